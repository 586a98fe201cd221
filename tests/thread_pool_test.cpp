// ThreadPool (src/core/thread_pool.h): every index of a loop runs exactly once, for any thread count.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/thread_pool.h"

namespace {

// Counts how often each index of [0, n) was visited.
std::vector<int> visits(spill::ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  auto fn = [&](int64_t b, int64_t e) {
    EXPECT_LE(0, b);
    EXPECT_LT(b, e);
    EXPECT_LE(e, n);
    for (int64_t i = b; i < e; ++i) ++seen[size_t(i)];
  };
  pool.parallel_for(n, fn);
  std::vector<int> out;
  for (auto& s : seen) out.push_back(s.load());
  return out;
}

TEST(ThreadPool, EveryIndexRunsOnce) {
  for (int threads : {1, 2, 3}) {
    spill::ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1001}) {
      const std::vector<int> v = visits(pool, n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[size_t(i)], 1) << threads << " threads, n " << n << ", index " << i;
    }
  }
}

}  // namespace
