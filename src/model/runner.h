// A model runner executes planned forward steps on one backend and owns that backend's KV
// memory. The engine talks to this interface only, so a CUDA runner plugs in unchanged.
//
// What a runner is built with and reports (docs/ARCHITECTURE.md, "Engine contract"):
//   - its limits (RunnerLimits): the most sequences, tokens and positions one step may have, so
//     it can size its workspace (and capture its graphs) once, up front;
//   - its KV pool (KvCacheConfig): it sizes the pool itself from a budget (KvCapacity) and its own
//     bytes per block; the engine reads block size and count from kv_config() and never computes
//     KV bytes;
//   - a step (forward_sample): the sampled token (and logprobs when asked) per logit row, so a
//     device runner samples where the logits are; forward() returns the full logits, for
//     `spill logits`, eval and tests.
// A runner throws DeviceFatalError (core/error.h) when its device is gone; the engine then ends.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/model_spec.h"
#include "model/batch.h"
#include "model/kv_format.h"
#include "sampling/sampler.h"

namespace spill {

class Model;

struct KvCacheConfig {
  int32_t block_size = 16;  // tokens per KV block
  int64_t n_blocks = 0;     // blocks in the pool (all layers of a block together)
  // Reported by the runner (its kv_config()); ignored when given to make_cpu_runner.
  KvFormat format = KvFormat::F32;  // what K and V are stored in
  int64_t bytes_per_block = 0;      // one block, all layers, K and V (and their scales)
  // The window of each KV cache group's layers (0: full attention), group 0 first (KvGroups in
  // model/kv_format.h). Reported by the runner; {0} for a model whose layers all attend alike.
  std::vector<int32_t> group_windows{0};

  int32_t n_groups() const { return int32_t(group_windows.size()); }
  // The longest sequence the pool holds alone (kv_pool_tokens).
  int64_t pool_tokens() const { return kv_pool_tokens(group_windows, n_blocks, block_size); }
};

// How big a KV pool to make: by blocks or by bytes (at most one), or the runner's default.
struct KvCapacity {
  int32_t block_size = 16;
  int64_t blocks = 0;  // > 0: exactly this many blocks
  int64_t bytes = 0;   // > 0: as many blocks as fit in this many bytes (--kv-mem)
};
// Blocks for capacity, given the bytes one block takes on the backend. The default (neither set)
// holds 4 sequences of the model's full context (kv_blocks_for_sequence: sliding layers hold a window), at most 2 GiB (the CPU runner's default; a GPU
// runner gives what is left of its memory as `bytes` instead). Throws spill::Error when both are
// set or the result is under one block.
int64_t resolve_kv_blocks(const ModelSpec& spec, const KvCapacity& capacity, int64_t bytes_per_block);

// The most one step may hold. A runner sizes its buffers for these once; a batch beyond them is
// refused (spill::Error), so the scheduler must plan within them.
struct RunnerLimits {
  int32_t max_seqs = 64;            // sequences in one step; slot ids are in [0, max_seqs)
  int64_t max_batch_tokens = 2048;  // tokens in one step, all chunks together
  // Positions of one sequence: start_pos + n_tokens <= max_model_len. 0 when building: the
  // model's max_position_embeddings, capped by the KV pool; limits() reports the resolved value.
  int64_t max_model_len = 0;

  // Throws spill::Error naming the bad field.
  void validate() const;
};
// limits with max_model_len resolved (0 -> min(model context, pool tokens)); validated.
RunnerLimits resolve_runner_limits(const ModelSpec& spec, RunnerLimits limits, const KvCacheConfig& kv);

// What a step produced for one logit row.
struct SampledRow {
  SampledToken sampled;  // the token, and its logprobs when the row's sampler asks for them
  // Non-empty: nothing could be sampled for this row (no finite logit); only its request fails.
  std::string error;
  bool ok() const { return error.empty(); }
};

struct StepResult {
  std::vector<SampledRow> rows;  // one per logit row of the batch, in logit-row order
};

// Where a runner's routed-expert reads went, counted since it started (for /metrics and logs).
// A runner without expert placement reports the routings only; the CUDA runner with an expert plan
// reports its host reads and VRAM expert cache too.
struct ExpertTraffic {
  int64_t tokens = 0;          // tokens run through the MoE layers (each token once, not per layer)
  int64_t routings = 0;        // (token, slot) pairs over all MoE layers
  int64_t host_routings = 0;   // of which to an expert in host RAM (read in place, or computed by the CPU)
  int64_t cache_routings = 0;  // of which to a host expert served from the VRAM expert cache
  int64_t host_bytes = 0;      // expert bytes read over PCIe (a touched host expert once per MoE call)
  int64_t cpu_routings = 0;    // of host_routings, those the CPU computed (--cpu-experts)
  int64_t cpu_bytes = 0;       // expert bytes the CPU read for them (once per MoE call); not in host_bytes
  int64_t staged_steps = 0;    // steps that copied every host expert to VRAM once instead (prefill)
  int64_t staged_bytes = 0;    // of host_bytes, those copies
  int64_t cache_copies = 0;    // host experts copied into the VRAM expert cache
  int64_t cache_copy_bytes = 0;
  int64_t cache_evictions = 0;
  double step_seconds = 0;     // host wall time of the steps these counts are of
  // Gauges: where the routed experts live now.
  int64_t vram_expert_bytes = 0;  // placed in VRAM by the plan (or all, without one)
  int64_t host_expert_bytes = 0;  // placed in host RAM by the plan
  int64_t cache_bytes = 0;        // the VRAM expert cache's slots
  int64_t cache_slots = 0, cache_slots_used = 0;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelSpec& spec() const = 0;
  virtual const KvCacheConfig& kv_config() const = 0;  // block size, blocks, format, bytes per block
  virtual const RunnerLimits& limits() const = 0;      // resolved: max_model_len > 0
  // One line for start-up logs: backend, device, threads.
  virtual std::string describe() const = 0;

  // Runs one step. logits is resized to [batch.n_logit_rows(), vocab_size], row-major.
  // Reads and writes KV blocks named by the chunks' block tables; blocks not named are untouched.
  virtual void forward(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer = nullptr) = 0;

  // Runs one step and samples every logit row r with samplers[r] (which records the pick: see
  // SequenceSampler::accept for a pick made on a device). samplers.size() must equal
  // batch.n_logit_rows(); batch.all_logits must be false. out.rows gets one entry per logit row.
  // A row whose logits admit no token gets an error in its entry and the others are unaffected;
  // a failure of the step itself throws (DeviceFatalError when the device is gone).
  // This default runs forward() into host logits and samples each row on the host; a GPU runner
  // overrides it to sample on the device, with these samplers as the exact reference.
  virtual void forward_sample(const ForwardBatch& batch, std::span<SequenceSampler* const> samplers, StepResult& out,
                              ForwardObserver* observer = nullptr);

  // Counts of the routed experts' reads so far. Called on the thread that runs the steps, between
  // steps. A runner of a model without routed experts returns zeros.
  virtual ExpertTraffic expert_traffic() const { return {}; }

 protected:
  // Samples each row of host logits ([samplers.size(), vocab]) into out: forward_sample's host half.
  void sample_on_host(std::span<const float> logits, std::span<SequenceSampler* const> samplers, StepResult& out);

 private:
  // Scratch of the default forward_sample, reused across steps.
  std::vector<float> host_logits_;
  SamplerWorkspace sampler_workspace_;
};

// Bytes one KV block takes on the CPU backend: fp32 K and V of block_size positions in each of
// KvGroups::layers_per_block() layers (all layers, for a model with one KV group).
int64_t cpu_kv_bytes_per_block(const ModelSpec& spec, int32_t block_size);

// Block tables for batches built by hand (spill logits, eval, tests) on any model: one sequence of
// blocks_per_table blocks in each KV group, the groups on disjoint blocks, group g's table
// tables[g] = block ids [first + g * blocks_per_table, first + (g + 1) * blocks_per_table). The
// pool needs first + kv.n_groups() * blocks_per_table blocks (hand_built_pool_blocks).
struct HandBuiltTables {
  std::vector<std::vector<int32_t>> tables;  // per group
  // Points chunk's block_table and group_tables at these tables (which must outlive the batch);
  // first_in_slot: also marks the chunk the slot's first, every table its new blocks.
  void attach(SeqChunk& chunk, bool first_in_slot = false) const;
};
HandBuiltTables hand_built_tables(const ModelSpec& spec, int64_t blocks_per_table, int32_t first = 0);
// The pool a hand-built batch of n_seqs sequences of blocks_per_table blocks each needs.
int64_t hand_built_pool_blocks(const ModelSpec& spec, int64_t blocks_per_table, int64_t n_seqs = 1);

struct CpuRunnerConfig {
  KvCapacity kv{};         // block size, and the pool by blocks, by bytes or by default
  RunnerLimits limits{};
  int n_threads = 0;       // <= 0: one per hardware thread
};
std::unique_ptr<ModelRunner> make_cpu_runner(const Model& model, const CpuRunnerConfig& config);
// A pool of exactly kv.n_blocks blocks and the default limits (tests, hand-built batches).
// n_threads <= 0: one per hardware thread.
std::unique_ptr<ModelRunner> make_cpu_runner(const Model& model, KvCacheConfig kv, int n_threads = 0);

}  // namespace spill
