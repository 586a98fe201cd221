// FP8 e4m3 (quant/fp8.h), the KV cache's format: decoding, rounding to nearest even, saturation and
// NaN, and the per-vector scale of quantize_kv_fp8. The GPU's conversion is compared with these bit
// for bit in tests/cuda_ops_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "quant/fp8.h"

namespace spill::quant {
namespace {

bool is_nan_code(uint8_t q) { return (q & 0x7Fu) == 0x7Fu; }

TEST(Fp8, DecodesTheFormatsValues) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);            // exponent 7 (the bias), mantissa 0
  EXPECT_EQ(e4m3_to_f32(0xB8), -1.0f);
  EXPECT_EQ(e4m3_to_f32(0x3C), 1.5f);
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);          // the largest finite value (no infinities)
  EXPECT_EQ(e4m3_to_f32(0x77), 240.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
  // Codes 0 .. 0x7E are the non-negative values in increasing order; the sign bit mirrors them.
  for (int c = 1; c <= 0x7E; ++c) {
    EXPECT_LT(e4m3_to_f32(uint8_t(c - 1)), e4m3_to_f32(uint8_t(c))) << c;
    EXPECT_EQ(e4m3_to_f32(uint8_t(c | 0x80)), -e4m3_to_f32(uint8_t(c)));
  }
}

TEST(Fp8, RoundsToNearestEvenAndSaturates) {
  // Every value encodes to itself.
  for (int c = 0; c < 256; ++c) {
    if (!is_nan_code(uint8_t(c))) {
      EXPECT_EQ(int(f32_to_e4m3(e4m3_to_f32(uint8_t(c)))), c) << c;
    }
  }
  // Between neighbours: the midpoint goes to the even code (mantissa bit 0 clear), anything off it to
  // the nearer one.
  for (int c = 0; c < 0x7E; ++c) {
    const double lo = e4m3_to_f32(uint8_t(c)), hi = e4m3_to_f32(uint8_t(c + 1));
    const double mid = (lo + hi) / 2;
    const int even = (c & 1) == 0 ? c : c + 1;
    for (const int sign : {0, 0x80}) {
      const double s = sign ? -1.0 : 1.0;
      EXPECT_EQ(int(f32_to_e4m3(float(s * mid))), even | sign) << "midpoint above code " << c;
      EXPECT_EQ(int(f32_to_e4m3(std::nextafter(float(s * mid), float(s * lo)))), c | sign) << c;
      EXPECT_EQ(int(f32_to_e4m3(std::nextafter(float(s * mid), float(s * hi)))), (c + 1) | sign) << c;
    }
  }
  // Beyond 448 (where 480 would be the next value) everything saturates, infinities included.
  for (const float x : {448.5f, 463.9f, 464.0f, 480.0f, 1e6f, 3e38f, INFINITY}) {
    EXPECT_EQ(int(f32_to_e4m3(x)), 0x7E) << x;
    EXPECT_EQ(int(f32_to_e4m3(-x)), 0xFE) << x;
  }
  // Below half the smallest subnormal: zero, keeping the sign.
  EXPECT_EQ(int(f32_to_e4m3(std::ldexp(1.0f, -11))), 0x00);
  EXPECT_EQ(int(f32_to_e4m3(-std::ldexp(1.0f, -11))), 0x80);
  EXPECT_TRUE(is_nan_code(f32_to_e4m3(NAN)));
}

TEST(Fp8, KvVectorsUseTheFullRangeWithinHalfAStep) {
  std::mt19937_64 rng(3);
  for (const float spread : {1e-3f, 1.0f, 40.0f, 3e4f}) {
    std::normal_distribution<float> d(0.0f, spread);
    std::vector<float> x(128);
    for (float& v : x) v = d(rng);
    x[17] = 0.0f;
    std::vector<uint8_t> q(x.size());
    const float scale = quantize_kv_fp8(x.data(), int64_t(x.size()), q.data());
    float amax = 0.0f;
    for (float v : x) amax = std::fmax(amax, std::fabs(v));
    ASSERT_EQ(scale, amax / kE4m3Max);
    int at_max = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      at_max += (q[i] & 0x7F) == 0x7E;
      // e4m3 keeps 4 significant bits: half a step is 2^-4 of the value (2^-10 of the scale in the
      // subnormal range); 448 / amax and the two products add a few f32 roundings.
      const double back = double(e4m3_to_f32(q[i])) * scale;
      const double bound = (std::ldexp(std::fabs(double(x[i])), -4) + std::ldexp(double(scale), -10)) * (1 + 1e-6);
      EXPECT_LE(std::fabs(back - x[i]), bound) << "spread " << spread << " value " << i;
      EXPECT_EQ(double(bf16_to_f32(kv_fp8_to_bf16(q[i], scale))), double(bf16_to_f32(f32_to_bf16(float(back)))));
    }
    EXPECT_GE(at_max, 1) << "the largest value is +-448 x scale";
    EXPECT_EQ(q[17] & 0x7F, 0);
  }
  // A vector of zeros: scale 0 (reads back as zeros); one with a non-finite value: scale NaN (reads
  // back as NaN, as a BF16 cache would hold the value).
  std::vector<float> zeros(64, 0.0f), bad(64, 1.0f);
  bad[5] = INFINITY;
  std::vector<uint8_t> q(64, 0xAA);
  EXPECT_EQ(quantize_kv_fp8(zeros.data(), 64, q.data()), 0.0f);
  for (uint8_t b : q) EXPECT_EQ(b, 0);
  std::fill(q.begin(), q.end(), 0xAA);
  EXPECT_TRUE(std::isnan(quantize_kv_fp8(bad.data(), 64, q.data())));
  for (uint8_t b : q) EXPECT_EQ(b, 0);
  EXPECT_TRUE(std::isnan(bf16_to_f32(kv_fp8_to_bf16(0, NAN))));
}

}  // namespace
}  // namespace spill::quant
