// The VRAM expert cache's policy (offload/expert_cache_policy.h) on hand-made traffic: what it
// admits, when an admitted expert is served, what it evicts and what it keeps.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "offload/expert_cache_policy.h"

namespace spill::offload {
namespace {

// Touch counts for `layers` MoE layers of `experts` experts: the listed (layer, expert) once each.
std::vector<uint32_t> touch_list(int layers, int experts, std::initializer_list<std::pair<int, int>> touched) {
  std::vector<uint32_t> t(size_t(layers * experts), 0);
  for (auto [l, e] : touched) t[size_t(l * experts + e)] += 1;
  return t;
}

std::vector<std::vector<bool>> all_on_host(int layers, int experts) {
  return std::vector<std::vector<bool>>(size_t(layers), std::vector<bool>(size_t(experts), true));
}

TEST(ExpertCachePolicy, OneTouchIsNotWorthACopyTwoAre) {
  ExpertCachePolicy p(all_on_host(1, 4), {.slots = 2});
  p.observe(touch_list(1, 4, {{0, 1}}));
  EXPECT_TRUE(p.decide().empty()) << "score " << p.score(0, 1);
  p.observe(touch_list(1, 4, {{0, 1}}));
  const std::vector<CacheAdmission> a = p.decide();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].expert, (CachedExpert{0, 1}));
  EXPECT_FALSE(a[0].evicted.valid());
  EXPECT_FALSE(p.served(0, 1)) << "served before its copy landed";
  EXPECT_GE(p.slot_of(0, 1), 0);
  p.landed(a[0].slot);
  EXPECT_TRUE(p.served(0, 1));
  EXPECT_EQ(p.slots_used(), 1);
  EXPECT_EQ(p.expert_in(a[0].slot), (CachedExpert{0, 1}));
}

TEST(ExpertCachePolicy, ScoresHalveEveryHalfLife) {
  ExpertCachePolicy p(all_on_host(1, 2), {.slots = 1, .half_life_steps = 8});
  p.observe(touch_list(1, 2, {{0, 0}}));
  for (int i = 0; i < 8; ++i) p.observe(touch_list(1, 2, {}));
  EXPECT_NEAR(p.score(0, 0), 0.5, 1e-12);
  p.observe(touch_list(1, 2, {}), 8);  // eight steps' counts at once decay as eight steps
  EXPECT_NEAR(p.score(0, 0), 0.25, 1e-12);
}

TEST(ExpertCachePolicy, HottestFirstAndNoMoreCopiesInFlightThanAllowed) {
  ExpertCachePolicy p(all_on_host(2, 4), {.slots = 8, .max_copies_in_flight = 2});
  // Heat: (1,3) touched 4 steps, (0,2) 3 steps, (0,0) 2 steps, (1,1) 2 steps.
  for (int step = 0; step < 4; ++step) {
    std::vector<uint32_t> t = touch_list(2, 4, {{1, 3}});
    if (step >= 1) t[2] = 1;
    if (step >= 2) t[0] = 1, t[4 + 1] = 1;
    p.observe(t);
  }
  std::vector<CacheAdmission> a = p.decide();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].expert, (CachedExpert{1, 3}));
  EXPECT_EQ(a[1].expert, (CachedExpert{0, 2}));
  EXPECT_TRUE(p.decide().empty()) << "two copies are in flight";
  p.landed(a[0].slot);
  a = p.decide();
  ASSERT_EQ(a.size(), 1u);
  // (0,0) and (1,1) tie: the lower (layer, expert) first.
  EXPECT_EQ(a[0].expert, (CachedExpert{0, 0}));
  EXPECT_EQ(p.copies_in_flight(), 2);
}

TEST(ExpertCachePolicy, VramExpertsAreNeverCached) {
  std::vector<std::vector<bool>> host = {{true, false, true}};
  ExpertCachePolicy p(host, {.slots = 3, .max_copies_in_flight = 3});
  for (int i = 0; i < 5; ++i) p.observe(touch_list(1, 3, {{0, 0}, {0, 1}, {0, 2}}));
  EXPECT_EQ(p.score(0, 1), 0.0);
  const std::vector<CacheAdmission> a = p.decide();
  ASSERT_EQ(a.size(), 2u);
  for (const CacheAdmission& x : a) EXPECT_NE(x.expert.expert, 1);
}

TEST(ExpertCachePolicy, AColdSlotGoesToAMuchHotterExpertButNotToAPeer) {
  ExpertCachePolicy p(all_on_host(1, 3), {.slots = 1, .half_life_steps = 4, .replace_margin = 1.0});
  for (int i = 0; i < 4; ++i) p.observe(touch_list(1, 3, {{0, 0}}));
  std::vector<CacheAdmission> a = p.decide();
  ASSERT_EQ(a.size(), 1u);
  p.landed(a[0].slot);
  ASSERT_TRUE(p.served(0, 0));
  // Expert 1 becomes as hot as expert 0 (both touched every step): not worth swapping.
  for (int i = 0; i < 12; ++i) p.observe(touch_list(1, 3, {{0, 0}, {0, 1}}));
  EXPECT_TRUE(p.decide().empty()) << p.score(0, 1) << " vs " << p.score(0, 0);
  // Expert 0 goes cold, expert 1 stays hot: 1 takes the slot, 0 is read from host again.
  for (int i = 0; i < 8; ++i) p.observe(touch_list(1, 3, {{0, 1}}));
  a = p.decide();
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].expert, (CachedExpert{0, 1}));
  EXPECT_EQ(a[0].evicted, (CachedExpert{0, 0}));
  EXPECT_FALSE(p.served(0, 0));
  EXPECT_EQ(p.slot_of(0, 0), -1);
  EXPECT_FALSE(p.served(0, 1)) << "its copy has not landed";
  EXPECT_EQ(p.evictions(), 1);
  p.landed(a[0].slot);
  EXPECT_TRUE(p.served(0, 1));
}

TEST(ExpertCachePolicy, ASlotStillCopyingIsNotTaken) {
  ExpertCachePolicy p(all_on_host(1, 2), {.slots = 1, .replace_margin = 0.0});
  p.observe(touch_list(1, 2, {{0, 0}}));
  p.observe(touch_list(1, 2, {{0, 0}}));
  ASSERT_EQ(p.decide().size(), 1u);
  for (int i = 0; i < 10; ++i) p.observe(touch_list(1, 2, {{0, 1}}));
  EXPECT_TRUE(p.decide().empty());
}

TEST(ExpertCachePolicy, OnePoolServesTheHotterLayerMore) {
  ExpertCachePolicy p(all_on_host(2, 8), {.slots = 4, .max_copies_in_flight = 8});
  for (int i = 0; i < 6; ++i) p.observe(touch_list(2, 8, {{0, 1}, {1, 0}, {1, 2}, {1, 4}, {1, 6}}));
  p.observe(touch_list(2, 8, {{1, 0}, {1, 2}, {1, 4}, {1, 6}}));
  const std::vector<CacheAdmission> a = p.decide();
  ASSERT_EQ(a.size(), 4u);
  for (const CacheAdmission& x : a) EXPECT_EQ(x.expert.moe_layer, 1);
}

TEST(ExpertCachePolicy, RefusesOptionsThatCannotWork) {
  EXPECT_THROW(ExpertCachePolicy(all_on_host(1, 2), {.slots = -1}), Error);
  EXPECT_THROW(ExpertCachePolicy(all_on_host(1, 2), {.slots = 1, .half_life_steps = 0}), Error);
  EXPECT_THROW(ExpertCachePolicy(all_on_host(1, 2), {.slots = 1, .half_life_steps = NAN}), Error);
  EXPECT_THROW(ExpertCachePolicy(all_on_host(1, 2), {.slots = 1, .max_copies_in_flight = 0}), Error);
  EXPECT_THROW(ExpertCachePolicy({{true, true}, {true}}, {.slots = 1}), Error);
  ExpertCachePolicy p(all_on_host(1, 2), {.slots = 1});
  EXPECT_THROW(p.observe(std::vector<uint32_t>(3, 0)), Error);
  EXPECT_THROW(p.landed(0), Error) << "slot 0 was not copying";
}

TEST(ExpertCachePolicy, NoSlotsNoAdmissions) {
  ExpertCachePolicy p(all_on_host(1, 2), {.slots = 0});
  for (int i = 0; i < 4; ++i) p.observe(touch_list(1, 2, {{0, 0}}));
  EXPECT_TRUE(p.decide().empty());
}

}  // namespace
}  // namespace spill::offload
