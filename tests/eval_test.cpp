// spill eval's figures against a float64 computation written here from the definitions
// (llama-perplexity --kl-divergence's): which tokens count, perplexity, KL divergence, its 99th
// percentile and top-1 agreement, on a tiny random model against its quantized self.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

#include "core/error.h"
#include "model/eval.h"
#include "model/model.h"
#include "model/quantize_on_load.h"
#include "model/runner.h"
#include "test_models.h"

namespace spill {

namespace fs = std::filesystem;

namespace {

struct EvalModels {
  fs::path dir;
  std::unique_ptr<Model> ref, quant;
  std::unique_ptr<ModelRunner> ref_runner, quant_runner;
  std::vector<int32_t> tokens;
  static constexpr int64_t kVocab = 300;

  explicit EvalModels(int32_t ctx) {
    dir = fs::temp_directory_path() / ("spill_eval_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    spill::testing::write_random_model(dir.string(), {.vocab_size = kVocab, .hidden_size = 256, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                                                  .head_dim = 64, .n_experts = 4, .moe_intermediate_size = 256, .seed = 3});
    ref = Model::load(dir.string());
    quant = Model::load(dir.string());
    quantize_model(*quant, quant::parse_quant_mix("experts=q2_k,attention=q8_0,head=q8_0"));
    const KvCacheConfig kv{.block_size = 16, .n_blocks = (ctx + 15) / 16};
    ref_runner = make_cpu_runner(*ref, kv, 1);
    quant_runner = make_cpu_runner(*quant, kv, 1);
    std::mt19937 rng(5);
    tokens.resize(230);
    for (int32_t& t : tokens) t = int32_t(rng() % kVocab);
  }
  ~EvalModels() { fs::remove_all(dir); }

  std::vector<float> window_logits(ModelRunner& r, const std::vector<int32_t>& window) {
    std::vector<int32_t> table(size_t((window.size() + 15) / 16));
    std::iota(table.begin(), table.end(), 0);
    ForwardBatch b;
    b.tokens = window;
    b.seqs.push_back({.first_token = 0, .n_tokens = int32_t(window.size()), .start_pos = 0, .block_table = table,
                      .want_logits = true});
    b.all_logits = true;
    std::vector<float> out;
    r.forward(b, out);
    return out;
  }
};

// log softmax in long double, straight from the definition.
std::vector<long double> log_softmax(const float* x, int64_t n) {
  long double m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max<long double>(m, x[i]);
  long double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp((long double)x[i] - m);
  std::vector<long double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = (long double)x[i] - m - std::log(s);
  return out;
}

}  // namespace

TEST(Eval, MatchesAFloat64ComputationOverTheScoredTokens) {
  for (int32_t stride : {0, 20}) {
    const int32_t ctx = 48;
    EvalModels f(ctx);
    const EvalOptions options{.ctx = ctx, .stride = stride};
    const EvalResult r = evaluate(*f.quant_runner, f.ref_runner.get(), f.tokens, options);

    // The reference computation: windows, scored positions, and every figure from the logits.
    const int32_t step = stride ? stride : ctx;
    const int32_t first = std::max(ctx / 2, ctx - 1 - step);
    std::vector<long double> nll, ref_nll, kld;
    int64_t same = 0, windows = 0;
    std::set<size_t> targets;
    for (size_t s = 0; s + size_t(ctx) <= f.tokens.size(); s += size_t(step), ++windows) {
      const std::vector<int32_t> window(f.tokens.begin() + long(s), f.tokens.begin() + long(s) + ctx);
      const std::vector<float> lq = f.window_logits(*f.quant_runner, window);
      const std::vector<float> lr = f.window_logits(*f.ref_runner, window);
      for (int32_t p = first; p < ctx - 1; ++p) {
        const size_t target = s + size_t(p) + 1;
        EXPECT_TRUE(targets.insert(target).second) << "token " << target << " scored twice";
        const auto q = log_softmax(lq.data() + size_t(p) * EvalModels::kVocab, EvalModels::kVocab);
        const auto b = log_softmax(lr.data() + size_t(p) * EvalModels::kVocab, EvalModels::kVocab);
        nll.push_back(-q[size_t(f.tokens[target])]);
        ref_nll.push_back(-b[size_t(f.tokens[target])]);
        long double k = 0;
        for (int64_t v = 0; v < EvalModels::kVocab; ++v) k += std::exp(b[size_t(v)]) * (b[size_t(v)] - q[size_t(v)]);
        kld.push_back(k);
        same += std::max_element(q.begin(), q.end()) - q.begin() == std::max_element(b.begin(), b.end()) - b.begin();
      }
    }
    const size_t n = nll.size();
    ASSERT_EQ(r.n_windows, windows);
    ASSERT_EQ(r.n_scored, int64_t(n));
    if (stride == 0) {
      EXPECT_EQ(n, size_t(windows) * size_t(ctx - 1 - ctx / 2));  // llama-perplexity's count
    }
    const long double ppl = std::exp(std::accumulate(nll.begin(), nll.end(), 0.0L) / n);
    const long double ref_ppl = std::exp(std::accumulate(ref_nll.begin(), ref_nll.end(), 0.0L) / n);
    const long double mean_kld = std::accumulate(kld.begin(), kld.end(), 0.0L) / n;
    std::vector<long double> sorted = kld;
    std::sort(sorted.begin(), sorted.end());
    const long double pos = 0.99L * (n - 1);
    const size_t ip = size_t(pos);
    const long double p99 = (1 - (pos - ip)) * sorted[ip] + (pos - ip) * sorted[std::min(ip + 1, n - 1)];
    // Logits are the same floats in both; the figures differ by double vs long double rounding
    // over a few thousand terms: 1e-12 relative.
    EXPECT_NEAR(r.ppl, double(ppl), 1e-12 * double(ppl));
    EXPECT_NEAR(r.ref_ppl, double(ref_ppl), 1e-12 * double(ref_ppl));
    EXPECT_NEAR(r.kld_mean, double(mean_kld), 1e-12 + 1e-9 * double(mean_kld));
    EXPECT_NEAR(r.kld_p99, double(p99), 1e-12 + 1e-9 * double(p99));
    EXPECT_NEAR(r.kld_max, double(sorted.back()), 1e-12 + 1e-9 * double(sorted.back()));
    EXPECT_DOUBLE_EQ(r.top1, double(same) / double(n));
    EXPECT_GT(r.kld_mean, 0);  // 2-bit experts do change the distributions
    EXPECT_LT(r.top1, 1.0 + 1e-12);
  }
}

TEST(Eval, SelfReferenceGivesZeroDivergence) {
  EvalModels f(32);
  const EvalResult r = evaluate(*f.ref_runner, f.ref_runner.get(), f.tokens, {.ctx = 32});
  EXPECT_NEAR(r.kld_mean, 0, 1e-12);
  EXPECT_EQ(r.top1, 1.0);
  EXPECT_DOUBLE_EQ(r.ppl, r.ref_ppl);
}

TEST(Eval, BosReplacesEachWindowsFirstToken) {
  EvalModels f(32);
  const EvalResult with_bos = evaluate(*f.ref_runner, nullptr, f.tokens, {.ctx = 32, .bos_token = 1});
  // The same as evaluating windows whose first token is 1, without the option.
  std::vector<int32_t> patched = f.tokens;
  for (size_t s = 0; s + 32 <= patched.size(); s += 32) patched[s] = 1;
  const EvalResult manual = evaluate(*f.ref_runner, nullptr, patched, {.ctx = 32});
  EXPECT_DOUBLE_EQ(with_bos.ppl, manual.ppl);
}

TEST(Eval, RejectsBadWindows) {
  EvalModels f(32);
  EXPECT_THROW(evaluate(*f.ref_runner, nullptr, f.tokens, {.ctx = 2}), Error);
  EXPECT_THROW(evaluate(*f.ref_runner, nullptr, f.tokens, {.ctx = 32, .stride = 40}), Error);
  EXPECT_THROW(evaluate(*f.ref_runner, nullptr, std::vector<int32_t>(10, 1), {.ctx = 32}), Error);
}

TEST(Eval, PercentileInterpolatesAsLlamaPerplexity) {
  const std::vector<double> v = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(sorted_percentile(v, 0.99), 9.9);
  EXPECT_DOUBLE_EQ(sorted_percentile(v, 0.5), 5);
  EXPECT_DOUBLE_EQ(sorted_percentile(v, 1.0), 10);
}

}  // namespace spill
