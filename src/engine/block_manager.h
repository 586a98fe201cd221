// The paged KV cache's bookkeeping on the host: which blocks are free, who references which
// block, and which full blocks hold a known token prefix (automatic prefix caching).
//
// The KV memory itself belongs to the model runner; this class only hands out block ids, so it
// is the same for the CPU and the CUDA backend and is tested without a model.
//
// Prefix caching. A full block is identified by a key chained from its parent's key and its own
// tokens: key(b_i) = H(key(b_{i-1}), tokens of b_i), with key(b_{-1}) = H(salt). Equal keys mean
// equal KV (same tokens at the same positions behind the same prefix), so a new sequence can share
// the blocks of any earlier sequence with the same leading tokens. Keys are 128-bit from a hash
// seeded per process, and a hit is also checked against the block's stored tokens and parent key,
// so a collision cannot hand one request another's KV. Only full blocks are ever shared; the
// last, partial block of a sequence is always private, and a shared block is never written.
//
// Life of a block: free (ref 0, no key) -> in use (ref >= 1) -> when its last user lets go, either
// free again or, if it was registered under a key, "cached": ref 0, still findable, evictable.
// Free and cached blocks sit in one list ordered by eviction priority: plain free blocks first,
// then cached ones from least to most recently used. Allocation takes from the front, so a cached
// block is only evicted when no plain free block is left.
//
// KV cache groups (model/kv_format.h): on a model with several (gpt-oss's full and sliding-window
// layers), one pool serves them all, each sequence has one table per group, and a block holds one
// group's KV. The token chain and its keys are the same for every group; a group's blocks are
// found under their key and their group, so each group caches its own copy of a prefix.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/batch.h"

namespace spill {

struct PrefixKey {
  uint64_t lo = 0, hi = 0;
  bool operator==(const PrefixKey&) const = default;
};

struct PrefixKeyHash {
  size_t operator()(const PrefixKey& k) const { return size_t(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull)); }
};

struct BlockManagerParams {
  int64_t n_blocks = 0;
  int32_t block_size = 16;
  bool prefix_caching = true;
  // Seeds the key hash. 0: drawn at random, so keys cannot be predicted from outside the process.
  uint64_t hash_seed = 0;
  // The window of each KV cache group, 0 for full attention (KvCacheConfig::group_windows). The
  // scheduler reads them; the block manager only keeps the groups' cached blocks apart.
  std::vector<int32_t> group_windows{0};
};

struct BlockManagerStats {
  int64_t n_blocks = 0;
  int64_t in_use = 0;       // ref_count > 0
  int64_t free = 0;         // ref_count == 0, cached or not: what allocate() can take
  int64_t cached = 0;       // registered under a key (in use or not)
  int64_t cached_free = 0;  // registered and ref_count == 0: evictable
  int64_t evictions = 0;    // cached blocks reused for new content, ever
};

class BlockManager {
 public:
  explicit BlockManager(const BlockManagerParams& params);

  int32_t block_size() const { return block_size_; }
  int64_t n_blocks() const { return int64_t(blocks_.size()); }
  int64_t n_free() const { return n_free_; }
  bool prefix_caching() const { return prefix_caching_; }
  int32_t n_groups() const { return int32_t(group_windows_.size()); }
  int32_t group_window(int32_t group) const { return group_windows_[size_t(group)]; }
  BlockManagerStats stats() const;

  // The key every sequence's chain starts from. Requests with different salts never share blocks.
  PrefixKey root_key(uint64_t salt) const;
  // The key of a full block of block_size tokens behind parent.
  PrefixKey chain_key(const PrefixKey& parent, std::span<const int32_t> block_tokens) const;

  // Walks tokens block by block from the root and returns how many leading full blocks are cached
  // (at most max_blocks). For each hit appends the block id to blocks and its key to keys. Takes no
  // references: call acquire() on the hits before anything else allocates.
  // group: the KV group whose blocks are looked up.
  int64_t find_cached_prefix(std::span<const int32_t> tokens, uint64_t salt, int64_t max_blocks,
                             std::vector<int32_t>& blocks, std::vector<PrefixKey>& keys, int32_t group = 0) const;
  // The block of group that holds block_tokens under key behind parent, or kNoBlock.
  int32_t find_block(int32_t group, const PrefixKey& key, const PrefixKey& parent,
                     std::span<const int32_t> block_tokens) const;
  // How many of these blocks have ref_count 0 (acquiring them takes them out of the free list).
  // kNoBlock entries are skipped, here and in acquire() and release().
  int64_t count_free(std::span<const int32_t> blocks) const;

  // Adds a reference to each block (cached blocks leave the free list).
  void acquire(std::span<const int32_t> blocks);
  // Appends n fresh blocks to out, evicting least recently used cached blocks as needed. Returns
  // false and changes nothing when fewer than n blocks are free.
  bool allocate(int64_t n, std::vector<int32_t>& out);
  // Drops one reference from each block. Pass a sequence's blocks in table order: they are
  // released back to front, so a chain's tail is evicted before its head (a head without its
  // tail is still useful; a tail without its head can never be found).
  void release(std::span<const int32_t> blocks);

  // Records that block (full, in use by the caller) holds the tokens keyed by key behind parent.
  // Returns false when another block already holds that key (then this block stays private and
  // is simply freed when released) or when prefix caching is off.
  bool register_full_block(int32_t block, const PrefixKey& key, const PrefixKey& parent,
                           std::span<const int32_t> block_tokens, int32_t group = 0);

  int32_t ref_count(int32_t block) const { return blocks_[size_t(block)].ref_count; }
  bool is_cached(int32_t block) const { return blocks_[size_t(block)].registered; }

  // Checks every internal invariant (ref counts, list membership, key map); throws spill::Error
  // describing the first violation. For tests; O(n_blocks).
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    bool registered = false;
    bool in_free_list = false;
    int32_t group = 0;             // the KV group whose content it holds while registered
    int32_t prev = -1, next = -1;  // free list links
    PrefixKey key, parent;         // key: as stored (group_key of the chain key)
    std::vector<int32_t> tokens;  // the block's tokens, kept while registered to verify hits
  };

  void list_remove(int32_t b);
  void list_push_front(int32_t b);
  void list_push_back(int32_t b);
  void unregister(int32_t b);
  // The key a group's block is stored under: the chain key itself for group 0.
  PrefixKey group_key(const PrefixKey& key, int32_t group) const;

  int32_t block_size_;
  bool prefix_caching_;
  std::vector<int32_t> group_windows_;
  uint64_t seed_lo_, seed_hi_;
  std::vector<Block> blocks_;
  int32_t head_ = -1, tail_ = -1;  // free list: front is evicted first
  int64_t n_free_ = 0;
  int64_t n_registered_ = 0;
  int64_t n_cached_free_ = 0;
  int64_t evictions_ = 0;
  std::unordered_map<PrefixKey, int32_t, PrefixKeyHash> by_key_;
};

}  // namespace spill
