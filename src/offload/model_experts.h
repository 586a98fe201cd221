// The bridge between a loaded Model and the expert store: the model's routed experts as the store
// reads them, and (CUDA builds) the one call a runner makes to place them as a plan says.
#pragma once
#include "offload/expert_layout.h"
#include "offload/plan_file.h"

#include <cstdint>
#include <string>

#if SPILL_HAVE_CUDA
#include <memory>

#include "offload/expert_store.h"
#endif

namespace spill {
class Model;
namespace placement {
struct PlanOutcome;
}
}  // namespace spill

namespace spill::offload {

// Every MoE layer's routed experts, pointing at the model's own bytes (mapped file pages for a
// GGUF, the model's owned copies after --quant, anonymous pages for --synthetic). Throws
// spill::Error when an expert's matrices are not what the MoE kernels take (gate and up of
// different types, shapes that disagree with the spec).
ExpertSources expert_sources(const Model& model);

// A plan made at start-up (placement::make_plan) as the store reads it: through its JSON, so a plan
// planned in process and one loaded from `--plan FILE` pass the same checks. Throws spill::Error
// when the outcome is a refusal.
PlacementPlan plan_from_outcome(const placement::PlanOutcome& outcome);

// The planner's flags of serve, generate and run-batch (instead of --plan FILE): plan at start-up.
struct StartupPlacement {
  std::string gpu_mem{};     // --gpu-mem: what spill may use of the GPU (weights, KV, workspace)
  std::string host_experts{};  // --host-experts: at least this share of the routed experts in host RAM
  std::string host_mem{};    // --host-mem: pinned host RAM the plan may use
  // --expert-cache-mem: VRAM for the expert cache (offload/expert_cache.h), with --gpu-mem or --plan;
  // with --gpu-mem it comes out of that budget before the plan is made.
  std::string expert_cache_mem{};
  // The in-place host read rate the plan is priced at (GB/s; measured at start-up by the CUDA runner's
  // opener, offload::measure_host_reads); 0: placement::Ceilings' nominal figure.
  double host_read_gbps = 0;
  // --cpu-experts: a share of each layer's host experts computed by CPU threads ("auto": balanced
  // against the measured rates; "0" or empty: none), and --cpu-expert-threads.
  std::string cpu_experts{};
  int cpu_expert_threads = 0;
  bool requested() const { return !gpu_mem.empty() || !host_experts.empty() || !host_mem.empty() || host_read_gbps > 0; }
  int64_t expert_cache_bytes() const;  // 0 when not given; throws spill::Error for a bad size
  // CudaRunnerConfig::cpu_expert_share: 0 (off), a share in (0, 1], or -1 (auto); throws for a bad value.
  double cpu_expert_share() const;
};
struct StartupPlan {
  PlacementPlan plan;
  int64_t kv_budget_bytes = 0;  // what --gpu-mem leaves for the KV pool: the plan's KV and its room
  std::string fit_report;       // placement::format_fit_report of the outcome
};
// Plans `model`'s routed experts for one GPU as `spill plan` would, priced at the tensors as the
// model holds them (after any --quant): KV for min(max_seqs, 4) sequences of the model length
// (at most 32768) unless kv_mem > 0, the embedding in VRAM (the CUDA runner keeps it there).
// Throws spill::Error carrying the fit report when the model does not fit, before any upload.
// kv_format: the format the runner will keep its KV cache in (the CUDA runner's default, BF16).
StartupPlan plan_at_startup(const Model& model, const StartupPlacement& flags, int64_t max_seqs, int64_t max_model_len,
                            int64_t max_batch_tokens, int64_t kv_mem, KvFormat kv_format = KvFormat::BF16);

// offload::uniform_plan for this model: host_share of every MoE layer's experts in host RAM, each
// layer priced at its own experts' bytes (a GGUF mix may give layers different down types). For
// benchmarks and tests that want a given share without running the planner.
PlacementPlan uniform_plan_for(const Model& model, double host_share, uint64_t seed = 1);

#if SPILL_HAVE_CUDA
// Checks `plan` against `model`, then places every routed expert of the plan's layers on
// options.plan_gpu as it says and uploads the per-layer device tables. The store must not outlive
// the model (in-place experts are the model's file pages).
std::unique_ptr<ExpertStore> build_expert_store(const Model& model, const PlacementPlan& plan,
                                                const ExpertStoreOptions& options = {});
#endif

}  // namespace spill::offload
