// The portable kernels of dot_q8: plain loops over the quants, exact in int32, and the float
// combination of dot_q8_paths.h lane by lane, so they give the vector builds' bits on any CPU.
#include <algorithm>
#include <cmath>

#include "quant/dot_q8_paths.h"

namespace spill::quant::detail {
namespace {

// Lane l of a 32-weight chunk: the products at positions 4l .. 4l+3 (dot_q8_paths.h).
template <class Value>
inline int32_t lane_sum(Value value, const int8_t* q, int l) {
  int32_t s = 0;
  for (int i = 4 * l; i < 4 * l + 4; ++i) s += value(i) * int32_t(q[i]);
  return s;
}

// Q8_0 and the signed legacy formats: value(block, i) is the signed value at position i.
template <class Block, class Value>
float row_signed(const Block* w, const int8_t* q, const float* dx, int64_t nb, Value value) {
  float acc[8] = {};
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    float in[2][8] = {};
    for (int64_t b = b0; b < std::min(nb, b0 + 8); ++b) {
      const float d = f16_to_f32(w[b].d);
      for (int l = 0; l < 8; ++l) {
        const int32_t s = lane_sum([&](int i) { return value(w[b], i); }, q + 32 * b, l);
        in[b % 2][l] = std::fma(d, float(s), in[b % 2][l]);
      }
    }
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(dx[b0 / 8], in[0][l] + in[1][l], acc[l]);
  }
  return reduce8(acc);
}

float row_q8_0(const BlockQ8_0* w, const int8_t* q, const float* dx, int64_t nb) {
  return row_signed(w, q, dx, nb, [](const BlockQ8_0& b, int i) { return int32_t(b.qs[i]); });
}

// The legacy 32-weight formats: quant l is the low (l < 16) or high nibble of qs[l % 16], plus 16
// where bit l of qh is set (Q5_*).
inline int32_t nibble(const uint8_t* qs, int l) { return l < 16 ? (qs[l] & 0xF) : (qs[l - 16] >> 4); }

float row_q4_0(const BlockQ4_0* w, const int8_t* q, const float* dx, int64_t nb) {
  return row_signed(w, q, dx, nb, [](const BlockQ4_0& b, int i) { return nibble(b.qs, i) - 8; });
}
float row_q5_0(const BlockQ5_0* w, const int8_t* q, const float* dx, int64_t nb) {
  return row_signed(w, q, dx, nb, [](const BlockQ5_0& b, int i) {
    return (nibble(b.qs, i) | int32_t((q5_high_bits(b.qh) >> i) & 1) << 4) - 16;
  });
}
float row_iq4_nl(const BlockIQ4_NL* w, const int8_t* q, const float* dx, int64_t nb) {
  return row_signed(w, q, dx, nb, [](const BlockIQ4_NL& b, int i) { return int32_t(kIq4nlValues[nibble(b.qs, i)]); });
}

// Sub-blocks 2p and 2p+1 of Q4_K/Q5_K are the low and high nibbles of qs[32p:32p+32]; Q5_K adds
// 16 where bit j of qh[l] is set for sub-block j.
template <bool kFiveBit, class Block>
float row_q45_k(const Block* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb) {
  float acc[8] = {}, macc[8] = {};
  for (int64_t i = 0; i < nb; ++i, q += kSuperBlock, s16 += 16) {
    uint8_t sc[8], m[8];
    scale_mins_k4(w[i].scales, sc, m);
    int32_t lanes[8] = {}, min_lanes[8];
    for (int j = 0; j < 8; ++j) {
      const uint8_t* qs = w[i].qs + 32 * (j / 2);
      auto value = [&](int l) {
        int32_t v = (j % 2) ? (qs[l] >> 4) : (qs[l] & 0xF);
        if constexpr (kFiveBit) v += ((w[i].qh[l] >> j) & 1) << 4;
        return v;
      };
      for (int l = 0; l < 8; ++l) lanes[l] += int32_t(sc[j]) * lane_sum(value, q + 32 * j, l);
    }
    for (int l = 0; l < 8; ++l) min_lanes[l] = int32_t(m[l]) * (int32_t(s16[2 * l]) + int32_t(s16[2 * l + 1]));
    const float d = f16_to_f32(w[i].d) * dx[i], dmin = f16_to_f32(w[i].dmin) * dx[i];
    for (int l = 0; l < 8; ++l) {
      acc[l] = std::fma(d, float(lanes[l]), acc[l]);
      macc[l] = std::fma(dmin, float(min_lanes[l]), macc[l]);
    }
  }
  float diff[8];
  for (int l = 0; l < 8; ++l) diff[l] = acc[l] - macc[l];
  return reduce8(diff);
}

float row_q4_k(const BlockQ4_K* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb) {
  return row_q45_k<false>(w, q, s16, dx, nb);
}
float row_q5_k(const BlockQ5_K* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb) {
  return row_q45_k<true>(w, q, s16, dx, nb);
}

// Weights 128h + 32k + l: nibble (k / 2 ? high : low) of ql[64h + 32(k % 2) + l], top two bits
// from bits 2k, 2k+1 of qh[32h + l]; stored offset by 32 (taken off per lane).
float row_q6_k(const BlockQ6_K* w, const int8_t* q, const int16_t* s16, const float* dx, int64_t nb) {
  float acc[8] = {};
  for (int64_t i = 0; i < nb; ++i, q += kSuperBlock, s16 += 16) {
    int32_t lanes[8] = {};
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k) {
        auto value = [&](int l) {
          const uint8_t lq = w[i].ql[64 * h + 32 * (k % 2) + l];
          return ((k / 2) ? (lq >> 4) : (lq & 0xF)) | (((w[i].qh[32 * h + l] >> (2 * k)) & 3) << 4);
        };
        const int c = 4 * h + k;  // chunk c holds sub-blocks 2c (lanes 0-3) and 2c + 1 (lanes 4-7)
        for (int l = 0; l < 8; ++l)
          lanes[l] += int32_t(w[i].scales[2 * c + l / 4]) * lane_sum(value, q + 32 * c, l);
      }
    const float d = f16_to_f32(w[i].d) * dx[i];
    for (int l = 0; l < 8; ++l) {
      const int32_t offset = int32_t(w[i].scales[2 * l]) * s16[2 * l] + int32_t(w[i].scales[2 * l + 1]) * s16[2 * l + 1];
      acc[l] = std::fma(d, float(lanes[l] - 32 * offset), acc[l]);
    }
  }
  return reduce8(acc);
}

float amax(const float* x, int64_t n, float* poison) {
  float m = 0.0f, p = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    m = std::max(m, std::fabs(x[i]));
    p += x[i] * 0.0f;
  }
  *poison = p;
  return m;
}

void round(const float* x, int64_t n, float inv, int8_t* q) {
  // Round to nearest (even); |x * inv| <= 127 up to one rounding, so the clamp only guards it.
  for (int64_t i = 0; i < n; ++i) q[i] = int8_t(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
}

void sum16(const int8_t* q, int64_t n16, int16_t* out) {
  for (int64_t j = 0; j < n16; ++j) {
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) s += q[16 * j + l];
    out[j] = int16_t(s);
  }
}

// Q4_1 / Q5_1: the unsigned quants' sums (the min is the caller's).
template <class Block, bool kFiveBit>
void legacy_unsigned(const Block* w, const int8_t* q, int64_t nb, int32_t* out) {
  for (int64_t i = 0; i < nb; ++i, q += 32) {
    uint32_t high = 0;
    if constexpr (kFiveBit) high = q5_high_bits(w[i].qh);
    int32_t s = 0;
    for (int l = 0; l < 32; ++l) s += (nibble(w[i].qs, l) | int32_t((high >> l) & 1) << 4) * int32_t(q[l]);
    out[i] = s;
  }
}

void q4_1(const BlockQ4_1* w, const int8_t* q, int64_t nb, int32_t* out) { legacy_unsigned<BlockQ4_1, false>(w, q, nb, out); }
void q5_1(const BlockQ5_1* w, const int8_t* q, int64_t nb, int32_t* out) { legacy_unsigned<BlockQ5_1, true>(w, q, nb, out); }

}  // namespace

const Q8Kernels kQ8Scalar = {row_q8_0, row_q4_k, row_q5_k, row_q6_k, row_q4_0, row_q5_0, row_iq4_nl, q4_1, q5_1,
                             amax,     round,    sum16,    nullptr,  nullptr,  nullptr, nullptr, nullptr, nullptr};

}  // namespace spill::quant::detail
