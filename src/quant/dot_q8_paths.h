// The integer halves of dot_q8 (quant.h), one build per instruction set: each returns exact
// per-block integer sums, and dot_q8.cpp applies the float scales in one order for every path.
// Internal to src/quant.
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/blocks.h"

namespace spill::quant::detail {

// What one kernel build computes.
//
// Row dots, the float scales applied (Q8_0, Q4_K, Q5_K, Q6_K, and Q4_0, Q5_0, IQ4_NL, which
// combine as Q8_0 does). Each build computes the same eight int32 "lanes" per block, exactly, and combines them
// in the same float operations, lane by lane, so the bits never depend on the build:
//   lane l of a block sums the products at the positions p with (p % 32) / 4 == l (the lane a
//   maddubs + madd pair puts them in), each times its sub-block scale where the format has one;
//   Q4_K/Q5_K: a second lane set m_l (s16[2l] + s16[2l+1]), sub-block l's min term;
//   Q6_K: the stored offset of 32 taken off per lane as 32 (sc_2l s16[2l] + sc_2l+1 s16[2l+1]).
// Float order, acc[8] starting at +0:
//   Q8_0 (and Q4_0, Q5_0, IQ4_NL, their lanes of the signed values quant - 8, quant - 16 and
//         the IQ4_NL level): per activation block g of 256 (8 weight blocks, fewer in a short last one), two inner
//         chains in[b % 2] = fma(d_b, float(lane), in[b % 2]) in block order, then
//         acc = fma(d_x[g], in0 + in1, acc);
//   Q4_K, Q5_K: per super-block acc = fma(d * d_x, float(lane), acc), macc likewise with
//         dmin * d_x and the min lanes; the result is reduce8(acc - macc);
//   Q6_K: acc = fma(d * d_x, float(lane), acc).
// and reduce8 (below) sums the eight lanes. Half-precision scales are converted exactly.
//
// Integer sums for the legacy formats with a min, the float scales applied by dot_q8.cpp
// (nb blocks of 32):
//   q4_1, q5_1: out[i] = sum_l u_l q[32 i + l], u_l the unsigned quant (the min is applied by the
//               caller, from the activations' per-16 sums)
// All exact in int32.
//
// Activation rounding (quantize_activations_q8's inner loops, the same bits in every build):
//   amax: max |x_i| over n values, and poison = sum of x_i * 0 (NaN exactly when some x_i is not
//         finite); round: q_i = int8(clamp(nearbyint(x_i * inv), -127, 127)); sum16: the sums of
//         each 16 consecutive q.
struct Q8Kernels {
  float (*row_q8_0)(const BlockQ8_0* w, const int8_t* q, const float* dx, int64_t n_blocks);
  float (*row_q4_k)(const BlockQ4_K* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb);
  float (*row_q5_k)(const BlockQ5_K* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb);
  float (*row_q6_k)(const BlockQ6_K* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb);
  float (*row_q4_0)(const BlockQ4_0* w, const int8_t* q, const float* dx, int64_t n_blocks);
  float (*row_q5_0)(const BlockQ5_0* w, const int8_t* q, const float* dx, int64_t n_blocks);
  float (*row_iq4_nl)(const BlockIQ4_NL* w, const int8_t* q, const float* dx, int64_t n_blocks);
  void (*q4_1)(const BlockQ4_1* w, const int8_t* q, int64_t nb, int32_t* out);
  void (*q5_1)(const BlockQ5_1* w, const int8_t* q, int64_t nb, int32_t* out);
  float (*amax)(const float* x, int64_t n, float* poison);
  void (*round)(const float* x, int64_t n, float inv, int8_t* q);
  void (*sum16)(const int8_t* q, int64_t n16, int16_t* out);
  // Four tokens against one row: out[t] is exactly what the one-token kernel above gives token t
  // (the same lanes, the same float operations), with the row's loads and unpacking shared by the
  // four. Null where a build has none: the caller takes the one-token kernel four times.
  void (*row_q8_0_x4)(const BlockQ8_0* w, const int8_t* const q[4], const float* const dx[4], int64_t n_blocks,
                      float out[4]);
  void (*row_q4_k_x4)(const BlockQ4_K* w, const int8_t* const q[4], const int16_t* const s16[4],
                      const float* const dx[4], int64_t nb, float out[4]);
  void (*row_q5_k_x4)(const BlockQ5_K* w, const int8_t* const q[4], const int16_t* const s16[4],
                      const float* const dx[4], int64_t nb, float out[4]);
  // Two tokens the same way (the two left after groups of four; an expert's one or two tokens in a
  // decode batch, where each token alone would unpack the row again). Null where a build has none.
  void (*row_q8_0_x2)(const BlockQ8_0* w, const int8_t* const q[2], const float* const dx[2], int64_t n_blocks,
                      float out[2]);
  void (*row_q4_k_x2)(const BlockQ4_K* w, const int8_t* const q[2], const int16_t* const s16[2],
                      const float* const dx[2], int64_t nb, float out[2]);
  void (*row_q5_k_x2)(const BlockQ5_K* w, const int8_t* const q[2], const int16_t* const s16[2],
                      const float* const dx[2], int64_t nb, float out[2]);
};

// The lanes' sum: lanes i and i+4, then i and i+2, then 0 and 1.
inline float reduce8(const float* v) {
  float t4[4], t2[2];
  for (int i = 0; i < 4; ++i) t4[i] = v[i] + v[i + 4];
  for (int i = 0; i < 2; ++i) t2[i] = t4[i] + t4[i + 2];
  return t2[0] + t2[1];
}

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

}  // namespace spill::quant::detail
