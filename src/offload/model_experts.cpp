#include "offload/model_experts.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "model/model.h"
#include "placement/fit_report.h"
#include "placement/measured_bytes.h"
#include "placement/memory.h"
#include "placement/planner.h"

namespace spill::offload {

ExpertSources expert_sources(const Model& model) {
  const ModelSpec& s = model.spec();
  ExpertSources out{.where = model.where(), .n_layers = s.n_layers, .top_k = s.n_experts_per_token};
  out.prepare = [&model](const void* p, size_t n) { model.prepare(p, n); };
  out.drop = [&model](const void* p, size_t n) { model.drop(p, n); };
  for (int64_t l = 0; l < s.n_layers; ++l) {
    if (!s.layer_is_moe[size_t(l)]) continue;
    const LayerWeights& lw = model.layers[size_t(l)];
    if (lw.experts.empty()) fail("{}: layer {} is a MoE layer without experts", model.where(), l);
    const ExpertWeights& first = lw.experts[0];
    MoeLayerSource ml{.layer = l, .hidden = s.hidden_size, .width = s.moe_intermediate_size,
                      .gate_up_type = first.gate.dtype, .down_type = first.down.dtype};
    for (size_t e = 0; e < lw.experts.size(); ++e) {
      const ExpertWeights& x = lw.experts[e];
      // One type per projection across the layer: the kernels decode a layer with one gate/up type
      // and one down type.
      if (x.gate.dtype != ml.gate_up_type || x.up.dtype != ml.gate_up_type || x.down.dtype != ml.down_type)
        fail("{}: layer {} expert {}: gate {}, up {}, down {}; the MoE kernels need gate and up of one type and every "
             "expert of a layer alike (requantize with one experts type, e.g. --quant experts=q4_k)",
             model.where(), l, e, dtype_name(x.gate.dtype), dtype_name(x.up.dtype), dtype_name(x.down.dtype));
      auto shaped = [&](const TensorView& t, int64_t rows, int64_t cols) { return t.rows() == rows && t.cols() == cols; };
      if (!shaped(x.gate, ml.width, ml.hidden) || !shaped(x.up, ml.width, ml.hidden) || !shaped(x.down, ml.hidden, ml.width))
        fail("{}: layer {} expert {}: gate {}, up {}, down {} do not match width {} and hidden {}", model.where(), l, e,
             shape_str(x.gate), shape_str(x.up), shape_str(x.down), ml.width, ml.hidden);
      ml.experts.push_back({.gate = static_cast<const uint8_t*>(x.gate.data),
                            .up = static_cast<const uint8_t*>(x.up.data),
                            .down = static_cast<const uint8_t*>(x.down.data)});
    }
    out.moe_layers.push_back(std::move(ml));
  }
  return out;
}

PlacementPlan uniform_plan_for(const Model& model, double host_share, uint64_t seed) {
  const ModelSpec& s = model.spec();
  const ExpertSources src = expert_sources(model);
  if (src.moe_layers.empty()) fail("{}: no routed experts to place", model.where());
  PlacementPlan p = uniform_plan({.n_layers = s.n_layers, .n_experts = s.n_experts, .top_k = s.n_experts_per_token,
                                  .hidden_size = s.hidden_size, .moe_intermediate_size = s.moe_intermediate_size,
                                  .layer_is_moe = s.layer_is_moe, .expert_type = src.moe_layers[0].gate_up_type,
                                  .expert_bytes = src.moe_layers[0].expert_bytes(), .host_share = host_share,
                                  .seed = seed});
  p.where = "a uniform plan (" + std::to_string(host_share) + " of each layer's experts in host RAM)";
  p.routed_expert_bytes = 0;
  for (const MoeLayerSource& ml : src.moe_layers) {
    p.layers[size_t(ml.layer)].expert_bytes = ml.expert_bytes();
    p.routed_expert_bytes = std::max(p.routed_expert_bytes, ml.expert_bytes());
  }
  p.host_bytes = p.host_expert_bytes();
  return p;
}

PlacementPlan plan_from_outcome(const placement::PlanOutcome& outcome) {
  if (!outcome.fits) fail("the placement plan does not fit: {}", outcome.refusal);
  return parse_plan(placement::plan_to_json(outcome), "the start-up plan");
}

int64_t StartupPlacement::expert_cache_bytes() const {
  return expert_cache_mem.empty() ? 0 : placement::parse_byte_size(expert_cache_mem, "--expert-cache-mem");
}

double StartupPlacement::cpu_expert_share() const {
  if (cpu_experts.empty()) return 0.0;
  if (cpu_experts == "auto") return -1.0;
  return placement::parse_share(cpu_experts, "--cpu-experts");
}

StartupPlan plan_at_startup(const Model& model, const StartupPlacement& flags, int64_t max_seqs, int64_t max_model_len,
                            int64_t max_batch_tokens, int64_t kv_mem, KvFormat kv_format) {
  using namespace placement;
  if (flags.gpu_mem.empty())
    fail("--host-experts, --host-mem and --host-read-gbps plan the experts within a GPU budget: give --gpu-mem too "
         "(what spill may use of the GPU, e.g. --gpu-mem 64G)");
  PlanRequest req;
  req.shape = shape_of(model);
  req.measured = measure_weights(model);
  req.types = dominant_types(model);
  req.kv_format = kv_format;
  // One budget per GPU: several make an expert-parallel plan in the layout the runner runs (every GPU
  // a share of each layer's experts, the rest replicated).
  req.gpu_mem = parse_byte_sizes(flags.gpu_mem, "--gpu-mem");
  if (req.gpu_mem.size() > 1) {
    req.parallel = Parallelism::Experts;
    req.attention = AttentionParallel::Replicated;
  }
  if (const int64_t cache = flags.expert_cache_bytes(); cache > 0) {
    for (int64_t& budget : req.gpu_mem) {
      if (cache >= budget)
        fail("--expert-cache-mem {} is all of --gpu-mem {} on a GPU: the cache comes out of each GPU's budget; give "
             "it less",
             flags.expert_cache_mem, flags.gpu_mem);
      budget -= cache;
    }
  }
  if (!flags.host_mem.empty()) req.host_mem = parse_byte_size(flags.host_mem, "--host-mem");
  if (!flags.host_experts.empty()) req.min_host_fraction = parse_share(flags.host_experts, "--host-experts");
  if (kv_mem > 0) {
    req.kv_mem = kv_mem;
  } else {
    const int64_t model_len = max_model_len > 0 ? max_model_len : model.spec().max_position_embeddings;
    req.max_model_len = std::clamp<int64_t>(model_len, 1, 32768);
    req.max_seqs = std::clamp<int64_t>(max_seqs, 1, 4);
  }
  req.max_batch_tokens = max_batch_tokens;
  req.embedding = EmbeddingHome::Gpu;
  if (flags.host_read_gbps > 0) req.ceilings.host_read_gbps = flags.host_read_gbps;
  const PlanOutcome outcome = make_plan(std::move(req));
  StartupPlan out;
  out.fit_report = format_fit_report(outcome);
  if (!outcome.fits) fail("the model does not fit --gpu-mem {}:\n{}", flags.gpu_mem, out.fit_report);
  out.plan = plan_from_outcome(outcome);
  // The KV pool: what the plan gives it and leaves free, on the GPU with the least (every GPU of an
  // expert-parallel group holds the same blocks).
  out.kv_budget_bytes = INT64_MAX;
  for (const GpuPlan& gpu : outcome.plan.gpus)
    out.kv_budget_bytes = std::min(out.kv_budget_bytes, gpu.kv + std::max<int64_t>(0, gpu.room()));
  return out;
}

#if SPILL_HAVE_CUDA
std::unique_ptr<ExpertStore> build_expert_store(const Model& model, const PlacementPlan& plan,
                                                const ExpertStoreOptions& options) {
  return ExpertStore::build(expert_sources(model), plan, options);
}
#endif

}  // namespace spill::offload
