// Speed of the block-format kernels on this CPU at a decode shape: y = W x for one token, W of
// 2048 x 768 weights (x 256-weight blocks), through spill::cpu::matmul (the path decode takes).
// Prints GB/s of weight bytes read, next to this machine's read bandwidth measured here, with the
// matrices in cache (one matrix, reused) and streamed from memory (enough distinct matrices to
// exceed the last-level cache), on 1 and on every hardware thread. Rates are given per wall
// second and per CPU second per thread (the machine may be shared; see process_cpu_seconds).
//
// Block formats with an int8-activation kernel (quant::has_dot_q8) are measured twice: with f32
// activations (quant::dot, the exact reference) and with int8 activations (quant::dot_q8; the
// per-token rounding is inside the timed matmul). "(default)" marks the one the matmul takes
// (quant::prefer_dot_q8).
//
// Build: cmake --build build --target quant_speed; run: build/quant_speed [seconds-per-case] [TYPE,TYPE,...]
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace {

using spill::DType;
using Clock = std::chrono::steady_clock;

// Whether `name` is one of the comma-separated names of `list` (every name when list is empty).
bool selected(std::string_view list, std::string_view name) {
  if (list.empty()) return true;
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    if (list.substr(at, end - at) == name) return true;
    at = end + 1;
  }
  return false;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds of the whole process (every thread): on a shared machine, wall time also counts the
// time the scheduler gave to others; CPU time per thread is what the kernels would take alone.
double process_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// The best of repeated timings of fn, as bytes per wall second and per CPU second per thread.
struct Rate {
  double wall = 0, cpu = 0;  // GB/s
};
template <class Fn>
Rate best_rate(double min_seconds, int threads, double bytes, Fn fn) {
  Rate r;
  const auto start = Clock::now();
  do {
    const auto t0 = Clock::now();
    const double c0 = process_cpu_seconds();
    fn();
    const double wall = seconds_since(t0), cpu = (process_cpu_seconds() - c0) / threads;
    r.wall = std::max(r.wall, bytes / wall / 1e9);
    r.cpu = std::max(r.cpu, bytes / std::max(cpu, 1e-9) / 1e9);
  } while (seconds_since(start) < min_seconds);
  return r;
}

// Read bandwidth: every thread sums its slice of a buffer far larger than the caches.
Rate read_bandwidth(spill::ThreadPool& pool, int threads, const std::vector<float>& buf, double min_seconds) {
  const int64_t n = int64_t(buf.size() / 8);  // 8-float vectors
  std::vector<float> sink(64, 0.0f);
  const Rate r = best_rate(min_seconds, threads, double(n) * 32, [&] {
    pool.parallel_for(n, [&](int64_t a, int64_t b) {
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (int64_t i = a; i + 4 <= b; i += 4) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(buf.data() + 8 * i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(buf.data() + 8 * (i + 1)));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(buf.data() + 8 * (i + 2)));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(buf.data() + 8 * (i + 3)));
      }
      float out[8];
      _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
      sink[size_t(a * 63 / std::max<int64_t>(n, 1))] += out[0];
    });
  });
  if (sink[0] == 12345.0f) std::printf(" ");
  return r;
}

struct Result {
  Rate hot, cold;  // GB/s of weight bytes
  Rate batch16;    // 16 tokens at once, in cache: G(weight x token) per second, in Rate's GB/s fields
  Rate cold2;      // 2 tokens at once, streamed: weight GB/s (an expert's two tokens in a decode batch)
};

// What spill::cpu::matmul does for a prefer_dot_q8 format (each token's activations rounded
// once, then dot_q8 per row), for the formats it does not take that path for.
void matmul_q8(spill::ThreadPool& pool, const float* x, int64_t n, const spill::TensorView& w, float* y) {
  const int64_t M = w.rows(), K = w.cols();
  static std::vector<spill::quant::ActivationsQ8> acts;
  if (acts.size() < size_t(n)) acts.resize(size_t(n));
  for (int64_t t = 0; t < n; ++t) spill::quant::quantize_activations_q8(x + t * K, K, acts[size_t(t)]);
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t t = 0; t < n; ++t) y[t * M + m] = spill::quant::dot_q8(w.dtype, w.row_data(m), acts[size_t(t)]);
  });
}

Result measure(spill::ThreadPool& pool, int threads, DType t, int64_t M, int64_t K, double min_seconds, size_t stream_bytes,
               bool force_q8) {
  auto mm = [&](const float* x, int64_t n, const spill::TensorView& w, float* y) {
    if (force_q8) matmul_q8(pool, x, n, w, y);
    else spill::cpu::matmul(pool, x, n, w, y);
  };
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int64_t rb = spill::row_bytes(t, K);
  const size_t mat_bytes = size_t(M * rb);
  const size_t n_mats = std::max<size_t>(1, stream_bytes / mat_bytes + 1);
  // One quantized matrix, copied to fill the streaming set (the values do not matter for speed).
  std::vector<uint8_t> one(mat_bytes);
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    for (float& v : row) v = normal(rng);
    spill::quant::quantize_row(t, row.data(), one.data() + m * rb, K);
  }
  std::vector<uint8_t> all(mat_bytes * n_mats);
  for (size_t i = 0; i < n_mats; ++i) std::memcpy(all.data() + i * mat_bytes, one.data(), mat_bytes);
  constexpr int64_t kBatch = 16;
  std::vector<float> x(static_cast<size_t>(K * kBatch)), y(static_cast<size_t>(M * kBatch));
  for (float& v : x) v = normal(rng);
  auto view_of = [&](size_t i) {
    spill::TensorView v;
    v.data = all.data() + i * mat_bytes;
    v.dtype = t;
    v.ndim = 2;
    v.shape = {M, K, 0, 0};
    return v;
  };
  Result r;
  // In cache: the same matrix again and again. Streamed: each matmul a different matrix.
  r.hot = best_rate(min_seconds, threads, double(8 * mat_bytes), [&] {
    for (int rep = 0; rep < 8; ++rep) mm(x.data(), 1, view_of(0), y.data());
  });
  r.cold = best_rate(min_seconds, threads, double(n_mats * mat_bytes), [&] {
    for (size_t i = 0; i < n_mats; ++i) mm(x.data(), 1, view_of(i), y.data());
  });
  r.cold2 = best_rate(min_seconds, threads, double(n_mats * mat_bytes), [&] {
    for (size_t i = 0; i < n_mats; ++i) mm(x.data(), 2, view_of(i), y.data());
  });
  // Prefill-like: 16 tokens through the same matrix (weight-token products per second).
  r.batch16 = best_rate(min_seconds, threads, double(M * K * kBatch), [&] {
    mm(x.data(), kBatch, view_of(0), y.data());
  });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const double secs = argc > 1 ? std::atof(argv[1]) : 0.5;
  // argv[2], optional: the types to run, comma-separated as spill names them ("Q8_0,Q4_0").
  const std::string only = argc > 2 ? argv[2] : "";
  const int64_t M = 2048, K = 768;
  const size_t stream_bytes = size_t(256) << 20;  // well past the last-level cache
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<float> buf(stream_bytes / 4);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(i & 7);
  std::printf("dot kernels: %s; matrix %lld x %lld; streaming set %zu MiB\n\n", spill::quant::cpu_kernel_path(),
              (long long)M, (long long)K, stream_bytes >> 20);
  const DType types[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,   DType::Q6_K, DType::Q5_K,
                         DType::Q4_K, DType::Q3_K, DType::Q2_K, DType::IQ4_XS, DType::MXFP4, DType::Q4_0,
                         DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL};
  for (int threads : {1, hw}) {
    spill::ThreadPool pool(threads);
    const Rate bw = read_bandwidth(pool, threads, buf, secs);
    std::printf("threads: %d, measured read bandwidth: %.1f GB/s wall, %.1f GB/s per CPU-second per thread\n\n",
                threads, bw.wall, bw.cpu);
    std::printf("| type | activations | bits/weight | in cache GB/s (wall / cpu) | streamed GB/s (wall / cpu) | streamed / bandwidth (cpu) | streamed Gweights/s (cpu) | 2 tokens, streamed GB/s (cpu) | 16 tokens, in cache: Gweight-tokens/s (cpu) |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    for (DType t : types)
    for (auto mode : {spill::cpu::ActivationMode::F32, spill::cpu::ActivationMode::Q8}) {
      if (!selected(only, spill::dtype_name(t))) continue;
      const bool q8 = mode == spill::cpu::ActivationMode::Q8;
      if (q8 && !spill::quant::has_dot_q8(t)) continue;
      spill::cpu::set_activation_mode(mode);
      const Result r = measure(pool, threads, t, M, K, secs, stream_bytes, q8 && !spill::quant::prefer_dot_q8(t));
      const double bpw = spill::dtype_bits_per_weight(t);
      const bool is_default = q8 == spill::quant::prefer_dot_q8(t);
      std::printf("| %s | %s%s | %.4g | %.1f / %.1f | %.1f / %.1f | %.0f%% | %.2f | %.1f | %.2f |\n",
                  std::string(spill::dtype_name(t)).c_str(), spill::cpu::activation_mode_name(mode),
                  is_default ? " (default)" : "", bpw, r.hot.wall, r.hot.cpu, r.cold.wall, r.cold.cpu,
                  100 * r.cold.cpu / bw.cpu, r.cold.cpu * 8 / bpw, r.cold2.cpu, r.batch16.cpu);
      std::fflush(stdout);
    }
    std::printf("\n");
    if (hw == 1) break;
  }
  return 0;
}
