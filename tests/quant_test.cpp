// The block-format dequantizers against llama.cpp's: fixtures made by gguf-py's numpy port of
// ggml-quants.c (tools/fixtures/make_quant_fixtures.py) on random blocks, compared bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/npy.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace {

using spill::DType;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

class DequantizeFixture : public ::testing::TestWithParam<DType> {};

TEST_P(DequantizeFixture, BitExactAgainstGgufPy) {
  const DType t = GetParam();
  const std::string base = std::string(SPILL_TEST_DATA) + "/quant/" + lower(spill::dtype_name(t));
  const std::vector<uint8_t> blocks = read_bytes(base + ".bin");
  const spill::NpyArray expected = spill::read_npy_f32(base + ".npy");
  const int64_t n = int64_t(expected.data.size());
  ASSERT_EQ(int64_t(blocks.size()), spill::row_bytes(t, n)) << "fixture sizes disagree";
  std::vector<float> got(size_t(n), -1.0f);
  spill::quant::dequantize_row(t, blocks.data(), got.data(), n);
  int mismatches = 0;
  for (int64_t i = 0; i < n && mismatches < 5; ++i) {
    if (bits_of(got[size_t(i)]) != bits_of(expected.data[size_t(i)])) {
      ADD_FAILURE() << spill::dtype_name(t) << " weight " << i << " (block " << i / spill::dtype_block_elems(t)
                    << "): spill " << got[size_t(i)] << ", gguf-py " << expected.data[size_t(i)];
      ++mismatches;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantizeFixture,
                         ::testing::Values(DType::F16, DType::BF16, DType::Q8_0, DType::Q6_K, DType::Q5_K,
                                           DType::Q4_K, DType::Q3_K, DType::Q2_K, DType::IQ4_XS, DType::MXFP4,
                                           DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL),
                         [](const auto& info) { return std::string(spill::dtype_name(info.param)); });

TEST(Dequantize, RejectsPartialBlocks) {
  std::vector<uint8_t> bytes(1024);
  std::vector<float> out(300);
  EXPECT_THROW(spill::quant::dequantize_row(DType::Q4_K, bytes.data(), out.data(), 300), spill::Error);
  EXPECT_THROW(spill::quant::dequantize_row(DType::Q8_0, bytes.data(), out.data(), 33), spill::Error);
}

}  // namespace

// ---- dot products ----------------------------------------------------------------------

namespace {

// Byte offsets of a block's f16 scale fields, and of its f16 min-scale (dmin) where it has one.
struct ScaleFields {
  std::vector<int> f16;  // every f16 field
  int d = -1;            // the field that scales the quants
  int dmin = -1;         // the field that scales the mins
};
ScaleFields scale_fields(DType t) {
  switch (t) {
    case DType::Q8_0: return {{0}, 0, -1};
    case DType::Q6_K: return {{208}, 208, -1};
    case DType::Q5_K:
    case DType::Q4_K: return {{0, 2}, 0, 2};
    case DType::Q3_K: return {{108}, 108, -1};
    case DType::Q2_K: return {{80, 82}, 80, 82};
    case DType::IQ4_XS: return {{0}, 0, -1};
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::IQ4_NL: return {{0}, 0, -1};
    case DType::Q4_1:
    case DType::Q5_1: return {{0, 2}, 0, 2};
    default: return {};
  }
}

// Random bytes of a row of n weights: uniform quants, finite f16 scales of sane size, e8m0
// exponents near 1, half-precision floats of moderate size.
std::vector<uint8_t> random_row(DType t, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> bytes(size_t(spill::row_bytes(t, n)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : bytes) b = uint8_t(byte(rng));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (t == DType::F32) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = normal(rng);
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
    return bytes;
  }
  if (t == DType::F16 || t == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = normal(rng);
      const uint16_t h = t == DType::F16 ? spill::f32_to_f16(v) : spill::f32_to_bf16(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
    return bytes;
  }
  const int64_t bb = spill::dtype_traits(t).block_bytes, nb = n / spill::dtype_block_elems(t);
  std::uniform_real_distribution<float> log_scale(-12.0f, -2.0f);
  std::uniform_int_distribution<int> exponent(118, 130);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* block = bytes.data() + i * bb;
    if (t == DType::MXFP4) block[0] = uint8_t(exponent(rng));
    for (int off : scale_fields(t).f16) {
      const uint16_t h = spill::f32_to_f16(std::exp2(log_scale(rng)));
      std::memcpy(block + off, &h, 2);
    }
  }
  return bytes;
}

// The row with one f16 field of every block set to zero (to separate d*q from the mins).
std::vector<uint8_t> zero_field(DType t, std::vector<uint8_t> bytes, int off) {
  const int64_t bb = spill::dtype_traits(t).block_bytes;
  for (size_t i = 0; i < bytes.size(); i += size_t(bb)) bytes[i + size_t(off)] = bytes[i + size_t(off) + 1] = 0;
  return bytes;
}

struct DotReference {
  double exact;      // float64 dot of the dequantized row
  double tolerance;  // fp32 rounding bound (see below)
};

// The dot kernels compute sum_j d_j * sum_i(q_i x_i) - m_j * sum_i(x_i) in fp32: every term passes
// through at most k = (n/16 + 12) roundings (products, the sub-block chain, the scale fma, the
// accumulator chain of n/32 sub-blocks per lane, the 4-step reduction, the final subtraction; plain
// floats add one per weight of the n % 32 tail, summed one at a time), and the dequantized weights
// the reference uses are themselves d_j q - m_j rounded twice. So
// |error| <= (k + 2) u sum_i (|d_j q_i| + |m_j|) |x_i| with u = 2^-24; d_j q_i and m_j come from
// dequantizing the row with dmin and then d zeroed.
DotReference dot_reference(DType t, const std::vector<uint8_t>& row, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size());
  std::vector<float> w(static_cast<size_t>(n)), quants(static_cast<size_t>(n)), mins(static_cast<size_t>(n), 0.0f);
  spill::quant::dequantize_row(t, row.data(), w.data(), n);
  const ScaleFields f = scale_fields(t);
  if (f.dmin >= 0) {
    spill::quant::dequantize_row(t, zero_field(t, row, f.dmin).data(), quants.data(), n);
    spill::quant::dequantize_row(t, zero_field(t, row, f.d).data(), mins.data(), n);
  } else {
    quants = w;
  }
  double exact = 0, magnitude = 0;
  for (int64_t i = 0; i < n; ++i) {
    exact += double(w[size_t(i)]) * double(x[size_t(i)]);
    magnitude += (std::fabs(double(quants[size_t(i)])) + std::fabs(double(mins[size_t(i)]))) * std::fabs(double(x[size_t(i)]));
  }
  const double k = double(n) / 16 + 12 + (spill::dtype_is_float(t) ? double(n % 32) : 0.0);
  return {exact, (k + 2) * std::ldexp(1.0, -24) * magnitude};
}

const DType kAllTypes[] = {DType::F32,  DType::F16,  DType::BF16,   DType::Q8_0,  DType::Q6_K, DType::Q5_K,
                           DType::Q4_K, DType::Q3_K,  DType::Q2_K,   DType::IQ4_XS, DType::MXFP4, DType::Q4_0,
                           DType::Q4_1, DType::Q5_0,  DType::Q5_1,   DType::IQ4_NL};

class DotTest : public ::testing::TestWithParam<DType> {};

TEST_P(DotTest, MatchesFloat64DotOfDequantizedRow) {
  const DType t = GetParam();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t be = std::max<int64_t>(spill::dtype_block_elems(t), 1);
  // One block, a few, and a decode-sized row; float types also get a ragged tail.
  for (int64_t blocks : {int64_t(1), int64_t(3), int64_t(2048 / be) + 1}) {
    int64_t n = blocks * be;
    if (spill::dtype_is_float(t)) n += 29;
    const std::vector<uint8_t> row = random_row(t, n, rng);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    const DotReference ref = dot_reference(t, row, x);
    const float got = spill::quant::dot(t, row.data(), x.data(), n);
    EXPECT_NEAR(double(got), ref.exact, ref.tolerance) << spill::dtype_name(t) << " n=" << n;
  }
}

TEST_P(DotTest, EveryKernelPathGivesTheSameBits) {
  const DType t = GetParam();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t be = spill::dtype_block_elems(t);
  int paths_compared = 0;
  for (int trial = 0; trial < 20; ++trial) {
    int64_t n = be * (1 + trial * 3);
    if (spill::dtype_is_float(t)) n += trial;
    const std::vector<uint8_t> row = random_row(t, n, rng);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    const float scalar = spill::quant::dot_on(spill::quant::KernelPath::Scalar, t, row.data(), x.data(), n);
    for (auto p : {spill::quant::KernelPath::Avx2, spill::quant::KernelPath::Avx512}) {
      if (!spill::quant::cpu_supports(p)) continue;
      const float v = spill::quant::dot_on(p, t, row.data(), x.data(), n);
      EXPECT_EQ(bits_of(v), bits_of(scalar)) << spill::quant::kernel_path_name(p) << " vs scalar, n=" << n;
      ++paths_compared;
    }
    EXPECT_EQ(bits_of(spill::quant::dot(t, row.data(), x.data(), n)), bits_of(scalar));
  }
  if (paths_compared == 0) GTEST_SKIP() << "this CPU has no vector path to compare with the scalar one";
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DotTest, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(spill::dtype_name(info.param)); });

// ---- the int8-activation path -----------------------------------------------------------

// Every rounded activation is within half a step of its float (d_b / 2), up to the f32 rounding of
// 127 / max and of x * that (two roundings of x, plus d_b's own: 4 ulp of |x| bounds them).
TEST(ActivationsQ8, RoundingIsWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {int64_t(32), int64_t(256), int64_t(256 * 5 + 96)}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng) * (normal(rng) > 1.5f ? 40.0f : 1.0f);
    spill::quant::ActivationsQ8 a;
    spill::quant::quantize_activations_q8(x.data(), n, a);
    ASSERT_EQ(a.d.size(), size_t((n + 255) / 256));
    for (int64_t i = 0; i < n; ++i) {
      const double d = a.d[size_t(i / 256)], xr = d * a.q[size_t(i)];
      ASSERT_LE(std::abs(a.q[size_t(i)]), 127);
      EXPECT_LE(std::fabs(double(x[size_t(i)]) - xr), d / 2 + 4 * std::ldexp(std::fabs(double(x[size_t(i)])), -24))
          << "n=" << n << " i=" << i;
    }
    for (int64_t j = 0; j < n / 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += a.q[size_t(16 * j + l)];
      EXPECT_EQ(a.sum16[size_t(j)], s);
    }
  }
  std::vector<float> zeros(64, 0.0f);
  spill::quant::ActivationsQ8 a;
  spill::quant::quantize_activations_q8(zeros.data(), 64, a);
  for (int8_t q : a.q) EXPECT_EQ(q, 0);
  std::vector<float> bad(64, 1.0f);
  bad[40] = NAN;
  EXPECT_THROW(spill::quant::quantize_activations_q8(bad.data(), 64, a), spill::Error);
  EXPECT_THROW(spill::quant::quantize_activations_q8(zeros.data(), 48, a), spill::Error);
}

const DType kQ8Types[] = {DType::Q8_0, DType::Q6_K, DType::Q5_K, DType::Q4_K,  DType::Q4_0,
                          DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL};

class DotQ8Test : public ::testing::TestWithParam<DType> {};

// The bound of quant.h's accuracy contract, against a float64 dot of the dequantized row with the
// original f32 x: sum_i |w_i| |x_i - x'_i| for the activation rounding (x'_i = d_b q_i, computed
// here in float64, so that term is exact), plus (nb + 12) u sum_i (|d_j q_i| + |m_j|) |x'_i| for
// the float combination in dot_q8_paths.h's order, counting the roundings a term passes through:
// float() of a lane above 2^24 (1); for the K-quants the scale product d * d_x (1), <= nb fused
// multiply-adds into the lane (its own and one per later 256-block), the mins' subtraction (1);
// for Q8_0 and the signed legacy formats an inner chain of <= 4 fused multiply-adds and the two
// chains' sum (5), then <= nb fused multiply-adds into the lane; Q4_1/Q5_1 (summed per block) the
// product d * float(sum) and the min's (3), 8 inner terms, the block's d_x (1) and nb adds; the
// eight lanes' sum (3); and the reference's own 2 roundings of each dequantized weight.
TEST_P(DotQ8Test, WithinTheActivationRoundingBound) {
  const DType t = GetParam();
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t be = spill::dtype_block_elems(t);
  for (int64_t blocks : {int64_t(1), int64_t(3), int64_t(2048 / be) + 1, int64_t(8192 / be)}) {
    const int64_t n = blocks * be;
    const std::vector<uint8_t> row = random_row(t, n, rng);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    spill::quant::ActivationsQ8 a;
    spill::quant::quantize_activations_q8(x.data(), n, a);
    std::vector<float> w(static_cast<size_t>(n)), quants(static_cast<size_t>(n)), mins(static_cast<size_t>(n), 0.0f);
    spill::quant::dequantize_row(t, row.data(), w.data(), n);
    const ScaleFields f = scale_fields(t);
    if (f.dmin >= 0) {
      spill::quant::dequantize_row(t, zero_field(t, row, f.dmin).data(), quants.data(), n);
      spill::quant::dequantize_row(t, zero_field(t, row, f.d).data(), mins.data(), n);
    } else {
      quants = w;
    }
    double exact = 0, rounding = 0, magnitude = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double xi = x[size_t(i)], xr = double(a.d[size_t(i / 256)]) * a.q[size_t(i)];
      exact += double(w[size_t(i)]) * xi;
      rounding += std::fabs(double(w[size_t(i)])) * std::fabs(xi - xr);
      magnitude += (std::fabs(double(quants[size_t(i)])) + std::fabs(double(mins[size_t(i)]))) * std::fabs(xr);
    }
    const double nb = double((n + 255) / 256);
    const double tolerance = rounding + (nb + 12) * std::ldexp(1.0, -24) * magnitude;
    const float got = spill::quant::dot_q8(t, row.data(), a);
    EXPECT_NEAR(double(got), exact, tolerance) << spill::dtype_name(t) << " n=" << n;
    // And the bound is not vacuous: the activation rounding is most of it, and far below the dot.
    EXPECT_LT(rounding, 0.05 * magnitude) << spill::dtype_name(t) << " n=" << n;
  }
}

TEST_P(DotQ8Test, EveryKernelPathGivesTheSameBits) {
  const DType t = GetParam();
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t be = spill::dtype_block_elems(t);
  int paths_compared = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t n = be * (1 + trial * 3);
    std::vector<uint8_t> row = random_row(t, n, rng);
    // Extreme bytes too: every quant and scale bit pattern is a legal block.
    if (trial % 4 == 3)
      for (size_t i = 0; i < row.size(); ++i)
        if (rng() % 3 == 0) row[i] = uint8_t(rng());
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    if (trial % 5 == 4) x[0] = 1000.0f;  // one large activation: the others round to few levels
    spill::quant::ActivationsQ8 a;
    spill::quant::quantize_activations_q8(x.data(), n, a);
    const float scalar = spill::quant::dot_q8_on(spill::quant::KernelPath::Scalar, t, row.data(), a);
    for (auto p : {spill::quant::KernelPath::Avx2, spill::quant::KernelPath::Avx512}) {
      if (!spill::quant::cpu_supports(p)) continue;
      const float v = spill::quant::dot_q8_on(p, t, row.data(), a);
      if (std::isnan(scalar)) {
        EXPECT_TRUE(std::isnan(v));
      } else {
        EXPECT_EQ(bits_of(v), bits_of(scalar)) << spill::quant::kernel_path_name(p) << " vs scalar, n=" << n;
      }
      ++paths_compared;
    }
  }
  if (paths_compared == 0) GTEST_SKIP() << "this CPU has no vector path to compare with the scalar one";
}

// A row against many tokens (the prompt path) gives every token dot_q8's bits, whatever the count
// (groups of four and the ones left over).
TEST_P(DotQ8Test, ManyTokensGetTheBitsOfOneAtATime) {
  const DType t = GetParam();
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 3 * 256;
  std::vector<uint8_t> row = random_row(t, n, rng);
  for (size_t i = 0; i < row.size(); ++i)
    if (rng() % 5 == 0) row[i] = uint8_t(rng());  // every quant and scale bit pattern is a legal block
  const spill::quant::DotQ8Tokens fn = spill::quant::dot_q8_tokens_fn(t, n);
  for (int64_t count : {int64_t(1), int64_t(3), int64_t(4), int64_t(7), int64_t(9), int64_t(16)}) {
    std::vector<spill::quant::ActivationsQ8> acts(static_cast<size_t>(count));
    for (auto& a : acts) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = normal(rng);
      spill::quant::quantize_activations_q8(x.data(), n, a);
    }
    const int64_t stride = 3;
    std::vector<float> out(static_cast<size_t>(count * stride), NAN);
    fn(row.data(), acts.data(), count, out.data(), stride);
    for (int64_t i = 0; i < count; ++i) {
      const float want = spill::quant::dot_q8(t, row.data(), acts[size_t(i)]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[size_t(i * stride)]));
      } else {
        EXPECT_EQ(bits_of(out[size_t(i * stride)]), bits_of(want)) << "token " << i << " of " << count;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Q8Types, DotQ8Test, ::testing::ValuesIn(kQ8Types),
                         [](const auto& info) { return std::string(spill::dtype_name(info.param)); });

TEST(DotQ8, RefusesFormatsWithoutAKernelAndPartialRows) {
  std::vector<float> x(256, 0.5f);
  spill::quant::ActivationsQ8 a;
  spill::quant::quantize_activations_q8(x.data(), 256, a);
  std::vector<uint8_t> row(size_t(spill::row_bytes(DType::Q3_K, 256)), 0);
  EXPECT_FALSE(spill::quant::has_dot_q8(DType::Q3_K));
  EXPECT_THROW(spill::quant::dot_q8(DType::Q3_K, row.data(), a), spill::Error);
  spill::quant::quantize_activations_q8(x.data(), 96, a);
  std::vector<uint8_t> q4(size_t(spill::row_bytes(DType::Q4_K, 256)), 0);
  EXPECT_THROW(spill::quant::dot_q8(DType::Q4_K, q4.data(), a), spill::Error);
}

TEST(Dot, RejectsPartialBlocks) {
  std::vector<uint8_t> bytes(1024);
  std::vector<float> x(300);
  EXPECT_THROW(spill::quant::dot(DType::Q6_K, bytes.data(), x.data(), 300), spill::Error);
}

TEST(Dot, ReportsItsKernelPath) {
  const std::string path = spill::quant::cpu_kernel_path();
  EXPECT_TRUE(path == "scalar" || path == "avx2" || path == "avx512") << path;
}

}  // namespace

// ---- quantizers ------------------------------------------------------------------------
// (That they reach lower error than ggml's own quantizers on the same data is measured by
// tools/bench/quant_rmse.cpp, which links ggml: docs/perf/quant-rmse-2026-12-01.md.)

namespace {

const DType kBlockTypes[] = {DType::Q8_0, DType::Q6_K, DType::Q5_K, DType::Q4_K,   DType::Q3_K,
                             DType::Q2_K, DType::IQ4_XS, DType::MXFP4, DType::Q4_0, DType::Q4_1,
                             DType::Q5_0, DType::Q5_1, DType::IQ4_NL};

// What quantize_row minimises without an importance row.
std::vector<float> default_weights(DType t, const std::vector<float>& x) {
  std::vector<float> w(x.size());
  spill::quant::default_error_weights(t, x.data(), int64_t(x.size()), w.data());
  return w;
}

double weighted_sq_error(DType t, const std::vector<float>& x, const std::vector<uint8_t>& q, const float* imp) {
  std::vector<float> y(x.size());
  spill::quant::dequantize_row(t, q.data(), y.data(), int64_t(x.size()));
  double e = 0;
  for (size_t i = 0; i < x.size(); ++i) e += (imp ? imp[i] : 1.0) * double(x[i] - y[i]) * double(x[i] - y[i]);
  return e;
}

// Q8_0: ggml's scale, amax / 127 stored as f16, and every weight at the level nearest to it at the
// stored scale: no weight ends further from its value than ggml's rounding against the unrounded
// scale puts it (quantize_row_q8_0_ref, written out here), and the largest weight is never clipped
// by more than the f16 rounding of the scale.
TEST(Quantize, Q8_0KeepsGgmlsScaleAndRoundsAgainstTheStoredOne) {
  std::mt19937 rng(11);
  std::student_t_distribution<float> heavy(3.0f);
  const int64_t n = 32 * 512;
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = 0.05f * heavy(rng);
  std::vector<uint8_t> q(size_t(spill::row_bytes(DType::Q8_0, n)));
  spill::quant::quantize_row(DType::Q8_0, x.data(), q.data(), n);
  std::vector<float> y(x.size());
  spill::quant::dequantize_row(DType::Q8_0, q.data(), y.data(), n);
  const auto* blocks = reinterpret_cast<const spill::quant::BlockQ8_0*>(q.data());
  int64_t closer = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[size_t(32 * b + l)]));
    const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    ASSERT_EQ(blocks[b].d, spill::f32_to_f16(d)) << "block " << b;
    const float d16 = spill::f16_to_f32(blocks[b].d);
    for (int l = 0; l < 32; ++l) {
      const size_t i = size_t(32 * b + l);
      const float ggml = d16 * float(std::lround(x[i] * id));
      EXPECT_LE(std::fabs(x[i] - y[i]), std::fabs(x[i] - ggml)) << "block " << b << " weight " << l;
      closer += std::fabs(x[i] - y[i]) < std::fabs(x[i] - ggml);
    }
  }
  EXPECT_GT(closer, 0);  // the f16 rounding of the scale moves some levels
}

class QuantizeTest : public ::testing::TestWithParam<DType> {};

// Importance steers the error to where it is cheap: the importance-weighted error of a row
// quantized with its importance is below that of the same row quantized without.
TEST_P(QuantizeTest, ImportanceLowersTheWeightedError) {
  const DType t = GetParam();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 4096;
  std::vector<float> x(static_cast<size_t>(n)), imp(static_cast<size_t>(n));
  for (float& v : x) v = 0.02f * normal(rng);
  for (float& v : imp) v = std::exp(2.0f * normal(rng));
  std::vector<uint8_t> plain(size_t(spill::row_bytes(t, n))), weighted(plain.size());
  spill::quant::quantize_row(t, x.data(), plain.data(), n);
  spill::quant::quantize_row(t, x.data(), weighted.data(), n, imp.data());
  if (t == DType::Q8_0) {
    // Q8_0 keeps ggml's scale (the largest weight on the grid) whatever the importance: a search
    // that trades the largest weights for the sum of squares raised the KL divergence at 8 bits.
    EXPECT_EQ(plain, weighted);
    return;
  }
  EXPECT_LT(weighted_sq_error(t, x, weighted, imp.data()), weighted_sq_error(t, x, plain, imp.data()));
  const std::vector<float> dw = default_weights(t, x);
  EXPECT_LT(weighted_sq_error(t, x, plain, dw.data()), weighted_sq_error(t, x, weighted, dw.data()))
      << "without importance the default-weighted error should be the one minimised";
}

// A row that some block encodes exactly (here: the dequantized values of a quantized row) must
// come back at least as close as that encoding, i.e. (for these grids) almost exactly.
TEST_P(QuantizeTest, RequantizingADequantizedRowLosesAlmostNothing) {
  const DType t = GetParam();
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 1024;
  std::vector<float> x(static_cast<size_t>(n)), y(x.size()), z(x.size());
  for (float& v : x) v = 0.02f * normal(rng);
  std::vector<uint8_t> q(size_t(spill::row_bytes(t, n))), q2(q.size());
  spill::quant::quantize_row(t, x.data(), q.data(), n);
  spill::quant::dequantize_row(t, q.data(), y.data(), n);
  spill::quant::quantize_row(t, y.data(), q2.data(), n);
  const std::vector<float> wx = default_weights(t, x), wy = default_weights(t, y);
  const double first = weighted_sq_error(t, x, q, wx.data()), again = weighted_sq_error(t, y, q2, wy.data());
  EXPECT_LT(again, 0.05 * first) << "re-quantizing values on the grid should nearly reproduce them";
}

TEST_P(QuantizeTest, AllZeroRowStaysZero) {
  const DType t = GetParam();
  const int64_t n = 512;
  std::vector<float> x(static_cast<size_t>(n), 0.0f), y(x.size(), 1.0f);
  std::vector<uint8_t> q(size_t(spill::row_bytes(t, n)));
  spill::quant::quantize_row(t, x.data(), q.data(), n);
  spill::quant::dequantize_row(t, q.data(), y.data(), n);
  for (float v : y) ASSERT_EQ(v, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantizeTest, ::testing::ValuesIn(kBlockTypes),
                         [](const auto& info) { return std::string(spill::dtype_name(info.param)); });

TEST(Quantize, FloatTypesRoundToNearest) {
  const std::vector<float> x = {1.0f, -2.5f, 3.14159f, 1e-3f, 65504.0f, -0.0f};
  std::vector<uint16_t> h(x.size()), b(x.size());
  spill::quant::quantize_row(DType::F16, x.data(), h.data(), int64_t(x.size()));
  spill::quant::quantize_row(DType::BF16, x.data(), b.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(h[i], spill::f32_to_f16(x[i]));
    EXPECT_EQ(b[i], spill::f32_to_bf16(x[i]));
  }
}

TEST(Quantize, RejectsBadInput) {
  std::vector<float> x(256, 0.5f), imp(256, 1.0f);
  std::vector<uint8_t> q(1024);
  EXPECT_THROW(spill::quant::quantize_row(DType::Q4_K, x.data(), q.data(), 255), spill::Error);
  x[17] = NAN;
  EXPECT_THROW(spill::quant::quantize_row(DType::Q4_K, x.data(), q.data(), 256), spill::Error);
  x[17] = 0.5f;
  imp[3] = -1.0f;
  EXPECT_THROW(spill::quant::quantize_row(DType::Q6_K, x.data(), q.data(), 256, imp.data()), spill::Error);
  x[0] = 1e9f;  // its scale would overflow f16
  EXPECT_THROW(spill::quant::quantize_row(DType::Q8_0, x.data(), q.data(), 256), spill::Error);
}

}  // namespace

namespace {

// The override is read once per process, so each case runs in a fresh child process (gtest's
// "threadsafe" death-test style re-executes the test binary).
int kernel_path_in_child(const char* value) {
  setenv("SPILL_CPU_KERNELS", value, 1);
  try {
    return std::string(spill::quant::cpu_kernel_path()) == value ? 0 : 1;
  } catch (const spill::Error&) {
    return 2;
  }
}

TEST(Dot, KernelPathOverrideFromTheEnvironment) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(kernel_path_in_child("scalar")), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(std::exit(kernel_path_in_child("sse9")), ::testing::ExitedWithCode(2), "");
  if (!spill::quant::cpu_supports(spill::quant::KernelPath::Avx512)) {
    EXPECT_EXIT(std::exit(kernel_path_in_child("avx512")), ::testing::ExitedWithCode(2), "");
  }
}

}  // namespace

namespace {

// dot_tokens shares a row's unpacking between tokens; each token must still get dot()'s bits.
TEST(DotTokens, EveryTokenGetsTheBitsDotGivesIt) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType t : kAllTypes) {
    const int64_t n = 3 * 256 + (spill::dtype_is_float(t) ? 5 : 0), stride = n + 3;
    const std::vector<uint8_t> row = random_row(t, n, rng);
    for (int64_t tokens : {int64_t(1), int64_t(4), int64_t(7)}) {
      std::vector<float> x(static_cast<size_t>(tokens * stride));
      for (float& v : x) v = normal(rng);
      std::vector<float> out(static_cast<size_t>(tokens * 2), NAN);
      spill::quant::dot_tokens(t, row.data(), x.data(), stride, tokens, n, out.data(), 2);
      for (int64_t i = 0; i < tokens; ++i)
        ASSERT_EQ(bits_of(out[size_t(2 * i)]), bits_of(spill::quant::dot(t, row.data(), x.data() + i * stride, n)))
            << spill::dtype_name(t) << " token " << i << " of " << tokens;
    }
  }
}

}  // namespace
