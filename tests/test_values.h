// Values the numeric tests share: random inputs from the test's seeded generator, f32's rounding
// error bounds, and the masked logit.
#pragma once
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace spill::test {

// n normally distributed floats.
inline std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// f32's unit roundoff u = 2^-24 and Higham's gamma_m = m u / (1 - m u), the bound on the relative
// error of a result m f32 roundings deep.
inline constexpr double kF32Unit = 1.0 / 16777216.0;
inline double f32_gamma(int64_t m) { return double(m) * kF32Unit / (1.0 - double(m) * kF32Unit); }

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace spill::test
