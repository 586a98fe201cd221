// Quantizers: for each block, the scales, mins and quants that minimise the (importance-)weighted
// squared error of the weights as the dequantizer will reconstruct them.
//
// Every two-level format (a float super-scale times small integer sub-block scales) is fitted in
// three steps:
//   1. each sub-block gets its best float scale (and min) by a search over candidate scales, each
//      refined by weighted least squares on the quants it rounds to (as ggml's make_qkx2_quants /
//      make_qx_quants do);
//   2. the super-scale (and super-min) starts at the value that fits the largest sub-scale;
//   3. given the super-scale rounded to f16, each sub-block picks its integer scale (and min)
//      among the neighbours of its ideal one by the error of the re-rounded quants, computed
//      exactly as dequantize_row will compute the weights; then the super-scale is refitted by
//      least squares over the whole block and step 3 repeats while the error falls.
// Step 3 is where this beats rounding each float to its grid: the scale codes, the f16 rounding
// and the quants are chosen together against the real reconstruction.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace spill::quant {

namespace {

constexpr float kF16Max = 65504.0f;

int nearest(float v) { return int(std::nearbyint(v)); }
float f16_round(float v) { return f16_to_f32(f32_to_f16(v)); }

// The values a quant can take, as the dequantizer multiplies them: consecutive integers, or a
// table (sorted here, with `code` mapping a sorted position back to the stored 4-bit code).
struct Levels {
  int count;
  int qmin;                       // linear levels: qmin, qmin+1, ..., qmin+count-1
  const int8_t* table = nullptr;  // or these, ascending
  const uint8_t* code = nullptr;  // stored code of table[i] (identity when null)

  float value(int i) const { return table ? float(table[i]) : float(qmin + i); }
  float lowest() const { return value(0); }
  float highest() const { return value(count - 1); }
  uint8_t stored(int i) const { return code ? code[i] : uint8_t(i); }
};

const Levels kLinear8{256, -128};
const Levels kLinear6{64, -32};
const Levels kLinear5u{32, 0};
const Levels kLinear4u{16, 0};
const Levels kLinear3{8, -4};
const Levels kLinear2u{4, 0};
const Levels kIq4{16, 0, kIq4nlValues};
const Levels kLinear4{16, -8};
const Levels kLinear5{32, -16};
// kFp4Values sorted (its two zeros are one level) and the codes that store them.
constexpr int8_t kFp4Sorted[15] = {-12, -8, -6, -4, -3, -2, -1, 0, 1, 2, 3, 4, 6, 8, 12};
constexpr uint8_t kFp4Codes[15] = {15, 14, 13, 12, 11, 10, 9, 0, 1, 2, 3, 4, 5, 6, 7};
const Levels kFp4{15, 0, kFp4Sorted, kFp4Codes};

// The search evaluates thousands of candidate scales per block, so its inner loop works on eight
// weights at a time (GCC/Clang vector extensions: AVX2 on x86-64-v3, SSE pairs elsewhere).
typedef float F8 __attribute__((vector_size(32)));
inline F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline F8 splat(float a) { return F8{a, a, a, a, a, a, a, a}; }
inline float lanes_sum(F8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}
// Round to nearest (ties to even) for |v| < 2^22, by the float adder itself.
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23

// For a sub-block x[0:n] (n a multiple of 8) reconstructed as dl * level - ml with each weight
// at its nearest level: the weighted squared error (computed as the dequantizer reconstructs),
// and the weighted sums of level, level^2 and x * level that least squares needs.
struct FitStats {
  float err = 0, sl = 0, sll = 0, sxl = 0;
};

// The nearest level of each of eight weights, as level values.
inline F8 nearest_levels(F8 xv, float dl, float ml, float inv, const Levels& lv) {
  F8 t = (xv + splat(ml)) * splat(inv);
  if (!lv.table) {
    const F8 lo = splat(lv.lowest()), hi = splat(lv.highest());
    t = t < lo ? lo : t;
    t = t > hi ? hi : t;
    return (t + splat(kRoundMagic)) - splat(kRoundMagic);
  }
  // Tables: start at the lowest level and step up past every midpoint t exceeds (the order of
  // levels does not matter: |x - (dl v - ml)| = |dl| |t - v| for either sign of dl).
  F8 v = splat(lv.value(0));
  for (int j = 0; j + 1 < lv.count; ++j) {
    const float mid = 0.5f * (lv.value(j) + lv.value(j + 1));
    v = t > splat(mid) ? splat(lv.value(j + 1)) : v;
  }
  return v;
}

FitStats fit_stats(const float* x, const float* w, int n, float dl, float ml, const Levels& lv) {
  if (std::fabs(dl) < 1e-30f) dl = 0;  // (and no infinite reciprocal)
  const float inv = dl != 0 ? 1.0f / dl : 0.0f;
  F8 err = splat(0), sl = err, sll = err, sxl = err;
  for (int i = 0; i < n; i += 8) {
    const F8 xv = load8(x + i), wv = load8(w + i);
    const F8 l = nearest_levels(xv, dl, ml, inv, lv);
    const F8 diff = splat(dl) * l - splat(ml) - xv;
    err += wv * diff * diff;
    const F8 wl = wv * l;
    sl += wl;
    sll += wl * l;
    sxl += wl * xv;
  }
  return {lanes_sum(err), lanes_sum(sl), lanes_sum(sll), lanes_sum(sxl)};
}

float fit_error(const float* x, const float* w, int n, float dl, float ml, const Levels& lv) {
  return fit_stats(x, w, n, dl, ml, lv).err;
}

// The positions (in lv) of the levels fit_stats chose.
void assign_levels(const float* x, int n, float dl, float ml, const Levels& lv, uint8_t* idx) {
  if (std::fabs(dl) < 1e-30f) dl = 0;
  const float inv = dl != 0 ? 1.0f / dl : 0.0f;
  for (int i = 0; i < n; i += 8) {
    const F8 l = nearest_levels(load8(x + i), dl, ml, inv, lv);
    for (int k = 0; k < 8; ++k) {
      int pos = 0;
      if (!lv.table) pos = int(l[k]) - lv.qmin;
      else
        while (lv.value(pos) != l[k]) ++pos;
      idx[i + k] = uint8_t(pos);
    }
  }
}

// Step 1 for scale-only sub-blocks: the float scale s minimising sum w (s * level - x)^2. Each
// candidate maps the largest weight to one end of the level range, a tenth of a level apart, and
// is refined once by least squares on the levels it rounds to.
float fit_scale(const float* x, const float* w, int n, const Levels& lv, int ntry) {
  int im = 0;
  for (int i = 1; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(x[im])) im = i;
  const float xm = x[im];
  if (xm == 0) return 0;
  const float spacing = (lv.highest() - lv.lowest()) / float(lv.count - 1);
  float best_s = 0, best_err = std::numeric_limits<float>::infinity();
  for (float target : {lv.lowest(), lv.highest()}) {
    for (int k = -ntry; k <= ntry; ++k) {
      const float denom = target + 0.15f * spacing * float(k);
      if (denom == 0 || (denom > 0) != (target > 0)) continue;
      const float s = xm / denom;
      const FitStats st = fit_stats(x, w, n, s, 0, lv);
      if (st.err < best_err) best_err = st.err, best_s = s;
      if (st.sll <= 0) continue;
      const float s2 = st.sxl / st.sll;
      const float e2 = fit_error(x, w, n, s2, 0, lv);
      if (e2 < best_err) best_err = e2, best_s = s2;
    }
  }
  return best_s;
}

// Step 1 for scale-and-min sub-blocks: x ~ s * q - m with q in [0, qmax], s, m >= 0. Candidates
// spread the range [min(x, 0), max(x)] over qmax - 1 to qmax + 1 steps, each refined by least
// squares on its levels (twice).
// With free_min (Q4_1, Q5_1: w = d q + m with m of either sign) the min is not held at m >= 0.
void fit_scale_min(const float* x, const float* w, int n, const Levels& lv, float& s_out, float& m_out,
                   bool free_min = false) {
  float lo = x[0], hi = x[0];
  float sw = 0, swx = 0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sw += w[i];
    swx += w[i] * x[i];
  }
  if (!free_min) lo = std::min(lo, 0.0f);
  if (hi == lo) {
    s_out = 0;
    m_out = -lo;
    return;
  }
  const int qmax = lv.count - 1;
  float best_s = float(hi - lo) / float(qmax), best_m = -lo;
  float best_err = fit_error(x, w, n, best_s, best_m, lv);
  auto refine = [&](float s, float m) {
    for (int pass = 0; pass < 3; ++pass) {
      const FitStats st = fit_stats(x, w, n, s, m, lv);
      if (st.err < best_err) best_err = st.err, best_s = s, best_m = m;
      if (pass == 2) return;
      const double D = double(sw) * st.sll - double(st.sl) * st.sl;
      if (D <= 0) return;
      double ns = (double(sw) * st.sxl - double(swx) * st.sl) / D;
      double b = (double(st.sll) * swx - double(st.sl) * st.sxl) / D;  // x ~ ns * l + b, b = -m
      if (b > 0 && !free_min) {
        b = 0;
        ns = double(st.sxl) / st.sll;
      }
      if (!(ns > 0)) return;
      s = float(ns);
      m = float(-b);
    }
  };
  for (int k = 0; k <= 10; ++k) {
    const float iscale = (float(qmax) - 1.0f + 0.2f * float(k)) / (hi - lo);
    if (iscale <= 0) continue;
    refine(1.0f / iscale, -lo);
  }
  s_out = best_s;
  m_out = best_m;
}

// ---- steps 2 and 3: a super-block of sub-blocks with integer scale (and min) codes ----------
struct SuperSpec {
  int sub;                  // weights per sub-block
  int nsub;                 // sub-blocks per block
  const Levels* levels;     // the quants
  int cmin, cmax;           // the scale codes' range (the dequantizer's multiplier)
  bool has_min;             // mins: codes in [0, mmax]
  int mmax;
};

struct SuperFit {
  float d = 0, dmin = 0;  // f16-exact
  int code[16] = {}, mcode[16] = {};
  uint8_t idx[256] = {};
  float err = std::numeric_limits<float>::infinity();
};

// Step 3 for fixed (d, dmin): every sub-block's best codes near its ideal ones.
SuperFit choose_codes(const SuperSpec& sp, const float* x, const float* w, const float* s, const float* m, float d,
                      float dmin) {
  SuperFit f;
  f.d = d;
  f.dmin = dmin;
  f.err = 0;
  for (int j = 0; j < sp.nsub; ++j) {
    const float* xj = x + j * sp.sub;
    const float* wj = w + j * sp.sub;
    const int c0 = d != 0 ? std::clamp(nearest(s[j] / d), sp.cmin, sp.cmax) : 0;
    const int m0 = sp.has_min && dmin != 0 ? std::clamp(nearest(m[j] / dmin), 0, sp.mmax) : 0;
    float best = std::numeric_limits<float>::infinity();
    int bc = c0, bm = m0;
    for (int c = std::max(sp.cmin, c0 - 1); c <= std::min(sp.cmax, c0 + 1); ++c) {
      const float dl = d * float(c);
      const int mlo = sp.has_min ? std::max(0, m0 - 1) : 0, mhi = sp.has_min ? std::min(sp.mmax, m0 + 1) : 0;
      for (int mc = mlo; mc <= mhi; ++mc) {
        const float ml = dmin * float(mc);
        const float e = fit_error(xj, wj, sp.sub, dl, ml, *sp.levels);
        if (e < best) best = e, bc = c, bm = mc;
      }
    }
    f.code[j] = bc;
    f.mcode[j] = bm;
    f.err += best;
    assign_levels(xj, sp.sub, d * float(bc), dmin * float(bm), *sp.levels, f.idx + j * sp.sub);
  }
  return f;
}

// Least-squares super-scale (and super-min) for the codes and quants of f: x ~ d * c_j * l - dmin * mc_j.
void refit_super(const SuperSpec& sp, const float* x, const float* w, const SuperFit& f, float& d, float& dmin) {
  double saa = 0, sab = 0, sbb = 0, sxa = 0, sxb = 0;
  for (int j = 0; j < sp.nsub; ++j)
    for (int i = 0; i < sp.sub; ++i) {
      const int k = j * sp.sub + i;
      const double a = double(f.code[j]) * sp.levels->value(f.idx[k]);
      const double b = -double(f.mcode[j]);
      saa += w[k] * a * a;
      sab += w[k] * a * b;
      sbb += w[k] * b * b;
      sxa += w[k] * a * x[k];
      sxb += w[k] * b * x[k];
    }
  d = f.d;
  dmin = f.dmin;
  if (!sp.has_min || sbb == 0) {
    if (saa > 0) d = float(sxa / saa);
    return;
  }
  const double D = saa * sbb - sab * sab;
  if (D <= 0) return;
  d = float((sxa * sbb - sxb * sab) / D);
  dmin = float((saa * sxb - sab * sxa) / D);
}

void check_f16_range(float v, DType t) {
  if (!(std::fabs(v) <= kF16Max))
    fail("cannot quantize to {}: a block's scale ({}) does not fit the format's f16 field; the weights are too large",
         dtype_name(t), v);
}

SuperFit fit_super_block(const SuperSpec& sp, const float* x, const float* w, DType t) {
  float s[16], m[16] = {};
  for (int j = 0; j < sp.nsub; ++j) {
    if (sp.has_min) fit_scale_min(x + j * sp.sub, w + j * sp.sub, sp.sub, *sp.levels, s[j], m[j]);
    else s[j] = fit_scale(x + j * sp.sub, w + j * sp.sub, sp.sub, *sp.levels, 5);
  }
  // Step 2: starting super-scales that fit the largest sub-scale (at either end of the code range).
  int jm = 0;
  float m_largest = 0;
  for (int j = 0; j < sp.nsub; ++j) {
    if (std::fabs(s[j]) > std::fabs(s[jm])) jm = j;
    m_largest = std::max(m_largest, m[j]);
  }
  const float dmin0 = sp.has_min ? m_largest / float(sp.mmax) : 0.0f;
  float starts[2] = {std::fabs(s[jm]) / float(sp.cmax), sp.cmin < 0 ? s[jm] / float(sp.cmin) : 0.0f};
  SuperFit best;
  for (float d0 : starts) {
    if (d0 == 0 && starts[0] != 0) continue;
    float d = d0, dmin = dmin0;
    for (int iter = 0; iter < 4; ++iter) {
      check_f16_range(d, t);
      check_f16_range(dmin, t);
      SuperFit f = choose_codes(sp, x, w, s, m, f16_round(d), f16_round(dmin));
      const bool improved = f.err < best.err;
      if (improved) best = f;
      if (!improved && iter > 0) break;
      refit_super(sp, x, w, f, d, dmin);
    }
  }
  return best;
}

// ---- per format: pack the fit into ggml's bytes -------------------------------------------
const SuperSpec kQ6K{16, 16, &kLinear6, -128, 127, false, 0};
const SuperSpec kQ5K{32, 8, &kLinear5u, 0, 63, true, 63};
const SuperSpec kQ4K{32, 8, &kLinear4u, 0, 63, true, 63};
const SuperSpec kQ3K{16, 16, &kLinear3, -32, 31, false, 0};
const SuperSpec kQ2K{16, 16, &kLinear2u, 0, 15, true, 15};
const SuperSpec kIQ4XS{32, 8, &kIq4, -32, 31, false, 0};

void pack_q6_k(const SuperFit& f, BlockQ6_K& b) {
  std::memset(&b, 0, sizeof b);
  b.d = f32_to_f16(f.d);
  for (int k = 0; k < 16; ++k) b.scales[k] = int8_t(f.code[k]);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* u = f.idx + 128 * h;  // idx = q + 32, 0..63
    for (int l = 0; l < 32; ++l) {
      b.ql[64 * h + l] = uint8_t((u[l] & 0xF) | ((u[l + 64] & 0xF) << 4));
      b.ql[64 * h + 32 + l] = uint8_t((u[l + 32] & 0xF) | ((u[l + 96] & 0xF) << 4));
      b.qh[32 * h + l] = uint8_t((u[l] >> 4) | ((u[l + 32] >> 4) << 2) | ((u[l + 64] >> 4) << 4) | ((u[l + 96] >> 4) << 6));
    }
  }
}

template <bool kFiveBit, class Block>
void pack_q45_k(const SuperFit& f, Block& b) {
  std::memset(&b, 0, sizeof b);
  b.d = f32_to_f16(f.d);
  b.dmin = f32_to_f16(f.dmin);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) sc[j] = uint8_t(f.code[j]), mn[j] = uint8_t(f.mcode[j]);
  pack_scale_min_k4(sc, mn, b.scales);
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo = f.idx[64 * p + l], hi = f.idx[64 * p + 32 + l];
      b.qs[32 * p + l] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
      if constexpr (kFiveBit) b.qh[l] |= uint8_t(((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
    }
}

void pack_q3_k(const SuperFit& f, BlockQ3_K& b) {
  std::memset(&b, 0, sizeof b);
  b.d = f32_to_f16(f.d);
  uint8_t sc[16];
  for (int k = 0; k < 16; ++k) sc[k] = uint8_t(f.code[k] + 32);
  pack_scales_q3(sc, b.scales);
  for (int h = 0; h < 2; ++h)
    for (int plane = 0; plane < 4; ++plane)
      for (int l = 0; l < 32; ++l) {
        const uint8_t u = f.idx[128 * h + 32 * plane + l];  // q + 4, 0..7
        b.qs[32 * h + l] |= uint8_t((u & 3) << (2 * plane));
        if (u & 4) b.hmask[l] |= uint8_t(1 << (4 * h + plane));
      }
}

void pack_q2_k(const SuperFit& f, BlockQ2_K& b) {
  std::memset(&b, 0, sizeof b);
  b.d = f32_to_f16(f.d);
  b.dmin = f32_to_f16(f.dmin);
  for (int k = 0; k < 16; ++k) b.scales[k] = uint8_t(f.code[k] | (f.mcode[k] << 4));
  for (int h = 0; h < 2; ++h)
    for (int plane = 0; plane < 4; ++plane)
      for (int l = 0; l < 32; ++l) b.qs[32 * h + l] |= uint8_t(f.idx[128 * h + 32 * plane + l] << (2 * plane));
}

void pack_iq4_xs(const SuperFit& f, BlockIQ4_XS& b) {
  std::memset(&b, 0, sizeof b);
  b.d = f32_to_f16(f.d);
  for (int j = 0; j < 8; ++j) {
    const int ls = f.code[j] + 32;
    b.scales_l[j / 2] |= uint8_t((ls & 0xF) << (4 * (j % 2)));
    b.scales_h |= uint16_t((ls >> 4) << (2 * j));
    for (int l = 0; l < 16; ++l) b.qs[16 * j + l] = uint8_t(f.idx[32 * j + l] | (f.idx[32 * j + 16 + l] << 4));
  }
}

// Q8_0: one f16 scale per 32 weights, ggml's: amax / 127, which keeps the block's largest weight
// on the grid. Each weight then takes the level nearest to it at the scale as stored (f16), where
// ggml rounds against the unrounded scale: no weight is further from its value than in ggml's
// block. Searching the scale (fit_scale, or the f16 neighbours by weighted error) lowered the RMSE
// by clipping the largest weights but raised the mean KL divergence under llama-perplexity
// (docs/perf/quant-quality-2026-12-04.md): at 8 bits the few large weights matter more than the
// sum of the small rounding errors. `w` is not used.
void quantize_q8_0_block(const float* x, const float* /*w*/, BlockQ8_0& b) {
  float amax = 0.0f;
  bool finite = true;
  for (int l = 0; l < 32; ++l) {
    finite &= std::isfinite(x[l]);
    amax = std::max(amax, std::fabs(x[l]));
  }
  const float s = finite ? amax / 127.0f : std::numeric_limits<float>::infinity();
  check_f16_range(s, DType::Q8_0);
  b.d = f32_to_f16(s);
  uint8_t idx[32];
  assign_levels(x, 32, f16_to_f32(b.d), 0, kLinear8, idx);
  for (int l = 0; l < 32; ++l) b.qs[l] = int8_t(int(idx[l]) - 128);
}

// Q4_0, Q5_0, IQ4_NL: one f16 scale per 32 weights, as Q8_0, over 16 or 32 levels.
template <class Block>
void quantize_scaled32_block(const float* x, const float* w, const Levels& lv, DType t, Block& b) {
  const float s = fit_scale(x, w, 32, lv, 7);
  check_f16_range(s, t);
  const uint16_t h = f32_to_f16(s);
  float best = std::numeric_limits<float>::infinity();
  uint16_t best_h = h;
  for (int delta = -2; delta <= 2; ++delta) {
    const uint16_t c = uint16_t(h + delta);
    if (((c ^ h) & 0x8000) || ((c >> 10) & 0x1F) == 0x1F) continue;  // same sign, finite
    const float e = fit_error(x, w, 32, f16_to_f32(c), 0, lv);
    if (e < best) best = e, best_h = c;
  }
  uint8_t idx[32];
  assign_levels(x, 32, f16_to_f32(best_h), 0, lv, idx);
  std::memset(&b, 0, sizeof b);
  b.d = best_h;
  for (int l = 0; l < 16; ++l) b.qs[l] = uint8_t((lv.stored(idx[l]) & 0xF) | ((lv.stored(idx[l + 16]) & 0xF) << 4));
  if constexpr (requires { b.qh; }) {
    uint32_t high = 0;
    for (int l = 0; l < 32; ++l) high |= uint32_t(lv.stored(idx[l]) >> 4) << l;
    for (int k = 0; k < 4; ++k) b.qh[k] = uint8_t(high >> (8 * k));
  }
}

// Q4_1, Q5_1: an f16 scale and an f16 min (of either sign) per 32 weights, w = d q + m. The fitted
// pair, and the least-squares pair for the quants it rounds to, are each tried with their f16
// neighbours, every candidate's quants re-rounded and its error computed as dequantized.
template <class Block>
void quantize_affine32_block(const float* x, const float* w, const Levels& lv, DType t, Block& b) {
  float s, neg_m;  // x ~ s * q - neg_m
  fit_scale_min(x, w, 32, lv, s, neg_m, /*free_min=*/true);
  check_f16_range(s, t);
  check_f16_range(neg_m, t);
  float best = std::numeric_limits<float>::infinity();
  uint16_t best_d = 0, best_m = 0;
  auto try_around = [&](float d, float m) {
    const uint16_t hd = f32_to_f16(d), hm = f32_to_f16(m);
    for (int dd = -1; dd <= 1; ++dd)
      for (int dm = -1; dm <= 1; ++dm) {
        const uint16_t cd = uint16_t(hd + dd), cm = uint16_t(hm + dm);
        if (((cd ^ hd) & 0x8000) || ((cd >> 10) & 0x1F) == 0x1F) continue;
        if (((cm ^ hm) & 0x8000) || ((cm >> 10) & 0x1F) == 0x1F) continue;
        const float e = fit_error(x, w, 32, f16_to_f32(cd), -f16_to_f32(cm), lv);
        if (e < best) best = e, best_d = cd, best_m = cm;
      }
  };
  try_around(s, -neg_m);
  // Least squares for (d, m) on the quants the best pair gives, then its neighbours too.
  uint8_t idx[32];
  assign_levels(x, 32, f16_to_f32(best_d), -f16_to_f32(best_m), lv, idx);
  double sw = 0, sq = 0, sqq = 0, sx = 0, sxq = 0;
  for (int l = 0; l < 32; ++l) {
    const double q = lv.value(idx[l]);
    sw += w[l], sq += w[l] * q, sqq += w[l] * q * q, sx += w[l] * x[l], sxq += w[l] * x[l] * q;
  }
  const double D = sw * sqq - sq * sq;
  if (D > 0) {
    const double d = (sw * sxq - sq * sx) / D, m = (sqq * sx - sq * sxq) / D;
    if (std::fabs(d) <= kF16Max && std::fabs(m) <= kF16Max && d >= 0) try_around(float(d), float(m));
  }
  assign_levels(x, 32, f16_to_f32(best_d), -f16_to_f32(best_m), lv, idx);
  std::memset(&b, 0, sizeof b);
  b.d = best_d;
  b.m = best_m;
  for (int l = 0; l < 16; ++l) b.qs[l] = uint8_t((idx[l] & 0xF) | ((idx[l + 16] & 0xF) << 4));
  if constexpr (requires { b.qh; }) {
    uint32_t high = 0;
    for (int l = 0; l < 32; ++l) high |= uint32_t(idx[l] >> 4) << l;
    for (int k = 0; k < 4; ++k) b.qh[k] = uint8_t(high >> (8 * k));
  }
}

// MXFP4: the shared exponent that rounds the block best, among those near its largest weight's.
void quantize_mxfp4_block(const float* x, const float* w, BlockMXFP4& b) {
  float amax = 0;
  for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[l]));
  // The largest doubled e2m1 value is 12, so 2^(e-128) * 12 ~ amax: e ~ log2(amax / 6) + 127.
  const int e0 = amax > 0 ? int(std::floor(std::log2(amax))) - 2 + 127 : 0;
  float best = std::numeric_limits<float>::infinity();
  int best_e = std::clamp(e0, 0, 254);
  for (int e = e0 - 1; e <= e0 + 2; ++e) {
    if (e < 0 || e > 254) continue;
    const float err = fit_error(x, w, 32, e8m0_half_to_f32(uint8_t(e)), 0, kFp4);
    if (err < best) best = err, best_e = e;
  }
  uint8_t idx[32];
  assign_levels(x, 32, e8m0_half_to_f32(uint8_t(best_e)), 0, kFp4, idx);
  b.e = uint8_t(best_e);
  for (int l = 0; l < 16; ++l) b.qs[l] = uint8_t(kFp4.stored(idx[l]) | (kFp4.stored(idx[l + 16]) << 4));
}

template <class Block, class Pack>
void quantize_super(DType t, const SuperSpec& sp, const float* x, const float* w, void* dst, int64_t n, Pack pack) {
  Block* b = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i) pack(fit_super_block(sp, x + i * kSuperBlock, w + i * kSuperBlock, t), b[i]);
}

template <class Block, class Fit>
void quantize_blocks32(const float* x, const float* w, void* dst, int64_t n, Fit fit) {
  Block* b = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / 32; ++i) fit(x + 32 * i, w + 32 * i, b[i]);
}

}  // namespace

void default_error_weights(DType t, const float* x, int64_t n, float* w) {
  if (t == DType::Q6_K || t == DType::Q8_0) {
    for (int64_t i = 0; i < n; ++i) w[i] = x[i] * x[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) w[i] = 1.0f;
}

void quantize_row(DType t, const float* src, void* dst, int64_t n, const float* importance) {
  if (!row_fits(t, n))
    fail("cannot quantize a row of {} weights to {}: rows must be whole blocks of {}", n, dtype_name(t),
         dtype_block_elems(t));
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(src[i])) fail("cannot quantize to {}: weight {} of the row is {}", dtype_name(t), i, src[i]);
    if (importance && !(importance[i] >= 0 && std::isfinite(importance[i])))
      fail("cannot quantize to {}: importance {} of the row is {} (importance must be finite and >= 0)",
           dtype_name(t), i, importance[i]);
  }
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case DType::F16: {
      uint16_t* p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      uint16_t* p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(src[i]);
      return;
    }
    default: break;
  }
  // Per-block weights: the importance row, or 1; a block whose importance is all zero is fitted
  // unweighted (any fit is as good as any other for it, and the least-squares steps need a weight).
  const int64_t be = dtype_block_elems(t);
  std::vector<float> weights(size_t(n), 1.0f);
  std::vector<float> emphasis;
  if (!importance) {
    emphasis.resize(size_t(n));
    default_error_weights(t, src, n, emphasis.data());
    importance = emphasis.data();
  }
  if (importance)
    for (int64_t b0 = 0; b0 < n; b0 += be) {
      double sum = 0;
      for (int64_t i = b0; i < b0 + be; ++i) sum += importance[i];
      if (sum > 0) std::copy(importance + b0, importance + b0 + be, weights.begin() + b0);
    }
  const float* w = weights.data();
  switch (t) {
    case DType::Q8_0: {
      BlockQ8_0* b = static_cast<BlockQ8_0*>(dst);
      for (int64_t i = 0; i < n / 32; ++i) quantize_q8_0_block(src + 32 * i, w + 32 * i, b[i]);
      return;
    }
    case DType::MXFP4: {
      BlockMXFP4* b = static_cast<BlockMXFP4*>(dst);
      for (int64_t i = 0; i < n / 32; ++i) quantize_mxfp4_block(src + 32 * i, w + 32 * i, b[i]);
      return;
    }
    case DType::Q4_0: quantize_blocks32<BlockQ4_0>(src, w, dst, n, [&](const float* x, const float* wx, BlockQ4_0& b) {
      quantize_scaled32_block(x, wx, kLinear4, t, b);
    }); return;
    case DType::Q5_0: quantize_blocks32<BlockQ5_0>(src, w, dst, n, [&](const float* x, const float* wx, BlockQ5_0& b) {
      quantize_scaled32_block(x, wx, kLinear5, t, b);
    }); return;
    case DType::IQ4_NL: quantize_blocks32<BlockIQ4_NL>(src, w, dst, n, [&](const float* x, const float* wx, BlockIQ4_NL& b) {
      quantize_scaled32_block(x, wx, kIq4, t, b);
    }); return;
    case DType::Q4_1: quantize_blocks32<BlockQ4_1>(src, w, dst, n, [&](const float* x, const float* wx, BlockQ4_1& b) {
      quantize_affine32_block(x, wx, kLinear4u, t, b);
    }); return;
    case DType::Q5_1: quantize_blocks32<BlockQ5_1>(src, w, dst, n, [&](const float* x, const float* wx, BlockQ5_1& b) {
      quantize_affine32_block(x, wx, kLinear5u, t, b);
    }); return;
    case DType::Q6_K: quantize_super<BlockQ6_K>(t, kQ6K, src, w, dst, n, pack_q6_k); return;
    case DType::Q5_K: quantize_super<BlockQ5_K>(t, kQ5K, src, w, dst, n, pack_q45_k<true, BlockQ5_K>); return;
    case DType::Q4_K: quantize_super<BlockQ4_K>(t, kQ4K, src, w, dst, n, pack_q45_k<false, BlockQ4_K>); return;
    case DType::Q3_K: quantize_super<BlockQ3_K>(t, kQ3K, src, w, dst, n, pack_q3_k); return;
    case DType::Q2_K: quantize_super<BlockQ2_K>(t, kQ2K, src, w, dst, n, pack_q2_k); return;
    case DType::IQ4_XS: quantize_super<BlockIQ4_XS>(t, kIQ4XS, src, w, dst, n, pack_iq4_xs); return;
    default: break;
  }
}

}  // namespace spill::quant
