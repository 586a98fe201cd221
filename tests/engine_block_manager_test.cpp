#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "core/error.h"
#include "engine/block_manager.h"

namespace spill {
namespace {

std::vector<int32_t> iota_tokens(int64_t n, int32_t first = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Registers the full blocks of tokens held in blocks, chaining keys as the scheduler does.
std::vector<PrefixKey> register_chain(BlockManager& bm, const std::vector<int32_t>& tokens,
                                      const std::vector<int32_t>& blocks, uint64_t salt = 0) {
  std::vector<PrefixKey> keys;
  PrefixKey parent = bm.root_key(salt);
  const int64_t bs = bm.block_size();
  for (size_t i = 0; i < blocks.size() && int64_t(i + 1) * bs <= int64_t(tokens.size()); ++i) {
    std::span<const int32_t> bt(tokens.data() + i * size_t(bs), size_t(bs));
    PrefixKey key = bm.chain_key(parent, bt);
    bm.register_full_block(blocks[i], key, parent, bt);
    keys.push_back(key);
    parent = key;
  }
  return keys;
}

int64_t hits(const BlockManager& bm, const std::vector<int32_t>& tokens, std::vector<int32_t>* blocks_out = nullptr,
             uint64_t salt = 0, int64_t max_blocks = 1 << 30) {
  std::vector<int32_t> blocks;
  std::vector<PrefixKey> keys;
  const int64_t n = bm.find_cached_prefix(tokens, salt, max_blocks, blocks, keys);
  EXPECT_EQ(int64_t(blocks.size()), n);
  EXPECT_EQ(int64_t(keys.size()), n);
  if (blocks_out) *blocks_out = blocks;
  return n;
}

TEST(BlockManager, AllocatesEveryBlockOnceAndRefusesMoreWithoutSideEffects) {
  BlockManager bm({.n_blocks = 5, .block_size = 4});
  std::vector<int32_t> got;
  ASSERT_TRUE(bm.allocate(3, got));
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(bm.allocate(3, got));  // only 2 left
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(bm.n_free(), 2);
  ASSERT_TRUE(bm.allocate(2, got));
  EXPECT_EQ(bm.n_free(), 0);
  EXPECT_TRUE(bm.allocate(0, got));
  bm.check_invariants();
  bm.release(got);
  EXPECT_EQ(bm.n_free(), 5);
  bm.check_invariants();
}

TEST(BlockManager, RejectsBadParameters) {
  EXPECT_THROW(BlockManager({.n_blocks = 0, .block_size = 16}), Error);
  EXPECT_THROW(BlockManager({.n_blocks = 4, .block_size = 0}), Error);
}

TEST(BlockManager, SharedBlocksAreRefCountedAndReleasedOnce) {
  BlockManager bm({.n_blocks = 4, .block_size = 2});
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.allocate(2, a));
  const auto tokens = iota_tokens(4);
  register_chain(bm, tokens, a);
  std::vector<int32_t> b;
  EXPECT_EQ(hits(bm, tokens, &b), 2);
  EXPECT_EQ(b, a);
  bm.acquire(b);
  EXPECT_EQ(bm.ref_count(a[0]), 2);
  EXPECT_EQ(bm.n_free(), 2);
  bm.release(a);
  EXPECT_EQ(bm.ref_count(a[0]), 1);
  EXPECT_EQ(bm.n_free(), 2);
  bm.release(b);
  EXPECT_EQ(bm.n_free(), 4);
  EXPECT_EQ(bm.stats().cached_free, 2);
  EXPECT_THROW(bm.release(b), Error);  // a double release is caught, not silently corrupting
  bm.check_invariants();
}

TEST(BlockManager, FreeCachedBlocksStayFindableAndComeBackOutOfTheFreeList) {
  BlockManager bm({.n_blocks = 4, .block_size = 2});
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.allocate(3, a));
  const auto tokens = iota_tokens(5);  // 2 full blocks + 1 partial
  register_chain(bm, tokens, a);
  EXPECT_TRUE(bm.is_cached(a[0]));
  EXPECT_TRUE(bm.is_cached(a[1]));
  EXPECT_FALSE(bm.is_cached(a[2]));  // partial: never cached
  bm.release(a);
  EXPECT_EQ(bm.n_free(), 4);
  std::vector<int32_t> b;
  EXPECT_EQ(hits(bm, tokens, &b), 2);
  EXPECT_EQ(bm.count_free(b), 2);
  bm.acquire(b);
  EXPECT_EQ(bm.n_free(), 2);
  bm.check_invariants();
}

TEST(BlockManager, PlainFreeBlocksAreUsedBeforeCachedOnesAndCachedOnesLeastRecentlyUsedFirst) {
  BlockManager bm({.n_blocks = 6, .block_size = 1});
  // Three single-block chains, released in order x, y, z; z is the most recently used.
  std::vector<int32_t> x, y, z;
  ASSERT_TRUE(bm.allocate(1, x));
  ASSERT_TRUE(bm.allocate(1, y));
  ASSERT_TRUE(bm.allocate(1, z));
  register_chain(bm, {10}, x);
  register_chain(bm, {20}, y);
  register_chain(bm, {30}, z);
  bm.release(x);
  bm.release(y);
  bm.release(z);
  // Touch x again: it becomes the most recently used.
  std::vector<int32_t> again;
  ASSERT_EQ(hits(bm, {10, 99}, &again), 1);
  bm.acquire(again);
  bm.release(again);
  // Three plain blocks are handed out before any cached content is given up.
  std::vector<int32_t> fresh;
  ASSERT_TRUE(bm.allocate(3, fresh));
  EXPECT_EQ(bm.stats().evictions, 0);
  EXPECT_EQ(hits(bm, {20, 0}), 1);
  // Next evictions: y (least recently used), then z; x survives longest.
  ASSERT_TRUE(bm.allocate(1, fresh));
  EXPECT_EQ(hits(bm, {20, 0}), 0);
  EXPECT_EQ(hits(bm, {30, 0}), 1);
  EXPECT_EQ(hits(bm, {10, 0}), 1);
  ASSERT_TRUE(bm.allocate(1, fresh));
  EXPECT_EQ(hits(bm, {30, 0}), 0);
  EXPECT_EQ(hits(bm, {10, 0}), 1);
  EXPECT_EQ(bm.stats().evictions, 2);
  bm.check_invariants();
}

TEST(BlockManager, ReleasingAChainEvictsItsTailBeforeItsHead) {
  BlockManager bm({.n_blocks = 3, .block_size = 2});
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.allocate(3, a));
  const auto tokens = iota_tokens(6);
  register_chain(bm, tokens, a);
  bm.release(a);
  std::vector<int32_t> one;
  ASSERT_TRUE(bm.allocate(1, one));
  EXPECT_EQ(one[0], a[2]);  // the tail went first
  EXPECT_EQ(hits(bm, tokens), 2);
}

TEST(BlockManager, KeysDependOnTheWholePrefixAndTheSalt) {
  BlockManager bm({.n_blocks = 8, .block_size = 2});
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.allocate(2, a));
  register_chain(bm, {1, 2, 3, 4}, a);
  EXPECT_EQ(hits(bm, {1, 2, 3, 4, 5}), 2);
  EXPECT_EQ(hits(bm, {1, 2, 3, 9}), 1);  // second block differs
  EXPECT_EQ(hits(bm, {0, 2, 3, 4}), 0);  // same second block behind a different first: no hit
  EXPECT_EQ(hits(bm, {1, 2, 3}), 1);     // a partial block never matches
  EXPECT_EQ(hits(bm, {1, 2, 3, 4}, nullptr, /*salt=*/7), 0);
  EXPECT_EQ(hits(bm, {1, 2, 3, 4}, nullptr, 0, /*max_blocks=*/1), 1);
  // Same tokens and salt under a different engine seed: still deterministic per instance.
  BlockManager other({.n_blocks = 2, .block_size = 2, .hash_seed = 42});
  BlockManager same({.n_blocks = 2, .block_size = 2, .hash_seed = 42});
  const std::vector<int32_t> t = {5, 6};
  EXPECT_EQ(other.chain_key(other.root_key(0), t), same.chain_key(same.root_key(0), t));
}

TEST(BlockManager, ADuplicateKeyLeavesTheSecondBlockPrivate) {
  BlockManager bm({.n_blocks = 4, .block_size = 2});
  std::vector<int32_t> a, b;
  ASSERT_TRUE(bm.allocate(1, a));
  ASSERT_TRUE(bm.allocate(1, b));
  const PrefixKey root = bm.root_key(0);
  const std::vector<int32_t> t = {3, 4};
  const PrefixKey key = bm.chain_key(root, t);
  EXPECT_TRUE(bm.register_full_block(a[0], key, root, t));
  EXPECT_FALSE(bm.register_full_block(b[0], key, root, t));
  EXPECT_FALSE(bm.is_cached(b[0]));
  bm.release(b);
  EXPECT_EQ(bm.stats().cached_free, 0);
  EXPECT_THROW(bm.register_full_block(a[0], key, root, std::vector<int32_t>{3}), Error);  // not full
  bm.check_invariants();
}

TEST(BlockManager, PrefixCachingOffNeverHits) {
  BlockManager bm({.n_blocks = 4, .block_size = 2, .prefix_caching = false});
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.allocate(2, a));
  register_chain(bm, {1, 2, 3, 4}, a);
  EXPECT_FALSE(bm.is_cached(a[0]));
  EXPECT_EQ(hits(bm, {1, 2, 3, 4}), 0);
}

// Random operations against a simple model of who holds what; the invariants hold throughout
// and everything returns to the pool at the end.
TEST(BlockManager, RandomWorkloadKeepsInvariantsAndLeaksNothing) {
  const int32_t bs = 3;
  BlockManager bm({.n_blocks = 40, .block_size = bs, .hash_seed = 1});
  std::mt19937 rng(7);
  struct Holder {
    std::vector<int32_t> tokens, blocks;
  };
  std::vector<Holder> holders;
  for (int iter = 0; iter < 3000; ++iter) {
    const int op = int(rng() % 3);
    if (op < 2 && holders.size() < 12) {
      // A new "sequence": tokens from a small alphabet so prefixes repeat often.
      Holder h;
      const int64_t len = 1 + int64_t(rng() % 20);
      for (int64_t i = 0; i < len; ++i) h.tokens.push_back(int32_t(rng() % 2));
      std::vector<PrefixKey> keys;
      const int64_t n_hit = bm.find_cached_prefix(h.tokens, 0, (len - 1) / bs, h.blocks, keys);
      const int64_t need = (len + bs - 1) / bs - n_hit;
      if (need > bm.n_free() - bm.count_free(h.blocks)) {
        h.blocks.clear();
        continue;
      }
      bm.acquire(h.blocks);
      ASSERT_TRUE(bm.allocate(need, h.blocks));
      // Every hit block's content equals ours.
      register_chain(bm, h.tokens, h.blocks);
      holders.push_back(std::move(h));
    } else if (!holders.empty()) {
      const size_t i = rng() % holders.size();
      bm.release(holders[i].blocks);
      holders.erase(holders.begin() + ptrdiff_t(i));
    }
    if (iter % 97 == 0) bm.check_invariants();
  }
  for (Holder& h : holders) bm.release(h.blocks);
  bm.check_invariants();
  EXPECT_EQ(bm.n_free(), bm.n_blocks());
  EXPECT_EQ(bm.stats().in_use, 0);
  EXPECT_GT(bm.stats().evictions, 0);
}

// Each KV group caches its own copy of a prefix: the same key finds a group's block only.
TEST(BlockManager, GroupsFindOnlyTheirOwnCachedBlocks) {
  BlockManager bm({.n_blocks = 4, .block_size = 2, .hash_seed = 1, .group_windows = {0, 3}});
  const std::vector<int32_t> tokens = {5, 6};
  const PrefixKey root = bm.root_key(0), key = bm.chain_key(root, tokens);
  std::vector<int32_t> full, sliding;
  ASSERT_TRUE(bm.allocate(1, full));
  ASSERT_TRUE(bm.allocate(1, sliding));
  EXPECT_TRUE(bm.register_full_block(full[0], key, root, tokens, 0));
  EXPECT_EQ(bm.find_block(1, key, root, tokens), kNoBlock) << "group 0's block must not serve group 1";
  EXPECT_TRUE(bm.register_full_block(sliding[0], key, root, tokens, 1)) << "the same key, another group";
  EXPECT_EQ(bm.find_block(0, key, root, tokens), full[0]);
  EXPECT_EQ(bm.find_block(1, key, root, tokens), sliding[0]);
  bm.release(full);
  bm.release(sliding);
  bm.check_invariants();
  EXPECT_EQ(bm.stats().cached_free, 2);
  EXPECT_THROW(BlockManager({.n_blocks = 4, .group_windows = {}}), Error);
  EXPECT_THROW(BlockManager({.n_blocks = 4, .group_windows = {0, 3, 4}}), Error);
}

}  // namespace
}  // namespace spill
