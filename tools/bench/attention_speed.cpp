// Speed of the CPU paged attention (src/backend/cpu/attention.cpp) in a prefill: a prompt of N
// tokens fed in chunks of --chunk tokens, each chunk attending causally over the cache written by
// the ones before, and a decode step at the end of that context. Prints one row per context:
// seconds, tokens/s, and GFLOP/s counting 4 * head_dim flops per (query head, position seen).
//
// Usage: attention_speed [--heads 4] [--kv-heads 2] [--head-dim 64] [--chunk 2048] [--threads 0]
//                        [--contexts 1024,4096,16384,32768]
// Defaults are one layer of spill-tiny; multiply the seconds by its 6 layers for a whole model.
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"

namespace {

using Clock = std::chrono::steady_clock;

// CPU seconds of the whole process (all threads): on a shared machine the wall time says how loaded
// it is, the CPU time what the kernel costs.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    v.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n_heads = 4, n_kv = 2, D = 64, chunk = 2048;
  int threads = 0;
  std::vector<int64_t> contexts = {1024, 4096, 16384, 32768};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--heads") n_heads = std::atoll(value);
    else if (flag == "--kv-heads") n_kv = std::atoll(value);
    else if (flag == "--head-dim") D = std::atoll(value);
    else if (flag == "--chunk") chunk = std::atoll(value);
    else if (flag == "--threads") threads = std::atoi(value);
    else if (flag == "--contexts") contexts = parse_list(value);
    else {
      std::fprintf(stderr, "attention_speed: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (n_heads <= 0 || n_kv <= 0 || n_heads % n_kv != 0 || D <= 0 || chunk <= 0) {
    std::fprintf(stderr, "attention_speed: need heads a positive multiple of kv-heads, head-dim and chunk > 0\n");
    return 2;
  }
  spill::ThreadPool pool(threads);
  const int32_t block_size = 16;
  std::printf("paged attention, one layer: %lld query heads, %lld KV heads, head_dim %lld, chunks of %lld, %d threads\n",
              (long long)n_heads, (long long)n_kv, (long long)D, (long long)chunk, pool.size());
  std::printf("| context | prefill wall s | prefill CPU s | tok/s per wall s | GFLOP per CPU s | decode CPU ms/token |\n");
  std::printf("|--------:|---------------:|--------------:|-----------------:|----------------:|--------------------:|\n");
  for (const int64_t ctx : contexts) {
    const int64_t n_blocks = (ctx + 1 + block_size - 1) / block_size;
    std::vector<float> kc(static_cast<size_t>(n_blocks * block_size * n_kv * D)), vc(kc.size());
    spill::cpu::PagedKv kv{kc.data(), vc.data(), block_size, n_kv, D};
    std::vector<int32_t> table(static_cast<size_t>(n_blocks));
    for (int64_t b = 0; b < n_blocks; ++b) table[size_t(b)] = int32_t((b * 7919) % n_blocks);  // scattered
    std::mt19937 rng(static_cast<uint32_t>(ctx));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int64_t n = std::min(chunk, ctx);
    std::vector<float> q(static_cast<size_t>(n * n_heads * D)), k(static_cast<size_t>(n * n_kv * D)), v(k.size()), out(q.size());
    for (float& x : q) x = dist(rng);
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    double flops = 0;
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    for (int64_t start = 0; start < ctx; start += chunk) {
      const int32_t len = int32_t(std::min(chunk, ctx - start));
      const spill::cpu::AttentionChunk c{0, len, int32_t(start), table};
      spill::cpu::paged_attention(pool, kv, {&c, 1}, q.data(), k.data(), v.data(), n_heads, out.data());
      for (int64_t i = 0; i < len; ++i) flops += 4.0 * double(D) * double(n_heads) * double(start + i + 1);
    }
    const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double prefill_cpu = cpu_seconds() - c0;
    const int reps = 20;
    const double c1 = cpu_seconds();
    for (int i = 0; i < reps; ++i) {
      const spill::cpu::AttentionChunk c{0, 1, int32_t(ctx), table};
      spill::cpu::paged_attention(pool, kv, {&c, 1}, q.data(), k.data(), v.data(), n_heads, out.data());
    }
    const double decode_ms = (cpu_seconds() - c1) * 1e3 / reps;
    std::printf("| %7lld | %14.3f | %13.3f | %16.0f | %15.1f | %19.3f |\n", (long long)ctx, prefill_s, prefill_cpu,
                double(ctx) / prefill_s, flops / prefill_cpu * 1e-9, decode_ms);
    std::fflush(stdout);
  }
  return 0;
}
