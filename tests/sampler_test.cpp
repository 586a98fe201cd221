#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"
#include "sampling/sampling_math.h"
#include "test_values.h"

namespace spill {
namespace {

using test::kNegInf;

SampledToken pick(const SamplingParams& p, const std::vector<float>& logits, std::vector<int32_t> prompt = {},
                  uint64_t seed = 1) {
  SequenceSampler s(p, prompt, seed);
  SamplerWorkspace ws;
  return s.sample(logits, ws);
}

// Draws n tokens with one sampler and counts them.
std::map<int32_t, int64_t> histogram(const SamplingParams& p, const std::vector<float>& logits, int64_t n,
                                     uint64_t seed = 12345) {
  SamplingParams no_state = p;
  no_state.seed = seed;
  SequenceSampler s(no_state, {}, 0);
  SamplerWorkspace ws;
  std::map<int32_t, int64_t> counts;
  for (int64_t i = 0; i < n; ++i) ++counts[s.sample(logits, ws).token];
  return counts;
}

// Count of a token drawn n times with probability p is Binomial(n, p); a 5-sigma band fails a
// correct sampler with probability ~6e-7 per check, and a wrong distribution by a few percent
// falls far outside it at n = 200000.
void expect_binomial(int64_t count, int64_t n, double p, const char* what) {
  const double mean = double(n) * p;
  const double sigma = std::sqrt(double(n) * p * (1.0 - p));
  EXPECT_NEAR(double(count), mean, 5.0 * sigma + 1e-9) << what << ": expected probability " << p;
}

std::vector<float> logits_for_probs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(p > 0 ? float(std::log(p)) : kNegInf);
  return out;
}

TEST(Sampler, GreedyPicksArgmaxAndLowestIdOnTies) {
  const SamplingParams greedy{.temperature = 0.0f};
  EXPECT_EQ(pick(greedy, {0.1f, 3.0f, -2.0f, 1.0f}).token, 1);
  EXPECT_EQ(pick(greedy, {1.0f, 5.0f, 5.0f, 5.0f}).token, 1);  // torch.argmax returns the first maximum
  EXPECT_EQ(pick(greedy, {kNegInf, kNegInf, kNegInf, 0.0f}).token, 3);
  EXPECT_EQ(pick(greedy, {std::nanf(""), 2.0f, 1.0f}).token, 1);  // NaN is never picked
}

TEST(Sampler, AllMinusInfinityButOneAlwaysPicksIt) {
  const std::vector<float> logits = {kNegInf, kNegInf, 7.0f, kNegInf, kNegInf};
  for (SamplingParams p : {SamplingParams{}, SamplingParams{.temperature = 5.0f, .top_p = 0.01f},
                           SamplingParams{.top_k = 3, .min_p = 0.9f}}) {
    for (uint64_t seed = 0; seed < 50; ++seed) EXPECT_EQ(pick(p, logits, {}, seed).token, 2);
  }
}

TEST(Sampler, AllMinusInfinityIsAnErrorNotAGuess) {
  const std::vector<float> logits(8, kNegInf);
  EXPECT_THROW(pick(SamplingParams{}, logits), Error);
  EXPECT_THROW(pick(SamplingParams{.temperature = 0.0f}, logits), Error);
}

TEST(Sampler, TopKLargerThanVocabIsNoTruncation) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  const int64_t n = 200000;
  auto counts = histogram({.top_k = 1000}, logits_for_probs(probs), n);
  for (int32_t t = 0; t < 4; ++t) expect_binomial(counts[t], n, probs[size_t(t)], "top_k > vocab");
}

TEST(Sampler, TemperatureOneMatchesSoftmax) {
  const std::vector<double> probs = {1.0 / 6, 2.0 / 6, 3.0 / 6};
  const int64_t n = 200000;
  auto counts = histogram({}, logits_for_probs(probs), n);
  for (int32_t t = 0; t < 3; ++t) expect_binomial(counts[t], n, probs[size_t(t)], "softmax");
}

TEST(Sampler, TemperatureSharpens) {
  // logits ln(1), ln(3) at T = 0.5 become ln(1), ln(9): probabilities 0.1 and 0.9.
  const int64_t n = 200000;
  auto counts = histogram({.temperature = 0.5f}, logits_for_probs({0.25, 0.75}), n);
  expect_binomial(counts[0], n, 0.1, "T=0.5");
  expect_binomial(counts[1], n, 0.9, "T=0.5");
}

TEST(Sampler, TopKRenormalisesOverTheKBest) {
  const int64_t n = 200000;
  auto counts = histogram({.top_k = 2}, logits_for_probs({0.1, 0.2, 0.3, 0.4}), n);
  EXPECT_EQ(counts[0] + counts[1], 0);
  expect_binomial(counts[2], n, 3.0 / 7, "top_k=2");
  expect_binomial(counts[3], n, 4.0 / 7, "top_k=2");
}

TEST(Sampler, TopKTiesKeepTheLowerIds) {
  // Four equal tokens, top_k = 2: the two lowest ids survive (stable order, as a sort would give).
  auto counts = histogram({.top_k = 2}, {1.0f, 1.0f, 1.0f, 1.0f}, 20000);
  EXPECT_EQ(counts[2] + counts[3], 0);
  EXPECT_GT(counts[0], 0);
  EXPECT_GT(counts[1], 0);
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // Sorted probabilities 0.5, 0.333, 0.167: top_p = 0.6 keeps the first two (0.5 < 0.6).
  const int64_t n = 200000;
  auto counts = histogram({.top_p = 0.6f}, logits_for_probs({1.0 / 6, 2.0 / 6, 3.0 / 6}), n);
  EXPECT_EQ(counts[0], 0);
  expect_binomial(counts[1], n, 0.4, "top_p=0.6");
  expect_binomial(counts[2], n, 0.6, "top_p=0.6");
  // Exactly reaching p with the first token keeps only it.
  auto exact = histogram({.top_p = 0.5f}, logits_for_probs({1.0 / 6, 2.0 / 6, 3.0 / 6}), 5000);
  EXPECT_EQ(exact[2], 5000);
}

TEST(Sampler, TinyTopPIsGreedy) {
  const std::vector<float> logits = {0.3f, 0.31f, 0.29f, 0.305f};
  auto counts = histogram({.top_p = 1e-6f}, logits, 5000);
  EXPECT_EQ(counts[1], 5000);
}

TEST(Sampler, MinPDropsTokensBelowTheFractionOfTheBest) {
  // p = 0.5, 0.3, 0.15, 0.05; min_p = 0.25 -> threshold 0.125 keeps the first three.
  const int64_t n = 200000;
  auto counts = histogram({.min_p = 0.25f}, logits_for_probs({0.5, 0.3, 0.15, 0.05}), n);
  EXPECT_EQ(counts[3], 0);
  expect_binomial(counts[0], n, 0.5 / 0.95, "min_p");
  expect_binomial(counts[1], n, 0.3 / 0.95, "min_p");
  expect_binomial(counts[2], n, 0.15 / 0.95, "min_p");
  // min_p = 1 keeps only the best token.
  auto one = histogram({.min_p = 1.0f}, logits_for_probs({0.2, 0.5, 0.3}), 3000);
  EXPECT_EQ(one[1], 3000);
}

TEST(Sampler, TopKTopPMinPCompose) {
  // probs 0.4, 0.3, 0.2, 0.1; top_k = 3 -> 4/9, 3/9, 2/9; top_p = 0.7 -> keeps 0.444 and 0.333
  // (0.444 < 0.7, 0.778 >= 0.7) -> 4/7, 3/7; min_p = 0.8 of the best -> 3/4 < 0.8 drops token 1.
  auto counts = histogram({.top_k = 3, .top_p = 0.7f, .min_p = 0.8f}, logits_for_probs({0.4, 0.3, 0.2, 0.1}), 4000);
  EXPECT_EQ(counts[0], 4000);
  const int64_t n = 200000;
  auto two = histogram({.top_k = 3, .top_p = 0.7f}, logits_for_probs({0.4, 0.3, 0.2, 0.1}), n);
  EXPECT_EQ(two[2] + two[3], 0);
  expect_binomial(two[0], n, 4.0 / 7, "top_k+top_p");
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::sin(double(i) * 0.37) * 2.0);
  auto run = [&](uint64_t seed) {
    SequenceSampler s({.temperature = 1.3f, .top_p = 0.95f, .seed = seed}, {}, 999);
    SamplerWorkspace ws;
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits, ws).token);
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
  // The fallback seed is used when the request gives none.
  SequenceSampler a({}, {}, 42), b({}, {}, 42);
  SamplerWorkspace ws;
  for (int i = 0; i < 32; ++i) EXPECT_EQ(a.sample(logits, ws).token, b.sample(logits, ws).token);
  EXPECT_EQ(a.seed(), 42u);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  // Token 0 (logit 2.0, in the prompt) becomes 1.0; token 1 (-0.5, generated) becomes -1.0;
  // token 2 (1.5, unseen) stays and is now the best.
  SequenceSampler s({.temperature = 0.0f, .repetition_penalty = 2.0f}, std::vector<int32_t>{0, 0}, 1);
  SamplerWorkspace ws;
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, -0.5f, 1.5f}, ws).token, 2);
  // Generated 2 is now penalised too: 0.75 < 1.0 (token 0), so token 0 wins.
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, -0.5f, 1.5f}, ws).token, 0);
  // A penalty < 1 encourages repetition: logit -1 * 0.5 = -0.5 beats -0.6.
  EXPECT_EQ(pick({.temperature = 0.0f, .repetition_penalty = 0.5f}, {-0.6f, -1.0f}, {1}).token, 1);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  // Prompt tokens are not penalised by presence/frequency (OpenAI semantics).
  EXPECT_EQ(pick({.temperature = 0.0f, .presence_penalty = 2.0f}, {1.0f, 0.9f}, {0, 0, 0}).token, 0);
  SequenceSampler s({.temperature = 0.0f, .presence_penalty = 0.5f, .frequency_penalty = 0.25f}, {}, 1);
  SamplerWorkspace ws;
  const std::vector<float> logits = {2.0f, 1.4f, 0.0f};
  EXPECT_EQ(s.sample(logits, ws).token, 0);  // 2.0
  EXPECT_EQ(s.sample(logits, ws).token, 1);  // token 0 now 2.0 - 0.5 - 0.25 = 1.25 < 1.4
}

TEST(Sampler, FrequencyPenaltyGrowsWithCount) {
  SequenceSampler s({.temperature = 0.0f, .frequency_penalty = 0.3f}, {}, 1);
  SamplerWorkspace ws;
  const std::vector<float> logits = {1.0f, 0.5f};
  // token 0: 1.0, 0.7, 0.4 (< 0.5) -> 0, 0, then 1; token 1 then 0.2 vs 0.4 -> 0 again.
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(s.sample(logits, ws).token);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 0, 1, 0}));
}

TEST(Sampler, LogprobsAreRawLogSoftmaxWithTopAlternatives) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -1.0f, kNegInf};
  SamplingParams p{.temperature = 0.0f, .repetition_penalty = 1.5f, .logprobs = true, .top_logprobs = 3};
  SampledToken got = pick(p, logits, {1});  // the penalty moves the pick to token 2
  EXPECT_EQ(got.token, 2);
  double z = 0;
  for (float v : logits) z += std::exp(double(v));
  EXPECT_NEAR(got.logprob, 3.0 - std::log(z), 1e-6);  // unpenalised
  ASSERT_EQ(got.top.size(), 3u);
  EXPECT_EQ(got.top[0].token, 1);  // tie: lower id first
  EXPECT_EQ(got.top[1].token, 2);
  EXPECT_EQ(got.top[2].token, 0);
  EXPECT_NEAR(got.top[2].logprob, 1.0 - std::log(z), 1e-6);
  // More alternatives than finite tokens: -inf ones come last, never NaN.
  SampledToken all = pick({.temperature = 0.0f, .logprobs = true, .top_logprobs = 5}, logits);
  ASSERT_EQ(all.top.size(), 5u);
  EXPECT_EQ(all.top[4].token, 4);
  EXPECT_TRUE(std::isinf(all.top[4].logprob));
  // Without logprobs nothing is reported.
  EXPECT_TRUE(pick({.temperature = 0.0f}, logits).top.empty());
}

// A device sampler picks the token and the host sampler records it with accept(): every later
// pick (draw counter and penalty history) must be what it would have been had the host picked it.
// The draw's definition written the plain way: candidates sorted (score, then lower id), integer
// masses, top-k, top-p's prefix, min-p, then the first token whose cumulative mass passes the
// target. The sampler finds the same token with a digit search that never sorts (and that the
// GPU sampler shares); vocabularies above 32 candidates take that path.
int32_t reference_draw(const SamplingParams& p, const std::vector<float>& logits, uint64_t seed, uint64_t index) {
  const float inv_t = 1.0f / p.temperature;
  std::vector<float> s(logits.size());
  std::vector<int32_t> cand;
  for (size_t t = 0; t < logits.size(); ++t) {
    s[t] = logits[t] * inv_t;
    if (s[t] > kNegInf) cand.push_back(int32_t(t));
  }
  std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
  if (p.top_k > 0 && size_t(p.top_k) < cand.size()) cand.resize(size_t(p.top_k));
  const float max_score = s[size_t(cand[0])];
  std::vector<uint64_t> mass;
  uint64_t total = 0;
  for (int32_t t : cand) total += mass.emplace_back(sampling_mass(sampling_weight(s[size_t(t)], max_score)));
  if (p.top_p < 1.0f) {
    const uint64_t limit = sampling_top_p_limit(p.top_p, total);
    uint64_t before = 0;
    size_t keep = 0;
    while (keep < cand.size() && (keep == 0 || before < limit)) before += mass[keep++];
    cand.resize(keep);
    mass.resize(keep);
  }
  for (size_t i = 0; i < cand.size(); ++i)
    if (p.min_p > 0.0f && sampling_weight(s[size_t(cand[i])], max_score) < double(p.min_p)) mass[i] = 0;
  total = 0;
  for (uint64_t m : mass) total += m;
  const uint64_t target = sampling_target(seed, index, total);
  uint64_t cumulative = 0;
  int32_t last = -1;
  for (size_t i = 0; i < cand.size(); ++i) {
    if (mass[i] == 0) continue;
    last = cand[i];
    cumulative += mass[i];
    if (cumulative > target) return cand[i];
  }
  return last;
}

TEST(Sampler, DrawIsTheCumulativeIntegerMassInRankOrder) {
  std::mt19937_64 rng(77);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  const std::vector<SamplingParams> settings = {
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_k = 40},
      {.temperature = 1.0f, .top_p = 0.9f},
      {.temperature = 1.3f, .min_p = 0.05f},
      {.temperature = 0.8f, .top_k = 500, .top_p = 0.95f, .min_p = 0.01f},
      {.temperature = 2.0f, .top_k = 33},
  };
  for (int row = 0; row < 12; ++row) {
    std::vector<float> logits(3001);
    for (auto& x : logits) x = normal(rng);
    if (row % 3 == 1)
      for (auto& x : logits) x = std::round(x);  // many ties
    if (row % 3 == 2)
      for (size_t i = 0; i < logits.size(); i += 3) logits[i] = kNegInf;
    for (const SamplingParams& base : settings) {
      SamplingParams p = base;
      p.seed = rng();
      SequenceSampler s(p, {}, 0);
      SamplerWorkspace ws;
      for (uint64_t index = 0; index < 20; ++index)
        ASSERT_EQ(s.sample(logits, ws).token, reference_draw(p, logits, *p.seed, index))
            << "row " << row << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p << " index " << index;
    }
  }
}

TEST(Sampler, AcceptingAPickMadeElsewhereLeavesTheSamplerAsIfItHadPicked) {
  std::vector<float> logits(500);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::cos(double(i) * 0.21) * 1.5);
  const SamplingParams p{.temperature = 0.9f,
                         .top_k = 40,
                         .top_p = 0.9f,
                         .repetition_penalty = 1.3f,
                         .presence_penalty = 0.4f,
                         .frequency_penalty = 0.2f,
                         .seed = 77};
  const std::vector<int32_t> prompt = {5, 9, 9, 400};
  SequenceSampler host(p, prompt, 0), device_twin(p, prompt, 0);
  SamplerWorkspace ws;
  for (int i = 0; i < 48; ++i) {
    const int32_t picked = host.sample(logits, ws).token;
    if (i % 3 == 0) {
      device_twin.accept(picked);  // picked on "the device"
    } else {
      ASSERT_EQ(device_twin.sample(logits, ws).token, picked) << "pick " << i;
    }
    ASSERT_EQ(device_twin.n_sampled(), host.n_sampled());
  }
  EXPECT_EQ(host.n_sampled(), 48u);
  // The state a device sampler would upload is the same too.
  EXPECT_EQ(std::vector<int32_t>(device_twin.prompt_tokens().begin(), device_twin.prompt_tokens().end()),
            (std::vector<int32_t>{5, 9, 400}));
  ASSERT_EQ(device_twin.output_tokens().size(), host.output_tokens().size());
  int64_t total = 0;
  for (int32_t t : host.output_tokens()) {
    EXPECT_EQ(device_twin.output_count(t), host.output_count(t)) << "token " << t;
    total += host.output_count(t);
  }
  EXPECT_EQ(total, 48);
  EXPECT_EQ(host.output_count(-1), 0);
  EXPECT_THROW(device_twin.accept(-1), Error);
}

TEST(Sampler, ValidateNamesTheField) {
  auto message = [](const SamplingParams& p) {
    try {
      p.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message({}), "");
  EXPECT_NE(message({.temperature = -1.0f}).find("temperature"), std::string::npos);
  EXPECT_NE(message({.top_k = -2}).find("top_k"), std::string::npos);
  EXPECT_NE(message({.top_p = 0.0f}).find("top_p"), std::string::npos);
  EXPECT_NE(message({.min_p = 1.5f}).find("min_p"), std::string::npos);
  EXPECT_NE(message({.repetition_penalty = 0.0f}).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(message({.presence_penalty = 3.0f}).find("presence_penalty"), std::string::npos);
  EXPECT_NE(message({.frequency_penalty = -3.0f}).find("frequency_penalty"), std::string::npos);
  EXPECT_NE(message({.logprobs = true, .top_logprobs = 21}).find("top_logprobs"), std::string::npos);
  EXPECT_NE(message({.top_logprobs = 2}).find("logprobs"), std::string::npos);
}

}  // namespace
}  // namespace spill
