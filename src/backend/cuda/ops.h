// The CUDA runner's per-layer kernels other than the quantized GEMV (gemv.h) and the block-format
// experts (moe.h): embedding rows, RMSNorm fused with the residual add, q/k norm and RoPE fused with
// the paged-KV write, paged attention (decode and prefill in one kernel), router softmax + top-k,
// SiLU * up, dense matmul of F32/BF16/F16 weights, the routed experts of F32/BF16/F16 weights, and
// argmax. One canonical kernel per job; each has its CPU twin in src/backend/cpu/ (named below),
// which tests/cuda_ops_test.cpp compares it with.
//
// Batch invariance: every output element is computed by a fixed sequence of operations that
// depends only on its own row's inputs and the shapes (never on n or on the other rows), so a
// token's result is bit-identical alone or in any batch.
//
// All functions enqueue on `stream` and never synchronise; pointers are device memory. Shapes are
// checked on the host (spill::Error naming the op).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/moe.h"
#include "core/dtype.h"

namespace spill::cuda {

// Largest head_dim the attention and RoPE kernels take (a lane holds head_dim / 32 values).
constexpr int kMaxHeadDim = 256;

// ---- embedding (twin: cpu::load_row) ------------------------------------------------------------
// out[t, :] = row ids[t] of table [vocab, hidden] as f32. table: F32, BF16, F16 or Q8_0.
bool embed_rows_supported(DType type);
void embed_rows(const void* table, DType type, int64_t vocab, int64_t hidden, const int32_t* ids, int64_t n,
                float* out, cudaStream_t stream);

// ---- RMSNorm (twin: cpu::rmsnorm, then the residual add the CPU forward does) --------------------
// For each output row r (input row i = rows ? rows[r] : r):
//   if residual: x[i] += residual[i] (written back to x)
//   out[r] = weight * (x[i] * (1 / sqrt(mean(x[i]^2) + eps)))   (mean of squares in double, as the twin)
// out may alias x when rows is null.
struct RmsNormArgs {
  float* x = nullptr;               // [.., dim]
  const float* residual = nullptr;  // [.., dim] or null
  // [.., dim] or null: a second residual (a shared expert's output beside the routed experts'),
  // x += residual + residual2 in that order, as the CPU forward adds them
  const float* residual2 = nullptr;
  const int32_t* rows = nullptr;    // [n] input row per output row, or null (identity)
  const float* weight = nullptr;    // [dim] f32
  float* out = nullptr;             // [n, dim]
  int64_t n = 0, dim = 0;
  int64_t ld_x = 0, ld_out = 0;     // row strides (0: dim)
  double eps = 1e-6;
  // Or null: the output rows also rounded to int8 per block of 256 at rounded_rows_at(rounded, n,
  // dim) (gemv.h), with round_rows's bits, for the tensor-core GEMMs that read them next: in the
  // norm's own kernel where the row fits its registers, else by round_rows after it. dim % 32 == 0.
  void* rounded = nullptr;
};
void rmsnorm(const RmsNormArgs& args, cudaStream_t stream);

// ---- q/k norm + RoPE + paged-KV write (twins: cpu::rmsnorm, cpu::apply_rope, paged_attention's store) ----
// With q_norm/k_norm: RMSNorm of each head (norm_per_head, weights [head_dim]) or of each token's
// whole q and k (weights [q_dim] / [kv_dim]), in place, the mean of squares in double. Then clamps q,
// k, v to [-clip, clip] when clip > 0 (OLMoE), rotates q in place and k (rotate-half form, cos/sin
// of position * inv_freq[i], times attention_factor), and stores k and v at their cache slots:
// K/V pools are [slots][n_kv_heads][head_dim] in kv_type: F32, BF16 (rounded to nearest), or FP8
// (e4m3 bytes, with one f32 scale per (slot, KV head) in k_scale / v_scale [slots][n_kv_heads]:
// quant::quantize_kv_fp8 of the rotated k and of v, bit for bit). k is scratch afterwards (normed,
// and for FP8 rotated, in place).
struct RopeKvArgs {
  float* q = nullptr;
  float* k = nullptr;
  const float* v = nullptr;
  int64_t ld_q = 0, ld_k = 0, ld_v = 0;
  const int32_t* positions = nullptr;  // [n]
  const int64_t* slots = nullptr;      // [n] block * block_size + slot of each token
  const float* inv_freq = nullptr;     // [head_dim / 2]
  float attention_factor = 1.0f;
  float clip = 0.0f;
  const float* q_norm = nullptr;  // null: no q/k norm
  const float* k_norm = nullptr;
  bool norm_per_head = true;
  double norm_eps = 1e-6;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  KvFormat kv_type = KvFormat::BF16;
  float* k_scale = nullptr;  // FP8 only
  float* v_scale = nullptr;
  int64_t n = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
};
void rope_kv_write(const RopeKvArgs& args, cudaStream_t stream);

// ---- paged attention (twin: cpu::paged_attention's attend) ---------------------------------------
// For token t (query q[t], position positions[t]) and head h: causal softmax attention over the
// positions 0..positions[t] of its sequence, read from the paged cache through the sequence's
// block table (block_tables + table_offset[t]). GQA: head h reads kv head h / (n_heads / n_kv_heads).
// Decode and prefill tokens mix freely. A context is split along the sequence (flash-decoding)
// into attention_partitions(n_pos) partitions, whose partial results are combined in a fixed
// order: at most kMaxAttentionPartitions of at least kMinAttentionPartition positions (a multiple
// of 32) each. The split depends on the token's own position only, so results stay batch-invariant.
constexpr int kMinAttentionPartition = 128;
constexpr int kMaxAttentionPartitions = 64;
struct AttentionSplit {
  int32_t parts, length;  // partitions, positions per partition (the last may be shorter)
};
__host__ __device__ inline AttentionSplit attention_split(int32_t n_pos, int32_t min_part = kMinAttentionPartition) {
  int32_t parts = (n_pos + min_part - 1) / min_part;
  parts = parts < kMaxAttentionPartitions ? parts : kMaxAttentionPartitions;
  if (parts < 1) parts = 1;
  int32_t length = (n_pos + parts - 1) / parts;
  length = (length + 31) / 32 * 32;
  return {(n_pos + length - 1) / length, length};
}
// The most partitions any context of at most max_positions positions splits into: a grid sized for
// the batch's longest context must hold them all, and attention_split(n).parts is not monotonic in n
// (8192 positions split into 64 partitions of 128, 8193 into 52 of 160).
__host__ __device__ inline int32_t attention_grid_partitions(int32_t max_positions,
                                                             int32_t min_part = kMinAttentionPartition) {
  if (max_positions <= min_part) return 1;
  const int32_t parts = (max_positions + min_part - 1) / min_part;
  return parts < kMaxAttentionPartitions ? parts : kMaxAttentionPartitions;
}
struct AttentionArgs {
  const float* q = nullptr;
  int64_t ld_q = 0;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  KvFormat kv_type = KvFormat::BF16;
  const float* k_scale = nullptr;  // FP8 only: [slots][n_kv_heads] (RopeKvArgs)
  const float* v_scale = nullptr;
  const int32_t* positions = nullptr;     // [n]
  const int32_t* table_offset = nullptr;  // [n] where the token's block table starts in block_tables
  const int32_t* block_tables = nullptr;
  int32_t block_size = 16;
  float* out = nullptr;  // [n, n_heads * head_dim]
  int64_t n = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int32_t max_positions = 0;  // bound on positions[t] + 1 over the batch (sizes the grid)
  int32_t min_grid_parts = 0; // at least this many partitions in the grid (a graph's fixed grid)
  float* workspace = nullptr;  // attention_workspace_floats(...) floats
  // The prompt build of the tensor-core kernel: -1 attention_prompt_warps() (the process's choice), 0
  // the m16-tile-per-fetch build, 4 or 8 the build whose block of that many m16 tiles shares each K/V
  // fetch. A speed choice only: every build gives each token its decode bits.
  int32_t prompt_warps = -1;
  // Set by paged_attention (attention_min_partition()), not by callers: every kernel of a call splits alike.
  int32_t min_partition = kMinAttentionPartition;
};
// The shortest partition the split makes: kMinAttentionPartition, or SPILL_CUDA_ATTN_MIN_PART (a
// multiple of 32, 32 to 4096) for measurement. Read once per process; a token's bits depend on it
// (the partitions' merge order), never on its batch.
int32_t attention_min_partition();
// SPILL_CUDA_ATTN_PROMPT_WARPS (0, 4 or 8; default 0): the prompt build AttentionArgs::prompt_warps = -1 takes.
int attention_prompt_warps();
// Partitions a grid needs for a batch whose longest context is max_positions, under this process's
// split (attention_grid_partitions with attention_min_partition()): what paged_attention launches,
// so what a caller sizes a fixed grid or a workspace by.
int32_t attention_grid_parts(int32_t max_positions);
int64_t attention_workspace_floats(int64_t max_tokens, int64_t n_heads, int64_t head_dim, int32_t max_positions);
// Query heads per block of the tensor-core kernel paged_attention runs for these arguments (BF16 or
// FP8 cache, head_dim 64 or 128, a GQA group of at most 16 or a multiple of 16), 0 when the f32 tile
// kernel runs instead. The tensor-core kernel rounds q and the softmax weights to bf16 for its
// products (see ops.cu); the tile kernel keeps them in f32. An FP8 cache is read as the bf16 values
// quant::kv_fp8_to_bf16 gives, so its result is, bit for bit, the BF16 kernel's over a cache that
// holds those values; it runs on the tensor-core kernel only (kv_fp8_supported).
int attention_mma_heads(const AttentionArgs& a);
// Whether an FP8 KV cache can be attended over for this head shape (the tensor-core kernel's).
bool kv_fp8_supported(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim);
// The device's float -> e4m3 conversion (what rope_kv_write stores), n values; for tests against
// quant::f32_to_e4m3.
void f32_to_e4m3(const float* x, int64_t n, uint8_t* q, cudaStream_t stream);
// Kernels paged_attention launches for a batch whose longest context is max_positions (1 or 2).
int attention_launches(int32_t max_positions);
void paged_attention(const AttentionArgs& args, cudaStream_t stream);

// ---- router (twin: cpu::route_topk) ---------------------------------------------------------------
// Softmax over logits [n, n_experts], top-k per row (descending; ties to the lower id), optionally
// renormalised to sum 1. ids/weights: [n, k].
// Under expert parallelism each GPU runs only the experts it owns: with `share` set, the ids are
// also written to share.ids with every expert whose share.owned[id] is 0 replaced by -1 (which the
// MoE kernels count as contributing zero), so the full ids stay for observers and the GPU's own
// list costs no launch.
struct RouteShare {
  const uint8_t* owned = nullptr;  // device [n_experts]: 1 where this GPU holds the expert
  int32_t* ids = nullptr;          // device [n, k]
};
void route_topk(const float* logits, int64_t n, int64_t n_experts, int64_t k, bool renormalise, int32_t* ids,
                float* weights, cudaStream_t stream, RouteShare share = {});

// ---- SiLU * up (twin: cpu::swiglu_mlp's middle) ---------------------------------------------------
// out[t, i] = silu(gate_up[t, i]) * gate_up[t, width + i] (gate and up side by side, ld = 2 width)
// when up == null; else silu(gate[t, i]) * up[t, i] with both [n, width].
void silu_mul(const float* gate, const float* up, int64_t n, int64_t width, float* out, cudaStream_t stream);

// ---- residual add ----------------------------------------------------------------------------------
// x[i] += y[i] for i < count.
void add_inplace(float* x, const float* y, int64_t count, cudaStream_t stream);
// y[i] += bias[i % cols] for i < rows * cols.
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);

// ---- dense matmul of F32/BF16/F16 weights (twin: cpu::matmul) ----------------------------------------
// y[t, m] = sum_k x[t, k] * w[m, k] (+ bias[m]), y [n, rows], x [n, cols]. Each output is one
// block's fixed-order sum: thread i takes the 16-byte vectors i, i + 128, ... of the row (single
// elements where cols or the buffers do not allow 16-byte loads), then the warp butterfly and the
// warps in order.
bool matmul_float_supported(DType type);
void matmul_float(const void* w, DType type, int64_t rows, int64_t cols, const float* x, int64_t n,
                  const float* bias, float* y, cudaStream_t stream);

// ---- routed experts of F32/BF16/F16 weights (twin: cpu::moe_experts) --------------------------------
// Same contract as moe_experts (moe.h) for the float formats: each (token, slot) pair reads its
// expert's rows through the table; the slots' weighted rows are added in slot order. Workspace:
// moe_float_workspace_bytes.
struct MoeFloatArgs {
  const ExpertWeights* table = nullptr;  // [n_experts] device
  DType type = DType::BF16;              // gate, up and down
  int64_t hidden = 0, width = 0;
  int32_t n_experts = 0, top_k = 0;
  const float* x = nullptr;        // [n, hidden]
  int64_t n = 0;
  const int32_t* ids = nullptr;    // [n, top_k]
  const float* weights = nullptr;  // [n, top_k]
  float* out = nullptr;            // [n, hidden]
  void* workspace = nullptr;
};
int64_t moe_float_workspace_bytes(int64_t max_tokens, int32_t top_k, int64_t hidden, int64_t width);
void moe_experts_float(const MoeFloatArgs& args, cudaStream_t stream);

// ---- argmax ----------------------------------------------------------------------------------------
// ids[r] = the index of row r's largest value (the lowest index among equals; NaN never wins).
void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, cudaStream_t stream);

}  // namespace spill::cuda
