// The integer halves of dot_q8 (quant.h), one build per instruction set: each returns exact
// per-block integer sums, and dot_q8.cpp applies the float scales in one order for every path.
// Internal to src/quant.
#pragma once
#include <cstdint>

#include "quant/blocks.h"

namespace spill::quant::detail {

// What one kernel build computes, for nb blocks of weights against the int8 activations q (and
// their per-16 sums s16, for formats with a min term):
//   q8_0: out[i]  = sum_l w[i].qs[l] q[32 i + l]                              (nb blocks of 32)
//   q4_k, q5_k: out[2 i] = sum_j sc_j sum_l q_jl x_jl, out[2 i + 1] = sum_j m_j sum_l x_jl
//   q6_k: out[i]  = sum_j sc_j sum_l (q_jl - 32) x_jl                           (nb blocks of 256)
// with sc_j, m_j the 6-bit (Q6_K: signed 8-bit) sub-block scales and mins, and for the legacy
// 32-weight formats (nb blocks of 32)
//   q4_0, q5_0, iq4_nl: out[i] = sum_l v_l q[32 i + l], v_l the signed value (quant - 8, quant - 16,
//                       the IQ4_NL level)
//   q4_1, q5_1:         out[i] = sum_l u_l q[32 i + l], u_l the unsigned quant (the min is applied
//                       by the caller, from the activations' per-16 sums)
// All exact in int32.
struct Q8Kernels {
  void (*q8_0)(const BlockQ8_0* w, const int8_t* q, int64_t nb, int32_t* out);
  void (*q4_k)(const BlockQ4_K* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out);
  void (*q5_k)(const BlockQ5_K* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out);
  void (*q6_k)(const BlockQ6_K* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out);
  void (*q4_0)(const BlockQ4_0* w, const int8_t* q, int64_t nb, int32_t* out);
  void (*q4_1)(const BlockQ4_1* w, const int8_t* q, int64_t nb, int32_t* out);
  void (*q5_0)(const BlockQ5_0* w, const int8_t* q, int64_t nb, int32_t* out);
  void (*q5_1)(const BlockQ5_1* w, const int8_t* q, int64_t nb, int32_t* out);
  void (*iq4_nl)(const BlockIQ4_NL* w, const int8_t* q, int64_t nb, int32_t* out);
};

extern const Q8Kernels kQ8Scalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const Q8Kernels kQ8Avx2;
#endif

// Sub-block j's 6-bit scale and min of Q4_K / Q5_K, all eight at once.
inline void scale_mins_k4(const uint8_t* packed, uint8_t sc[8], uint8_t m[8]) {
  for (int j = 0; j < 8; ++j) unpack_scale_min_k4(j, packed, sc[j], m[j]);
}

// The same eight scales and eight mins as bytes of two words, from the packing's bit fields.
inline void scale_min_words_k4(const uint8_t* q, uint64_t& scales, uint64_t& mins) {
  uint32_t a, b, c;
  std::memcpy(&a, q, 4);
  std::memcpy(&b, q + 4, 4);
  std::memcpy(&c, q + 8, 4);
  auto join = [](uint32_t lo, uint32_t hi) { return uint64_t(lo) | (uint64_t(hi) << 32); };
  scales = join(a & 0x3f3f3f3fu, (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4));
  mins = join(b & 0x3f3f3f3fu, ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4));
}

// The min term of Q4_K / Q5_K: sum_j m_j (s16[2 j] + s16[2 j + 1]) over one super-block.
inline int32_t min_term_k4(const uint8_t m[8], const int16_t* s16) {
  int32_t s = 0;
  for (int j = 0; j < 8; ++j) s += int32_t(m[j]) * (int32_t(s16[2 * j]) + int32_t(s16[2 * j + 1]));
  return s;
}

// Q6_K's offset: 32 sum_j sc_j s16[j] over one super-block.
inline int32_t offset_term_q6(const int8_t sc[16], const int16_t* s16) {
  int32_t s = 0;
  for (int j = 0; j < 16; ++j) s += int32_t(sc[j]) * int32_t(s16[j]);
  return 32 * s;
}

}  // namespace spill::quant::detail
