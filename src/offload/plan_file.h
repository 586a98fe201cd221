// Reading a placement plan (the JSON `spill plan --out` writes, format "spill-placement-plan"
// version 1 for a layer split, 2 for expert parallelism, docs/placement.md) for the runtime that executes it: per layer, the GPU that owns it
// and the routed experts that live in host RAM. A plan is a file a user may edit, so it is
// untrusted input: every field the runtime uses is checked (type, range, order, consistency with
// the plan's own totals), and each failure names the file and the field (`layers[3].host[2]`).
// Fields the runtime does not use (VRAM by class, KV sizes, usage) are not read.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace spill::offload {

struct PlannedLayer {
  int64_t layer = 0;
  int gpu = 0;                 // the GPU that owns the layer and reads its host experts; -1: expert-parallel
  bool moe = false;
  int64_t experts = 0;         // routed experts (0 for a dense layer)
  int64_t expert_bytes = 0;    // bytes of one routed expert (gate + up + down, scales included)
  std::vector<int32_t> host{};  // experts in host RAM, strictly ascending; the rest are in VRAM
  // Expert-parallel plans (version 2): owners[e] is the GPU holding expert e (in its VRAM, or in
  // host RAM it reads over its own link). Empty for a layer split.
  std::vector<int32_t> owners{};
};

struct PlacementPlan {
  std::string where;  // the file (or "plan" for text), for messages
  int64_t n_layers = 0, n_experts = 0, top_k = 0, hidden_size = 0, moe_intermediate_size = 0;
  DType expert_type = DType::Q4_K;  // types.experts
  int64_t routed_expert_bytes = 0;  // the largest layer's expert (layers may differ: PlannedLayer::expert_bytes)
  int64_t host_experts = 0, host_bytes = 0;  // the plan's totals (experts, plus the embedding when on host)
  bool embedding_on_host = false;
  int n_gpus = 0;
  bool expert_parallel = false;  // version 2: every GPU takes part in every layer (docs/placement.md)
  // Version 2: which non-expert parts the plan split over the GPUs (true) or replicated (false).
  struct Split {
    bool attention = false, shared = false, dense = false, vocab = false;
    bool any() const { return attention || shared || dense || vocab; }
  } split{};
  std::vector<PlannedLayer> layers;  // layers[l].layer == l

  int64_t host_expert_count() const;           // sum of the host lists
  int64_t host_expert_bytes() const;           // sum over layers of host count x expert bytes
};

// Limits far above any real model, so that a hostile file cannot make the reader allocate without
// bound (the host lists are bounded by the experts a layer has).
struct PlanLimits {
  int64_t max_layers = 4096;
  int64_t max_experts = 1 << 16;
  int64_t max_gpus = 1024;
  int64_t max_text_bytes = int64_t(1) << 30;
};

// Parses and validates plan text; `where` names it in errors. Throws spill::Error.
PlacementPlan parse_plan(std::string_view json_text, const std::string& where, const PlanLimits& limits = {});
// Reads and parses a plan file. Throws spill::Error naming the path.
PlacementPlan load_plan(const std::string& path, const PlanLimits& limits = {});

// A plan with every routed expert in VRAM, or the given share of each MoE layer's experts in host
// RAM (the lowest ids of a seeded shuffle per layer): for tests and benchmarks that need a plan for
// a shape without running the planner.
struct UniformPlanParams {
  int64_t n_layers = 0, n_experts = 0, top_k = 0, hidden_size = 0, moe_intermediate_size = 0;
  std::vector<bool> layer_is_moe{};  // empty: every layer
  DType expert_type = DType::Q4_K;
  int64_t expert_bytes = 0;
  double host_share = 0;  // 0..1 of each MoE layer's experts, rounded to the nearest whole expert
  uint64_t seed = 1;
};
PlacementPlan uniform_plan(const UniformPlanParams& params);

}  // namespace spill::offload
