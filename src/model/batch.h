// What one forward step computes: the contract between the engine's scheduler (which plans
// steps) and a model runner (which executes them on some backend).
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace spill {

// KV cache groups: layers that keep their KV the same way share one block table per sequence
// (model/kv_format.h, KvGroups). A model whose layers all attend alike has one group; gpt-oss has
// two, its full-attention layers (group 0) and its sliding-window layers (group 1), whose blocks
// go back to the pool once they fall wholly out of the window.
inline constexpr int32_t kMaxKvGroups = 2;
// A table entry whose block was given back: a sliding group's block wholly before the window of
// the chunk's first position. No layer reads it.
inline constexpr int32_t kNoBlock = -1;

// One sequence's part of a step: n_tokens new tokens (a prefill chunk, or 1 when decoding)
// at positions [start_pos, start_pos + n_tokens). Positions before start_pos are already in
// the KV cache. The block table maps position p to KV block block_table[p / block_size],
// slot p % block_size, and must cover every position up to start_pos + n_tokens.
//
// Slots, for runners that keep per-sequence state on their device (block tables, sampling
// penalties): `slot` is in [0, RunnerLimits::max_seqs), unique among the sequences running at
// once and stable for as long as the sequence runs (the scheduler assigns it when the sequence
// starts running and frees it when it finishes or is preempted). A sequence's block table only
// grows while it holds a slot, so `new_blocks` is exactly the tail of block_table added since the
// sequence's previous chunk: a device table kept per slot stays equal to block_table by appending
// new_blocks. `first_in_slot` marks the first chunk since the sequence took the slot (new, or back
// after a preemption): whatever the runner kept for that slot is stale, and new_blocks is the whole
// block_table. Batches built by hand (spill logits, eval, tests) may leave slot 0 and new_blocks
// empty; a runner must not need them to compute a correct forward.
//
// Groups. block_table and new_blocks are KV group 0's (every layer's, on a single-group model);
// group g >= 1 has group_tables[g - 1] and group_new_blocks[g - 1], with the same length and the
// same rules. On a sliding group, the entries of blocks wholly before (start_pos - window + 1) may
// be kNoBlock: those blocks went back to the pool, and a per-slot device copy may keep their old
// ids, which no layer reads again. A batch for a multi-group model must name every group's table
// (block_tables_for_hand_built_batch in model/runner.h makes them for hand-built batches).
struct SeqChunk {
  int32_t first_token = 0;  // index of this chunk's first token in ForwardBatch::tokens
  int32_t n_tokens = 0;
  int32_t start_pos = 0;
  std::span<const int32_t> block_table;
  bool want_logits = false;  // return logits for the chunk's last token
  int32_t slot = 0;
  std::span<const int32_t> new_blocks{};  // the tail of block_table added since the previous chunk
  bool first_in_slot = false;
  std::array<std::span<const int32_t>, kMaxKvGroups - 1> group_tables{};
  std::array<std::span<const int32_t>, kMaxKvGroups - 1> group_new_blocks{};

  std::span<const int32_t> table(int32_t group) const { return group == 0 ? block_table : group_tables[size_t(group - 1)]; }
};

struct ForwardBatch {
  std::vector<int32_t> tokens;  // all chunks' tokens, chunk after chunk
  std::vector<SeqChunk> seqs;
  // When true, logits for every token of every chunk (used by `spill logits` and tests);
  // otherwise one row per chunk that wants logits, in chunk order.
  bool all_logits = false;

  int64_t n_tokens() const { return int64_t(tokens.size()); }
  int64_t n_logit_rows() const {
    if (all_logits) return n_tokens();
    int64_t n = 0;
    for (const SeqChunk& s : seqs) n += s.want_logits;
    return n;
  }
};

// Optional observer of a forward, for tests and debugging: router choices per layer, and named
// intermediate tensors (hidden states after each layer, ...), the way a CPU-vs-GPU divergence
// is found layer by layer.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // expert_ids and weights are [n_tokens, k], each row ordered by descending weight.
  virtual void on_router(int layer, int64_t n_tokens, int64_t k, const int32_t* expert_ids, const float* weights) {}
  // data is [rows, cols] float32, row-major, valid only during the call.
  virtual void on_tensor(const char* name, int layer, const float* data, int64_t rows, int64_t cols) {}
};

}  // namespace spill
