// The in-place-or-staged choice for a step's host experts (offload/expert_staging.h): staged once
// in-place reads would cover at least half of what staging copies, under uniform routing.
#include <gtest/gtest.h>

#include "offload/expert_staging.h"

namespace {

using spill::offload::worth_staging;

TEST(ExpertStaging, DecodeStepsReadInPlaceAndPrefillChunksStage) {
  // S30: top-8 of 128. A t-token call touches 1 - (15/16)^t of the experts: 6% at 1 token, 40% at
  // 8, 47.6% at 10, 50.8% at 11.
  EXPECT_FALSE(worth_staging(1, 256, 8, 128));
  EXPECT_FALSE(worth_staging(8, 256, 8, 128));
  EXPECT_FALSE(worth_staging(10, 256, 8, 128));
  EXPECT_TRUE(worth_staging(11, 256, 8, 128));
  EXPECT_TRUE(worth_staging(512, 256, 8, 128));  // two calls: in place reads everything twice
  // The seed shape: top-6 of 384; (63/64)^44 = 0.5001, (63/64)^45 = 0.4923.
  EXPECT_FALSE(worth_staging(44, 256, 6, 384));
  EXPECT_TRUE(worth_staging(45, 256, 6, 384));
  // Calls of 4 tokens: 21 tokens are six calls of at most 4, each touching 1 - (63/64)^4 = 6.1%:
  // 36.6% in all, not staged; 40 tokens are ten calls, 61%: staged.
  EXPECT_FALSE(worth_staging(21, 4, 6, 384));
  EXPECT_TRUE(worth_staging(40, 4, 6, 384));
  // Nonsense never stages.
  EXPECT_FALSE(worth_staging(0, 256, 8, 128));
  EXPECT_FALSE(worth_staging(100, 0, 8, 128));
  EXPECT_FALSE(worth_staging(100, 256, 0, 128));
  EXPECT_FALSE(worth_staging(100, 256, 8, 0));
}

}  // namespace
