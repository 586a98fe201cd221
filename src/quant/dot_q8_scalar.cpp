// The portable integer kernels of dot_q8: plain loops over the quants, exact in int32, so they
// give the same sums as the vector builds on any CPU.
#include "quant/dot_q8_paths.h"

namespace spill::quant::detail {
namespace {

void q8_0(const BlockQ8_0* w, const int8_t* q, int64_t nb, int32_t* out) {
  for (int64_t i = 0; i < nb; ++i, q += 32) {
    int32_t s = 0;
    for (int l = 0; l < 32; ++l) s += int32_t(w[i].qs[l]) * int32_t(q[l]);
    out[i] = s;
  }
}

// Sub-blocks 2p and 2p+1 of Q4_K/Q5_K are the low and high nibbles of qs[32p:32p+32]; Q5_K adds
// 16 where bit j of qh[l] is set for sub-block j.
template <bool kFiveBit, class Block>
void q45_k(const Block* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out) {
  for (int64_t i = 0; i < nb; ++i, q += kSuperBlock, s16 += 16) {
    uint8_t sc[8], m[8];
    scale_mins_k4(w[i].scales, sc, m);
    int32_t sum = 0;
    for (int j = 0; j < 8; ++j) {
      const uint8_t* qs = w[i].qs + 32 * (j / 2);
      int32_t s = 0;
      for (int l = 0; l < 32; ++l) {
        int32_t v = (j % 2) ? (qs[l] >> 4) : (qs[l] & 0xF);
        if constexpr (kFiveBit) v += ((w[i].qh[l] >> j) & 1) << 4;
        s += v * int32_t(q[32 * j + l]);
      }
      sum += int32_t(sc[j]) * s;
    }
    out[2 * i] = sum;
    out[2 * i + 1] = min_term_k4(m, s16);
  }
}

void q4_k(const BlockQ4_K* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out) {
  q45_k<false>(w, q, s16, nb, out);
}
void q5_k(const BlockQ5_K* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out) {
  q45_k<true>(w, q, s16, nb, out);
}

// Weights 128h + 32k + l: nibble (k / 2 ? high : low) of ql[64h + 32(k % 2) + l], top two bits
// from bits 2k, 2k+1 of qh[32h + l]; stored offset by 32 (the offset is taken off in the sum).
void q6_k(const BlockQ6_K* w, const int8_t* q, const int16_t* s16, int64_t nb, int32_t* out) {
  for (int64_t i = 0; i < nb; ++i, q += kSuperBlock, s16 += 16) {
    int32_t sum = 0;
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int half = 0; half < 2; ++half) {
          int32_t s = 0;
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const uint8_t lq = w[i].ql[64 * h + 32 * (k % 2) + l];
            const int32_t v = ((k / 2) ? (lq >> 4) : (lq & 0xF)) | (((w[i].qh[32 * h + l] >> (2 * k)) & 3) << 4);
            s += v * int32_t(q[128 * h + 32 * k + l]);
          }
          sum += int32_t(w[i].scales[8 * h + 2 * k + half]) * s;
        }
    out[i] = sum - offset_term_q6(w[i].scales, s16);
  }
}

// The legacy 32-weight formats: quant l is the low (l < 16) or high nibble of qs[l % 16], plus 16
// where bit l of qh is set (Q5_*); kOffset is taken off (Q4_0, Q5_0), or the IQ4_NL table applied.
template <class Block, bool kFiveBit, int kOffset, bool kTable = false>
void legacy(const Block* w, const int8_t* q, int64_t nb, int32_t* out) {
  for (int64_t i = 0; i < nb; ++i, q += 32) {
    uint32_t high = 0;
    if constexpr (kFiveBit) high = q5_high_bits(w[i].qh);
    int32_t s = 0;
    for (int l = 0; l < 32; ++l) {
      int32_t v = l < 16 ? (w[i].qs[l] & 0xF) : (w[i].qs[l - 16] >> 4);
      if constexpr (kFiveBit) v |= int32_t((high >> l) & 1) << 4;
      if constexpr (kTable) v = kIq4nlValues[v];
      else v -= kOffset;
      s += v * int32_t(q[l]);
    }
    out[i] = s;
  }
}

void q4_0(const BlockQ4_0* w, const int8_t* q, int64_t nb, int32_t* out) { legacy<BlockQ4_0, false, 8>(w, q, nb, out); }
void q4_1(const BlockQ4_1* w, const int8_t* q, int64_t nb, int32_t* out) { legacy<BlockQ4_1, false, 0>(w, q, nb, out); }
void q5_0(const BlockQ5_0* w, const int8_t* q, int64_t nb, int32_t* out) { legacy<BlockQ5_0, true, 16>(w, q, nb, out); }
void q5_1(const BlockQ5_1* w, const int8_t* q, int64_t nb, int32_t* out) { legacy<BlockQ5_1, true, 0>(w, q, nb, out); }
void iq4_nl(const BlockIQ4_NL* w, const int8_t* q, int64_t nb, int32_t* out) {
  legacy<BlockIQ4_NL, false, 0, true>(w, q, nb, out);
}

}  // namespace

const Q8Kernels kQ8Scalar = {q8_0, q4_k, q5_k, q6_k, q4_0, q4_1, q5_0, q5_1, iq4_nl};

}  // namespace spill::quant::detail
