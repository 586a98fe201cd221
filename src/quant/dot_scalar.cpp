// The portable dot products: dot_kernels.h over 16 floats in plain loops. On any CPU this gives
// the same bits as the AVX2 and AVX-512 paths (they compute the same elementwise operations).
#include <cmath>
#include <cstdint>

#include "quant/blocks.h"
#include "quant/dot_paths.h"

namespace {

struct V {
  float v[16];
  static V zero() { return set1(0.0f); }
  static V set1(float a) {
    V r;
    for (float& x : r.v) x = a;
    return r;
  }
  static V load(const float* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = p[i];
    return r;
  }
  static V load_f16(const uint16_t* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = spill::f16_to_f32(p[i]);
    return r;
  }
  static V load_bf16(const uint16_t* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = spill::bf16_to_f32(p[i]);
    return r;
  }
  static V from_i8(const int8_t* q) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = float(q[i]);
    return r;
  }
  static V mul(const V& a, const V& b) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] * b.v[i];
    return r;
  }
  static V add(const V& a, const V& b) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = a.v[i] + b.v[i];
    return r;
  }
  // a * b + c, rounded once.
  static V fma(const V& a, const V& b, const V& c) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return r;
  }
  void store(float* p) const {
    for (int i = 0; i < 16; ++i) p[i] = v[i];
  }
};

}  // namespace

#include "quant/dot_kernels.h"

namespace spill::quant::detail {

float dot_scalar(DType t, const void* row, const float* x, int64_t n) { return dot_any(t, row, x, n); }
void dot_tokens_scalar(DType t, const void* row, const float* x, int64_t x_stride, int64_t tokens, int64_t n, float* out,
                 int64_t out_stride) {
  dot_tokens_any(t, row, x, x_stride, tokens, n, out, out_stride);
}

}  // namespace spill::quant::detail
