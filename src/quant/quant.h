// The block formats on the CPU: the reference dequantizer of every DType (bit-exact to ggml's),
// quantizers that search scales to minimise (optionally importance-weighted) error, and the dot
// product the CPU matmul uses. The CUDA kernels read the same bytes and are tested against these.
//
// Bytes are ggml's block layouts exactly (see blocks.h), so rows of a GGUF tensor are passed as
// they are. A row of n weights takes row_bytes(t, n) bytes; n must be a whole number of blocks
// (row_fits), else every function here throws spill::Error. Functions are thread-safe (no state
// but the kernel choice, made once).
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace spill::quant {

// n weights (a whole number of blocks of t, see row_fits) from src (row_bytes(t, n) bytes) into dst.
// Each value is computed exactly as ggml's dequantize_row_* computes it (products rounded one at a
// time, never fused), checked bit for bit against gguf-py and ggml's C code.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantizes n floats (a whole number of blocks) into dst (row_bytes(t, n) bytes). importance, when
// given, holds n non-negative weights (a row of an importance matrix: mean squared activation per
// input column) that the scale search minimises the weighted squared error under; without it the
// plain squared error is minimised. F32/F16/BF16 round to nearest (even). Throws spill::Error for
// non-finite weights, negative or non-finite importance, or a block whose scale overflows f16.
// Cost: roughly ggml's own quantizer (tens of microseconds per 256 weights for the k-quants).
void quantize_row(DType t, const float* src, void* dst, int64_t n, const float* importance = nullptr);

// sum_i dequantize(row)[i] * x[i] over n weights, with f32 activations, accumulated in an order that
// depends on n alone (never on the batch or the thread), so a token's result is batch-invariant.
// For block formats the scales are applied to per-sub-block sums (the order is written out in
// dot_kernels.h), so the result equals a float64 dot of the dequantized row to within fp32
// rounding, not bit for bit; dot(F32, widened F16/BF16 row) == dot(F16/BF16 row) exactly.
float dot(DType t, const void* row, const float* x, int64_t n);

// dot() of one row with each of n_tokens activation rows: out[i * out_stride] = dot(t, row,
// x + i * x_stride, n), bit for bit, with the row's blocks unpacked once for every few tokens
// (prefill and batched decode read each weight row once per group of tokens).
void dot_tokens(DType t, const void* row, const float* x, int64_t x_stride, int64_t n_tokens, int64_t n, float* out,
                int64_t out_stride);

// The vector path dot() takes on this CPU: "avx512", "avx2" or "scalar" (the widest this CPU
// runs, unless the environment variable SPILL_CPU_KERNELS names one).
const char* cpu_kernel_path();

// The builds of dot(), for tests and benchmarks that compare them. Every path gives the same bits
// for the same input; dot() takes the widest one cpu_supports.
enum class KernelPath : uint8_t { Scalar, Avx2, Avx512 };
bool cpu_supports(KernelPath p);
const char* kernel_path_name(KernelPath p);
// dot() on a given path; throws spill::Error if this CPU cannot run it.
float dot_on(KernelPath p, DType t, const void* row, const float* x, int64_t n);

}  // namespace spill::quant
