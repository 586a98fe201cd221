#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace spill {

void SchedulerParams::validate() const {
  if (max_running < 1) fail("scheduler: max running sequences (--max-seqs) must be at least 1, got {}", max_running);
  if (max_batch_tokens < 1)
    fail("scheduler: the token budget per step (--max-batch-tokens) must be at least 1, got {}", max_batch_tokens);
}

Scheduler::Scheduler(const SchedulerParams& params, BlockManager& blocks) : params_(params), blocks_(blocks) {
  params_.validate();
  // Highest first, so that slots are handed out from 0 up.
  for (int32_t s = params_.max_running - 1; s >= 0; --s) free_slots_.push_back(s);
  for (int32_t g = 0; g < blocks_.n_groups(); ++g) has_window_ |= blocks_.group_window(g) > 0;
}

void Scheduler::take_slot(Sequence* seq) {
  // The running set never exceeds max_running, so a joining sequence always finds one.
  if (free_slots_.empty()) fail("scheduler: no free sequence slot for sequence {} (internal error)", seq->id);
  seq->slot = free_slots_.back();
  free_slots_.pop_back();
  seq->blocks_sent = 0;
}

void Scheduler::give_back_slot(Sequence* seq) {
  if (seq->slot < 0) return;
  free_slots_.push_back(seq->slot);
  seq->slot = -1;
  seq->blocks_sent = 0;
}

void Scheduler::enqueue(Sequence* seq) {
  if (seq->n_prompt <= 0 || seq->tokens.empty()) fail("scheduler: sequence {} has no tokens", seq->id);
  seq->state = SequenceState::Waiting;
  waiting_.push_back(seq);
}

void Scheduler::release_blocks(Sequence* seq) {
  for (int32_t g = blocks_.n_groups() - 1; g >= 0; --g) {
    blocks_.release(seq->table(g));
    seq->table(g).clear();
    seq->first_live[size_t(g)] = 0;
  }
  seq->block_keys.clear();
  seq->n_computed = 0;
}

void Scheduler::allocate_tail(Sequence* seq, int64_t n_blocks) {
  for (int32_t g = 0; g < blocks_.n_groups(); ++g)
    if (!blocks_.allocate(n_blocks, seq->table(g)))
      fail("scheduler: the block pool refused {} blocks it reported free (internal error)", n_blocks);
}

void Scheduler::drop_blocks_behind_windows(Sequence* seq) {
  const int64_t bs = blocks_.block_size();
  for (int32_t g = 0; g < blocks_.n_groups(); ++g) {
    const int32_t window = blocks_.group_window(g);
    if (window <= 0) continue;
    // The next query is at position n_computed and sees (n_computed - window, n_computed]: every
    // block wholly before that is never read again, by this sequence or by a later step of it.
    const int64_t first_seen = seq->n_computed - window + 1;
    if (first_seen <= 0) continue;
    std::vector<int32_t>& table = seq->table(g);
    const size_t dead = std::min(table.size(), size_t(first_seen / bs));
    // Oldest first, so among the cached ones the oldest is evicted first.
    for (size_t& i = seq->first_live[size_t(g)]; i < dead; ++i) {
      blocks_.release(std::span<const int32_t>(&table[i], 1));
      table[i] = kNoBlock;
    }
  }
}

void Scheduler::remove(Sequence* seq) {
  if (seq->state == SequenceState::Running) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
    give_back_slot(seq);
  } else if (seq->state == SequenceState::Waiting) {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  release_blocks(seq);
  seq->state = SequenceState::Finished;
}

void Scheduler::preempt(Sequence* victim, std::vector<Pending>& pending, int64_t& budget, StepTrace& trace) {
  if (victim->plan_slot >= 0) {  // planned earlier in this step: take it out of the step again
    Pending& p = pending[size_t(victim->plan_slot)];
    budget += p.n;
    p.n = 0;
    victim->plan_slot = -1;
  }
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  give_back_slot(victim);
  release_blocks(victim);
  victim->state = SequenceState::Waiting;
  ++victim->preemptions;
  // Victims are taken youngest first, so pushing each to the front keeps the queue oldest first.
  waiting_.push_front(victim);
  trace.preempted.push_back(victim->id);
  ++counters_.preemptions;
}

int64_t Scheduler::reserve(Sequence* seq, int64_t n, bool shrink_ok, std::vector<Pending>& pending, int64_t& budget,
                           StepTrace& trace) {
  const int64_t bs = blocks_.block_size(), groups = blocks_.n_groups();
  while (true) {
    // Every group's table grows by the same blocks (a sliding group frees its old ones at commit).
    const int64_t per_group = blocks_for(seq->n_computed + n) - int64_t(seq->block_table.size());
    if (per_group * groups <= blocks_.n_free()) {
      if (per_group > 0) allocate_tail(seq, per_group);
      return n;
    }
    Sequence* youngest = running_.back();
    if (youngest != seq) {
      preempt(youngest, pending, budget, trace);
      continue;
    }
    // Nothing younger to take blocks from. A chunk can still run on what is left.
    const int64_t fits = (int64_t(seq->block_table.size()) + blocks_.n_free() / groups) * bs - seq->n_computed;
    if (shrink_ok && fits >= 1 && fits < n) {
      n = fits;
      continue;
    }
    return 0;
  }
}

// Prefix hits on a model with several KV groups, or a sliding one. A hit of h blocks must give
// every group what the next query (at position h * block_size) reads: a full group every block
// before it, a sliding group the blocks that cover its window. Full groups hit on a prefix; then
// each sliding group takes the longest h, at most the full groups', whose window blocks are all
// cached; a shorter h can break no group's hit, so the rounds stop at the first that changes
// nothing. Leaves each group's hit table (kNoBlock before a window) in scratch_hits_ and the
// keys of the leading blocks in scratch_keys_; returns h.
int64_t Scheduler::find_group_hits(const Sequence& seq, int64_t max_blocks) {
  const int64_t bs = blocks_.block_size(), groups = blocks_.n_groups();
  for (auto& hits : scratch_hits_) hits.clear();
  scratch_keys_.clear();
  if (!blocks_.prefix_caching() || max_blocks <= 0) return 0;
  std::span<const int32_t> tokens(seq.tokens);
  const PrefixKey root = blocks_.root_key(seq.cache_salt);
  int64_t h = max_blocks;
  bool any_full = false;
  for (int32_t g = 0; g < groups; ++g) {
    if (blocks_.group_window(g) > 0) continue;
    std::vector<PrefixKey> keys;
    h = std::min(h, blocks_.find_cached_prefix(tokens, seq.cache_salt, h, scratch_hits_[size_t(g)],
                                               any_full ? keys : scratch_keys_, g));
    any_full = true;
  }
  // Keys of the blocks any sliding group may need: the chain from the root, block by block.
  for (int64_t i = int64_t(scratch_keys_.size()); i < h; ++i)
    scratch_keys_.push_back(blocks_.chain_key(i == 0 ? root : scratch_keys_[size_t(i - 1)],
                                              tokens.subspan(size_t(i * bs), size_t(bs))));
  auto block_tokens = [&](int64_t i) { return tokens.subspan(size_t(i * bs), size_t(bs)); };
  auto parent_of = [&](int64_t i) { return i == 0 ? root : scratch_keys_[size_t(i - 1)]; };
  for (bool changed = true; changed && h > 0;) {
    changed = false;
    for (int32_t g = 0; g < groups; ++g) {
      const int64_t window = blocks_.group_window(g);
      if (window <= 0) continue;
      // Largest h' <= h with blocks [first_seen(h') / bs, h') all cached. A miss at block m rules
      // out every h' > m (their windows reach back to m or further), so the search goes on below m.
      int64_t cand = h;
      while (cand > 0) {
        const int64_t lo = std::max<int64_t>(0, cand * bs - window + 1) / bs;
        int64_t miss = -1;
        for (int64_t i = cand - 1; i >= lo; --i)
          if (blocks_.find_block(g, scratch_keys_[size_t(i)], parent_of(i), block_tokens(i)) == kNoBlock) {
            miss = i;
            break;
          }
        if (miss < 0) break;
        cand = miss;
      }
      if (cand < h) h = cand, changed = true;
    }
  }
  // Every group's table for the hit of h blocks.
  for (int32_t g = 0; g < groups; ++g) {
    std::vector<int32_t>& hits = scratch_hits_[size_t(g)];
    const int64_t window = blocks_.group_window(g);
    if (window <= 0) {
      hits.resize(size_t(h));
      continue;
    }
    hits.assign(size_t(h), kNoBlock);
    const int64_t lo = h == 0 ? 0 : std::max<int64_t>(0, h * bs - window + 1) / bs;
    for (int64_t i = lo; i < h; ++i) hits[size_t(i)] = blocks_.find_block(g, scratch_keys_[size_t(i)], parent_of(i), block_tokens(i));
  }
  return h;
}

bool Scheduler::admit_front(std::vector<Pending>& pending, int64_t& budget, StepTrace& trace) {
  Sequence* seq = waiting_.front();
  const int64_t bs = blocks_.block_size(), groups = blocks_.n_groups();
  const int64_t total = seq->n_tokens();
  for (auto& hits : scratch_hits_) hits.clear();
  scratch_keys_.clear();
  // At least the last token is computed even when everything is cached: its logits are needed.
  // So only blocks strictly before it can be hits (a hit block is never written).
  const int64_t hit_blocks = groups == 1 && blocks_.group_window(0) == 0
                                 ? blocks_.find_cached_prefix(seq->tokens, seq->cache_salt, (total - 1) / bs,
                                                              scratch_hits_[0], scratch_keys_)
                                 : find_group_hits(*seq, (total - 1) / bs);
  const int64_t hit_tokens = hit_blocks * bs;
  int64_t n = std::min(total - hit_tokens, budget);
  int64_t hits_free = 0;  // hit blocks that sit in the free list: acquiring them takes them out
  for (int64_t g = 0; g < groups; ++g) hits_free += blocks_.count_free(scratch_hits_[size_t(g)]);
  const int64_t free_after_hits = blocks_.n_free() - hits_free;
  const int64_t need = groups * (blocks_for(hit_tokens + n) - hit_blocks);
  if (need > free_after_hits) {
    // Start with what fits; the rest of the prompt follows in later chunks.
    n = (hit_blocks + free_after_hits / groups) * bs - hit_tokens;
    if (n <= 0) {
      for (auto& hits : scratch_hits_) hits.clear();
      scratch_keys_.clear();
      return false;
    }
  }
  waiting_.pop_front();
  for (int32_t g = 0; g < groups; ++g) {
    std::vector<int32_t>& hits = scratch_hits_[size_t(g)];
    blocks_.acquire(hits);
    seq->table(g).assign(hits.begin(), hits.end());
    // A sliding group's hit starts with kNoBlock up to its window.
    seq->first_live[size_t(g)] = size_t(std::find_if(hits.begin(), hits.end(), [](int32_t b) { return b != kNoBlock; }) -
                                        hits.begin());
    hits.clear();
  }
  seq->block_keys.assign(scratch_keys_.begin(), scratch_keys_.begin() + hit_blocks);
  scratch_keys_.clear();
  seq->n_computed = hit_tokens;
  allocate_tail(seq, blocks_for(hit_tokens + n) - hit_blocks);
  if (seq->cached_tokens < 0) seq->cached_tokens = hit_tokens;
  counters_.prefix_query_tokens += total;
  counters_.prefix_hit_tokens += hit_tokens;
  seq->state = SequenceState::Running;
  take_slot(seq);
  // Priority is submission order (ids grow with it), also for a preempted sequence coming back:
  // it keeps its rank rather than becoming the youngest and the next victim.
  running_.insert(std::upper_bound(running_.begin(), running_.end(), seq,
                                   [](const Sequence* a, const Sequence* b) { return a->id < b->id; }),
                  seq);
  seq->plan_slot = int32_t(pending.size());
  pending.push_back({seq, seq->n_computed, n});
  budget -= n;
  trace.admitted.push_back(seq->id);
  return true;
}

void Scheduler::plan(StepPlan& plan) {
  plan.batch.tokens.clear();
  plan.batch.seqs.clear();
  plan.batch.all_logits = false;
  plan.chunk_seqs.clear();
  plan.logit_seqs.clear();
  StepTrace& trace = plan.trace;
  trace = StepTrace{};
  trace.step = counters_.steps;

  std::vector<Pending> pending;
  pending.reserve(running_.size() + 8);
  int64_t budget = params_.max_batch_tokens;

  // Passes 1 and 2: decodes, then chunks, each oldest first. running_ may lose its tail to
  // preemption inside the loop; entries before i are never removed, so indexing stays valid.
  for (int pass = 0; pass < 2; ++pass) {
    const bool decode_pass = pass == 0;
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence* seq = running_[i];
      if (seq->plan_slot >= 0) continue;
      const int64_t remaining = seq->n_uncomputed();
      if ((remaining == 1) != decode_pass) continue;
      const int64_t n = reserve(seq, std::min(remaining, budget), !decode_pass, pending, budget, trace);
      if (n == 0) {
        // Even alone at the back it does not fit: it makes room for the older ones.
        preempt(seq, pending, budget, trace);
        break;  // it was the youngest, so nothing after it is left in this pass
      }
      seq->plan_slot = int32_t(pending.size());
      pending.push_back({seq, seq->n_computed, n});
      budget -= n;
    }
  }

  // Pass 3: admissions. Not after a preemption: the pool is short, and a newcomer would only be
  // preempted again.
  if (trace.preempted.empty()) {
    while (!waiting_.empty() && budget > 0 && int64_t(running_.size()) < params_.max_running) {
      if (!admit_front(pending, budget, trace)) break;
    }
  }

  // Lay the step out oldest first (running_'s order), so a runner sees a stable order.
  // Every planned sequence still in the step is in running_; preempted ones left it.
  for (Sequence* seq : running_) {
    if (seq->plan_slot < 0) continue;
    const Pending& p = pending[size_t(seq->plan_slot)];
    seq->plan_slot = -1;
    SeqChunk chunk;
    chunk.first_token = int32_t(plan.batch.tokens.size());
    chunk.n_tokens = int32_t(p.n);
    chunk.start_pos = int32_t(p.start);
    chunk.block_table = seq->block_table;
    chunk.want_logits = p.start + p.n == seq->n_tokens();
    chunk.slot = seq->slot;
    chunk.first_in_slot = seq->blocks_sent == 0;  // every chunk holds a block, so only the first sees 0
    chunk.new_blocks = std::span<const int32_t>(seq->block_table).subspan(seq->blocks_sent);
    for (int32_t g = 1; g < blocks_.n_groups(); ++g) {
      chunk.group_tables[size_t(g - 1)] = seq->table(g);
      chunk.group_new_blocks[size_t(g - 1)] = std::span<const int32_t>(seq->table(g)).subspan(seq->blocks_sent);
    }
    seq->blocks_sent = seq->block_table.size();
    plan.batch.tokens.insert(plan.batch.tokens.end(), seq->tokens.begin() + p.start,
                             seq->tokens.begin() + p.start + p.n);
    plan.batch.seqs.push_back(chunk);
    plan.chunk_seqs.push_back(seq);
    if (chunk.want_logits) plan.logit_seqs.push_back(seq);
    trace.chunks.push_back({.seq_id = seq->id,
                            .slot = seq->slot,
                            .start_pos = p.start,
                            .n_tokens = int32_t(p.n),
                            .decode = p.n == 1 && p.start >= seq->n_prompt,
                            .want_logits = chunk.want_logits});
  }
  trace.n_tokens = plan.batch.n_tokens();
  trace.free_blocks_after = blocks_.n_free();
  trace.n_running = int64_t(running_.size());
  trace.n_waiting = int64_t(waiting_.size());
}

void Scheduler::commit(const StepPlan& plan) {
  const int64_t bs = blocks_.block_size();
  for (size_t i = 0; i < plan.batch.seqs.size(); ++i) {
    const SeqChunk& chunk = plan.batch.seqs[i];
    Sequence* seq = plan.chunk_seqs[i];
    seq->n_computed = int64_t(chunk.start_pos) + chunk.n_tokens;
    if (blocks_.prefix_caching()) {
      // Offer each block that just became full to the prefix cache, chaining its key from the
      // last; on a model with several KV groups, each group's block under that key.
      while (int64_t(seq->block_keys.size()) < seq->n_computed / bs) {
        const size_t b = seq->block_keys.size();
        const PrefixKey parent = b == 0 ? blocks_.root_key(seq->cache_salt) : seq->block_keys[b - 1];
        std::span<const int32_t> block_tokens(seq->tokens.data() + b * size_t(bs), size_t(bs));
        const PrefixKey key = blocks_.chain_key(parent, block_tokens);
        for (int32_t g = 0; g < blocks_.n_groups(); ++g)
          if (seq->table(g)[b] != kNoBlock) blocks_.register_full_block(seq->table(g)[b], key, parent, block_tokens, g);
        seq->block_keys.push_back(key);
      }
    }
    // Then sliding groups give back what their windows have left behind (cached, when caching is on).
    if (has_window_) drop_blocks_behind_windows(seq);
  }
  counters_.computed_tokens += plan.batch.n_tokens();
  ++counters_.steps;
}

}  // namespace spill
