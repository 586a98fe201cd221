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

template <int kSub, bool kMin>
inline void accumulate(Acc& a, int parity, const int8_t* q, const float* x, float d, float m) {
  V p = V::mul(V::from_i8(q), V::load(x));
  if constexpr (kSub == 32) p = V::fma(V::from_i8(q + 16), V::load(x + 16), p);
  a.s[parity] = V::fma(V::set1(d), p, a.s[parity]);
  if constexpr (kMin) {
    V xs = V::load(x);
    if constexpr (kSub == 32) xs = V::add(xs, V::load(x + 16));
    a.m[parity] = V::fma(V::set1(m), xs, a.m[parity]);
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

template <bool kFiveBit, class Block>
inline void unpack_q45_k(const Block& b, Unpacked& u) {
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, b.scales, sc, m);
    u.d[j] = d * float(sc);
    u.m[j] = dmin * float(m);
  }
  for (int p = 0; p < 4; ++p) {
    const uint8_t* qs = b.qs + 32 * p;
    int8_t* lo = u.q + 64 * p;
    int8_t* hi = lo + 32;
    for (int l = 0; l < 32; ++l) {
      lo[l] = int8_t(qs[l] & 0xF);
      hi[l] = int8_t(qs[l] >> 4);
    }
    if constexpr (kFiveBit) {
      for (int l = 0; l < 32; ++l) {
        lo[l] = int8_t(lo[l] | (((b.qh[l] >> (2 * p)) & 1) << 4));
        hi[l] = int8_t(hi[l] | (((b.qh[l] >> (2 * p + 1)) & 1) << 4));
      }
    }
  }
}

inline void unpack_q6_k(const BlockQ6_K& b, Unpacked& u) {
  const float d = f16_to_f32(b.d);
  for (int k = 0; k < 16; ++k) u.d[k] = d * float(b.scales[k]);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    int8_t* q = u.q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      q[l] = int8_t(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
      q[l + 32] = int8_t(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      q[l + 64] = int8_t(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      q[l + 96] = int8_t(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

inline void unpack_q3_k(const BlockQ3_K& b, Unpacked& u) {
  const float d = f16_to_f32(b.d);
  uint8_t scales[16];
  unpack_scales_q3(b.scales, scales);
  for (int k = 0; k < 16; ++k) u.d[k] = d * float(int(scales[k]) - 32);
  // Weights 128*h + 32*plane + l: 2-bit plane `plane` of qs[32*h + l], high bit 4*h + plane of hmask[l].
  for (int h = 0; h < 2; ++h)
    for (int plane = 0; plane < 4; ++plane) {
      int8_t* q = u.q + 128 * h + 32 * plane;
      const uint8_t* qs = b.qs + 32 * h;
      const int hbit = 4 * h + plane;
      for (int l = 0; l < 32; ++l)
        q[l] = int8_t(((qs[l] >> (2 * plane)) & 3) - (((b.hmask[l] >> hbit) & 1) ? 0 : 4));
    }
}

inline void unpack_q2_k(const BlockQ2_K& b, Unpacked& u) {
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  for (int k = 0; k < 16; ++k) {
    u.d[k] = d * float(b.scales[k] & 0xF);
    u.m[k] = dmin * float(b.scales[k] >> 4);
  }
  for (int h = 0; h < 2; ++h)
    for (int plane = 0; plane < 4; ++plane) {
      int8_t* q = u.q + 128 * h + 32 * plane;
      const uint8_t* qs = b.qs + 32 * h;
      for (int l = 0; l < 32; ++l) q[l] = int8_t((qs[l] >> (2 * plane)) & 3);
    }
}

inline void unpack_lut_nibbles(const uint8_t* packed16, const int8_t* table, int8_t* q32) {
  for (int l = 0; l < 16; ++l) {
    q32[l] = table[packed16[l] & 0xF];
    q32[l + 16] = table[packed16[l] >> 4];
  }
}

inline void unpack_iq4_xs(const BlockIQ4_XS& b, Unpacked& u) {
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < 8; ++j) {
    u.d[j] = d * float(iq4xs_scale(b, j) - 32);
    unpack_lut_nibbles(b.qs + 16 * j, kIq4nlValues, u.q + 32 * j);
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
    for (int k = 0; k < kSubs; ++k) accumulate<kSub, kMin>(a, k & 1, u.q + kSub * k, x + kSub * k, u.d[k], u.m[k]);
  }
  return finish<kMin>(a);
}

inline float dot_q8_0(const void* row, const float* x, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(row);
  Acc a;
  for (int64_t i = 0; i < n / 32; ++i)
    accumulate<32, false>(a, int(i & 1), b[i].qs, x + 32 * i, f16_to_f32(b[i].d), 0.0f);
  return finish<false>(a);
}

inline float dot_mxfp4(const void* row, const float* x, int64_t n) {
  const BlockMXFP4* b = static_cast<const BlockMXFP4*>(row);
  Acc a;
  alignas(32) int8_t q[32];
  for (int64_t i = 0; i < n / 32; ++i) {
    unpack_lut_nibbles(b[i].qs, kFp4Values, q);
    accumulate<32, false>(a, int(i & 1), q, x + 32 * i, e8m0_half_to_f32(b[i].e), 0.0f);
  }
  return finish<false>(a);
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
    case DType::Q6_K: return dot_super_blocks<BlockQ6_K, 16, false>(row, x, n, unpack_q6_k);
    case DType::Q5_K: return dot_super_blocks<BlockQ5_K, 32, true>(row, x, n, unpack_q45_k<true, BlockQ5_K>);
    case DType::Q4_K: return dot_super_blocks<BlockQ4_K, 32, true>(row, x, n, unpack_q45_k<false, BlockQ4_K>);
    case DType::Q3_K: return dot_super_blocks<BlockQ3_K, 16, false>(row, x, n, unpack_q3_k);
    case DType::Q2_K: return dot_super_blocks<BlockQ2_K, 16, true>(row, x, n, unpack_q2_k);
    case DType::IQ4_XS: return dot_super_blocks<BlockIQ4_XS, 32, false>(row, x, n, unpack_iq4_xs);
    case DType::MXFP4: return dot_mxfp4(row, x, n);
  }
  return 0.0f;
}

}  // namespace
