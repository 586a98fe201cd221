// The dot products of every weight type with f32 activations, written once over a 16-lane vector
// type V and compiled three times: dot_scalar.cpp (V = 16 floats in a loop), dot_avx2.cpp (two
// __m256) and dot_avx512.cpp (one __m512). Every operation on V is elementwise and the reductions
// are scalar code shared by all three, so the paths give bit-identical results by construction:
// the order of the arithmetic is this file's, not the instruction set's.
//
// The order, for block formats: each sub-block of S = 16 or 32 weights forms the lanewise
// products P = q[0:16] * x[0:16] (then P = fma(q[16:32], x[16:32], P) when S = 32) from its
// integer quants q, and adds d_j * P into one of two 16-lane accumulators (even and odd
// sub-blocks alternate, so two chains run in parallel); formats with a min (Q4_K, Q5_K, Q2_K)
// likewise add m_j * (x[0:16] + x[16:32]) into two more. The result is reduce(acc0 + acc1) minus
// reduce(min0 + min1), reduce summing lanes i and i+8, then i and i+4, i and i+2, 0 and 1.
// Dequantized weight d_j * q - m_j times x, summed: the same value, rounded differently.
//
// The legacy 32-weight formats (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) are sub-blocks of 32 in the
// same scheme, blocks alternating between the two chains as Q8_0's do; Q4_1/Q5_1's "+ m" is the
// min term with -m (negating is exact).
//
// For F32/F16/BF16 the order is the one the CPU backend has always used: lanes 0-15 and 16-31 of
// each 32-weight chunk fused-multiply-added into A and B, then (A.lo + A.hi) + (B.lo + B.hi)
// reduced over 8 lanes as above, then the tail (n % 32) added one fma at a time.
//
// This header has no include guard on purpose and must be included after V is declared, with
// everything it needs (quant/blocks.h, <cmath>) included before any target pragma.

namespace {

using namespace spill;
using namespace spill::quant;

inline float reduce8(const float* v) {
  float t4[4], t2[2];
  for (int i = 0; i < 4; ++i) t4[i] = v[i] + v[i + 4];
  for (int i = 0; i < 2; ++i) t2[i] = t4[i] + t4[i + 2];
  return t2[0] + t2[1];
}

inline float reduce16(const V& a) {
  float lanes[16], v8[8];
  a.store(lanes);
  for (int i = 0; i < 8; ++i) v8[i] = lanes[i] + lanes[i + 8];
  return reduce8(v8);
}

struct Acc {
  V s[2] = {V::zero(), V::zero()};
  V m[2] = {V::zero(), V::zero()};
};

// (The parity is a template argument so the accumulators stay in registers.)
template <int kSub, bool kMin, int kParity>
inline void accumulate(Acc& a, const int8_t* q, const float* x, float d, float m) {
  V p = V::mul(V::from_i8(q), V::load(x));
  if constexpr (kSub == 32) p = V::fma(V::from_i8(q + 16), V::load(x + 16), p);
  a.s[kParity] = V::fma(V::set1(d), p, a.s[kParity]);
  if constexpr (kMin) {
    V xs = V::load(x);
    if constexpr (kSub == 32) xs = V::add(xs, V::load(x + 16));
    a.m[kParity] = V::fma(V::set1(m), xs, a.m[kParity]);
  }
}

template <bool kMin>
inline float finish(const Acc& a) {
  const float s = reduce16(V::add(a.s[0], a.s[1]));
  if constexpr (!kMin) return s;
  return s - reduce16(V::add(a.m[0], a.m[1]));
}

// ---- plain floats ----------------------------------------------------------------
template <class Load, class Scalar>
inline float dot_floats(const float* x, int64_t n, Load load, Scalar scalar) {
  V a = V::zero(), b = V::zero();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = V::fma(V::load(x + i), load(i), a);
    b = V::fma(V::load(x + i + 16), load(i + 16), b);
  }
  float la[16], lb[16], v8[8];
  a.store(la);
  b.store(lb);
  for (int j = 0; j < 8; ++j) v8[j] = (la[j] + la[j + 8]) + (lb[j] + lb[j + 8]);
  float s = reduce8(v8);
  for (; i < n; ++i) s = std::fma(x[i], scalar(i), s);
  return s;
}

// ---- unpacking a block's quants to int8 and its sub-block scales to float ----------
// The integer quants are exact, so how each translation unit's compiler vectorises these loops
// cannot change a result.
struct Unpacked {
  alignas(64) int8_t q[kSuperBlock];
  float d[16] = {};
  float m[16] = {};  // zero for formats without mins
};

// Byte-plane primitives the unpackers are built from, on 32 (or 16) bytes at a time: plain loops
// for the scalar build, SSE/AVX2 in the x86 builds (SPILL_QUANT_X86_UNPACK). Integer results, so
// the implementations agree exactly.
#if defined(SPILL_QUANT_X86_UNPACK)
inline float half(uint16_t h) { return _cvtsh_ss(h); }  // exact, as f16_to_f32
// out[i] = d * float(byte i of v), for 8 unsigned / signed bytes
inline void scaled_u8x8(uint64_t v, float d, float* out) {
  const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(v))));
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_set1_ps(d), f));
}
inline void scaled_i8x8(uint64_t v, float d, float* out) {
  const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(int64_t(v))));
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_set1_ps(d), f));
}
inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void store32(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
// lo[l] = p[l] & 15, hi[l] = p[l] >> 4
inline void nibbles32(const uint8_t* p, int8_t* lo, int8_t* hi) {
  const __m256i v = load32(p), m = _mm256_set1_epi8(0x0F);
  store32(lo, _mm256_and_si256(v, m));
  store32(hi, _mm256_and_si256(_mm256_srli_epi16(v, 4), m));
}
// q[l] = (p[l] >> shift) & 3
inline void bits2_32(const uint8_t* p, int shift, int8_t* q) {
  store32(q, _mm256_and_si256(_mm256_srl_epi16(load32(p), _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(3)));
}
// q[l] += (((p[l] >> shift) & 3) << 4) + offset
inline void add_bits2_x16(const uint8_t* p, int shift, int8_t offset, int8_t* q) {
  __m256i t = _mm256_and_si256(_mm256_srl_epi16(load32(p), _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(3));
  t = _mm256_add_epi8(_mm256_slli_epi16(t, 4), _mm256_set1_epi8(offset));
  store32(q, _mm256_add_epi8(load32(q), t));
}
// q[l] += bit `bit` of p[l] ? if_set : if_clear
inline void add_if_bit32(const uint8_t* p, int bit, int8_t if_set, int8_t if_clear, int8_t* q) {
  const __m256i b = _mm256_set1_epi8(char(1 << bit));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(load32(p), b), b);
  const __m256i add = _mm256_blendv_epi8(_mm256_set1_epi8(if_clear), _mm256_set1_epi8(if_set), set);
  store32(q, _mm256_add_epi8(load32(q), add));
}
// q[l] = table[p[l] & 15], q[l + 16] = table[p[l] >> 4] for 16 bytes p
// q[l] = table[nibble l of p] + (bit l of bits ? if_set : 0), for the 32 quants of a legacy block
// (nibble l: the low nibble of p[l] for l < 16, the high one of p[l - 16]), in registers and
// stored once. The bit of byte l: byte l / 8 of the broadcast word, tested against bit l % 8.
inline void lut_nibbles16_add_bits(const uint8_t* p, const int8_t* table, uint32_t bits, int8_t if_set, int8_t* q) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(0x0F);
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(table));
  const __m256i vals = _mm256_set_m128i(_mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(v, 4), m)),
                                        _mm_shuffle_epi8(t, _mm_and_si128(v, m)));
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i w = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), spread);
  const __m256i mask = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(w, mask), mask);
  store32(q, _mm256_add_epi8(vals, _mm256_and_si256(set, _mm256_set1_epi8(if_set))));
}
inline void lut_nibbles16(const uint8_t* p, const int8_t* table, int8_t* q) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(0x0F);
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(table));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm_shuffle_epi8(t, _mm_and_si128(v, m)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(v, 4), m)));
}
#else
inline float half(uint16_t h) { return f16_to_f32(h); }
inline void scaled_u8x8(uint64_t v, float d, float* out) {
  for (int i = 0; i < 8; ++i) out[i] = d * float(uint8_t(v >> (8 * i)));
}
inline void scaled_i8x8(uint64_t v, float d, float* out) {
  for (int i = 0; i < 8; ++i) out[i] = d * float(int8_t(uint8_t(v >> (8 * i))));
}
inline void nibbles32(const uint8_t* p, int8_t* lo, int8_t* hi) {
  for (int l = 0; l < 32; ++l) lo[l] = int8_t(p[l] & 0xF), hi[l] = int8_t(p[l] >> 4);
}
inline void bits2_32(const uint8_t* p, int shift, int8_t* q) {
  for (int l = 0; l < 32; ++l) q[l] = int8_t((p[l] >> shift) & 3);
}
inline void add_bits2_x16(const uint8_t* p, int shift, int8_t offset, int8_t* q) {
  for (int l = 0; l < 32; ++l) q[l] = int8_t(q[l] + (((p[l] >> shift) & 3) << 4) + offset);
}
inline void add_if_bit32(const uint8_t* p, int bit, int8_t if_set, int8_t if_clear, int8_t* q) {
  for (int l = 0; l < 32; ++l) q[l] = int8_t(q[l] + (((p[l] >> bit) & 1) ? if_set : if_clear));
}
inline void lut_nibbles16(const uint8_t* p, const int8_t* table, int8_t* q) {
  for (int l = 0; l < 16; ++l) q[l] = table[p[l] & 0xF], q[l + 16] = table[p[l] >> 4];
}
inline void lut_nibbles16_add_bits(const uint8_t* p, const int8_t* table, uint32_t bits, int8_t if_set, int8_t* q) {
  lut_nibbles16(p, table, q);
  for (int l = 0; l < 32; ++l) q[l] = int8_t(q[l] + (((bits >> l) & 1) ? if_set : 0));
}
#endif

inline uint64_t join32(uint32_t lo, uint32_t hi) { return uint64_t(lo) | (uint64_t(hi) << 32); }

// The 8 scales and 8 mins of Q4_K/Q5_K as bytes, four at a time (see unpack_scale_min_k4).
inline void scale_min_bytes_k4(const uint8_t* q, uint64_t& scales, uint64_t& mins) {
  uint32_t a, b, c;
  std::memcpy(&a, q, 4);
  std::memcpy(&b, q + 4, 4);
  std::memcpy(&c, q + 8, 4);
  scales = join32(a & 0x3f3f3f3fu, (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4));
  mins = join32(b & 0x3f3f3f3fu, ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4));
}

template <bool kFiveBit, class Block>
inline void unpack_q45_k(const Block& b, Unpacked& u) {
  uint64_t scales, mins;
  scale_min_bytes_k4(b.scales, scales, mins);
  scaled_u8x8(scales, half(b.d), u.d);
  scaled_u8x8(mins, half(b.dmin), u.m);
  // Sub-blocks 2p and 2p+1 are the low and high nibbles of qs[32p:32p+32]; Q5_K's fifth bit of
  // sub-block j is bit j of qh.
  for (int p = 0; p < 4; ++p) {
    int8_t* lo = u.q + 64 * p;
    nibbles32(b.qs + 32 * p, lo, lo + 32);
    if constexpr (kFiveBit) {
      add_if_bit32(b.qh, 2 * p, 16, 0, lo);
      add_if_bit32(b.qh, 2 * p + 1, 16, 0, lo + 32);
    }
  }
}

inline void unpack_q6_k(const BlockQ6_K& b, Unpacked& u) {
  const float d = half(b.d);
  uint64_t s0, s1;
  std::memcpy(&s0, b.scales, 8);
  std::memcpy(&s1, b.scales + 8, 8);
  scaled_i8x8(s0, d, u.d);
  scaled_i8x8(s1, d, u.d + 8);
  // In each half of 128: weights 0-31 and 64-95 are the low and high nibbles of ql[0:32], 32-63
  // and 96-127 those of ql[32:64]; their top 2 bits are bits 0-1, 4-5, 2-3, 6-7 of qh[0:32].
  for (int h = 0; h < 2; ++h) {
    int8_t* q = u.q + 128 * h;
    const uint8_t* qh = b.qh + 32 * h;
    nibbles32(b.ql + 64 * h, q, q + 64);
    nibbles32(b.ql + 64 * h + 32, q + 32, q + 96);
    for (int i = 0; i < 4; ++i) add_bits2_x16(qh, 2 * i, -32, q + 32 * i);
  }
}

inline void unpack_q3_k(const BlockQ3_K& b, Unpacked& u) {
  // The 16 6-bit scales (see unpack_scales_q3), four at a time, then offset by -32.
  uint32_t a, bw, c;
  std::memcpy(&a, b.scales, 4);
  std::memcpy(&bw, b.scales + 4, 4);
  std::memcpy(&c, b.scales + 8, 4);
  const uint32_t lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u;
  // Subtracting 32 from every byte (each byte is 0..63, so no borrow crosses bytes as signed).
  const uint32_t s0 = ((a & lo4) | ((c & lo2) << 4)), s1 = ((bw & lo4) | (((c >> 2) & lo2) << 4));
  const uint32_t s2 = (((a >> 4) & lo4) | (((c >> 4) & lo2) << 4)), s3 = (((bw >> 4) & lo4) | (((c >> 6) & lo2) << 4));
  auto minus32 = [](uint32_t v) { return uint32_t((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u; };
  const float d = half(b.d);
  scaled_i8x8(join32(minus32(s0), minus32(s1)), d, u.d);
  scaled_i8x8(join32(minus32(s2), minus32(s3)), d, u.d + 8);
  // Weights 128*h + 32*plane + l: 2-bit plane `plane` of qs[32*h + l], minus 4 unless bit
  // 4*h + plane of hmask[l] is set.
  for (int h = 0; h < 2; ++h)
    for (int plane = 0; plane < 4; ++plane) {
      int8_t* q = u.q + 128 * h + 32 * plane;
      bits2_32(b.qs + 32 * h, 2 * plane, q);
      add_if_bit32(b.hmask, 4 * h + plane, 0, -4, q);
    }
}

inline void unpack_q2_k(const BlockQ2_K& b, Unpacked& u) {
  const float d = half(b.d), dmin = half(b.dmin);
  for (int h = 0; h < 2; ++h) {
    uint64_t v;
    std::memcpy(&v, b.scales + 8 * h, 8);
    scaled_u8x8(v & 0x0f0f0f0f0f0f0f0full, d, u.d + 8 * h);
    scaled_u8x8((v >> 4) & 0x0f0f0f0f0f0f0f0full, dmin, u.m + 8 * h);
  }
  for (int h = 0; h < 2; ++h)
    for (int plane = 0; plane < 4; ++plane) bits2_32(b.qs + 32 * h, 2 * plane, u.q + 128 * h + 32 * plane);
}

inline void unpack_iq4_xs(const BlockIQ4_XS& b, Unpacked& u) {
  const float d = half(b.d);
  for (int j = 0; j < 8; ++j) {
    u.d[j] = d * float(iq4xs_scale(b, j) - 32);
    lut_nibbles16(b.qs + 16 * j, kIq4nlValues, u.q + 32 * j);
  }
}

// ---- the dot of one row -------------------------------------------------------------
template <class Block, int kSub, bool kMin, class Unpack>
inline float dot_super_blocks(const void* row, const float* x, int64_t n, Unpack unpack) {
  const Block* b = static_cast<const Block*>(row);
  Acc a;
  Unpacked u;
  constexpr int kSubs = kSuperBlock / kSub;
  for (int64_t i = 0; i < n / kSuperBlock; ++i, x += kSuperBlock) {
    unpack(b[i], u);
    for (int k = 0; k < kSubs; k += 2) {
      accumulate<kSub, kMin, 0>(a, u.q + kSub * k, x + kSub * k, u.d[k], u.m[k]);
      accumulate<kSub, kMin, 1>(a, u.q + kSub * (k + 1), x + kSub * (k + 1), u.d[k + 1], u.m[k + 1]);
    }
  }
  return finish<kMin>(a);
}

// The same for several tokens: each super-block is unpacked once per group of tokens, and each
// token's accumulators see exactly the operations dot_super_blocks gives them.
template <class Block, int kSub, bool kMin, class Unpack>
inline void dot_super_blocks_tokens(const void* row, const float* x, int64_t x_stride, int64_t tokens, int64_t n,
                                    float* out, int64_t out_stride, Unpack unpack) {
  const Block* b = static_cast<const Block*>(row);
  constexpr int kGroup = 4;
  constexpr int kSubs = kSuperBlock / kSub;
  Unpacked u;
  for (int64_t t0 = 0; t0 < tokens; t0 += kGroup) {
    const int group = int(std::min<int64_t>(kGroup, tokens - t0));
    Acc a[kGroup];
    for (int64_t i = 0; i < n / kSuperBlock; ++i) {
      unpack(b[i], u);
      for (int g = 0; g < group; ++g) {
        const float* xg = x + (t0 + g) * x_stride + i * kSuperBlock;
        for (int k = 0; k < kSubs; k += 2) {
          accumulate<kSub, kMin, 0>(a[g], u.q + kSub * k, xg + kSub * k, u.d[k], u.m[k]);
          accumulate<kSub, kMin, 1>(a[g], u.q + kSub * (k + 1), xg + kSub * (k + 1), u.d[k + 1], u.m[k + 1]);
        }
      }
    }
    for (int g = 0; g < group; ++g) out[(t0 + g) * out_stride] = finish<kMin>(a[g]);
  }
}

inline float dot_q8_0(const void* row, const float* x, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(row);
  Acc a;
  const int64_t nb = n / 32;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    accumulate<32, false, 0>(a, b[i].qs, x + 32 * i, half(b[i].d), 0.0f);
    accumulate<32, false, 1>(a, b[i + 1].qs, x + 32 * (i + 1), half(b[i + 1].d), 0.0f);
  }
  if (i < nb) accumulate<32, false, 0>(a, b[i].qs, x + 32 * i, half(b[i].d), 0.0f);
  return finish<false>(a);
}

inline float dot_mxfp4(const void* row, const float* x, int64_t n) {
  const BlockMXFP4* b = static_cast<const BlockMXFP4*>(row);
  Acc a;
  alignas(32) int8_t q[64];
  const int64_t nb = n / 32;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    lut_nibbles16(b[i].qs, kFp4Values, q);
    lut_nibbles16(b[i + 1].qs, kFp4Values, q + 32);
    accumulate<32, false, 0>(a, q, x + 32 * i, e8m0_half_to_f32(b[i].e), 0.0f);
    accumulate<32, false, 1>(a, q + 32, x + 32 * (i + 1), e8m0_half_to_f32(b[i + 1].e), 0.0f);
  }
  if (i < nb) {
    lut_nibbles16(b[i].qs, kFp4Values, q);
    accumulate<32, false, 0>(a, q, x + 32 * i, e8m0_half_to_f32(b[i].e), 0.0f);
  }
  return finish<false>(a);
}

// ---- the legacy 32-weight formats ------------------------------------------------------
// A block's 32 quants as signed values (the offset taken off, or the IQ4_NL level) and its scale
// and min term (the dequantized weight is d * q - m).
inline constexpr int8_t kNibbleMinus8[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
inline constexpr int8_t kNibbleMinus16[16] = {-16, -15, -14, -13, -12, -11, -10, -9,
                                              -8,  -7,  -6,  -5,  -4,  -3,  -2,  -1};
inline constexpr int8_t kNibble[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

inline void unpack_legacy(const BlockQ4_0& b, int8_t* q, float& d, float&) {
  lut_nibbles16(b.qs, kNibbleMinus8, q);
  d = half(b.d);
}
inline void unpack_legacy(const BlockQ4_1& b, int8_t* q, float& d, float& m) {
  lut_nibbles16(b.qs, kNibble, q);
  d = half(b.d);
  m = -half(b.m);
}
inline void unpack_legacy(const BlockQ5_0& b, int8_t* q, float& d, float&) {
  lut_nibbles16_add_bits(b.qs, kNibbleMinus16, q5_high_bits(b.qh), 16, q);
  d = half(b.d);
}
inline void unpack_legacy(const BlockQ5_1& b, int8_t* q, float& d, float& m) {
  lut_nibbles16_add_bits(b.qs, kNibble, q5_high_bits(b.qh), 16, q);
  d = half(b.d);
  m = -half(b.m);
}
inline void unpack_legacy(const BlockIQ4_NL& b, int8_t* q, float& d, float&) {
  lut_nibbles16(b.qs, kIq4nlValues, q);
  d = half(b.d);
}

template <class Block, bool kMin>
inline float dot_legacy(const void* row, const float* x, int64_t n) {
  const Block* b = static_cast<const Block*>(row);
  Acc a;
  alignas(32) int8_t q[64];
  float d0 = 0, m0 = 0, d1 = 0, m1 = 0;
  const int64_t nb = n / 32;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    unpack_legacy(b[i], q, d0, m0);
    unpack_legacy(b[i + 1], q + 32, d1, m1);
    accumulate<32, kMin, 0>(a, q, x + 32 * i, d0, m0);
    accumulate<32, kMin, 1>(a, q + 32, x + 32 * (i + 1), d1, m1);
  }
  if (i < nb) {
    unpack_legacy(b[i], q, d0, m0);
    accumulate<32, kMin, 0>(a, q, x + 32 * i, d0, m0);
  }
  return finish<kMin>(a);
}

inline float dot_any(DType t, const void* row, const float* x, int64_t n) {
  switch (t) {
    case DType::F32: {
      const float* w = static_cast<const float*>(row);
      return dot_floats(x, n, [w](int64_t i) { return V::load(w + i); }, [w](int64_t i) { return w[i]; });
    }
    case DType::F16: {
      const uint16_t* w = static_cast<const uint16_t*>(row);
      return dot_floats(x, n, [w](int64_t i) { return V::load_f16(w + i); },
                        [w](int64_t i) { return f16_to_f32(w[i]); });
    }
    case DType::BF16: {
      const uint16_t* w = static_cast<const uint16_t*>(row);
      return dot_floats(x, n, [w](int64_t i) { return V::load_bf16(w + i); },
                        [w](int64_t i) { return bf16_to_f32(w[i]); });
    }
    case DType::Q8_0: return dot_q8_0(row, x, n);
    case DType::Q6_K: return dot_super_blocks<BlockQ6_K, 16, false>(row, x, n, [](const BlockQ6_K& b, Unpacked& u) { unpack_q6_k(b, u); });
    case DType::Q5_K: return dot_super_blocks<BlockQ5_K, 32, true>(row, x, n, [](const BlockQ5_K& b, Unpacked& u) { unpack_q45_k<true>(b, u); });
    case DType::Q4_K: return dot_super_blocks<BlockQ4_K, 32, true>(row, x, n, [](const BlockQ4_K& b, Unpacked& u) { unpack_q45_k<false>(b, u); });
    case DType::Q3_K: return dot_super_blocks<BlockQ3_K, 16, false>(row, x, n, [](const BlockQ3_K& b, Unpacked& u) { unpack_q3_k(b, u); });
    case DType::Q2_K: return dot_super_blocks<BlockQ2_K, 16, true>(row, x, n, [](const BlockQ2_K& b, Unpacked& u) { unpack_q2_k(b, u); });
    case DType::IQ4_XS: return dot_super_blocks<BlockIQ4_XS, 32, false>(row, x, n, [](const BlockIQ4_XS& b, Unpacked& u) { unpack_iq4_xs(b, u); });
    case DType::MXFP4: return dot_mxfp4(row, x, n);
    case DType::Q4_0: return dot_legacy<BlockQ4_0, false>(row, x, n);
    case DType::Q4_1: return dot_legacy<BlockQ4_1, true>(row, x, n);
    case DType::Q5_0: return dot_legacy<BlockQ5_0, false>(row, x, n);
    case DType::Q5_1: return dot_legacy<BlockQ5_1, true>(row, x, n);
    case DType::IQ4_NL: return dot_legacy<BlockIQ4_NL, false>(row, x, n);
  }
  return 0.0f;
}

inline void dot_tokens_any(DType t, const void* row, const float* x, int64_t x_stride, int64_t tokens, int64_t n,
                           float* out, int64_t out_stride) {
  if (tokens == 1) {  // the single-token kernel keeps its accumulators in registers
    out[0] = dot_any(t, row, x, n);
    return;
  }
  switch (t) {
    case DType::Q6_K:
      return dot_super_blocks_tokens<BlockQ6_K, 16, false>(row, x, x_stride, tokens, n, out, out_stride,
                                                           [](const BlockQ6_K& b, Unpacked& u) { unpack_q6_k(b, u); });
    case DType::Q5_K:
      return dot_super_blocks_tokens<BlockQ5_K, 32, true>(
          row, x, x_stride, tokens, n, out, out_stride, [](const BlockQ5_K& b, Unpacked& u) { unpack_q45_k<true>(b, u); });
    case DType::Q4_K:
      return dot_super_blocks_tokens<BlockQ4_K, 32, true>(
          row, x, x_stride, tokens, n, out, out_stride, [](const BlockQ4_K& b, Unpacked& u) { unpack_q45_k<false>(b, u); });
    case DType::Q3_K:
      return dot_super_blocks_tokens<BlockQ3_K, 16, false>(row, x, x_stride, tokens, n, out, out_stride,
                                                           [](const BlockQ3_K& b, Unpacked& u) { unpack_q3_k(b, u); });
    case DType::Q2_K:
      return dot_super_blocks_tokens<BlockQ2_K, 16, true>(row, x, x_stride, tokens, n, out, out_stride,
                                                          [](const BlockQ2_K& b, Unpacked& u) { unpack_q2_k(b, u); });
    case DType::IQ4_XS:
      return dot_super_blocks_tokens<BlockIQ4_XS, 32, false>(
          row, x, x_stride, tokens, n, out, out_stride, [](const BlockIQ4_XS& b, Unpacked& u) { unpack_iq4_xs(b, u); });
    default:  // nothing to share between tokens
      for (int64_t i = 0; i < tokens; ++i) out[i * out_stride] = dot_any(t, row, x + i * x_stride, n);
  }
}

}  // namespace
