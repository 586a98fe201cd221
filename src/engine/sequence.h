// What the scheduler knows about one request: its tokens and where their KV lives. The engine's
// per-request state (sampler, detokenizer, channel) extends this; the scheduler never sees it.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "engine/block_manager.h"

namespace spill {

enum class SequenceState : uint8_t {
  Waiting,   // in the waiting queue (new, or preempted and to be recomputed)
  Running,   // admitted: holds KV blocks, scheduled in (almost) every step
  Finished,  // removed from the scheduler; holds no blocks
};

struct Sequence {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // the prompt, then every generated token
  int64_t n_prompt = 0;
  uint64_t cache_salt = 0;  // sequences share cached blocks only with equal salts
  SequenceState state = SequenceState::Waiting;

  // KV state, owned by the scheduler. tokens[0, n_computed) have KV in the blocks of block_table
  // (position p in block block_table[p / block_size], slot p % block_size).
  int64_t n_computed = 0;
  std::vector<int32_t> block_table;
  // KV groups 1.. (model/kv_format.h): their tables, as long as block_table. A sliding group's
  // leading blocks that no query will read again are kNoBlock: [0, first_live[g]) of its table.
  std::array<std::vector<int32_t>, kMaxKvGroups - 1> group_tables;
  std::array<size_t, kMaxKvGroups> first_live{};
  std::vector<int32_t>& table(int32_t group) { return group == 0 ? block_table : group_tables[size_t(group - 1)]; }
  const std::vector<int32_t>& table(int32_t group) const {
    return group == 0 ? block_table : group_tables[size_t(group - 1)];
  }
  // Prefix keys of the leading full blocks whose KV is computed (or was found in the cache).
  std::vector<PrefixKey> block_keys;

  // Its runner slot while Running (SeqChunk::slot), else -1; and how many blocks of block_table
  // (and of each group's table) the runner has been given in chunks since the sequence took the slot.
  int32_t slot = -1;
  size_t blocks_sent = 0;

  // The scheduler's scratch while it plans a step: this sequence's entry in the plan, or -1.
  int32_t plan_slot = -1;

  // Accounting.
  int64_t cached_tokens = -1;  // prefix-cache hit when first admitted; -1 until then
  int32_t preemptions = 0;

  int64_t n_tokens() const { return int64_t(tokens.size()); }
  int64_t n_generated() const { return n_tokens() - n_prompt; }
  // Tokens that still need a forward before the next token can be sampled.
  int64_t n_uncomputed() const { return n_tokens() - n_computed; }
};

}  // namespace spill
