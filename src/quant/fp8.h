// FP8 e4m3 (OCP "E4M3FN": 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities, 0x7F
// and 0xFF are NaN, the largest finite value is 448) and the KV cache's use of it.
//
// The FP8 KV cache (--kv-format fp8) keeps each (token, KV head) vector of K and of V as head_dim
// e4m3 values and one f32 scale: scale = amax / 448 and q_i = e4m3(x_i * (448 / amax)), so the
// largest value of every vector uses the format's whole range (a per-vector scale, not one
// calibrated per tensor: nothing to calibrate, and a vector of small values keeps its precision).
// Reading it back, x_i ~ float(q_i) * scale.
//
// This is the CPU twin of the CUDA write (backend/cuda/ops.cu, rope_kv_write) and read (the
// attention kernels): the same single IEEE operations in the same order, so the GPU's bytes and
// scales equal quantize_kv_fp8's bit for bit (tests/cuda_ops_test.cpp).
#pragma once
#include <cstdint>

namespace spill::quant {

constexpr float kE4m3Max = 448.0f;

// Round to nearest, ties to even; |x| beyond the largest finite value (infinities included)
// saturates to +-448; NaN gives 0x7F (the sign kept). What the GPU's cvt.rn.satfinite.e4m3x2.f32
// gives.
uint8_t f32_to_e4m3(float x);
// Exact (every e4m3 value is an f32); 0x7F / 0xFF give NaN.
float e4m3_to_f32(uint8_t q);

// One KV vector of n values into n e4m3 bytes; returns its scale. amax = max |x_i|; then
//   amax == 0:        scale 0, every q_i 0;
//   any x_i not finite: scale NaN (so the whole vector reads back as NaN, as a BF16 cache would
//                     hold the non-finite value), every q_i 0;
//   else:             scale = amax / 448, q_i = f32_to_e4m3(x_i * (448 / amax)) (one division
//                     each, one product per value).
float quantize_kv_fp8(const float* x, int64_t n, uint8_t* q);

// What the GPU's attention multiplies by: bf16 of (float(q) * scale), rounded to nearest even, the
// product one IEEE multiply. Returned as the bf16 bits.
uint16_t kv_fp8_to_bf16(uint8_t q, float scale);

}  // namespace spill::quant
