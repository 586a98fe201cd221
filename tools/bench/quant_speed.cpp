// Speed of the block-format kernels on this CPU at a decode shape: y = W x for one token, W of
// 2048 x 768 weights (x 256-weight blocks), through spill::cpu::matmul (the path decode takes).
// Prints GB/s of weight bytes read, next to this machine's read bandwidth measured here, with the
// matrices in cache (one matrix, reused) and streamed from memory (enough distinct matrices to
// exceed the last-level cache), on 1 and on every hardware thread.
//
// Build: cmake --build build --target quant_speed; run: build/quant_speed [seconds-per-case]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace {

using spill::DType;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Read bandwidth: every thread sums its slice of a buffer far larger than the caches.
double read_bandwidth_gbs(spill::ThreadPool& pool, const std::vector<__m256>& buf, double min_seconds) {
  const int64_t n = int64_t(buf.size());
  std::vector<float> sink(64, 0.0f);
  double best = 0;
  const auto start = Clock::now();
  while (seconds_since(start) < min_seconds) {
    const auto t0 = Clock::now();
    pool.parallel_for(n, [&](int64_t a, int64_t b) {
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      int64_t i = a;
      for (; i + 4 <= b; i += 4) {
        s0 = _mm256_add_ps(s0, buf[size_t(i)]);
        s1 = _mm256_add_ps(s1, buf[size_t(i + 1)]);
        s2 = _mm256_add_ps(s2, buf[size_t(i + 2)]);
        s3 = _mm256_add_ps(s3, buf[size_t(i + 3)]);
      }
      float out[8];
      _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
      sink[size_t(a * 63 / std::max<int64_t>(n, 1))] += out[0];
    });
    best = std::max(best, double(n) * 32 / seconds_since(t0) / 1e9);
  }
  if (sink[0] == 12345.0f) std::printf(" ");
  return best;
}

struct Result {
  double hot, cold;  // GB/s of weight bytes
};

Result measure(spill::ThreadPool& pool, DType t, int64_t M, int64_t K, double min_seconds, size_t stream_bytes) {
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
  std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(M));
  for (float& v : x) v = normal(rng);
  auto view_of = [&](size_t i) {
    spill::TensorView v;
    v.data = all.data() + i * mat_bytes;
    v.dtype = t;
    v.ndim = 2;
    v.shape = {M, K, 0, 0};
    return v;
  };
  auto run = [&](size_t mats) {
    double best = 0;
    const auto start = Clock::now();
    size_t next = 0;
    while (seconds_since(start) < min_seconds) {
      const auto t0 = Clock::now();
      for (size_t i = 0; i < mats; ++i) spill::cpu::matmul(pool, x.data(), 1, view_of(next++ % n_mats), y.data());
      best = std::max(best, double(mats * mat_bytes) / seconds_since(t0) / 1e9);
    }
    return best;
  };
  Result r;
  {
    // Hot: the same matrix again and again.
    double best = 0;
    const auto start = Clock::now();
    while (seconds_since(start) < min_seconds) {
      const auto t0 = Clock::now();
      for (int rep = 0; rep < 8; ++rep) spill::cpu::matmul(pool, x.data(), 1, view_of(0), y.data());
      best = std::max(best, double(8 * mat_bytes) / seconds_since(t0) / 1e9);
    }
    r.hot = best;
  }
  r.cold = run(n_mats);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const double secs = argc > 1 ? std::atof(argv[1]) : 0.5;
  const int64_t M = 2048, K = 768;
  const size_t stream_bytes = size_t(256) << 20;  // well past the last-level cache
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<__m256> buf(stream_bytes / 32);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = _mm256_set1_ps(float(i & 7));
  std::printf("dot kernels: %s; matrix %lld x %lld; streaming set %zu MiB\n\n", spill::quant::cpu_kernel_path(),
              (long long)M, (long long)K, stream_bytes >> 20);
  const DType types[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,   DType::Q6_K, DType::Q5_K,
                         DType::Q4_K, DType::Q3_K, DType::Q2_K, DType::IQ4_XS, DType::MXFP4};
  for (int threads : {1, hw}) {
    spill::ThreadPool pool(threads);
    const double bw = read_bandwidth_gbs(pool, buf, secs);
    std::printf("threads: %d, measured read bandwidth: %.1f GB/s\n\n", threads, bw);
    std::printf("| type | bits/weight | in cache GB/s | streamed GB/s | streamed / bandwidth | streamed Gweights/s |\n");
    std::printf("|---|---|---|---|---|---|\n");
    for (DType t : types) {
      const Result r = measure(pool, t, M, K, secs, stream_bytes);
      const double bpw = spill::dtype_bits_per_weight(t);
      std::printf("| %s | %.4g | %.1f | %.1f | %.0f%% | %.2f |\n", std::string(spill::dtype_name(t)).c_str(), bpw,
                  r.hot, r.cold, 100 * r.cold / bw, r.cold * 8 / bpw);
      std::fflush(stdout);
    }
    std::printf("\n");
    if (hw == 1) break;
  }
  return 0;
}
