// The AVX2 integer kernels of dot_q8: unsigned quants times signed int8 activations with maddubs
// (pairs into int16, which cannot overflow: at most 2 * 63 * 127), then madd with the sub-block
// scales into the eight int32 lanes of dot_q8_paths.h (exact, so equal to dot_q8_scalar.cpp's),
// combined with the float scales in registers in that header's order.
#include <algorithm>
#include <cmath>

#include "quant/dot_q8_paths.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace spill::quant::detail {
namespace {

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// |a| * (x with a's sign), in int32 pairs of pairs: maddubs wants its first operand unsigned.
// a = -128 cannot occur in a quantizer's output but is a legal byte; |-128| read as unsigned is
// 128, still exact (2 * 128 * 127 fits int16).
inline __m256i q8_0_products(const BlockQ8_0& b, const int8_t* q) {
  const __m256i a = load32(b.qs), x = load32(q);
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(x, a));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// The float part of dot_q8_paths.h's order, in registers.
inline float half(uint16_t h) { return _cvtsh_ss(h); }  // exact, as f16_to_f32
inline float reduce(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return reduce8(lanes);
}

// Q8_0 and the signed legacy formats, NT tokens against one row (1 in decode; 4 in a prompt, where
// each block is loaded once for the four): products(block, q) gives the block's eight int32 lanes,
// and each token takes dot_q8_paths.h's float order on its own.
template <int NT, class Block, class Products>
void row_signed_n(const Block* w, const int8_t* const q[NT], const float* const dx[NT], int64_t nb, Products products,
                float out[NT]) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int64_t end = std::min(nb, b0 + 8);
    __m256 in0[NT], in1[NT];
    for (int t = 0; t < NT; ++t) in0[t] = in1[t] = _mm256_setzero_ps();
    int64_t b = b0;
    for (; b + 2 <= end; b += 2) {
      const __m256 d0 = _mm256_set1_ps(half(w[b].d)), d1 = _mm256_set1_ps(half(w[b + 1].d));
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        in0[t] = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(products(w[b], q[t] + 32 * b)), in0[t]);
        in1[t] = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(products(w[b + 1], q[t] + 32 * b + 32)), in1[t]);
      }
    }
    if (b < end)  // b is even: chain 0
      for (int t = 0; t < NT; ++t)
        in0[t] = _mm256_fmadd_ps(_mm256_set1_ps(half(w[b].d)), _mm256_cvtepi32_ps(products(w[b], q[t] + 32 * b)), in0[t]);
    for (int t = 0; t < NT; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dx[t][b0 / 8]), _mm256_add_ps(in0[t], in1[t]), acc[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = reduce(acc[t]);
}
template <class Block, class Products>
float row_signed(const Block* w, const int8_t* q, const float* dx, int64_t nb, Products products) {
  float out[1];
  row_signed_n<1>(w, &q, &dx, nb, products, out);
  return out[0];
}

float row_q8_0(const BlockQ8_0* w, const int8_t* q, const float* dx, int64_t nb) {
  return row_signed(w, q, dx, nb, [](const BlockQ8_0& b, const int8_t* x) { return q8_0_products(b, x); });
}
void row_q8_0_x4(const BlockQ8_0* w, const int8_t* const q[4], const float* const dx[4], int64_t nb, float out[4]) {
  row_signed_n<4>(w, q, dx, nb, [](const BlockQ8_0& b, const int8_t* x) { return q8_0_products(b, x); }, out);
}
void row_q8_0_x2(const BlockQ8_0* w, const int8_t* const q[2], const float* const dx[2], int64_t nb, float out[2]) {
  row_signed_n<2>(w, q, dx, nb, [](const BlockQ8_0& b, const int8_t* x) { return q8_0_products(b, x); }, out);
}

// 16 copies of int16 lane j of each 128-bit half of v.
inline __m256i spread16(__m256i v, int j) { return _mm256_shuffle_epi8(v, _mm256_set1_epi16(short(0x0100 + 0x0202 * j))); }

// Q4_K / Q5_K, NT tokens against one row (1 in decode; 4 in a prompt, where the nibbles, high bits
// and scale spreads of each group are made once for the four); each token's lanes and float chains
// are its own.
template <int NT, bool kFiveBit, class Block>
void row_q45_k_n(const Block* w, const int8_t* const q[NT], const int16_t* const s16[NT], const float* const dx[NT],
               int64_t nb, float out[NT]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 acc[NT], macc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = macc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    uint64_t sc, m;
    scale_min_words_k4(w[i].scales, sc, m);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc))));
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFiveBit) qh = load32(w[i].qh);
    __m256i lanes[NT];
    for (int t = 0; t < NT; ++t) lanes[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {  // unrolled: the scales' shuffle masks become constants
      const __m256i bytes = load32(w[i].qs + 32 * p);
      __m256i lo = _mm256_and_si256(bytes, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
      if constexpr (kFiveBit) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
        qh = _mm256_srli_epi16(qh, 2);
      }
      const __m256i slo = spread16(scales, 2 * p), shi = spread16(scales, 2 * p + 1);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        const int8_t* qt = q[t] + kSuperBlock * i + 64 * p;
        lanes[t] = _mm256_add_epi32(lanes[t], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load32(qt)), slo));
        lanes[t] = _mm256_add_epi32(lanes[t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load32(qt + 32)), shi));
      }
    }
    // Lane l: m_l (s16[2l] + s16[2l+1]), the mins widened to int16 and each doubled into a pair.
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(m)));
    const __m256i mpairs = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
    const float d = half(w[i].d), dmin = half(w[i].dmin);
    for (int t = 0; t < NT; ++t) {
      const __m256i min_lanes = _mm256_madd_epi16(load32(s16[t] + 16 * i), mpairs);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx[t][i]), _mm256_cvtepi32_ps(lanes[t]), acc[t]);
      macc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * dx[t][i]), _mm256_cvtepi32_ps(min_lanes), macc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = reduce(_mm256_sub_ps(acc[t], macc[t]));
}
template <bool kFiveBit, class Block>
float row_q45_k(const Block* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb) {
  float out[1];
  row_q45_k_n<1, kFiveBit>(w, &q, &s16, &dx, nb, out);
  return out[0];
}

float row_q4_k(const BlockQ4_K* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb) {
  return row_q45_k<false>(w, q, s16, dx, nb);
}
void row_q4_k_x4(const BlockQ4_K* w, const int8_t* const q[4], const int16_t* const s16[4], const float* const dx[4],
                 int64_t nb, float out[4]) {
  row_q45_k_n<4, false>(w, q, s16, dx, nb, out);
}
void row_q5_k_x4(const BlockQ5_K* w, const int8_t* const q[4], const int16_t* const s16[4], const float* const dx[4],
                 int64_t nb, float out[4]) {
  row_q45_k_n<4, true>(w, q, s16, dx, nb, out);
}
void row_q4_k_x2(const BlockQ4_K* w, const int8_t* const q[2], const int16_t* const s16[2], const float* const dx[2],
                 int64_t nb, float out[2]) {
  row_q45_k_n<2, false>(w, q, s16, dx, nb, out);
}
void row_q5_k_x2(const BlockQ5_K* w, const int8_t* const q[2], const int16_t* const s16[2], const float* const dx[2],
                 int64_t nb, float out[2]) {
  row_q45_k_n<2, true>(w, q, s16, dx, nb, out);
}

float row_q5_k(const BlockQ5_K* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb) {
  return row_q45_k<true>(w, q, s16, dx, nb);
}

float row_q6_k(const BlockQ6_K* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
  const __m128i evens_odds = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, q += kSuperBlock, s16 += 16) {
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].scales));
    // Low half: the even sub-blocks' scales as int16, high half the odd ones: chunk c's pair.
    const __m128i eo = _mm_shuffle_epi8(sc8, evens_odds);
    const __m256i pairs = _mm256_set_m128i(_mm_cvtepi8_epi16(_mm_srli_si128(eo, 8)), _mm_cvtepi8_epi16(eo));
    __m256i lanes = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(w[i].ql + 64 * h), ql1 = load32(w[i].ql + 64 * h + 32);
      const __m256i qh = load32(w[i].qh + 32 * h);
      const __m256i lows[4] = {_mm256_and_si256(ql0, low4), _mm256_and_si256(ql1, low4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4)};
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), two);
        const __m256i v = _mm256_or_si256(lows[k], _mm256_slli_epi16(top, 4));
        const __m256i p = _mm256_maddubs_epi16(v, load32(q + 128 * h + 32 * k));
        lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(p, spread16(pairs, 4 * h + k)));
      }
    }
    // The stored offset: lane l takes 32 (sc_2l s16[2l] + sc_2l+1 s16[2l+1]).
    const __m256i offset = _mm256_madd_epi16(load32(s16), _mm256_cvtepi8_epi16(sc8));
    lanes = _mm256_sub_epi32(lanes, _mm256_slli_epi32(offset, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(w[i].d) * dx[i]), _mm256_cvtepi32_ps(lanes), acc);
  }
  return reduce(acc);
}

float amax(const float* x, int64_t n, float* poison) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), zero = _mm256_setzero_ps();
  __m256 m = zero, p = zero;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    m = _mm256_max_ps(m, _mm256_and_ps(v, abs_mask));
    p = _mm256_add_ps(p, _mm256_mul_ps(v, zero));
  }
  alignas(32) float ml[8], pl[8];
  _mm256_store_ps(ml, m);
  _mm256_store_ps(pl, p);
  float mx = 0.0f, ps = 0.0f;
  for (int l = 0; l < 8; ++l) {
    mx = std::max(mx, ml[l]);
    ps += pl[l];
  }
  for (; i < n; ++i) {
    mx = std::max(mx, std::fabs(x[i]));
    ps += x[i] * 0.0f;
  }
  *poison = ps;
  return mx;
}

void round(const float* x, int64_t n, float inv, int8_t* q) {
  const __m256 scale = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  auto quants = [&](const float* p) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(p), scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
  };
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    // packs interleave the 128-bit halves; the permute puts the 32 bytes back in order.
    const __m256i a = _mm256_packs_epi32(quants(x + i), quants(x + i + 8));
    const __m256i b = _mm256_packs_epi32(quants(x + i + 16), quants(x + i + 24));
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), bytes);
  }
  for (; i < n; ++i) q[i] = int8_t(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
}

void sum16(const int8_t* q, int64_t n16, int16_t* out) {
  // Biased to unsigned (q + 128), summed by sad per 8 bytes, the bias taken off: 16 * 128.
  const __m128i bias = _mm_set1_epi8(char(0x80));
  for (int64_t j = 0; j < n16; ++j) {
    const __m128i u = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * j)), bias);
    const __m128i s = _mm_sad_epu8(u, _mm_setzero_si128());
    out[j] = int16_t(_mm_cvtsi128_si32(s) + _mm_extract_epi16(s, 4) - 2048);
  }
}

// ---- the legacy 32-weight formats ----
// The 32 quants of a block as bytes, in weight order: the 16 low nibbles, then the 16 high ones.
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
// 16 in byte l where bit l of the block's qh word is set (byte l holds qh byte l / 8, tested
// against bit l % 8).
inline __m256i fifth_bits(const uint8_t* qh) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(int(q5_high_bits(qh))), spread);
  const __m256i mask = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask), _mm256_set1_epi8(16));
}

// Signed values v (|v| <= 127) times int8 activations, in int32 pairs of pairs (as q8_0's).
inline __m256i signed_products(__m256i v, const int8_t* q) {
  const __m256i x = load32(q);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(x, v)), _mm256_set1_epi16(1));
}
// Unsigned values u (<= 31) times int8 activations.
inline __m256i unsigned_products(__m256i u, const int8_t* q) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, load32(q)), _mm256_set1_epi16(1));
}

template <class Block, class Products>
void legacy(const Block* w, const int8_t* q, int64_t nb, int32_t* out, Products products) {
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4, q += 128) {  // four blocks' sums per horizontal add, as q8_0
    const __m256i p0 = products(w[i], q), p1 = products(w[i + 1], q + 32);
    const __m256i p2 = products(w[i + 2], q + 64), p3 = products(w[i + 3], q + 96);
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), s);
  }
  for (; i < nb; ++i, q += 32) out[i] = hsum(products(w[i], q));
}

float row_q4_0(const BlockQ4_0* w, const int8_t* q, const float* dx, int64_t nb) {
  return row_signed(w, q, dx, nb, [](const BlockQ4_0& b, const int8_t* x) {
    return signed_products(_mm256_sub_epi8(nibbles32(b.qs), _mm256_set1_epi8(8)), x);
  });
}
void q4_1(const BlockQ4_1* w, const int8_t* q, int64_t nb, int32_t* out) {
  legacy(w, q, nb, out, [](const BlockQ4_1& b, const int8_t* x) { return unsigned_products(nibbles32(b.qs), x); });
}
float row_q5_0(const BlockQ5_0* w, const int8_t* q, const float* dx, int64_t nb) {
  return row_signed(w, q, dx, nb, [](const BlockQ5_0& b, const int8_t* x) {
    const __m256i v = _mm256_or_si256(nibbles32(b.qs), fifth_bits(b.qh));
    return signed_products(_mm256_sub_epi8(v, _mm256_set1_epi8(16)), x);
  });
}
void q5_1(const BlockQ5_1* w, const int8_t* q, int64_t nb, int32_t* out) {
  legacy(w, q, nb, out, [](const BlockQ5_1& b, const int8_t* x) {
    return unsigned_products(_mm256_or_si256(nibbles32(b.qs), fifth_bits(b.qh)), x);
  });
}
float row_iq4_nl(const BlockIQ4_NL* w, const int8_t* q, const float* dx, int64_t nb) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  return row_signed(w, q, dx, nb, [&](const BlockIQ4_NL& b, const int8_t* x) {
    return signed_products(_mm256_shuffle_epi8(table, nibbles32(b.qs)), x);
  });
}

}  // namespace

const Q8Kernels kQ8Avx2 = {row_q8_0, row_q4_k, row_q5_k, row_q6_k,    row_q4_0,    row_q5_0,   row_iq4_nl, q4_1,
                           q5_1,     amax,     round,    sum16,       row_q8_0_x4, row_q4_k_x4, row_q5_k_x4,
                           row_q8_0_x2, row_q4_k_x2, row_q5_k_x2};

}  // namespace spill::quant::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
