#include "quant/fp8.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace spill::quant {

uint8_t f32_to_e4m3(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint8_t sign = uint8_t((bits >> 24) & 0x80u);
  if (std::isnan(x)) return uint8_t(sign | 0x7Fu);
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return uint8_t(sign | 0x7Eu);  // saturate (infinities too)
  // a < 448 is a finite value below 2^9. e4m3's smallest normal is 2^-6 and its values are spaced
  // 2^(e-3) in binade [2^e, 2^(e+1)), 2^-9 in the subnormal range: scale a so that one spacing is
  // 1 and round to the nearest integer (ties to even), exactly, in double.
  int e;
  std::frexp(a, &e);  // a = m 2^e with m in [0.5, 1): a's binade is [2^(e-1), 2^e)
  int binade = e - 1;
  if (binade < -6) binade = -6;  // subnormals share the spacing of the lowest binade
  const double step = std::ldexp(1.0, binade - 3);
  const double units = std::nearbyint(double(a) / step);  // default rounding: to nearest even
  // units * step is the rounded magnitude; it may have carried into the next binade (or reached 448).
  const double r = units * step;
  if (r >= 448.0) return uint8_t(sign | 0x7Eu);
  if (r < std::ldexp(1.0, -6)) return uint8_t(sign | uint8_t(units));  // subnormal: mantissa = units
  int er;
  const double mr = std::frexp(r, &er);                    // r = mr 2^er, mr in [0.5, 1)
  const uint32_t exp_field = uint32_t(er - 1 + 7);         // biased exponent of binade [2^(er-1), 2^er)
  const uint32_t mant = uint32_t(std::lround((mr * 2.0 - 1.0) * 8.0));  // exact: r is on the grid
  return uint8_t(sign | (exp_field << 3) | mant);
}

float e4m3_to_f32(uint8_t q) {
  const bool neg = (q & 0x80u) != 0;
  const uint32_t exp_field = (q >> 3) & 0xFu, mant = q & 7u;
  if (exp_field == 0xF && mant == 7) return neg ? -NAN : NAN;
  const float mag = exp_field == 0 ? std::ldexp(float(mant), -9)  // subnormal: mant * 2^-6 / 8
                                   : std::ldexp(float(8 + mant), int(exp_field) - 7 - 3);
  return neg ? -mag : mag;
}

float quantize_kv_fp8(const float* x, int64_t n, uint8_t* q) {
  if (n <= 0) return 0.0f;
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::fmax(amax, std::fabs(x[i]));
  }
  if (!finite || amax == 0.0f) {
    std::memset(q, 0, size_t(n));
    return finite ? 0.0f : NAN;
  }
  const float scale = amax / kE4m3Max;
  const float inv = kE4m3Max / amax;
  for (int64_t i = 0; i < n; ++i) q[i] = f32_to_e4m3(x[i] * inv);
  return scale;
}

uint16_t kv_fp8_to_bf16(uint8_t q, float scale) { return f32_to_bf16(e4m3_to_f32(q) * scale); }

}  // namespace spill::quant
