// The CUDA MoE expert path (backend/cuda/moe.h) against its CPU twin cpu::moe_experts_blocks, over
// awkward batches and routings; batch invariance; the expert table pointing at mapped pinned host
// memory; the table changing under a captured graph.
//
// The kernels round their inputs to int8 per block of 256 (x for gate/up, the activations h for
// down: quant::quantize_activations_q8's rounding, block_dot.cuh). The twin is given the rounded x'
// (the same values the kernels dot with; rounded to f32 for it) and keeps h unrounded, so the bound
// carries the rounding of h. Per output, from the arithmetic (e = 2^-24):
//   gate/up: |dg| <= G_gu * sum |x'| (|w| + |ml|)           (likewise du; G_gu includes the f32 x')
//   act h = silu(g) u: |dh| <= 1.1 (|dg| + e|g|) (|u| + |du|) + (|silu g| + 1.1 |dg|)(|du| + e|u|) + 8e|h|
//            (|silu'| <= 1.1; expf, the division and the product each a few ulp)
//   rounding of h: |qh_i| <= max over i's block of (|h| + |dh|) / 254 (1 + e) + 3.01 e (|h_i| + |dh_i|)
//            (half a step of the block's scale, plus the f32 roundings of 127 / max and h * that)
//   down: |dy| <= sum |wd| (|dh| + |qh|) + G_d * sum (|wd| + |ml|)(|h| + |dh| + |qh|) + e|y|
//   out: sum over slots of |weight| (|dy| + 2e|y|) + top_k e sum |weight y|
// where the twin rounds each stage to f32 too (its own e terms are inside the above).
#include <gtest/gtest.h>

#if SPILL_HAVE_CUDA
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/moe_blocks.h"
#include "backend/cuda/moe.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "quant/random_blocks.h"

namespace spill {
namespace {

using test::DeviceBuffer;

struct MoeCase {
  int64_t hidden, width;
  int32_t n_experts, top_k;
  DType gate_up, down;
};

cuda::MoeShape moe_shape(const MoeCase& c) {
  return {.hidden = c.hidden, .width = c.width, .n_experts = c.n_experts, .top_k = c.top_k,
          .gate_up_type = c.gate_up, .down_type = c.down};
}

// Random experts, one span each, laid out as expert_span_layout says.
struct Experts {
  cuda::ExpertSpanLayout layout;
  std::vector<uint8_t> bytes;  // n_experts spans
  std::vector<cpu::BlockExpert> host;
  Experts(const MoeCase& c, uint64_t seed) {
    layout = cuda::expert_span_layout(moe_shape(c));
    bytes.assign(size_t(layout.bytes * c.n_experts), 0);
    const int64_t gate_blocks = c.width * row_bytes(c.gate_up, c.hidden) / dtype_traits(c.gate_up).block_bytes;
    const int64_t down_blocks = c.hidden * row_bytes(c.down, c.width) / dtype_traits(c.down).block_bytes;
    for (int32_t e = 0; e < c.n_experts; ++e) {
      uint8_t* span = bytes.data() + e * layout.bytes;
      quant::fill_random_blocks(c.gate_up, span + layout.gate_offset, gate_blocks, seed * 1000 + 3 * e);
      quant::fill_random_blocks(c.gate_up, span + layout.up_offset, gate_blocks, seed * 1000 + 3 * e + 1);
      quant::fill_random_blocks(c.down, span + layout.down_offset, down_blocks, seed * 1000 + 3 * e + 2);
      host.push_back({span + layout.gate_offset, span + layout.up_offset, span + layout.down_offset});
    }
  }
  // The device table for the spans copied to `base` (a device-visible address).
  std::vector<cuda::ExpertWeights> table(const uint8_t* base) const {
    std::vector<cuda::ExpertWeights> t;
    for (size_t e = 0; e < host.size(); ++e) {
      const uint8_t* span = base + int64_t(e) * layout.bytes;
      t.push_back({span + layout.gate_offset, span + layout.up_offset, span + layout.down_offset});
    }
    return t;
  }
};

struct Routing {
  std::vector<float> x;        // [n, hidden]
  std::vector<int32_t> ids;    // [n, k]
  std::vector<float> weights;  // [n, k]
};

// Distinct random experts per token from the first `pool` experts (pool < n_experts leaves the
// others without tokens), softmax-like positive weights summing to 1.
Routing random_routing(const MoeCase& c, int64_t n, int32_t pool, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Routing r;
  r.x.resize(size_t(n * c.hidden));
  for (float& v : r.x) v = dist(rng);
  std::vector<int32_t> order(static_cast<size_t>(pool));
  for (int64_t t = 0; t < n; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    float sum = 0;
    for (int32_t j = 0; j < c.top_k; ++j) {
      r.ids.push_back(order[size_t(j)]);
      r.weights.push_back(0.1f + std::fabs(dist(rng)));
      sum += r.weights.back();
    }
    for (int32_t j = 0; j < c.top_k; ++j) r.weights[size_t(t * c.top_k + j)] /= sum;
  }
  return r;
}

// The twin's output for the rounded activations the kernels take (x' rounded to f32 for it).
std::vector<float> run_twin(const MoeCase& c, const std::vector<cpu::BlockExpert>& experts, const Routing& r,
                            int64_t n) {
  std::vector<float> xr(r.x.size());
  for (int64_t t = 0; t < n; ++t) {
    const auto xq = test::rounded_activations(r.x.data() + t * c.hidden, c.hidden);
    for (int64_t i = 0; i < c.hidden; ++i) xr[size_t(t * c.hidden + i)] = float(xq[size_t(i)]);
  }
  std::vector<float> want(size_t(n * c.hidden));
  cpu::moe_experts_blocks({.hidden = c.hidden, .width = c.width, .top_k = c.top_k, .gate_up_type = c.gate_up,
                           .down_type = c.down},
                          experts, xr.data(), n, r.ids.data(), r.weights.data(), want.data());
  return want;
}

// Runs the CUDA path with the experts' spans at `span_base` (device-visible, already filled).
// tile_from: the plan's tensor-core decode tiles (plan_moe; -1 the process default).
std::vector<float> run_cuda(const MoeCase& c, const Experts& ex, const uint8_t* span_base, const Routing& r,
                            int64_t n, int64_t max_tokens, int64_t tile_from = -1) {
  const cuda::MoePlan plan = cuda::plan_moe(moe_shape(c), max_tokens, tile_from);
  const auto table = ex.table(span_base);
  DeviceBuffer dtable(table.size() * sizeof(cuda::ExpertWeights)), dx(r.x.size() * 4), dids(r.ids.size() * 4),
      dw(r.weights.size() * 4), dout(size_t(n * c.hidden) * 4), ws(size_t(plan.workspace_bytes));
  dtable.upload(table.data(), dtable.bytes);
  dx.upload(r.x.data(), dx.bytes);
  dids.upload(r.ids.data(), dids.bytes);
  dw.upload(r.weights.data(), dw.bytes);
  dout.poison();
  cuda::init_moe_workspace(plan, ws.ptr, nullptr);
  cuda::moe_experts(plan,
                    {.table = dtable.as<cuda::ExpertWeights>(), .x = dx.as<float>(), .n = n, .ids = dids.as<int32_t>(),
                     .weights = dw.as<float>(), .out = dout.as<float>(), .workspace = ws.ptr},
                    nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return test::download<float>(dout.ptr, size_t(n * c.hidden));
}

// The error bound above, per output, in float64 from the dequantized weights.
std::vector<double> error_bound(const MoeCase& c, const Experts& ex, const Routing& r, int64_t n) {
  const double e = std::ldexp(1.0, -24);
  const double g_gu = test::q8_dot_error_gamma(c.hidden, 1), g_d = test::q8_dot_error_gamma(c.width, 0);
  std::vector<double> bound(size_t(n * c.hidden), 0.0), y_abs_sum(size_t(n * c.hidden), 0.0);
  std::vector<float> w(size_t(std::max(c.hidden, c.width))), off(w.size());
  std::vector<double> h(size_t(c.width)), dh(size_t(c.width)), qh(size_t(c.width));
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<double> x = test::rounded_activations(r.x.data() + t * c.hidden, c.hidden);
    for (int32_t j = 0; j < c.top_k; ++j) {
      const int32_t id = r.ids[size_t(t * c.top_k + j)];
      if (id < 0 || id >= c.n_experts) continue;
      const double weight = r.weights[size_t(t * c.top_k + j)];
      const auto& exp = ex.host[size_t(id)];
      const int64_t rb_gu = row_bytes(c.gate_up, c.hidden), rb_d = row_bytes(c.down, c.width);
      for (int64_t i = 0; i < c.width; ++i) {
        double gv[2], gm[2];
        for (int m = 0; m < 2; ++m) {
          const uint8_t* row = static_cast<const uint8_t*>(m ? exp.up : exp.gate) + i * rb_gu;
          quant::dequantize_row(c.gate_up, row, w.data(), c.hidden);
          test::offset_magnitudes(c.gate_up, row, c.hidden, off.data());
          double v = 0, mag = 0;
          for (int64_t q = 0; q < c.hidden; ++q) {
            v += double(w[size_t(q)]) * x[size_t(q)];
            mag += std::fabs(x[size_t(q)]) * (std::fabs(double(w[size_t(q)])) + off[size_t(q)]);
          }
          gv[m] = v;
          gm[m] = g_gu * mag;
        }
        const double g = gv[0], u = gv[1], dg = gm[0], du = gm[1];
        const double silu = g / (1.0 + std::exp(-g));
        h[size_t(i)] = silu * u;
        dh[size_t(i)] = 1.1 * (dg + e * std::fabs(g)) * (std::fabs(u) + du) +
                        (std::fabs(silu) + 1.1 * dg) * (du + e * std::fabs(u)) + 8 * e * std::fabs(h[size_t(i)]);
      }
      for (int64_t b0 = 0; b0 < c.width; b0 += 256) {
        const int64_t b1 = std::min<int64_t>(c.width, b0 + 256);
        double top = 0;
        for (int64_t i = b0; i < b1; ++i) top = std::max(top, std::fabs(h[size_t(i)]) + dh[size_t(i)]);
        for (int64_t i = b0; i < b1; ++i)
          qh[size_t(i)] = top / 254.0 * (1 + e) + 3.01 * e * (std::fabs(h[size_t(i)]) + dh[size_t(i)]);
      }
      for (int64_t row_i = 0; row_i < c.hidden; ++row_i) {
        const uint8_t* row = static_cast<const uint8_t*>(exp.down) + row_i * rb_d;
        quant::dequantize_row(c.down, row, w.data(), c.width);
        test::offset_magnitudes(c.down, row, c.width, off.data());
        double y = 0, dy = 0, mag = 0;
        for (int64_t q = 0; q < c.width; ++q) {
          y += double(w[size_t(q)]) * h[size_t(q)];
          dy += std::fabs(double(w[size_t(q)])) * (dh[size_t(q)] + qh[size_t(q)]);
          mag += (std::fabs(double(w[size_t(q)])) + off[size_t(q)]) *
                 (std::fabs(h[size_t(q)]) + dh[size_t(q)] + qh[size_t(q)]);
        }
        dy += g_d * mag + e * std::fabs(y);
        bound[size_t(t * c.hidden + row_i)] += std::fabs(weight) * (dy + 2 * e * std::fabs(y));
        y_abs_sum[size_t(t * c.hidden + row_i)] += std::fabs(weight * y);
      }
    }
  }
  for (size_t i = 0; i < bound.size(); ++i) bound[i] += c.top_k * e * y_abs_sum[i];
  return bound;
}

void expect_matches_twin(const MoeCase& c, int64_t n, int32_t pool, uint64_t seed, int64_t tile_from = -1) {
  SCOPED_TRACE("tile_from " + std::to_string(tile_from));
  const Experts ex(c, seed);
  const Routing r = random_routing(c, n, pool, seed + 7);
  DeviceBuffer spans(ex.bytes.size());
  spans.upload(ex.bytes.data(), ex.bytes.size());
  const auto got = run_cuda(c, ex, spans.as<uint8_t>(), r, n, n, tile_from);
  const std::vector<float> want = run_twin(c, ex.host, r, n);
  const auto bound = error_bound(c, ex, r, n);
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= bound[i]) && bad++ < 5)
      ADD_FAILURE() << dtype_name(c.gate_up) << "/" << dtype_name(c.down) << " H" << c.hidden << " I" << c.width
                    << " E" << c.n_experts << " k" << c.top_k << " n=" << n << " token " << i / size_t(c.hidden)
                    << " row " << i % size_t(c.hidden) << ": got " << got[i] << ", twin " << want[i] << ", bound "
                    << bound[i];
  EXPECT_EQ(bad, 0);
}

TEST(CudaMoe, MatchesCpuTwinOverBatchesAndFormats) {
  SPILL_SKIP_WITHOUT_GPU();
  // Batches 1, 3, 8, 17 and 64; Q4_K with a Q6_K down (as Q4_K_M files mix them); routing over a
  // pool smaller than the experts, so some get no tokens.
  const MoeCase q4{512, 256, 16, 4, DType::Q4_K, DType::Q6_K};
  uint64_t seed = 11;
  for (int64_t n : {1, 3, 8, 17, 64}) expect_matches_twin(q4, n, 12, seed++);
  for (DType t : {DType::Q3_K, DType::Q2_K, DType::Q5_K, DType::Q6_K})
    expect_matches_twin({768, 512, 8, 3, t, t}, 5, 8, seed++);
  // The tensor-core decode tiles (2 .. 8 tokens; gate/up only where down is Q6_K), in every format
  // they take.
  for (int64_t n : {2, 3, 8}) expect_matches_twin(q4, n, 12, seed++, 2);
  for (DType t : {DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q8_0})
    expect_matches_twin({768, 512, 8, 3, t, t}, 5, 8, seed++, 2);
  // Enough tokens per expert for the tensor-core path (mmq.cuh), in every format it takes; a
  // partial tile of rows (width 768 = 24 tiles of 32) and of tokens.
  for (DType t : {DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q8_0})
    expect_matches_twin({768, 512, 8, 3, t, t}, 40, 8, seed++);
  expect_matches_twin({512, 768, 8, 2, DType::Q4_K, DType::Q3_K}, 100, 6, seed++);
}

TEST(CudaMoe, TopKEqualToExpertCountAndSmallQ8Widths) {
  SPILL_SKIP_WITHOUT_GPU();
  // Every token routes to every expert; hidden 160 and width 96 are not powers of two.
  expect_matches_twin({160, 96, 5, 5, DType::Q8_0, DType::Q8_0}, 3, 5, 21);
  expect_matches_twin({160, 96, 5, 5, DType::Q8_0, DType::Q8_0}, 17, 5, 22);
}

TEST(CudaMoe, ManyTokensOnFewExperts) {
  SPILL_SKIP_WITHOUT_GPU();
  // 17 tokens all on the same 2 of 32 experts (17 tokens per expert), 30 experts idle.
  expect_matches_twin({256, 256, 32, 2, DType::Q4_K, DType::Q4_K}, 17, 2, 31);
}

TEST(CudaMoe, OutOfRangeIdsContributeNothing) {
  SPILL_SKIP_WITHOUT_GPU();
  const MoeCase c{256, 256, 4, 2, DType::Q4_K, DType::Q4_K};
  const Experts ex(c, 41);
  DeviceBuffer spans(ex.bytes.size());
  spans.upload(ex.bytes.data(), ex.bytes.size());
  // 3 tokens: the decode kernels, and the decode tiles (tile_from 2); 40: the grouped tensor-core
  // path, where the invalid ids form a token tile of their own.
  for (int64_t tile_from : {0, 2})
  for (int64_t n : {3, 40}) {
    Routing r = random_routing(c, n, 4, 42 + n);
    r.ids[1] = -1;
    r.ids[4] = 4;  // == n_experts
    if (n > 3) r.ids[37] = -7, r.ids[60] = 1 << 30;
    const auto got = run_cuda(c, ex, spans.as<uint8_t>(), r, n, n, tile_from);
    const std::vector<float> want = run_twin(c, ex.host, r, n);
    const auto bound = error_bound(c, ex, r, n);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_LE(std::fabs(double(got[i]) - want[i]), bound[i]) << "n " << n << " tile_from " << tile_from << " " << i;
  }
}

TEST(CudaMoe, TokenAloneIsBitIdenticalToTokenInBatchesOfEightAndSeventeen) {
  SPILL_SKIP_WITHOUT_GPU();
  for (DType type : {DType::Q4_K, DType::Q3_K, DType::Q8_0}) {
  SCOPED_TRACE(dtype_name(type));
  const MoeCase c{1024, 512, 16, 4, type, type};
  const Experts ex(c, 51);
  DeviceBuffer spans(ex.bytes.size());
  spans.upload(ex.bytes.data(), ex.bytes.size());
  // Few experts, so the token shares them with others of the batch. Alone, a token takes the
  // one-token kernels; up to 8 tokens the same kernels or (tile_from 2) the tensor-core decode
  // tiles over the pairs gathered in place; more the pairs grouped by expert first and the
  // tensor-core tiles (200: several tiles of 32 per expert): a token's bits must not change.
  for (int64_t tile_from : {0, 2})
  for (int64_t n : {2, 5, 8, 17, 200}) {
    if (tile_from == 2 && n > 8) continue;
    SCOPED_TRACE("tile_from " + std::to_string(tile_from));
    const Routing batch = random_routing(c, n, 6, 52);
    const auto all = run_cuda(c, ex, spans.as<uint8_t>(), batch, n, n, tile_from);
    for (int64_t t : {int64_t(0), int64_t(5), n - 1}) {
      Routing one;
      one.x.assign(batch.x.begin() + t * c.hidden, batch.x.begin() + (t + 1) * c.hidden);
      one.ids.assign(batch.ids.begin() + t * c.top_k, batch.ids.begin() + (t + 1) * c.top_k);
      one.weights.assign(batch.weights.begin() + t * c.top_k, batch.weights.begin() + (t + 1) * c.top_k);
      const auto alone = run_cuda(c, ex, spans.as<uint8_t>(), one, 1, 8);
      ASSERT_EQ(std::memcmp(alone.data(), all.data() + t * c.hidden, size_t(c.hidden) * 4), 0)
          << "token " << t << " of " << n;
    }
  }
  }
}

TEST(CudaMoe, MappedPinnedHostExpertsGiveBitIdenticalOutput) {
  SPILL_SKIP_WITHOUT_GPU();
  // The same bytes in VRAM and in mapped pinned host memory, read in place: the one-token kernels
  // (tile_from 0) and the tensor-core decode tiles (tile_from 2, which read each row's K steps as
  // pieces rather than whole rows) must give the same bits from either.
  for (DType type : {DType::Q3_K, DType::Q4_K}) {
    const MoeCase c{768, 256, 8, 3, type, type};
    const Experts ex(c, 61);
    const Routing r = random_routing(c, 4, 8, 62);
    DeviceBuffer spans(ex.bytes.size());
    spans.upload(ex.bytes.data(), ex.bytes.size());
    void* host = nullptr;
    CUDA_OK(cudaHostAlloc(&host, ex.bytes.size(), cudaHostAllocMapped));
    std::memcpy(host, ex.bytes.data(), ex.bytes.size());
    void* mapped = nullptr;
    CUDA_OK(cudaHostGetDevicePointer(&mapped, host, 0));
    for (int64_t tile_from : {0, 2}) {
      const auto vram = run_cuda(c, ex, spans.as<uint8_t>(), r, 4, 4, tile_from);
      const auto pinned = run_cuda(c, ex, static_cast<const uint8_t*>(mapped), r, 4, 4, tile_from);
      EXPECT_EQ(std::memcmp(vram.data(), pinned.data(), vram.size() * 4), 0)
          << dtype_name(type) << " tile_from " << tile_from;
    }
    cudaFreeHost(host);
  }
}

TEST(CudaMoe, CapturedGraphFollowsTheTableWhenItChanges) {
  SPILL_SKIP_WITHOUT_GPU();
  // The one-token kernels and (tile_from 2) the tensor-core decode tiles: each reads the table
  // when it runs, so a captured graph follows a changed entry.
  for (int64_t tile_from : {0, 2}) {
  SCOPED_TRACE("tile_from " + std::to_string(tile_from));
  const MoeCase c{256, 256, 4, 2, DType::Q4_K, DType::Q4_K};
  const Experts ex(c, 71);
  const Routing r = random_routing(c, 2, 4, 72);
  DeviceBuffer spans(ex.bytes.size());
  spans.upload(ex.bytes.data(), ex.bytes.size());
  const cuda::MoePlan plan = cuda::plan_moe(moe_shape(c), 2, tile_from);
  auto table = ex.table(spans.as<uint8_t>());
  DeviceBuffer dtable(table.size() * sizeof(cuda::ExpertWeights)), dx(r.x.size() * 4), dids(r.ids.size() * 4),
      dw(r.weights.size() * 4), dout(size_t(2 * c.hidden) * 4), ws(size_t(plan.workspace_bytes));
  dtable.upload(table.data(), dtable.bytes);
  dx.upload(r.x.data(), dx.bytes);
  dids.upload(r.ids.data(), dids.bytes);
  dw.upload(r.weights.data(), dw.bytes);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cuda::init_moe_workspace(plan, ws.ptr, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cuda::moe_experts(plan,
                    {.table = dtable.as<cuda::ExpertWeights>(), .x = dx.as<float>(), .n = 2, .ids = dids.as<int32_t>(),
                     .weights = dw.as<float>(), .out = dout.as<float>(), .workspace = ws.ptr},
                    stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  // Swap two experts' table entries (as an expert cache would move one): the replay must follow.
  std::swap(table[0], table[1]);
  dtable.upload(table.data(), dtable.bytes);
  dout.poison();
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  const auto got = test::download<float>(dout.ptr, size_t(2 * c.hidden));
  std::vector<cpu::BlockExpert> swapped = ex.host;
  std::swap(swapped[0], swapped[1]);
  const std::vector<float> want = run_twin(c, swapped, r, 2);
  Experts swapped_ex = ex;
  swapped_ex.host = swapped;
  const auto bound = error_bound(c, swapped_ex, r, 2);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_LE(std::fabs(double(got[i]) - want[i]), bound[i]) << i;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  }
}

TEST(CudaMoe, RefusesBadShapesClearly) {
  EXPECT_THROW(cuda::plan_moe({.hidden = 100, .width = 256, .n_experts = 8, .top_k = 2}, 1), Error);
  EXPECT_THROW(cuda::plan_moe({.hidden = 256, .width = 256, .n_experts = 8, .top_k = 9}, 1), Error);
  EXPECT_THROW(cuda::plan_moe({.hidden = 256, .width = 256, .n_experts = 8, .top_k = 2,
                               .gate_up_type = DType::MXFP4, .down_type = DType::Q4_K}, 1), Error);
}

}  // namespace
}  // namespace spill
#else
TEST(CudaMoe, SkippedWithoutCuda) { GTEST_SKIP() << "spill was built without CUDA"; }
#endif
