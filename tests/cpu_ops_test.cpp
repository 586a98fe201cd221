// CPU kernels against plain double-precision references, on awkward shapes, and the property
// the engine relies on: a token's result does not depend on the batch it is computed in.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/quant.h"
#include "test_values.h"

namespace {

using spill::DType;
using spill::TensorView;
using spill::test::random_vector;

struct OwnedTensor {
  std::vector<uint16_t> half;
  std::vector<float> f32;
  std::vector<double> exact;  // the values the stored weights represent
  TensorView view;
};

OwnedTensor random_tensor(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  OwnedTensor t;
  const size_t n = static_cast<size_t>(rows * cols);
  t.exact.resize(n);
  if (dtype == DType::F32) {
    t.f32.resize(n);
    for (size_t i = 0; i < n; ++i) t.exact[i] = t.f32[i] = dist(rng);
    t.view.data = t.f32.data();
  } else {
    t.half.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const float v = dist(rng);
      t.half[i] = dtype == DType::BF16 ? spill::f32_to_bf16(v) : spill::f32_to_f16(v);
      t.exact[i] = dtype == DType::BF16 ? spill::bf16_to_f32(t.half[i]) : spill::f16_to_f32(t.half[i]);
    }
    t.view.data = t.half.data();
  }
  t.view.dtype = dtype;
  t.view.ndim = 2;
  t.view.shape = {rows, cols, 0, 0};
  return t;
}

class MatmulTest : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t, int64_t>> {};

// fp32 accumulation of K products: relative error ~ K * 2^-24 in the worst case; 1e-5 of the
// row's magnitude scale holds for these K with a wide margin and catches any wrong index.
TEST_P(MatmulTest, MatchesDoubleReference) {
  auto [dtype, n, M, K] = GetParam();
  std::mt19937 rng(uint32_t(n * 131 + M * 7 + K));
  OwnedTensor w = random_tensor(dtype, M, K, rng);
  std::vector<float> x = random_vector(static_cast<size_t>(n * K), rng);
  std::vector<float> y(static_cast<size_t>(n * M), NAN);
  spill::ThreadPool pool(3);
  spill::cpu::matmul(pool, x.data(), n, w.view, y.data());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t m = 0; m < M; ++m) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        ref += double(x[size_t(t * K + k)]) * w.exact[size_t(m * K + k)];
        mag += std::abs(double(x[size_t(t * K + k)]) * w.exact[size_t(m * K + k)]);
      }
      ASSERT_NEAR(y[size_t(t * M + m)], ref, 1e-5 * mag + 1e-30) << "t=" << t << " m=" << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16, DType::F16),
                                            ::testing::Values(int64_t(1), int64_t(3), int64_t(19)),
                                            ::testing::Values(int64_t(1), int64_t(37)),
                                            ::testing::Values(int64_t(1), int64_t(31), int64_t(111), int64_t(256))));

TEST(Matmul, TokenResultIndependentOfBatch) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    std::mt19937 rng(7);
    const int64_t M = 45, K = 97, n = 13;
    OwnedTensor w = random_tensor(dtype, M, K, rng);
    std::vector<float> x = random_vector(static_cast<size_t>(n * K), rng);
    std::vector<float> batched(static_cast<size_t>(n * M)), alone(static_cast<size_t>(M));
    spill::ThreadPool pool(2);
    spill::cpu::matmul(pool, x.data(), n, w.view, batched.data());
    for (int64_t t = 0; t < n; ++t) {
      spill::cpu::matmul(pool, x.data() + t * K, 1, w.view, alone.data());
      for (int64_t m = 0; m < M; ++m) ASSERT_EQ(alone[size_t(m)], batched[size_t(t * M + m)]) << "bitwise, t=" << t;
    }
  }
}

// ---- block formats ----------------------------------------------------------------------
// A [rows, cols] matrix of Gaussian weights quantized by spill's quantizer into `dtype`.
struct QuantTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
};
QuantTensor quantized_tensor(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  QuantTensor t;
  const int64_t rb = spill::row_bytes(dtype, cols);
  t.bytes.resize(size_t(rows * rb));
  std::vector<float> w = random_vector(static_cast<size_t>(cols), rng);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : w) v *= 0.9f + 0.2f * float(r % 3);  // rows of different scales
    spill::quant::quantize_row(dtype, w.data(), t.bytes.data() + r * rb, cols);
    w = random_vector(static_cast<size_t>(cols), rng);
  }
  t.view.data = t.bytes.data();
  t.view.dtype = dtype;
  t.view.ndim = 2;
  t.view.shape = {rows, cols, 0, 0};
  return t;
}

const DType kMatmulBlockTypes[] = {DType::Q8_0, DType::Q6_K, DType::Q5_K,   DType::Q4_K,
                                   DType::Q3_K, DType::Q2_K, DType::IQ4_XS, DType::MXFP4};

// Sets the CPU matmul's activation mode for one test and puts the previous one back.
struct ActivationModeScope {
  spill::cpu::ActivationMode saved = spill::cpu::activation_mode();
  explicit ActivationModeScope(spill::cpu::ActivationMode m) { spill::cpu::set_activation_mode(m); }
  ~ActivationModeScope() { spill::cpu::set_activation_mode(saved); }
};

TEST(BlockMatmul, ActivationModeNames) {
  EXPECT_EQ(spill::cpu::parse_activation_mode("q8"), spill::cpu::ActivationMode::Q8);
  EXPECT_EQ(spill::cpu::parse_activation_mode("f32"), spill::cpu::ActivationMode::F32);
  EXPECT_THROW(spill::cpu::parse_activation_mode("int8"), spill::Error);
}

class BlockMatmulTest : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t, int64_t>> {};

// Each output is the row's quant::dot with the token (whose accuracy against a float64 dot of the
// dequantized row quant_test checks): bit for bit, at every n, on rows that are not powers of two.
TEST_P(BlockMatmulTest, EveryOutputIsTheRowDot) {
  auto [dtype, n, M, blocks] = GetParam();
  const int64_t K = blocks * spill::dtype_block_elems(dtype);
  std::mt19937 rng(uint32_t(n * 131 + M * 7 + K));
  QuantTensor w = quantized_tensor(dtype, M, K, rng);
  std::vector<float> x = random_vector(static_cast<size_t>(n * K), rng);
  std::vector<float> y(static_cast<size_t>(n * M), NAN);
  spill::ThreadPool pool(3);
  ActivationModeScope f32(spill::cpu::ActivationMode::F32);
  spill::cpu::matmul(pool, x.data(), n, w.view, y.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t m = 0; m < M; ++m) {
      const float expected = spill::quant::dot(dtype, w.view.row_data(m), x.data() + t * K, K);
      ASSERT_EQ(y[size_t(t * M + m)], expected) << "t=" << t << " m=" << m;
      ASSERT_EQ(spill::cpu::dot_row(x.data() + t * K, w.view, m), expected);
    }
}

// With int8 activations each output is quant::dot_q8 of the row with that token rounded alone
// (formats whose q8 kernel is not the faster one keep quant::dot).
TEST_P(BlockMatmulTest, Q8OutputIsTheRowDotQ8) {
  auto [dtype, n, M, blocks] = GetParam();
  const int64_t K = blocks * spill::dtype_block_elems(dtype);
  std::mt19937 rng(uint32_t(n * 131 + M * 7 + K));
  QuantTensor w = quantized_tensor(dtype, M, K, rng);
  std::vector<float> x = random_vector(static_cast<size_t>(n * K), rng);
  std::vector<float> y(static_cast<size_t>(n * M), NAN);
  spill::ThreadPool pool(3);
  ActivationModeScope q8(spill::cpu::ActivationMode::Q8);
  spill::cpu::matmul(pool, x.data(), n, w.view, y.data());
  spill::quant::ActivationsQ8 a;
  for (int64_t t = 0; t < n; ++t) {
    spill::quant::quantize_activations_q8(x.data() + t * K, K, a);
    for (int64_t m = 0; m < M; ++m) {
      const float expected = spill::quant::prefer_dot_q8(dtype)
                                 ? spill::quant::dot_q8(dtype, w.view.row_data(m), a)
                                 : spill::quant::dot(dtype, w.view.row_data(m), x.data() + t * K, K);
      ASSERT_EQ(y[size_t(t * M + m)], expected) << "t=" << t << " m=" << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BlockMatmulTest,
                         ::testing::Combine(::testing::ValuesIn(kMatmulBlockTypes),
                                            ::testing::Values(int64_t(1), int64_t(3), int64_t(17)),
                                            ::testing::Values(int64_t(1), int64_t(37)),
                                            ::testing::Values(int64_t(1), int64_t(3))),
                         [](const auto& info) {
                           return std::string(spill::dtype_name(std::get<0>(info.param))) + "_n" +
                                  std::to_string(std::get<1>(info.param)) + "_M" +
                                  std::to_string(std::get<2>(info.param)) + "_blocks" +
                                  std::to_string(std::get<3>(info.param));
                         });

TEST(BlockMatmul, TokenResultIndependentOfBatch) {
  for (auto mode : {spill::cpu::ActivationMode::F32, spill::cpu::ActivationMode::Q8})
  for (DType dtype : kMatmulBlockTypes) {
    ActivationModeScope scope(mode);
    std::mt19937 rng(5);
    const int64_t M = 45, K = 3 * 256, n = 13;
    QuantTensor w = quantized_tensor(dtype, M, K, rng);
    std::vector<float> x = random_vector(static_cast<size_t>(n * K), rng);
    std::vector<float> batched(static_cast<size_t>(n * M)), alone(static_cast<size_t>(M));
    spill::ThreadPool pool(2);
    spill::cpu::matmul(pool, x.data(), n, w.view, batched.data());
    for (int64_t t = 0; t < n; ++t) {
      spill::cpu::matmul(pool, x.data() + t * K, 1, w.view, alone.data());
      for (int64_t m = 0; m < M; ++m)
        ASSERT_EQ(alone[size_t(m)], batched[size_t(t * M + m)])
            << spill::dtype_name(dtype) << " " << spill::cpu::activation_mode_name(mode) << " bitwise, t=" << t;
    }
  }
}

// Embedding rows (load_row) are the dequantized rows, at any row index.
TEST(BlockMatmul, LoadRowIsTheDequantizedRow) {
  for (DType dtype : kMatmulBlockTypes) {
    std::mt19937 rng(9);
    const int64_t M = 7, K = 512;
    QuantTensor w = quantized_tensor(dtype, M, K, rng);
    std::vector<float> got(static_cast<size_t>(K)), expected(static_cast<size_t>(K));
    for (int64_t m = 0; m < M; ++m) {
      spill::cpu::load_row(w.view, m, got.data());
      spill::quant::dequantize_row(dtype, w.bytes.data() + m * spill::row_bytes(dtype, K), expected.data(), K);
      ASSERT_EQ(got, expected) << spill::dtype_name(dtype) << " row " << m;
    }
  }
}

TEST(BlockMatmul, RejectsRowsThatAreNotWholeBlocks) {
  std::vector<uint8_t> bytes(4096);
  TensorView w;
  w.data = bytes.data();
  w.dtype = DType::Q4_K;
  w.ndim = 2;
  w.shape = {2, 100, 0, 0};
  std::vector<float> x(100), y(2);
  spill::ThreadPool pool(1);
  EXPECT_THROW(spill::cpu::matmul(pool, x.data(), 1, w, y.data()), spill::Error);
}

TEST(RmsNorm, MatchesReference) {
  std::mt19937 rng(3);
  const int64_t n = 5, dim = 111;
  OwnedTensor w = random_tensor(DType::BF16, 1, dim, rng);
  w.view.ndim = 1;
  w.view.shape = {dim, 0, 0, 0};
  std::vector<float> x = random_vector(static_cast<size_t>(n * dim), rng), out(static_cast<size_t>(n * dim));
  spill::cpu::rmsnorm(x.data(), n, dim, w.view, 1e-6, out.data());
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += double(x[size_t(i * dim + j)]) * x[size_t(i * dim + j)];
    const double scale = 1 / std::sqrt(ss / dim + 1e-6);
    for (int64_t j = 0; j < dim; ++j) {
      const double ref = x[size_t(i * dim + j)] * scale * w.exact[size_t(j)];
      ASSERT_NEAR(out[size_t(i * dim + j)], ref, 1e-6 * (std::abs(ref) + 1));
    }
  }
}

TEST(Rope, RotatesPairsByPositionTimesFrequency) {
  spill::RopeSpec spec;
  spec.theta = 10000;
  const int64_t D = 10, heads = 3;
  auto table = spill::cpu::make_rope_table(spec, D);
  std::mt19937 rng(5);
  std::vector<float> x = random_vector(static_cast<size_t>(2 * heads * D), rng), y = x;
  const int32_t positions[] = {0, 37};
  spill::cpu::apply_rope(table, y.data(), 2, heads, D, positions);
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < D / 2; ++i) {
        const double freq = std::pow(10000.0, -2.0 * i / D), angle = positions[t] * freq;
        const float* xi = x.data() + (t * heads + h) * D;
        const float* yi = y.data() + (t * heads + h) * D;
        ASSERT_NEAR(yi[i], xi[i] * std::cos(angle) - xi[i + D / 2] * std::sin(angle), 2e-5);
        ASSERT_NEAR(yi[i + D / 2], xi[i + D / 2] * std::cos(angle) + xi[i] * std::sin(angle), 2e-5);
      }
}

// Paged attention against contiguous causal attention in double, with chunks that start
// mid-sequence (cached prefix) and blocks given out of order.
TEST(PagedAttention, MatchesContiguousReference) {
  const int64_t D = 12, n_heads = 6, n_kv = 2, group = n_heads / n_kv;
  const int32_t block_size = 3;
  const int32_t total_len = 11, cached = 4;  // positions 0..3 written by a first step, 4..10 by a second
  std::mt19937 rng(11);
  std::vector<float> q = random_vector(static_cast<size_t>(total_len * n_heads * D), rng);
  std::vector<float> k = random_vector(static_cast<size_t>(total_len * n_kv * D), rng);
  std::vector<float> v = random_vector(static_cast<size_t>(total_len * n_kv * D), rng);
  const int32_t n_blocks = 8;
  std::vector<float> kc(static_cast<size_t>(n_blocks * block_size * n_kv * D), NAN), vc = kc;
  spill::cpu::PagedKv kv{kc.data(), vc.data(), block_size, n_kv, D};
  const std::vector<int32_t> table = {6, 2, 7, 0};  // covers 12 positions
  spill::ThreadPool pool(2);
  std::vector<float> out(static_cast<size_t>(total_len * n_heads * D), NAN);
  // Step 1: prefill the first 4 positions; step 2: the remaining 7, attending to the cached ones.
  spill::cpu::AttentionChunk first{0, cached, 0, table};
  spill::cpu::paged_attention(pool, kv, {&first, 1}, q.data(), k.data(), v.data(), n_heads, out.data());
  spill::cpu::AttentionChunk second{0, total_len - cached, cached, table};
  spill::cpu::paged_attention(pool, kv, {&second, 1}, q.data() + cached * n_heads * D, k.data() + cached * n_kv * D,
                              v.data() + cached * n_kv * D, n_heads, out.data() + cached * n_heads * D);
  for (int32_t t = 0; t < total_len; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / group;
      std::vector<double> s(static_cast<size_t>(t + 1));
      double mx = -1e300, den = 0;
      for (int32_t p = 0; p <= t; ++p) {
        double d = 0;
        for (int64_t j = 0; j < D; ++j) d += double(q[size_t((t * n_heads + h) * D + j)]) * k[size_t((p * n_kv + kvh) * D + j)];
        s[size_t(p)] = d / std::sqrt(double(D));
        mx = std::max(mx, s[size_t(p)]);
      }
      for (double& e : s) den += e = std::exp(e - mx);
      for (int64_t j = 0; j < D; ++j) {
        double ref = 0;
        for (int32_t p = 0; p <= t; ++p) ref += s[size_t(p)] / den * v[size_t((p * n_kv + kvh) * D + j)];
        ASSERT_NEAR(out[size_t((t * n_heads + h) * D + j)], ref, 1e-5) << "t=" << t << " h=" << h;
      }
    }
}

// A sequence long enough for many of the kernel's 32-position tiles, written in three steps (a
// prefill chunk that ends mid-tile, one decode-sized token, the rest), against float64 causal
// attention: head_dim 64 (the vector path) and 12 (padded), with a window that crosses tile
// boundaries, with sinks. Tolerance per (token, head) from the fp32 arithmetic, as for the CUDA
// twin: each score is off by at most ds = 2 gamma(D + 2) max_p |q||k| scale, each weight then by
// ~2 ds relative, plus the roundings of exp and of the sums over n_pos terms; times max |v|. A
// wrong position, mask or rescale errs by O(0.1).
struct LongAttentionCase {
  int64_t D;
  int32_t window;
  bool sinks;
};
class PagedAttentionLong : public ::testing::TestWithParam<LongAttentionCase> {};

TEST_P(PagedAttentionLong, ManyTilesMatchFloat64) {
  const LongAttentionCase tc = GetParam();
  const int64_t D = tc.D, n_heads = 6, n_kv = 2, group = n_heads / n_kv;
  const int32_t block_size = 5, total_len = 150;
  const int32_t steps[] = {0, 45, 46, total_len};  // [0, 45), [45, 46), [46, 150)
  std::mt19937 rng(uint32_t(D * 131 + tc.window * 7 + tc.sinks));
  const auto q = random_vector(size_t(total_len * n_heads * D), rng);
  const auto k = random_vector(size_t(total_len * n_kv * D), rng);
  const auto v = random_vector(size_t(total_len * n_kv * D), rng);
  const auto sinks = random_vector(size_t(n_heads), rng);
  const int32_t n_blocks = total_len / block_size + 3;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int32_t b = 0; b < n_blocks; ++b) table[size_t(b)] = (b * 13) % n_blocks;  // 13 is prime to 33: a permutation
  std::vector<float> kc(static_cast<size_t>(n_blocks * block_size * n_kv * D), NAN), vc = kc;
  spill::cpu::PagedKv kv{kc.data(), vc.data(), block_size, n_kv, D};
  spill::ThreadPool pool(3);
  const float scale = 0.2f;
  const spill::cpu::AttentionParams params{.scale = scale, .window = tc.window, .sinks = tc.sinks ? sinks.data() : nullptr};
  std::vector<float> out(static_cast<size_t>(total_len * n_heads * D), NAN);
  for (int s = 0; s + 1 < 4; ++s) {
    const int32_t start = steps[s], n = steps[s + 1] - steps[s];
    const spill::cpu::AttentionChunk c{0, n, start, table};
    spill::cpu::paged_attention(pool, kv, {&c, 1}, q.data() + start * n_heads * D, k.data() + start * n_kv * D,
                                v.data() + start * n_kv * D, n_heads, out.data() + start * n_heads * D, params);
  }
  const double u = std::ldexp(1.0, -24);
  auto gamma = [&](double n) { return n * u / (1 - n * u); };
  for (int32_t t = 0; t < total_len; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / group;
      const int32_t lo = tc.window > 0 ? std::max(0, t - tc.window + 1) : 0;
      std::vector<double> s;
      double mx = tc.sinks ? sinks[size_t(h)] : -1e300, max_qk = 0, max_v = 0;
      for (int32_t p = lo; p <= t; ++p) {
        double d = 0, a = 0;
        for (int64_t j = 0; j < D; ++j) {
          const double prod = double(q[size_t((t * n_heads + h) * D + j)]) * k[size_t((p * n_kv + kvh) * D + j)];
          d += prod;
          a += std::fabs(prod);
          max_v = std::max(max_v, std::fabs(double(v[size_t((p * n_kv + kvh) * D + j)])));
        }
        s.push_back(d * scale);
        max_qk = std::max(max_qk, a * scale);
        mx = std::max(mx, s.back());
      }
      double den = tc.sinks ? std::exp(sinks[size_t(h)] - mx) : 0;
      for (double& e : s) den += e = std::exp(e - mx);
      const double ds = 2 * gamma(double(D + 2)) * max_qk;
      const double bound = (4 * ds + 2 * gamma(2.0 * double(s.size()) + 16) + 16 * u) * max_v;
      for (int64_t j = 0; j < D; ++j) {
        double ref = 0;
        for (int32_t p = lo; p <= t; ++p) ref += s[size_t(p - lo)] / den * v[size_t((p * n_kv + kvh) * D + j)];
        ASSERT_NEAR(out[size_t((t * n_heads + h) * D + j)], ref, bound) << "t=" << t << " h=" << h << " d=" << j;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionLong,
                         ::testing::Values(LongAttentionCase{64, 0, false}, LongAttentionCase{64, 37, true},
                                           LongAttentionCase{12, 0, true}, LongAttentionCase{12, 70, false}));

// The batch invariance the engine relies on, for attention: a token's output is bit-identical
// whether its sequence is prefilled in one chunk, fed one token per step, or computed in a step
// shared with another sequence's chunk and a decode token (other block tables, other lengths),
// and whatever the number of threads. Queries of one step are blocked together in the kernel, so
// this fails if a query's arithmetic depends on its neighbours.
TEST(PagedAttention, TokenResultIndependentOfBatch) {
  const int64_t D = 64, n_heads = 4, n_kv = 2;
  const int32_t block_size = 16, len = 100;
  for (const int32_t window : {0, 29}) {
    std::mt19937 rng(uint32_t(17 + window));
    const auto q = random_vector(size_t(len * n_heads * D), rng);
    const auto k = random_vector(size_t(len * n_kv * D), rng);
    const auto v = random_vector(size_t(len * n_kv * D), rng);
    const spill::cpu::AttentionParams params{.window = window};
    const int32_t seq_blocks = (len + block_size - 1) / block_size;
    // Sequence A in blocks [0, seq_blocks), reversed; B (another prompt) after it.
    std::vector<int32_t> table_a(static_cast<size_t>(seq_blocks)), table_b(static_cast<size_t>(seq_blocks));
    for (int32_t b = 0; b < seq_blocks; ++b) {
      table_a[size_t(b)] = seq_blocks - 1 - b;
      table_b[size_t(b)] = seq_blocks + b;
    }
    const size_t cache_floats = size_t(2 * seq_blocks * block_size * n_kv * D);
    auto run = [&](int threads, auto&& feed) {
      std::vector<float> kc(cache_floats, 0.0f), vc(cache_floats, 0.0f), out(size_t(len * n_heads * D), NAN);
      spill::cpu::PagedKv kv{kc.data(), vc.data(), block_size, n_kv, D};
      spill::ThreadPool pool(threads);
      feed(pool, kv, out);
      return out;
    };
    // A alone, one chunk.
    const auto one_chunk = run(1, [&](spill::ThreadPool& pool, const spill::cpu::PagedKv& kv, std::vector<float>& out) {
      const spill::cpu::AttentionChunk c{0, len, 0, table_a};
      spill::cpu::paged_attention(pool, kv, {&c, 1}, q.data(), k.data(), v.data(), n_heads, out.data(), params);
    });
    // A one token per step.
    const auto per_token = run(2, [&](spill::ThreadPool& pool, const spill::cpu::PagedKv& kv, std::vector<float>& out) {
      for (int32_t t = 0; t < len; ++t) {
        const spill::cpu::AttentionChunk c{0, 1, t, table_a};
        spill::cpu::paged_attention(pool, kv, {&c, 1}, q.data() + t * n_heads * D, k.data() + t * n_kv * D,
                                    v.data() + t * n_kv * D, n_heads, out.data() + t * n_heads * D, params);
      }
    });
    // A in chunks of 7 (ends mid-tile), each step shared with B: B's prompt (other data: A's
    // tokens in reverse) in one chunk at step 0, then B decoding one token per step.
    const auto shared = run(3, [&](spill::ThreadPool& pool, const spill::cpu::PagedKv& kv, std::vector<float>& out) {
      const int64_t b_prompt = 40;
      int64_t b_len = 0;
      for (int32_t start = 0; start < len; start += 7) {
        const int32_t n = std::min(7, len - start);
        const int32_t b_n = b_len == 0 ? int32_t(b_prompt) : 1;
        // Step inputs: B's tokens first, then A's.
        std::vector<float> sq, sk, sv;
        for (int32_t i = 0; i < b_n; ++i) {
          const int32_t src = len - 1 - int32_t(b_len + i);
          sq.insert(sq.end(), q.begin() + src * n_heads * D, q.begin() + (src + 1) * n_heads * D);
          sk.insert(sk.end(), k.begin() + src * n_kv * D, k.begin() + (src + 1) * n_kv * D);
          sv.insert(sv.end(), v.begin() + src * n_kv * D, v.begin() + (src + 1) * n_kv * D);
        }
        sq.insert(sq.end(), q.begin() + start * n_heads * D, q.begin() + (start + n) * n_heads * D);
        sk.insert(sk.end(), k.begin() + start * n_kv * D, k.begin() + (start + n) * n_kv * D);
        sv.insert(sv.end(), v.begin() + start * n_kv * D, v.begin() + (start + n) * n_kv * D);
        const spill::cpu::AttentionChunk chunks[] = {{0, b_n, int32_t(b_len), table_b}, {b_n, n, start, table_a}};
        std::vector<float> step_out(sq.size());
        spill::cpu::paged_attention(pool, kv, chunks, sq.data(), sk.data(), sv.data(), n_heads, step_out.data(), params);
        std::copy(step_out.begin() + b_n * n_heads * D, step_out.end(), out.begin() + start * n_heads * D);
        b_len += b_n;
      }
    });
    for (size_t i = 0; i < one_chunk.size(); ++i) {
      ASSERT_EQ(std::memcmp(&one_chunk[i], &per_token[i], 4), 0)
          << "one chunk vs one token per step, window " << window << " token " << i / size_t(n_heads * D);
      ASSERT_EQ(std::memcmp(&one_chunk[i], &shared[i], 4), 0)
          << "one chunk vs steps shared with another sequence, window " << window << " token " << i / size_t(n_heads * D);
    }
  }
}

TEST(RouteTopk, SoftmaxTopkRenormalise) {
  const float logits[] = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f};
  int32_t ids[3];
  float w[3];
  spill::cpu::route_topk(logits, 1, 5, 3, false, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  EXPECT_EQ(ids[2], 0);
  double den = 0;
  for (float l : logits) den += std::exp(double(l));
  EXPECT_NEAR(w[0], std::exp(2.0) / den, 1e-6);
  spill::cpu::route_topk(logits, 1, 5, 3, true, ids, w);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-6);
  EXPECT_NEAR(w[0] / w[1], std::exp(0.5), 1e-5);
  // top-k = number of experts keeps all of them, weights summing to 1 without renormalising.
  int32_t all_ids[5];
  float all_w[5];
  spill::cpu::route_topk(logits, 1, 5, 5, false, all_ids, all_w);
  EXPECT_NEAR(all_w[0] + all_w[1] + all_w[2] + all_w[3] + all_w[4], 1.0, 1e-6);
}

// Experts that receive no token, one token, and most tokens; output against a per-token
// reference in double.
TEST(MoeExperts, MatchesPerTokenReference) {
  const int64_t H = 23, I = 9, E = 5, k = 2, n = 7;
  std::mt19937 rng(13);
  std::vector<OwnedTensor> gate, up, down;
  for (int64_t e = 0; e < E; ++e) {
    gate.push_back(random_tensor(DType::BF16, I, H, rng, 0.3f));
    up.push_back(random_tensor(DType::BF16, I, H, rng, 0.3f));
    down.push_back(random_tensor(DType::BF16, H, I, rng, 0.3f));
  }
  std::vector<spill::cpu::ExpertView> views;
  for (int64_t e = 0; e < E; ++e) views.push_back({&gate[size_t(e)].view, &up[size_t(e)].view, &down[size_t(e)].view});
  // Expert 4 gets nothing; expert 3 gets one token; expert 0 most.
  const std::vector<int32_t> ids = {0, 1, 0, 2, 1, 0, 0, 3, 2, 0, 0, 1, 1, 2};
  std::vector<float> weights(static_cast<size_t>(n * k));
  for (float& w : weights) w = std::uniform_real_distribution<float>(0.1f, 1.0f)(rng);
  std::vector<float> x = random_vector(static_cast<size_t>(n * H), rng), out(static_cast<size_t>(n * H), NAN);
  spill::ThreadPool pool(2);
  spill::cpu::moe_experts(pool, x.data(), n, H, k, ids.data(), weights.data(), views, out.data());
  // Tolerance from the arithmetic (Higham's first-order bounds): the kernel computes in fp32
  // (unit roundoff u = 2^-24) on weights that are exactly their bf16 values. A dot product of
  // length L is off by at most gamma_L = L*u times the sum of its terms' magnitudes. The gated
  // activation silu(g)*v passes an error in g on with a gain below 1.1*|v| (|silu'| < 1.1) and
  // one in v with a gain of |silu(g)|, and rounds 4 more times (exp, add, divide, multiply). The
  // down projection and the weighted sum over the k experts add their own gamma terms. The bound
  // is evaluated per output in double along with the reference; it comes to a few 1e-6 of the
  // outputs' magnitude here, where the old fixed 1e-5 * (|ref| + 1) was loosest for small outputs.
  constexpr double u = 1.0 / (1 << 24);
  auto gamma = [&](int64_t len) { return double(len) * u / (1 - double(len) * u); };
  double worst_ratio = 0;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> ref(static_cast<size_t>(H), 0.0), bound(static_cast<size_t>(H), 0.0);
    for (int64_t s = 0; s < k; ++s) {
      const int32_t e = ids[size_t(t * k + s)];
      const double w = weights[size_t(t * k + s)];
      std::vector<double> act(static_cast<size_t>(I)), act_err(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, v = 0, g_mag = 0, v_mag = 0;
        for (int64_t j = 0; j < H; ++j) {
          const double xg = double(x[size_t(t * H + j)]) * gate[size_t(e)].exact[size_t(i * H + j)];
          const double xv = double(x[size_t(t * H + j)]) * up[size_t(e)].exact[size_t(i * H + j)];
          g += xg, v += xv, g_mag += std::abs(xg), v_mag += std::abs(xv);
        }
        const double silu = g / (1 + std::exp(-g));
        act[size_t(i)] = silu * v;
        act_err[size_t(i)] = gamma(H) * (1.1 * g_mag * std::abs(v) + std::abs(silu) * v_mag) + gamma(4) * std::abs(silu * v);
      }
      for (int64_t j = 0; j < H; ++j) {
        double d = 0, d_mag = 0, d_err = 0;
        for (int64_t i = 0; i < I; ++i) {
          const double wd = down[size_t(e)].exact[size_t(j * I + i)];
          d += act[size_t(i)] * wd;
          d_mag += std::abs(act[size_t(i)] * wd);
          d_err += act_err[size_t(i)] * std::abs(wd);
        }
        ref[size_t(j)] += w * d;
        bound[size_t(j)] += w * (d_err + gamma(I) * d_mag) + gamma(k + 1) * std::abs(w * d);
      }
    }
    for (int64_t j = 0; j < H; ++j) {
      const double err = std::abs(double(out[size_t(t * H + j)]) - ref[size_t(j)]);
      worst_ratio = std::max(worst_ratio, err / bound[size_t(j)]);
      ASSERT_LE(err, bound[size_t(j)]) << "t=" << t << " j=" << j << " ref=" << ref[size_t(j)];
    }
  }
  RecordProperty("worst_error_over_bound", std::to_string(worst_ratio));
}

TEST(Dtype, ConversionsRoundTrip) {
  // Exactly representable values survive both ways.
  for (float v : {1.0f, -2.5f, 0.09375f, 65504.0f}) EXPECT_EQ(spill::f16_to_f32(spill::f32_to_f16(v)), v);
  for (float v : {1.0f, -2.5f, 0.09375f, std::ldexp(1.5f, 100)}) EXPECT_EQ(spill::bf16_to_f32(spill::f32_to_bf16(v)), v);
  EXPECT_EQ(spill::f32_to_bf16(1.00390625f), 0x3f80);  // halfway: round to even
  EXPECT_EQ(spill::f32_to_f16(1e6f), 0x7c00);          // overflow -> inf
  EXPECT_EQ(spill::f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
}

}  // namespace
