// fill_random_blocks: deterministic whatever the thread count, and every dequantized weight finite
// and small (|w| < 0.25 in the block formats, <= 1 in plain floats), for every DType.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "quant/quant.h"
#include "quant/random_blocks.h"

namespace spill {
namespace {

TEST(RandomBlocks, FiniteSmallWeightsAndThreadCountIndependent) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType t = DType(i);
    const int64_t blocks = 40000;  // more than two chunks of 2^14
    const size_t bytes = size_t(blocks * dtype_traits(t).block_bytes);
    std::vector<uint8_t> one(bytes), many(bytes);
    quant::fill_random_blocks(t, one.data(), blocks, 7, 1);
    quant::fill_random_blocks(t, many.data(), blocks, 7, 5);
    ASSERT_EQ(one, many) << dtype_name(t);
    std::vector<float> w(size_t(blocks * dtype_block_elems(t)));
    quant::dequantize_row(t, one.data(), w.data(), int64_t(w.size()));
    double sum_sq = 0;
    for (float v : w) {
      ASSERT_TRUE(std::isfinite(v) && std::fabs(v) <= (dtype_is_float(t) ? 1.0f : 0.25f)) << dtype_name(t) << " " << v;
      sum_sq += double(v) * v;
    }
    EXPECT_GT(sum_sq, 0.0) << dtype_name(t);  // not all zeros
    std::vector<uint8_t> other(bytes);
    quant::fill_random_blocks(t, other.data(), blocks, 8, 3);
    EXPECT_NE(one, other) << dtype_name(t) << ": another seed gives other bytes";
  }
}

}  // namespace
}  // namespace spill
