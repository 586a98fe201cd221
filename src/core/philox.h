// Philox4x32-10, the counter-based generator of Salmon et al. ("Parallel random numbers: as easy as
// 1, 2, 3", SC 2011): 128 random bits are a pure function of a 128-bit counter and a 64-bit key, so
// the draw for a sequence's n-th sampled token can be computed anywhere, in any order, on the CPU or
// in a CUDA kernel, and the two agree bit for bit. Written to C++17 for CUDA sources.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SPILL_HOST_DEVICE __host__ __device__
#else
#define SPILL_HOST_DEVICE
#endif

namespace spill {

struct Philox4x32Block {
  uint32_t v[4];
};

SPILL_HOST_DEVICE inline Philox4x32Block philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                                       uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule: golden ratio, sqrt(3) - 1
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const uint64_t p0 = uint64_t(kMul0) * c0, p1 = uint64_t(kMul1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return {{c0, c1, c2, c3}};
}

// The uniform double in [0, 1) (53 random bits) that a sequence seeded with `seed` uses for its
// `index`-th sampled token (counter = index, key = seed).
SPILL_HOST_DEVICE inline double philox_uniform01(uint64_t seed, uint64_t index) {
  const Philox4x32Block b = philox4x32_10(uint32_t(index), uint32_t(index >> 32), 0, 0, uint32_t(seed), uint32_t(seed >> 32));
  const uint64_t bits = (uint64_t(b.v[0]) << 32) | b.v[1];
  return double(bits >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

}  // namespace spill
