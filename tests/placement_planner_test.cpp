// The planner: deterministic, least-used experts to host first, balanced across layers, several
// GPUs within their own budgets, refusals that say by how much and what to change, and the
// reference deployment's budget (seed shape, two GPUs capped at 95.6 GiB).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "placement/fit_report.h"
#include "placement/planner.h"

namespace spill::placement {
namespace {

namespace fs = std::filesystem;
constexpr int64_t GiB = int64_t(1) << 30;

// A small MoE whose rows are whole k-quant blocks: 6 layers x 16 experts top-2, hidden 256.
ModelShape small_shape(int64_t layers = 6, int64_t experts = 16) {
  return parse_model_shape(fmt::format(R"({{"model_type": "qwen3_moe", "vocab_size": 1024, "hidden_size": 256,
      "num_hidden_layers": {}, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
      "intermediate_size": 512, "num_experts": {}, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
      "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "norm_topk_prob": true,
      "tie_word_embeddings": false, "eos_token_id": 1}})",
                                       layers, experts),
                           "small.json");
}

// A profile whose usage we choose: layer l, expert e gets weight(l, e) decode routings.
template <class F>
RoutingProfile profile_from(const ModelShape& shape, F weight) {
  RoutingProfile p = RoutingProfile::empty_for(shape.spec);
  for (int64_t l = 0; l < p.n_layers; ++l) {
    LayerRouting& lr = p.layers[size_t(l)];
    int64_t total = 0;
    for (int64_t e = 0; e < p.n_experts; ++e) total += lr.decode[size_t(e)] = weight(l, e);
    lr.decode_tokens = total / p.top_k;
  }
  return p;
}

// The budget that forces `host` experts off the only GPU: everything in VRAM minus host experts' bytes.
PlanRequest request_for(const ModelShape& shape, double gpu_gib = 0) {
  PlanRequest r{.shape = shape, .types = parse_tensor_class_types("experts=q4_k"), .max_model_len = 1024, .max_seqs = 2};
  r.gpu_mem = {gpu_gib > 0 ? int64_t(gpu_gib * double(GiB)) : GiB};
  r.embedding = EmbeddingHome::Gpu;  // budgets below count experts only; the seed test covers Auto
  return r;
}

int64_t no_offload_total(const PlanRequest& r) { return make_plan(r).no_offload[0].vram_total(); }

TEST(PlacementPlanner, DeterministicByteForByte) {
  const ModelShape shape = small_shape();
  PlanRequest r = request_for(shape);
  r.profile = profile_from(shape, [](int64_t l, int64_t e) { return 1 + (l * 7 + e * 13) % 17; });
  const int64_t eb = account_weights(shape, r.types).routed_expert_bytes;
  r.gpu_mem = {no_offload_total(r) - 21 * eb};
  const PlanOutcome a = make_plan(r), b = make_plan(r);
  ASSERT_TRUE(a.fits) << a.refusal;
  EXPECT_EQ(plan_to_json(a), plan_to_json(b));
  EXPECT_EQ(format_fit_report(a), format_fit_report(b));
  EXPECT_EQ(a.plan.host_experts(), 21);
}

TEST(PlacementPlanner, LeastUsedExpertsGoToHostFirst) {
  const ModelShape shape = small_shape();
  PlanRequest r = request_for(shape);
  // Distinct usages in every layer, in an order that differs per layer.
  r.profile = profile_from(shape, [](int64_t l, int64_t e) { return 100 + ((e * 5 + l * 3) % 16) * 10; });
  const int64_t eb = account_weights(shape, r.types).routed_expert_bytes;
  r.gpu_mem = {no_offload_total(r) - 6 * 3 * eb};  // 3 host experts per layer
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.fits) << o.refusal;
  for (const LayerPlan& l : o.plan.layers) {
    ASSERT_EQ(l.host_experts.size(), 3u) << "layer " << l.layer;
    // The three least-used experts of this layer, found directly from the counts.
    std::vector<int32_t> ids(16);
    std::iota(ids.begin(), ids.end(), 0);
    const auto& counts = r.profile->layers[size_t(l.layer)].decode;
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return counts[size_t(a)] < counts[size_t(b)]; });
    std::vector<int32_t> expected(ids.begin(), ids.begin() + 3);
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(l.host_experts, expected) << "layer " << l.layer;
  }
  // Against uniform usage, the profile-driven plan reads fewer host bytes per token.
  const double profiled = estimate_decode(o.plan, o.request, 1, 1024).host_bytes_per_token;
  double uniform_choice = 0;  // the same count per layer, but the most-used experts
  for (const LayerPlan& l : o.plan.layers) {
    std::vector<double> u = o.plan.usage[size_t(l.layer)];
    std::sort(u.begin(), u.end());
    for (size_t i = 0; i < 3; ++i) uniform_choice += u[u.size() - 1 - i] * double(eb);
  }
  EXPECT_LT(profiled, uniform_choice);
}

TEST(PlacementPlanner, BalancedAcrossLayersEvenWhenOneLayerIsColdest) {
  const ModelShape shape = small_shape();
  PlanRequest r = request_for(shape);
  // Layer 2's experts are all nearly unused: a global least-used pick would empty layer 2 first.
  r.profile = profile_from(shape, [](int64_t l, int64_t e) { return l == 2 ? 1 + e : 1000 + e; });
  const int64_t eb = account_weights(shape, r.types).routed_expert_bytes;
  for (int64_t host : {1, 5, 13, 40}) {
    r.gpu_mem = {no_offload_total(r) - host * eb};
    const PlanOutcome o = make_plan(r);
    ASSERT_TRUE(o.fits) << o.refusal;
    size_t lo = 99, hi = 0;
    for (const LayerPlan& l : o.plan.layers) lo = std::min(lo, l.host_experts.size()), hi = std::max(hi, l.host_experts.size());
    EXPECT_LE(hi - lo, 1u) << host << " host experts";
    EXPECT_EQ(o.plan.host_experts(), host);
    // The leftover experts go to the layer whose next candidate is least used: layer 2 first.
    if (host % 6 != 0) {
      EXPECT_EQ(o.plan.layers[2].host_experts.size(), hi);
    }
  }
}

TEST(PlacementPlanner, OffloadsNoMoreThanTheBudgetNeeds) {
  const ModelShape shape = small_shape();
  PlanRequest r = request_for(shape);
  const int64_t eb = account_weights(shape, r.types).routed_expert_bytes;
  for (int64_t short_by : {int64_t(1), eb / 2, eb, 7 * eb + 3, 50 * eb}) {
    r.gpu_mem = {no_offload_total(r) - short_by};
    r.embedding = EmbeddingHome::Gpu;  // keep the arithmetic to experts
    const PlanOutcome o = make_plan(r);
    ASSERT_TRUE(o.fits) << o.refusal;
    EXPECT_EQ(o.plan.host_experts(), (short_by + eb - 1) / eb);
    EXPECT_GE(o.plan.gpus[0].room(), 0);
    EXPECT_LT(o.plan.gpus[0].room(), eb);  // one expert fewer on the host would not fit
  }
}

TEST(PlacementPlanner, EveryExpertAccountedOnceAndGpuTotalsAddUp) {
  const ModelShape shape = small_shape(8, 16);
  PlanRequest r = request_for(shape);
  r.max_batch_tokens = 64;
  r.gpu_mem = {int64_t(0.6 * double(no_offload_total(r)) / 2), int64_t(0.5 * double(no_offload_total(r)) / 2),
               int64_t(0.45 * double(no_offload_total(r)) / 2)};
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.fits) << o.refusal;
  const Plan& p = o.plan;
  const int64_t eb = p.bytes.routed_expert_bytes;
  int64_t vram_experts = 0, host_bytes = 0, next_layer = 0;
  for (const GpuPlan& g : p.gpus) {
    EXPECT_EQ(g.first_layer, next_layer);  // contiguous ranges in GPU order
    next_layer += g.n_layers;
    EXPECT_LE(g.vram_total(), g.budget) << "gpu" << g.gpu;
    vram_experts += g.weights[TensorClass::RoutedExperts];
    host_bytes += g.host_bytes;
  }
  EXPECT_EQ(next_layer, 8);
  EXPECT_TRUE(p.gpus.back().lm_head);
  EXPECT_EQ(vram_experts + host_bytes, p.bytes.total[TensorClass::RoutedExperts]);
  EXPECT_EQ(host_bytes, p.host_experts() * eb);
  for (const LayerPlan& l : p.layers) {
    EXPECT_TRUE(std::is_sorted(l.host_experts.begin(), l.host_experts.end()));
    EXPECT_EQ(std::adjacent_find(l.host_experts.begin(), l.host_experts.end()), l.host_experts.end());
    EXPECT_EQ(l.gpu, [&] {
      for (const GpuPlan& g : p.gpus)
        if (l.layer >= g.first_layer && l.layer < g.first_layer + g.n_layers) return g.gpu;
      return -1;
    }());
  }
}

std::string refusal_of(const PlanRequest& r) {
  const PlanOutcome o = make_plan(r);
  EXPECT_FALSE(o.fits);
  EXPECT_NE(format_fit_report(o).find("REFUSED"), std::string::npos);
  return o.refusal;
}

TEST(PlacementPlanner, RefusalsSayByHowMuchAndWhatToChange) {
  const ModelShape shape = small_shape();
  PlanRequest r = request_for(shape);
  // KV of 8 x 4096 tokens alone is larger than the GPU.
  r.max_seqs = 8;
  r.max_model_len = 4096;
  const int64_t kv = 8 * 4096 * kv_bytes_per_token(shape.spec, KvFormat::BF16);
  r.gpu_mem = {kv / 2};
  std::string why = refusal_of(r);
  EXPECT_NE(why.find("does not fit even with every routed expert in host RAM"), std::string::npos) << why;
  EXPECT_NE(why.find("over its budget"), std::string::npos) << why;
  EXPECT_NE(why.find("--max-seqs"), std::string::npos) << why;
  EXPECT_NE(why.find("--max-model-len"), std::string::npos) << why;
  EXPECT_NE(why.find("--kv-format fp8"), std::string::npos) << why;

  // Host RAM too small for what must move.
  r = request_for(shape);
  const int64_t eb = account_weights(shape, r.types).routed_expert_bytes;
  r.gpu_mem = {no_offload_total(r) - 10 * eb};
  r.embedding = EmbeddingHome::Gpu;
  r.host_mem = 4 * eb;
  why = refusal_of(r);
  EXPECT_NE(why.find("host RAM: 10 routed experts"), std::string::npos) << why;
  EXPECT_NE(why.find("over by " + format_bytes(6 * eb)), std::string::npos) << why;
  EXPECT_NE(why.find("experts=q2_k"), std::string::npos) << why;

  // No offload allowed.
  r.host_mem = 0;
  r.allow_offload = false;
  why = refusal_of(r);
  EXPECT_NE(why.find("does not fit in VRAM without offload"), std::string::npos) << why;
  EXPECT_NE(why.find("allow offload"), std::string::npos) << why;

  // Nonsense is an error, not a refusal.
  r.gpu_mem = {};
  EXPECT_THROW(make_plan(r), Error);
  r = request_for(shape);
  r.profile = RoutingProfile::empty_for(small_shape(6, 8).spec);
  EXPECT_THROW(make_plan(r), Error);
}

TEST(PlacementPlanner, UniformBatchEstimateCountsDistinctExperts) {
  const ModelShape shape = small_shape();
  PlanRequest r = request_for(shape);
  r.min_host_fraction = 0.25;  // 4 of 16 per layer
  r.embedding = EmbeddingHome::Gpu;
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.fits);
  const double p = 2.0 / 16.0;  // top-2 of 16, uniform
  for (int64_t B : {1, 3, 16}) {
    const DecodeEstimate d = estimate_decode(o.plan, o.request, B, 100);
    const double distinct = 6 * 4 * (1 - std::pow(1 - p, double(B)));
    EXPECT_NEAR(d.expected_host_experts_per_step, distinct, 1e-9 * distinct);
    EXPECT_NEAR(d.host_bytes_per_token, distinct * double(o.plan.bytes.routed_expert_bytes) / double(B), 1e-6);
    // Expected: every byte at its rate one after the other, plus the overhead of each of the 6
    // layers; never faster than the bound.
    const Ceilings& c = o.request.ceilings;
    const double want = d.vram_bytes_per_step / (c.decode_vram_gbps * 1e9) + d.host_bytes_per_step / (c.host_read_gbps * 1e9) +
                        6 * 1e-6 * (c.layer_overhead_us + c.layer_overhead_us_per_token * double(B));
    EXPECT_NEAR(d.expected_step_seconds, want, 1e-12 * want);
    EXPECT_GT(d.expected_step_seconds, d.step_seconds);
    EXPECT_NEAR(d.expected_tokens_per_s_per_stream, 1.0 / want, 1e-9 / want);
  }
}

// The reference deployment (seeds/): 40 layers x 384 routed experts at ~3 bits, two GPUs capped at
// 95.6 GiB. It needed 102.1 GiB per GPU without offload and ran at 72.4 GiB with 30% of the routed
// experts (4,608 of 15,360) in host RAM.
TEST(PlacementPlanner, SeedBudgetRefusedWithoutOffloadFitsWithThirtyPercentOnHost) {
  const ModelShape seed = load_model_shape((fs::path(SPILL_TEST_DATA) / "shapes" / "seed.json").string());
  PlanRequest r{.shape = seed,
                .types = parse_tensor_class_types("experts=q3_k,attention=q8_0,embed=q8_0,head=q6_k,shared=q6_k"),
                .kv_format = KvFormat::Fp8E4m3,
                .gpu_mem = {int64_t(95.6 * double(GiB)), int64_t(95.6 * double(GiB))},
                .max_model_len = 131072,
                .max_seqs = 2};
  r.allow_offload = false;
  const PlanOutcome refused = make_plan(r);
  EXPECT_FALSE(refused.fits);
  // As the seed found: the weights alone are over the budget, before any KV.
  for (const GpuPlan& g : refused.no_offload) EXPECT_GT(g.weights.total(), g.budget) << "gpu" << g.gpu;
  std::printf("seed, no offload: weights %.2f / %.2f GiB per GPU (seed: 102.1), %.2f / %.2f with KV and workspace\n",
              gib(refused.no_offload[0].weights.total()), gib(refused.no_offload[1].weights.total()),
              gib(refused.no_offload[0].vram_total()), gib(refused.no_offload[1].vram_total()));

  r.allow_offload = true;
  r.min_host_fraction = 0.30;
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.fits) << o.refusal;
  EXPECT_EQ(o.plan.host_experts(), 4608);
  EXPECT_TRUE(o.plan.embedding_on_host);
  for (const GpuPlan& g : o.plan.gpus) {
    EXPECT_LE(g.vram_total(), g.budget);
    EXPECT_GT(g.room(), 4 * GiB) << "gpu" << g.gpu << ": room left for more KV";
  }
  for (const LayerPlan& l : o.plan.layers) EXPECT_TRUE(l.host_experts.size() == 115 || l.host_experts.size() == 116);
  std::printf("seed, 30%% on host: weights %.2f / %.2f GiB per GPU (seed: 72.4), %.2f / %.2f with KV and workspace\n",
              gib(o.plan.gpus[0].weights.total()), gib(o.plan.gpus[1].weights.total()), gib(o.plan.gpus[0].vram_total()),
              gib(o.plan.gpus[1].vram_total()));
}

}  // namespace
}  // namespace spill::placement
