#include <gtest/gtest.h>

#include "engine/stop_strings.h"

namespace spill {
namespace {

// Feeds pieces one at a time; returns everything released and the match (if any).
std::pair<std::string, std::optional<std::string>> feed(StopStringMatcher& m, std::vector<std::string> pieces,
                                                        bool flush = true) {
  std::string shown;
  for (const std::string& p : pieces) {
    StopStringMatcher::Result r = m.push(p);
    shown += r.text;
    if (r.matched) return {shown, r.matched};
  }
  if (flush) shown += m.flush();
  return {shown, std::nullopt};
}

TEST(StopStrings, NoStopsPassEverythingThrough) {
  StopStringMatcher m;
  auto r = m.push("hello");
  EXPECT_EQ(r.text, "hello");
  EXPECT_FALSE(r.matched);
  EXPECT_EQ(m.held_bytes(), 0u);
}

TEST(StopStrings, MatchAcrossPiecesIsCutBeforeTheStopAndNothingOfItIsShown) {
  StopStringMatcher m({"</end>"});
  std::string shown;
  auto r1 = m.push("abc</");
  EXPECT_EQ(r1.text, "abc");  // "</" might start the stop string: held
  auto r2 = m.push("en");
  EXPECT_EQ(r2.text, "");
  auto r3 = m.push("d>tail");
  ASSERT_TRUE(r3.matched);
  EXPECT_EQ(*r3.matched, "</end>");
  EXPECT_EQ(r3.text, "");
}

TEST(StopStrings, AFalseStartIsReleasedOnceItCannotMatch) {
  StopStringMatcher m({"STOP"});
  auto r1 = m.push("xxST");
  EXPECT_EQ(r1.text, "xx");
  auto r2 = m.push("Ay");
  EXPECT_EQ(r2.text, "STAy");
  EXPECT_FALSE(r2.matched);
}

TEST(StopStrings, HeldTextIsReleasedAtTheEnd) {
  StopStringMatcher m({"\n\n"});
  auto [shown, matched] = feed(m, {"line", "\n"});
  EXPECT_FALSE(matched);
  EXPECT_EQ(shown, "line\n");
}

TEST(StopStrings, EarliestMatchWinsThenTheLongestAtThatPosition) {
  StopStringMatcher a({"cd", "bcde"});
  auto [shown_a, matched_a] = feed(a, {"abcdef"});
  EXPECT_EQ(shown_a, "a");
  EXPECT_EQ(*matched_a, "bcde");
  StopStringMatcher b({"ab", "abc"});
  auto [shown_b, matched_b] = feed(b, {"xabcz"});
  EXPECT_EQ(shown_b, "x");
  EXPECT_EQ(*matched_b, "abc");
}

TEST(StopStrings, StopAtTheVeryStartAndOverlappingPrefixes) {
  StopStringMatcher m({"aab"});
  auto [shown, matched] = feed(m, {"a", "a", "a", "b", "c"});  // "aaab": match starts at 1
  ASSERT_TRUE(matched);
  EXPECT_EQ(shown, "a");
  StopStringMatcher start({"x"});
  auto [s2, m2] = feed(start, {"xyz"});
  EXPECT_EQ(s2, "");
  EXPECT_TRUE(m2);
}

TEST(StopStrings, MultiByteCharactersAreNeverSplit) {
  StopStringMatcher m({"é!"});  // "é" is 2 bytes
  auto r1 = m.push("caf\xc3\xa9");
  EXPECT_EQ(r1.text, "caf");  // the whole "é" is held, not half of it
  auto r2 = m.push("?");
  EXPECT_EQ(r2.text, "\xc3\xa9?");
}

TEST(StopStrings, EmptyStopStringsAreIgnored) {
  StopStringMatcher m({"", "z"});
  auto [shown, matched] = feed(m, {"abc"});
  EXPECT_EQ(shown, "abc");
  EXPECT_FALSE(matched);
}

}  // namespace
}  // namespace spill
