// The AVX2 integer kernels of dot_q8: unsigned quants times signed int8 activations with maddubs
// (pairs into int16, which cannot overflow: at most 2 * 63 * 127), then madd with the sub-block
// scales into int32, one horizontal sum per block. Exact, so equal to dot_q8_scalar.cpp's sums.
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

void q8_0(const BlockQ8_0* w, const int8_t* q, int64_t nb, int32_t* out) {
  int64_t i = 0;
  // Four blocks' sums at once: three horizontal adds leave block k's two half-sums in lanes k
  // and k + 4.
  for (; i + 4 <= nb; i += 4, q += 128) {
    const __m256i p0 = q8_0_products(w[i], q), p1 = q8_0_products(w[i + 1], q + 32);
    const __m256i p2 = q8_0_products(w[i + 2], q + 64), p3 = q8_0_products(w[i + 3], q + 96);
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), s);
  }
  for (; i < nb; ++i, q += 32) out[i] = hsum(q8_0_products(w[i], q));
}

template <bool kFiveBit, class Block>
void q45_k(const Block* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < nb; ++i, q += kSuperBlock, s16 += 16) {
    uint64_t sc, m;
    scale_min_words_k4(w[i].scales, sc, m);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFiveBit) qh = load32(w[i].qh);
    __m256i acc = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i bytes = load32(w[i].qs + 32 * p);
      __m256i lo = _mm256_and_si256(bytes, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
      if constexpr (kFiveBit) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
        qh = _mm256_srli_epi16(qh, 2);
      }
      const __m256i plo = _mm256_maddubs_epi16(lo, load32(q + 64 * p));
      const __m256i phi = _mm256_maddubs_epi16(hi, load32(q + 64 * p + 32));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(plo, _mm256_set1_epi16(short((sc >> (16 * p)) & 0xFF))));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(phi, _mm256_set1_epi16(short((sc >> (16 * p + 8)) & 0xFF))));
    }
    // sum_j m_j (s16[2j] + s16[2j+1]): the mins widened to int16 and each doubled into a pair.
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(m)));
    const __m256i mpairs = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
    out[2 * i] = hsum(acc);
    out[2 * i + 1] = hsum(_mm256_madd_epi16(load32(s16), mpairs));
  }
}

void q4_k(const BlockQ4_K* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out) {
  q45_k<false>(w, q, s16, nb, out);
}
void q5_k(const BlockQ5_K* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out) {
  q45_k<true>(w, q, s16, nb, out);
}

void q6_k(const BlockQ6_K* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < nb; ++i, q += kSuperBlock, s16 += 16) {
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(w[i].ql + 64 * h), ql1 = load32(w[i].ql + 64 * h + 32);
      const __m256i qh = load32(w[i].qh + 32 * h);
      const __m256i lows[4] = {_mm256_and_si256(ql0, low4), _mm256_and_si256(ql1, low4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4)};
      for (int k = 0; k < 4; ++k) {
        const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), two);
        const __m256i v = _mm256_or_si256(lows[k], _mm256_slli_epi16(top, 4));
        const __m256i p = _mm256_maddubs_epi16(v, load32(q + 128 * h + 32 * k));
        // Bytes 0-15 are sub-block 8h + 2k, bytes 16-31 the next one.
        const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(w[i].scales[8 * h + 2 * k + 1]),
                                               _mm_set1_epi16(w[i].scales[8 * h + 2 * k]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale));
      }
    }
    out[i] = hsum(acc) - offset_term_q6(w[i].scales, s16);
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

void q4_0(const BlockQ4_0* w, const int8_t* q, int64_t nb, int32_t* out) {
  legacy(w, q, nb, out, [](const BlockQ4_0& b, const int8_t* x) {
    return signed_products(_mm256_sub_epi8(nibbles32(b.qs), _mm256_set1_epi8(8)), x);
  });
}
void q4_1(const BlockQ4_1* w, const int8_t* q, int64_t nb, int32_t* out) {
  legacy(w, q, nb, out, [](const BlockQ4_1& b, const int8_t* x) { return unsigned_products(nibbles32(b.qs), x); });
}
void q5_0(const BlockQ5_0* w, const int8_t* q, int64_t nb, int32_t* out) {
  legacy(w, q, nb, out, [](const BlockQ5_0& b, const int8_t* x) {
    const __m256i v = _mm256_or_si256(nibbles32(b.qs), fifth_bits(b.qh));
    return signed_products(_mm256_sub_epi8(v, _mm256_set1_epi8(16)), x);
  });
}
void q5_1(const BlockQ5_1* w, const int8_t* q, int64_t nb, int32_t* out) {
  legacy(w, q, nb, out, [](const BlockQ5_1& b, const int8_t* x) {
    return unsigned_products(_mm256_or_si256(nibbles32(b.qs), fifth_bits(b.qh)), x);
  });
}
void iq4_nl(const BlockIQ4_NL* w, const int8_t* q, int64_t nb, int32_t* out) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  legacy(w, q, nb, out, [&](const BlockIQ4_NL& b, const int8_t* x) {
    return signed_products(_mm256_shuffle_epi8(table, nibbles32(b.qs)), x);
  });
}

}  // namespace

const Q8Kernels kQ8Avx2 = {q8_0, q4_k, q5_k, q6_k, q4_0, q4_1, q5_0, q5_1, iq4_nl};

}  // namespace spill::quant::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
