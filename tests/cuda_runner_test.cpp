// The CUDA runner end to end against the CPU runner (src/model/decoder.cpp), the reference: the
// same steps on both, logits compared within a bound from the arithmetic, greedy tokens identical
// (but for near-ties);
// prefill chunks and decodes mixed in one step; shuffled block tables; batch invariance on the GPU
// (a sequence's logits bit-identical alone or batched); bad input as spill::Error.
//
// The bound. Each dot product of K terms is within gamma_K sum |x w| of exact on either side, so
// the CPU's and the GPU's differ by 2 gamma_K relative to sum |x w|. A layer chains the q/k/v,
// attention score, attention output, o, router, gate/up and down dots; RMSNorm renormalises each
// layer's input, so to first order their relative errors add along the chain:
//   eps = sum over layers of sum over the chain's dots of 2 gamma_K  (+ 2 x 2^-9 per layer for a
//   BF16 KV cache: K and V rounded once each),
// and a logit is off by at most eps times the largest |logit| (the head's sum |x w| is of that
// size for these models, whose logits are spread by design). A BF16 cache rounds K and V (2^-8
// relative each): V's rounding adds 2^-8 to the attention output's relative error, K's moves every
// score by at most 2^-8 S, S the largest sum |q k| / sqrt(D), and the softmax weights relatively by
// twice that; with per-head RMS-normed q and k, S <= sqrt(D) max|w_q| max|w_k| (Cauchy-Schwarz).
// Greedy picks must agree wherever that bound decides them (expect_same_pick).
#include <gtest/gtest.h>

#if SPILL_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/collectives.h"
#include "backend/cuda/cuda_runner.h"
#include "backend/cuda/expert_parallel_runner.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/quantize_on_load.h"
#include "model/runner.h"
#include "model/synthetic_source.h"
#include "offload/model_experts.h"
#include "test_models.h"
#include "test_values.h"

namespace spill {
namespace {

using testing::RandomModelParams;
using testing::TempDir;
using testing::write_random_model;

using test::f32_gamma;
using test::kF32Unit;

// The bound on a score, S above, from the model's q/k norm weights (per-head norms only).
double score_bound(const Model& m) {
  const ModelSpec& s = m.spec();
  double wq = 0, wk = 0;
  std::vector<float> row(static_cast<size_t>(s.head_dim));
  for (const LayerWeights& l : m.layers) {
    if (s.qk_norm != QkNorm::PerHead) fail("score_bound: needs per-head q/k norms");
    for (auto [t, w] : {std::pair{&l.q_norm, &wq}, std::pair{&l.k_norm, &wk}}) {
      TensorView v = *t;
      v.ndim = 2;
      v.shape = {1, s.head_dim, 0, 0};
      cpu::load_row(v, 0, row.data());
      for (float f : row) *w = std::max(*w, double(std::fabs(f)));
    }
  }
  return std::sqrt(double(s.head_dim)) * wq * wk;
}

double chain_eps(const ModelSpec& s, int64_t max_positions, KvFormat kv, double score = 0) {
  const int64_t H = s.hidden_size, D = s.head_dim;
  // A shared expert runs beside the routed ones (their outputs are added): the longer of the two
  // chains, with the widest down projection, bounds both.
  const int64_t I = std::max({s.intermediate_size, s.moe_intermediate_size, s.shared_intermediate_size()});
  double per_layer = 2 * (f32_gamma(H) + f32_gamma(D) + f32_gamma(max_positions + 32) + f32_gamma(s.q_dim()) +
                          f32_gamma(H) + f32_gamma(H) + f32_gamma(I) +
                          f32_gamma(std::max<int64_t>(s.n_experts_per_token, 1)));
  if (kv == KvFormat::BF16) {
    if (score <= 0) fail("chain_eps: a BF16 cache needs the score bound");
    per_layer += std::ldexp(1.0, -8) * (1 + 2 * score);
  }
  return double(s.n_layers) * per_layer + 2 * f32_gamma(H);
}

// One sequence's part of a step, with its own block table.
struct Part {
  int seq;
  std::vector<int32_t> tokens;
  int32_t start_pos;
  bool want_logits = true;
};

struct Steps {
  int32_t block_size = 4;
  std::vector<std::vector<int32_t>> tables;  // per sequence
  ForwardBatch make(const std::vector<Part>& parts, bool all_logits) const {
    ForwardBatch b;
    b.all_logits = all_logits;
    for (const Part& p : parts) {
      SeqChunk c;
      c.first_token = int32_t(b.tokens.size());
      c.n_tokens = int32_t(p.tokens.size());
      c.start_pos = p.start_pos;
      c.block_table = tables[size_t(p.seq)];
      c.want_logits = p.want_logits;
      c.slot = int32_t(p.seq);  // one slot per sequence, as the scheduler gives them
      b.tokens.insert(b.tokens.end(), p.tokens.begin(), p.tokens.end());
      b.seqs.push_back(c);
    }
    return b;
  }
};

// Block tables for n_seqs sequences of up to max_len positions: shuffled, disjoint.
Steps make_steps(int n_seqs, int32_t max_len, int32_t block_size, int64_t* n_blocks, uint32_t seed) {
  Steps s;
  s.block_size = block_size;
  const int32_t per = (max_len + block_size - 1) / block_size;
  std::vector<int32_t> pool(size_t(per * n_seqs + 5));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(seed));
  for (int i = 0; i < n_seqs; ++i) s.tables.emplace_back(pool.begin() + i * per, pool.begin() + (i + 1) * per);
  *n_blocks = int64_t(pool.size());
  return s;
}

int32_t argmax(const float* row, int64_t n) { return int32_t(std::max_element(row, row + n) - row); }

// Greedy picks must agree wherever the arithmetic decides them: with every logit within tol of
// the CPU's, the GPU can only pick j over the CPU's i when c[i] - c[j] <= 2 tol. Where the CPU's
// best two are that close (a near-tie: an int8 rounding step that an upstream difference of one
// ulp moves can swap them), either pick is right, and it is counted and printed.
int g_near_ties = 0;
void expect_same_pick(const float* g, const float* c, int64_t vocab, double tol, const std::string& what) {
  const int32_t pg = argmax(g, vocab), pc = argmax(c, vocab);
  if (pg == pc) return;
  const double gap = double(c[pc]) - double(c[pg]);
  if (gap <= 2 * tol) {
    ++g_near_ties;
    std::printf("[ measure ] %s: near-tie, cpu picks %d, gpu %d, cpu gap %.3g <= 2 x tol %.3g\n", what.c_str(), pc, pg,
                gap, tol);
    return;
  }
  ADD_FAILURE() << what << ": gpu picks " << pg << ", cpu " << pc << " by a margin of " << gap << " (tol " << tol
                << ")";
}

// Compares two logit sets; returns max |diff| / tolerance.
double compare_logits(const std::vector<float>& gpu, const std::vector<float>& cpu, int64_t vocab, double eps,
                      const std::string& what) {
  EXPECT_EQ(gpu.size(), cpu.size()) << what;
  if (gpu.size() != cpu.size()) return 1e9;
  double worst = 0;
  for (size_t r = 0; r * size_t(vocab) < cpu.size(); ++r) {
    const float* c = cpu.data() + r * size_t(vocab);
    const float* g = gpu.data() + r * size_t(vocab);
    double max_abs = 0;
    for (int64_t j = 0; j < vocab; ++j) max_abs = std::max(max_abs, std::fabs(double(c[j])));
    const double tol = eps * max_abs;
    for (int64_t j = 0; j < vocab; ++j) {
      const double d = std::fabs(double(g[j]) - double(c[j]));
      worst = std::max(worst, d / tol);
      if (d > tol) {
        ADD_FAILURE() << what << ": row " << r << " logit " << j << ": gpu " << g[j] << " cpu " << c[j] << " (tol " << tol
                      << ")";
        return worst;
      }
    }
    expect_same_pick(g, c, vocab, tol, what + ": greedy pick of row " + std::to_string(r));
  }
  return worst;
}

std::unique_ptr<ModelRunner> cuda_runner(const Model& m, int64_t n_blocks, int32_t bs, KvFormat kv = KvFormat::F32,
                                         bool graphs = true) {
  CudaRunnerConfig c;
  c.kv = {.block_size = bs, .n_blocks = n_blocks};
  c.max_batch_tokens = 256;
  c.max_seqs = 16;
  c.kv_format = kv;
  c.cuda_graphs = graphs;
  return make_cuda_runner(m, c);
}

class CudaRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("spill-cuda-runner-test");
    // One dense layer and two MoE layers; hidden and widths not powers of two.
    write_random_model(dir_->path(), RandomModelParams{.vocab_size = 300, .hidden_size = 96, .n_layers = 3,
                                                       .n_heads = 6, .n_kv_heads = 2, .head_dim = 16,
                                                       .n_experts = 6, .n_experts_per_token = 2,
                                                       .moe_intermediate_size = 40, .intermediate_size = 120,
                                                       .dense_layers = {1}, .seed = 5});
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    SPILL_SKIP_WITHOUT_GPU();
    cpu::set_activation_mode(cpu::ActivationMode::F32);
  }
  static inline TempDir* dir_ = nullptr;
};

TEST_F(CudaRunnerTest, PrefillLogitsMatchTheCpuRunner) {
  auto model = Model::load(dir_->path());
  for (KvFormat kv : {KvFormat::F32, KvFormat::BF16}) {
    int64_t n_blocks = 0;
    Steps s = make_steps(1, 64, 4, &n_blocks, 3);
    auto cpu = make_cpu_runner(*model, {.block_size = 4, .n_blocks = n_blocks}, 2);
    auto gpu = cuda_runner(*model, n_blocks, 4, kv);
    std::vector<int32_t> prompt(23);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37 + 11) % 300);
    const ForwardBatch b = s.make({{0, prompt, 0}}, true);
    std::vector<float> lc, lg;
    cpu->forward(b, lc);
    gpu->forward(b, lg);
    const double r = compare_logits(lg, lc, 300, chain_eps(model->spec(), 23, kv, score_bound(*model)), "prefill");
    std::printf("[ measure ] prefill, %s KV: max |gpu - cpu| / bound = %.3g\n", std::string(kv_format_name(kv)).c_str(), r);
  }
}

TEST_F(CudaRunnerTest, GreedyDecodeMatchesTheCpuRunner) {
  auto model = Model::load(dir_->path());
  for (KvFormat kv : {KvFormat::F32, KvFormat::BF16}) {
    int64_t n_blocks = 0;
    Steps s = make_steps(1, 64, 4, &n_blocks, 4);
    auto cpu = make_cpu_runner(*model, {.block_size = 4, .n_blocks = n_blocks}, 2);
    auto gpu = cuda_runner(*model, n_blocks, 4, kv);
    std::vector<int32_t> prompt = {5, 17, 250, 3, 99, 42, 7};
    std::vector<float> lc, lg;
    cpu->forward(s.make({{0, prompt, 0}}, false), lc);
    gpu->forward(s.make({{0, prompt, 0}}, false), lg);
    int32_t pos = int32_t(prompt.size());
    double worst = 0;
    for (int step = 0; step < 24; ++step) {
      const double eps = chain_eps(model->spec(), pos + 1, kv, score_bound(*model));
      worst = std::max(worst, compare_logits(lg, lc, 300, eps, "decode step " + std::to_string(step)));
      const int32_t next = argmax(lc.data(), 300);
      ASSERT_EQ(argmax(lg.data(), 300), next) << "step " << step;
      cpu->forward(s.make({{0, {next}, pos}}, false), lc);
      gpu->forward(s.make({{0, {next}, pos}}, false), lg);
      ++pos;
    }
    std::printf("[ measure ] 24 greedy steps, %s KV: max |gpu - cpu| / bound = %.3g\n",
                std::string(kv_format_name(kv)).c_str(), worst);
  }
}

TEST_F(CudaRunnerTest, MixedPrefillAndDecodeStepMatchesTheCpuRunner) {
  auto model = Model::load(dir_->path());
  int64_t n_blocks = 0;
  Steps s = make_steps(3, 64, 4, &n_blocks, 5);
  auto cpu = make_cpu_runner(*model, {.block_size = 4, .n_blocks = n_blocks}, 2);
  auto gpu = cuda_runner(*model, n_blocks, 4);
  auto tokens = [](int n, int seed) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[size_t(i)] = (i * 53 + seed * 19) % 300;
    return t;
  };
  // Step 1: A prefills 10, B prefills 5 (B does not want logits).
  // Step 2: A decodes, B continues with 7 more, C prefills 4: all logits.
  // Step 3: all three decode.
  const std::vector<std::vector<Part>> plan = {
      {{0, tokens(10, 1), 0}, {1, tokens(5, 2), 0, false}},
      {{0, {17}, 10}, {1, tokens(7, 3), 5}, {2, tokens(4, 4), 0}},
      {{2, {8}, 4}, {0, {9}, 11}, {1, {10}, 12}},
  };
  for (size_t i = 0; i < plan.size(); ++i) {
    const ForwardBatch b = s.make(plan[i], i == 1);
    std::vector<float> lc, lg;
    cpu->forward(b, lc);
    gpu->forward(b, lg);
    compare_logits(lg, lc, 300, chain_eps(model->spec(), 16, KvFormat::F32), "mixed step " + std::to_string(i));
  }
}

// forward_sample picks on the device exactly what each row's SequenceSampler picks from the same
// runner's logits (greedy, seeded sampling with top-k/top-p/min-p, penalties, logprobs), and leaves
// every sampler in the state its own sample() would have: several steps, decode graphs replayed.
TEST_F(CudaRunnerTest, SamplingOnTheDeviceMatchesTheSamplersOnItsLogits) {
  auto model = Model::load(dir_->path());
  int64_t n_blocks = 0;
  Steps s = make_steps(3, 64, 4, &n_blocks, 12);
  auto gpu = cuda_runner(*model, n_blocks, 4);
  std::vector<SamplingParams> params(3);
  params[0].temperature = 0.0f;
  params[1].temperature = 0.9f, params[1].top_k = 40, params[1].top_p = 0.9f, params[1].seed = 7;
  params[2].temperature = 1.3f, params[2].min_p = 0.02f, params[2].repetition_penalty = 1.3f,
  params[2].presence_penalty = 0.5f, params[2].frequency_penalty = 0.25f, params[2].seed = 99;
  params[2].logprobs = true, params[2].top_logprobs = 5;
  std::vector<std::vector<int32_t>> prompts = {{4, 9, 31}, {200, 1, 1, 7, 55}, {12, 12, 12, 290}};
  std::vector<SequenceSampler> host, device;
  for (size_t i = 0; i < 3; ++i) {
    host.emplace_back(params[i], prompts[i], 1000 + i);
    device.emplace_back(params[i], prompts[i], 1000 + i);
  }
  std::vector<SequenceSampler*> device_ptrs = {&device[0], &device[1], &device[2]};
  SamplerWorkspace ws;
  std::vector<Part> step;
  for (int i = 0; i < 3; ++i) step.push_back({i, prompts[size_t(i)], 0});
  for (int iter = 0; iter < 6; ++iter) {
    const ForwardBatch b = s.make(step, false);
    std::vector<float> logits;
    gpu->forward(b, logits);  // the same step twice writes the same KV entries: the logits repeat
    StepResult out;
    gpu->forward_sample(b, device_ptrs, out);
    ASSERT_EQ(out.rows.size(), 3u);
    for (size_t r = 0; r < 3; ++r) {
      ASSERT_TRUE(out.rows[r].ok()) << out.rows[r].error;
      const SampledToken want = host[r].sample(std::span<const float>(logits).subspan(r * 300, 300), ws);
      EXPECT_EQ(out.rows[r].sampled.token, want.token) << "row " << r << " step " << iter;
      if (params[r].logprobs) {
        EXPECT_NEAR(out.rows[r].sampled.logprob, want.logprob, 1e-5) << "row " << r;
        ASSERT_EQ(out.rows[r].sampled.top.size(), want.top.size());
        for (size_t j = 0; j < want.top.size(); ++j) EXPECT_EQ(out.rows[r].sampled.top[j].token, want.top[j].token);
      }
      EXPECT_EQ(device[r].n_sampled(), host[r].n_sampled());
    }
    std::vector<Part> next;
    for (int i = 0; i < 3; ++i) {
      const int32_t pos = step[size_t(i)].start_pos + int32_t(step[size_t(i)].tokens.size());
      next.push_back({i, {out.rows[size_t(i)].sampled.token}, pos});
    }
    step = next;
  }
}

// A context of ~1500 positions: attention split into a dozen partitions, prefilled in chunks of the
// runner's token limit, then decoded (graphs of a 16-partition grid).
TEST_F(CudaRunnerTest, LongContextMatchesTheCpuRunner) {
  auto model = Model::load(dir_->path());
  int64_t n_blocks = 0;
  Steps s = make_steps(1, 1600, 16, &n_blocks, 10);
  auto cpu = make_cpu_runner(*model, {.block_size = 16, .n_blocks = n_blocks}, 0);
  auto gpu = cuda_runner(*model, n_blocks, 16, KvFormat::F32);
  std::vector<float> lc, lg;
  int32_t pos = 0;
  for (int chunk = 0; chunk < 6; ++chunk) {
    std::vector<int32_t> t(250);
    for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((pos + int32_t(i)) * 7 % 300);
    cpu->forward(s.make({{0, t, pos}}, false), lc);
    gpu->forward(s.make({{0, t, pos}}, false), lg);
    pos += 250;
    compare_logits(lg, lc, 300, chain_eps(model->spec(), pos, KvFormat::F32), "chunk " + std::to_string(chunk));
  }
  for (int step = 0; step < 4; ++step) {
    const int32_t next = argmax(lc.data(), 300);
    cpu->forward(s.make({{0, {next}, pos}}, false), lc);
    gpu->forward(s.make({{0, {next}, pos}}, false), lg);
    ++pos;
    compare_logits(lg, lc, 300, chain_eps(model->spec(), pos, KvFormat::F32), "long decode " + std::to_string(step));
  }
}

// A sequence's logits alone and with other sequences around it (some prefilling, in a different order
// each step) are bit-identical.
void expect_batch_invariant(const Model& model, KvFormat kv) {
  const int64_t V = model.spec().vocab_size;
  int64_t n_blocks = 0;
  Steps s = make_steps(4, 64, 4, &n_blocks, 6);
  auto alone = cuda_runner(model, n_blocks, 4, kv);
  auto batched = cuda_runner(model, n_blocks, 4, kv);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<float> la, lb;
  alone->forward(s.make({{0, prompt, 0}}, false), la);
  batched->forward(s.make({{1, {40, 41, 42}, 0}, {0, prompt, 0}, {2, {7}, 0}}, false), lb);
  ASSERT_EQ(0, std::memcmp(la.data(), lb.data() + V, size_t(V) * 4)) << "prefill";
  int32_t pos = int32_t(prompt.size());
  int32_t other = 3;
  for (int step = 0; step < 6; ++step) {
    const int32_t next = argmax(la.data(), V);
    alone->forward(s.make({{0, {next}, pos}}, false), la);
    std::vector<Part> parts = {{3, {int32_t(50 + step)}, step}, {1, {int32_t(60 + step)}, other}};
    parts.insert(parts.begin() + (step % 3 == 0 ? 0 : 1), Part{0, {next}, pos});
    if (step % 2) parts.push_back({2, {int32_t(70 + step), 71, 72}, 1 + 3 * (step / 2)});
    batched->forward(s.make(parts, false), lb);
    size_t row = 0;
    for (size_t i = 0; i < parts.size(); ++i)
      if (parts[i].seq == 0) row = i;
    ASSERT_EQ(0, std::memcmp(la.data(), lb.data() + row * size_t(V), size_t(V) * 4)) << "decode step " << step;
    ++pos;
    ++other;
  }
}

// Decode steps replay captured graphs (per batch size and attention partitions); the same steps
// launched kernel by kernel must give the same bits. Contexts cross the 128-position split.
void expect_graphs_match_eager(const Model& model, KvFormat kv) {
  int64_t n_blocks = 0;
  Steps s = make_steps(3, 400, 4, &n_blocks, 9);
  auto graphs = cuda_runner(model, n_blocks, 4, kv, true);
  auto eager = cuda_runner(model, n_blocks, 4, kv, false);
  std::vector<int32_t> prompt(120);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 13 + 1) % 300);
  std::vector<float> lg, le;
  const ForwardBatch pre = s.make({{0, prompt, 0}, {1, {5, 6}, 0}, {2, prompt, 0}}, false);
  graphs->forward(pre, lg);
  eager->forward(pre, le);
  ASSERT_EQ(0, std::memcmp(lg.data(), le.data(), le.size() * 4));
  std::vector<int32_t> pos = {120, 2, 120};
  for (int step = 0; step < 30; ++step) {
    std::vector<Part> parts;
    for (int q = 0; q < 3; ++q)
      if (step % 5 != 4 || q != 1)  // batch size 2 now and then
        parts.push_back({q, {int32_t((step * 7 + q) % 300)}, pos[size_t(q)]++});
    const ForwardBatch b = s.make(parts, false);
    graphs->forward(b, lg);
    eager->forward(b, le);
    ASSERT_EQ(lg.size(), le.size());
    ASSERT_EQ(0, std::memcmp(lg.data(), le.data(), le.size() * 4)) << "step " << step;
  }
  const CudaRunnerStats st = cuda_runner_stats(*graphs);
  std::printf("[ measure ] decode (%s KV): %lld launches per step\n", std::string(kv_format_name(kv)).c_str(),
              (long long)st.launches_last_step);
}

TEST_F(CudaRunnerTest, LogitsAreBatchInvariant) {
  auto model = Model::load(dir_->path());
  expect_batch_invariant(*model, KvFormat::BF16);
}

TEST_F(CudaRunnerTest, GraphReplayIsBitIdenticalToEagerLaunches) {
  auto model = Model::load(dir_->path());
  expect_graphs_match_eager(*model, KvFormat::BF16);
}

TEST_F(CudaRunnerTest, KvPoolIsSizedFromABudget) {
  auto model = Model::load(dir_->path());
  const int64_t per_block = cuda_kv_bytes_per_block(model->spec(), 16, KvFormat::BF16);
  CudaRunnerConfig c;
  c.kv = {.block_size = 16, .n_blocks = 0};
  c.kv_budget_bytes = 10 * per_block + per_block / 2;
  c.max_model_len = 160;
  auto r = make_cuda_runner(*model, c);
  EXPECT_EQ(r->kv_config().n_blocks, 10);
  EXPECT_EQ(cuda_runner_stats(*r).kv_bytes, 10 * per_block);
  std::vector<int32_t> table(10);
  std::iota(table.begin(), table.end(), 0);
  ForwardBatch b;
  b.tokens = {1, 2, 3};
  b.seqs.push_back({.first_token = 0, .n_tokens = 3, .start_pos = 0, .block_table = table, .want_logits = true});
  std::vector<float> l;
  r->forward(b, l);
  EXPECT_EQ(l.size(), 300u);
  c.kv_budget_bytes = per_block / 2;
  EXPECT_THROW(make_cuda_runner(*model, c), Error);
  // No budget: the free memory less a reserve.
  c.kv_budget_bytes = 0;
  auto all = make_cuda_runner(*model, c);
  EXPECT_GT(all->kv_config().n_blocks, 1000);
}

TEST_F(CudaRunnerTest, BadInputIsAClearError) {
  auto model = Model::load(dir_->path());
  int64_t n_blocks = 0;
  Steps s = make_steps(1, 64, 4, &n_blocks, 7);
  auto gpu = cuda_runner(*model, n_blocks, 4);
  std::vector<float> l;
  EXPECT_THROW(gpu->forward(s.make({{0, {300}, 0}}, false), l), Error);
  std::vector<int32_t> many(257, 1);
  EXPECT_THROW(gpu->forward(s.make({{0, many, 0}}, false), l), Error);
  ForwardBatch short_table = s.make({{0, {1, 2, 3}, 0}}, false);
  short_table.seqs[0].start_pos = 62;  // 65 positions; the table covers 64
  EXPECT_THROW(gpu->forward(short_table, l), Error);
  // Still usable after the errors.
  gpu->forward(s.make({{0, {1, 2}, 0}}, false), l);
  EXPECT_EQ(l.size(), 300u);
  CudaRunnerConfig bad;
  bad.kv = {.block_size = 4, .n_blocks = 8};
  // An FP8 cache for a head shape the tensor-core attention does not take (head_dim 16): refused
  // by name before anything is uploaded.
  bad.kv_format = KvFormat::Fp8E4m3;
  try {
    make_cuda_runner(*model, bad);
    ADD_FAILURE() << "an FP8 cache with head_dim 16 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use --kv-format bf16"), std::string::npos) << e.what();
  }
  bad.kv_format = KvFormat::BF16;
  bad.device = 99;
  EXPECT_THROW(make_cuda_runner(*model, bad), Error);
}

// Today's engine, unchanged, on the CUDA runner: 16 greedy requests of different lengths arriving
// together with a token budget that forces chunked prefill and mixed steps; each output equals the
// same request alone on the CUDA runner (batch invariance through the engine), and with an F32 KV
// cache the CPU engine's output.
TEST_F(CudaRunnerTest, TheEngineRunsOnTheCudaRunner) {
  const std::vector<int64_t> lengths = {1, 5, 15, 16, 17, 31, 32, 33, 47, 64, 70, 3, 9, 48, 2, 40};
  const int64_t n_new = 12;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int32_t> p(static_cast<size_t>(lengths[i]));
    for (size_t j = 0; j < p.size(); ++j) p[j] = int32_t((j * 31 + i * 17 + 3) % 300);
    prompts.push_back(std::move(p));
  }
  auto make = [&](bool gpu, KvFormat kv, int64_t max_batch_tokens) {
    auto model = Model::load(dir_->path());
    std::unique_ptr<ModelRunner> runner =
        gpu ? cuda_runner(*model, 256, 16, kv) : make_cpu_runner(*model, {.block_size = 16, .n_blocks = 256}, 2);
    EngineConfig config{.scheduler = {.max_running = 16, .max_batch_tokens = max_batch_tokens}};
    return std::make_unique<Engine>(EngineParts{.model = std::move(model), .runner = std::move(runner)}, config);
  };
  auto run_all = [&](Engine& e) {
    std::vector<RequestStream> streams;
    for (const auto& p : prompts)
      streams.push_back(e.submit({.prompt = p, .sampling = {.temperature = 0.0f}, .max_tokens = n_new}));
    std::vector<std::vector<int32_t>> out;
    for (auto& st : streams) {
      RequestOutput o = st.collect();
      EXPECT_TRUE(o.finish && o.finish->reason == FinishReason::Length) << (o.finish ? o.finish->error : "no finish");
      out.push_back(o.token_ids);
    }
    return out;
  };
  {
    auto batched = make(true, KvFormat::BF16, 48);
    const auto together = run_all(*batched);
    auto alone_engine = make(true, KvFormat::BF16, 256);
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestOutput o =
          alone_engine->submit({.prompt = prompts[i], .sampling = {.temperature = 0.0f}, .max_tokens = n_new}).collect();
      EXPECT_EQ(o.token_ids, together[i]) << "request " << i << " batched vs alone";
    }
  }
  auto gpu = make(true, KvFormat::F32, 48);
  auto cpu = make(false, KvFormat::F32, 48);
  const auto g = run_all(*gpu), c = run_all(*cpu);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(g[i], c[i]) << "request " << i << " GPU vs CPU";
}

// A real checkpoint: the bundled model (BF16 safetensors, tied head, 6 layers of 16 experts).
std::string checkpoint_dir() {
  if (const char* env = std::getenv("SPILL_TINY_DIR")) return env;
  return testing::spill_tiny_dir();
}

// int8_activations: both runners round each block-format matmul's input to int8 per block of 256
// (the GPU kernels always; the CPU in ActivationMode::Q8), from inputs that already differ by the
// float chain's rounding. Where that difference moves an activation across a rounding boundary the
// two roundings differ by one quantum, d_b = (largest |x| of the block) / 127, so each rounded input
// adds up to 1/127 relative to the scale the chain bound is taken at: four per layer (q/k/v, o,
// gate/up, down) and one for the LM head. The greedy tokens must still be identical.
void greedy_against_cpu(const Model& model, int n_new, const std::string& what, bool int8_activations = false) {
  const int64_t V = model.spec().vocab_size;
  int64_t n_blocks = 0;
  Steps s = make_steps(1, 128, 16, &n_blocks, 8);
  auto cpu = make_cpu_runner(model, {.block_size = 16, .n_blocks = n_blocks}, 0);
  auto gpu = cuda_runner(model, n_blocks, 16, KvFormat::F32);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back(int32_t((i * 7919 + 13) % V));
  std::vector<float> lc, lg;
  const double quanta = int8_activations ? double(4 * model.spec().n_layers + 1) / 127.0 : 0.0;
  cpu->forward(s.make({{0, prompt, 0}}, true), lc);
  gpu->forward(s.make({{0, prompt, 0}}, true), lg);
  double worst = compare_logits(lg, lc, V, chain_eps(model.spec(), 21, KvFormat::F32) + quanta, what + " prefill");
  int32_t pos = int32_t(prompt.size());
  for (int step = 0; step < n_new; ++step) {
    const int32_t next = argmax(lc.data() + lc.size() - size_t(V), V);
    cpu->forward(s.make({{0, {next}, pos}}, false), lc);
    gpu->forward(s.make({{0, {next}, pos}}, false), lg);
    worst = std::max(worst, compare_logits(lg, lc, V, chain_eps(model.spec(), pos + 1, KvFormat::F32) + quanta, what));
    ++pos;
  }
  std::printf("[ measure ] %s: max |gpu - cpu| / bound = %.3g\n", what.c_str(), worst);
}

TEST(CudaRunnerModels, SpillTinyGreedyMatchesTheCpuRunner) {
  SPILL_SKIP_WITHOUT_GPU();
  const std::string dir = checkpoint_dir();
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << dir << " not found (set SPILL_TINY_DIR)";
  cpu::set_activation_mode(cpu::ActivationMode::F32);
  auto model = Model::load(dir);
  greedy_against_cpu(*model, 12, "spill-tiny bf16");
}

// The FP8 KV cache (e4m3 with a scale per token and KV head) on the bundled model (head_dim 64, GQA 2):
// batch-invariant and graph-safe as the BF16 cache is; its pool holds about twice the tokens. Its
// logits differ from the BF16 cache's by the e4m3 rounding of K and V (measured, printed: spill eval
// --kv-format fp8 gives the KL divergence on real text).
TEST(CudaRunnerModels, Fp8KvCacheIsBatchInvariantAndGraphSafe) {
  SPILL_SKIP_WITHOUT_GPU();
  const std::string dir = checkpoint_dir();
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << dir << " not found (set SPILL_TINY_DIR)";
  auto model = Model::load(dir);
  expect_batch_invariant(*model, KvFormat::Fp8E4m3);
  expect_graphs_match_eager(*model, KvFormat::Fp8E4m3);
  const ModelSpec& spec = model->spec();
  EXPECT_EQ(cuda_kv_bytes_per_block(spec, 16, KvFormat::Fp8E4m3),
            16 * 2 * spec.n_layers * spec.n_kv_heads * (spec.head_dim + 4));  // values + one f32 scale per head
  // Greedy from one prompt with each cache: how far apart they are.
  const int64_t V = spec.vocab_size;
  int64_t n_blocks = 0;
  Steps s = make_steps(1, 128, 16, &n_blocks, 8);
  auto bf16 = cuda_runner(*model, n_blocks, 16, KvFormat::BF16), fp8 = cuda_runner(*model, n_blocks, 16, KvFormat::Fp8E4m3);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(int32_t((i * 7919 + 13) % V));
  std::vector<float> lb, lf;
  bf16->forward(s.make({{0, prompt, 0}}, false), lb);
  fp8->forward(s.make({{0, prompt, 0}}, false), lf);
  int32_t pos = int32_t(prompt.size());
  int agree = 0, steps = 48;
  double max_diff = 0;
  for (int step = 0; step < steps; ++step) {
    for (int64_t j = 0; j < V; ++j) max_diff = std::max(max_diff, std::fabs(double(lb[size_t(j)]) - double(lf[size_t(j)])));
    const int32_t next = argmax(lb.data(), V);
    agree += argmax(lf.data(), V) == next;
    bf16->forward(s.make({{0, {next}, pos}}, false), lb);
    fp8->forward(s.make({{0, {next}, pos}}, false), lf);
    ++pos;
  }
  std::printf("[ measure ] spill-tiny, FP8 against BF16 KV over %d steps: same greedy pick %d times, max |logit diff| %.4g\n",
              steps, agree, max_diff);
}

// Block-format weights through the real quantizer: a random model whose widths are whole 256-blocks,
// quantized on load by --quant mixes (K-quants, Q8_0; an embedding the device gather cannot read,
// so its rows come from the host; a tied head).
//
// The GPU's block-format kernels round each token's activations to int8 per block of 256, as the
// CPU's int8 path does (quant::quantize_activations_q8, the same bits from the same input), so the
// twin here is the CPU runner in ActivationMode::Q8: the two differ by the order their float sums
// are combined in (the chain bound) and by the rounding steps where an upstream difference moves an
// activation across a rounding boundary (greedy_against_cpu's int8 term).
TEST(CudaRunnerModels, QuantizedModelsGreedyMatchTheCpuRunner) {
  SPILL_SKIP_WITHOUT_GPU();
  cpu::set_activation_mode(cpu::ActivationMode::Q8);
  TempDir dir("spill-cuda-runner-quant");
  for (bool tied : {false, true}) {
    const std::string path = dir.path() + (tied ? "/tied" : "/untied");
    write_random_model(path, RandomModelParams{.vocab_size = 512, .hidden_size = 256, .n_layers = 3, .n_heads = 4,
                                               .n_kv_heads = 2, .head_dim = 64, .n_experts = 8,
                                               .n_experts_per_token = 2, .moe_intermediate_size = 256,
                                               .intermediate_size = 512, .dense_layers = {0},
                                               .tie_word_embeddings = tied, .seed = 21});
    for (const char* mix : {"q4_k_m", "q8_0", "experts=q4_k,attention=q6_k,dense=q5_k,head=q8_0,embed=q4_k"}) {
      auto model = Model::load(path);
      QuantRequest request;
      request.quant = mix;
      quantize_as_asked(*model, request);
      greedy_against_cpu(*model, 8, std::string(mix) + (tied ? " tied" : ""), /*int8_activations=*/true);
    }
  }
}

// The offload tests' model: 3 layers (the first dense), 8 experts top-2, Q4_K experts, in `dir`.
std::unique_ptr<Model> small_offload_model(const TempDir& dir, uint64_t seed) {
  write_random_model(dir.path(), RandomModelParams{.vocab_size = 512, .hidden_size = 256, .n_layers = 3, .n_heads = 4,
                                                   .n_kv_heads = 2, .head_dim = 64, .n_experts = 8,
                                                   .n_experts_per_token = 2, .moe_intermediate_size = 256,
                                                   .intermediate_size = 512, .dense_layers = {0}, .seed = seed});
  auto model = Model::load(dir.path());
  QuantRequest request;
  request.quant = "experts=q4_k,attention=q8_0,dense=q8_0,head=q8_0,embed=q8_0";
  quantize_as_asked(*model, request);
  return model;
}

// The offload tests' runner: one sequence of up to 64 tokens a step, an F32 KV pool, the given plan.
CudaRunnerConfig small_offload_config(int64_t n_blocks, std::optional<offload::PlacementPlan> plan) {
  CudaRunnerConfig c;
  c.kv = {.block_size = 16, .n_blocks = n_blocks};
  c.max_batch_tokens = 64;
  c.max_seqs = 4;
  c.kv_format = KvFormat::F32;
  c.expert_plan = std::move(plan);
  return c;
}

// A MoE model with a shared expert (DeepSeek-style: always on, added to the routed experts), made
// by the synthetic generator: the eager model against the CPU runner; the same model made on
// demand (its matrices written as the runner uploads them, then dropped) gives bit-identical
// logits, with its experts in VRAM or half of them in host RAM, and its uploaded pages are given
// back.
ModelSpec shared_expert_spec() {
  return parse_model_spec(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 640,
    "hidden_size": 512, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "num_experts": 16, "num_experts_per_tok": 3, "moe_intermediate_size": 256,
    "n_shared_experts": 2, "intermediate_size": 768, "norm_topk_prob": true, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "max_position_embeddings": 4096, "tie_word_embeddings": false})",
                          "shared-expert test config");
}

SyntheticOptions shared_expert_mix(SyntheticFill fill) {
  SyntheticOptions o;
  o.seed = 31;
  o.fill = fill;
  o.type_for = [](const WeightKey& k, int64_t rows, int64_t) {
    if (k.role == WeightRole::ExpertsGate || k.role == WeightRole::ExpertsUp || k.role == WeightRole::ExpertsDown)
      return DType::Q4_K;
    if (k.role == WeightRole::SharedGate || k.role == WeightRole::SharedUp || k.role == WeightRole::SharedDown)
      return DType::Q6_K;
    if (rows == 1 || k.role == WeightRole::Router) return DType::F32;
    return DType::Q8_0;
  };
  return o;
}

TEST(CudaRunnerModels, SharedExpertsAndOnDemandWeightsMatchTheCpuRunner) {
  SPILL_SKIP_WITHOUT_GPU();
  cpu::set_activation_mode(cpu::ActivationMode::Q8);
  const ModelSpec spec = shared_expert_spec();
  auto eager = Model::from_source(spec, make_synthetic_source(spec, shared_expert_mix(SyntheticFill::Now)));
  ASSERT_FALSE(eager->layers[1].shared.gate.empty());
  greedy_against_cpu(*eager, 8, "shared experts", /*int8_activations=*/true);

  int64_t n_blocks = 0;
  Steps s = make_steps(1, 64, 16, &n_blocks, 17);
  auto run = [&](const Model& m, std::optional<offload::PlacementPlan> plan) {
    auto gpu = make_cuda_runner(m, small_offload_config(n_blocks, std::move(plan)));
    std::vector<float> all, lg;
    std::vector<int32_t> prompt = {5, 71, 300, 9, 600, 12};
    gpu->forward(s.make({{0, prompt, 0}}, false), lg);
    all = lg;
    int32_t pos = int32_t(prompt.size());
    for (int step = 0; step < 5; ++step) {
      gpu->forward(s.make({{0, {argmax(lg.data(), spec.vocab_size)}, pos++}}, false), lg);
      all.insert(all.end(), lg.begin(), lg.end());
    }
    return all;
  };
  const std::vector<float> want = run(*eager, std::nullopt);
  for (double share : {0.0, 0.5}) {
    auto lazy = Model::from_source(spec, make_synthetic_source(spec, shared_expert_mix(SyntheticFill::OnDemand)));
    const TensorView& gate = lazy->layers[2].experts[7].gate;  // 256 rows of 288 bytes: whole pages inside
    const std::vector<float> got =
        run(*lazy, share > 0 ? std::optional(offload::uniform_plan_for(*lazy, share, 3)) : std::nullopt);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "host share " << share;
    // The expert's interior pages were given back after the upload: they read as zeros again.
    const uint8_t* page = reinterpret_cast<const uint8_t*>((uintptr_t(gate.data) + 4095) / 4096 * 4096);
    EXPECT_TRUE(std::all_of(page, page + 4096, [](uint8_t b) { return b == 0; })) << "host share " << share;
    lazy->prepare(gate.data, gate.nbytes());
    EXPECT_EQ(std::memcmp(gate.data, eager->layers[2].experts[7].gate.data, gate.nbytes()), 0);
  }
}

// Experts in host RAM (a plan's share of every MoE layer pinned and mapped, read by the MoE kernels
// over PCIe) give exactly the logits of all experts in VRAM: prefill, then greedy decode steps
// replayed from graphs. The runner reports where the expert bytes went.
TEST(CudaRunnerModels, ExpertsInHostRamGiveTheLogitsOfExpertsInVram) {
  SPILL_SKIP_WITHOUT_GPU();
  TempDir dir("spill-cuda-runner-offload");
  auto model = small_offload_model(dir, 23);
  int64_t n_blocks = 0;
  Steps s = make_steps(1, 64, 16, &n_blocks, 13);
  auto run = [&](std::optional<offload::PlacementPlan> plan, CudaRunnerStats* stats, bool stage = true) {
    CudaRunnerConfig c = small_offload_config(n_blocks, std::move(plan));
    c.stage_host_experts = stage;
    auto gpu = make_cuda_runner(*model, c);
    std::vector<float> all, lg;
    std::vector<int32_t> prompt = {3, 77, 150, 9, 400, 12, 31};
    gpu->forward(s.make({{0, prompt, 0}}, false), lg);
    all = lg;
    int32_t pos = int32_t(prompt.size());
    for (int step = 0; step < 6; ++step) {
      const int32_t next = argmax(lg.data(), 512);
      gpu->forward(s.make({{0, {next}, pos++}}, false), lg);
      all.insert(all.end(), lg.begin(), lg.end());
    }
    *stats = cuda_runner_stats(*gpu);
    // The 7-token prefill touches most host experts: staged (offload/expert_staging.h) unless off.
    EXPECT_EQ(gpu->expert_traffic().staged_steps, plan && stage ? 1 : 0);
    return all;
  };
  CudaRunnerStats vram_stats, host_stats;
  const std::vector<float> vram = run(std::nullopt, &vram_stats);
  for (double share : {0.25, 1.0}) {
    const offload::PlacementPlan plan = offload::uniform_plan_for(*model, share, 5);
    const std::vector<float> in_place = run(plan, &host_stats, /*stage=*/false);
    EXPECT_EQ(std::memcmp(in_place.data(), vram.data(), vram.size() * 4), 0) << "host share " << share << ", in place";
    const std::vector<float> host = run(plan, &host_stats);
    ASSERT_EQ(host.size(), vram.size());
    EXPECT_EQ(std::memcmp(host.data(), vram.data(), vram.size() * 4), 0) << "host share " << share;
    EXPECT_EQ(host_stats.host_expert_bytes, plan.host_expert_bytes()) << host_stats.expert_store_summary;
    EXPECT_GT(host_stats.host_expert_bytes, 0);
    EXPECT_LT(host_stats.weight_bytes, vram_stats.weight_bytes);
    std::printf("[ measure ] host share %.2f: %lld expert bytes in host RAM, %lld in VRAM\n", share,
                (long long)host_stats.host_expert_bytes, (long long)host_stats.vram_expert_bytes);
  }
}

// The VRAM expert cache: with every routed expert in host RAM and slots for a few of them, greedy
// decode gives exactly the logits of all experts in VRAM while copies land and entries switch
// (the same kernels read the same bytes, from a slot or from host RAM); the MoE kernels' counters
// count every routing (tokens x top-k x MoE layers) and, without a cache, the host bytes of a
// one-token step are its top-k experts' bytes in every MoE layer.
TEST(CudaRunnerModels, ExpertCacheKeepsTheLogitsAndCountsEveryRouting) {
  SPILL_SKIP_WITHOUT_GPU();
  TempDir dir("spill-cuda-runner-expert-cache");
  auto model = small_offload_model(dir, 29);
  const int64_t moe_layers = 2, top_k = 2;
  const LayerWeights& w1 = model->layers[1];
  const int64_t expert_bytes = int64_t(w1.experts[0].gate.nbytes() + w1.experts[0].up.nbytes() + w1.experts[0].down.nbytes());
  int64_t n_blocks = 0;
  Steps s = make_steps(1, 64, 16, &n_blocks, 17);
  const int decode_steps = 40;
  struct Run {
    std::vector<float> logits;
    ExpertTraffic after_prefill, end;
  };
  auto run = [&](std::optional<offload::PlacementPlan> plan, int64_t cache_bytes) {
    CudaRunnerConfig c = small_offload_config(n_blocks, std::move(plan));
    c.expert_cache_bytes = cache_bytes;
    c.count_experts = CudaRunnerConfig::ExpertCounting::Always;  // the all-VRAM run too
    auto gpu = make_cuda_runner(*model, c);
    Run r;
    std::vector<float> lg;
    const std::vector<int32_t> prompt = {5, 60, 222, 9, 301, 44, 17};
    gpu->forward(s.make({{0, prompt, 0}}, false), lg);
    r.logits = lg;
    r.after_prefill = gpu->expert_traffic();
    EXPECT_EQ(r.after_prefill.tokens, int64_t(prompt.size()));
    EXPECT_EQ(r.after_prefill.routings, int64_t(prompt.size()) * top_k * moe_layers);
    int32_t pos = int32_t(prompt.size());
    for (int step = 0; step < decode_steps; ++step) {
      const int32_t next = argmax(lg.data(), 512);
      gpu->forward(s.make({{0, {next}, pos++}}, false), lg);
      r.logits.insert(r.logits.end(), lg.begin(), lg.end());
    }
    r.end = gpu->expert_traffic();
    EXPECT_EQ(r.end.tokens - r.after_prefill.tokens, decode_steps);
    EXPECT_EQ(r.end.routings - r.after_prefill.routings, int64_t(decode_steps) * top_k * moe_layers);
    return r;
  };
  const Run vram = run(std::nullopt, 0);
  EXPECT_EQ(vram.end.host_routings, 0);
  EXPECT_EQ(vram.end.host_bytes, 0);
  EXPECT_EQ(vram.end.vram_expert_bytes, moe_layers * 8 * expert_bytes);

  const offload::PlacementPlan all_host = offload::uniform_plan_for(*model, 1.0, 3);
  const Run host = run(all_host, 0);
  EXPECT_EQ(std::memcmp(host.logits.data(), vram.logits.data(), vram.logits.size() * 4), 0);
  EXPECT_EQ(host.end.host_routings, host.end.routings);
  // The prefill copied every host expert to VRAM once (each span padded to 256 bytes per matrix).
  EXPECT_EQ(host.after_prefill.staged_steps, 1);
  EXPECT_EQ(host.after_prefill.host_bytes, host.after_prefill.staged_bytes);
  EXPECT_GE(host.after_prefill.staged_bytes, moe_layers * 8 * expert_bytes);
  EXPECT_LE(host.after_prefill.staged_bytes, moe_layers * 8 * (expert_bytes + 3 * 256));
  EXPECT_EQ(host.end.staged_steps, 1);
  EXPECT_EQ(host.end.host_bytes - host.after_prefill.host_bytes, int64_t(decode_steps) * top_k * moe_layers * expert_bytes);
  EXPECT_EQ(host.end.cache_routings, 0);

  // Six slots for sixteen host experts: the cache fills and serves, the logits stay.
  const Run cached = run(all_host, 6 * 256 * ((expert_bytes + 3 * 256) / 256));
  ASSERT_EQ(cached.logits.size(), vram.logits.size());
  EXPECT_EQ(std::memcmp(cached.logits.data(), vram.logits.data(), vram.logits.size() * 4), 0);
  EXPECT_EQ(cached.end.cache_slots, 6);
  EXPECT_GT(cached.end.cache_copies, 0);
  EXPECT_LE(cached.end.cache_slots_used, cached.end.cache_slots);
  EXPECT_GT(cached.end.cache_routings, 0);
  EXPECT_EQ(cached.end.cache_routings + cached.end.host_routings, cached.end.routings);
  EXPECT_LT(cached.end.host_bytes, host.end.host_bytes);
  EXPECT_EQ(cached.end.cache_copy_bytes, cached.end.cache_copies * expert_bytes);
  std::printf("[ measure ] expert cache, 6 slots: %lld copies, %lld evictions, served %lld of %lld routings; host "
              "bytes %lld (without the cache %lld)\n",
              (long long)cached.end.cache_copies, (long long)cached.end.cache_evictions,
              (long long)cached.end.cache_routings, (long long)cached.end.routings, (long long)cached.end.host_bytes,
              (long long)host.end.host_bytes);
}

// Host experts computed by CPU threads (offload/cpu_experts.h) while the GPU reads the others: the
// logits stay within the int8 bound of the all-GPU run (the CPU's int8 kernels round as the GPU's
// do but add in another order), graph replays give the eager steps' bits, a sequence's logits are
// bit-identical alone and in a decode batch (each pair always goes to the same side), the CPU served
// every decode call, and the host bytes counted over the link drop by the CPU's share.
TEST(CudaRunnerModels, CpuExpertsKeepTheLogitsWithinTheBoundAndStayBatchInvariant) {
  SPILL_SKIP_WITHOUT_GPU();
  cpu::set_activation_mode(cpu::ActivationMode::Q8);
  TempDir dir("spill-cuda-runner-cpu-experts");
  auto model = small_offload_model(dir, 31);
  const int64_t V = model->spec().vocab_size;
  int64_t n_blocks = 0;
  Steps s = make_steps(4, 64, 16, &n_blocks, 19);
  const offload::PlacementPlan all_host = offload::uniform_plan_for(*model, 1.0, 3);
  auto runner = [&](double cpu_share, bool graphs) {
    CudaRunnerConfig c = small_offload_config(n_blocks, all_host);
    c.stage_host_experts = false;
    c.cuda_graphs = graphs;
    c.cpu_expert_share = cpu_share;
    c.cpu_expert_threads = 2;
    c.count_experts = CudaRunnerConfig::ExpertCounting::Always;
    return make_cuda_runner(*model, c);
  };
  auto gpu_only = runner(0.0, true), hybrid = runner(0.5, true), eager = runner(0.5, false), batched = runner(0.5, true);
  EXPECT_NE(hybrid->describe().find("CPU experts: 8 host experts"), std::string::npos) << hybrid->describe();
  // A 12-token prompt (past the CPU's 8-token calls: every expert on the GPU) and a 5-token one
  // (the CPU's experts on the CPU), then greedy decode.
  const std::vector<int32_t> prompt = {5, 60, 222, 9, 301, 44, 17, 90, 3, 400, 12, 7};
  const std::vector<int32_t> other = {11, 22, 33, 44, 55};
  std::vector<float> lr, lh, le, lb;
  const double quanta = double(4 * model->spec().n_layers + 1) / 127.0;
  for (auto* r : {&gpu_only, &hybrid, &eager, &batched}) {
    std::vector<float>& out = r == &gpu_only ? lr : r == &hybrid ? lh : r == &eager ? le : lb;
    (*r)->forward(s.make({{0, prompt, 0}}, false), out);
  }
  double worst = compare_logits(lh, lr, V, chain_eps(model->spec(), 12, KvFormat::F32) + quanta, "12-token prefill");
  ASSERT_EQ(0, std::memcmp(lh.data(), le.data(), lh.size() * 4));
  for (auto* r : {&gpu_only, &hybrid, &eager}) {
    std::vector<float>& out = r == &gpu_only ? lr : r == &hybrid ? lh : le;
    (*r)->forward(s.make({{1, other, 0}}, false), out);
  }
  worst = std::max(worst, compare_logits(lh, lr, V, chain_eps(model->spec(), 5, KvFormat::F32) + quanta, "5-token prefill"));
  ASSERT_EQ(0, std::memcmp(lh.data(), le.data(), lh.size() * 4));
  batched->forward(s.make({{1, other, 0}, {2, {70, 71}, 0}}, false), lb);  // the batch's other sequences
  const ExpertTraffic before = hybrid->expert_traffic();
  int32_t pos = int32_t(prompt.size());
  const int steps = 8;
  for (int step = 0; step < steps; ++step) {
    const int32_t next = argmax(lr.data() + lr.size() - size_t(V), V);
    gpu_only->forward(s.make({{0, {next}, pos}}, false), lr);
    hybrid->forward(s.make({{0, {next}, pos}}, false), lh);
    eager->forward(s.make({{0, {next}, pos}}, false), le);
    worst = std::max(worst, compare_logits(lh, lr, V, chain_eps(model->spec(), pos + 1, KvFormat::F32) + quanta,
                                           "decode step " + std::to_string(step)));
    ASSERT_EQ(0, std::memcmp(lh.data(), le.data(), lh.size() * 4)) << "graph against eager, step " << step;
    // The same token of sequence 0 beside two others (batch 3), its row in the middle.
    batched->forward(s.make({{1, {int32_t(80 + step)}, 5 + step}, {0, {next}, pos}, {2, {int32_t(90 + step)}, 2 + step}},
                            false),
                     lb);
    ASSERT_EQ(0, std::memcmp(lh.data(), lb.data() + size_t(V), size_t(V) * 4)) << "batched, step " << step;
    ++pos;
  }
  const CudaRunnerStats st = cuda_runner_stats(*hybrid);
  const ExpertTraffic after = hybrid->expert_traffic();
  // One call per MoE layer per step of up to 8 tokens: the 5-token prefill and the decode steps.
  EXPECT_EQ(st.cpu_expert_calls, 2 * (1 + steps));
  EXPECT_GT(st.cpu_expert_bytes, 0);
  EXPECT_EQ(after.host_routings - before.host_routings, int64_t(steps) * 2 * 2);
  // One token's top-2 are two distinct experts per layer: each decode step touches 2 x 2 host experts,
  // each read once, by the CPU or over the link (half of them are the CPU's, so the link reads less
  // than all); the CPU's bytes are its routings' experts.
  const LayerWeights& w1 = model->layers[1];
  const int64_t expert_bytes = int64_t(w1.experts[0].gate.nbytes() + w1.experts[0].up.nbytes() + w1.experts[0].down.nbytes());
  EXPECT_LT(after.host_bytes - before.host_bytes, int64_t(steps) * 2 * 2 * expert_bytes);
  const int64_t cpu_routings = after.cpu_routings - before.cpu_routings;
  EXPECT_GT(cpu_routings, 0);
  EXPECT_LT(cpu_routings, after.host_routings - before.host_routings);
  EXPECT_EQ(after.cpu_bytes - before.cpu_bytes, cpu_routings * expert_bytes);
  EXPECT_EQ(after.cpu_bytes - before.cpu_bytes + after.host_bytes - before.host_bytes, int64_t(steps) * 2 * 2 * expert_bytes);
  std::printf("[ measure ] CPU experts: max |hybrid - gpu| / bound = %.3g; %lld calls, %lld expert bytes on the CPU\n",
              worst, (long long)st.cpu_expert_calls, (long long)st.cpu_expert_bytes);
}

// A plan the runner cannot take is refused by name: one that puts a layer on another GPU.
TEST(CudaRunnerModels, ExpertPlansForOtherGpusAreRefusedClearly) {
  SPILL_SKIP_WITHOUT_GPU();
  TempDir dir("spill-cuda-runner-offload-bad");
  write_random_model(dir.path(), RandomModelParams{.vocab_size = 512, .hidden_size = 256, .n_layers = 2, .n_heads = 4,
                                                   .n_kv_heads = 2, .head_dim = 64, .n_experts = 4,
                                                   .n_experts_per_token = 2, .moe_intermediate_size = 256,
                                                   .intermediate_size = 512, .seed = 24});
  auto model = Model::load(dir.path());
  QuantRequest request;
  request.quant = "q8_0";
  quantize_as_asked(*model, request);
  offload::PlacementPlan plan = offload::uniform_plan_for(*model, 0.5, 1);
  plan.layers[1].gpu = 1;
  CudaRunnerConfig c;
  c.kv = {.block_size = 16, .n_blocks = 8};
  c.max_batch_tokens = 16;
  c.max_seqs = 2;
  c.expert_plan = plan;
  try {
    make_cuda_runner(*model, c);
    ADD_FAILURE() << "a plan with a layer on GPU 1 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 on GPU 1"), std::string::npos) << e.what();
  }
}

// ---- expert parallelism (backend/cuda/expert_parallel_runner.h) -------------------------------

// A plan of `world` GPUs sharing every MoE layer's experts (version 2), from a one-GPU plan's
// host lists: expert e of layer l goes to owner(l, e); nothing else is split.
offload::PlacementPlan expert_parallel_plan(offload::PlacementPlan plan, int world,
                                            const std::function<int(int64_t, int64_t)>& owner) {
  plan.expert_parallel = true;
  plan.n_gpus = world;
  for (offload::PlannedLayer& pl : plan.layers) {
    pl.gpu = -1;
    if (!pl.moe) continue;
    pl.owners.resize(size_t(pl.experts));
    for (int64_t e = 0; e < pl.experts; ++e) pl.owners[size_t(e)] = int32_t(owner(pl.layer, e));
  }
  return plan;
}

// A prompt then greedy decode steps on `runner`: every step's logits, back to back.
std::vector<float> greedy_logits(ModelRunner& runner, const Steps& s, int64_t vocab, std::vector<int32_t> prompt,
                                 int decode_steps) {
  std::vector<float> all, lg;
  runner.forward(s.make({{0, prompt, 0}}, false), lg);
  all = lg;
  int32_t pos = int32_t(prompt.size());
  for (int step = 0; step < decode_steps; ++step) {
    runner.forward(s.make({{0, {argmax(lg.data(), vocab)}, pos++}}, false), lg);
    all.insert(all.end(), lg.begin(), lg.end());
  }
  return all;
}

// A group over the offload model's experts (top-2, 2 MoE layers; a quarter in host RAM) against
// the one-GPU runner: a prompt, then greedy decode steps, every step's logits bit for bit; every
// routing is counted once (by the GPU that owns its expert) and every host expert is somewhere.
void expect_group_gives_the_one_gpu_bits(uint64_t seed, int world, std::vector<int> devices,
                                         ExpertParallelConfig::Sums sums,
                                         const std::function<int(int64_t, int64_t)>& owner, const std::string& what) {
  TempDir dir("spill-cuda-ep");
  auto model = small_offload_model(dir, seed);
  int64_t n_blocks = 0;
  Steps s = make_steps(1, 64, 16, &n_blocks, uint32_t(seed));
  const std::vector<int32_t> prompt = {3, 77, 150, 9, 400, 12, 31};
  const offload::PlacementPlan plan = offload::uniform_plan_for(*model, 0.25, 5);
  auto one = make_cuda_runner(*model, small_offload_config(n_blocks, plan));
  const std::vector<float> want = greedy_logits(*one, s, 512, prompt, 6);
  auto group = make_expert_parallel_runner(
      *model, {.runner = small_offload_config(n_blocks, expert_parallel_plan(plan, world, owner)),
               .devices = std::move(devices), .sums = sums});
  EXPECT_NE(group->describe().find(fmt::format("expert-parallel GPU {} of {}", world - 1, world)), std::string::npos)
      << group->describe();
  const std::vector<float> got = greedy_logits(*group, s, 512, prompt, 6);
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << what;
  const ExpertTraffic t = group->expert_traffic();
  EXPECT_EQ(t.routings, int64_t(prompt.size() + 6) * 2 * 2) << what << ": tokens x top-2 x 2 MoE layers";
  EXPECT_EQ(t.host_expert_bytes, plan.host_expert_bytes()) << what;
}

// One GPU as a group of one: the same code as two GPUs (the router's share, NCCL's all-reduce
// after each MoE layer, captured into the decode graphs) gives the one-GPU runner's logits bit for
// bit, since every expert is its own and a sum over one rank is its rows.
TEST(CudaExpertParallel, AGroupOfOneGivesTheOneGpuRunnersBits) {
  SPILL_SKIP_WITHOUT_GPU();
  const cuda::NcclInfo nccl = cuda::nccl_info();
  if (!nccl.ok) GTEST_SKIP() << "no NCCL: " << nccl.why;
  expect_group_gives_the_one_gpu_bits(41, 1, {}, ExpertParallelConfig::Sums::Nccl, [](int64_t, int64_t) { return 0; },
                                      "a group of one");
}

// Two GPUs' worth of ranks sharing this one (their sums through host memory): each rank runs only
// its experts and the sums give every rank the same rows. With top-2 routing the sum of the two
// partials is the one-GPU slot sum exactly (each partial is one slot's row plus zeros, and a + b is
// commutative), so the logits are bit-identical to one GPU's, wherever each expert lives. With
// top-3 and experts interleaved across the ranks the three terms are added in another order: the
// logits move within the rounding of a different reduction order, which the CPU-vs-GPU chain bound
// (its 2 gamma_K per layer for the slot sum) covers, and greedy picks agree.
TEST(CudaExpertParallel, TwoRanksOnOneGpuGiveTheOneGpuLogits) {
  SPILL_SKIP_WITHOUT_GPU();
  // Interleaved owners, then GPU 1 holding all but one expert per layer.
  expect_group_gives_the_one_gpu_bits(43, 2, {0, 0}, ExpertParallelConfig::Sums::Host,
                                      [](int64_t l, int64_t e) { return int((e * 3 + l) % 2); }, "interleaved");
  expect_group_gives_the_one_gpu_bits(43, 2, {0, 0}, ExpertParallelConfig::Sums::Host,
                                      [](int64_t l, int64_t e) { return int(e != l % 8); }, "all but one on GPU 1");

  int64_t n_blocks = 0;
  Steps s = make_steps(1, 64, 16, &n_blocks, 9);
  const std::vector<int32_t> prompt = {5, 71, 300, 9, 200, 12, 33, 4};
  // Top-3, a shared expert (replicated), experts interleaved.
  const ModelSpec spec = shared_expert_spec();
  auto shared = Model::from_source(spec, make_synthetic_source(spec, shared_expert_mix(SyntheticFill::Now)));
  const offload::PlacementPlan splan = offload::uniform_plan_for(*shared, 0.5, 3);
  auto one3 = make_cuda_runner(*shared, small_offload_config(n_blocks, splan));
  const std::vector<float> want3 = greedy_logits(*one3, s, spec.vocab_size, prompt, 6);
  auto group3 = make_expert_parallel_runner(
      *shared, {.runner = small_offload_config(n_blocks, expert_parallel_plan(splan, 2, [](int64_t l, int64_t e) {
                  return int((e + l) % 2);
                })),
                .devices = {0, 0}, .sums = ExpertParallelConfig::Sums::Host});
  const std::vector<float> got3 = greedy_logits(*group3, s, spec.vocab_size, prompt, 6);
  const double worst = compare_logits(got3, want3, spec.vocab_size, chain_eps(spec, 64, KvFormat::F32), "top-3, 2 ranks");
  std::printf("[ measure ] top-3 over 2 ranks: largest logit difference %.3g of the bound\n", worst);
}

// What the group cannot run is refused by name: a split of attention, a plan for more GPUs than
// the machine has, and a version 2 plan given to the one-GPU runner.
TEST(CudaExpertParallel, PlansTheGroupCannotRunAreRefusedClearly) {
  SPILL_SKIP_WITHOUT_GPU();
  TempDir dir("spill-cuda-ep-bad");
  auto model = small_offload_model(dir, 45);
  const offload::PlacementPlan v1 = offload::uniform_plan_for(*model, 0.25, 5);
  auto refused = [&](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "taken; expected an error naming \"" << needle << "\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  offload::PlacementPlan split = expert_parallel_plan(v1, 2, [](int64_t, int64_t e) { return int(e % 2); });
  split.split.attention = true;
  refused([&] {
    make_expert_parallel_runner(*model, {.runner = small_offload_config(32, split), .devices = {0, 0},
                                         .sums = ExpertParallelConfig::Sums::Host});
  }, "--attention replicated");
  const offload::PlacementPlan v2 = expert_parallel_plan(v1, 2, [](int64_t, int64_t e) { return int(e % 2); });
  refused([&] { make_cuda_runner(*model, small_offload_config(32, v2)); }, "make_expert_parallel_runner");
  refused([&] { make_expert_parallel_runner(*model, {.runner = small_offload_config(32, v2), .devices = {0, 0}}); },
          "NCCL needs a device per GPU");
  refused([&] { make_expert_parallel_runner(*model, {.runner = small_offload_config(32, v2), .devices = {0, 99}}); },
          "cuda:99");
}

// Bad input is refused before any GPU of the group starts the step (a clear error naming it), and
// the group runs the next step as if it had not come.
TEST(CudaExpertParallel, BadInputFailsTheStepNotTheGroup) {
  SPILL_SKIP_WITHOUT_GPU();
  TempDir dir("spill-cuda-ep-input");
  auto model = small_offload_model(dir, 49);
  int64_t n_blocks = 0;
  Steps s = make_steps(1, 64, 16, &n_blocks, 13);
  const offload::PlacementPlan plan = offload::uniform_plan_for(*model, 0.25, 5);
  auto group = make_expert_parallel_runner(
      *model, {.runner = small_offload_config(n_blocks, expert_parallel_plan(plan, 2, [](int64_t, int64_t e) {
                 return int(e % 2);
               })),
               .devices = {0, 0}, .sums = ExpertParallelConfig::Sums::Host});
  std::vector<float> lg;
  try {
    group->forward(s.make({{0, {3, 9999, 5}, 0}}, false), lg);
    ADD_FAILURE() << "a token outside the vocabulary was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("9999"), std::string::npos) << e.what();
  }
  auto one = make_cuda_runner(*model, small_offload_config(n_blocks, plan));
  const std::vector<int32_t> prompt = {3, 77, 150, 9};
  const std::vector<float> want = greedy_logits(*one, s, 512, prompt, 3);
  const std::vector<float> got = greedy_logits(*group, s, 512, prompt, 3);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
}

// Two GPUs through NCCL (skipped with fewer): the same bits as one GPU (top-2, as above).
TEST(CudaExpertParallel, TwoGpusGiveTheOneGpuLogits) {
  SPILL_SKIP_WITHOUT_GPU();
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) GTEST_SKIP() << "needs two GPUs; this machine has " << n;
  const cuda::NcclInfo nccl = cuda::nccl_info();
  if (!nccl.ok) GTEST_SKIP() << "no NCCL: " << nccl.why;
  expect_group_gives_the_one_gpu_bits(47, 2, {0, 1}, ExpertParallelConfig::Sums::Nccl,
                                      [](int64_t l, int64_t e) { return int((e * 3 + l) % 2); }, "two GPUs");
}

TEST(CudaRunnerModels, QuantizedGgufsGreedyMatchTheCpuRunner) {
  SPILL_SKIP_WITHOUT_GPU();
  const char* env = std::getenv("SPILL_GGUF_DIR");
  const std::string dir = env ? env : "/work/gguf";
  cpu::set_activation_mode(cpu::ActivationMode::Q8);  // the GPU's activation rounding (above)
  int found = 0;
  for (const char* name : {"qwen3_moe-Q4_K_M.gguf", "qwen3-Q8_0.gguf", "spill-tiny-Q4_K_M.gguf"}) {
    const std::string path = dir + "/" + name;
    if (!std::filesystem::exists(path)) continue;
    ++found;
    auto model = Model::load(path);
    greedy_against_cpu(*model, 8, name, /*int8_activations=*/true);
  }
  if (found == 0) GTEST_SKIP() << "no GGUF test files in " << dir << " (set SPILL_GGUF_DIR)";
}

}  // namespace
}  // namespace spill

#else
TEST(CudaRunner, SkippedWithoutCuda) { GTEST_SKIP() << "spill was built without CUDA"; }
#endif
