// dot(): picks the widest kernel build this CPU runs, once. All builds compute the same bits
// (dot_kernels.h), so the choice changes speed only.
#include <cstdlib>

#include "core/error.h"
#include "quant/dot_paths.h"
#include "quant/quant.h"

namespace spill::quant {

namespace {

using DotFn = float (*)(DType, const void*, const float*, int64_t);

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

KernelPath best_path() {
  for (KernelPath p : {KernelPath::Avx512, KernelPath::Avx2})
    if (cpu_supports(p)) return p;
  return KernelPath::Scalar;
}

struct Dispatch {
  KernelPath path = best_path();
  DotFn fn = kernel_of(path);
};
const Dispatch& dispatch() {
  static const Dispatch d;
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
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
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

float dot_on(KernelPath p, DType t, const void* row, const float* x, int64_t n) {
  if (!cpu_supports(p)) fail("this CPU cannot run the {} dot-product kernels", kernel_path_name(p));
  check_row(t, n);
  return kernel_of(p)(t, row, x, n);
}

}  // namespace spill::quant
