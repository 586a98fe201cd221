// Dense quantized GEMV for decode: y[n, rows] = x[n, cols] * W[rows, cols]^T with W in a ggml block
// format (Q8_0, Q6_K, Q5_K, Q4_K, Q3_K, Q2_K), x in f32 or bf16, y in f32, n small (1..8 is the
// decode case; any n works, in groups of 8). The weight bytes are read once for all n rows.
//
// CPU twin: quant::dequantize_row and a float64 dot (tests/cuda_gemv_test.cpp).
//
// Work split: a block of 4 warps takes 16 rows; each warp stages 4 rows (one K-chunk of them) in
// shared memory with coalesced 16-byte copies, then dots them with the activations. When the rows
// alone give too few blocks to fill the GPU, K is split into chunks whose partial sums the last
// block of each row tile adds in chunk order: the split depends on (type, rows, cols) only, so a
// row's result never depends on n or on the other rows.
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
  int64_t workspace_bytes = 0;  // device bytes gemv() needs (0 when k_splits == 1)
};

// Checks the shape (cols a whole number of blocks, a supported type) and chooses the split.
GemvPlan plan_gemv(DType type, int64_t rows, int64_t cols, int64_t max_n);

struct GemvArgs {
  const void* weights = nullptr;  // rows * row_bytes(type, cols) bytes, 16-byte aligned, device-visible
  const void* x = nullptr;        // [n, cols] f32 or bf16, 16-byte aligned
  bool x_bf16 = false;
  int64_t n = 1;                  // 1 .. plan.max_n
  float* y = nullptr;             // [n, rows]
  void* workspace = nullptr;      // plan.workspace_bytes, prepared once by init_gemv_workspace
};

// Zeroes the workspace's tile counters (once after allocation; gemv leaves them zero).
void init_gemv_workspace(const GemvPlan& plan, void* workspace, cudaStream_t stream);

// Enqueues the GEMV on `stream`; no host synchronisation.
void gemv(const GemvPlan& plan, const GemvArgs& args, cudaStream_t stream);

}  // namespace spill::cuda
