// spill bench's workloads: prompts of exact token counts (counted by the bundled model's real
// tokenizer), reproducible from the seed, and the named scenarios.
#include <gtest/gtest.h>

#include <filesystem>

#include "bench/workload.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace spill::bench {
namespace {

const std::string kTokenizer = std::string(SPILL_SOURCE_DIR) + "/models/spill-tiny/tokenizer.json";

TEST(BenchWorkload, TextHasExactlyTheTokensAsked) {
  Tokenizer tok = Tokenizer::from_file(kTokenizer);
  auto counter = make_local_counter(tok, kTokenizer);
  // Awkward sizes: one token, fewer than the tail reserve, block boundaries, the tiny model's context.
  for (int64_t n : {1, 2, 3, 15, 17, 100, 257, 1000, 1536, 4096}) {
    std::string text = text_with_tokens(*counter, n, 42 + uint64_t(n));
    EXPECT_EQ(int64_t(tok.encode(text, false).size()), n) << n;
  }
  EXPECT_EQ(text_with_tokens(*counter, 0, 1), "");
}

TEST(BenchWorkload, SameSeedSameText) {
  auto counter = make_local_counter(Tokenizer::from_file(kTokenizer), kTokenizer);
  EXPECT_EQ(text_with_tokens(*counter, 300, 7), text_with_tokens(*counter, 300, 7));
  EXPECT_NE(text_with_tokens(*counter, 300, 7), text_with_tokens(*counter, 300, 8));
}

TEST(BenchWorkload, ACounterThatCannotBeSatisfiedFails) {
  // Every text is "one token" to this counter, so 50 can never be reached.
  auto stuck = make_function_counter([](const std::string&) { return int64_t(1); }, "a broken counter");
  EXPECT_THROW(text_with_tokens(*stuck, 50, 1), Error);
}

TEST(BenchWorkload, SessionPlansAreSeededAndInRange) {
  Scenario s = select_scenarios("agent-4k").front();
  auto a = plan_session(s, 11), b = plan_session(s, 11), c = plan_session(s, 12);
  ASSERT_EQ(a.size(), size_t(s.turns));
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].user_tokens, b[i].user_tokens);
    EXPECT_EQ(a[i].max_tokens, b[i].max_tokens);
    EXPECT_EQ(a[i].text_seed, b[i].text_seed);
    EXPECT_GE(a[i].user_tokens, s.user_min_tokens);
    EXPECT_LE(a[i].user_tokens, s.user_max_tokens);
    EXPECT_TRUE(a[i].max_tokens == s.short_output || a[i].max_tokens == s.long_output);
    differs |= a[i].user_tokens != c[i].user_tokens;
  }
  EXPECT_TRUE(differs);
  // Over many sessions the long share approaches long_fraction (binomial: 3 sigma of 6000 turns).
  int total = 0, longs = 0;
  for (uint64_t seed = 0; seed < 1000; ++seed)
    for (const TurnPlan& p : plan_session(s, seed)) {
      ++total;
      longs += p.max_tokens == s.long_output;
    }
  double share = double(longs) / total, sigma = std::sqrt(s.long_fraction * (1 - s.long_fraction) / total);
  EXPECT_NEAR(share, s.long_fraction, 3 * sigma);
}

TEST(BenchWorkload, NamedScenariosAndGroups) {
  auto all = select_scenarios("all");
  ASSERT_EQ(all.size(), 9u);  // six agent scenarios, long-context, prefix-cache, pp-tg
  int agents = 0;
  for (const Scenario& s : all) agents += s.kind == ScenarioKind::Agent;
  EXPECT_EQ(agents, 6);
  EXPECT_EQ(all.front().name, "agent-4k");
  EXPECT_LE(select_scenarios("agent-256k").front().worst_case_tokens(), 262144);
  // The tiny group fits the bundled model's 2048-token context.
  for (const Scenario& s : select_scenarios("tiny")) EXPECT_LE(s.worst_case_tokens(), 2048) << s.name;
  EXPECT_EQ(select_scenarios("agent-4k,agent-4k").size(), 1u);
  EXPECT_THROW(select_scenarios("agent-5k"), Error);
  EXPECT_THROW(select_scenarios(","), Error);
}

}  // namespace
}  // namespace spill::bench
