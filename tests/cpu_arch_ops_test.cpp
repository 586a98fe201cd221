// The CPU kernels the gpt-oss, DeepSeek-V3 and GLM-4.x families add, each against a plain
// float64 loop written from the models' definitions: windowed attention with sinks, latent
// attention with absorbed up-projections against the expanded keys and values, the sigmoid
// group-limited router with its correction bias, top-k-then-softmax, the clamped SwiGLU with
// biases, interleaved and partial rotary embeddings.
//
// Tolerances: fp32 sums of at most a few hundred products of O(1) values against float64; 2e-5
// relative is ~100x the rounding and far below what a wrong index, mask or scale gives (> 1e-2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "test_values.h"

namespace {

using spill::DType;
using spill::TensorView;
using spill::test::random_vector;

TensorView f32_view(const std::vector<float>& v, int64_t rows, int64_t cols) {
  TensorView t;
  t.data = v.data();
  t.dtype = DType::F32;
  t.ndim = 2;
  t.shape = {rows, cols, 0, 0};
  return t;
}

TensorView f32_vector(const std::vector<float>& v) {
  TensorView t;
  t.data = v.data();
  t.dtype = DType::F32;
  t.ndim = 1;
  t.shape = {int64_t(v.size()), 0, 0, 0};
  return t;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// ---- attention: sliding window and sinks ----------------------------------------------------

// Windows shorter and longer than the sequence, with and without sinks, two steps (a cached
// prefix, then the rest) over blocks given out of order.
class WindowedAttention : public ::testing::TestWithParam<std::tuple<int32_t, bool>> {};

TEST_P(WindowedAttention, MatchesFloat64) {
  const auto [window, with_sinks] = GetParam();
  const int64_t D = 8, n_heads = 4, n_kv = 2, group = n_heads / n_kv;
  const int32_t block_size = 3, total_len = 11, cached = 4;
  std::mt19937 rng(uint32_t(window * 7 + with_sinks));
  const auto q = random_vector(size_t(total_len * n_heads * D), rng);
  const auto k = random_vector(size_t(total_len * n_kv * D), rng);
  const auto v = random_vector(size_t(total_len * n_kv * D), rng);
  const auto sinks = random_vector(size_t(n_heads), rng, 2.0f);
  std::vector<float> kc(size_t(8 * block_size * n_kv * D), NAN), vc = kc;
  spill::cpu::PagedKv kv{kc.data(), vc.data(), block_size, n_kv, D};
  const std::vector<int32_t> table = {6, 2, 7, 0};
  spill::ThreadPool pool(2);
  const float scale = 0.3f;  // not 1/sqrt(D): the parameter must be used
  const spill::cpu::AttentionParams params{.scale = scale, .window = window,
                                           .sinks = with_sinks ? sinks.data() : nullptr};
  std::vector<float> out(size_t(total_len * n_heads * D), NAN);
  spill::cpu::AttentionChunk first{0, cached, 0, table};
  spill::cpu::paged_attention(pool, kv, {&first, 1}, q.data(), k.data(), v.data(), n_heads, out.data(), params);
  spill::cpu::AttentionChunk second{0, total_len - cached, cached, table};
  spill::cpu::paged_attention(pool, kv, {&second, 1}, q.data() + cached * n_heads * D, k.data() + cached * n_kv * D,
                              v.data() + cached * n_kv * D, n_heads, out.data() + cached * n_heads * D, params);
  for (int32_t t = 0; t < total_len; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / group;
      const int32_t lo = window > 0 ? std::max(0, t - window + 1) : 0;
      std::vector<double> s;
      double mx = with_sinks ? sinks[size_t(h)] : -1e300;
      for (int32_t p = lo; p <= t; ++p) {
        double d = 0;
        for (int64_t j = 0; j < D; ++j) d += double(q[size_t((t * n_heads + h) * D + j)]) * k[size_t((p * n_kv + kvh) * D + j)];
        s.push_back(d * scale);
        mx = std::max(mx, s.back());
      }
      double den = with_sinks ? std::exp(sinks[size_t(h)] - mx) : 0;
      for (double& e : s) den += e = std::exp(e - mx);
      for (int64_t j = 0; j < D; ++j) {
        double ref = 0;
        for (int32_t p = lo; p <= t; ++p) ref += s[size_t(p - lo)] / den * v[size_t((p * n_kv + kvh) * D + j)];
        ASSERT_NEAR(out[size_t((t * n_heads + h) * D + j)], ref, 2e-5 * (1 + std::abs(ref)))
            << "t " << t << " h " << h << " j " << j;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Windows, WindowedAttention,
                         ::testing::Combine(::testing::Values(0, 1, 4, 20), ::testing::Bool()));

// ---- multi-head latent attention ------------------------------------------------------------

// The absorbed computation (scores against latents, one value up-projection per head) against
// the expanded one (every position's keys and values up-projected), in float64, over a cached
// prefix and a second step; kv_b in F32 and BF16 (BF16 exercises the dequantizing row reads).
class MlaAttention : public ::testing::TestWithParam<DType> {};

TEST_P(MlaAttention, AbsorbedEqualsExpanded) {
  const DType dtype = GetParam();
  const int64_t heads = 3, R = 20, nope = 6, rope = 4, vd = 5, per_head = nope + vd, entry = R + rope;
  const int32_t block_size = 4, total_len = 9, cached = 5;
  std::mt19937 rng(dtype == DType::F32 ? 3 : 4);
  const auto q = random_vector(size_t(total_len * heads * (nope + rope)), rng);
  const auto latent = random_vector(size_t(total_len * entry), rng);
  auto w = random_vector(size_t(heads * per_head * R), rng, 0.3f);
  std::vector<uint16_t> w16(w.size());
  if (dtype == DType::BF16)
    for (size_t i = 0; i < w.size(); ++i) w[i] = spill::bf16_to_f32(w16[i] = spill::f32_to_bf16(w[i]));
  TensorView kv_b = f32_view(w, heads * per_head, R);
  if (dtype == DType::BF16) kv_b.data = w16.data(), kv_b.dtype = DType::BF16;
  std::vector<float> cache(size_t(6 * block_size * entry), NAN);
  const spill::cpu::PagedLatentKv kv{cache.data(), block_size, entry};
  const std::vector<int32_t> table = {5, 1, 3};
  const spill::cpu::MlaAttentionParams params{.n_heads = heads, .kv_lora_rank = R, .qk_nope_head_dim = nope,
                                              .qk_rope_head_dim = rope, .v_head_dim = vd, .scale = 0.21f};
  spill::ThreadPool pool(3);
  std::vector<float> out(size_t(total_len * heads * vd), NAN);
  spill::cpu::AttentionChunk first{0, cached, 0, table};
  spill::cpu::mla_attention(pool, params, kv, {&first, 1}, q.data(), latent.data(), kv_b, out.data());
  spill::cpu::AttentionChunk second{0, total_len - cached, cached, table};
  spill::cpu::mla_attention(pool, params, kv, {&second, 1}, q.data() + cached * heads * (nope + rope),
                            latent.data() + cached * entry, kv_b, out.data() + cached * heads * vd);
  // Expanded: k_nope(p) = W_uk c(p), v(p) = W_uv c(p), k_rope(p) shared by the heads.
  for (int32_t t = 0; t < total_len; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* qh = q.data() + (t * heads + h) * (nope + rope);
      std::vector<double> s(static_cast<size_t>(t + 1));
      std::vector<std::vector<double>> vals(size_t(t + 1), std::vector<double>(size_t(vd)));
      double mx = -1e300;
      for (int32_t p = 0; p <= t; ++p) {
        const float* c = latent.data() + p * entry;
        double d = 0;
        for (int64_t i = 0; i < nope; ++i) {
          double k_i = 0;
          for (int64_t r = 0; r < R; ++r) k_i += double(w[size_t((h * per_head + i) * R + r)]) * c[r];
          d += qh[i] * k_i;
        }
        for (int64_t i = 0; i < rope; ++i) d += double(qh[nope + i]) * c[R + i];
        for (int64_t j = 0; j < vd; ++j)
          for (int64_t r = 0; r < R; ++r) vals[size_t(p)][size_t(j)] += double(w[size_t((h * per_head + nope + j) * R + r)]) * c[r];
        s[size_t(p)] = d * 0.21;
        mx = std::max(mx, s[size_t(p)]);
      }
      double den = 0;
      for (double& e : s) den += e = std::exp(e - mx);
      for (int64_t j = 0; j < vd; ++j) {
        double ref = 0;
        for (int32_t p = 0; p <= t; ++p) ref += s[size_t(p)] / den * vals[size_t(p)][size_t(j)];
        ASSERT_NEAR(out[size_t((t * heads + h) * vd + j)], ref, 2e-5 * (1 + std::abs(ref)))
            << "t " << t << " h " << h << " j " << j;
      }
    }
  // The cache holds exactly each token's latent: kv_lora_rank + rope values per position.
  for (int32_t p = 0; p < total_len; ++p)
    for (int64_t i = 0; i < entry; ++i)
      ASSERT_EQ(kv.at(table[size_t(p / block_size)], p % block_size)[i], latent[size_t(p * entry + i)]);
}

INSTANTIATE_TEST_SUITE_P(Types, MlaAttention, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(spill::dtype_name(info.param)); });

// A token's MLA output is the same alone and in a batch with others (decode after prefill).
TEST(MlaAttention, BatchInvariant) {
  const int64_t heads = 2, R = 16, nope = 4, rope = 2, vd = 4, entry = R + rope;
  std::mt19937 rng(9);
  const auto q = random_vector(size_t(6 * heads * (nope + rope)), rng);
  const auto latent = random_vector(size_t(6 * entry), rng);
  const auto w = random_vector(size_t(heads * (nope + vd) * R), rng, 0.3f);
  const TensorView kv_b = f32_view(w, heads * (nope + vd), R);
  const spill::cpu::MlaAttentionParams params{.n_heads = heads, .kv_lora_rank = R, .qk_nope_head_dim = nope,
                                              .qk_rope_head_dim = rope, .v_head_dim = vd, .scale = 0.3f};
  spill::ThreadPool pool(2);
  std::vector<float> c1(static_cast<size_t>(4 * 2 * entry)), c2 = c1;
  const std::vector<int32_t> table = {0, 1, 2};
  std::vector<float> all(static_cast<size_t>(6 * heads * vd)), one(all.size());
  spill::cpu::AttentionChunk whole{0, 6, 0, table};
  spill::cpu::mla_attention(pool, params, {c1.data(), 2, entry}, {&whole, 1}, q.data(), latent.data(), kv_b, all.data());
  for (int32_t t = 0; t < 6; ++t) {
    spill::cpu::AttentionChunk step{0, 1, t, table};
    spill::cpu::mla_attention(pool, params, {c2.data(), 2, entry}, {&step, 1}, q.data() + t * heads * (nope + rope),
                              latent.data() + t * entry, kv_b, one.data() + t * heads * vd);
  }
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], one[i]) << i;
}

// ---- routers --------------------------------------------------------------------------------

struct RouteRef {
  std::vector<int32_t> ids;  // descending weight
  std::vector<double> weights;
};

RouteRef sigmoid_grouped_ref(const float* logits, const float* bias, int64_t E, int64_t G, int64_t TG, int64_t k,
                             bool renorm, double scale) {
  std::vector<double> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    s[size_t(e)] = 1 / (1 + std::exp(-double(logits[e])));
    c[size_t(e)] = s[size_t(e)] + (bias ? bias[e] : 0.0);
  }
  const int64_t per = E / G;
  std::vector<double> gs(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> m(c.begin() + g * per, c.begin() + (g + 1) * per);
    std::sort(m.rbegin(), m.rend());
    gs[size_t(g)] = m[0] + (per > 1 ? m[1] : 0);
  }
  std::vector<int32_t> gorder(static_cast<size_t>(G));
  std::iota(gorder.begin(), gorder.end(), 0);
  std::stable_sort(gorder.begin(), gorder.end(), [&](int32_t a, int32_t b) { return gs[size_t(a)] > gs[size_t(b)]; });
  std::vector<int32_t> cand;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t j = 0; j < (G > 1 ? TG : 1); ++j)
      if (G == 1 || e / per == gorder[size_t(j)]) cand.push_back(int32_t(e));
  std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return c[size_t(a)] > c[size_t(b)]; });
  cand.resize(size_t(k));
  double sum = 0;
  for (int32_t e : cand) sum += s[size_t(e)];
  std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
  RouteRef r;
  for (int32_t e : cand) {
    r.ids.push_back(e);
    r.weights.push_back(s[size_t(e)] / (renorm ? sum + 1e-20 : 1.0) * scale);
  }
  return r;
}

class SigmoidRouter : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, bool>> {};

TEST_P(SigmoidRouter, MatchesFloat64) {
  const auto [E, G, TG, renorm] = GetParam();
  const int64_t k = std::min<int64_t>(4, TG * (E / G)), n = 23;
  std::mt19937 rng(uint32_t(E * 31 + G * 7 + TG + renorm));
  const auto logits = random_vector(size_t(n * E), rng, 1.5f);
  const auto bias = random_vector(size_t(E), rng, 0.1f);
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::vector<float> w(static_cast<size_t>(n * k));
  const spill::cpu::SigmoidRouterParams params{.n_group = G, .topk_group = TG, .renormalise = renorm,
                                               .routed_scaling_factor = 2.5f, .correction_bias = bias.data()};
  spill::cpu::route_sigmoid_grouped(params, logits.data(), n, E, k, ids.data(), w.data());
  for (int64_t t = 0; t < n; ++t) {
    const RouteRef ref = sigmoid_grouped_ref(logits.data() + t * E, bias.data(), E, G, TG, k, renorm, 2.5);
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(ids[size_t(t * k + j)], ref.ids[size_t(j)]) << "token " << t << " slot " << j;
      ASSERT_NEAR(w[size_t(t * k + j)], ref.weights[size_t(j)], 1e-6 * (1 + ref.weights[size_t(j)]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SigmoidRouter,
                         ::testing::Values(std::make_tuple(16, 4, 2, true), std::make_tuple(16, 1, 1, false),
                                           std::make_tuple(12, 6, 1, true), std::make_tuple(8, 2, 2, false),
                                           std::make_tuple(5, 1, 1, true)));

// The correction bias chooses but does not weight: a bias that lifts expert 3 over expert 0
// changes the choice, and expert 3's weight is its own sigmoid score.
TEST(SigmoidRouter, CorrectionBiasSelectsButDoesNotWeight) {
  const float logits[4] = {2.0f, 1.0f, 0.0f, 1.5f};
  const float bias[4] = {0.0f, 0.0f, 0.0f, 0.2f};  // sigmoid(1.5) + 0.2 > sigmoid(2.0)
  int32_t ids[1];
  float w[1];
  spill::cpu::route_sigmoid_grouped({.correction_bias = bias}, logits, 1, 4, 1, ids, w);
  EXPECT_EQ(ids[0], 3);
  EXPECT_NEAR(w[0], 1 / (1 + std::exp(-1.5)), 1e-7);
  spill::cpu::route_sigmoid_grouped({}, logits, 1, 4, 1, ids, w);
  EXPECT_EQ(ids[0], 0);
}

// Group limits: the best expert overall sits in a group whose top-2 sum loses; it is not chosen.
TEST(SigmoidRouter, GroupLimitExcludesExpertsOfLosingGroups) {
  // groups {0,1} {2,3}: group 0 = {3.0, -3.0}, group 1 = {2.0, 2.0}; top-2 sums favour group 1.
  const float logits[4] = {3.0f, -3.0f, 2.0f, 2.0f};
  int32_t ids[2];
  float w[2];
  spill::cpu::route_sigmoid_grouped({.n_group = 2, .topk_group = 1}, logits, 1, 4, 2, ids, w);
  EXPECT_EQ(std::min(ids[0], ids[1]), 2);
  EXPECT_EQ(std::max(ids[0], ids[1]), 3);
}

TEST(TopKSoftmaxRouter, SoftmaxOverTheChosenOnly) {
  const int64_t E = 9, k = 3, n = 17;
  std::mt19937 rng(21);
  const auto logits = random_vector(size_t(n * E), rng, 2.0f);
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::vector<float> w(static_cast<size_t>(n * k));
  spill::cpu::route_topk_softmax(logits.data(), n, E, k, ids.data(), w.data());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    const float* l = logits.data() + t * E;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
    double den = 0;
    for (int64_t j = 0; j < k; ++j) den += std::exp(double(l[order[size_t(j)]]) - l[order[0]]);
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(ids[size_t(t * k + j)], order[size_t(j)]);
      ASSERT_NEAR(w[size_t(t * k + j)], std::exp(double(l[order[size_t(j)]]) - l[order[0]]) / den, 1e-6);
    }
  }
}

// ---- clamped SwiGLU with biases (gpt-oss experts) ----------------------------------------------

TEST(ClampedSwiGLU, MatchesFloat64WithBiasesAndClamping) {
  const int64_t H = 24, I = 10, n = 7;
  std::mt19937 rng(33);
  const auto x = random_vector(size_t(n * H), rng);
  const auto gate = random_vector(size_t(I * H), rng, 1.5f), up = random_vector(size_t(I * H), rng, 1.5f);
  const auto down = random_vector(size_t(H * I), rng, 0.2f);
  const auto gb = random_vector(size_t(I), rng), ub = random_vector(size_t(I), rng), db = random_vector(size_t(H), rng);
  const TensorView g = f32_view(gate, I, H), u = f32_view(up, I, H), d = f32_view(down, H, I);
  const TensorView gbv = f32_vector(gb), ubv = f32_vector(ub), dbv = f32_vector(db);
  spill::ThreadPool pool(2);
  std::vector<float> out(static_cast<size_t>(n * H));
  const float alpha = 1.702f, limit = 3.0f;  // a low limit: many units clamp on both sides
  spill::cpu::swiglu_mlp(pool, x.data(), n, {&g, &u, &d, &gbv, &ubv, &dbv}, out.data(),
                         {.kind = spill::MlpActivation::ClampedSwiGLU, .alpha = alpha, .limit = limit});
  int clamped = 0;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> act(static_cast<size_t>(I));
    for (int64_t i = 0; i < I; ++i) {
      double a = gb[size_t(i)], b = ub[size_t(i)];
      for (int64_t h = 0; h < H; ++h) {
        a += double(gate[size_t(i * H + h)]) * x[size_t(t * H + h)];
        b += double(up[size_t(i * H + h)]) * x[size_t(t * H + h)];
      }
      clamped += a > limit || std::abs(b) > limit;
      a = std::min(a, double(limit));
      b = std::clamp(b, -double(limit), double(limit));
      act[size_t(i)] = (b + 1) * a / (1 + std::exp(-alpha * a));
    }
    std::vector<double> ref(static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) {
      ref[size_t(h)] = db[size_t(h)];
      for (int64_t i = 0; i < I; ++i) ref[size_t(h)] += double(down[size_t(h * I + i)]) * act[size_t(i)];
    }
    const double scale = max_abs(ref);
    for (int64_t h = 0; h < H; ++h) ASSERT_NEAR(out[size_t(t * H + h)], ref[size_t(h)], 2e-5 * (1 + scale));
  }
  EXPECT_GT(clamped, 10) << "the test should exercise the clamp";
}

// ---- rotary embeddings: interleaved pairs, partial dims at an offset --------------------------

TEST(Rope, InterleavedAndPartialWithOffset) {
  spill::RopeSpec spec;
  spec.theta = 5000;
  const int64_t stride = 14, offset = 6, dims = 8, heads = 2;  // rotate dims [6, 14) of each head
  for (bool interleaved : {false, true}) {
    auto table = spill::cpu::make_rope_table(spec, dims, interleaved);
    ASSERT_EQ(table.dims(), dims);
    std::mt19937 rng(interleaved ? 8 : 7);
    std::vector<float> x = random_vector(size_t(3 * heads * stride), rng), y = x;
    const int32_t positions[] = {0, 5, 91};
    spill::cpu::apply_rope(table, y.data(), 3, heads, stride, positions, offset);
    for (int t = 0; t < 3; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const float* xi = x.data() + (t * heads + h) * stride;
        const float* yi = y.data() + (t * heads + h) * stride;
        for (int64_t i = 0; i < offset; ++i) ASSERT_EQ(yi[i], xi[i]);  // the pass-through part
        for (int64_t i = 0; i < dims / 2; ++i) {
          const double angle = positions[t] * std::pow(5000.0, -2.0 * double(i) / double(dims));
          const int64_t a = offset + (interleaved ? 2 * i : i), b = interleaved ? a + 1 : a + dims / 2;
          ASSERT_NEAR(yi[a], xi[a] * std::cos(angle) - xi[b] * std::sin(angle), 2e-5);
          ASSERT_NEAR(yi[b], xi[b] * std::cos(angle) + xi[a] * std::sin(angle), 2e-5);
        }
      }
  }
}

}  // namespace
