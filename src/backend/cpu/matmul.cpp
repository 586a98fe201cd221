#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace spill::cpu {

namespace {

// One accumulation order for every weight dtype: 4 x 8 lanes over 32-element chunks, a fixed
// horizontal reduction, then the scalar tail. Converting a bf16/f16 row to float first and then
// calling dot_f32 gives bit-identical results to the fused loads below, which is what makes a
// token's output independent of the batch it is computed in.
#if defined(__AVX2__) && defined(__FMA__)
inline float hsum(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 lo = _mm256_castps256_ps128(s), hi = _mm256_extractf128_ps(s, 1);
  __m128 q = _mm_add_ps(lo, hi);
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline __m256 load_bf16(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
template <class Load, class Scalar>
inline float dot_impl(const float* x, const void* w, int64_t n, Load load, Scalar scalar) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load(w, i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load(w, i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), load(w, i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), load(w, i + 24), a3);
  }
  float s = hsum(a0, a1, a2, a3);
  for (; i < n; ++i) s += x[i] * scalar(w, i);
  return s;
}
inline float dot_f32(const float* x, const float* w, int64_t n) {
  return dot_impl(
      x, w, n, [](const void* p, int64_t i) { return _mm256_loadu_ps(static_cast<const float*>(p) + i); },
      [](const void* p, int64_t i) { return static_cast<const float*>(p)[i]; });
}
inline float dot_bf16(const float* x, const uint16_t* w, int64_t n) {
  return dot_impl(
      x, w, n, [](const void* p, int64_t i) { return load_bf16(static_cast<const uint16_t*>(p) + i); },
      [](const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); });
}
inline float dot_f16(const float* x, const uint16_t* w, int64_t n) {
  return dot_impl(
      x, w, n, [](const void* p, int64_t i) { return load_f16(static_cast<const uint16_t*>(p) + i); },
      [](const void* p, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(p)[i]); });
}
#else
// Portable version of the same order: 32 partial sums, reduced in the same tree.
template <class Get>
inline float dot_impl(const float* x, int64_t n, Get get) {
  float acc[32] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 32; ++j) acc[j] += x[i + j] * get(i + j);
  float lanes[8];
  for (int j = 0; j < 8; ++j) lanes[j] = (acc[j] + acc[8 + j]) + (acc[16 + j] + acc[24 + j]);
  float q[4];
  for (int j = 0; j < 4; ++j) q[j] = lanes[j] + lanes[4 + j];
  float s = (q[0] + q[2]) + (q[1] + q[3]);
  for (; i < n; ++i) s += x[i] * get(i);
  return s;
}
inline float dot_f32(const float* x, const float* w, int64_t n) {
  return dot_impl(x, n, [w](int64_t i) { return w[i]; });
}
inline float dot_bf16(const float* x, const uint16_t* w, int64_t n) {
  return dot_impl(x, n, [w](int64_t i) { return bf16_to_f32(w[i]); });
}
inline float dot_f16(const float* x, const uint16_t* w, int64_t n) {
  return dot_impl(x, n, [w](int64_t i) { return f16_to_f32(w[i]); });
}
#endif

}  // namespace

void load_row(const TensorView& w, int64_t row, float* out) {
  const int64_t K = w.cols();
  switch (w.dtype) {
    case DType::F32: std::copy_n(static_cast<const float*>(w.data) + row * K, K, out); break;
    case DType::BF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + row * K;
      for (int64_t i = 0; i < K; ++i) out[i] = bf16_to_f32(p[i]);
      break;
    }
    case DType::F16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + row * K;
      for (int64_t i = 0; i < K; ++i) out[i] = f16_to_f32(p[i]);
      break;
    }
    default: fail("the CPU backend cannot read {} weights yet", dtype_name(w.dtype));
  }
}

float dot_row(const float* x, const TensorView& w, int64_t row) {
  const int64_t K = w.cols();
  switch (w.dtype) {
    case DType::F32: return dot_f32(x, static_cast<const float*>(w.data) + row * K, K);
    case DType::BF16: return dot_bf16(x, static_cast<const uint16_t*>(w.data) + row * K, K);
    case DType::F16: return dot_f16(x, static_cast<const uint16_t*>(w.data) + row * K, K);
    default: fail("the CPU backend cannot read {} weights yet", dtype_name(w.dtype));
  }
  return 0;
}

void matmul(ThreadPool& pool, const float* x, int64_t n, const TensorView& w, float* y, const TensorView* bias) {
  const int64_t M = w.rows(), K = w.cols();
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    // With several tokens, a half-precision row is widened once and reused for every token.
    std::vector<float> row;
    const bool widen = n > 1 && w.dtype != DType::F32;
    if (widen) row.resize(static_cast<size_t>(K));
    for (int64_t m = m0; m < m1; ++m) {
      if (widen) {
        load_row(w, m, row.data());
        for (int64_t t = 0; t < n; ++t) y[t * M + m] = dot_f32(x + t * K, row.data(), K);
      } else {
        for (int64_t t = 0; t < n; ++t) y[t * M + m] = dot_row(x + t * K, w, m);
      }
    }
  });
  if (bias && !bias->empty()) {
    std::vector<float> b(static_cast<size_t>(M));
    TensorView bv = *bias;
    bv.ndim = 2;
    bv.shape = {1, M, 0, 0};
    load_row(bv, 0, b.data());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t m = 0; m < M; ++m) y[t * M + m] += b[size_t(m)];
  }
}

}  // namespace spill::cpu
