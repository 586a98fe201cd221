#include "engine/block_manager.h"

#include <algorithm>
#include <random>

#include "core/error.h"

namespace spill {

namespace {

// splitmix64's finaliser: a bijection with full avalanche, cheap enough to run per token.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// One 64-bit lane of a key: absorbs the parent and the tokens one at a time.
uint64_t hash_lane(uint64_t seed, uint64_t parent_a, uint64_t parent_b, std::span<const int32_t> tokens) {
  uint64_t h = mix64(seed ^ parent_a);
  h = mix64(h ^ (parent_b + 0x9e3779b97f4a7c15ull));
  for (int32_t t : tokens) h = mix64(h ^ (uint64_t(uint32_t(t)) * 0xff51afd7ed558ccdull + 0x632be59bd9b4e019ull));
  return mix64(h ^ uint64_t(tokens.size()));
}

uint64_t random_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

}  // namespace

BlockManager::BlockManager(const BlockManagerParams& params)
    : block_size_(params.block_size), prefix_caching_(params.prefix_caching), group_windows_(params.group_windows) {
  if (params.block_size <= 0) fail("KV cache: block size must be positive, got {}", params.block_size);
  if (group_windows_.empty() || group_windows_.size() > size_t(kMaxKvGroups))
    fail("KV cache: {} KV cache groups; spill keeps 1 to {}", group_windows_.size(), kMaxKvGroups);
  for (int32_t w : group_windows_)
    if (w < 0) fail("KV cache: a sliding window of {} positions", w);
  if (params.n_blocks <= 0) fail("KV cache: the pool needs at least one block, got {}", params.n_blocks);
  if (params.n_blocks > int64_t(INT32_MAX))
    fail("KV cache: {} blocks is more than a block id can name", params.n_blocks);
  const uint64_t seed = params.hash_seed ? params.hash_seed : random_seed();
  seed_lo_ = mix64(seed);
  seed_hi_ = mix64(seed ^ 0x5851f42d4c957f2dull);
  blocks_.resize(size_t(params.n_blocks));
  // Ascending ids from the front: the first allocations get blocks 0, 1, 2, ... (readable traces).
  for (int32_t b = int32_t(params.n_blocks) - 1; b >= 0; --b) list_push_front(b);
  n_free_ = params.n_blocks;
}

BlockManagerStats BlockManager::stats() const {
  BlockManagerStats s;
  s.n_blocks = n_blocks();
  s.free = n_free_;
  s.in_use = n_blocks() - n_free_;
  s.cached = n_registered_;
  s.cached_free = n_cached_free_;
  s.evictions = evictions_;
  return s;
}

PrefixKey BlockManager::root_key(uint64_t salt) const {
  return {hash_lane(seed_lo_, salt, 0, {}), hash_lane(seed_hi_, salt, 1, {})};
}

PrefixKey BlockManager::chain_key(const PrefixKey& parent, std::span<const int32_t> block_tokens) const {
  return {hash_lane(seed_lo_, parent.lo, parent.hi, block_tokens),
          hash_lane(seed_hi_, parent.hi, parent.lo, block_tokens)};
}

PrefixKey BlockManager::group_key(const PrefixKey& key, int32_t group) const {
  if (group == 0) return key;
  return {mix64(key.lo ^ (uint64_t(group) * 0xd6e8feb86659fd93ull)), mix64(key.hi + uint64_t(group))};
}

int32_t BlockManager::find_block(int32_t group, const PrefixKey& key, const PrefixKey& parent,
                                 std::span<const int32_t> block_tokens) const {
  auto it = by_key_.find(group_key(key, group));
  if (it == by_key_.end()) return kNoBlock;
  const Block& b = blocks_[size_t(it->second)];
  if (b.group != group || b.parent != parent ||
      !std::equal(b.tokens.begin(), b.tokens.end(), block_tokens.begin(), block_tokens.end()))
    return kNoBlock;  // a 128-bit collision: astronomically unlikely, but never share on a mere hash match
  return it->second;
}

int64_t BlockManager::find_cached_prefix(std::span<const int32_t> tokens, uint64_t salt, int64_t max_blocks,
                                         std::vector<int32_t>& blocks, std::vector<PrefixKey>& keys,
                                         int32_t group) const {
  if (!prefix_caching_) return 0;
  const int64_t full_blocks = std::min<int64_t>(max_blocks, int64_t(tokens.size()) / block_size_);
  PrefixKey parent = root_key(salt);
  int64_t hits = 0;
  for (int64_t i = 0; i < full_blocks; ++i) {
    std::span<const int32_t> block_tokens = tokens.subspan(size_t(i * block_size_), size_t(block_size_));
    const PrefixKey key = chain_key(parent, block_tokens);
    const int32_t b = find_block(group, key, parent, block_tokens);
    if (b == kNoBlock) break;
    blocks.push_back(b);
    keys.push_back(key);
    parent = key;
    ++hits;
  }
  return hits;
}

int64_t BlockManager::count_free(std::span<const int32_t> blocks) const {
  int64_t n = 0;
  for (int32_t b : blocks) n += b != kNoBlock && blocks_[size_t(b)].ref_count == 0;
  return n;
}

void BlockManager::acquire(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    if (b == kNoBlock) continue;
    Block& blk = blocks_[size_t(b)];
    if (blk.ref_count == 0) {
      list_remove(b);
      --n_free_;
    }
    ++blk.ref_count;
  }
}

bool BlockManager::allocate(int64_t n, std::vector<int32_t>& out) {
  if (n < 0) fail("KV cache: cannot allocate {} blocks", n);
  if (n > n_free_) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = head_;
    list_remove(b);
    --n_free_;
    Block& blk = blocks_[size_t(b)];
    if (blk.registered) {
      unregister(b);
      ++evictions_;
    }
    blk.ref_count = 1;
    out.push_back(b);
  }
  return true;
}

void BlockManager::release(std::span<const int32_t> blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    if (b == kNoBlock) continue;
    Block& blk = blocks_[size_t(b)];
    if (blk.ref_count <= 0) fail("KV cache: block {} released more often than acquired (internal error)", b);
    if (--blk.ref_count > 0) continue;
    // A cached block goes to the back (evicted last, most recently used); a plain one to the
    // front, so it is reused before any cached content is given up.
    if (blk.registered) {
      list_push_back(b);
    } else {
      list_push_front(b);
    }
    ++n_free_;
  }
}

bool BlockManager::register_full_block(int32_t block, const PrefixKey& key, const PrefixKey& parent,
                                       std::span<const int32_t> block_tokens, int32_t group) {
  if (!prefix_caching_) return false;
  if (int64_t(block_tokens.size()) != block_size_)
    fail("KV cache: only full blocks can be cached ({} tokens given, block size {})", block_tokens.size(), block_size_);
  if (group < 0 || group >= n_groups()) fail("KV cache: group {} of {} (internal error)", group, n_groups());
  Block& blk = blocks_[size_t(block)];
  const PrefixKey stored = group_key(key, group);
  if (blk.registered) return blk.key == stored;
  auto [it, inserted] = by_key_.try_emplace(stored, block);
  if (!inserted) return false;
  blk.registered = true;
  blk.key = stored;
  blk.group = group;
  blk.parent = parent;
  blk.tokens.assign(block_tokens.begin(), block_tokens.end());
  ++n_registered_;
  return true;
}

void BlockManager::unregister(int32_t b) {
  Block& blk = blocks_[size_t(b)];
  by_key_.erase(blk.key);
  blk.registered = false;
  blk.tokens.clear();
  --n_registered_;
}

void BlockManager::list_remove(int32_t b) {
  Block& blk = blocks_[size_t(b)];
  if (blk.prev >= 0)
    blocks_[size_t(blk.prev)].next = blk.next;
  else
    head_ = blk.next;
  if (blk.next >= 0)
    blocks_[size_t(blk.next)].prev = blk.prev;
  else
    tail_ = blk.prev;
  blk.prev = blk.next = -1;
  blk.in_free_list = false;
  if (blk.registered) --n_cached_free_;
}

void BlockManager::list_push_front(int32_t b) {
  Block& blk = blocks_[size_t(b)];
  blk.prev = -1;
  blk.next = head_;
  if (head_ >= 0)
    blocks_[size_t(head_)].prev = b;
  else
    tail_ = b;
  head_ = b;
  blk.in_free_list = true;
  if (blk.registered) ++n_cached_free_;
}

void BlockManager::list_push_back(int32_t b) {
  Block& blk = blocks_[size_t(b)];
  blk.next = -1;
  blk.prev = tail_;
  if (tail_ >= 0)
    blocks_[size_t(tail_)].next = b;
  else
    head_ = b;
  tail_ = b;
  blk.in_free_list = true;
  if (blk.registered) ++n_cached_free_;
}

void BlockManager::check_invariants() const {
  int64_t listed = 0, registered = 0, cached_free = 0;
  bool seen_cached = false;
  int32_t prev = -1;
  for (int32_t b = head_; b >= 0; b = blocks_[size_t(b)].next) {
    const Block& blk = blocks_[size_t(b)];
    if (++listed > n_blocks()) fail("KV cache invariant: the free list has a cycle");
    if (blk.prev != prev) fail("KV cache invariant: block {} has a broken back link", b);
    if (blk.ref_count != 0)
      fail("KV cache invariant: block {} is in the free list with ref_count {}", b, blk.ref_count);
    if (!blk.in_free_list) fail("KV cache invariant: block {} is listed but not marked free", b);
    if (blk.registered) {
      seen_cached = true;
      ++cached_free;
    } else if (seen_cached)
      fail("KV cache invariant: plain free block {} sits behind cached blocks", b);
    prev = b;
  }
  if (prev != tail_) fail("KV cache invariant: the free list's tail is wrong");
  if (listed != n_free_) fail("KV cache invariant: {} blocks listed free but n_free = {}", listed, n_free_);
  for (int32_t b = 0; b < int32_t(n_blocks()); ++b) {
    const Block& blk = blocks_[size_t(b)];
    if (blk.ref_count < 0) fail("KV cache invariant: block {} has ref_count {}", b, blk.ref_count);
    if ((blk.ref_count == 0) != blk.in_free_list)
      fail("KV cache invariant: block {} free-list flag disagrees with ref_count {}", b, blk.ref_count);
    if (blk.registered) {
      ++registered;
      if (int64_t(blk.tokens.size()) != block_size_)
        fail("KV cache invariant: cached block {} keeps {} tokens", b, blk.tokens.size());
      auto it = by_key_.find(blk.key);
      if (it == by_key_.end() || it->second != b)
        fail("KV cache invariant: cached block {} is not findable by its key", b);
    }
  }
  if (cached_free != n_cached_free_)
    fail("KV cache invariant: {} cached blocks are free but the counter says {}", cached_free, n_cached_free_);
  if (registered != n_registered_ || int64_t(by_key_.size()) != n_registered_)
    fail("KV cache invariant: {} blocks marked cached, {} counted, {} keys", registered, n_registered_, by_key_.size());
}

}  // namespace spill
