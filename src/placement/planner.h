// The placement planner: per routed expert, VRAM of one GPU or pinned host RAM, from a memory
// budget and a routing profile; per other tensor class, the same where it makes sense (the
// embedding is read a row per token, so host RAM is a good home; the LM head is read whole every
// step and stays on a GPU). Pure host code: it decides, a runner executes.
//
// Several GPUs, two ways (Parallelism):
// - Experts (the default): every GPU takes part in every layer. Each owns a share of each layer's
//   routed experts, in its VRAM or in host RAM it reads in place over its own PCIe link, so all
//   links work on every layer at once; the shares are balanced per layer (the slowest link sets
//   the step time). Attention with its KV, shared experts and dense MLPs are split by heads / by
//   width over the GPUs (AttentionParallel::Tensor) where the shapes divide, or replicated; router
//   and norms are replicated; embedding and head are split by vocabulary rows. All-reduces join the
//   GPUs' partial sums (two per layer split by tensor, one replicated).
// - Layers: contiguous layer ranges, one per GPU (the step runs through them in order); the
//   embedding belongs to the first GPU (or host), the head to the last. Host experts of a layer
//   are read in place by the GPU that owns the layer, over its own PCIe link.
//
// Deterministic: the same request gives the same plan, byte for byte (ties go to the lower layer
// and expert id).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "placement/memory.h"
#include "placement/profile.h"
#include "placement/tensor_types.h"

namespace spill::placement {

// Bandwidth ceilings in GB/s (1e9 bytes/s), measured by `spill topo`; defaults are the H200
// figures: HBM read, and a kernel reading pinned host memory in place over PCIe Gen5 x16.
struct Ceilings {
  double hbm_read_gbps = 4530.0;
  double host_read_gbps = 50.0;
  // The expected decode time (DecodeEstimate::expected_*) of spill's CUDA runner: its decode
  // kernels read VRAM weights at decode_vram_gbps, not at the HBM peak (the int8 GEMV and MoE
  // kernels reach 13-38% of it at batch 1: docs/perf/expert-cache-2026-12-02.md), and each decoder
  // layer costs a chain of ~11 kernels, layer_overhead_us + layer_overhead_us_per_token x B, that its
  // bytes do not hide. Fitted on the H200 (620442f) to three measured steps: S30 all in VRAM at
  // batch 1 (2.92 ms) and 8 (7.70 ms), and S235 at --gpu-mem 96G at batch 1 (17.06 ms); checked
  // against S235 at batch 8 (expected 69.1 ms, measured 71.3) and S30 at --gpu-mem 12G at batch 1
  // (9.76, measured 9.27). The peak stays the bound's rate (step_seconds).
  double decode_vram_gbps = 1521.0;
  double layer_overhead_us = 25.1;
  double layer_overhead_us_per_token = 2.66;
  // One all-reduce of a decode step's hidden rows (a few KiB) across the GPUs of an expert-parallel
  // plan, in a CUDA graph over NVLink. Assumed (NCCL's small-message latency), not yet measured by
  // spill: `--allreduce-us` replaces it.
  double allreduce_us = 10.0;
};

enum class Parallelism { Experts, Layers };
enum class AttentionParallel { Tensor, Replicated };

enum class EmbeddingHome { Auto, Gpu, Host };  // Auto: host RAM when anything must be offloaded

struct PlanRequest {
  ModelShape shape{};
  TensorClassTypes types{};
  // The weights as a loaded file stores them (measure_weights: a GGUF's own, often per-layer, mix);
  // none: account_weights(shape, types) predicts them. With it, `types` only labels the report.
  std::optional<ModelBytes> measured{};
  KvFormat kv_format = KvFormat::BF16;
  std::vector<int64_t> gpu_mem{};  // usable bytes of each GPU
  int64_t gpu_reserve = 0;       // subtracted from every GPU (CUDA context, allocator slack)
  int64_t host_mem = 0;          // pinned host RAM the plan may use; 0: not limited
  // KV cache: room for max_seqs sequences of max_model_len tokens (in whole blocks), or kv_mem
  // bytes in all when > 0.
  int64_t max_model_len = 0;
  int64_t max_seqs = 0;
  int64_t kv_mem = 0;
  int32_t kv_block_size = 16;
  int64_t max_batch_tokens = 2048;
  EmbeddingHome embedding = EmbeddingHome::Auto;
  bool allow_offload = true;      // false: every routed expert in VRAM, or refuse
  double min_host_fraction = 0;   // at least this share of the routed experts in host RAM
  std::optional<RoutingProfile> profile{};  // none: uniform routing
  // Several GPUs: how they share the model (one GPU: the same plan either way).
  Parallelism parallel = Parallelism::Experts;
  AttentionParallel attention = AttentionParallel::Tensor;
  std::string profile_source{};             // for the report
  Ceilings ceilings{};
  int64_t report_batch = 0;    // B of the batch figures; 0: max_seqs (at least 1)
  int64_t report_context = 0;  // context of each stream in the decode bound; 0: min(4096, max_model_len)
};

struct GpuPlan {
  int gpu = 0;
  int64_t budget = 0;  // gpu_mem of this GPU
  int64_t first_layer = 0, n_layers = 0;  // expert-parallel: every layer
  bool embedding = false, lm_head = false;  // holds the embedding / head (expert-parallel: its rows' share)
  ClassBytes weights;  // in this GPU's VRAM, by class
  int64_t kv = 0, workspace = 0, reserve = 0;
  int64_t host_experts = 0;  // routed experts of its layers in host RAM
  int64_t host_bytes = 0;    // their bytes
  int64_t vram_total() const { return weights.total() + kv + workspace + reserve; }
  int64_t room() const { return budget - vram_total(); }
};

struct LayerPlan {
  int64_t layer = 0;
  int gpu = 0;  // the GPU that owns the layer and reads its host experts; -1: expert-parallel (every GPU)
  bool moe = false;
  std::vector<int32_t> host_experts{};  // ids in host RAM, ascending; every other expert is in VRAM
  // Expert-parallel: owner[e] is the GPU that holds routed expert e, in its VRAM or in host RAM it
  // reads over its own link. Empty for a layer split.
  std::vector<int32_t> owner{};
};

// How an expert-parallel plan splits the non-expert parts (each true: split over the GPUs; false:
// replicated on every GPU).
struct TensorSplit {
  bool attention = false;  // q/k/v/o by heads, with the KV cache's heads
  bool shared = false;     // shared experts by width
  bool dense = false;      // dense MLPs by width
  bool vocab = false;      // embedding and head by vocabulary rows
  std::vector<std::string> notes{};  // why a part stays replicated
};

struct Plan {
  ModelBytes bytes;
  // KV: a full-attention layer keeps kv_tokens positions (all sequences), a sliding-window layer
  // (gpt-oss) kv_sliding_tokens: max_seqs windows in whole blocks (kv_blocks_for_sequence).
  int64_t kv_tokens = 0;
  int64_t kv_bytes_per_token = 0;  // over the full-attention layers (every layer, without sliding ones)
  int64_t kv_sliding_tokens = 0;
  int64_t kv_sliding_bytes_per_token = 0;  // over the sliding-window layers; 0 without any
  int64_t kv_tokens_of_layer(const ModelSpec& spec, int64_t layer) const {
    return spec.sliding(layer) ? kv_sliding_tokens : kv_tokens;
  }
  int64_t kv_bytes() const { return kv_tokens * kv_bytes_per_token + kv_sliding_tokens * kv_sliding_bytes_per_token; }
  int64_t max_model_len = 0, max_seqs = 0;  // as resolved
  int64_t workspace_per_gpu = 0;
  bool embedding_on_host = false;
  Parallelism parallel = Parallelism::Layers;  // as planned: Layers for one GPU
  TensorSplit split{};                         // expert-parallel only
  std::vector<GpuPlan> gpus;
  std::vector<LayerPlan> layers;
  std::vector<std::vector<double>> usage;  // [layer][expert]: share of tokens routed there
  std::string usage_source;                // "uniform" or the profile

  int64_t host_experts() const;
  int64_t host_bytes() const;  // experts plus the embedding when it is in host RAM
  int64_t routed_experts() const;
};

struct PlanOutcome {
  bool fits = false;
  PlanRequest request;             // as given, with defaults resolved
  std::vector<GpuPlan> no_offload;  // the same model with everything in VRAM, split as evenly as it goes
  Plan plan;                        // the plan (when fits)
  std::string refusal;              // why not, by how much, and what to change (when !fits)
};

// Plans, or says why it cannot. Throws spill::Error only for a request that makes no sense (no
// GPU, a profile of another model); a budget that is too small is a refusal, not an exception.
PlanOutcome make_plan(PlanRequest request);

// The plan as readable JSON (format "spill-placement-plan", version 1; docs/placement.md): per
// GPU its layers and VRAM by class, per layer its GPU and the experts in host RAM, with bytes.
std::string plan_to_json(const PlanOutcome& outcome);

// Expected decode traffic of a plan for steps of `batch` tokens (one per stream), each stream at
// `context` tokens: bytes from VRAM and host per step, and the speed the ceilings allow.
struct DecodeEstimate {
  int64_t batch = 1, context = 0;
  double host_bytes_per_token = 0;  // host bytes of a step / batch
  double vram_bytes_per_step = 0;
  double host_bytes_per_step = 0;
  double expected_host_experts_per_step = 0;  // distinct host experts a step touches
  double step_seconds = 0;                    // lower bound: per layer max(VRAM/HBM, host/PCIe), summed
  double tokens_per_s_per_stream = 0;         // 1 / step_seconds: the upper bound per stream
  // What the CUDA runner is expected to take: per layer VRAM/HBM + host/PCIe + the layer overhead
  // (the host reads of a layer start only once its router has run, after the layer's attention, so
  // they add to the layer's chain rather than hide under it).
  // Expert-parallel, a layer: each GPU reads its own share (its weights' part, its experts) at once,
  // so the slowest GPU sets the layer's time, and the step adds its all-reduces at allreduce_us.
  // The byte totals above are summed over the GPUs.
  double expected_step_seconds = 0;
  double expected_tokens_per_s_per_stream = 0;
  int64_t allreduces_per_step = 0;
  double slowest_link_host_bytes_per_step = 0;  // the host bytes of the GPU that reads most, summed over layers
};
DecodeEstimate estimate_decode(const Plan& plan, const PlanRequest& request, int64_t batch, int64_t context);

}  // namespace spill::placement
