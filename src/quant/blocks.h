// The ggml block layouts, byte for byte, and the small decoders they share (6-bit scale packing,
// the non-linear 4-bit tables, e8m0 exponents). Internal to src/quant: the public interface is
// quant.h. Every struct is checked against dtype.h's block_bytes so the two cannot drift apart.
// Written to C++17 (CUDA sources may include it for the same layouts).
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace spill::quant {

constexpr int kSuperBlock = 256;  // weights per k-quant / IQ4_XS block (ggml's QK_K)

struct BlockQ8_0 {
  uint16_t d;     // f16 scale
  int8_t qs[32];  // w = d * q
};
struct BlockQ6_K {
  uint8_t ql[128];    // low 4 bits of each 6-bit quant
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // one per 16 weights
  uint16_t d;         // f16 super-scale: w = d * scale * (q - 32)
};
struct BlockQ5_K {
  uint16_t d, dmin;     // f16: w = d * sc * q - dmin * m
  uint8_t scales[12];   // 8 x (6-bit sc, 6-bit m), packed as in unpack_scale_min_k4
  uint8_t qh[32];       // fifth bit of each quant
  uint8_t qs[128];      // low 4 bits
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ3_K {
  uint8_t hmask[32];   // high bit: set means +0, clear means -4
  uint8_t qs[64];      // low 2 bits
  uint8_t scales[12];  // 16 x 6-bit scales (offset by 32)
  uint16_t d;
};
struct BlockQ2_K {
  uint8_t scales[16];  // low nibble: scale, high nibble: min, one pair per 16 weights
  uint8_t qs[64];
  uint16_t d, dmin;
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;    // high 2 bits of the 8 6-bit scales
  uint8_t scales_l[4];  // low 4 bits
  uint8_t qs[128];      // indices into kIq4nlValues
};
struct BlockMXFP4 {
  uint8_t e;       // e8m0 shared exponent
  uint8_t qs[16];  // e2m1 codes: low nibbles are weights 0..15, high nibbles 16..31
};

// The legacy 32-weight formats. Quant l (0..31) of a block: its low 4 bits are the low nibble of
// qs[l] for l < 16 and the high nibble of qs[l - 16] otherwise; Q5's fifth bit is bit l of qh
// (read as a little-endian 32-bit word).
struct BlockQ4_0 {
  uint16_t d;      // f16: w = d * (q - 8)
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d, m;   // f16: w = d * q + m
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;      // f16: w = d * (q - 16)
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d, m;   // f16: w = d * q + m
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockIQ4_NL {
  uint16_t d;      // f16: w = d * kIq4nlValues[q]
  uint8_t qs[16];
};

template <class Block>
constexpr bool block_matches(DType t) {
  return sizeof(Block) == size_t(dtype_traits(t).block_bytes);
}
static_assert(block_matches<BlockQ8_0>(DType::Q8_0));
static_assert(block_matches<BlockQ6_K>(DType::Q6_K));
static_assert(block_matches<BlockQ5_K>(DType::Q5_K));
static_assert(block_matches<BlockQ4_K>(DType::Q4_K));
static_assert(block_matches<BlockQ3_K>(DType::Q3_K));
static_assert(block_matches<BlockQ2_K>(DType::Q2_K));
static_assert(block_matches<BlockIQ4_XS>(DType::IQ4_XS));
static_assert(block_matches<BlockMXFP4>(DType::MXFP4));
static_assert(block_matches<BlockQ4_0>(DType::Q4_0));
static_assert(block_matches<BlockQ4_1>(DType::Q4_1));
static_assert(block_matches<BlockQ5_0>(DType::Q5_0));
static_assert(block_matches<BlockQ5_1>(DType::Q5_1));
static_assert(block_matches<BlockIQ4_NL>(DType::IQ4_NL));

// The 16 levels of IQ4_NL / IQ4_XS.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
// e2m1 values times two (MXFP4); the e8m0 scale is halved to match.
inline constexpr int8_t kFp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e-127) / 2, the MXFP4 scale for doubled e2m1 values; subnormal for e < 2.
inline float e8m0_half_to_f32(uint8_t e) {
  uint32_t bits = e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Q4_K / Q5_K: sub-block j's 6-bit scale and min from the 12 packed bytes. Bytes 0-3 hold the
// scales of sub-blocks 0-3 (and the top 2 bits of 4-7), bytes 4-7 the mins likewise, bytes 8-11
// the low nibbles of sub-blocks 4-7 (scale low, min high).
inline void unpack_scale_min_k4(int j, const uint8_t* q, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    min = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}
inline void pack_scale_min_k4(const uint8_t scale[8], const uint8_t min[8], uint8_t q[12]) {
  for (int j = 0; j < 4; ++j) {
    q[j] = uint8_t((scale[j] & 63) | ((scale[j + 4] >> 4) << 6));
    q[j + 4] = uint8_t((min[j] & 63) | ((min[j + 4] >> 4) << 6));
    q[j + 8] = uint8_t((scale[j + 4] & 0xF) | ((min[j + 4] & 0xF) << 4));
  }
}

// Q3_K: the 16 6-bit scales (0..63, stored offset by 32). Byte k of 0-7 holds the low nibbles of
// scales k (low) and k+8 (high); bytes 8-11 the top 2 bits, scale k at bits 2*(k/4) of byte 8+k%4.
inline void unpack_scales_q3(const uint8_t q[12], uint8_t out[16]) {
  for (int k = 0; k < 16; ++k) {
    const uint8_t low = k < 8 ? (q[k] & 0xF) : (q[k - 8] >> 4);
    const uint8_t high = (q[8 + k % 4] >> (2 * (k / 4))) & 3;
    out[k] = uint8_t(low | (high << 4));
  }
}
inline void pack_scales_q3(const uint8_t s[16], uint8_t q[12]) {
  std::memset(q, 0, 12);
  for (int k = 0; k < 16; ++k) {
    if (k < 8) q[k] |= s[k] & 0xF;
    else q[k - 8] |= uint8_t((s[k] & 0xF) << 4);
    q[8 + k % 4] |= uint8_t(((s[k] >> 4) & 3) << (2 * (k / 4)));
  }
}

// Q5_0 / Q5_1: the 32 fifth bits, bit l for quant l.
inline uint32_t q5_high_bits(const uint8_t qh[4]) {
  return uint32_t(qh[0]) | (uint32_t(qh[1]) << 8) | (uint32_t(qh[2]) << 16) | (uint32_t(qh[3]) << 24);
}

// IQ4_XS: sub-block j's 6-bit scale (offset by 32).
inline int iq4xs_scale(const BlockIQ4_XS& b, int j) {
  return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4);
}

}  // namespace spill::quant
