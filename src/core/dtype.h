// Element types of weights: plain floats and the ggml block formats, with the traits that say
// how many bytes a row of each takes, and the conversions the kernels use.
//
// A block format stores a row as consecutive blocks of block_elems weights in block_bytes bytes
// (quantized values and their scales together), bit for bit as ggml lays them out, so a GGUF
// file's bytes are used as they are, by the CPU and the CUDA kernels alike. Plain floats are
// blocks of one element. Written to C++17: CUDA sources include it.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace spill {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  Q8_0,    // 32 weights: f16 scale + 32 x int8
  Q6_K,    // 256 weights: 6-bit, 16 int8 sub-block scales, f16 super-scale
  Q5_K,    // 256 weights: 5-bit, 8 x 6-bit scale/min pairs, f16 scale and min
  Q4_K,    // 256 weights: 4-bit, 8 x 6-bit scale/min pairs, f16 scale and min
  Q3_K,    // 256 weights: 3-bit (2 low bits + high-bit mask), 16 x 6-bit scales, f16 super-scale
  Q2_K,    // 256 weights: 2-bit, 16 x (4-bit scale, 4-bit min), f16 scale and min
  IQ4_XS,  // 256 weights: 4-bit indices into a non-linear table, 8 x 6-bit scales, f16 super-scale
  MXFP4,   // 32 weights: e8m0 shared exponent + 32 x fp4 (e2m1), as gpt-oss stores its experts
  // ggml's legacy 32-weight formats: what llama-quantize's k-quant mixes store a row in when its
  // width is not a multiple of 256 (Q4_K -> Q5_0, Q5_K -> Q5_1, Q3_K/Q2_K -> Q4_0, IQ4_XS ->
  // IQ4_NL), and what many published GGUFs contain. (Appended: the ids above are stable.)
  Q4_0,    // 32 weights: f16 scale + 32 x 4-bit (w = d * (q - 8))
  Q4_1,    // 32 weights: f16 scale and min + 32 x 4-bit (w = d * q + m)
  Q5_0,    // 32 weights: f16 scale + 32 x 5-bit (4 low bits + a 32-bit high-bit word; w = d * (q - 16))
  Q5_1,    // 32 weights: f16 scale and min + 32 x 5-bit (w = d * q + m)
  IQ4_NL,  // 32 weights: f16 scale + 32 x 4-bit indices into IQ4_XS's non-linear table
};
constexpr int kNumDTypes = 16;

// What a KV cache stores K and V in (sizes and names: model/kv_format.h). F32 is what the CPU runner
// keeps; BF16 and FP8 (e4m3 values with one f32 scale per token, KV head and K or V: quant/fp8.h) are
// for GPU runners.
enum class KvFormat : uint8_t { F32, BF16, Fp8E4m3 };

struct DTypeTraits {
  std::string_view name;  // as spill and ggml print it: "F32", "Q4_K", ...
  int32_t block_elems;    // weights per block (1 for plain floats)
  int32_t block_bytes;    // bytes per block
  int32_t ggml_type;      // the type id a GGUF file stores (enum ggml_type)
  bool is_float;          // plain F32/F16/BF16: one element per block, no scales
};

constexpr DTypeTraits kDTypeTraits[kNumDTypes] = {
    {"F32", 1, 4, 0, true},       {"F16", 1, 2, 1, true},     {"BF16", 1, 2, 30, true},
    {"Q8_0", 32, 34, 8, false},   {"Q6_K", 256, 210, 14, false}, {"Q5_K", 256, 176, 13, false},
    {"Q4_K", 256, 144, 12, false}, {"Q3_K", 256, 110, 11, false}, {"Q2_K", 256, 84, 10, false},
    {"IQ4_XS", 256, 136, 23, false}, {"MXFP4", 32, 17, 39, false},
    {"Q4_0", 32, 18, 2, false},    {"Q4_1", 32, 20, 3, false},    {"Q5_0", 32, 22, 6, false},
    {"Q5_1", 32, 24, 7, false},    {"IQ4_NL", 32, 18, 20, false},
};

constexpr const DTypeTraits& dtype_traits(DType t) { return kDTypeTraits[static_cast<int>(t)]; }
constexpr std::string_view dtype_name(DType t) { return dtype_traits(t).name; }
constexpr bool dtype_is_float(DType t) { return dtype_traits(t).is_float; }
constexpr int64_t dtype_block_elems(DType t) { return dtype_traits(t).block_elems; }

// Whether a row of `cols` weights can be stored in this type (whole blocks only).
constexpr bool row_fits(DType t, int64_t cols) { return cols >= 0 && cols % dtype_traits(t).block_elems == 0; }
// Bytes of one row of `cols` weights; cols must be a whole number of blocks (row_fits).
constexpr int64_t row_bytes(DType t, int64_t cols) {
  return cols / dtype_traits(t).block_elems * dtype_traits(t).block_bytes;
}
// Bits per weight, scales included (4.5 for Q4_K, 8.5 for Q8_0).
constexpr double dtype_bits_per_weight(DType t) {
  return 8.0 * dtype_traits(t).block_bytes / dtype_traits(t).block_elems;
}

// Parses a name as dtype_name prints it, case-insensitively ("q4_k", "BF16"); false if unknown.
bool parse_dtype_name(std::string_view s, DType& out);
// The DType of a ggml type id; false for ids spill does not support.
bool dtype_from_ggml_type(int64_t ggml_type, DType& out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = int32_t((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    mant |= 0x800000;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = 1u << (shift - 1);
    uint32_t rounded = (mant + half - 1 + ((mant >> shift) & 1)) >> shift;
    return uint16_t(sign | rounded);
  }
  uint32_t rounded = mant + 0xfff + ((mant >> 13) & 1);
  if (rounded & 0x800000) {
    rounded = 0;
    ++exp;
    if (exp >= 31) return uint16_t(sign | 0x7c00);
  }
  return uint16_t(sign | (uint32_t(exp) << 10) | (rounded >> 13));
}

}  // namespace spill
