// The per-instruction-set builds of dot_kernels.h, for dot.cpp's run-time dispatch and the tests
// that check the paths agree. Internal to src/quant.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace spill::quant::detail {

float dot_scalar(DType t, const void* row, const float* x, int64_t n);
void dot_tokens_scalar(DType t, const void* row, const float* x, int64_t x_stride, int64_t tokens, int64_t n,
                       float* out, int64_t out_stride);
#if defined(__x86_64__) || defined(_M_X64)
float dot_avx2(DType t, const void* row, const float* x, int64_t n);
float dot_avx512(DType t, const void* row, const float* x, int64_t n);
void dot_tokens_avx2(DType t, const void* row, const float* x, int64_t x_stride, int64_t tokens, int64_t n,
                     float* out, int64_t out_stride);
void dot_tokens_avx512(DType t, const void* row, const float* x, int64_t x_stride, int64_t tokens, int64_t n,
                       float* out, int64_t out_stride);
#endif

}  // namespace spill::quant::detail
