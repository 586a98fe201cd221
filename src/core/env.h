// Integer settings from the environment, for the measurement knobs of the kernels (SPILL_GEMV_*,
// SPILL_CUDA_ATTN_*: they change how work is split, never a result's bits or meaning). C++17: the
// CUDA sources include it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace spill {

// The variable's value as an integer clamped to [lo, hi]; fallback when it is unset or empty. A value
// that is not a number reads as 0 (then clamped), as atoll gives it.
inline int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  return std::clamp<int64_t>(std::atoll(v), lo, hi);
}

}  // namespace spill
