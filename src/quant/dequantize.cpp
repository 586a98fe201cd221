// The reference dequantizers: the value of every weight, bit for bit as ggml's dequantize_row_*
// computes it (products rounded one at a time, never fused: this file is built with
// -ffp-contract=off), so the CUDA kernels and the dot products have one definition to match.
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace spill::quant {

namespace {

template <class Block>
const Block* blocks_of(const void* src) {
  return static_cast<const Block*>(src);
}

void dequantize_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_f32(b[i].d);
    for (int l = 0; l < 32; ++l) y[l] = float(b[i].qs[l]) * d;
  }
}

void dequantize_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    // Each half of 128 weights: 64 bytes of low nibbles and 32 bytes holding four 2-bit highs.
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * float(sc[s]) * float(q1);
        y[l + 32] = d * float(sc[s + 2]) * float(q2);
        y[l + 64] = d * float(sc[s + 4]) * float(q3);
        y[l + 96] = d * float(sc[s + 6]) * float(q4);
      }
    }
  }
}

// Q4_K and Q5_K share the scale/min packing; Q5_K adds a fifth bit from qh.
template <bool kFiveBit, class Block>
void dequantize_q45_k(const Block* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int pair = 0; pair < 4; ++pair, q += 32) {
      for (int half = 0; half < 2; ++half, y += 32) {
        const int j = 2 * pair + half;
        uint8_t sc, m;
        unpack_scale_min_k4(j, b[i].scales, sc, m);
        const float dl = d * float(sc), ml = dmin * float(m);
        for (int l = 0; l < 32; ++l) {
          int v = half ? (q[l] >> 4) : (q[l] & 0xF);
          if constexpr (kFiveBit) v += ((b[i].qh[l] >> j) & 1) << 4;
          y[l] = dl * float(v) - ml;
        }
      }
    }
  }
}

void dequantize_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    uint8_t scales[16];
    unpack_scales_q3(b[i].scales, scales);
    // 16 sub-blocks of 16: sub-block k sits in the 2-bit plane (k/2)%4 of qs bytes
    // 32*(k/8) + 16*(k%2) ..., its high bit in bit k/2 of the same hmask byte index mod 32.
    for (int k = 0; k < 16; ++k, y += 16) {
      const float dl = d * float(int(scales[k]) - 32);
      const int shift = 2 * ((k / 2) % 4);
      const uint8_t* q = b[i].qs + 32 * (k / 8) + 16 * (k % 2);
      const uint8_t* hm = b[i].hmask + 16 * (k % 2);
      const int hbit = k / 2;
      for (int l = 0; l < 16; ++l) {
        const int v = ((q[l] >> shift) & 3) - (((hm[l] >> hbit) & 1) ? 0 : 4);
        y[l] = dl * float(v);
      }
    }
  }
}

void dequantize_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int k = 0; k < 16; ++k, y += 16) {
      const uint8_t sc = b[i].scales[k];
      const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
      const int shift = 2 * ((k / 2) % 4);
      const uint8_t* q = b[i].qs + 32 * (k / 8) + 16 * (k % 2);
      for (int l = 0; l < 16; ++l) y[l] = dl * float((q[l] >> shift) & 3) - ml;
    }
  }
}

void dequantize_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 8; ++j, y += 32) {
      const float dl = d * float(iq4xs_scale(b[i], j) - 32);
      const uint8_t* qs = b[i].qs + 16 * j;
      for (int l = 0; l < 16; ++l) {
        y[l] = dl * float(kIq4nlValues[qs[l] & 0xF]);
        y[l + 16] = dl * float(kIq4nlValues[qs[l] >> 4]);
      }
    }
  }
}

void dequantize_mxfp4(const BlockMXFP4* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = e8m0_half_to_f32(b[i].e);
    for (int l = 0; l < 16; ++l) {
      y[l] = float(kFp4Values[b[i].qs[l] & 0xF]) * d;
      y[l + 16] = float(kFp4Values[b[i].qs[l] >> 4]) * d;
    }
  }
}

// The legacy 32-weight formats: quant l's low nibble is qs[l % 16]'s low (l < 16) or high nibble,
// its fifth bit (Q5_*) bit l of qh. Without a min w = d * (q - offset), with one w = d * q + m.
template <class Block, bool kFiveBit, bool kMin>
void dequantize_legacy(const Block* b, float* y, int64_t nb) {
  constexpr int kOffset = kMin ? 0 : (kFiveBit ? 16 : 8);
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_f32(b[i].d);
    float m = 0.0f;
    if constexpr (kMin) m = f16_to_f32(b[i].m);
    uint32_t high = 0;
    if constexpr (kFiveBit) high = q5_high_bits(b[i].qh);
    for (int l = 0; l < 32; ++l) {
      int q = l < 16 ? (b[i].qs[l] & 0xF) : (b[i].qs[l - 16] >> 4);
      if constexpr (kFiveBit) q |= int((high >> l) & 1) << 4;
      if constexpr (kMin) y[l] = float(q) * d + m;
      else y[l] = float(q - kOffset) * d;
    }
  }
}

void dequantize_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_f32(b[i].d);
    for (int l = 0; l < 16; ++l) {
      y[l] = d * float(kIq4nlValues[b[i].qs[l] & 0xF]);
      y[l + 16] = d * float(kIq4nlValues[b[i].qs[l] >> 4]);
    }
  }
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  if (!row_fits(t, n))
    fail("cannot dequantize a row of {} weights as {}: rows must be whole blocks of {}", n, dtype_name(t),
         dtype_block_elems(t));
  const int64_t nb = n / dtype_block_elems(t);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case DType::F16: {
      const uint16_t* p = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if defined(__F16C__)
      // The hardware conversion is exact, like f16_to_f32, and what makes widening F16 rows cheap.
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
#endif
      for (; i < n; ++i) dst[i] = f16_to_f32(p[i]);
      break;
    }
    case DType::BF16: {
      const uint16_t* p = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(p[i]);
      break;
    }
    case DType::Q8_0: dequantize_q8_0(blocks_of<BlockQ8_0>(src), dst, nb); break;
    case DType::Q6_K: dequantize_q6_k(blocks_of<BlockQ6_K>(src), dst, nb); break;
    case DType::Q5_K: dequantize_q45_k<true>(blocks_of<BlockQ5_K>(src), dst, nb); break;
    case DType::Q4_K: dequantize_q45_k<false>(blocks_of<BlockQ4_K>(src), dst, nb); break;
    case DType::Q3_K: dequantize_q3_k(blocks_of<BlockQ3_K>(src), dst, nb); break;
    case DType::Q2_K: dequantize_q2_k(blocks_of<BlockQ2_K>(src), dst, nb); break;
    case DType::IQ4_XS: dequantize_iq4_xs(blocks_of<BlockIQ4_XS>(src), dst, nb); break;
    case DType::MXFP4: dequantize_mxfp4(blocks_of<BlockMXFP4>(src), dst, nb); break;
    case DType::Q4_0: dequantize_legacy<BlockQ4_0, false, false>(blocks_of<BlockQ4_0>(src), dst, nb); break;
    case DType::Q4_1: dequantize_legacy<BlockQ4_1, false, true>(blocks_of<BlockQ4_1>(src), dst, nb); break;
    case DType::Q5_0: dequantize_legacy<BlockQ5_0, true, false>(blocks_of<BlockQ5_0>(src), dst, nb); break;
    case DType::Q5_1: dequantize_legacy<BlockQ5_1, true, true>(blocks_of<BlockQ5_1>(src), dst, nb); break;
    case DType::IQ4_NL: dequantize_iq4_nl(blocks_of<BlockIQ4_NL>(src), dst, nb); break;
  }
}

}  // namespace spill::quant
