// The arithmetic the CPU sampler (sampler.cpp) and the CUDA sampler (backend/cuda/sampling.cu)
// share, written once for host and device so that both pick the same token bit for bit.
//
// Why not plain floating-point sums: a GPU adds a row's weights in parallel, in an order a CPU loop
// does not, and double addition is not associative; std::exp and CUDA's exp also differ in the last
// bit. So a draw is defined on integers, where order does not matter:
//   * weight w = sampling_exp(s - s_max) in (0, 1], computed here with fma, rint and ldexp only (each
//     correctly rounded on both sides, and fma is explicit so no compiler contracts differently);
//   * mass q = floor(w * 2^45), a uint64; a row's total is below 2^63 for any vocabulary under 2^18,
//     and tokens with w < 2^-45 (less than 3e-14 of the top token's probability) get no mass;
//   * tokens are ranked by a 64-bit key (score, then lower id first: the CPU's MoreLikely order),
//     and every selection (top-k, top-p's cut, the draw) is "the least likely token whose mass
//     before it, in key order, is <= a threshold", a pure function of the integer masses.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/philox.h"

namespace spill {

// Most logits per row a sampler accepts: 2^18 masses of at most 2^45 sum below 2^63.
inline constexpr uint64_t kMaxSampledVocab = uint64_t(1) << 18;

// Mass of a weight of 1 (the top token): 2^45.
inline constexpr double kSamplingMassOne = 35184372088832.0;

// exp(x) for x <= 0: 0 below -708 (and for -inf / NaN). About 1 ulp accurate; what matters is that
// host and device compute the same bits.
SPILL_HOST_DEVICE inline double sampling_exp(double x) {
  if (!(x > -708.0)) return 0.0;
  const double n = ::rint(x * 1.4426950408889634);        // x / ln 2, to the nearest integer
  double r = ::fma(-n, 6.93147180369123816490e-01, x);     // ln 2 high part (exact times n)
  r = ::fma(-n, 1.90821492927058770002e-10, r);            // ln 2 low part; |r| <= 0.35
  // Taylor series to degree 13 (remainder < 1e-17 on |r| <= 0.35), Horner with fma.
  double p = 1.0 / 6227020800.0;
  p = ::fma(p, r, 1.0 / 479001600.0);
  p = ::fma(p, r, 1.0 / 39916800.0);
  p = ::fma(p, r, 1.0 / 3628800.0);
  p = ::fma(p, r, 1.0 / 362880.0);
  p = ::fma(p, r, 1.0 / 40320.0);
  p = ::fma(p, r, 1.0 / 5040.0);
  p = ::fma(p, r, 1.0 / 720.0);
  p = ::fma(p, r, 1.0 / 120.0);
  p = ::fma(p, r, 1.0 / 24.0);
  p = ::fma(p, r, 1.0 / 6.0);
  p = ::fma(p, r, 0.5);
  p = ::fma(p, r, 1.0);
  p = ::fma(p, r, 1.0);
  return ::ldexp(p, int(n));
}

// The weight of a score relative to the row's top score (scores already penalised and scaled by
// 1 / temperature; max_score is finite or +inf). +inf top scores (a model bug, or a forcing bias) share all the mass.
SPILL_HOST_DEVICE inline double sampling_weight(float score, float max_score) {
  if (max_score > 3.402823466e38f) return score == max_score ? 1.0 : 0.0;
  return sampling_exp(double(score) - double(max_score));
}

SPILL_HOST_DEVICE inline uint64_t sampling_mass(double weight) { return uint64_t(weight * kSamplingMassOne); }

// top_p's cut: tokens whose mass before them is below this are kept (at least 1: the top token).
SPILL_HOST_DEVICE inline uint64_t sampling_top_p_limit(float top_p, uint64_t total) {
  const uint64_t limit = uint64_t(double(top_p) * double(total));
  return limit > 0 ? limit : 1;
}

// The draw's position in [0, total]: the picked token is the least likely one whose mass before
// it is <= this (so a position equal to total, from rounding, picks the last token with mass).
SPILL_HOST_DEVICE inline uint64_t sampling_target(uint64_t seed, uint64_t index, uint64_t total) {
  return uint64_t(philox_uniform01(seed, index) * double(total));
}

// Ranking key: larger is more likely. Higher score first, then the lower id; -0 ranks as +0.
// Not for NaN (never a candidate).
SPILL_HOST_DEVICE inline uint64_t sampling_key(float score, int32_t token) {
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(score);
#else
  std::memcpy(&bits, &score, sizeof bits);
#endif
  if (score == 0.0f) bits = 0;
  const uint32_t ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (uint64_t(ordered) << 32) | uint64_t(~uint32_t(token));
}

SPILL_HOST_DEVICE inline int32_t sampling_key_token(uint64_t key) { return int32_t(~uint32_t(key)); }

// The presence / frequency penalty of a token generated `count` times (fma on both sides).
SPILL_HOST_DEVICE inline float sampling_count_penalty(float presence, float frequency, int32_t count) {
  return ::fmaf(frequency, float(count), presence);
}

}  // namespace spill
