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
  blocks_.release(seq->block_table);
  seq->block_table.clear();
  seq->block_keys.clear();
  seq->n_computed = 0;
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
  const int64_t bs = blocks_.block_size();
  while (true) {
    const int64_t need = blocks_for(seq->n_computed + n) - int64_t(seq->block_table.size());
    if (need <= blocks_.n_free()) {
      if (need > 0 && !blocks_.allocate(need, seq->block_table))
        fail("scheduler: the block pool refused {} blocks it reported free (internal error)", need);
      return n;
    }
    Sequence* youngest = running_.back();
    if (youngest != seq) {
      preempt(youngest, pending, budget, trace);
      continue;
    }
    // Nothing younger to take blocks from. A chunk can still run on what is left.
    const int64_t fits = (int64_t(seq->block_table.size()) + blocks_.n_free()) * bs - seq->n_computed;
    if (shrink_ok && fits >= 1 && fits < n) {
      n = fits;
      continue;
    }
    return 0;
  }
}

bool Scheduler::admit_front(std::vector<Pending>& pending, int64_t& budget, StepTrace& trace) {
  Sequence* seq = waiting_.front();
  const int64_t bs = blocks_.block_size();
  const int64_t total = seq->n_tokens();
  // At least the last token is computed even when everything is cached: its logits are needed.
  // So only blocks strictly before it can be hits (a hit block is never written).
  scratch_blocks_.clear();
  scratch_keys_.clear();
  const int64_t hit_blocks =
      blocks_.find_cached_prefix(seq->tokens, seq->cache_salt, (total - 1) / bs, scratch_blocks_, scratch_keys_);
  const int64_t hit_tokens = hit_blocks * bs;
  int64_t n = std::min(total - hit_tokens, budget);
  const int64_t free_after_hits = blocks_.n_free() - blocks_.count_free(scratch_blocks_);
  const int64_t need = blocks_for(hit_tokens + n) - hit_blocks;
  if (need > free_after_hits) {
    // Start with what fits; the rest of the prompt follows in later chunks.
    n = (hit_blocks + free_after_hits) * bs - hit_tokens;
    if (n <= 0) return false;
  }
  waiting_.pop_front();
  blocks_.acquire(scratch_blocks_);
  seq->block_table.assign(scratch_blocks_.begin(), scratch_blocks_.end());
  seq->block_keys.assign(scratch_keys_.begin(), scratch_keys_.end());
  seq->n_computed = hit_tokens;
  const int64_t more = blocks_for(hit_tokens + n) - hit_blocks;
  if (!blocks_.allocate(more, seq->block_table))
    fail("scheduler: the block pool refused {} blocks it reported free (internal error)", more);
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
    if (!blocks_.prefix_caching()) continue;
    // Offer each block that just became full to the prefix cache, chaining its key from the last.
    while (int64_t(seq->block_keys.size()) < seq->n_computed / bs) {
      const size_t b = seq->block_keys.size();
      const PrefixKey parent = b == 0 ? blocks_.root_key(seq->cache_salt) : seq->block_keys[b - 1];
      std::span<const int32_t> block_tokens(seq->tokens.data() + b * size_t(bs), size_t(bs));
      const PrefixKey key = blocks_.chain_key(parent, block_tokens);
      blocks_.register_full_block(seq->block_table[b], key, parent, block_tokens);
      seq->block_keys.push_back(key);
    }
  }
  counters_.computed_tokens += plan.batch.n_tokens();
  ++counters_.steps;
}

}  // namespace spill
