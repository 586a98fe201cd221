// The CPU side of host experts computed by the CPU (offload/cpu_experts.h): which experts the CPU
// takes (an even share of each layer's host experts, never a VRAM one), what auto chooses, and the
// rows it hands the GPU: for a pair (t, j) of a CPU expert, weights[t, j] * E(x[t]) as the CPU
// runner's MoE (cpu::moe_experts, the same int8 kernels) computes it, other pairs' rows untouched.
// No GPU needed: the CPU threads' arithmetic runs here.
#include <gtest/gtest.h>

#if SPILL_HAVE_CUDA
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/tensor.h"
#include "offload/cpu_experts.h"
#include "quant/quant.h"
#include "test_values.h"

namespace spill {
namespace {

TEST(CpuExperts, TheSplitTakesAnEvenShareOfTheHostExpertsOnly) {
  std::vector<uint8_t> on_host(16, 0);
  for (int e : {1, 2, 3, 5, 8, 9, 13, 14}) on_host[size_t(e)] = 1;
  for (double share : {0.0, 0.25, 0.5, 0.6, 1.0}) {
    const std::vector<uint8_t> cpu = offload::cpu_expert_split(on_host, share);
    ASSERT_EQ(cpu.size(), on_host.size());
    int taken = 0;
    for (size_t e = 0; e < cpu.size(); ++e) {
      if (cpu[e]) {
        EXPECT_TRUE(on_host[e]) << "expert " << e << " is in VRAM";
      }
      taken += cpu[e];
    }
    EXPECT_EQ(taken, int(std::floor(8 * share + 1e-9))) << "share " << share;
  }
  // Spread, not the first ones: half of 8 is every other host expert.
  const std::vector<uint8_t> half = offload::cpu_expert_split(on_host, 0.5);
  EXPECT_EQ(std::vector<uint8_t>({half[1], half[2], half[3], half[5]}), std::vector<uint8_t>({0, 1, 0, 1}));
  // auto: all to the CPU only where it is clearly faster alone; a measurement that failed gives none.
  EXPECT_EQ(offload::auto_cpu_share(60.0, 30.0), 1.0);
  EXPECT_EQ(offload::auto_cpu_share(55.0, 50.0), 0.0);
  EXPECT_EQ(offload::auto_cpu_share(0.0, 30.0), 0.0);
  EXPECT_EQ(offload::auto_cpu_share(60.0, 0.0), 0.0);
}

struct BlockMatrix {
  std::vector<uint8_t> bytes;
  TensorView view;
};
BlockMatrix random_matrix(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  BlockMatrix m;
  m.bytes.resize(size_t(rows * row_bytes(t, cols)));
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> v = test::random_vector(size_t(cols), rng, 0.5f);
    quant::quantize_row(t, v.data(), m.bytes.data() + r * row_bytes(t, cols), cols);
  }
  m.view = TensorView::matrix(m.bytes.data(), t, rows, cols);
  return m;
}

TEST(CpuExperts, RowsAreTheCpuRunnersExpertOutputsPerPair) {
  cpu::set_activation_mode(cpu::ActivationMode::Q8);
  std::mt19937 rng(7);
  const int64_t H = 512, I = 256, E = 6, n = 3;
  std::vector<BlockMatrix> gate, up, down;
  for (int64_t e = 0; e < E; ++e) {
    gate.push_back(random_matrix(DType::Q4_K, I, H, rng));
    up.push_back(random_matrix(DType::Q4_K, I, H, rng));
    down.push_back(random_matrix(DType::Q6_K, H, I, rng));
  }
  const cuda::MoeShape shape{.hidden = H, .width = I, .n_experts = int32_t(E), .top_k = 1,
                             .gate_up_type = DType::Q4_K, .down_type = DType::Q6_K};
  std::vector<cuda::ExpertWeights> host;
  std::vector<cpu::ExpertView> views;
  for (int64_t e = 0; e < E; ++e) {
    host.push_back({gate[size_t(e)].bytes.data(), up[size_t(e)].bytes.data(), down[size_t(e)].bytes.data()});
    views.push_back({&gate[size_t(e)].view, &up[size_t(e)].view, &down[size_t(e)].view});
  }
  offload::CpuExperts::Layer layer = offload::cpu_layer(shape, host, {1, 0, 1, 1, 0, 1});
  const std::vector<float> x = test::random_vector(size_t(n * H), rng);
  ThreadPool pool(2);
  for (int64_t k : {1, 2}) {
    layer.shape.top_k = int32_t(k);
    // Token 0: CPU experts only; token 1: one of each, an invalid id; token 2: a GPU expert first.
    const std::vector<int32_t> all_ids = {0, 2, 3, 1, 4, 5};
    const std::vector<int32_t> ids = k == 1 ? std::vector<int32_t>{0, 1, 5} : all_ids;
    std::vector<int32_t> with_invalid = ids;
    if (k == 2) with_invalid[3] = int32_t(E);  // token 1's second slot: no expert
    const std::vector<float> weights = {0.7f, 0.3f, 0.55f, 0.45f, 0.9f, 0.1f};
    const float kSentinel = 1234.5f;
    std::vector<float> rows(size_t(n * k * H), kSentinel);
    const int64_t bytes = offload::cpu_expert_rows(pool, layer, x.data(), n, with_invalid.data(), weights.data(), rows.data());
    int64_t cpu_pairs = 0, distinct = 0;
    std::vector<bool> seen(size_t(E), false);
    for (int64_t q = 0; q < n * k; ++q) {
      const int32_t id = with_invalid[size_t(q)];
      const bool by_cpu = id >= 0 && id < E && layer.cpu[size_t(id)];
      cpu_pairs += by_cpu;
      if (by_cpu && !seen[size_t(id)]) seen[size_t(id)] = true, ++distinct;
      if (!by_cpu) {
        for (int64_t j = 0; j < H; ++j) ASSERT_EQ(rows[size_t(q * H + j)], kSentinel) << "pair " << q << " is the GPU's";
        continue;
      }
      // The CPU runner's MoE on this one pair: its output row is 0 + weight * E(x).
      std::vector<float> want(static_cast<size_t>(H));
      const float w = weights[size_t(q)];
      cpu::moe_experts(pool, x.data() + (q / k) * H, 1, H, 1, &id, &w, views, want.data());
      for (int64_t j = 0; j < H; ++j)
        ASSERT_EQ(rows[size_t(q * H + j)], want[size_t(j)]) << "top-" << k << " pair " << q << " element " << j;
    }
    EXPECT_GT(cpu_pairs, 0);
    EXPECT_EQ(bytes, distinct * int64_t(gate[0].view.nbytes() + up[0].view.nbytes() + down[0].view.nbytes()));
  }
}

}  // namespace
}  // namespace spill
#else
TEST(CpuExperts, SkippedWithoutCuda) { GTEST_SKIP() << "spill was built without CUDA"; }
#endif
