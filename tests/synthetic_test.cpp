// Synthetic models: any config shape, any format, finite forwards, sizes without filling, skewed routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "formats/model_spec.h"
#include "model/model.h"
#include "model/runner.h"
#include "model/synthetic_source.h"
#include "offload/host_memory.h"

namespace {

using spill::DType;
using spill::WeightKey;
using spill::WeightRole;

spill::ModelSpec tiny_moe_spec() {
  return spill::parse_model_spec(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 1000,
    "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
    "intermediate_size": 512, "norm_topk_prob": true, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "max_position_embeddings": 4096, "tie_word_embeddings": false})",
                                 "test config");
}

bool is_expert(WeightRole r) {
  return r == WeightRole::ExpertsGate || r == WeightRole::ExpertsUp || r == WeightRole::ExpertsDown;
}

// Experts Q4_K, big matrices Q8_0, norms and router F32: the S30 benchmark mix on a small shape.
spill::SyntheticOptions s30_like_mix(uint64_t seed) {
  spill::SyntheticOptions o;
  o.seed = seed;
  o.type_for = [](const WeightKey& k, int64_t rows, int64_t cols) {
    if (is_expert(k.role)) return DType::Q4_K;
    if (rows == 1 || k.role == WeightRole::Router) return DType::F32;
    return DType::Q8_0;
  };
  return o;
}

// Every routed (token, slot) pair per layer.
struct RouterCounts : spill::ForwardObserver {
  std::vector<std::vector<int64_t>> counts;
  void on_router(int layer, int64_t n, int64_t k, const int32_t* ids, const float*) override {
    if (counts.size() <= size_t(layer)) counts.resize(size_t(layer) + 1);
    counts[size_t(layer)].resize(8);
    for (int64_t i = 0; i < n * k; ++i) ++counts[size_t(layer)][size_t(ids[i])];
  }
};

std::vector<float> forward_all(const spill::Model& model, const std::vector<int32_t>& tokens,
                               spill::ForwardObserver* observer = nullptr) {
  const int32_t block = 16;
  const int32_t n_blocks = int32_t((tokens.size() + block - 1) / block);
  auto runner = spill::make_cpu_runner(model, {.block_size = block, .n_blocks = n_blocks}, 1);
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int32_t b = 0; b < n_blocks; ++b) table[size_t(b)] = b;
  spill::ForwardBatch batch;
  batch.tokens = tokens;
  batch.seqs.push_back({.first_token = 0, .n_tokens = int32_t(tokens.size()), .start_pos = 0, .block_table = table});
  batch.all_logits = true;
  std::vector<float> logits;
  runner->forward(batch, logits, observer);
  return logits;
}

std::vector<int32_t> some_tokens(int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((i * 7919 + 13) % 1000));
  return t;
}

TEST(Synthetic, QuantizedModelRunsWithFiniteSpreadLogits) {
  auto model = spill::Model::from_source(tiny_moe_spec(), spill::make_synthetic_source(tiny_moe_spec(), s30_like_mix(3)));
  EXPECT_EQ(model->layers[0].experts[5].gate.dtype, DType::Q4_K);
  EXPECT_EQ(model->layers[1].q.dtype, DType::Q8_0);
  const std::vector<float> logits = forward_all(*model, some_tokens(20));
  ASSERT_EQ(logits.size(), size_t(20 * 1000));
  double sum_sq = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    sum_sq += double(v) * v;
  }
  // Unit-variance activations through a unit-gain head: logits of order 1, not 0 and not huge.
  const double rms = std::sqrt(sum_sq / double(logits.size()));
  EXPECT_GT(rms, 0.1);
  EXPECT_LT(rms, 100.0);
}

TEST(Synthetic, SameSeedSameBytesOtherSeedOtherBytes) {
  const spill::ModelSpec spec = tiny_moe_spec();
  auto a = spill::make_synthetic_source(spec, s30_like_mix(5));
  auto b = spill::make_synthetic_source(spec, s30_like_mix(5));
  auto c = spill::make_synthetic_source(spec, s30_like_mix(6));
  for (const auto& [name, t] : a->tensors()) {
    const spill::TensorView& tb = b->tensors().at(name);
    const spill::TensorView& tc = c->tensors().at(name);
    ASSERT_EQ(t.nbytes(), tb.nbytes());
    EXPECT_EQ(std::memcmp(t.data, tb.data, t.nbytes()), 0) << name;
    EXPECT_NE(std::memcmp(t.data, tc.data, t.nbytes()), 0) << name;
  }
}

// A model made on demand: norms and routers at once, the matrices when prepared, in any pieces and
// order, to exactly the eager model's bytes; dropped pages go back to the kernel and a new prepare
// brings the same bytes; once everything is prepared (a reader in place), drop keeps the bytes.
TEST(Synthetic, OnDemandBytesAreTheEagerBytesInAnyPieces) {
  const spill::ModelSpec spec = tiny_moe_spec();
  auto eager = spill::make_synthetic_source(spec, s30_like_mix(5));
  spill::SyntheticOptions o = s30_like_mix(5);
  o.fill = spill::SyntheticFill::OnDemand;
  auto lazy = spill::make_synthetic_source(spec, o);
  const spill::TensorView& norm = lazy->tensors().at("blk.1.attn_norm.weight");
  EXPECT_EQ(std::memcmp(norm.data, eager->tensors().at("blk.1.attn_norm.weight").data, norm.nbytes()), 0);
  const spill::TensorView& gate = lazy->tensors().at("blk.0.ffn_gate_exps.weight");
  const auto* g = static_cast<const uint8_t*>(gate.data);
  EXPECT_TRUE(std::all_of(g, g + gate.nbytes(), [](uint8_t b) { return b == 0; })) << "not written before prepare";
  for (const auto& [name, t] : lazy->tensors()) {
    // Pieces of an odd size, the last first: rows are cut anywhere.
    const size_t piece = 1237, n = t.nbytes();
    for (size_t at = (n - 1) / piece * piece; ; at -= piece) {
      lazy->prepare(static_cast<const uint8_t*>(t.data) + at, std::min(piece, n - at));
      if (at == 0) break;
    }
    EXPECT_EQ(std::memcmp(t.data, eager->tensors().at(name).data, n), 0) << name;
  }
}

TEST(Synthetic, DroppedPagesAreGivenBackAndPreparedAgain) {
  spill::ModelSpec spec = tiny_moe_spec();
  spec.n_experts = 64;  // 64 x 256 rows of 144-byte Q4_K blocks: a 2.3 MB gate tensor
  auto eager = spill::make_synthetic_source(spec, s30_like_mix(9));
  spill::SyntheticOptions o = s30_like_mix(9);
  o.fill = spill::SyntheticFill::OnDemand;
  auto lazy = spill::make_synthetic_source(spec, o);
  const spill::TensorView& t = lazy->tensors().at("blk.1.ffn_gate_exps.weight");
  const spill::TensorView& want = eager->tensors().at("blk.1.ffn_gate_exps.weight");
  const int64_t before = spill::offload::read_process_memory().rss_anon;
  lazy->prepare(t.data, t.nbytes());
  const int64_t filled = spill::offload::read_process_memory().rss_anon;
  // From byte 100 on: the first page is not wholly inside the range and keeps its bytes.
  lazy->drop(static_cast<const uint8_t*>(t.data) + 100, t.nbytes() - 100);
  const int64_t dropped = spill::offload::read_process_memory().rss_anon;
  if (before < 0) GTEST_SKIP() << "the kernel does not report RssAnon";
  const int64_t bytes = int64_t(t.nbytes());
  EXPECT_GT(filled - before, bytes * 9 / 10) << "prepare writes the tensor";
  EXPECT_GT(filled - dropped, bytes * 9 / 10) << "drop gives its pages back";
  EXPECT_EQ(std::memcmp(t.data, want.data, 4096), 0) << "the first, shared page keeps its bytes";
  const auto* mid = static_cast<const uint8_t*>(t.data) + bytes / 2;
  EXPECT_TRUE(std::all_of(mid, mid + 1024, [](uint8_t b) { return b == 0; }));
  lazy->prepare(t.data, t.nbytes());
  EXPECT_EQ(std::memcmp(t.data, want.data, t.nbytes()), 0);
  lazy->prepare_all();
  lazy->drop(t.data, t.nbytes());
  EXPECT_EQ(std::memcmp(t.data, want.data, t.nbytes()), 0) << "after prepare_all nothing is dropped";
}

TEST(Synthetic, UnfilledS235ReportsItsBytesAtOnce) {
  const spill::ModelSpec spec = spill::parse_model_spec(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
    "hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1536,
    "intermediate_size": 12288, "norm_topk_prob": true, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "max_position_embeddings": 40960, "tie_word_embeddings": false})",
                                                        "s235");
  spill::SyntheticOptions o;
  o.fill = spill::SyntheticFill::Never;
  o.type_for = [](const WeightKey& k, int64_t, int64_t) { return is_expert(k.role) ? DType::Q3_K : DType::Q8_0; };
  const auto t0 = std::chrono::steady_clock::now();
  auto src = spill::make_synthetic_source(spec, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t expert_bytes = 0;
  for (const auto& [name, t] : src->tensors())
    if (name.find("_exps") != std::string::npos) expert_bytes += int64_t(t.nbytes());
  // By hand: 94 layers x 128 experts x (gate + up: 2 x 1536 rows of 4096, down: 4096 rows of 1536),
  // Q3_K = 110 bytes per 256 weights.
  const int64_t by_hand = 94LL * 128 * (2 * 1536 * (4096 / 256) * 110 + 4096 * (1536 / 256) * 110);
  EXPECT_EQ(expert_bytes, by_hand);
  EXPECT_LT(seconds, 5.0) << "reserving address space must not touch the 97 GB";
}

TEST(Synthetic, RoutingSkewConcentratesRoutings) {
  const spill::ModelSpec spec = tiny_moe_spec();
  auto shares = [&](double skew) {
    spill::SyntheticOptions o = s30_like_mix(11);
    o.routing_skew = skew;
    auto model = spill::Model::from_source(spec, spill::make_synthetic_source(spec, o));
    RouterCounts counts;
    forward_all(*model, some_tokens(200), &counts);
    std::vector<double> s;
    for (int64_t c : counts.counts[0]) s.push_back(double(c) / (200.0 * 2));  // share of routings
    std::sort(s.begin(), s.end());
    return s;
  };
  // Bias -1.5 ln(rank) on unit-variance logits: the first-ranked expert wins a top-2 slot almost
  // always (share of routings near 1/2), the last almost never. Without skew every expert is near 1/8.
  const std::vector<double> skewed = shares(1.5), uniform = shares(0.0);
  EXPECT_GT(skewed.back(), 0.35);
  EXPECT_LT(skewed.front(), 0.03);
  EXPECT_LT(uniform.back(), 0.30);
  EXPECT_GT(uniform.front(), 0.03);
}

}  // namespace
