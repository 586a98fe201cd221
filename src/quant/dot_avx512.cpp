// The AVX-512 dot products: dot_kernels.h over one __m512. Built for AVX-512 F/BW/VL by target
// pragma (after every shared header, so no inline function of theirs is compiled for AVX-512 and
// picked up by code that runs elsewhere), and only called where the CPU has them.
#include <cmath>
#include <cstdint>

#include "quant/blocks.h"
#include "quant/dot_paths.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#if defined(__clang__)
// clang has no target pragma; the same target attribute on every function in the region.
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
// GCC 12's own _mm512_cvtepi8_epi32 / _mm512_cvtepi32_ps pass _mm512_undefined_*() as the
// pass-through operand and then warn about it; nothing here reads an uninitialised value.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace {

struct V {
  __m512 v;
  static V zero() { return {_mm512_setzero_ps()}; }
  static V set1(float a) { return {_mm512_set1_ps(a)}; }
  static V load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static V load_f16(const uint16_t* p) {
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
  }
  static V load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
  }
  static V from_i8(const int8_t* q) {
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))))};
  }
  static V mul(const V& a, const V& b) { return {_mm512_mul_ps(a.v, b.v)}; }
  static V add(const V& a, const V& b) { return {_mm512_add_ps(a.v, b.v)}; }
  static V fma(const V& a, const V& b, const V& c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
};

}  // namespace

#define SPILL_QUANT_X86_UNPACK 1
#include "quant/dot_kernels.h"

namespace spill::quant::detail {

float dot_avx512(DType t, const void* row, const float* x, int64_t n) { return dot_any(t, row, x, n); }
void dot_tokens_avx512(DType t, const void* row, const float* x, int64_t x_stride, int64_t tokens, int64_t n, float* out,
                 int64_t out_stride) {
  dot_tokens_any(t, row, x, x_stride, tokens, n, out, out_stride);
}

}  // namespace spill::quant::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

#endif
