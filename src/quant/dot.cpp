// dot(): picks the widest kernel build this CPU runs, once. All builds compute the same bits
// (dot_kernels.h), so the choice changes speed only.
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "quant/dot_paths.h"
#include "quant/quant.h"

namespace spill::quant {

namespace {

using DotFn = float (*)(DType, const void*, const float*, int64_t);
using DotTokensFn = void (*)(DType, const void*, const float*, int64_t, int64_t, int64_t, float*, int64_t);

DotFn kernel_of(KernelPath p) {
  switch (p) {
#if defined(__x86_64__) || defined(_M_X64)
    case KernelPath::Avx512: return detail::dot_avx512;
    case KernelPath::Avx2: return detail::dot_avx2;
#else
    case KernelPath::Avx512:
    case KernelPath::Avx2: return nullptr;
#endif
    case KernelPath::Scalar: return detail::dot_scalar;
  }
  return nullptr;
}

DotTokensFn tokens_kernel_of(KernelPath p) {
  switch (p) {
#if defined(__x86_64__) || defined(_M_X64)
    case KernelPath::Avx512: return detail::dot_tokens_avx512;
    case KernelPath::Avx2: return detail::dot_tokens_avx2;
#else
    case KernelPath::Avx512:
    case KernelPath::Avx2: return nullptr;
#endif
    case KernelPath::Scalar: return detail::dot_tokens_scalar;
  }
  return nullptr;
}

KernelPath best_path() {
  for (KernelPath p : {KernelPath::Avx512, KernelPath::Avx2})
    if (cpu_supports(p)) return p;
  return KernelPath::Scalar;
}

// SPILL_CPU_KERNELS=scalar|avx2|avx512 overrides the choice (to compare paths in a whole run, or
// to step around one); a path this CPU lacks, or an unknown name, is an error at the first dot().
KernelPath chosen_path() {
  const char* env = std::getenv("SPILL_CPU_KERNELS");
  if (!env || !*env) return best_path();
  const std::string_view want(env);
  for (KernelPath p : {KernelPath::Scalar, KernelPath::Avx2, KernelPath::Avx512}) {
    if (want != kernel_path_name(p)) continue;
    if (!cpu_supports(p)) fail("SPILL_CPU_KERNELS={}: this CPU cannot run those kernels; unset it or use scalar", env);
    return p;
  }
  fail("SPILL_CPU_KERNELS={}: unknown; use scalar, avx2 or avx512", env);
}

struct Dispatch {
  KernelPath path = chosen_path();
  DotFn fn = kernel_of(path);
  DotTokensFn tokens_fn = tokens_kernel_of(path);
};
const Dispatch& dispatch() {
  static const Dispatch d;  // a throw leaves it unset, so the next call throws again
  return d;
}

void check_row(DType t, int64_t n) {
  if (!row_fits(t, n))
    fail("cannot take a dot product over {} weights of {}: rows must be whole blocks of {}", n, dtype_name(t),
         dtype_block_elems(t));
}

}  // namespace

bool cpu_supports(KernelPath p) {
  switch (p) {
    case KernelPath::Scalar: return true;
#if defined(__x86_64__) || defined(_M_X64)
    case KernelPath::Avx2:
#if defined(__clang__)
      // clang's __builtin_cpu_supports does not know "f16c"; every AVX2 CPU (Intel Haswell, AMD
      // Excavator and later) has it.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
    case KernelPath::Avx512:
      return cpu_supports(KernelPath::Avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    case KernelPath::Avx2:
    case KernelPath::Avx512: return false;
#endif
  }
  return false;
}

const char* kernel_path_name(KernelPath p) {
  switch (p) {
    case KernelPath::Avx512: return "avx512";
    case KernelPath::Avx2: return "avx2";
    case KernelPath::Scalar: return "scalar";
  }
  return "?";
}

const char* cpu_kernel_path() { return kernel_path_name(dispatch().path); }

float dot(DType t, const void* row, const float* x, int64_t n) {
  check_row(t, n);
  return dispatch().fn(t, row, x, n);
}

void dot_tokens(DType t, const void* row, const float* x, int64_t x_stride, int64_t n_tokens, int64_t n, float* out,
                int64_t out_stride) {
  check_row(t, n);
  if (n_tokens > 0) dispatch().tokens_fn(t, row, x, x_stride, n_tokens, n, out, out_stride);
}

float dot_on(KernelPath p, DType t, const void* row, const float* x, int64_t n) {
  if (!cpu_supports(p)) fail("this CPU cannot run the {} dot-product kernels", kernel_path_name(p));
  check_row(t, n);
  return kernel_of(p)(t, row, x, n);
}

}  // namespace spill::quant
