// The block formats on the CPU: the reference dequantizer of every DType (bit-exact to ggml's),
// quantizers that search scales to minimise (optionally importance-weighted) error, and the dot
// product the CPU matmul uses. The CUDA kernels read the same bytes and are tested against these.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace spill::quant {

// n weights (a whole number of blocks of t, see row_fits) from src (row_bytes(t, n) bytes) into dst.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantizes n floats (a whole number of blocks) into dst (row_bytes(t, n) bytes). importance, when
// given, holds n non-negative weights (a row of an importance matrix: mean squared activation per
// input column) that the scale search minimises the weighted squared error under.
void quantize_row(DType t, const float* src, void* dst, int64_t n, const float* importance = nullptr);

// sum_i dequantize(row)[i] * x[i] over n weights, with f32 activations, accumulated in an order that
// depends on n alone (never on the batch or the thread), so a token's result is batch-invariant.
float dot(DType t, const void* row, const float* x, int64_t n);

// The vector path dot() takes on this CPU: "avx512", "avx2" or "scalar".
const char* cpu_kernel_path();

// The builds of dot(), for tests and benchmarks that compare them. Every path gives the same bits
// for the same input; dot() takes the widest one cpu_supports.
enum class KernelPath : uint8_t { Scalar, Avx2, Avx512 };
bool cpu_supports(KernelPath p);
const char* kernel_path_name(KernelPath p);
// dot() on a given path; throws spill::Error if this CPU cannot run it.
float dot_on(KernelPath p, DType t, const void* row, const float* x, int64_t n);

}  // namespace spill::quant
