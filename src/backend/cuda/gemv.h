// Dense quantized GEMV for decode: y[n, rows] = x[n, cols] * W[rows, cols]^T with W in a ggml block
// format (Q8_0, Q6_K, Q5_K, Q4_K, Q3_K, Q2_K), x in f32 or bf16, y in f32, n small (1..8 is the
// decode case; any n works, in groups of up to 8). The weight bytes are read once for all n rows.
//
// Arithmetic: each token's activations are rounded to int8 per block of 256 exactly as
// quant::quantize_activations_q8 rounds them (the CPU's int8-activation path), and the weights'
// integer quants are dotted with them by __dp4a, the float scales applied per 32-weight unit
// (block_dot.cuh). CPU twin: quant::quantize_activations_q8 + quant::dot_q8; the tests compare with
// a float64 dot of the reference dequantizer's weights and those rounded activations.
//
// Optionally (plan_gemv's mma_from, SPILL_GEMV_MMA_FROM; off by default until measured), calls of
// few tokens (mma_from .. 31) in a format with an MmqFormat (mmq.cuh):
// the activations rounded once (round_rows, or by the RMSNorm before), then a block of 4 warps takes
// 64 rows x 8 tokens of one K-chunk on int8 tensor cores: the same chunks, the same per-chunk chains
// and the same ordered sum of the chunks as below, so the same bits. Where one warp's __dp4a walk
// serves 8 tokens with 8 times the instructions, one mma serves them all.
//
// Work split: a block of 4 warps takes 16 rows; each warp stages 4 rows (one K-chunk of them) in
// shared memory with coalesced 16-byte copies, the block rounds a group of tokens' activations of
// that chunk into shared memory, then each warp dots its rows with them. When the rows
// alone give too few blocks to fill the GPU, K is split into chunks whose partial sums the last
// block of each row tile adds in chunk order: the split depends on (type, rows, cols) and the GPU's
// size (a grid is kept to one wave where the chunk sizes allow) only, so a row's result never
// depends on n or on the other rows.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace spill::cuda {

struct GemvPlan {
  DType type = DType::Q8_0;
  int64_t rows = 0, cols = 0;
  int64_t max_n = 0;          // most activation rows one call may pass
  int64_t k_chunk = 0;        // weights per K-chunk (whole blocks)
  int32_t k_splits = 1;       // chunks per row
  int64_t row_tiles = 0;      // blocks of 16 rows
  bool mmq = false;           // calls of kMmqMinTokens or more run on int8 tensor cores (mmq.cuh)
  // Calls of mma_from .. kMmqMinTokens - 1 tokens run the decode tile on int8 tensor cores (64 rows
  // x 8 tokens per block, K split as for the decode kernels); 0: never (formats without an MmqFormat).
  int64_t mma_from = 0;
  int64_t workspace_bytes = 0;  // device bytes gemv() needs (0: none)
};

// Tokens from which a call runs the tensor-core path, for the formats that have one (Q8_0, Q5_K,
// Q4_K, Q3_K): below, the decode kernels' weight-row walk is faster; from here on the tiles' reuse of
// each weight and activation wins. Either path gives a token the same bits.
constexpr int64_t kMmqMinTokens = 32;

// Checks the shape (cols a whole number of blocks, a supported type) and chooses the split.
// mma_from: the smallest call the tensor-core decode tile takes (GemvPlan::mma_from); -1: the
// process default, SPILL_GEMV_MMA_FROM or 0 (off: the tile has not been measured against the
// __dp4a kernels yet, docs/perf/NOTES.md).
GemvPlan plan_gemv(DType type, int64_t rows, int64_t cols, int64_t max_n, int64_t mma_from = -1);

// Activations rounded once per call (round_rows below, or the RMSNorm that wrote them: see
// RmsNormArgs::rounded): row r's int8 values q[r * cols + i] and the scale of each block of 256
// (d[r * d_stride + b]), as quantize_tokens computes them.
struct RoundedRows {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  int64_t cols = 0, d_stride = 0;
};
__host__ __device__ inline int64_t rounded_rows_bytes(int64_t rows, int64_t cols) {
  const int64_t q = (rows * cols + 15) / 16 * 16;
  const int64_t d = (rows * ((cols + 255) / 256) * 4 + 15) / 16 * 16;
  return q + d;
}
__host__ __device__ inline RoundedRows rounded_rows_at(void* base, int64_t rows, int64_t cols) {
  uint8_t* p = static_cast<uint8_t*>(base);
  RoundedRows r;
  r.cols = cols;
  r.d_stride = (cols + 255) / 256;
  r.q = reinterpret_cast<const int8_t*>(p);
  p += (rows * cols + 15) / 16 * 16;
  r.d = reinterpret_cast<const float*>(p);
  return r;
}

// The rows of r from row `first` on.
__host__ __device__ inline RoundedRows rounded_rows_from(const RoundedRows& r, int64_t first) {
  RoundedRows s = r;
  s.q += first * r.cols;
  s.d += first * r.d_stride;
  return s;
}

struct GemvArgs {
  const void* weights = nullptr;  // rows * row_bytes(type, cols) bytes, 16-byte aligned, device-visible
  const void* x = nullptr;        // [n, cols] f32 or bf16, 16-byte aligned
  bool x_bf16 = false;
  int64_t n = 1;                  // 1 .. plan.max_n
  float* y = nullptr;             // [n, rows]
  void* workspace = nullptr;      // plan.workspace_bytes, prepared once by init_gemv_workspace
  // x already rounded (q set: n rows of plan.cols, the bits round_rows gives): the tensor-core path
  // reads these instead of rounding x itself; the decode path reads x.
  RoundedRows rounded{};
};

// Zeroes the workspace's tile counters (once after allocation; gemv leaves them zero).
void init_gemv_workspace(const GemvPlan& plan, void* workspace, cudaStream_t stream);

// Enqueues the GEMV on `stream`; no host synchronisation.
void gemv(const GemvPlan& plan, const GemvArgs& args, cudaStream_t stream);

// Kernels gemv() launches for a call of n tokens (the tensor-core path rounds the activations first,
// unless they come rounded).
int gemv_launches(const GemvPlan& plan, int64_t n, bool rounded = false);
// Whether a call of n tokens would read rounded activations (the tensor-core path).
inline bool gemv_reads_rounded(const GemvPlan& plan, int64_t n) {
  return (plan.mmq && n >= kMmqMinTokens) || (plan.mma_from > 0 && n >= plan.mma_from);
}

// Tokens one gemv() call should be planned for: the tensor-core path's tiles want whole prefill
// chunks; the decode path's split-K workspace grows with the tokens.
int64_t gemv_tokens_per_call(DType type);

// Rounds x [n, cols] (f32 or bf16, cols a multiple of 32) to int8 per block of 256 into `out`
// (rounded_rows_bytes(n, cols) device bytes, laid out as rounded_rows_at says; mmq.cuh): what the
// tensor-core kernels read.
void round_rows(const void* x, bool x_bf16, int64_t n, int64_t cols, void* out, cudaStream_t stream);

// The int8 rounding the GEMV and MoE kernels apply to their activations, on its own: x [n, cols]
// (cols a multiple of 32, 16-byte aligned, device) into q [n, cols] and d [n, ceil(cols / 256)],
// bit for bit what quant::quantize_activations_q8 stores for each row (a non-finite activation
// gives its block the scale NaN). For tests and for callers that want the rounded values.
void quantize_activations_q8(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, cudaStream_t stream);

}  // namespace spill::cuda
