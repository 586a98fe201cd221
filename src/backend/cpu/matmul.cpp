#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "quant/quant.h"

namespace spill::cpu {

void load_row(const TensorView& w, int64_t row, float* out) {
  quant::dequantize_row(w.dtype, w.row_data(row), out, w.cols());
}

namespace {

ActivationMode mode_from_environment() {
  const char* env = std::getenv("SPILL_CPU_ACTIVATIONS");
  if (!env || !*env) return ActivationMode::Q8;
  return parse_activation_mode(env);
}

std::atomic<int> g_mode{-1};  // -1: not yet read from the environment

}  // namespace

ActivationMode parse_activation_mode(std::string_view name) {
  if (name == "q8") return ActivationMode::Q8;
  if (name == "f32") return ActivationMode::F32;
  fail("CPU activations '{}': unknown; use q8 (int8 activations, llama.cpp's arithmetic) or f32 (exact)", name);
}

const char* activation_mode_name(ActivationMode mode) { return mode == ActivationMode::Q8 ? "q8" : "f32"; }

ActivationMode activation_mode() {
  int m = g_mode.load(std::memory_order_relaxed);
  if (m < 0) {
    m = int(mode_from_environment());
    g_mode.store(m, std::memory_order_relaxed);
  }
  return ActivationMode(m);
}

void set_activation_mode(ActivationMode mode) { g_mode.store(int(mode), std::memory_order_relaxed); }

float dot_row(const float* x, const TensorView& w, int64_t row) {
  return quant::dot(w.dtype, w.row_data(row), x, w.cols());
}

namespace {

void add_bias(const TensorView& bias, int64_t n, int64_t M, float* y) {
  if (bias.empty()) return;
  std::vector<float> b(static_cast<size_t>(M));
  TensorView bv = bias;
  bv.ndim = 2;
  bv.shape = {1, M, 0, 0};
  load_row(bv, 0, b.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t m = 0; m < M; ++m) y[t * M + m] += b[size_t(m)];
}

}  // namespace

void matmul(ThreadPool& pool, const float* x, int64_t n, const TensorView& w, float* y, const TensorView* bias) {
  const int64_t M = w.rows(), K = w.cols();
  if (!row_fits(w.dtype, K))
    fail("cannot multiply by a {} matrix of {} columns: rows must be whole blocks of {}", dtype_name(w.dtype), K,
         dtype_block_elems(w.dtype));
  // Batch invariance: with several tokens a half-precision row is widened once and reused, which
  // gives the same bits as the fused dot (quant::dot reads F16/BF16 in exactly F32's order). A
  // block-format row takes the fused dot for every n (dot_tokens gives each token the bits
  // quant::dot gives it alone): its factored arithmetic (scales applied to sub-block sums) has no
  // widened twin.
  const bool widen = n > 1 && (w.dtype == DType::F16 || w.dtype == DType::BF16);
  if (activation_mode() == ActivationMode::Q8 && quant::prefer_dot_q8(w.dtype)) {
    thread_local std::vector<const float*> rows;
    rows.resize(size_t(n));
    for (int64_t t = 0; t < n; ++t) rows[size_t(t)] = x + t * K;
    const MatmulJob job{.w = &w, .x = rows.data(), .n = n, .y = y, .bias = nullptr};
    matmul_jobs(pool, {&job, 1});
  } else {
    pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    std::vector<float> row;
    if (widen) row.resize(static_cast<size_t>(K));
    for (int64_t m = m0; m < m1; ++m) {
      if (widen) {
        load_row(w, m, row.data());
        for (int64_t t = 0; t < n; ++t) y[t * M + m] = quant::dot(DType::F32, row.data(), x + t * K, K);
      } else {
        quant::dot_tokens(w.dtype, w.row_data(m), x, K, n, K, y + m, M);  // == quant::dot per token
      }
    }
    });
  }
  if (bias) add_bias(*bias, n, M, y);
}

// A decode step reads each weight row once, and a row dot waits on its loads: the kernels' own
// loads reach too few cache lines ahead to keep DRAM busy (moe1b, a 0.9B MoE: ~6 GB/s per core of
// the ~14 a plain read reaches). So the rows a thread will read next are requested this far ahead,
// a row's worth of lines per row: moe1b decode 84 -> 130 tok/s at 2 threads (1 KB: 126, 4 KB: 101,
// 8 KB: 89: further ahead the lines leave L1 before they are used; docs/perf/cpu-decode-2026-12-04.md).
constexpr int64_t kPrefetchBytes = 2048;

void matmul_jobs(ThreadPool& pool, std::span<const MatmulJob> jobs) {
  const bool q8_mode = activation_mode() == ActivationMode::Q8;
  bool all_q8 = q8_mode;
  for (const MatmulJob& j : jobs) all_q8 = all_q8 && quant::prefer_dot_q8(j.w->dtype);
  if (!all_q8) {  // the f32-activation ones each alone, from their tokens gathered into rows
    std::vector<MatmulJob> q8_jobs;
    std::vector<float> xs;
    for (const MatmulJob& j : jobs) {
      if (q8_mode && quant::prefer_dot_q8(j.w->dtype)) {
        q8_jobs.push_back(j);
        continue;
      }
      const int64_t K = j.w->cols();
      xs.resize(size_t(j.n * K));
      for (int64_t t = 0; t < j.n; ++t) std::copy_n(j.x[t], K, xs.data() + t * K);
      matmul(pool, xs.data(), j.n, *j.w, j.y, j.bias);
    }
    if (!q8_jobs.empty()) matmul_jobs(pool, q8_jobs);
    return;
  }
  // Each token's activations rounded once, alone (so its result is the same in any batch), and
  // shared by consecutive jobs that point at the same tokens.
  struct Resolved {
    quant::DotQ8Row dot;
    quant::DotQ8Tokens tokens;  // the same bits, a row against many tokens (prompts)
    const quant::ActivationsQ8* acts;  // n of them
    int64_t first_row;                 // in the loop over every job's rows
  };
  thread_local std::vector<quant::ActivationsQ8> acts;
  thread_local std::vector<Resolved> resolved;
  std::vector<size_t> acts_at(jobs.size());
  size_t used = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    const bool shared = i > 0 && j.n == jobs[i - 1].n && j.w->cols() == jobs[i - 1].w->cols() &&
                        std::equal(j.x, j.x + j.n, jobs[i - 1].x);
    if (shared) {
      acts_at[i] = acts_at[i - 1];
      continue;
    }
    acts_at[i] = used;
    used += size_t(j.n);
  }
  if (acts.size() < used) acts.resize(used);
  resolved.resize(jobs.size());
  int64_t total_rows = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    const int64_t K = j.w->cols();
    resolved[i] = {quant::dot_q8_row(j.w->dtype, K), quant::dot_q8_tokens_fn(j.w->dtype, K), acts.data() + acts_at[i],
                   total_rows};  // checks K
    if (i == 0 || acts_at[i] != acts_at[i - 1])
      for (int64_t t = 0; t < j.n; ++t) quant::quantize_activations_q8(j.x[t], K, acts[acts_at[i] + size_t(t)]);
    total_rows += j.w->rows();
  }
  const Resolved* res = resolved.data();
  pool.parallel_for(total_rows, [&](int64_t r0, int64_t r1) {
    size_t i = 0;
    while (i + 1 < jobs.size() && res[i + 1].first_row <= r0) ++i;
    for (; i < jobs.size() && res[i].first_row < r1; ++i) {
      const MatmulJob& j = jobs[i];
      const int64_t M = j.w->rows();
      const int64_t begin = std::max<int64_t>(r0 - res[i].first_row, 0), end = std::min(M, r1 - res[i].first_row);
      const int64_t row_bytes = j.w->row_bytes();
      const uint8_t* const stop = j.w->row_data(end);  // this thread's rows of the matrix end here
      for (int64_t m = begin; m < end; ++m) {
        const uint8_t* row = j.w->row_data(m);
        for (const uint8_t* p = row + kPrefetchBytes; p < row + kPrefetchBytes + row_bytes && p < stop; p += 64)
          __builtin_prefetch(p);  // a hint: never faults, changes no result
        if (j.n == 1) j.y[m] = res[i].dot(row, res[i].acts[0]);
        else res[i].tokens(row, res[i].acts, j.n, j.y + m, M);
      }
    }
  });
  for (const MatmulJob& j : jobs)
    if (j.bias) add_bias(*j.bias, j.n, j.w->rows(), j.y);
}

}  // namespace spill::cpu
