#include "quant/random_blocks.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "quant/blocks.h"

namespace spill::quant {
namespace {

constexpr int64_t kChunkBlocks = 1 << 14;  // blocks per independently seeded stream

// splitmix64: fast, and every seed gives a full-quality stream.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) * (1.0f / 16777216.0f); }
  void bytes(void* dst, size_t n) {
    uint8_t* p = static_cast<uint8_t*>(dst);
    for (; n >= 8; n -= 8, p += 8) {
      const uint64_t v = next();
      std::memcpy(p, &v, 8);
    }
    if (n) {
      const uint64_t v = next();
      std::memcpy(p, &v, n);
    }
  }
};

// Scales are drawn so that |d * scale * q| is at most about 0.1: d over [0.5, 1] of its range,
// with either sign where the format's scale is signed.
void fill_block(DType t, uint8_t* b, Rng& rng) {
  const auto f16 = [](float v) { return f32_to_f16(v); };
  switch (t) {
    case DType::F32: {
      const float v = rng.uniform(-1.0f, 1.0f);
      std::memcpy(b, &v, 4);
      break;
    }
    case DType::F16: {
      const uint16_t v = f16(rng.uniform(-1.0f, 1.0f));
      std::memcpy(b, &v, 2);
      break;
    }
    case DType::BF16: {
      const uint16_t v = f32_to_bf16(rng.uniform(-1.0f, 1.0f));
      std::memcpy(b, &v, 2);
      break;
    }
    case DType::Q8_0: {
      auto* q = reinterpret_cast<BlockQ8_0*>(b);
      rng.bytes(q->qs, sizeof q->qs);
      q->d = f16(rng.uniform(0.5f, 1.0f) * 0.1f / 127.0f);
      break;
    }
    case DType::Q6_K: {
      auto* q = reinterpret_cast<BlockQ6_K*>(b);
      rng.bytes(q->ql, sizeof q->ql);
      rng.bytes(q->qh, sizeof q->qh);
      for (auto& s : q->scales) s = int8_t(int(rng.next() % 255) - 127);  // -127 .. 127
      q->d = f16(rng.uniform(0.5f, 1.0f) * 0.1f / (32.0f * 127.0f));
      break;
    }
    case DType::Q5_K:
    case DType::Q4_K: {
      const bool five = t == DType::Q5_K;
      uint16_t* d = reinterpret_cast<uint16_t*>(b);
      const float max_q = five ? 31.0f : 15.0f;
      d[0] = f16(rng.uniform(0.5f, 1.0f) * 0.1f / (63.0f * max_q));
      d[1] = f16(rng.uniform(0.5f, 1.0f) * 0.05f / 63.0f);
      rng.bytes(b + 4, 12);        // 6-bit scales and mins: any bit pattern is valid
      rng.bytes(b + 16, size_t(dtype_traits(t).block_bytes - 16));  // (qh and) qs
      break;
    }
    case DType::Q3_K: {
      auto* q = reinterpret_cast<BlockQ3_K*>(b);
      rng.bytes(q->hmask, sizeof q->hmask);
      rng.bytes(q->qs, sizeof q->qs);
      rng.bytes(q->scales, sizeof q->scales);
      q->d = f16(rng.uniform(0.5f, 1.0f) * 0.1f / (32.0f * 4.0f));
      break;
    }
    case DType::Q2_K: {
      auto* q = reinterpret_cast<BlockQ2_K*>(b);
      rng.bytes(q->scales, sizeof q->scales);
      rng.bytes(q->qs, sizeof q->qs);
      q->d = f16(rng.uniform(0.5f, 1.0f) * 0.1f / (15.0f * 3.0f));
      q->dmin = f16(rng.uniform(0.5f, 1.0f) * 0.05f / 15.0f);
      break;
    }
    case DType::IQ4_XS: {
      auto* q = reinterpret_cast<BlockIQ4_XS*>(b);
      rng.bytes(&q->scales_h, sizeof q->scales_h);
      rng.bytes(q->scales_l, sizeof q->scales_l);
      rng.bytes(q->qs, sizeof q->qs);
      q->d = f16(rng.uniform(0.5f, 1.0f) * 0.1f / (32.0f * 127.0f));
      break;
    }
    case DType::MXFP4: {
      auto* q = reinterpret_cast<BlockMXFP4*>(b);
      rng.bytes(q->qs, sizeof q->qs);
      q->e = uint8_t(118 + rng.next() % 5);  // 2^-9 .. 2^-5 per half-unit: |w| <= 12 * 2^-6
      break;
    }
    case DType::Q4_0:
    case DType::IQ4_NL: {  // d, then 16 bytes of nibbles
      const float max_q = t == DType::Q4_0 ? 8.0f : 127.0f;
      const uint16_t d = f16(rng.uniform(0.5f, 1.0f) * 0.1f / max_q);
      std::memcpy(b, &d, 2);
      rng.bytes(b + 2, 16);
      break;
    }
    case DType::Q5_0: {
      auto* q = reinterpret_cast<BlockQ5_0*>(b);
      rng.bytes(q->qh, sizeof q->qh);
      rng.bytes(q->qs, sizeof q->qs);
      q->d = f16(rng.uniform(0.5f, 1.0f) * 0.1f / 16.0f);
      break;
    }
    case DType::Q4_1:
    case DType::Q5_1: {  // d, m, then (qh and) qs; w = d q + m in [-0.05, 0.05]-ish
      const float max_q = t == DType::Q4_1 ? 15.0f : 31.0f;
      uint16_t* dm = reinterpret_cast<uint16_t*>(b);
      dm[0] = f16(rng.uniform(0.5f, 1.0f) * 0.1f / max_q);
      dm[1] = f16(-rng.uniform(0.5f, 1.0f) * 0.05f);
      rng.bytes(b + 4, size_t(dtype_traits(t).block_bytes - 4));
      break;
    }
  }
}

}  // namespace

void fill_random_blocks(DType t, void* dst, int64_t n_blocks, uint64_t seed, int threads) {
  const int64_t bytes = dtype_traits(t).block_bytes;
  const int64_t chunks = (n_blocks + kChunkBlocks - 1) / kChunkBlocks;
  auto fill_chunks = [&](int64_t first, int64_t step) {
    for (int64_t c = first; c < chunks; c += step) {
      Rng rng{seed * 0x100000001B3ull + uint64_t(c) * 0x9E3779B97F4A7C15ull + uint64_t(t)};
      uint8_t* b = static_cast<uint8_t*>(dst) + c * kChunkBlocks * bytes;
      const int64_t end = std::min(n_blocks, (c + 1) * kChunkBlocks);
      for (int64_t i = c * kChunkBlocks; i < end; ++i, b += bytes) fill_block(t, b, rng);
    }
  };
  int n = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  n = int(std::min<int64_t>(n, chunks));
  if (n <= 1) {
    fill_chunks(0, 1);
    return;
  }
  std::vector<std::thread> pool;
  for (int i = 0; i < n; ++i) pool.emplace_back(fill_chunks, int64_t(i), int64_t(n));
  for (auto& th : pool) th.join();
}

}  // namespace spill::quant
