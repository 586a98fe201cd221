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

TEST(PlacementPlanner, LayerSplitAccountsEveryExpertOnceAndGpuTotalsAddUp) {
  const ModelShape shape = small_shape(8, 16);
  PlanRequest r = request_for(shape);
  r.parallel = Parallelism::Layers;
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

// Per layer and GPU: the experts it owns in VRAM and in host RAM, counted from the plan's own lists.
struct Owned {
  std::vector<std::vector<int64_t>> vram, host;  // [layer][gpu]
};
Owned owned_by_gpu(const Plan& p) {
  const size_t G = p.gpus.size();
  Owned o{.vram = std::vector<std::vector<int64_t>>(p.layers.size(), std::vector<int64_t>(G, 0)),
          .host = std::vector<std::vector<int64_t>>(p.layers.size(), std::vector<int64_t>(G, 0))};
  for (const LayerPlan& l : p.layers)
    for (size_t e = 0; e < l.owner.size(); ++e) {
      const bool on_host = std::binary_search(l.host_experts.begin(), l.host_experts.end(), int32_t(e));
      (on_host ? o.host : o.vram)[size_t(l.layer)][size_t(l.owner[e])] += 1;
    }
  return o;
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
  // Expert-parallel (the default for two GPUs): each GPU reads 57 or 58 of a layer's host experts
  // over its own link, and holds half of the KV (8 KV heads split 4 + 4).
  ASSERT_EQ(o.plan.parallel, Parallelism::Experts);
  const Owned own = owned_by_gpu(o.plan);
  for (size_t l = 0; l < 40; ++l) EXPECT_LE(std::abs(own.host[l][0] - own.host[l][1]), 1) << "layer " << l;
  EXPECT_EQ(o.plan.gpus[0].kv + o.plan.gpus[1].kv, o.plan.kv_bytes());
  std::printf("seed, 30%% on host: weights %.2f / %.2f GiB per GPU (seed: 72.4), %.2f / %.2f with KV and workspace\n",
              gib(o.plan.gpus[0].weights.total()), gib(o.plan.gpus[1].weights.total()), gib(o.plan.gpus[0].vram_total()),
              gib(o.plan.gpus[1].vram_total()));
}

// ---- expert parallelism -------------------------------------------------------------------------

TEST(PlacementPlanner, ExpertParallelGivesEveryGpuAShareOfEveryLayer) {
  const ModelShape shape = small_shape(8, 16);
  PlanRequest r = request_for(shape);
  r.profile = profile_from(shape, [](int64_t l, int64_t e) { return 1 + (l * 7 + e * 13) % 17; });
  const int64_t eb = account_weights(shape, r.types).routed_expert_bytes;
  r.gpu_mem = {GiB, GiB};
  const int64_t all_in = make_plan(r).no_offload[0].vram_total();  // each GPU: 8 of each layer's 16 experts
  for (int64_t short_by : {int64_t(1), eb, 5 * eb + 7, 40 * eb}) {
    r.gpu_mem = {all_in - short_by, all_in - short_by};
    const PlanOutcome o = make_plan(r);
    ASSERT_TRUE(o.fits) << o.refusal;
    const Plan& p = o.plan;
    ASSERT_EQ(p.parallel, Parallelism::Experts);
    // Each GPU is short by the same bytes, so each puts exactly as many whole experts in host RAM.
    const int64_t per_gpu = (short_by + eb - 1) / eb;
    EXPECT_EQ(p.host_experts(), 2 * per_gpu) << "short by " << short_by;
    const Owned own = owned_by_gpu(p);
    int64_t vram_bytes = 0, host_bytes = 0;
    for (size_t g = 0; g < 2; ++g) {
      const GpuPlan& gp = p.gpus[g];
      EXPECT_EQ(gp.first_layer, 0);
      EXPECT_EQ(gp.n_layers, 8);
      EXPECT_LE(gp.vram_total(), gp.budget);
      EXPECT_LT(gp.room(), eb);  // one host expert fewer would not fit
      int64_t vram_experts = 0, host_experts = 0;
      for (size_t l = 0; l < 8; ++l) vram_experts += own.vram[l][g], host_experts += own.host[l][g];
      EXPECT_EQ(gp.weights[TensorClass::RoutedExperts], vram_experts * eb);
      EXPECT_EQ(gp.host_experts, host_experts);
      EXPECT_EQ(gp.host_bytes, host_experts * eb);
      vram_bytes += gp.weights[TensorClass::RoutedExperts];
      host_bytes += gp.host_bytes;
    }
    EXPECT_EQ(vram_bytes + host_bytes, p.bytes.total[TensorClass::RoutedExperts]);
    for (const LayerPlan& l : p.layers) {
      EXPECT_EQ(l.gpu, -1);
      ASSERT_EQ(l.owner.size(), 16u);
      for (int32_t g : l.owner) EXPECT_TRUE(g == 0 || g == 1) << g;
      // Both links busy in every layer, with counts within one of each other.
      const size_t L = size_t(l.layer);
      EXPECT_LE(std::abs(own.host[L][0] - own.host[L][1]), 1) << "layer " << l.layer;
      EXPECT_LE(std::abs(own.vram[L][0] - own.vram[L][1] + own.host[L][0] - own.host[L][1]), 2) << "layer " << l.layer;
      // The GPUs' usage in the layer differs by at most one expert's.
      double load[2] = {0, 0}, largest = 0;
      for (size_t e = 0; e < 16; ++e) {
        const bool on_host = std::binary_search(l.host_experts.begin(), l.host_experts.end(), int32_t(e));
        if (on_host) load[l.owner[e]] += p.usage[L][e], largest = std::max(largest, p.usage[L][e]);
      }
      EXPECT_LE(std::abs(load[0] - load[1]), largest + 1e-12) << "layer " << l.layer;
    }
    EXPECT_EQ(plan_to_json(o), plan_to_json(make_plan(r)));  // deterministic
  }
}

TEST(PlacementPlanner, ExpertParallelHostLinksStayBalancedWhenBudgetsDiffer) {
  const ModelShape shape = small_shape(8, 16);
  PlanRequest r = request_for(shape);
  const int64_t eb = account_weights(shape, r.types).routed_expert_bytes;
  r.gpu_mem = {GiB, GiB};
  const int64_t all_in = make_plan(r).no_offload[0].vram_total();
  r.gpu_mem = {all_in - 2 * eb, all_in - 30 * eb};  // the second GPU has 28 experts' less room
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.fits) << o.refusal;
  const Owned own = owned_by_gpu(o.plan);
  int64_t vram[2] = {0, 0};
  for (size_t l = 0; l < 8; ++l) {
    EXPECT_LE(std::abs(own.host[l][0] - own.host[l][1]), 1) << "layer " << l;
    vram[0] += own.vram[l][0], vram[1] += own.vram[l][1];
  }
  EXPECT_GT(vram[0], vram[1]);  // the larger GPU holds more of the VRAM experts
  EXPECT_EQ(o.plan.host_experts(), 32);  // 128 experts, rooms for 62 + 34 in VRAM
  for (const GpuPlan& g : o.plan.gpus) EXPECT_LE(g.vram_total(), g.budget) << "gpu" << g.gpu;
}

TEST(PlacementPlanner, ExpertParallelSplitsWhatDividesAndReplicatesTheRest) {
  const ModelShape shape = small_shape(6, 16);  // 4 query / 2 KV heads of 64, hidden 256
  PlanRequest r = request_for(shape);
  r.types = parse_tensor_class_types("experts=q4_k,attention=q8_0");
  const ModelBytes mb = account_weights(shape, r.types);
  const int64_t kv_per_layer = make_plan(r).plan.kv_tokens * kv_bytes_per_token_per_layer(shape.spec, KvFormat::BF16);
  r.gpu_mem = {GiB, GiB};
  PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.fits) << o.refusal;
  EXPECT_TRUE(o.plan.split.attention);  // 2 heads of 64 = 128 columns of o each: whole Q8_0 blocks
  EXPECT_TRUE(o.plan.split.vocab);
  for (const GpuPlan& g : o.plan.gpus) {
    EXPECT_EQ(g.weights[TensorClass::Attention], 6 * ((mb.layers[0].weights[TensorClass::Attention] + 1) / 2));
    EXPECT_EQ(g.weights[TensorClass::Router], mb.total[TensorClass::Router]);  // replicated
    EXPECT_EQ(g.kv, 6 * ((kv_per_layer + 1) / 2));
    EXPECT_TRUE(g.lm_head);
    EXPECT_EQ(g.weights[TensorClass::LmHead], (mb.total[TensorClass::LmHead] + 1) / 2);
  }
  // Three GPUs: 2 KV heads do not split; attention stays whole on each, and the report says why.
  r.gpu_mem = {GiB, GiB, GiB};
  o = make_plan(r);
  ASSERT_TRUE(o.fits) << o.refusal;
  EXPECT_FALSE(o.plan.split.attention);
  for (const GpuPlan& g : o.plan.gpus) {
    EXPECT_EQ(g.weights[TensorClass::Attention], mb.total[TensorClass::Attention]);
    EXPECT_EQ(g.kv, 6 * kv_per_layer);
  }
  EXPECT_NE(format_fit_report(o).find("attention replicated: 4 query / 2 KV heads do not split over 3 GPUs"),
            std::string::npos)
      << format_fit_report(o);
  // Replicated on request: everything but the experts on every GPU; the head on GPU 0 alone.
  r.gpu_mem = {GiB, GiB};
  r.attention = AttentionParallel::Replicated;
  o = make_plan(r);
  ASSERT_TRUE(o.fits) << o.refusal;
  EXPECT_FALSE(o.plan.split.attention || o.plan.split.vocab);
  EXPECT_TRUE(o.plan.gpus[0].lm_head);
  EXPECT_FALSE(o.plan.gpus[1].lm_head);
  EXPECT_EQ(o.plan.gpus[1].weights[TensorClass::Attention], mb.total[TensorClass::Attention]);
}

TEST(PlacementPlanner, ExpertParallelEstimateTakesEachLayersSlowestLink) {
  const ModelShape shape = small_shape(8, 16);
  PlanRequest r = request_for(shape);
  r.min_host_fraction = 0.25;  // 4 of 16 per layer: 2 per GPU
  r.gpu_mem = {GiB, GiB};
  r.ceilings.host_read_gbps = 1e-3;  // host reads dominate every layer
  const PlanOutcome o = make_plan(r);
  ASSERT_TRUE(o.fits) << o.refusal;
  const Plan& p = o.plan;
  const double eb = double(p.bytes.routed_expert_bytes), host = r.ceilings.host_read_gbps * 1e9;
  for (int64_t B : {1, 4}) {
    const DecodeEstimate d = estimate_decode(p, o.request, B, 100);
    // Each layer waits for the GPU whose host experts are touched most: computed from the owners.
    double slowest = 0, one_link = 0;
    for (const LayerPlan& l : p.layers) {
      double g_bytes[2] = {0, 0};
      for (int32_t e : l.host_experts)
        g_bytes[l.owner[size_t(e)]] += (1 - std::pow(1 - p.usage[size_t(l.layer)][size_t(e)], double(B))) * eb;
      slowest += std::max(g_bytes[0], g_bytes[1]);
      one_link += g_bytes[0] + g_bytes[1];
    }
    EXPECT_NEAR(d.slowest_link_host_bytes_per_step, slowest, 1e-6 * slowest);
    EXPECT_NEAR(d.host_bytes_per_step, one_link, 1e-6 * one_link);
    EXPECT_NEAR(d.step_seconds, slowest / host, 1e-3 * slowest / host);  // VRAM reads are noise at this ceiling
    EXPECT_LT(d.step_seconds, 0.6 * one_link / host);  // two links at once: about half of one link's time
    EXPECT_EQ(d.allreduces_per_step, 2 * 8 + 2);        // attention and MLP per layer; embedding and head
    const Ceilings& c = r.ceilings;
    EXPECT_GE(d.expected_step_seconds, d.step_seconds + 8 * 1e-6 * (c.layer_overhead_us + 2 * c.allreduce_us));
  }
}

TEST(PlacementPlanner, ExpertParallelRefusesWhenWhatEveryGpuHoldsIsAlreadyOverBudget) {
  const ModelShape shape = small_shape();  // 2 KV heads: over 3 GPUs the KV is replicated
  PlanRequest r = request_for(shape);
  r.max_seqs = 8;
  r.max_model_len = 4096;
  const int64_t kv = 8 * 4096 * kv_bytes_per_token(shape.spec, KvFormat::BF16);
  r.gpu_mem = {kv / 2, kv / 2, kv / 2};
  const std::string why = refusal_of(r);
  EXPECT_NE(why.find("does not fit even with every routed expert in host RAM"), std::string::npos) << why;
  EXPECT_NE(why.find("Expert parallel: attention replicated: 4 query / 2 KV heads do not split over 3 GPUs"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("--kv-format fp8"), std::string::npos) << why;
  // Over two GPUs the KV splits, half on each, and the same budget fits.
  r.gpu_mem = {kv / 2 + GiB / 4, kv / 2 + GiB / 4};
  const PlanOutcome o = make_plan(r);
  EXPECT_TRUE(o.fits) << o.refusal;
}

}  // namespace
}  // namespace spill::placement
