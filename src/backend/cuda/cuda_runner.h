// The CUDA model runner: the whole decoder forward (src/model/decoder.cpp's CpuRunner is its
// reference) on one GPU, behind the ModelRunner interface, so the engine runs it unchanged.
//
// Device memory is the runner's: it uploads every weight once, in its stored format (F32, BF16,
// F16, or a ggml block format the GEMV/MoE kernels decode), keeps the paged KV cache in VRAM
// (BF16 by default, F32 on request; per layer [block][slot][kv_head][head_dim], addressed through
// each chunk's block table), and one workspace sized from the config's limits. Per step it copies
// the step's metadata (tokens, positions, KV slots, block tables) to the device in one transfer,
// enqueues the layers with no host synchronisation, and copies the logit rows back at the end (the
// one synchronisation; a ForwardObserver adds one per observed tensor).
//
// This header does not include CUDA: a build without CUDA gets a make_cuda_runner that throws.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "model/runner.h"
#include "offload/plan_file.h"

namespace spill {

class Model;

// Expert parallelism (an expert-parallel plan, docs/placement.md): each GPU runs a CudaRunner that
// holds the experts the plan gives it and a copy of everything else. After each MoE layer's routed
// experts, its rows hold the sum over its own experts only; PartialSums leaves in them the sum over
// every GPU, the same bits on each, so all GPUs carry the same hidden rows into the next layer.
class PartialSums {
 public:
  virtual ~PartialSums() = default;
  // rows: count floats in rank's device memory, summed in place; enqueued on `stream` (the rank's
  // cudaStream_t), called from the thread that drives that rank.
  virtual void sum(int rank, float* rows, int64_t count, void* stream) = 0;
  // Whether sum() may be captured into a CUDA graph (NCCL's may; an exchange through the host may not).
  virtual bool capturable() const = 0;
  // A rank failed mid-step: every rank waiting in sum() (on the host or on the device) stops
  // waiting, and the sums fail from then on.
  virtual void abort() = 0;
};

struct ExpertShard {
  int rank = 0, world = 1;
  PartialSums* sums = nullptr;  // not owned; null: not a shard (the whole model on this GPU)
};

struct CudaRunnerConfig {
  // Block size and blocks in the pool (all layers of a block together). n_blocks 0: as many as
  // kv_budget_bytes holds, or with no budget the free device memory after the weights and the
  // workspace, less a reserve (1 GiB or 5%); kv_config() reports the count.
  KvCacheConfig kv;
  int64_t kv_budget_bytes = 0;
  int device = 0;                   // CUDA device ordinal
  int64_t max_batch_tokens = 2048;  // most tokens one step may carry (sizes the activations)
  int32_t max_seqs = 256;           // most chunks one step may carry
  // Most positions a sequence may reach (sizes the block-table and split-attention workspace);
  // <= 0: what the KV pool holds (n_blocks * block_size; with n_blocks 0 the model's
  // max_position_embeddings), capped at the model's max_position_embeddings.
  int64_t max_model_len = 0;
  // F32, BF16 (the default) or FP8 (e4m3 with a scale per token, KV head and K or V: half BF16's bytes;
  // head_dim 64 or 128 and a GQA group of at most 16 query heads, or a multiple of 16).
  KvFormat kv_format = KvFormat::BF16;
  // Decode-only steps (one token per chunk, logits for each) replay a CUDA graph per (batch size,
  // attention partitions), captured at first use; false: every step is launched kernel by kernel.
  bool cuda_graphs = true;
  // An event between ops and their device times in cuda_runner_stats (every step launched eagerly).
  bool profile_ops = false;
  // Where each routed expert lives (offload::ExpertStore): a plan (`spill plan`, or
  // offload::uniform_plan) puts some of every MoE layer's experts in host RAM, pinned and mapped,
  // which the MoE kernels read in place over PCIe; the rest go to VRAM. Empty: all in VRAM, as
  // uploaded with the other weights. Block-format experts only; every layer on this GPU (the plan's
  // GPU 0).
  std::optional<offload::PlacementPlan> expert_plan{};
  // Host experts read from the model file's own pages rather than copied into pinned memory
  // (offload::ExpertStoreOptions::in_place; off by default, see docs/offload.md).
  bool experts_in_place = false;
  // VRAM for the expert cache (offload/expert_cache.h): slots that hold copies of the host experts
  // live traffic reads most, refilled as it changes. 0: none. Needs an expert_plan with host experts.
  int64_t expert_cache_bytes = 0;
  // Steps that touch most host experts (prefill chunks) copy each MoE layer's host experts into
  // VRAM once, the next layer's copy overlapping this layer's compute (offload/expert_staging.h),
  // instead of reading them in place from every MoE call; worth_staging() decides per step. Two
  // slots of the largest layer's host experts, taken from the KV budget when they are at most a
  // quarter of it (else not used; describe() says which).
  bool stage_host_experts = true;
  // Count routings and expert reads (expert_traffic()) in the MoE kernels, read back each step
  // beside the LM head: WithPlan when an expert plan puts experts in host RAM (their traffic is what
  // /metrics and the expert cache need; measured cost 0.4-0.9% of an all-VRAM S30 step, so a runner
  // without a plan does not pay it), Always, or Off (to measure that cost; no cache then).
  enum class ExpertCounting { WithPlan, Always, Off };
  ExpertCounting count_experts = ExpertCounting::WithPlan;
  // GPU `shard.rank` of an expert-parallel group (needs an expert_plan of version 2 over shard.world
  // GPUs, with nothing but the experts split): the plan's experts of that GPU, attention, shared
  // experts and dense MLPs replicated. Ranks past 0 compute no logits: forward() leaves them empty
  // and forward_sample is rank 0's (make_expert_parallel_runner drives the group).
  ExpertShard shard{};
  // Host experts computed by CPU threads while the GPU reads the others over PCIe
  // (offload/cpu_experts.h), in decode calls of up to 8 tokens; needs an expert plan with host
  // experts. 0: off (every expert on the GPU; output bit-identical to all-in-VRAM). In (0, 1]: that
  // share of each layer's host experts; < 0 (auto): all of them where the CPU's measured expert rate
  // beats the measured link rate (offload::auto_cpu_share), else none. The CPU's int8 kernels are
  // not bit-identical to the GPU's, so tokens can differ from all-in-VRAM (as between any two
  // backends); a token's bits still do not depend on the other sequences of a decode step.
  double cpu_expert_share = 0;
  int cpu_expert_threads = 0;  // <= 0: the GPU's NUMA node's cores less two
};

// Bytes one KV block takes on the CUDA backend (K and V, all layers, scales included): the
// planner's arithmetic (model/kv_format.h).
inline int64_t cuda_kv_bytes_per_block(const ModelSpec& spec, int32_t block_size, KvFormat format) {
  return int64_t(block_size) * kv_bytes_per_token(spec, format);
}

// What a CUDA runner holds on the device, and what its last step launched (benchmarks, logs).
struct CudaRunnerStats {
  int64_t weight_bytes = 0;     // the weights as uploaded (stored formats, expert tables)
  int64_t kv_bytes = 0;         // the KV pool
  int64_t workspace_bytes = 0;  // activations, GEMV/MoE/attention workspaces
  int64_t launches_last_step = 0;  // kernels (and device copies) the last forward enqueued
  // With an expert plan: the routed experts in VRAM and in host RAM, and the store's start-up lines.
  int64_t vram_expert_bytes = 0, host_expert_bytes = 0;
  std::string expert_store_summary;
  // With CPU experts (config.cpu_expert_share): calls served, expert bytes the CPU read and its busy
  // time in them, since start-up.
  int64_t cpu_expert_calls = 0, cpu_expert_bytes = 0;
  double cpu_expert_busy_seconds = 0;
  // With profile_ops: the last step's device time by op (summed over layers), in step order.
  std::vector<std::pair<std::string, double>> op_ms_last_step;
};

#if SPILL_HAVE_CUDA
// The stats of a runner make_cuda_runner made; throws spill::Error for any other runner.
CudaRunnerStats cuda_runner_stats(const ModelRunner& runner);

// Checks a batch as the runner's forward does before it enqueues anything (chunks, positions,
// block ids, limits, token ids); throws spill::Error for a bad one. A group of runners checks a step
// once before any GPU starts it, so bad input fails the step and not the group.
void cuda_runner_check_batch(const ModelRunner& runner, const ForwardBatch& batch);

// Uploads the model's weights to config.device and allocates the KV pool and workspace there.
// Throws spill::Error (what did not fit or is not supported, and what to do) on failure. The model
// must outlive the runner only when its embedding is in a block format the device gather does not
// decode (those rows are dequantized on the host per step).
std::unique_ptr<ModelRunner> make_cuda_runner(const Model& model, const CudaRunnerConfig& config);
#else
inline std::unique_ptr<ModelRunner> make_cuda_runner(const Model&, const CudaRunnerConfig&) {
  fail("spill was built without CUDA (-DSPILL_CUDA=OFF or no nvcc at configure time); use the CPU runner");
}
#endif

}  // namespace spill
