// The AVX2 dot products: dot_kernels.h over a pair of __m256 (lanes 0-7 and 8-15). Built for
// AVX2 + FMA + F16C by target pragma, and only called where the CPU has them.
#include <cmath>
#include <cstdint>

#include "quant/blocks.h"
#include "quant/dot_paths.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace {

struct V {
  __m256 lo, hi;
  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V set1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
  static V load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static V load_f16(const uint16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
  }
  static __m256 bf16x8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V load_bf16(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
  static V from_i8(const int8_t* q) {  // two sign-extending loads of 8 bytes each
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8))))};
  }
  static V mul(const V& a, const V& b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static V add(const V& a, const V& b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static V fma(const V& a, const V& b, const V& c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  void store(float* p) const {
    _mm256_storeu_ps(p, lo);
    _mm256_storeu_ps(p + 8, hi);
  }
};

}  // namespace

#define SPILL_QUANT_X86_UNPACK 1
#include "quant/dot_kernels.h"

namespace spill::quant::detail {

float dot_avx2(DType t, const void* row, const float* x, int64_t n) { return dot_any(t, row, x, n); }
void dot_tokens_avx2(DType t, const void* row, const float* x, int64_t x_stride, int64_t tokens, int64_t n, float* out,
                 int64_t out_stride) {
  dot_tokens_any(t, row, x, x_stride, tokens, n, out, out_stride);
}

}  // namespace spill::quant::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
