// gpt-oss, DeepSeek-V3 / Kimi-K2 and GLM-4.x: their published config.json files resolve into
// ModelSpec as their modeling code reads them, memory accounting counts their tensors (the
// published parameter counts are the reference) and MLA's latent KV, and the CPU forward of a tiny
// random model of each family gives every token the same logits whether the sequence is prefilled
// at once or decoded one token at a time through the paged KV cache (sliding windows shorter than
// the sequence, blocks smaller than the window, the latent cache), alone or batched with another.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "formats/model_spec.h"
#include "model/model.h"
#include "model/runner.h"
#include "model/synthetic_source.h"
#include "placement/memory.h"
#include "placement/planner.h"

namespace spill {
namespace {

namespace fs = std::filesystem;
const fs::path kShapes = fs::path(SPILL_TEST_DATA) / "shapes";

std::string read_file_for_test(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

placement::ModelShape shape_of(const char* file) { return placement::load_model_shape((kShapes / file).string()); }

// All classes F32: bytes / 4 is the parameter count (biases and sinks are counted as f32 too).
placement::TensorClassTypes all_f32() {
  placement::TensorClassTypes t;
  t.types.fill(DType::F32);
  return t;
}

int64_t params_of(const placement::ModelShape& shape) {
  const placement::ModelBytes b = placement::account_weights(shape, all_f32());
  return b.total.total() / 4;
}

// ---- published configs -> ModelSpec ------------------------------------------------------------

TEST(FamilySpec, DeepSeekV3) {
  const ModelSpec s = shape_of("deepseek-v3.json").spec;
  EXPECT_EQ(s.arch, Arch::DeepseekV3);
  EXPECT_EQ(s.attention, AttentionKind::Mla);
  EXPECT_EQ(s.mla.q_lora_rank, 1536);
  EXPECT_EQ(s.mla.kv_lora_rank, 512);
  EXPECT_EQ(s.mla.qk_nope_head_dim, 128);
  EXPECT_EQ(s.mla.qk_rope_head_dim, 64);
  EXPECT_EQ(s.mla.v_head_dim, 128);
  EXPECT_EQ(s.rope_dims(), 64);
  EXPECT_TRUE(s.rope_interleaved);
  EXPECT_EQ(s.kv_values_per_token(), 576);  // 512 latent + 64 rope key
  for (int l = 0; l < 61; ++l) EXPECT_EQ(s.layer_is_moe[size_t(l)], l >= 3) << l;
  EXPECT_EQ(s.n_experts, 256);
  EXPECT_EQ(s.n_experts_per_token, 8);
  EXPECT_EQ(s.n_shared_experts, 1);
  EXPECT_EQ(s.shared_intermediate_size(), 2048);
  EXPECT_EQ(s.router.kind, RouterKind::SigmoidGrouped);
  EXPECT_TRUE(s.router.correction_bias);
  EXPECT_EQ(s.router.n_group, 8);
  EXPECT_EQ(s.router.topk_group, 4);
  EXPECT_DOUBLE_EQ(s.router.routed_scaling_factor, 2.5);
  EXPECT_TRUE(s.norm_topk_prob);
  // YaRN: factor 40 over 4096 positions; cos/sin unscaled (mscale = mscale_all_dim), the softmax
  // scale 192^-0.5 * (0.1 ln 40 + 1)^2 (DeepSeek's yarn_get_mscale with mscale_all_dim = 1).
  EXPECT_EQ(s.rope.kind, RopeKind::Yarn);
  EXPECT_DOUBLE_EQ(s.rope.factor, 40.0);
  EXPECT_DOUBLE_EQ(s.rope.attention_factor, 1.0);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(s.softmax_scale(), m * m / std::sqrt(192.0), 1e-15);
}

TEST(FamilySpec, KimiK2) {
  const ModelSpec s = shape_of("kimi-k2.json").spec;
  EXPECT_EQ(s.arch, Arch::DeepseekV3);
  EXPECT_EQ(s.n_experts, 384);
  EXPECT_EQ(s.router.n_group, 1);
  EXPECT_DOUBLE_EQ(s.router.routed_scaling_factor, 2.827);
  EXPECT_FALSE(s.layer_is_moe[0]);
  EXPECT_TRUE(s.layer_is_moe[1]);
  EXPECT_EQ(s.kv_values_per_token(), 576);
}

TEST(FamilySpec, Glm46) {
  const ModelSpec s = shape_of("glm-4.6.json").spec;
  EXPECT_EQ(s.arch, Arch::Glm4Moe);
  EXPECT_EQ(s.attention, AttentionKind::Gqa);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.rope_dims(), 64);  // partial_rotary_factor 0.5
  EXPECT_FALSE(s.rope_interleaved);
  EXPECT_EQ(s.qk_norm, QkNorm::PerHead);
  EXPECT_TRUE(s.attention_bias);
  EXPECT_FALSE(s.attention_out_bias);
  EXPECT_EQ(s.n_experts, 160);
  EXPECT_EQ(s.n_shared_experts, 1);
  EXPECT_EQ(s.router.kind, RouterKind::SigmoidGrouped);
  for (int l = 0; l < 92; ++l) EXPECT_EQ(s.layer_is_moe[size_t(l)], l >= 3) << l;
  EXPECT_NEAR(s.softmax_scale(), 1 / std::sqrt(128.0), 1e-15);
  EXPECT_EQ(s.kv_values_per_token(), 2 * 8 * 128);
}

TEST(FamilySpec, GptOss120b) {
  const ModelSpec s = shape_of("gpt-oss-120b.json").spec;
  EXPECT_EQ(s.arch, Arch::GptOss);
  EXPECT_EQ(s.n_experts, 128);
  EXPECT_EQ(s.n_experts_per_token, 4);
  EXPECT_EQ(s.moe_intermediate_size, 2880);
  EXPECT_EQ(s.n_moe_layers(), 36);
  EXPECT_EQ(s.router.kind, RouterKind::TopKSoftmax);
  EXPECT_TRUE(s.router_bias);
  EXPECT_TRUE(s.expert_bias);
  EXPECT_EQ(s.expert_activation, MlpActivation::ClampedSwiGLU);
  EXPECT_DOUBLE_EQ(s.swiglu_limit, 7.0);
  EXPECT_DOUBLE_EQ(s.swiglu_alpha, 1.702);
  EXPECT_TRUE(s.attention_sinks);
  EXPECT_TRUE(s.attention_out_bias);
  EXPECT_EQ(s.sliding_window, 128);
  for (int l = 0; l < 36; ++l) EXPECT_EQ(s.sliding(l), l % 2 == 0) << l;
  EXPECT_EQ(s.rope.kind, RopeKind::Yarn);
  EXPECT_FALSE(s.rope.truncate);
  EXPECT_DOUBLE_EQ(s.rope.factor, 32.0);
  EXPECT_EQ(s.head_dim, 64);
}

// Configurations spill cannot run fail at load with the file and the field.
TEST(FamilySpec, UnsupportedVariantsFailClearly) {
  const std::string base = read_file_for_test((kShapes / "deepseek-v3.json").string());
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = base;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  auto message = [](const std::string& text) {
    try {
      parse_model_spec(text, "cfg.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(with("\"noaux_tc\"", "\"group_limited_greedy\"")).find("topk_method"), std::string::npos);
  EXPECT_NE(message(with("\"sigmoid\"", "\"softmax\"")).find("scoring_func"), std::string::npos);
  EXPECT_NE(message(with("\"n_group\": 8", "\"n_group\": 7")).find("n_group"), std::string::npos);
  EXPECT_NE(message(with("\"topk_group\": 4", "\"topk_group\": 9")).find("topk_group"), std::string::npos);
  EXPECT_NE(message(with("\"kv_lora_rank\": 512", "\"kv_lora_rank\": null")).find("kv_lora_rank"), std::string::npos);
  const std::string oss = read_file_for_test((kShapes / "gpt-oss-120b.json").string());
  std::string fp8 = oss;
  fp8.replace(fp8.find("\"mxfp4\""), 7, "\"fp8\"");
  EXPECT_NE(message(fp8).find("quant_method"), std::string::npos);
  std::string short_types = oss;
  short_types.replace(short_types.find("[\"sliding_attention\", "), 22, "[");
  EXPECT_NE(message(short_types).find("layer_types"), std::string::npos);
}

// ---- memory accounting --------------------------------------------------------------------------

// MLA caches 576 values per token per layer on DeepSeek-V3 (kv_lora_rank + qk_rope_head_dim), not
// the 128 heads x (192 + 128) of expanded keys and values; the CPU runner allocates exactly that.
TEST(FamilyMemory, MlaKvBytesAreTheLatent) {
  const ModelSpec s = shape_of("deepseek-v3.json").spec;
  EXPECT_EQ(placement::kv_bytes_per_token_per_layer(s, placement::KvFormat::F32), 576 * 4);
  EXPECT_EQ(placement::kv_bytes_per_token_per_layer(s, placement::KvFormat::BF16), 576 * 2);
  EXPECT_EQ(placement::kv_bytes_per_token(s, placement::KvFormat::BF16), 61 * 576 * 2);
  EXPECT_EQ(cpu_kv_bytes_per_block(s, 16), 61 * 16 * 576 * 4);
  const ModelSpec g = shape_of("gpt-oss-120b.json").spec;
  EXPECT_EQ(placement::kv_bytes_per_token_per_layer(g, placement::KvFormat::BF16), 2 * 8 * 64 * 2);
}

// gpt-oss-120b's KV: 18 full layers keep every position, its 18 sliding layers (window 128) only
// what their window and paging need (ceil(127 / 16) + 1 = 9 blocks of 16 at any context length).
// Figures from the published shape: 8 KV heads x 64 dims, K and V, 2 bytes in bf16.
TEST(FamilyMemory, GptOssSlidingLayersKeepOnlyTheirWindow) {
  const ModelSpec g = shape_of("gpt-oss-120b.json").spec;
  const int64_t per_layer = 2 * 8 * 64 * 2, ctx = 131072;
  EXPECT_EQ(kv_bytes_for_sequence(g, KvFormat::BF16, ctx, 16), 18 * ctx * per_layer + 18 * 9 * 16 * per_layer);
  EXPECT_EQ(kv_bytes_for_sequence(g, KvFormat::BF16, 100, 16), 36 * 112 * per_layer);  // 7 blocks, inside the window
  EXPECT_EQ(kv_bytes_per_token(g, KvFormat::BF16), 36 * per_layer) << "every layer, as an unpaged cache would";
  const KvGroups groups = kv_groups(g);
  ASSERT_EQ(groups.size(), 2);
  EXPECT_EQ(groups.layers_per_block(), 18);
  EXPECT_EQ(cpu_kv_bytes_per_block(g, 16), 18 * 16 * (2 * 8 * 64 * 4)) << "a block is one group's 18 layers deep";
  EXPECT_EQ(kv_blocks_for_sequence(groups.windows(), ctx, 16), ctx / 16 + 9);
  // The placement planner: max_seqs windows for the sliding layers, max_seqs contexts for the full ones.
  placement::PlanRequest r{.shape = shape_of("gpt-oss-120b.json"), .max_model_len = ctx, .max_seqs = 4};
  r.gpu_mem = {int64_t(1) << 50};
  const placement::PlanOutcome out = placement::make_plan(r);
  ASSERT_TRUE(out.fits) << out.refusal;
  EXPECT_EQ(out.plan.kv_tokens, 4 * ctx);
  EXPECT_EQ(out.plan.kv_bytes_per_token, 18 * per_layer);
  EXPECT_EQ(out.plan.kv_sliding_tokens, 4 * 9 * 16);
  EXPECT_EQ(out.plan.kv_sliding_bytes_per_token, 18 * per_layer);
  EXPECT_EQ(out.plan.kv_bytes(), 4 * kv_bytes_for_sequence(g, KvFormat::BF16, ctx, 16));
}

// Parameter counts against the published ones: DeepSeek-V3 671B (without its 14B MTP module),
// Kimi-K2 "1T", GLM-4.6 355B with its MTP layer (spill counts the 92 decoder layers), gpt-oss-120b
// 116.83B.
TEST(FamilyMemory, ParameterCountsMatchThePublishedOnes) {
  EXPECT_NEAR(double(params_of(shape_of("deepseek-v3.json"))), 671.0e9, 0.5e9);
  const double kimi = double(params_of(shape_of("kimi-k2.json")));
  EXPECT_GT(kimi, 1.0e12);
  EXPECT_LT(kimi, 1.05e12);
  const double glm = double(params_of(shape_of("glm-4.6.json")));
  EXPECT_GT(glm, 350e9);
  EXPECT_LT(glm, 355e9);
  EXPECT_NEAR(double(params_of(shape_of("gpt-oss-120b.json"))), 116.83e9, 0.05e9);
}

// One gpt-oss-120b expert in MXFP4 (its checkpoint's format): 3 matrices of 2880 rows of 90
// blocks of 17 bytes, plus 2 x 2880 + 2880 f32 biases.
TEST(FamilyMemory, GptOssExpertBytesInMxfp4) {
  placement::TensorClassTypes t;
  t[placement::TensorClass::RoutedExperts] = DType::MXFP4;
  const placement::ModelBytes b = placement::account_weights(shape_of("gpt-oss-120b.json"), t);
  EXPECT_EQ(b.routed_expert_bytes, 3 * 2880 * 90 * 17 + 4 * 3 * 2880);
  EXPECT_EQ(b.total[placement::TensorClass::RoutedExperts], 36 * 128 * b.routed_expert_bytes);
}

// ---- the forward of tiny random models ----------------------------------------------------------

const char* kTinyGptOss = R"({"model_type": "gpt_oss", "vocab_size": 97, "hidden_size": 48,
  "intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 12, "num_local_experts": 6, "num_experts_per_tok": 2, "sliding_window": 4,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "swiglu_limit": 1.5,
  "rope_theta": 150000, "max_position_embeddings": 4096,
  "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32, "beta_slow": 1, "truncate": false,
                   "original_max_position_embeddings": 512}})";
const char* kTinyDeepseek = R"({"model_type": "deepseek_v3", "vocab_size": 89, "hidden_size": 40,
  "intermediate_size": 56, "moe_intermediate_size": 12, "num_hidden_layers": 3, "num_attention_heads": 3,
  "num_key_value_heads": 3, "q_lora_rank": 16, "kv_lora_rank": 24, "qk_nope_head_dim": 8, "qk_rope_head_dim": 6,
  "v_head_dim": 10, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 3, "n_group": 4,
  "topk_group": 2, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
  "max_position_embeddings": 16384, "rope_scaling": {"type": "yarn", "factor": 4, "mscale": 1.0,
  "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}})";
const char* kTinyDeepseekNoQLora = R"({"model_type": "deepseek_v3", "vocab_size": 89, "hidden_size": 40,
  "intermediate_size": 56, "moe_intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 2,
  "num_key_value_heads": 2, "q_lora_rank": null, "kv_lora_rank": 16, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4,
  "v_head_dim": 6, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "first_k_dense_replace": 0, "norm_topk_prob": false})";
const char* kTinyGlm = R"({"model_type": "glm4_moe", "vocab_size": 83, "hidden_size": 40,
  "intermediate_size": 48, "moe_intermediate_size": 12, "num_hidden_layers": 3, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 16, "partial_rotary_factor": 0.5, "use_qk_norm": true,
  "attention_bias": true, "n_routed_experts": 6, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 3,
  "topk_group": 2, "first_k_dense_replace": 1, "routed_scaling_factor": 1.8, "norm_topk_prob": true})";

std::unique_ptr<Model> tiny_model(const char* config, uint64_t seed) {
  const ModelSpec spec = parse_model_spec(config, "tiny config");
  SyntheticOptions o;
  o.seed = seed;
  return Model::from_source(spec, make_synthetic_source(spec, o));
}

std::vector<int32_t> tokens_for(const Model& m, int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((i * 31 + salt * 17 + 5) % m.spec().vocab_size));
  return t;
}

// Logits of every position of one sequence, prefilled in one step.
std::vector<float> prefill(const Model& m, const std::vector<int32_t>& tokens, int32_t block_size) {
  auto runner = make_cpu_runner(m, {.block_size = block_size, .n_blocks = 40}, 2);
  std::vector<int32_t> table(16), sliding_table(16);
  std::iota(table.rbegin(), table.rend(), 3);  // blocks out of order
  std::iota(sliding_table.begin(), sliding_table.end(), 20);  // gpt-oss's second KV group, other blocks
  ForwardBatch b;
  b.tokens = tokens;
  b.seqs.push_back({.first_token = 0, .n_tokens = int32_t(tokens.size()), .start_pos = 0, .block_table = table});
  b.seqs.back().group_tables[0] = sliding_table;  // ignored by a model with one KV group
  b.all_logits = true;
  std::vector<float> logits;
  runner->forward(b, logits);
  return logits;
}

class FamilyForward : public ::testing::TestWithParam<const char*> {};

// Decoding through the cache (one token per step, a second sequence batched beside it on other
// blocks) gives each position exactly the prefill's logits: the KV layout, the window and the
// latent cache hold what the forward needs, and a token's arithmetic does not depend on the batch.
TEST_P(FamilyForward, DecodeThroughTheCacheEqualsPrefill) {
  auto model = tiny_model(GetParam(), 42);
  const int64_t V = model->spec().vocab_size;
  const auto a = tokens_for(*model, 11, 1), c = tokens_for(*model, 7, 2);
  const std::vector<float> want_a = prefill(*model, a, 3), want_c = prefill(*model, c, 3);
  for (float f : want_a) ASSERT_TRUE(std::isfinite(f));
  auto runner = make_cpu_runner(*model, {.block_size = 3, .n_blocks = 32}, 2);
  const std::vector<int32_t> table_a = {9, 2, 5, 0}, table_c = {7, 1, 4};
  const std::vector<int32_t> sliding_a = {13, 3, 11, 6}, sliding_c = {8, 12, 10};  // gpt-oss's second KV group
  for (size_t pos = 0; pos < a.size(); ++pos) {
    ForwardBatch b;
    b.tokens = {a[pos]};
    b.seqs.push_back({.first_token = 0, .n_tokens = 1, .start_pos = int32_t(pos), .block_table = table_a,
                      .want_logits = true});
    b.seqs.back().group_tables[0] = sliding_a;
    if (pos < c.size()) {
      b.tokens.push_back(c[pos]);
      b.seqs.push_back({.first_token = 1, .n_tokens = 1, .start_pos = int32_t(pos), .block_table = table_c,
                        .want_logits = true, .slot = 1});
      b.seqs.back().group_tables[0] = sliding_c;
    }
    std::vector<float> logits;
    runner->forward(b, logits);
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(logits[size_t(v)], want_a[pos * size_t(V) + size_t(v)]) << "pos " << pos;
    if (pos < c.size()) {
      for (int64_t v = 0; v < V; ++v) ASSERT_EQ(logits[size_t(V + v)], want_c[pos * size_t(V) + size_t(v)]) << "pos " << pos;
    }
  }
}

std::string family_name(const ::testing::TestParamInfo<const char*>& info) {
  static const char* const names[] = {"gpt_oss", "deepseek_v3", "deepseek_v3_no_q_lora", "glm4_moe"};
  return names[info.index];
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyForward,
                         ::testing::Values(kTinyGptOss, kTinyDeepseek, kTinyDeepseekNoQLora, kTinyGlm), family_name);

// A sliding layer does not see past its window: in a one-layer gpt-oss model whose layer slides
// over 3 positions, changing token 2 leaves the logits of positions 5.. bit-identical and changes
// those of position 4 (whose window is 2..4).
TEST(FamilyForward, SlidingLayerDoesNotSeePastItsWindow) {
  const char* one_sliding = R"({"model_type": "gpt_oss", "vocab_size": 61, "hidden_size": 32,
    "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 3,
    "layer_types": ["sliding_attention"]})";
  auto model = tiny_model(one_sliding, 7);
  const int64_t V = model->spec().vocab_size;
  std::vector<int32_t> t = tokens_for(*model, 9, 3);
  const std::vector<float> base = prefill(*model, t, 2);
  std::vector<int32_t> changed = t;
  changed[2] = (changed[2] + 11) % int32_t(V);  // position 2: outside the window of positions >= 5
  const std::vector<float> other = prefill(*model, changed, 2);
  for (size_t pos = 5; pos < t.size(); ++pos)
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(base[pos * size_t(V) + size_t(v)], other[pos * size_t(V) + size_t(v)]);
  bool differs = false;
  for (int64_t v = 0; v < V; ++v) differs |= base[4 * size_t(V) + size_t(v)] != other[4 * size_t(V) + size_t(v)];
  EXPECT_TRUE(differs) << "position 4's window (2..4) includes the changed token";
}

}  // namespace
}  // namespace spill
