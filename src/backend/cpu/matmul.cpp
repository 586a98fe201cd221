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
    // Each token rounded once, alone (so its result is the same in any batch), for every row.
    thread_local std::vector<quant::ActivationsQ8> acts;
    if (acts.size() < size_t(n)) acts.resize(size_t(n));
    for (int64_t t = 0; t < n; ++t) quant::quantize_activations_q8(x + t * K, K, acts[size_t(t)]);
    const quant::ActivationsQ8* a = acts.data();
    pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        const void* row = w.row_data(m);
        for (int64_t t = 0; t < n; ++t) y[t * M + m] = quant::dot_q8(w.dtype, row, a[t]);
      }
    });
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
  if (bias && !bias->empty()) {
    std::vector<float> b(static_cast<size_t>(M));
    TensorView bv = *bias;
    bv.ndim = 2;
    bv.shape = {1, M, 0, 0};
    load_row(bv, 0, b.data());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t m = 0; m < M; ++m) y[t * M + m] += b[size_t(m)];
  }
}

}  // namespace spill::cpu
