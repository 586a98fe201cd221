// The decode core shared by the quantized GEMV (gemv.cu) and the MoE expert kernels (moe.cu):
// activations rounded to int8 once per kernel call, per-format decoders of 32-weight units straight
// from the ggml block bytes into int8 lanes, and the warp routine that stages a few weight rows in
// shared memory with coalesced 16-byte copies and dots them with up to 8 tokens using __dp4a.
//
// CPU twin: quant::quantize_activations_q8 + quant::dot_q8 (src/quant/quant.h). The rounding of the
// activations is the CPU's, bit for bit: per block of 256 (the last block of a row whose length is
// not a multiple of 256 is shorter), d = max|x| / 127 and q = rint(x * (127 / max|x|)) clamped to
// [-127, 127], all single IEEE operations; quantize_activations_q8() below exposes the device
// routine so the tests compare the bytes.
//
// Arithmetic, fixed so that a row's result never depends on the batch:
//  * a unit is 32 (or 64) weights of one block; its integer sum S = sum_g sc_g sum_i q_i x_i (and,
//    for the formats with mins, M = sum_g m_g sum_i x_i) is exact in int32;
//  * formats whose block is one activation block (the K-quants: 256 weights, one d and dmin):
//    the units' S and M are added per block, exactly, and the block's value is
//    f = d * S - dmin * M (S, M converted to float; two to four roundings);
//  * Q8_0 (blocks of 32, a scale each): each unit's value is f = d * S, and the 8 units of an
//    activation block are added in K order, f = f_0 + f_1 + ...;
//  * per (row, token) the activation blocks' values go into one chain in K order,
//    acc = fma(dx, f, acc) (dx the activation block's scale). The lanes of a warp decode the units
//    of one pass (32 consecutive units, whole activation blocks) in parallel and hand their sums
//    through shared memory to the lane that owns the (row, token). Integer sums are exact in any
//    order, and K order is also the order of a tensor-core tile loop (mmq.cuh), so the prefill
//    kernels give a token the same bits.
// Each token of a group has its own chains and the same operations whatever the group's size
// or the other tokens, so a token's result is bit-identical alone or in any batch. Every float
// operation is an explicit _rn intrinsic so the compiler cannot contract differently in different
// instantiations.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/dtype.h"

namespace spill::cuda {

constexpr int kRowsPerWarp = 4;     // rows a warp dots at once: the activations are loaded once for all four
constexpr int kActBlock = 256;      // activations per int8 scale (quant::quantize_activations_q8's block)
constexpr int kMaxTokenGroup = 8;   // tokens one pass over the staged weights serves

// ---- small device helpers ---------------------------------------------------------------------

__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// A 32-bit word from shared memory at any 2-byte-aligned address (block formats of 34, 110 and 210
// bytes leave rows only 2-byte aligned).
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  return __funnelshift_r(w[0], w[1], unsigned(a & 3) * 8u);
}
// Two consecutive words at a 2-byte-aligned address.
__device__ __forceinline__ void ld_u64_a2(const uint8_t* p, uint32_t& lo, uint32_t& hi) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  const unsigned s = unsigned(a & 3) * 8u;
  const uint32_t w0 = w[0], w1 = w[1], w2 = w[2];
  lo = __funnelshift_r(w0, w1, s);
  hi = __funnelshift_r(w1, w2, s);
}
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// Four int8 lanes of a and b multiplied and added to c, exactly.
__device__ __forceinline__ int32_t dot4(uint32_t a, uint32_t b, int32_t c) { return __dp4a(int(a), int(b), c); }

// ---- per-format unit decoders -----------------------------------------------------------------
// A unit is 32 weights of one block that one lane decodes: four groups of 8 weights, each group's
// weights at 8 consecutive activations starting at x_offset(slot, g) within the block. load() reads
// the unit's bytes and scales once (from shared memory) and leaves the weights as int8 lanes
// w[2g], w[2g+1]; dot(x) is S for the activations' matching words x[8]; min_dot(s8) is M from the
// groups' activation sums (formats with kHasMin). d and dmin are the block's float scales.

template <DType T>
struct Unit;

template <>
struct Unit<DType::Q8_0> {
  static constexpr int kXWords = 8, kSumWords = 4;
  static constexpr bool kOwnLoads = false;
  static constexpr int kUnitsPerBlock = 1, kBlockElems = 32, kBlockBytes = 34;
  static constexpr bool kHasMin = false;
  uint32_t w[8];
  float d, dmin;
  __device__ __forceinline__ void load(const uint8_t* b, int) {
    d = f16_bits_to_f32(ld_u16(b));
    dmin = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i += 2) ld_u64_a2(b + 2 + 4 * i, w[i], w[i + 1]);
  }
  __device__ static __forceinline__ int x_offset(int, int g) { return 8 * g; }
  __device__ __forceinline__ int32_t dot(const uint32_t x[8]) const {
    int32_t s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = dot4(w[i], x[i], s);
    return s;
  }
  __device__ __forceinline__ int32_t min_dot(const int32_t*) const { return 0; }
};

// Q4_K and Q5_K: unit s of 4 is sub-block pair s: qs bytes 32s .. 32s+31, whose low nibbles are
// sub-block 2s (activations 64s .. 64s+31) and high nibbles sub-block 2s+1 (64s+32 .. 64s+63), so
// one lane decodes the pair's scales once for 64 weights. w[0..7] are the low nibbles, w[8..15]
// the high ones; the activations come as four 16-byte words and the min term's sums as the eight
// sums of 8 of the pair (one 16-byte word).
template <bool kFiveBit>
struct UnitQ45K {
  static constexpr int kUnitsPerBlock = 4, kBlockElems = 256;
  static constexpr int kBlockBytes = kFiveBit ? 176 : 144;
  static constexpr int kQsOffset = kFiveBit ? 48 : 16;
  static constexpr bool kHasMin = true;
  static constexpr int kXWords = 16, kSumWords = 4;
  static constexpr bool kOwnLoads = true;
  uint32_t w[16];
  uint32_t mn_pack[2];  // (min, min) of each sub-block as an int8 pair, for dp2a
  int32_t sc[2];
  float d, dmin;
  __device__ static __forceinline__ void block_scales(const uint8_t* b, float& d, float& dmin) {
    const uint32_t head = *reinterpret_cast<const uint32_t*>(b);
    d = f16_bits_to_f32(uint16_t(head & 0xFFFF));
    dmin = f16_bits_to_f32(uint16_t(head >> 16));
  }
  __device__ __forceinline__ void load(const uint8_t* b, int s) {
    const uint4 h16 = *reinterpret_cast<const uint4*>(b);  // d, dmin, then the 12 scale bytes
    const uint32_t head = h16.x, a = h16.y, bb = h16.z, c = h16.w;
    const uint4 q0 = *reinterpret_cast<const uint4*>(b + kQsOffset + 32 * s);
    const uint4 q1 = *reinterpret_cast<const uint4*>(b + kQsOffset + 32 * s + 16);
    const uint32_t qs[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    uint32_t qh[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if constexpr (kFiveBit) {
      const uint4 h0 = *reinterpret_cast<const uint4*>(b + 16);
      const uint4 h1 = *reinterpret_cast<const uint4*>(b + 32);
      qh[0] = h0.x, qh[1] = h0.y, qh[2] = h0.z, qh[3] = h0.w, qh[4] = h1.x, qh[5] = h1.y, qh[6] = h1.z, qh[7] = h1.w;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      w[i] = qs[i] & 0x0F0F0F0Fu;
      w[8 + i] = (qs[i] >> 4) & 0x0F0F0F0Fu;
      if constexpr (kFiveBit) {
        w[i] |= ((qh[i] >> (2 * s)) & 0x01010101u) << 4;
        w[8 + i] |= ((qh[i] >> (2 * s + 1)) & 0x01010101u) << 4;
      }
    }
    d = f16_bits_to_f32(uint16_t(head & 0xFFFF));
    dmin = f16_bits_to_f32(uint16_t(head >> 16));
    // The eight 6-bit scales and mins as bytes of two words each (sub-blocks 0-3, 4-7); this
    // unit's pair (2s, 2s+1) is one half of one of them.
    const uint32_t sc_word = s < 2 ? (a & 0x3F3F3F3Fu) : ((c & 0x0F0F0F0Fu) | (((a >> 6) & 0x03030303u) << 4));
    const uint32_t mn_word = s < 2 ? (bb & 0x3F3F3F3Fu) : (((c >> 4) & 0x0F0F0F0Fu) | (((bb >> 6) & 0x03030303u) << 4));
    const int shift = 16 * (s & 1);
    sc[0] = int32_t((sc_word >> shift) & 0xFF);
    sc[1] = int32_t((sc_word >> (shift + 8)) & 0xFF);
    const uint32_t m0 = (mn_word >> shift) & 0xFF, m1 = (mn_word >> (shift + 8)) & 0xFF;
    mn_pack[0] = m0 * 0x0101u;
    mn_pack[1] = m1 * 0x0101u;
  }
  __device__ static __forceinline__ int x_offset(int s, int g) { return 64 * s + 8 * g; }
  __device__ static __forceinline__ void load_x(const int8_t* xb, int s, uint32_t (&x)[16]) {
    const uint4* p = reinterpret_cast<const uint4*>(xb + 64 * s);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = p[i];
      x[4 * i] = v.x, x[4 * i + 1] = v.y, x[4 * i + 2] = v.z, x[4 * i + 3] = v.w;
    }
  }
  // The pair's eight sums of 8 as int16 pairs in four words (low sub-block: words 0, 1).
  __device__ static __forceinline__ void load_sums(const int16_t* sb, int s, int32_t (&s8)[4]) {
    const uint4 v = *reinterpret_cast<const uint4*>(sb + 8 * s);
    s8[0] = int32_t(v.x), s8[1] = int32_t(v.y), s8[2] = int32_t(v.z), s8[3] = int32_t(v.w);
  }
  __device__ __forceinline__ int32_t dot(const uint32_t (&x)[16]) const {
    int32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      lo = dot4(w[i], x[i], lo);
      hi = dot4(w[8 + i], x[8 + i], hi);
    }
    return sc[0] * lo + sc[1] * hi;
  }
  __device__ __forceinline__ int32_t min_dot(const int32_t (&s8)[4]) const {
    // dp2a: two int16 sums times two int8 copies of the min, exactly.
    int32_t m = __dp2a_lo(s8[0], int(mn_pack[0]), 0);
    m = __dp2a_lo(s8[1], int(mn_pack[0]), m);
    m = __dp2a_lo(s8[2], int(mn_pack[1]), m);
    return __dp2a_lo(s8[3], int(mn_pack[1]), m);
  }
};
template <>
struct Unit<DType::Q4_K> : UnitQ45K<false> {};
template <>
struct Unit<DType::Q5_K> : UnitQ45K<true> {};

// Q6_K: unit s covers half h = s/4 (128 weights), positions l0 .. l0+7 (l0 = 8 (s%4)) of each of
// its four 32-weight quarters: ql[64h + l0], ql[64h + 32 + l0], qh[32h + l0], 8 bytes each. The
// stored offset of 32 is taken off each lane (q - 32 fits int8).
template <>
struct Unit<DType::Q6_K> {
  static constexpr int kXWords = 8, kSumWords = 4;
  static constexpr bool kOwnLoads = false;
  static constexpr int kUnitsPerBlock = 8, kBlockElems = 256, kBlockBytes = 210;
  static constexpr bool kHasMin = false;
  uint32_t w[8];
  int32_t sc[4];
  float d, dmin;
  __device__ static __forceinline__ void block_scales(const uint8_t* b, float& d, float& dmin) {
    d = f16_bits_to_f32(ld_u16(b + 208));
    dmin = 0.0f;
  }
  __device__ __forceinline__ void load(const uint8_t* b, int s) {
    const int h = s >> 2, l0 = 8 * (s & 3), is = l0 >> 4;
    uint32_t qa[2], qb[2], qh[2];
    ld_u64_a2(b + 64 * h + l0, qa[0], qa[1]);
    ld_u64_a2(b + 64 * h + 32 + l0, qb[0], qb[1]);
    ld_u64_a2(b + 128 + 32 * h + l0, qh[0], qh[1]);
    d = f16_bits_to_f32(ld_u16(b + 208));
    dmin = 0.0f;
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192 + 8 * h + is);
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      sc[g] = scales[2 * g];
      const int nib_shift = 4 * (g >> 1), hi_shift = 2 * g;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t low = (g & 1) ? qb[i] : qa[i];
        // q - 32 per byte: flipping bit 5 gives q - 32 in 6-bit two's complement; bit 5 then
        // extends into bits 6 and 7 (0x20 * 6 = 0xC0, no carry out of the byte).
        const uint32_t q = ((low >> nib_shift) & 0x0F0F0F0Fu) | (((qh[i] >> hi_shift) & 0x03030303u) << 4);
        const uint32_t t = q ^ 0x20202020u;
        w[2 * g + i] = t | ((t & 0x20202020u) * 6u);
      }
    }
  }
  __device__ static __forceinline__ int x_offset(int s, int g) { return 128 * (s >> 2) + 32 * g + 8 * (s & 3); }
  __device__ __forceinline__ int32_t dot(const uint32_t x[8]) const {
    int32_t s = 0;
#pragma unroll
    for (int g = 0; g < 4; ++g) s += sc[g] * dot4(w[2 * g + 1], x[2 * g + 1], dot4(w[2 * g], x[2 * g], 0));
    return s;
  }
  __device__ __forceinline__ int32_t min_dot(const int32_t*) const { return 0; }
};

// Q3_K and Q2_K share the 2-bit plane layout: byte L (0..31) of qs half H holds weights
// 128H + 32j + L in bit pair j. Unit s: H = s/4, bytes L0 .. L0+7 (L0 = 8 (s%4)); group j is
// sub-block 8H + 2j + L0/16.
template <>
struct Unit<DType::Q3_K> {
  // Unit s of 4: half H = s/2 of the block, bytes L0 .. L0+15 (L0 = 16 (s%2)) of its qs and of
  // hmask: four groups of 16 weights (128H + 32j + L0 ..), one scale each, 64 weights per lane.
  static constexpr int kUnitsPerBlock = 4, kBlockElems = 256, kBlockBytes = 110;
  static constexpr bool kHasMin = false;
  static constexpr int kXWords = 16, kSumWords = 4;
  static constexpr bool kOwnLoads = true;
  uint32_t w[16];
  int32_t sc[4];
  float d, dmin;
  __device__ static __forceinline__ void block_scales(const uint8_t* b, float& d, float& dmin) {
    d = f16_bits_to_f32(ld_u16(b + 108));
    dmin = 0.0f;
  }
  __device__ __forceinline__ void load(const uint8_t* b, int s) {
    const int H = s >> 1, L0 = 16 * (s & 1);
    uint32_t qs[4], hm[4], s01, s23;
    ld_u64_a2(b + 32 + 32 * H + L0, qs[0], qs[1]);
    ld_u64_a2(b + 32 + 32 * H + L0 + 8, qs[2], qs[3]);
    ld_u64_a2(b + L0, hm[0], hm[1]);
    ld_u64_a2(b + L0 + 8, hm[2], hm[3]);
    ld_u64_a2(b + 96, s01, s23);
    const uint32_t s45 = ld_u32_a2(b + 104);
    d = f16_bits_to_f32(ld_u16(b + 108));
    dmin = 0.0f;
    // Scale k (0..15) = low nibble (k < 8: byte k's low half, else byte k-8's high half) | two high
    // bits (byte 8 + k%4, bit pair k/4), minus 32. This unit's groups j = 0..3 take k = k0 + 2j
    // (k0 = 8H + s%2): bytes s%2 and s%2 + 2 of the scale words for k = 8H .. 8H+3 (wa) and
    // 8H+4 .. 8H+7 (wb), built four at a time.
    const int sh = 4 * H;
    const uint32_t wa = ((s01 >> sh) & 0x0F0F0F0Fu) | (((s45 >> sh) & 0x03030303u) << 4);
    const uint32_t wb = ((s23 >> sh) & 0x0F0F0F0Fu) | (((s45 >> (sh + 2)) & 0x03030303u) << 4);
    const int b0 = 8 * (s & 1);
    sc[0] = int32_t((wa >> b0) & 0xFF) - 32;
    sc[1] = int32_t((wa >> (b0 + 16)) & 0xFF) - 32;
    sc[2] = int32_t((wb >> b0) & 0xFF) - 32;
    sc[3] = int32_t((wb >> (b0 + 16)) & 0xFF) - 32;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // Weight = low two bits - 4 when the hmask bit is clear: 0xFC (-4) or'ed in per byte.
        const uint32_t clear = (~(hm[i] >> (4 * H + j))) & 0x01010101u;
        w[4 * j + i] = ((qs[i] >> (2 * j)) & 0x03030303u) | (clear * 0xFCu);
      }
    }
  }
  __device__ static __forceinline__ int x_offset(int s, int g) {  // g = 0..7: 8 weights each
    return 128 * (s >> 1) + 32 * (g >> 1) + 16 * (s & 1) + 8 * (g & 1);
  }
  __device__ static __forceinline__ void load_x(const int8_t* xb, int s, uint32_t (&x)[16]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint4 v = *reinterpret_cast<const uint4*>(xb + 128 * (s >> 1) + 32 * j + 16 * (s & 1));
      x[4 * j] = v.x, x[4 * j + 1] = v.y, x[4 * j + 2] = v.z, x[4 * j + 3] = v.w;
    }
  }
  __device__ static __forceinline__ void load_sums(const int16_t*, int, int32_t (&)[4]) {}
  __device__ __forceinline__ int32_t dot(const uint32_t (&x)[16]) const {
    int32_t s = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int32_t g = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) g = dot4(w[4 * j + i], x[4 * j + i], g);
      s += sc[j] * g;
    }
    return s;
  }
  __device__ __forceinline__ int32_t min_dot(const int32_t*) const { return 0; }
};

template <>
struct Unit<DType::Q2_K> {
  static constexpr int kXWords = 8, kSumWords = 4;
  static constexpr bool kOwnLoads = false;
  static constexpr int kUnitsPerBlock = 8, kBlockElems = 256, kBlockBytes = 84;
  static constexpr bool kHasMin = true;
  uint32_t w[8];
  int32_t sc[4], mn[4];
  float d, dmin;
  __device__ static __forceinline__ void block_scales(const uint8_t* b, float& d, float& dmin) {
    d = f16_bits_to_f32(ld_u16(b + 80));
    dmin = f16_bits_to_f32(ld_u16(b + 82));
  }
  __device__ __forceinline__ void load(const uint8_t* b, int s) {
    const int H = s >> 2, L0 = 8 * (s & 3);
    uint32_t qs[2];
    ld_u64_a2(b + 16 + 32 * H + L0, qs[0], qs[1]);
    d = f16_bits_to_f32(ld_u16(b + 80));
    dmin = f16_bits_to_f32(ld_u16(b + 82));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t scale = b[8 * H + 2 * j + (L0 >> 4)];
      sc[j] = int32_t(scale & 0xF);
      mn[j] = int32_t(scale >> 4);
#pragma unroll
      for (int i = 0; i < 2; ++i) w[2 * j + i] = (qs[i] >> (2 * j)) & 0x03030303u;
    }
  }
  __device__ static __forceinline__ int x_offset(int s, int g) { return 128 * (s >> 2) + 32 * g + 8 * (s & 3); }
  __device__ __forceinline__ int32_t dot(const uint32_t x[8]) const {
    int32_t s = 0;
#pragma unroll
    for (int g = 0; g < 4; ++g) s += sc[g] * dot4(w[2 * g + 1], x[2 * g + 1], dot4(w[2 * g], x[2 * g], 0));
    return s;
  }
  __device__ __forceinline__ int32_t min_dot(const int32_t s8[4]) const {
    return mn[0] * s8[0] + mn[1] * s8[1] + mn[2] * s8[2] + mn[3] * s8[3];
  }
};

// ---- activations, rounded to int8 -------------------------------------------------------------

template <class XT>
__device__ __forceinline__ void load_x8(const XT* p, float x[8]);
template <>
__device__ __forceinline__ void load_x8<float>(const float* p, float x[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
template <>
__device__ __forceinline__ void load_x8<__nv_bfloat16>(const __nv_bfloat16* p, float x[8]) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __uint_as_float(w[i] << 16);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}
// The same, from memory another kernel of this stream wrote (not through the read-only path).
__device__ __forceinline__ void load_x8_coherent(const float* p, float x[8]) {
  const float4 a = __ldcg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldcg(reinterpret_cast<const float4*>(p) + 1);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

// A group of tokens' activations over one K-range, rounded to int8, in shared memory:
// q[t * q_stride + i], the sum of each 8 consecutive q (for the formats' min terms), and one scale
// per block of 256 (from the K-range's start, which is a multiple of 256 in the row).
struct ActQ8 {
  int8_t* q;
  int16_t* s8;
  float* d;
  int q_stride, s8_stride, d_stride;
};

// Shared bytes ActQ8 takes for `tokens` tokens of k_len activations (k_len a multiple of 32).
__host__ __device__ constexpr int act_q8_q_stride(int k_len) { return (k_len + 15) / 16 * 16; }
__host__ __device__ constexpr int act_q8_s8_stride(int k_len) { return (k_len / 8 + 7) / 8 * 8; }
__host__ __device__ constexpr int act_q8_d_stride(int k_len) { return (k_len + kActBlock - 1) / kActBlock; }
__host__ __device__ constexpr int act_q8_bytes(int tokens, int k_len) {
  return tokens * (act_q8_q_stride(k_len) + 2 * act_q8_s8_stride(k_len) + (4 * act_q8_d_stride(k_len) + 15) / 16 * 16);
}
__device__ __forceinline__ ActQ8 act_q8_at(uint8_t* base, int tokens, int k_len) {
  ActQ8 a;
  a.q_stride = act_q8_q_stride(k_len);
  a.s8_stride = act_q8_s8_stride(k_len);
  a.d_stride = act_q8_d_stride(k_len);
  a.q = reinterpret_cast<int8_t*>(base);
  a.s8 = reinterpret_cast<int16_t*>(base + tokens * a.q_stride);
  a.d = reinterpret_cast<float*>(base + tokens * (a.q_stride + 2 * a.s8_stride));
  return a;
}

// One warp rounds one block of up to 256 activations (len, a multiple of 32... 8 at the least per
// lane that has any) exactly as quant::quantize_activations_q8 does. Lane l holds v = x[8l .. 8l+8)
// (zeros past len); returns the block's scale (NaN when any activation is not finite, so the
// outputs that use it are NaN rather than silently wrong) and leaves the rounded values in q[8].
__device__ __forceinline__ float round_block_q8(const float v[8], int q[8]) {
  float amax = 0.0f;
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float a = fabsf(v[i]);
    amax = fmaxf(amax, a);
    bad |= !(a <= 3.402823466e38f);
  }
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  bad = __any_sync(0xffffffffu, bad);
  const float inv = amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] = int(fminf(fmaxf(rintf(__fmul_rn(v[i], inv)), -127.0f), 127.0f));
  return bad ? __int_as_float(0x7FC00000) : __fdiv_rn(amax, 127.0f);
}

// A rounded block's eight int8 values of one lane as the two words they are stored in (lowest first).
__device__ __forceinline__ uint2 pack_q8x8(const int q[8]) {
  auto word = [](int a, int b, int c, int d) {
    return (uint32_t(a) & 0xFFu) | ((uint32_t(b) & 0xFFu) << 8) | ((uint32_t(c) & 0xFFu) << 16) | (uint32_t(d) << 24);
  };
  return make_uint2(word(q[0], q[1], q[2], q[3]), word(q[4], q[5], q[6], q[7]));
}

// The whole thread block rounds `tokens` tokens' activations [0, k_len) (x_row(t) points at the
// first; 16-byte aligned) into `out`: one warp per (token, block of 256). load(p, v) reads 8 values.
template <class XRow, class Load>
__device__ __forceinline__ void quantize_tokens(XRow&& x_row, int tokens, int k_len, const ActQ8& out, Load&& load) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int blocks = (k_len + kActBlock - 1) / kActBlock;
  for (int item = warp; item < tokens * blocks; item += warps) {
    const int t = item / blocks, b = item % blocks;
    const int i0 = b * kActBlock + 8 * lane;
    const bool mine = i0 < k_len;  // k_len is a multiple of 32, so a lane has all 8 or none
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (mine) load(x_row(t) + i0, v);
    int q[8];
    const float d = round_block_q8(v, q);
    if (mine) {
      *reinterpret_cast<uint2*>(out.q + t * out.q_stride + i0) = pack_q8x8(q);
      out.s8[t * out.s8_stride + i0 / 8] = int16_t(q[0] + q[1] + q[2] + q[3] + q[4] + q[5] + q[6] + q[7]);
    }
    if (lane == 0) out.d[t * out.d_stride + b] = d;
  }
}

// ---- staging rows in shared memory ------------------------------------------------------------

// Each staged row lands at the same offset within kStageAlign bytes of shared memory as its source
// within global memory: a cp.async whose shared destination sits at another offset than its source
// within 128 bytes is split into smaller requests, which costs nothing visible in HBM but halves
// in-place reads of host memory over PCIe (H200: 27-29 GB/s instead of 44-50 for rows of 432, 1152
// and 1760 bytes; tools/bench/host_read_patterns.cu).
constexpr int kStageAlign = 128;

// Shared bytes one staged row segment of `seg_bytes` takes: the segment may start anywhere inside
// its first 16-byte chunk, is copied as whole aligned chunks, and is shifted by up to
// kStageAlign - 16 bytes to match its source's offset.
__host__ __device__ constexpr int staged_row_stride(int seg_bytes) {
  return (seg_bytes + 15 + 15 + (kStageAlign - 16)) / 16 * 16;
}

// The warp copies each of its rows' segment [src, src + seg_bytes) into its shared slot with
// 16-byte cp.async (coalesced: consecutive lanes take consecutive chunks). Chunks cover
// [src & ~15, src + seg_bytes); bytes past the segment's end are never read (zero-filled), so a
// matrix's last row may end its allocation. The copies go out as one commit group per `part_bytes`
// of the rows (the bytes one pass of warp_dot_rows's lane loop decodes), so decoding can start on
// the first part while the others are in flight: wait_staged_part(i, parts) before decoding part i.
// Returns the number of parts; staged[r] is where row r's first byte lands.
__device__ __forceinline__ int stage_rows(const uint8_t* const src[kRowsPerWarp], int seg_bytes, int part_bytes,
                                          uint8_t* slot, int stride, const uint8_t* staged[kRowsPerWarp], int lane) {
  const int parts = (seg_bytes + part_bytes - 1) / part_bytes;
  // Per row, in 32-bit offsets from its first aligned chunk: the head (start & 15), the chunks
  // wholly inside the segment, and the next chunk of each part.
  const uint8_t* base[kRowsPerWarp];
  uint8_t* dst[kRowsPerWarp];
  unsigned dst_s[kRowsPerWarp];
  int head[kRowsPerWarp], full[kRowsPerWarp], next[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(src[r]);
    head[r] = int(start & 15);
    base[r] = reinterpret_cast<const uint8_t*>(start - uintptr_t(head[r]));
    const unsigned row_s = static_cast<unsigned>(__cvta_generic_to_shared(slot + r * stride));
    const unsigned shift = (unsigned(start - uintptr_t(head[r])) - row_s) & unsigned(kStageAlign - 1);
    dst[r] = slot + r * stride + shift;
    dst_s[r] = row_s + shift;
    staged[r] = dst[r] + head[r];
    full[r] = (head[r] + seg_bytes) / 16;
    next[r] = 0;
  }
  for (int part = 0; part < parts; ++part) {
    const int part_end = min((part + 1) * part_bytes, seg_bytes);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      // Chunks whose first byte lies before the end of this part (a chunk that straddles two parts
      // belongs to the earlier one, which needs it first).
      const int last = (head[r] + part_end + 15) / 16;
      for (int c = next[r] + lane; c < last; c += 32) {
        if (c < full[r]) {
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst_s[r] + unsigned(c) * 16u),
                       "l"(base[r] + c * 16));
        } else {
          // The segment's last bytes, where it ends inside a 16-byte chunk: byte loads, so
          // nothing past the end (maybe the end of the allocation) is touched.
          uint8_t* chunk = dst[r] + c * 16;
          for (int i = 0; i < 16; ++i) chunk[i] = c * 16 + i < head[r] + seg_bytes ? base[r][c * 16 + i] : uint8_t(0);
        }
      }
      next[r] = last;
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  return parts;
}

// Waits until parts 0 .. part of stage_rows have landed for the whole warp.
// later_groups: commit groups the warp issued after this stage_rows call (rows staged for later),
// which may stay in flight.
__device__ __forceinline__ void wait_staged_part(int part, int parts, int later_groups = 0) {
  switch (parts - 1 - part + later_groups) {  // groups still allowed in flight (an immediate operand)
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
  }
  __syncwarp();
}

// Bytes of one row that one pass of the lane loop (32 units) decodes.
template <DType T>
__device__ __forceinline__ int part_bytes_of() {
  return 32 / Unit<T>::kUnitsPerBlock * Unit<T>::kBlockBytes;
}

// Programmatic dependent launch (sm_90): wait for the grids this one depends on (their writes are
// then visible), and let the next grid in the stream start its prologue early. Both are no-ops
// for a kernel launched without the programmatic-serialization attribute.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// ---- the warp dot -----------------------------------------------------------------------------

// Token t's activations for unit `slot` of the block at x0: the words the unit's dot takes, the
// sums its min term takes (formats with mins), and the activation block's scale. Units of 32
// weights take four groups of 8 at x_offset(slot, g) and their sums of 8; a unit may bring its own
// loads (load_x / load_sums).
template <class U>
__device__ __forceinline__ void load_unit_x(const ActQ8& xq, int t, int x0, int slot, uint32_t (&x)[U::kXWords],
                                            int32_t (&s8)[U::kSumWords], float& dx) {
  const int8_t* xt = xq.q + t * xq.q_stride + x0;
  const int16_t* st = xq.s8 + t * xq.s8_stride + x0 / 8;
  if constexpr (U::kOwnLoads) {
    U::load_x(xt, slot, x);
    if constexpr (U::kHasMin) U::load_sums(st, slot, s8);
  } else {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const uint2 v = *reinterpret_cast<const uint2*>(xt + U::x_offset(slot, g));
      x[2 * g] = v.x;
      x[2 * g + 1] = v.y;
    }
    if constexpr (U::kHasMin) {
#pragma unroll
      for (int g = 0; g < 4; ++g) s8[g] = st[U::x_offset(slot, g) / 8];
    }
  }
  dx = xq.d[t * xq.d_stride + (x0 + U::x_offset(slot, 0)) / kActBlock];
}

// Whether a format's block is one activation block (the K-quants): its units' integer sums are
// added exactly before the block's scales apply (the header's arithmetic).
template <class U>
__host__ __device__ constexpr bool int_blocks() {
  return U::kBlockElems == kActBlock;
}

// An int32 as a float, exactly, for |v| < 2^22: v added to the mantissa of 1.5 * 2^23 (whose ulp is
// 1), then 1.5 * 2^23 taken away. The same value as __int2float_rn, by two full-rate adds where
// I2F issues at a quarter of the FP32 rate (the tensor-core Q8_0 tile converts every group sum).
__device__ __forceinline__ float small_int_to_float(int32_t v) {
  return __fsub_rn(__int_as_float(0x4B400000 + v), 12582912.0f);
}

// d * S of one unit against one token's activations (Q8_0: before the activation scale). A unit
// of a block of 32 sums 32 products of int8 values: |S| <= 2^19, so small_int_to_float is exact.
template <class U>
__device__ __forceinline__ float unit_value(const U& unit, const uint32_t (&x)[U::kXWords]) {
  static_assert(U::kBlockElems <= 32, "unit sums of blocks past 32 weights may pass 2^22");
  return __fmul_rn(unit.d, small_int_to_float(unit.dot(x)));
}

// A K-quant block's value from its exact sums: d * S - dmin * M. M's mins are at most 63 (6-bit)
// over group sums of at most 32 * 127 per 32 weights, so |M| <= 63 * 127 * 256 < 2^22 and
// small_int_to_float converts it exactly; S may pass 2^22 (Q4_K: 63 * 15 * 127 * 256) and takes I2F.
template <class U>
__device__ __forceinline__ float block_value(float d, float dmin, int32_t S, int32_t M) {
  float f = __fmul_rn(d, __int2float_rn(S));
  if constexpr (U::kHasMin) f = __fsub_rn(f, __fmul_rn(dmin, small_int_to_float(M)));
  return f;
}

// Words of the per-warp scratch warp_dot_q8 hands unit sums through: per output (row, token) a row
// of 32 unit values (S as int32, or Q8_0's floats) and a row of 32 M, each padded so that the
// owners' 16-byte reads are free of bank conflicts.
// Only the K-quants with mins need the M row: the others keep the smaller scratch (more blocks
// per SM for the decode kernels).
constexpr int kChainStride = 36;
__host__ __device__ constexpr bool chain_has_min_row(DType t) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q2_K;
}
__host__ __device__ constexpr int chain_scratch_floats(DType t, int nt) {
  return (chain_has_min_row(t) ? 2 : 1) * kRowsPerWarp * nt * kChainStride;
}

// Units per activation block of 256 (each block's units are summed before its scale applies).
template <class U>
__host__ __device__ constexpr int units_per_act_block() {
  return U::kBlockElems >= kActBlock ? U::kUnitsPerBlock * (U::kBlockElems / kActBlock) : kActBlock / U::kBlockElems;
}

// Dots kRowsPerWarp staged rows of `k_len` weights (whole blocks) with `tokens` (1 .. NT) tokens'
// rounded activations over the same K-range. Per pass, lane l decodes unit 32 * pass + l (RB rows
// at a time, each token's activations once for those rows) and writes its sums to `chain`
// (chain_scratch_floats(T, NT) words of shared memory, this warp's own); lane v < kRowsPerWarp * NT
// then adds output v's units per activation block, takes the block's value and continues its
// chain over the blocks (only the chain of fmas is serial). emit(row, token, value) is called once
// per (row, token < tokens) by the lane that owns the chain. parts_to_wait: what stage_rows
// returned, for the first pass over freshly staged rows (0 afterwards); later_groups: commit
// groups staged after these rows (see wait_staged_part).
// NT = 1 keeps few registers live (more warps per SM: the batch-1 case); NT = 8 decodes each unit
// once for 8 tokens. Both give the same bits for a token: its chain sees the same operations in
// the same order.
template <DType T, int NT, class Emit>
__device__ __forceinline__ void warp_dot_q8(const uint8_t* const staged[kRowsPerWarp], int k_len, const ActQ8& xq,
                                            int tokens, int lane, int parts_to_wait, int later_groups, float* chain,
                                            Emit&& emit) {
  using U = Unit<T>;
  constexpr bool kInt = int_blocks<U>();
  constexpr int RB = NT == 1 ? 1 : 2;  // rows decoded at once
  constexpr int V = kRowsPerWarp * NT;
  int32_t* chain_s = reinterpret_cast<int32_t*>(chain);  // S (kInt) or the float values
  int32_t* chain_m = chain_s + V * kChainStride;         // M (kInt formats with mins)
  static_assert(chain_has_min_row(T) == (kInt && U::kHasMin), "chain_scratch_floats must hold the M row");
  float acc = 0.0f;  // lane v < V: the chain of output v = (row v / NT, token v % NT)
  const int units = k_len / U::kBlockElems * U::kUnitsPerBlock;
  const int passes = (units + 31) / 32;
  const int own_token = lane % NT;
  // The owner's row, for the block scales (kInt).
  const uint8_t* own_row = staged[0];
#pragma unroll
  for (int r = 1; r < kRowsPerWarp; ++r)
    if (lane / NT == r) own_row = staged[r];
  for (int pass = 0; pass < passes; ++pass) {
    if (parts_to_wait) wait_staged_part(pass, parts_to_wait, later_groups);
    const int u = pass * 32 + lane;
    if (u < units) {
      const int block = u / U::kUnitsPerBlock, slot = u % U::kUnitsPerBlock;
      const int x0 = block * U::kBlockElems;
      // Output v's sums for this unit, straight to the scratch: S (or the float value's bits), M.
      auto put = [&](int v, const U& unit, const uint32_t (&x)[U::kXWords], const int32_t (&s8)[U::kSumWords]) {
        if constexpr (kInt) {
          chain_s[v * kChainStride + lane] = unit.dot(x);
          if constexpr (U::kHasMin) chain_m[v * kChainStride + lane] = unit.min_dot(s8);
        } else {
          chain_s[v * kChainStride + lane] = __float_as_int(unit_value(unit, x));
        }
      };
      if constexpr (NT == 1) {
        // One token: its activations for this unit once, then the rows one after another.
        uint32_t x[U::kXWords];
        int32_t s8[U::kSumWords] = {};
        float dx;
        load_unit_x<U>(xq, 0, x0, slot, x, s8, dx);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          U unit;
          unit.load(staged[r] + block * U::kBlockBytes, slot);
          put(r, unit, x, s8);
        }
      } else {
#pragma unroll
        for (int r0 = 0; r0 < kRowsPerWarp; r0 += RB) {
          U unit[RB];
#pragma unroll
          for (int r = 0; r < RB; ++r) unit[r].load(staged[r0 + r] + block * U::kBlockBytes, slot);
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            if (t < tokens) {
              uint32_t x[U::kXWords];
              int32_t s8[U::kSumWords] = {};
              float dx;
              load_unit_x<U>(xq, t, x0, slot, x, s8, dx);
#pragma unroll
              for (int r = 0; r < RB; ++r) put((r0 + r) * NT + t, unit[r], x, s8);
            }
          }
        }
      }
    }
    __syncwarp();
    if (lane < V && own_token < tokens) {
      constexpr int kPer = units_per_act_block<U>();  // 4 or 8: a pass holds 32 / kPer whole blocks
      const int32_t* row = chain_s + lane * kChainStride;
      const int32_t* mrow = chain_m + lane * kChainStride;
      const float* d = xq.d + own_token * xq.d_stride + pass * (32 / kPer);
      const int in_pass = min(32, units - pass * 32);
      int32_t f[32];
#pragma unroll
      for (int j = 0; j < 32; j += 4) {
        const int4 q = *reinterpret_cast<const int4*>(row + j);
        f[j] = q.x, f[j + 1] = q.y, f[j + 2] = q.z, f[j + 3] = q.w;
      }
#pragma unroll
      for (int b = 0; b < 32 / kPer; ++b) {
        if (b * kPer >= in_pass) break;
        float value;
        if constexpr (kInt) {
          int32_t S = f[b * kPer], M = 0;
#pragma unroll
          for (int j = 1; j < kPer; ++j) S += f[b * kPer + j];
          if constexpr (U::kHasMin) {
#pragma unroll
            for (int j = 0; j < kPer; j += 4) {
              const int4 q = *reinterpret_cast<const int4*>(mrow + b * kPer + j);
              M += q.x + q.y + q.z + q.w;
            }
          }
          float bd, bdmin;
          U::block_scales(own_row + (pass * (32 / kPer) + b) * U::kBlockBytes, bd, bdmin);
          value = block_value<U>(bd, bdmin, S, M);
        } else {
          value = __int_as_float(f[b * kPer]);
#pragma unroll
          for (int j = 1; j < kPer; ++j)
            if (b * kPer + j < in_pass) value = __fadd_rn(value, __int_as_float(f[b * kPer + j]));
        }
        acc = __fmaf_rn(d[b], value, acc);
      }
    }
    __syncwarp();  // the chain row is read before the next pass overwrites it
  }
  if (lane < V && own_token < tokens) emit(lane / NT, own_token, acc);
}

// Runs warp_dot_q8 over `tokens` tokens of a group NT at a time (tokens <= kMaxTokenGroup).
template <DType T, int NT, class Emit>
__device__ __forceinline__ void warp_dot_q8_group(const uint8_t* const staged[kRowsPerWarp], int k_len,
                                                  const ActQ8& xq, int tokens, int lane, int parts_to_wait,
                                                  int later_groups, float* chain, Emit&& emit) {
  for (int t0 = 0; t0 < tokens; t0 += NT) {
    ActQ8 sub = xq;
    sub.q += t0 * xq.q_stride;
    sub.s8 += t0 * xq.s8_stride;
    sub.d += t0 * xq.d_stride;
    warp_dot_q8<T, NT>(staged, k_len, sub, min(NT, tokens - t0), lane, t0 == 0 ? parts_to_wait : 0, later_groups, chain,
                       [&](int r, int t, float v) { emit(r, t0 + t, v); });
  }
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization,
// so it may start while the previous kernel in the stream finishes (see wait_for_previous_grid).
template <class... Params, class... Args>
__host__ cudaError_t launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                       cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Calls f(std::integral_constant<DType, T>) for the block formats the CUDA kernels decode.
template <class F>
__host__ bool dispatch_block_type(DType t, F&& f) {
  switch (t) {
    case DType::Q8_0: f(std::integral_constant<DType, DType::Q8_0>{}); return true;
    case DType::Q6_K: f(std::integral_constant<DType, DType::Q6_K>{}); return true;
    case DType::Q5_K: f(std::integral_constant<DType, DType::Q5_K>{}); return true;
    case DType::Q4_K: f(std::integral_constant<DType, DType::Q4_K>{}); return true;
    case DType::Q3_K: f(std::integral_constant<DType, DType::Q3_K>{}); return true;
    case DType::Q2_K: f(std::integral_constant<DType, DType::Q2_K>{}); return true;
    default: return false;
  }
}

}  // namespace spill::cuda
