// The CUDA quantized GEMV (backend/cuda/gemv.h) against its CPU twin: the reference dequantizer's
// weights dotted in float64 with the activations rounded to int8 by quant::quantize_activations_q8
// (the kernels' rounding is the same, bit for bit: checked here too). Bound per output:
// gamma * sum_i |x'_i| (|w_i| + |ml_i|) with gamma from the longest rounding chain of the kernel's
// arithmetic (cuda_test_util.h).
#include <gtest/gtest.h>

#if SPILL_HAVE_CUDA
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/gemv.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "quant/random_blocks.h"

namespace spill {
namespace {

using test::DeviceBuffer;

struct GemvCase {
  DType type;
  int64_t rows, cols, n;
  bool bf16;
  int64_t mma_from = -1;  // the plan's tensor-core decode tile (plan_gemv; -1 the process default)
};

struct GemvRun {
  std::vector<float> y;  // [n, rows]
  cuda::GemvPlan plan;
};

// Runs the GEMV of random weights (seeded) on random activations; returns y and fills the host
// copies of weights and (f32 values of the) activations.
GemvRun run_gemv(const GemvCase& c, std::vector<uint8_t>& w, std::vector<float>& x, int64_t max_n, uint64_t seed) {
  const int64_t rb = row_bytes(c.type, c.cols);
  w.resize(size_t(c.rows * rb));
  quant::fill_random_blocks(c.type, w.data(), c.rows * rb / dtype_traits(c.type).block_bytes, seed);
  std::mt19937 rng{uint32_t(seed)};
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  x.resize(size_t(c.n * c.cols));
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = dist(rng);
    if (c.bf16) {
      xb[i] = f32_to_bf16(x[i]);
      x[i] = bf16_to_f32(xb[i]);
    }
  }
  GemvRun run;
  run.plan = cuda::plan_gemv(c.type, c.rows, c.cols, max_n, c.mma_from);
  DeviceBuffer dw(w.size()), dx(x.size() * 4), dy(size_t(c.n * c.rows) * 4), ws(size_t(run.plan.workspace_bytes));
  dw.upload(w.data(), w.size());
  if (c.bf16) dx.upload(xb.data(), xb.size() * 2);
  else dx.upload(x.data(), x.size() * 4);
  dy.poison();
  cuda::init_gemv_workspace(run.plan, ws.ptr, nullptr);
  cuda::gemv(run.plan, {.weights = dw.ptr, .x = dx.ptr, .x_bf16 = c.bf16, .n = c.n, .y = dy.as<float>(),
                        .workspace = ws.ptr},
             nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  run.y = test::download<float>(dy.ptr, size_t(c.n * c.rows));
  return run;
}

void expect_matches_twin(const GemvCase& c, uint64_t seed) {
  std::vector<uint8_t> w;
  std::vector<float> x;
  const GemvRun run = run_gemv(c, w, x, c.n, seed);
  const int64_t rb = row_bytes(c.type, c.cols);
  const double gamma = test::q8_dot_error_gamma(run.plan.k_chunk, run.plan.k_splits);
  std::vector<float> row(size_t(c.cols)), off(size_t(c.cols));
  std::vector<std::vector<double>> xq;
  for (int64_t t = 0; t < c.n; ++t) xq.push_back(test::rounded_activations(x.data() + t * c.cols, c.cols));
  int64_t bad = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    quant::dequantize_row(c.type, w.data() + r * rb, row.data(), c.cols);
    test::offset_magnitudes(c.type, w.data() + r * rb, c.cols, off.data());
    for (int64_t t = 0; t < c.n; ++t) {
      const std::vector<double>& xt = xq[size_t(t)];
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < c.cols; ++i) {
        ref += double(row[size_t(i)]) * xt[size_t(i)];
        mag += std::fabs(xt[size_t(i)]) * (std::fabs(double(row[size_t(i)])) + off[size_t(i)]);
      }
      const float got = run.y[size_t(t * c.rows + r)];
      const double bound = gamma * mag;
      if (!(std::fabs(got - ref) <= bound) && bad++ < 5)
        ADD_FAILURE() << dtype_name(c.type) << " " << c.rows << "x" << c.cols << " n=" << c.n
                      << (c.bf16 ? " bf16" : " f32") << " mma_from " << c.mma_from << " row " << r << " token " << t << ": got " << got
                      << ", twin " << ref << ", bound " << bound;
    }
  }
  EXPECT_EQ(bad, 0);
}

class CudaGemvTest : public ::testing::TestWithParam<DType> {};

TEST_P(CudaGemvTest, MatchesCpuTwinOverAwkwardShapes) {
  SPILL_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  const int64_t be = dtype_block_elems(t);
  // Widths not powers of two where the format allows (Q8_0: 96 and 4128 end in a short activation
  // block); row counts that leave partial tiles; a short wide matrix that K-splits; batches 1, 3,
  // 8, 11 and 17 (more than one token group of 8), 33 and 70 (the tensor-core path where the
  // format has one: partial tiles of 64 rows and 64 tokens).
  // 8448 columns: a row of several K-chunks in every format (more than the 2304 bytes staged per chunk).
  std::vector<std::pair<int64_t, int64_t>> shapes = {{1, be * 3}, {45, 768}, {300, 1280}, {19, 4096}, {130, 2304},
                                                      {3, 8448}};
  if (be == 32) shapes.push_back({33, 4128});
  uint64_t seed = 1;
  for (const auto& [rows, cols] : shapes)
    for (int64_t n : {1, 3, 8, 11, 17, 33, 70})
      for (bool bf16 : {false, true}) {
        if (bf16 && (n == 3 || n == 33)) continue;
        expect_matches_twin({t, rows, cols, n, bf16}, seed++);
        // The tensor-core decode tile (off by default), where the format has one.
        if (n > 1 && n < cuda::kMmqMinTokens) expect_matches_twin({t, rows, cols, n, bf16, 2}, seed++);
      }
}

TEST_P(CudaGemvTest, TokenAloneIsBitIdenticalToTokenInBatch) {
  SPILL_SKIP_WITHOUT_GPU();
  const DType t = GetParam();
  // Batches of 3, 8 and 17 (the decode kernels' 8-token build, and with mma_from 2 the
  // tensor-core decode tile where the format has an MmqFormat; 17: three token tiles) and of 100
  // (the tensor-core prefill tiles); 3072 columns K-split into chunks. Alone: the one-token kernel.
  for (int64_t mma_from : {0, 2})
  for (int64_t n : {3, 8, 17, 100}) {
  SCOPED_TRACE("batch " + std::to_string(n) + ", mma_from " + std::to_string(mma_from));
  const GemvCase batch{t, 77, 3072, n, false, mma_from};
  std::vector<uint8_t> w;
  std::vector<float> x;
  const GemvRun all = run_gemv(batch, w, x, n, 99);
  // Token 5 of the batch, alone (same weights: same seed), through a plan sized for the batch.
  const int64_t rb = row_bytes(t, batch.cols);
  const auto plan = cuda::plan_gemv(t, batch.rows, batch.cols, n);
  DeviceBuffer dw(w.size()), dx(size_t(batch.cols) * 4), dy(size_t(batch.rows) * 4), ws(size_t(plan.workspace_bytes));
  dw.upload(w.data(), size_t(batch.rows * rb));
  dx.upload(x.data() + 5 * batch.cols, size_t(batch.cols) * 4);
  cuda::init_gemv_workspace(plan, ws.ptr, nullptr);
  cuda::gemv(plan, {.weights = dw.ptr, .x = dx.ptr, .n = 1, .y = dy.as<float>(), .workspace = ws.ptr}, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto alone = test::download<float>(dy.ptr, size_t(batch.rows));
  for (int64_t r = 0; r < batch.rows; ++r)
    ASSERT_EQ(std::memcmp(&alone[size_t(r)], &all.y[size_t(5 * batch.rows + r)], 4), 0)
        << "row " << r << ": alone " << alone[size_t(r)] << ", in batch " << all.y[size_t(5 * batch.rows + r)];
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaGemvTest,
                         ::testing::Values(DType::Q8_0, DType::Q4_K, DType::Q3_K, DType::Q6_K, DType::Q2_K,
                                           DType::Q5_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CudaGemv, RoundsActivationsToInt8ExactlyAsTheCpu) {
  SPILL_SKIP_WITHOUT_GPU();
  // Row lengths with a short last block (96, 288, 4128), a block of zeros, tiny and huge values,
  // and values that land on .5 after scaling (ties round to even on both sides).
  std::mt19937 rng{7};
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t cols : {32, 96, 288, 2048, 4128}) {
    const int64_t n = 3;
    std::vector<float> x(size_t(n * cols));
    for (float& v : x) v = dist(rng);
    for (int64_t i = 0; i < std::min<int64_t>(cols, 256); ++i) x[size_t(cols + i)] = 0.0f;  // token 1, block 0
    for (int64_t i = 0; i < cols; ++i) x[size_t(2 * cols + i)] = float(int(i % 255) - 127) * (i % 7 ? 1e-3f : 3e4f);
    DeviceBuffer dx(x.size() * 4), dq(x.size()), dd(size_t(n * ((cols + 255) / 256)) * 4);
    dx.upload(x.data(), dx.bytes);
    cuda::quantize_activations_q8(dx.as<float>(), n, cols, dq.as<int8_t>(), dd.as<float>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto q = test::download<int8_t>(dq.ptr, x.size());
    const auto d = test::download<float>(dd.ptr, size_t(n * ((cols + 255) / 256)));
    for (int64_t t = 0; t < n; ++t) {
      quant::ActivationsQ8 want;
      quant::quantize_activations_q8(x.data() + t * cols, cols, want);
      ASSERT_EQ(std::memcmp(q.data() + t * cols, want.q.data(), size_t(cols)), 0) << "cols " << cols << " token " << t;
      ASSERT_EQ(std::memcmp(d.data() + t * ((cols + 255) / 256), want.d.data(), want.d.size() * 4), 0)
          << "cols " << cols << " token " << t;
    }
  }
}

TEST(CudaGemv, NonFiniteActivationGivesNaNNotAFiniteGuess) {
  SPILL_SKIP_WITHOUT_GPU();
  const int64_t rows = 16, cols = 512;
  std::vector<uint8_t> w(size_t(rows * row_bytes(DType::Q8_0, cols)));
  quant::fill_random_blocks(DType::Q8_0, w.data(), int64_t(w.size()) / 34, 3);
  std::vector<float> x(size_t(cols), 0.5f);
  x[300] = std::nanf("");
  const auto plan = cuda::plan_gemv(DType::Q8_0, rows, cols, 1);
  DeviceBuffer dw(w.size()), dx(x.size() * 4), dy(size_t(rows) * 4), ws(size_t(plan.workspace_bytes));
  dw.upload(w.data(), w.size());
  dx.upload(x.data(), dx.bytes);
  cuda::init_gemv_workspace(plan, ws.ptr, nullptr);
  cuda::gemv(plan, {.weights = dw.ptr, .x = dx.ptr, .n = 1, .y = dy.as<float>(), .workspace = ws.ptr}, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float v : test::download<float>(dy.ptr, size_t(rows))) EXPECT_TRUE(std::isnan(v)) << v;
}

TEST(CudaGemv, RefusesUnsupportedTypesAndShapesClearly) {
  EXPECT_THROW(cuda::plan_gemv(DType::IQ4_XS, 16, 256, 1), Error);
  EXPECT_THROW(cuda::plan_gemv(DType::Q4_K, 16, 100, 1), Error);
  EXPECT_THROW(cuda::plan_gemv(DType::Q8_0, 0, 64, 1), Error);
}

}  // namespace
}  // namespace spill
#else
TEST(CudaGemv, SkippedWithoutCuda) { GTEST_SKIP() << "spill was built without CUDA"; }
#endif
