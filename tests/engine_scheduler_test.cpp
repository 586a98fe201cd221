// The scheduler on its own: plans are checked step by step against a simulated model that
// "samples" a token from the sequence's history, so no forward is needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>

#include "core/error.h"
#include "engine/scheduler.h"

namespace spill {
namespace {

struct SimSeq : Sequence {
  int64_t max_new = 0;
  bool done = false;
};

// Drives a scheduler like the engine does, minus the model: plan, check, commit, append a token
// to every sequence that got logits, retire the finished ones.
class Sim {
 public:
  Sim(BlockManagerParams bp, SchedulerParams sp) : blocks(bp), sched(sp, blocks) {}

  SimSeq* add(std::vector<int32_t> prompt, int64_t max_new, uint64_t salt = 0) {
    auto s = std::make_unique<SimSeq>();
    s->id = next_id++;
    s->n_prompt = int64_t(prompt.size());
    s->tokens = std::move(prompt);
    s->max_new = max_new;
    s->cache_salt = salt;
    sched.enqueue(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }

  // One step; returns its trace.
  StepTrace step() {
    sched.plan(plan);
    check_plan();
    sched.commit(plan);
    for (Sequence* s : plan.logit_seqs) {
      SimSeq* seq = static_cast<SimSeq*>(s);
      // The next token is a function of the whole history, like a model's would be.
      int64_t h = 7;
      for (int32_t t : seq->tokens) h = (h * 31 + t) % 1000003;
      seq->tokens.push_back(int32_t(h % 50));
      if (seq->n_generated() >= seq->max_new) {
        seq->done = true;
        sched.remove(seq);
      }
    }
    blocks.check_invariants();
    traces.push_back(plan.trace);
    return plan.trace;
  }

  void run_to_completion(int max_steps = 10000) {
    for (int i = 0; i < max_steps; ++i) {
      if (sched.running().empty() && sched.waiting().empty()) return;
      step();
    }
    FAIL() << "did not finish in " << max_steps << " steps";
  }

  // Structural checks every plan must pass.
  void check_plan() {
    const ForwardBatch& b = plan.batch;
    int64_t tokens = 0;
    ASSERT_EQ(b.seqs.size(), plan.chunk_seqs.size());
    ASSERT_LE(b.n_tokens(), sched.params().max_batch_tokens);
    ASSERT_LE(int64_t(b.seqs.size()), int64_t(sched.params().max_running));
    std::map<int32_t, int> writers;
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      const SeqChunk& c = b.seqs[i];
      const Sequence* seq = plan.chunk_seqs[i];
      EXPECT_EQ(c.first_token, tokens);
      EXPECT_EQ(c.start_pos, seq->n_computed) << "a chunk starts where the computed KV ends";
      EXPECT_GE(c.n_tokens, 1);
      tokens += c.n_tokens;
      const int64_t bs = blocks.block_size();
      EXPECT_GE(int64_t(c.block_table.size()) * bs, c.start_pos + c.n_tokens) << "the table covers the chunk";
      EXPECT_LT(int64_t(c.block_table.size() - 1) * bs, std::max<int64_t>(c.start_pos + c.n_tokens, 1))
          << "no block is allocated beyond the chunk";
      EXPECT_EQ(c.want_logits, c.start_pos + c.n_tokens == seq->n_tokens());
      for (int32_t t = 0; t < c.n_tokens; ++t)
        EXPECT_EQ(b.tokens[size_t(c.first_token + t)], seq->tokens[size_t(c.start_pos + t)]);
      for (int32_t g = 0; g < blocks.n_groups(); ++g) {
        const std::span<const int32_t> table = c.table(g);
        ASSERT_EQ(table.size(), c.block_table.size()) << "every KV group's table covers the same positions";
        // Given back (kNoBlock) only what the chunk's window no longer sees, on a sliding group.
        const int64_t window = blocks.group_window(g);
        const int64_t first_seen_block = window > 0 ? std::max<int64_t>(0, c.start_pos - window + 1) / bs : 0;
        for (int64_t k = 0; k < int64_t(table.size()); ++k) {
          if (k >= first_seen_block) {
            EXPECT_NE(table[size_t(k)], kNoBlock) << "group " << g << " block " << k << " is read by the chunk";
          } else if (table[size_t(k)] != kNoBlock) {
            EXPECT_GE(blocks.ref_count(table[size_t(k)]), 1);
          }
        }
        // Blocks this chunk writes: private to it, never shared, never cached.
        for (int64_t p = c.start_pos; p < c.start_pos + c.n_tokens; ++p) {
          const int32_t blk = table[size_t(p / bs)];
          EXPECT_EQ(blocks.ref_count(blk), 1) << "a written block must not be shared";
          EXPECT_FALSE(blocks.is_cached(blk)) << "a written block must not be in the prefix cache";
          auto [it, fresh] = writers.try_emplace(blk, int(i) * kMaxKvGroups + g);
          EXPECT_TRUE(fresh || it->second == int(i) * kMaxKvGroups + g)
              << "block " << blk << " is written by two sequences or two KV groups";
        }
      }
    }
    for (size_t i = 0; i < b.seqs.size(); ++i)
      for (int32_t g = 0; g < blocks.n_groups(); ++g)
        for (int32_t blk : b.seqs[i].table(g)) {
          auto it = writers.find(blk);
          if (it != writers.end()) {
            EXPECT_EQ(it->second, int(i) * kMaxKvGroups + g) << "block " << blk << " is written by another sequence";
          }
        }
    EXPECT_EQ(tokens, b.n_tokens());
    check_slots();
  }

  // Slots: unique among running sequences, in [0, max_running), unchanged while a sequence keeps
  // running; and a runner that keeps one block table per slot, resets it on first_in_slot and
  // appends new_blocks, holds exactly each chunk's block table.
  void check_slots() {
    const int32_t max_running = sched.params().max_running;
    std::set<int32_t> taken;
    for (const Sequence* s : sched.running()) {
      EXPECT_GE(s->slot, 0) << "sequence " << s->id;
      EXPECT_LT(s->slot, max_running) << "sequence " << s->id;
      EXPECT_TRUE(taken.insert(s->slot).second) << "slot " << s->slot << " is held by two running sequences";
      auto was = slot_at_last_plan.find(s);
      if (was != slot_at_last_plan.end()) {
        EXPECT_EQ(s->slot, was->second) << "sequence " << s->id << " changed slot while running";
      }
    }
    for (size_t i = 0; i < plan.batch.seqs.size(); ++i) {
      const SeqChunk& c = plan.batch.seqs[i];
      const Sequence* seq = plan.chunk_seqs[i];
      EXPECT_EQ(c.slot, seq->slot);
      const bool kept_running = slot_at_last_plan.count(seq) > 0;
      EXPECT_EQ(c.first_in_slot, !kept_running) << "sequence " << seq->id;
      if (c.first_in_slot) {
        device_owner[c.slot] = seq;
      } else {
        EXPECT_EQ(device_owner[c.slot], seq) << "slot " << c.slot << " changed hands without first_in_slot";
      }
      for (int32_t g = 0; g < blocks.n_groups(); ++g) {
        std::vector<int32_t>& table = device_tables[c.slot * kMaxKvGroups + g];
        if (c.first_in_slot) table.clear();
        const std::span<const int32_t> fresh = g == 0 ? c.new_blocks : c.group_new_blocks[size_t(g - 1)];
        table.insert(table.end(), fresh.begin(), fresh.end());
        // Equal, except where a sliding group gave a block back: the device copy keeps the old id there.
        ASSERT_EQ(table.size(), c.table(g).size()) << "sequence " << seq->id << " group " << g;
        for (size_t k = 0; k < table.size(); ++k) {
          if (c.table(g)[k] != kNoBlock) {
            EXPECT_EQ(table[k], c.table(g)[k])
                << "sequence " << seq->id << " group " << g << ": the appended new_blocks are not its block table";
          }
        }
      }
      if (c.first_in_slot) ++first_in_slot_chunks;
    }
    slot_at_last_plan.clear();
    for (const Sequence* s : sched.running()) slot_at_last_plan[s] = s->slot;
  }

  BlockManager blocks;
  Scheduler sched;
  StepPlan plan;
  std::vector<std::unique_ptr<SimSeq>> seqs;
  std::vector<StepTrace> traces;
  uint64_t next_id = 1;
  // What check_slots remembers between plans, as a device runner would.
  std::map<const Sequence*, int32_t> slot_at_last_plan;
  std::map<int32_t, std::vector<int32_t>> device_tables;
  std::map<int32_t, const Sequence*> device_owner;
  int64_t first_in_slot_chunks = 0;
};

std::vector<int32_t> tokens_from(int64_t n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(Scheduler, BlockBoundaryPromptLengthsGetExactlyTheBlocksTheyNeed) {
  for (int64_t len : {1, 15, 16, 17, 31, 32, 33}) {
    Sim sim({.n_blocks = 64, .block_size = 16}, {.max_running = 4, .max_batch_tokens = 256});
    SimSeq* s = sim.add(tokens_from(len, 100), 3);
    sim.step();
    EXPECT_EQ(int64_t(s->block_table.size()), (len + 15) / 16) << "prompt length " << len;
    EXPECT_EQ(s->n_computed, len);
    // The first decode writes position len: a new block exactly when len is a multiple of 16.
    sim.step();
    EXPECT_EQ(int64_t(s->block_table.size()), len / 16 + 1) << "prompt length " << len;
    sim.run_to_completion();
    EXPECT_EQ(sim.blocks.n_free(), 64);
  }
}

TEST(Scheduler, EmptyPromptIsRefused) {
  Sim sim({.n_blocks = 4, .block_size = 16}, {});
  EXPECT_THROW(sim.add({}, 1), Error);
}

TEST(Scheduler, BadParametersAreRefused) {
  BlockManager bm({.n_blocks = 4, .block_size = 16});
  EXPECT_THROW(Scheduler({.max_running = 0}, bm), Error);
  EXPECT_THROW(Scheduler({.max_batch_tokens = 0}, bm), Error);
}

TEST(Scheduler, PromptExactlyFillingThePoolRunsAlone) {
  // 4 blocks of 4 = 16 tokens: the prompt takes every block, is computed in one step, samples.
  Sim sim({.n_blocks = 4, .block_size = 4}, {.max_batch_tokens = 64});
  SimSeq* s = sim.add(tokens_from(16, 0), 1);
  StepTrace t = sim.step();
  ASSERT_EQ(t.chunks.size(), 1u);
  EXPECT_EQ(t.chunks[0].n_tokens, 16);
  EXPECT_TRUE(t.chunks[0].want_logits);
  EXPECT_EQ(t.free_blocks_after, 0);
  EXPECT_TRUE(s->done);
  EXPECT_EQ(sim.blocks.n_free(), 4);
}

TEST(Scheduler, ChunkedPrefillNeverStallsDecodes) {
  Sim sim({.n_blocks = 64, .block_size = 4}, {.max_running = 8, .max_batch_tokens = 8});
  SimSeq* a = sim.add(tokens_from(3, 0), 30);
  SimSeq* b = sim.add(tokens_from(2, 10), 30);
  sim.step();  // both prompts (5 tokens) in one step
  sim.step();  // both decode
  SimSeq* longp = sim.add(tokens_from(40, 200), 2);
  // From now on a and b decode one token every step while the long prompt takes the remaining
  // 6 tokens of the budget: 40 tokens in 7 chunks (6 * 6 + 4).
  int chunks = 0;
  int64_t covered = 0;
  while (longp->n_computed < 40) {
    StepTrace t = sim.step();
    ASSERT_EQ(t.chunks.size(), 3u);
    int64_t long_tokens = 0;
    for (const StepTraceChunk& c : t.chunks) {
      if (c.seq_id == longp->id) {
        EXPECT_EQ(c.start_pos, covered);
        long_tokens = c.n_tokens;
        EXPECT_FALSE(c.decode);
      } else {
        EXPECT_TRUE(c.decode) << "sequence " << c.seq_id << " must decode in every step";
        EXPECT_EQ(c.n_tokens, 1);
      }
    }
    EXPECT_EQ(long_tokens, std::min<int64_t>(6, 40 - covered));
    EXPECT_LE(t.n_tokens, 8);
    covered += long_tokens;
    ++chunks;
  }
  EXPECT_EQ(chunks, 7);
  EXPECT_EQ(longp->n_generated(), 1);  // the last chunk sampled its first token
  EXPECT_FALSE(a->done);
  EXPECT_FALSE(b->done);
  sim.run_to_completion();
  EXPECT_EQ(sim.blocks.n_free(), 64);
}

TEST(Scheduler, DecodesBeyondTheTokenBudgetWaitTheirTurnOldestFirst) {
  Sim sim({.n_blocks = 64, .block_size = 4}, {.max_running = 8, .max_batch_tokens = 3});
  std::vector<SimSeq*> s;
  for (int i = 0; i < 5; ++i) s.push_back(sim.add({int32_t(i)}, 4));
  sim.step();  // three one-token prompts fill the budget
  sim.step();  // three decodes fill the budget; the two others wait
  StepTrace t = sim.step();
  EXPECT_EQ(t.n_tokens, 3);
  sim.run_to_completion();
  for (SimSeq* q : s) EXPECT_TRUE(q->done);
}

TEST(Scheduler, MaxRunningCapsTheRunningSet) {
  Sim sim({.n_blocks = 64, .block_size = 4}, {.max_running = 2, .max_batch_tokens = 100});
  for (int i = 0; i < 5; ++i) sim.add(tokens_from(5, i * 10), 3);
  StepTrace t = sim.step();
  EXPECT_EQ(t.chunks.size(), 2u);
  EXPECT_EQ(t.n_waiting, 3);
  sim.run_to_completion();
  for (const StepTrace& tr : sim.traces) EXPECT_LE(tr.chunks.size(), 2u);
}

TEST(Scheduler, SharedPrefixIsReusedAndCountedExactly) {
  Sim sim({.n_blocks = 64, .block_size = 4}, {.max_batch_tokens = 256});
  const auto shared = tokens_from(18, 500);  // 4 full blocks + 2
  auto prompt_a = shared;
  prompt_a.push_back(1);
  SimSeq* a = sim.add(prompt_a, 5);
  sim.step();
  EXPECT_EQ(a->cached_tokens, 0);
  auto prompt_b = shared;
  prompt_b.insert(prompt_b.end(), {2, 3, 4});
  SimSeq* b = sim.add(prompt_b, 5);
  sim.step();
  EXPECT_EQ(b->cached_tokens, 16);  // the 4 full blocks of the shared 18 tokens
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(b->block_table[size_t(i)], a->block_table[size_t(i)]);
    EXPECT_EQ(sim.blocks.ref_count(a->block_table[size_t(i)]), 2);
  }
  EXPECT_NE(b->block_table[4], a->block_table[4]);
  // The step computed only b's uncached tail.
  const StepTrace& t = sim.traces.back();
  for (const StepTraceChunk& c : t.chunks) {
    if (c.seq_id == b->id) {
      EXPECT_EQ(c.start_pos, 16);
      EXPECT_EQ(c.n_tokens, 21 - 16);
    }
  }
  EXPECT_EQ(sim.sched.counters().prefix_hit_tokens, 16);
  EXPECT_EQ(sim.sched.counters().prefix_query_tokens, 19 + 21);
  sim.run_to_completion();
  EXPECT_EQ(sim.blocks.n_free(), 64);
}

TEST(Scheduler, AFullyCachedPromptStillComputesItsLastToken) {
  Sim sim({.n_blocks = 64, .block_size = 4}, {.max_batch_tokens = 256});
  SimSeq* a = sim.add(tokens_from(12, 0), 1);  // exactly 3 blocks
  sim.run_to_completion();
  ASSERT_TRUE(a->done);
  SimSeq* b = sim.add(tokens_from(12, 0), 1);
  StepTrace t = sim.step();
  // Blocks 0 and 1 are hits; block 2 holds the last token, which must be computed, so it is
  // recomputed whole in a fresh block (a cached block is never written).
  EXPECT_EQ(b->cached_tokens, 8);
  ASSERT_EQ(t.chunks.size(), 1u);
  EXPECT_EQ(t.chunks[0].start_pos, 8);
  EXPECT_EQ(t.chunks[0].n_tokens, 4);
  EXPECT_EQ(b->tokens.back(), a->tokens.back());  // same history, same "sampled" token
  // Different salt: nothing shared.
  SimSeq* c = sim.add(tokens_from(12, 0), 1, /*salt=*/99);
  sim.step();
  EXPECT_EQ(c->cached_tokens, 0);
}

TEST(Scheduler, PreemptionUnderPressureCompletesEverySequenceWithTheSameTokens) {
  // Reference: each sequence alone with plenty of blocks.
  auto prompts = [] {
    std::vector<std::vector<int32_t>> p;
    for (int i = 0; i < 6; ++i) p.push_back(tokens_from(5 + 3 * i, 40 * i));
    return p;
  }();
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    Sim sim({.n_blocks = 64, .block_size = 4}, {});
    SimSeq* s = sim.add(p, 12);
    sim.run_to_completion();
    alone.push_back(s->tokens);
  }
  // Together in 12 blocks of 4 = 48 tokens; they need 6 * ~(11..32) tokens at the end.
  Sim sim({.n_blocks = 12, .block_size = 4}, {.max_running = 6, .max_batch_tokens = 16});
  std::vector<SimSeq*> s;
  for (const auto& p : prompts) s.push_back(sim.add(p, 12));
  sim.run_to_completion();
  EXPECT_GT(sim.sched.counters().preemptions, 0) << "the pool was meant to be too small";
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_TRUE(s[i]->done);
    EXPECT_EQ(s[i]->tokens, alone[i]) << "sequence " << i;
  }
  EXPECT_EQ(sim.blocks.n_free(), 12);
  // Victims are always younger (higher id) than every sequence that runs in that step.
  for (const StepTrace& t : sim.traces)
    for (uint64_t victim : t.preempted)
      for (const StepTraceChunk& c : t.chunks) EXPECT_LT(c.seq_id, victim);
}

TEST(Scheduler, TheOldestSequenceIsNeverPreemptedForAYoungerOne) {
  // Two sequences that each grow to 8 blocks in a 10-block pool: the younger one is preempted,
  // the older finishes uninterrupted, then the younger completes.
  Sim sim({.n_blocks = 10, .block_size = 2}, {.max_running = 2, .max_batch_tokens = 64});
  SimSeq* old_seq = sim.add(tokens_from(4, 0), 12);
  sim.step();
  SimSeq* young = sim.add(tokens_from(4, 50), 12);
  sim.run_to_completion();
  EXPECT_EQ(old_seq->preemptions, 0);
  EXPECT_GE(young->preemptions, 1);
  EXPECT_TRUE(young->done);
  EXPECT_EQ(sim.blocks.n_free(), 10);
}

TEST(Scheduler, RemovingARunningOrWaitingSequenceFreesItsBlocksAtOnce) {
  Sim sim({.n_blocks = 8, .block_size = 4}, {.max_running = 1});
  SimSeq* a = sim.add(tokens_from(9, 0), 100);
  SimSeq* b = sim.add(tokens_from(3, 0), 100);
  sim.step();
  EXPECT_EQ(sim.blocks.n_free(), 8 - 3);
  sim.sched.remove(a);
  EXPECT_EQ(sim.blocks.n_free(), 8);
  EXPECT_EQ(a->state, SequenceState::Finished);
  EXPECT_TRUE(a->block_table.empty());
  sim.sched.remove(b);  // still waiting
  EXPECT_TRUE(sim.sched.waiting().empty());
  EXPECT_TRUE(sim.sched.running().empty());
  sim.blocks.check_invariants();
}

TEST(Scheduler, AdmissionStartsWithWhatFitsAndFinishesTheChunkLater) {
  // 3 blocks of 4 free while an older sequence holds the rest: a 20-token prompt starts with a
  // 12-token chunk... but it is the youngest, so as the older one grows it is preempted rather
  // than the older one. Both finish.
  Sim sim({.n_blocks = 8, .block_size = 4}, {.max_batch_tokens = 64});
  SimSeq* a = sim.add(tokens_from(18, 0), 6);  // 5 blocks
  sim.step();
  SimSeq* b = sim.add(tokens_from(20, 100), 2);
  StepTrace t = sim.step();
  for (const StepTraceChunk& c : t.chunks)
    if (c.seq_id == b->id) {
      EXPECT_LT(c.n_tokens, 20);
    }
  sim.run_to_completion();
  EXPECT_TRUE(a->done);
  EXPECT_TRUE(b->done);
  EXPECT_EQ(a->preemptions, 0);
  EXPECT_EQ(sim.blocks.n_free(), 8);
}

TEST(Scheduler, DegenerateSizesStillWork) {
  // Block size 1 and a budget of one token per step: every step computes exactly one token.
  auto run = [](BlockManagerParams bp, SchedulerParams sp) {
    Sim sim(bp, sp);
    std::vector<SimSeq*> s;
    for (int i = 0; i < 3; ++i) s.push_back(sim.add(tokens_from(3 + i, 10 * i), 4));
    sim.run_to_completion();
    for (const StepTrace& t : sim.traces) EXPECT_LE(t.n_tokens, sp.max_batch_tokens);
    EXPECT_EQ(sim.blocks.n_free(), bp.n_blocks);
    std::vector<std::vector<int32_t>> out;
    for (SimSeq* q : s) out.push_back(q->tokens);
    return out;
  };
  const auto roomy = run({.n_blocks = 64, .block_size = 4}, {});
  EXPECT_EQ(run({.n_blocks = 9, .block_size = 1}, {.max_running = 3, .max_batch_tokens = 1}), roomy);
  EXPECT_EQ(run({.n_blocks = 2, .block_size = 8}, {.max_running = 1, .max_batch_tokens = 2}), roomy);
}

// check_slots (run on every plan of every test here) asserts uniqueness, range, stability and
// that new_blocks rebuild each table; this test makes sure it sees slots reused, sequences
// preempted and re-admitted, and tables growing across block boundaries.
TEST(Scheduler, SlotsStayPutWhileRunningAndNewBlocksAreExactlyEachStepsAdditions) {
  Sim sim({.n_blocks = 12, .block_size = 2}, {.max_running = 3, .max_batch_tokens = 7});
  std::vector<SimSeq*> s;
  for (int i = 0; i < 7; ++i) s.push_back(sim.add(tokens_from(3 + i, 20 * i), 6));
  std::map<uint64_t, std::vector<int32_t>> slots_of;  // seq id -> its slot at each of its chunks
  sim.run_to_completion();
  for (SimSeq* q : s) EXPECT_TRUE(q->done);
  int64_t admissions = 0, preemptions = 0;
  for (const StepTrace& t : sim.traces) {
    admissions += int64_t(t.admitted.size());
    preemptions += int64_t(t.preempted.size());
    for (const StepTraceChunk& c : t.chunks) {
      EXPECT_GE(c.slot, 0);
      EXPECT_LT(c.slot, 3);
      slots_of[c.seq_id].push_back(c.slot);
    }
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small";
  // One fresh slot per admission, re-admissions after a preemption included.
  EXPECT_EQ(sim.first_in_slot_chunks, admissions);
  EXPECT_EQ(admissions, 7 + preemptions);
  // A sequence never preempted keeps one slot for its whole life.
  for (SimSeq* q : s) {
    if (q->preemptions > 0) continue;
    const std::vector<int32_t>& seen = slots_of[q->id];
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(std::set<int32_t>(seen.begin(), seen.end()).size(), 1u) << "sequence " << q->id;
  }
  // Seven sequences through three slots: slots were handed on.
  std::set<int32_t> used;
  for (const auto& [id, seen] : slots_of) used.insert(seen.begin(), seen.end());
  EXPECT_EQ(used, (std::set<int32_t>{0, 1, 2}));
}

TEST(Scheduler, ManyRandomSequencesUnderPressureAllFinishWithoutLeaks) {
  std::mt19937 rng(3);
  Sim sim({.n_blocks = 24, .block_size = 3, .hash_seed = 5}, {.max_running = 7, .max_batch_tokens = 11});
  std::vector<SimSeq*> all;
  for (int wave = 0; wave < 30; ++wave) {
    for (int j = 0; j < int(rng() % 3); ++j) {
      std::vector<int32_t> p(1 + rng() % 30);
      for (auto& t : p) t = int32_t(rng() % 3);  // small alphabet: many shared prefixes
      all.push_back(sim.add(p, 1 + int64_t(rng() % 10)));
    }
    for (int k = 0; k < 3; ++k)
      if (!sim.sched.running().empty() || !sim.sched.waiting().empty()) sim.step();
  }
  sim.run_to_completion();
  for (SimSeq* s : all) EXPECT_TRUE(s->done);
  EXPECT_EQ(sim.blocks.n_free(), 24);
  EXPECT_GT(sim.sched.counters().prefix_hit_tokens, 0);
}

// ---- KV cache groups: gpt-oss's full and sliding-window layers --------------------------------

// After each step, a sliding group holds exactly the blocks from the next query's window start
// (n_computed - window + 1) on; the plans pass every check of check_plan (a written block is
// private in every group, given-back entries are only behind the window, per-slot tables rebuilt
// from new_blocks). Caching and preemption on; everything comes back at the end.
TEST(Scheduler, SlidingGroupHoldsOnlyItsWindowUnderCachingAndPreemption) {
  const int32_t window = 5, bs = 3;
  std::mt19937 rng(9);
  Sim sim({.n_blocks = 40, .block_size = bs, .hash_seed = 5, .group_windows = {0, window}},
          {.max_running = 6, .max_batch_tokens = 13});
  std::vector<SimSeq*> all;
  for (int wave = 0; wave < 30; ++wave) {
    const int joining = 1 + int(rng() % 2);
    for (int j = 0; j < joining; ++j) {
      std::vector<int32_t> p(1 + rng() % 30);
      for (auto& t : p) t = int32_t(rng() % 3);  // small alphabet: many shared prefixes
      all.push_back(sim.add(p, 1 + int64_t(rng() % 12)));
    }
    for (int k = 0; k < 3; ++k) {
      if (sim.sched.running().empty() && sim.sched.waiting().empty()) break;
      sim.step();
      for (const Sequence* q : sim.sched.running()) {
        const int64_t first_seen = std::max<int64_t>(0, q->n_computed - window + 1);
        const std::vector<int32_t>& sliding = q->table(1);
        for (size_t b = 0; b < sliding.size(); ++b)
          EXPECT_EQ(sliding[b] == kNoBlock, int64_t(b) < first_seen / bs)
              << "sequence " << q->id << " at " << q->n_computed << ", block " << b;
        for (int32_t blk : q->block_table) EXPECT_NE(blk, kNoBlock) << "a full group keeps every block";
      }
    }
  }
  sim.run_to_completion();
  for (SimSeq* s : all) EXPECT_TRUE(s->done);
  EXPECT_EQ(sim.blocks.n_free(), 40);
  EXPECT_GT(sim.sched.counters().prefix_hit_tokens, 0);
  EXPECT_GT(sim.sched.counters().preemptions, 0);
}

// A prefix hit needs, in a sliding group, only the blocks that cover the window of the hit's end.
TEST(Scheduler, ASlidingGroupsHitNeedsOnlyTheBlocksOfItsWindow) {
  const int32_t window = 5, bs = 4;
  const std::vector<int32_t> a = tokens_from(24, 100);  // 6 full blocks
  std::vector<int32_t> b = a;
  b.insert(b.end(), {1, 2, 3, 4, 5});
  // Runs a alone; then takes the pool's plain free blocks and the n_evicted least recently used
  // cached ones into held, and gives 4 plain ones back (room for b's first chunk).
  auto run_a_and_evict = [&](Sim& sim, int64_t n_evicted, std::vector<int32_t>& held) {
    sim.add(a, 1);
    sim.run_to_completion();
    const int64_t plain = sim.blocks.n_free() - sim.blocks.stats().cached_free;
    ASSERT_TRUE(sim.blocks.allocate(plain + n_evicted, held));
    sim.blocks.release(std::span<const int32_t>(held.data(), 4));
    held.erase(held.begin(), held.begin() + 4);
  };
  {  // Everything still cached: the whole prefix hits, in the sliding group only block 5 (20..23).
    Sim sim({.n_blocks = 30, .block_size = bs, .group_windows = {0, window}}, {.max_running = 2});
    std::vector<int32_t> held;
    run_a_and_evict(sim, 0, held);
    SimSeq* q = sim.add(b, 1);
    const StepTrace t = sim.step();
    EXPECT_EQ(q->cached_tokens, 24);
    ASSERT_EQ(t.chunks.size(), 1u);
    EXPECT_EQ(t.chunks[0].start_pos, 24);
    EXPECT_EQ(t.chunks[0].n_tokens, 5);
    sim.blocks.release(held);
  }
  {  // The sliding group's blocks 0..4 evicted (they left its window first, so they are the least
     // recently used): the hit is still whole, as the next query's window (20..24) needs block 5 only.
    Sim sim({.n_blocks = 30, .block_size = bs, .group_windows = {0, window}}, {.max_running = 2});
    std::vector<int32_t> held;
    run_a_and_evict(sim, 5, held);
    SimSeq* q = sim.add(b, 1);
    sim.step();
    EXPECT_EQ(q->cached_tokens, 24);
    sim.blocks.release(held);
  }
  {  // Block 5 evicted as well: no shorter hit has its window either (each needs the block just
     // before it), so nothing hits although the full group still has all 6 blocks.
    Sim sim({.n_blocks = 30, .block_size = bs, .group_windows = {0, window}}, {.max_running = 2});
    std::vector<int32_t> held;
    run_a_and_evict(sim, 6, held);
    EXPECT_EQ(sim.blocks.stats().cached_free, 6) << "the full group's 6 blocks are left";
    SimSeq* q = sim.add(b, 1);
    sim.step();
    EXPECT_EQ(q->cached_tokens, 0);
    sim.blocks.release(held);
  }
}

}  // namespace
}  // namespace spill
