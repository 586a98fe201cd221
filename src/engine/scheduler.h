// The scheduler plans each step: which sequences run, how many tokens each, in which KV blocks.
// Pure host code with no model, so every policy below is unit-tested on its own.
//
// Policy (one unified token budget per step, as vLLM's v1 scheduler; first come, first served,
// where "first" is the sequence id, which the engine assigns in submission order):
//   1. Decoding sequences (one uncomputed token) first, oldest first: a long prompt never stalls
//      them, because its chunk only gets what budget they leave.
//   2. Then sequences part-way through their prompt (or through a recompute), oldest first, each
//      a chunk of at most the remaining budget.
//   3. Then, if nothing was preempted in this step, waiting sequences join from the front of the
//      queue while there is budget and room in the running set; each first takes what the prefix
//      cache already holds.
// When blocks run out, the youngest (highest id) running sequence is preempted: its blocks are released (full
// ones stay in the prefix cache, so recomputing them is often free) and it goes back to the front
// of the waiting queue, to be recomputed from its tokens later. An older sequence is never
// preempted for a younger one, so the oldest always progresses and nothing starves or deadlocks.
//
// Slots: a sequence takes a runner slot (SeqChunk::slot) when it starts running and gives it back
// when it finishes or is preempted, so slots are unique among running sequences and stable while a
// sequence runs; each chunk names the blocks added to its table since the sequence's previous
// chunk (SeqChunk::new_blocks), so a device runner can keep block tables per slot.
//
// Cost per step: O(sequences in the step + tokens in the step); a waiting sequence's prompt is
// hashed when it is admitted (once, or again after a preemption).
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"
#include "model/batch.h"

namespace spill {

struct SchedulerParams {
  // Sequences in the running set (and so in one step); each holds one runner slot in
  // [0, max_running) while it runs.
  int32_t max_running = 64;
  int64_t max_batch_tokens = 2048;  // tokens in one step, prefill chunks and decodes together

  // Throws spill::Error naming the bad field.
  void validate() const;
};

// What one step did, for tests, logs and metrics.
struct StepTraceChunk {
  uint64_t seq_id = 0;
  int32_t slot = -1;
  int64_t start_pos = 0;
  int32_t n_tokens = 0;
  bool decode = false;       // one token of a sequence that has produced output
  bool want_logits = false;  // the chunk reaches the sequence's end: a token is sampled
};

struct StepTrace {
  int64_t step = 0;
  std::vector<StepTraceChunk> chunks;
  std::vector<uint64_t> admitted;   // joined the running set in this step
  std::vector<uint64_t> preempted;  // sent back to the waiting queue in this step
  int64_t n_tokens = 0;
  int64_t free_blocks_after = 0;  // after this step's allocations
  int64_t n_running = 0, n_waiting = 0;
};

struct StepPlan {
  ForwardBatch batch;                 // what the runner computes
  std::vector<Sequence*> chunk_seqs;  // batch.seqs[i] belongs to chunk_seqs[i]
  std::vector<Sequence*> logit_seqs;  // logits row r belongs to logit_seqs[r]
  StepTrace trace;

  bool empty() const { return batch.seqs.empty(); }
};

struct SchedulerCounters {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prefix_query_tokens = 0;  // tokens looked up in the prefix cache at admission
  int64_t prefix_hit_tokens = 0;    // of which found
  int64_t computed_tokens = 0;      // tokens run through the model
};

class Scheduler {
 public:
  Scheduler(const SchedulerParams& params, BlockManager& blocks);

  // Appends a sequence (state Waiting, no blocks) to the waiting queue.
  void enqueue(Sequence* seq);
  // Takes a sequence out of the scheduler (finished, cancelled or failed) and releases its blocks
  // at once. Not during a step: between commit() and the next plan().
  void remove(Sequence* seq);

  // Plans the next step into plan (reused between steps to keep its buffers). Allocates the
  // blocks the step writes; may preempt. The batch's block tables point into the sequences'
  // tables and stay valid until the next plan() or remove().
  void plan(StepPlan& plan);
  // Records that the planned step ran: advances each sequence's computed tokens and offers its
  // newly full blocks to the prefix cache. Call after the forward, before appending sampled tokens.
  void commit(const StepPlan& plan);

  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const SchedulerCounters& counters() const { return counters_; }
  const SchedulerParams& params() const { return params_; }
  BlockManager& blocks() { return blocks_; }

 private:
  struct Pending {
    Sequence* seq;
    int64_t start;
    int64_t n;
  };
  // Makes seq's table cover n more tokens, preempting younger sequences if needed. For a chunk
  // (shrink_ok) n may be reduced to what fits. Returns the tokens it can run, 0 if none.
  int64_t reserve(Sequence* seq, int64_t n, bool shrink_ok, std::vector<Pending>& pending, int64_t& budget,
                  StepTrace& trace);
  void preempt(Sequence* victim, std::vector<Pending>& pending, int64_t& budget, StepTrace& trace);
  bool admit_front(std::vector<Pending>& pending, int64_t& budget, StepTrace& trace);
  void release_blocks(Sequence* seq);
  // Appends n_blocks fresh blocks to each KV group's table (the caller checked they are free).
  void allocate_tail(Sequence* seq, int64_t n_blocks);
  // Gives back a sliding group's blocks wholly before the next query's window (kNoBlock in the table).
  void drop_blocks_behind_windows(Sequence* seq);
  int64_t find_group_hits(const Sequence& seq, int64_t max_blocks);
  void take_slot(Sequence* seq);
  void give_back_slot(Sequence* seq);
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + blocks_.block_size() - 1) / blocks_.block_size(); }

  SchedulerParams params_;
  BlockManager& blocks_;
  std::vector<Sequence*> running_;  // by id: oldest first
  std::vector<int32_t> free_slots_;  // runner slots no running sequence holds; taken from the back

  std::deque<Sequence*> waiting_;
  SchedulerCounters counters_;
  bool has_window_ = false;  // some KV group slides
  std::array<std::vector<int32_t>, kMaxKvGroups> scratch_hits_;  // per group, admit_front's prefix hit
  std::vector<PrefixKey> scratch_keys_;
};

}  // namespace spill
