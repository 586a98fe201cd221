// Philox4x32-10 against the Random123 distribution's known-answer vectors (tests/kat_vectors,
// "philox4x32 10" lines: counter words, key words, expected output words).
#include <gtest/gtest.h>

#include "core/philox.h"

namespace {

struct Kat {
  uint32_t counter[4];
  uint32_t key[2];
  uint32_t expected[4];
};

TEST(Philox, MatchesRandom123KnownAnswers) {
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const spill::Philox4x32Block b =
        spill::philox4x32_10(k.counter[0], k.counter[1], k.counter[2], k.counter[3], k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(b.v[i], k.expected[i]) << "word " << i;
  }
}

TEST(Philox, UniformIsInUnitIntervalAndDependsOnSeedAndIndex) {
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = spill::philox_uniform01(7, uint64_t(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  // Mean of n uniforms: 0.5 with standard deviation sqrt(1/12/n) ~ 9.1e-4; 5 sigma.
  EXPECT_NEAR(sum / n, 0.5, 5 * 9.2e-4);
  EXPECT_NE(spill::philox_uniform01(7, 3), spill::philox_uniform01(8, 3));
  EXPECT_NE(spill::philox_uniform01(7, 3), spill::philox_uniform01(7, 4));
  EXPECT_EQ(spill::philox_uniform01(7, 3), spill::philox_uniform01(7, 3));
}

}  // namespace
