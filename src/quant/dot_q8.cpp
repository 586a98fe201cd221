// dot_q8 (quant.h): activations rounded to int8 per block of 256, integer sums from the kernel
// build this CPU runs (dot_q8_scalar.cpp, dot_q8_avx2.cpp), and the float scales applied here,
// in one order for every build, so the result's bits never depend on the instruction set.
#include <algorithm>
#include <cmath>
#include <string_view>

#include "core/error.h"
#include "quant/dot_q8_paths.h"
#include "quant/quant.h"

namespace spill::quant {

namespace {

constexpr int64_t kActBlock = 256;

const detail::Q8Kernels& kernels_for(KernelPath p) {
#if defined(__x86_64__) || defined(_M_X64)
  if (p != KernelPath::Scalar) return detail::kQ8Avx2;  // AVX-512 runs the AVX2 integer kernels
#endif
  (void)p;
  return detail::kQ8Scalar;
}

inline float half(uint16_t h) { return f16_to_f32(h); }

// The integer sums are made a chunk of blocks at a time into a buffer on the stack.
constexpr int64_t kChunk = 64;

float combine_q8_0(const detail::Q8Kernels& k, const void* row, const ActivationsQ8& a) {
  const BlockQ8_0* w = static_cast<const BlockQ8_0*>(row);
  const int64_t nb = a.n / 32;
  int32_t sums[kChunk];
  float total = 0.0f, inner = 0.0f;
  // Each activation block of 256 holds 8 weight blocks of 32: their d_w * sum is summed, then
  // scaled by the block's d_x and added to the total.
  for (int64_t c = 0; c < nb; c += kChunk) {
    const int64_t len = std::min(kChunk, nb - c);
    k.q8_0(w + c, a.q.data() + 32 * c, len, sums);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t b = c + i;
      inner += half(w[b].d) * float(sums[i]);
      if (b % 8 == 7 || b == nb - 1) {
        total += a.d[size_t(b / 8)] * inner;
        inner = 0.0f;
      }
    }
  }
  return total;
}

// The legacy 32-weight formats as Q8_0: per activation block of 256, the 8 weight blocks' d_w *
// sum (plus, for Q4_1/Q5_1, m_w * the sum of the block's 32 activation quants) summed, then scaled
// by d_x and added to the total.
template <class Block, bool kMin>
float combine_legacy(void (*kernel)(const Block*, const int8_t*, int64_t, int32_t*), const void* row,
                     const ActivationsQ8& a) {
  const Block* w = static_cast<const Block*>(row);
  const int64_t nb = a.n / 32;
  int32_t sums[kChunk];
  float total = 0.0f, inner = 0.0f;
  for (int64_t c = 0; c < nb; c += kChunk) {
    const int64_t len = std::min(kChunk, nb - c);
    kernel(w + c, a.q.data() + 32 * c, len, sums);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t b = c + i;
      float block = half(w[b].d) * float(sums[i]);
      if constexpr (kMin) {
        const int32_t qsum = int32_t(a.sum16[size_t(2 * b)]) + int32_t(a.sum16[size_t(2 * b + 1)]);
        block = block + half(w[b].m) * float(qsum);
      }
      inner += block;
      if (b % 8 == 7 || b == nb - 1) {
        total += a.d[size_t(b / 8)] * inner;
        inner = 0.0f;
      }
    }
  }
  return total;
}

template <class Block, bool kMin, class Kernel>
float combine_k(Kernel kernel, const void* row, const ActivationsQ8& a) {
  const Block* w = static_cast<const Block*>(row);
  const int64_t nb = a.n / kSuperBlock;
  constexpr int kPer = kMin ? 2 : 1;
  int32_t sums[kChunk * 2];
  float total = 0.0f;
  for (int64_t c = 0; c < nb; c += kChunk) {
    const int64_t len = std::min(kChunk, nb - c);
    kernel(w + c, a.q.data() + kSuperBlock * c, a.sum16.data() + 16 * c, len, sums);
    for (int64_t i = 0; i < len; ++i) {
      const Block& b = w[c + i];
      float block = half(b.d) * float(sums[kPer * i]);
      if constexpr (kMin) block = block - half(b.dmin) * float(sums[kPer * i + 1]);
      total += a.d[size_t(c + i)] * block;
    }
  }
  return total;
}

float dot_q8_with(const detail::Q8Kernels& k, DType t, const void* row, const ActivationsQ8& a) {
  if (!row_fits(t, a.n))
    fail("cannot take a q8 dot product over {} weights of {}: rows must be whole blocks of {}", a.n, dtype_name(t),
         dtype_block_elems(t));
  switch (t) {
    case DType::Q8_0: return combine_q8_0(k, row, a);
    case DType::Q4_K: return combine_k<BlockQ4_K, true>(k.q4_k, row, a);
    case DType::Q5_K: return combine_k<BlockQ5_K, true>(k.q5_k, row, a);
    case DType::Q6_K: return combine_k<BlockQ6_K, false>(k.q6_k, row, a);
    case DType::Q4_0: return combine_legacy<BlockQ4_0, false>(k.q4_0, row, a);
    case DType::Q4_1: return combine_legacy<BlockQ4_1, true>(k.q4_1, row, a);
    case DType::Q5_0: return combine_legacy<BlockQ5_0, false>(k.q5_0, row, a);
    case DType::Q5_1: return combine_legacy<BlockQ5_1, true>(k.q5_1, row, a);
    case DType::IQ4_NL: return combine_legacy<BlockIQ4_NL, false>(k.iq4_nl, row, a);
    default: fail("{} has no int8-activation dot product; use quant::dot (f32 activations)", dtype_name(t));
  }
}

KernelPath q8_path() {
  static const KernelPath p = [] {
    const std::string_view name = cpu_kernel_path();  // honours SPILL_CPU_KERNELS
    return name == "scalar" ? KernelPath::Scalar : KernelPath::Avx2;
  }();
  return p;
}

}  // namespace

void quantize_activations_q8(const float* x, int64_t n, ActivationsQ8& out) {
  if (n < 0 || n % 32 != 0)
    fail("cannot round {} activations to int8: the count must be a multiple of 32 (a whole weight block)", n);
  const int64_t blocks = (n + kActBlock - 1) / kActBlock;
  out.n = n;
  out.d.resize(size_t(blocks));
  out.q.resize(size_t(n));
  out.sum16.resize(size_t(n / 16));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kActBlock, end = std::min(n, begin + kActBlock);
    // poison is NaN exactly when some x is NaN or infinite (std::max would skip a NaN).
    float amax = 0.0f, poison = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      amax = std::max(amax, std::fabs(x[i]));
      poison += x[i] * 0.0f;
    }
    if (!std::isfinite(amax) || std::isnan(poison)) {
      for (int64_t i = begin; i < end; ++i)
        if (!std::isfinite(x[i])) fail("activation {} of {} is {}: cannot round it to int8", i, n, x[i]);
    }
    const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    out.d[size_t(b)] = d;
    for (int64_t i = begin; i < end; ++i) {
      // Round to nearest (even); |x * inv| <= 127 up to one rounding, so the clamp only guards it.
      const float r = std::nearbyint(x[i] * inv);
      out.q[size_t(i)] = int8_t(std::clamp(r, -127.0f, 127.0f));
    }
  }
  for (int64_t j = 0; j < n / 16; ++j) {
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) s += out.q[size_t(16 * j + l)];
    out.sum16[size_t(j)] = int16_t(s);
  }
}

bool has_dot_q8(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::IQ4_NL: return true;
    default: return false;
  }
}

bool prefer_dot_q8(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }

float dot_q8(DType t, const void* row, const ActivationsQ8& a) { return dot_q8_with(kernels_for(q8_path()), t, row, a); }

float dot_q8_on(KernelPath p, DType t, const void* row, const ActivationsQ8& a) {
  if (!cpu_supports(p)) fail("this CPU cannot run the {} dot-product kernels", kernel_path_name(p));
  return dot_q8_with(kernels_for(p), t, row, a);
}

}  // namespace spill::quant
