// The CUDA sampler against its CPU twin, SequenceSampler: for random logits rows (vocabularies of
// 1, 7, 50257 and 151936; ties, -inf and NaN logits), every parameter combination, many seeds and
// token indices, the GPU's token equals the CPU's exactly and its logprobs agree to within the
// rounding of the two log-softmax sums. Also a timing table (batch 1 / 8 / 64, vocab 151936).
#include <gtest/gtest.h>

#if SPILL_HAVE_CUDA
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda/sampling.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "sampling/sampler.h"
#include "test_values.h"

namespace spill {
namespace {

using test::kNegInf;

// The parameter combinations each row cycles through.
std::vector<SamplingParams> combinations() {
  std::vector<SamplingParams> c;
  c.push_back({.temperature = 0.0f});                                            // greedy
  c.push_back({.temperature = 0.0f, .repetition_penalty = 1.3f, .presence_penalty = 0.5f, .frequency_penalty = 0.7f});
  c.push_back({.temperature = 1.0f});                                            // temperature only
  c.push_back({.temperature = 0.7f});
  c.push_back({.temperature = 1.6f, .top_k = 1});
  c.push_back({.temperature = 1.0f, .top_k = 40});
  c.push_back({.temperature = 0.9f, .top_k = 5000});
  c.push_back({.temperature = 1.0f, .top_p = 0.9f});
  c.push_back({.temperature = 1.2f, .top_p = 0.3f});
  c.push_back({.temperature = 1.0f, .min_p = 0.05f});
  c.push_back({.temperature = 0.8f, .top_k = 50, .top_p = 0.95f, .min_p = 0.02f});  // combined
  c.push_back({.temperature = 1.0f, .top_k = 200, .top_p = 0.8f, .repetition_penalty = 1.2f});
  c.push_back({.temperature = 1.0f, .repetition_penalty = 0.8f, .presence_penalty = -1.0f, .frequency_penalty = 1.5f});
  c.push_back({.temperature = 0.6f, .top_p = 0.99f, .min_p = 0.1f, .presence_penalty = 2.0f});
  c.push_back({.temperature = 3.0f, .top_k = 2});
  c.push_back({.temperature = 1e-3f, .top_p = 0.5f});
  for (size_t i = 0; i < c.size(); ++i) {
    c[i].logprobs = (i % 3) != 0;
    c[i].top_logprobs = c[i].logprobs ? int32_t((i * 5 + 1) % (kMaxTopLogprobs + 1)) : 0;
  }
  return c;
}

// Logits of one row: kind 0 normal, 1 heavy ties (values on a coarse grid), 2 with -inf and NaN
// entries, 3 a peaked row (one dominant token), 4 all equal.
std::vector<float> make_logits(int64_t vocab, int kind, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (auto& x : v) x = normal(rng);
  if (kind == 1)
    for (auto& x : v) x = std::round(x * 2.0f) / 2.0f;
  if (kind == 2) {
    for (auto& x : v) {
      const float u = unit(rng);
      if (u < 0.3f) x = kNegInf;
      else if (u < 0.32f) x = std::nanf("");
    }
    v[size_t(vocab - 1)] = 1.0f;  // at least one finite logit
  }
  if (kind == 3) v[size_t(rng() % uint64_t(vocab))] = 40.0f;
  if (kind == 4)
    for (auto& x : v) x = 0.25f;
  return v;
}

// |a - b| allowed between the two logprobs: both round double log-softmax values to float, and the
// doubles differ by the sum's rounding (at most (vocab + 2) ulps relative, each side, with exp's
// error) and by the rounding of log_z; so one float ulp plus that.
float logprob_bound(float ref, int64_t vocab, float max_logit) {
  const double eps = std::ldexp(1.0, -52);
  const double log_z = std::fabs(double(max_logit)) + std::log(double(vocab)) + 1.0;
  const float ulp = std::nextafter(std::fabs(ref), std::numeric_limits<float>::infinity()) - std::fabs(ref);
  return ulp + float(2.0 * eps * (double(vocab) + 4.0 + log_z));
}

// A logprob of -inf (a -inf logit among the top alternatives) must be -inf on both sides.
void expect_logprob(float got, float want, int64_t vocab, float max_logit, const char* what, int index) {
  if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what << " " << index;
  } else {
    EXPECT_NEAR(got, want, logprob_bound(want, vocab, max_logit)) << what << " " << index;
  }
}

struct RowCase {
  SequenceSampler sampler;
  std::vector<float> logits;
};

// Runs `steps` steps over the rows: GPU pick vs a copy of each row's CPU sampler, then both accept
// the pick. Returns the number of rows checked.
int compare_rows(std::vector<RowCase>& rows, int64_t vocab, int steps) {
  cuda::SamplingPlan plan(int32_t(rows.size()), vocab);
  test::DeviceBuffer d_logits(rows.size() * size_t(vocab) * sizeof(float));
  std::vector<float> all(rows.size() * size_t(vocab));
  SamplerWorkspace ws;
  int checked = 0;
  for (int step = 0; step < steps; ++step) {
    for (size_t r = 0; r < rows.size(); ++r) {
      std::copy(rows[r].logits.begin(), rows[r].logits.end(), all.begin() + int64_t(r) * vocab);
      plan.set_row(int32_t(r), rows[r].sampler);
    }
    d_logits.upload(all.data(), all.size() * sizeof(float));
    plan.launch(d_logits.as<float>(), int32_t(rows.size()), nullptr);
    const auto got = plan.finish(nullptr);
    for (size_t r = 0; r < rows.size(); ++r) {
      SequenceSampler reference = rows[r].sampler;
      const SampledToken want = reference.sample(rows[r].logits, ws);
      const SamplingParams& p = reference.params();
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " row " << r << " step " << step << " T " << p.temperature
                                      << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p
                                      << " rep " << p.repetition_penalty << " seed " << reference.seed()
                                      << " index " << rows[r].sampler.n_sampled());
      EXPECT_EQ(got[r].token, want.token);
      const SampledToken host = cuda::to_sampled_token(got[r], p);
      EXPECT_EQ(host.top.size(), want.top.size());
      if (p.logprobs) {
        float max_logit = kNegInf;
        for (float x : rows[r].logits)
          if (x > max_logit) max_logit = x;
        expect_logprob(got[r].logprob, want.logprob, vocab, max_logit, "token", 0);
        EXPECT_EQ(got[r].top_count, int32_t(want.top.size()));
        for (int32_t i = 0; i < std::min<int32_t>(got[r].top_count, int32_t(want.top.size())); ++i) {
          EXPECT_EQ(got[r].top_tokens[i], want.top[size_t(i)].token) << "top " << i;
          expect_logprob(got[r].top_logprobs[i], want.top[size_t(i)].logprob, vocab, max_logit, "top", i);
        }
      }
      rows[r].sampler.accept(got[r].token);  // both continue from the same history
      ++checked;
    }
  }
  return checked;
}

void run_vocab(int64_t vocab, int n_rows, int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto combos = combinations();
  std::vector<RowCase> rows;
  for (int r = 0; r < n_rows; ++r) {
    SamplingParams p = combos[size_t(r) % combos.size()];
    p.seed = rng();
    std::vector<int32_t> prompt(size_t(rng() % 64));
    for (auto& t : prompt) t = int32_t(rng() % uint64_t(vocab + 2));  // a few out of vocabulary
    RowCase rc{SequenceSampler(p, prompt, 0), make_logits(vocab, int((r / int(combos.size())) + r) % 5, rng)};
    // Advance the token index and give the penalties an output history.
    const int history = int(rng() % 40);
    for (int i = 0; i < history; ++i) rc.sampler.accept(int32_t(rng() % uint64_t(std::min<int64_t>(vocab, 50))));
    rows.push_back(std::move(rc));
  }
  EXPECT_EQ(compare_rows(rows, vocab, steps), n_rows * steps);
}

TEST(CudaSampling, MatchesTheCpuSamplerVocab151936) {
  SPILL_SKIP_WITHOUT_GPU();
  run_vocab(151936, 64, 3, 1);
}

TEST(CudaSampling, MatchesTheCpuSamplerVocab50257) {
  SPILL_SKIP_WITHOUT_GPU();
  run_vocab(50257, 64, 3, 2);
}

TEST(CudaSampling, MatchesTheCpuSamplerSmallVocabularies) {
  SPILL_SKIP_WITHOUT_GPU();
  run_vocab(7, 64, 8, 3);
  run_vocab(1, 16, 4, 4);
  run_vocab(1000, 64, 4, 5);
}

TEST(CudaSampling, ManySeedsOnOneRowMatch) {
  SPILL_SKIP_WITHOUT_GPU();
  // One logits row, sampled with 64 seeds at once: the draw maps onto the filtered distribution
  // exactly as on the CPU across the whole [0, 1) range of draws.
  std::mt19937_64 rng(6);
  const auto logits = make_logits(4096, 0, rng);
  for (const SamplingParams& base : combinations()) {
    std::vector<RowCase> rows;
    for (int s = 0; s < 64; ++s) {
      SamplingParams p = base;
      p.seed = uint64_t(s) * 0x9E3779B97F4A7C15ull;
      rows.push_back({SequenceSampler(p, {}, 0), logits});
    }
    compare_rows(rows, 4096, 2);
  }
}

TEST(CudaSampling, InfiniteLogitsShareTheMass) {
  SPILL_SKIP_WITHOUT_GPU();
  std::vector<float> logits(1000, 1.0f);
  logits[17] = logits[400] = std::numeric_limits<float>::infinity();
  std::vector<RowCase> rows;
  for (int s = 0; s < 32; ++s) {
    SamplingParams p = combinations()[size_t(s) % 16];
    p.logprobs = false;
    p.top_logprobs = 0;
    p.seed = uint64_t(s);
    rows.push_back({SequenceSampler(p, {}, 0), logits});
  }
  compare_rows(rows, 1000, 3);
}

TEST(CudaSampling, NoFiniteLogitIsAnError) {
  SPILL_SKIP_WITHOUT_GPU();
  const int64_t vocab = 300;
  cuda::SamplingPlan plan(2, vocab);
  std::vector<float> logits(size_t(2 * vocab), kNegInf);
  logits[size_t(vocab + 5)] = std::nanf("");
  test::DeviceBuffer d(logits.size() * sizeof(float));
  d.upload(logits.data(), logits.size() * sizeof(float));
  for (float t : {0.0f, 1.0f}) {
    SequenceSampler a({.temperature = t}, {}, 1), b({.temperature = t}, {}, 2);
    plan.set_row(0, a);
    plan.set_row(1, b);
    plan.launch(d.as<float>(), 2, nullptr);
    const auto got = plan.finish(nullptr);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].token, -1);
    EXPECT_EQ(got[1].token, -1);
    EXPECT_THROW(cuda::to_sampled_token(got[0], a.params()), Error);
    SamplerWorkspace ws;
    EXPECT_THROW(a.sample(std::span<const float>(logits.data(), size_t(vocab)), ws), Error);
  }
}

TEST(CudaSampling, BadPlanArgumentsAreErrors) {
  SPILL_SKIP_WITHOUT_GPU();
  EXPECT_THROW(cuda::SamplingPlan(0, 100), Error);
  EXPECT_THROW(cuda::SamplingPlan(1, 0), Error);
  EXPECT_THROW(cuda::SamplingPlan(1, (int64_t(1) << 18) + 1), Error);
  cuda::SamplingPlan plan(2, 100);
  SequenceSampler s({}, {}, 1);
  EXPECT_THROW(plan.set_row(2, s), Error);
  EXPECT_THROW(plan.launch(nullptr, 1, nullptr), Error);
  test::DeviceBuffer d(100 * sizeof(float));
  EXPECT_THROW(plan.launch(d.as<float>(), 3, nullptr), Error);
}

// Not a correctness test: prints the time per launch (parameters up, kernel, results down, one
// stream synchronisation) at batch 1 / 8 / 64 for vocab 151936.
TEST(CudaSamplingBench, TimePerRowVocab151936) {
  SPILL_SKIP_WITHOUT_GPU();
  const int64_t vocab = 151936;
  std::mt19937_64 rng(9);
  std::vector<float> logits(size_t(64 * vocab));
  for (int r = 0; r < 64; ++r) {
    const auto row = make_logits(vocab, 0, rng);
    std::copy(row.begin(), row.end(), logits.begin() + r * vocab);
  }
  test::DeviceBuffer d(logits.size() * sizeof(float));
  d.upload(logits.data(), logits.size() * sizeof(float));
  cuda::SamplingPlan plan(64, vocab);
  struct Setting {
    const char* name;
    SamplingParams p;
  };
  const Setting settings[] = {
      {"greedy", {.temperature = 0.0f}},
      {"greedy+penalties", {.temperature = 0.0f, .repetition_penalty = 1.1f, .frequency_penalty = 0.5f}},
      {"temperature", {.temperature = 0.8f}},
      {"top_k=50 top_p=0.9", {.temperature = 0.8f, .top_k = 50, .top_p = 0.9f}},
      {"top_p=0.95 min_p=0.05", {.temperature = 1.0f, .top_p = 0.95f, .min_p = 0.05f}},
      {"temp + logprobs top 5", {.temperature = 0.8f, .logprobs = true, .top_logprobs = 5}},
  };
  std::printf("%-24s %6s %12s %12s\n", "setting", "batch", "us/launch", "us/row");
  std::vector<int32_t> prompt(200);
  for (auto& t : prompt) t = int32_t(rng() % uint64_t(vocab));
  for (const Setting& s : settings) {
    for (int batch : {1, 8, 64}) {
      std::vector<SequenceSampler> samplers;
      for (int r = 0; r < batch; ++r) {
        samplers.emplace_back(s.p, prompt, uint64_t(r));
        for (int i = 0; i < 100; ++i) samplers.back().accept(int32_t(rng() % uint64_t(vocab)));
      }
      double best = 1e30;
      for (int rep = 0; rep < 10; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < batch; ++r) plan.set_row(r, samplers[size_t(r)]);
        plan.launch(d.as<float>(), batch, nullptr);
        plan.finish(nullptr);
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        if (rep > 0) best = std::min(best, us);
      }
      std::printf("%-24s %6d %12.1f %12.2f\n", s.name, batch, best, best / batch);
    }
  }
}

}  // namespace
}  // namespace spill
#else
TEST(CudaSampling, SkippedWithoutCuda) { GTEST_SKIP() << "spill was built without CUDA"; }
#endif
