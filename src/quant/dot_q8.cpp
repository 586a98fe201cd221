// dot_q8 (quant.h): activations rounded to int8 per block of 256, and the row dots of the kernel
// build this CPU runs (dot_q8_scalar.cpp, dot_q8_avx2.cpp), which apply the float scales in the
// one order dot_q8_paths.h writes out (the legacy formats' scales are applied here, also in one
// order), so the result's bits never depend on the instruction set.
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

// Q4_1 / Q5_1: per activation block of 256, the 8 weight blocks' d_w *
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

template <class Block>
float row_k(float (*kernel)(const Block*, const int8_t*, const int16_t*, const float*, int64_t), const void* row,
            const ActivationsQ8& a) {
  return kernel(static_cast<const Block*>(row), a.q.data(), a.sum16.data(), a.d.data(), a.n / kSuperBlock);
}

float dot_q8_with(const detail::Q8Kernels& k, DType t, const void* row, const ActivationsQ8& a) {
  if (!row_fits(t, a.n))
    fail("cannot take a q8 dot product over {} weights of {}: rows must be whole blocks of {}", a.n, dtype_name(t),
         dtype_block_elems(t));
  switch (t) {
    case DType::Q8_0: return k.row_q8_0(static_cast<const BlockQ8_0*>(row), a.q.data(), a.d.data(), a.n / 32);
    case DType::Q4_K: return row_k(k.row_q4_k, row, a);
    case DType::Q5_K: return row_k(k.row_q5_k, row, a);
    case DType::Q6_K: return row_k(k.row_q6_k, row, a);
    case DType::Q4_0: return k.row_q4_0(static_cast<const BlockQ4_0*>(row), a.q.data(), a.d.data(), a.n / 32);
    case DType::Q4_1: return combine_legacy<BlockQ4_1, true>(k.q4_1, row, a);
    case DType::Q5_0: return k.row_q5_0(static_cast<const BlockQ5_0*>(row), a.q.data(), a.d.data(), a.n / 32);
    case DType::Q5_1: return combine_legacy<BlockQ5_1, true>(k.q5_1, row, a);
    case DType::IQ4_NL: return k.row_iq4_nl(static_cast<const BlockIQ4_NL*>(row), a.q.data(), a.d.data(), a.n / 32);
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
  const detail::Q8Kernels& k = kernels_for(q8_path());
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kActBlock, len = std::min(n, begin + kActBlock) - begin;
    // poison is NaN exactly when some x is NaN or infinite (std::max would skip a NaN).
    float poison = 0.0f;
    const float amax = k.amax(x + begin, len, &poison);
    if (!std::isfinite(amax) || std::isnan(poison)) {
      for (int64_t i = begin; i < begin + len; ++i)
        if (!std::isfinite(x[i])) fail("activation {} of {} is {}: cannot round it to int8", i, n, x[i]);
    }
    out.d[size_t(b)] = amax / 127.0f;
    k.round(x + begin, len, amax > 0.0f ? 127.0f / amax : 0.0f, out.q.data() + begin);
  }
  k.sum16(out.q.data(), n / 16, out.sum16.data());
}

bool has_dot_q8(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::IQ4_NL: return true;
    default: return false;
  }
}

bool prefer_dot_q8(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::Q4_0: case DType::Q5_0: case DType::IQ4_NL: return true;
    default: return false;
  }
}

namespace {

template <const detail::Q8Kernels* K>
float q8_0_row(const void* row, const ActivationsQ8& a) {
  return K->row_q8_0(static_cast<const BlockQ8_0*>(row), a.q.data(), a.d.data(), a.n / 32);
}
template <const detail::Q8Kernels* K, DType T>
float legacy_row(const void* row, const ActivationsQ8& a) {
  if constexpr (T == DType::Q4_0) return K->row_q4_0(static_cast<const BlockQ4_0*>(row), a.q.data(), a.d.data(), a.n / 32);
  if constexpr (T == DType::Q5_0) return K->row_q5_0(static_cast<const BlockQ5_0*>(row), a.q.data(), a.d.data(), a.n / 32);
  if constexpr (T == DType::IQ4_NL)
    return K->row_iq4_nl(static_cast<const BlockIQ4_NL*>(row), a.q.data(), a.d.data(), a.n / 32);
}
template <const detail::Q8Kernels* K, DType T>
float k_row(const void* row, const ActivationsQ8& a) {
  if constexpr (T == DType::Q4_K) return row_k(K->row_q4_k, row, a);
  if constexpr (T == DType::Q5_K) return row_k(K->row_q5_k, row, a);
  if constexpr (T == DType::Q6_K) return row_k(K->row_q6_k, row, a);
}
template <const detail::Q8Kernels* K>
DotQ8Row row_fn_of(DType t) {
  switch (t) {
    case DType::Q8_0: return q8_0_row<K>;
    case DType::Q4_K: return k_row<K, DType::Q4_K>;
    case DType::Q5_K: return k_row<K, DType::Q5_K>;
    case DType::Q6_K: return k_row<K, DType::Q6_K>;
    case DType::Q4_0: return legacy_row<K, DType::Q4_0>;
    case DType::Q5_0: return legacy_row<K, DType::Q5_0>;
    case DType::IQ4_NL: return legacy_row<K, DType::IQ4_NL>;
    default: return nullptr;
  }
}
template <DType T>
float any_row(const void* row, const ActivationsQ8& a) { return dot_q8(T, row, a); }

// One row against count tokens: four at a time through the build's x4 kernel where it has one for
// T (Q8_0, Q4_K, Q5_K), then two at a time through its x2 kernel, the rest one at a time through
// dot_q8_row's function. Every token gets the one-token kernel's bits whichever way it went.
template <const detail::Q8Kernels* K, DType T>
void tokens_row(const void* row, const ActivationsQ8* acts, int64_t count, float* out, int64_t stride) {
  if (count <= 0) return;
  // Tokens first .. first + N - 1 into o; false where the build has no N-token kernel for T.
  float o[4];
  auto group = [&]<int N>(int64_t first) {
    const int8_t* q[N];
    const float* dx[N];
    const int16_t* s16[N];
    for (int k = 0; k < N; ++k) {
      q[k] = acts[first + k].q.data();
      dx[k] = acts[first + k].d.data();
      s16[k] = acts[first + k].sum16.data();
    }
    const int64_t n = acts[first].n;
    const auto k8 = N == 4 ? K->row_q8_0_x4 : K->row_q8_0_x2;
    const auto k4 = N == 4 ? K->row_q4_k_x4 : K->row_q4_k_x2;
    const auto k5 = N == 4 ? K->row_q5_k_x4 : K->row_q5_k_x2;
    // The x4 and x2 kernels take arrays of 4 and 2; the pointers decay alike.
    if constexpr (T == DType::Q8_0) {
      if (!k8) return false;
      k8(static_cast<const BlockQ8_0*>(row), q, dx, n / 32, o);
    } else if constexpr (T == DType::Q4_K) {
      if (!k4) return false;
      k4(static_cast<const BlockQ4_K*>(row), q, s16, dx, n / kSuperBlock, o);
    } else if constexpr (T == DType::Q5_K) {
      if (!k5) return false;
      k5(static_cast<const BlockQ5_K*>(row), q, s16, dx, n / kSuperBlock, o);
    } else {
      return false;
    }
    return true;
  };
  int64_t i = 0;
  for (; i + 4 <= count && group.template operator()<4>(i); i += 4)
    for (int k = 0; k < 4; ++k) out[(i + k) * stride] = o[k];
  for (; i + 2 <= count && group.template operator()<2>(i); i += 2)
    for (int k = 0; k < 2; ++k) out[(i + k) * stride] = o[k];
  const DotQ8Row one = dot_q8_row(T, acts[0].n);
  for (; i < count; ++i) out[i * stride] = one(row, acts[i]);
}

template <const detail::Q8Kernels* K>
DotQ8Tokens tokens_fn_of(DType t) {
  switch (t) {
    case DType::Q8_0: return tokens_row<K, DType::Q8_0>;
    case DType::Q4_K: return tokens_row<K, DType::Q4_K>;
    case DType::Q5_K: return tokens_row<K, DType::Q5_K>;
    case DType::Q6_K: return tokens_row<K, DType::Q6_K>;
    case DType::Q4_0: return tokens_row<K, DType::Q4_0>;
    case DType::Q4_1: return tokens_row<K, DType::Q4_1>;
    case DType::Q5_0: return tokens_row<K, DType::Q5_0>;
    case DType::Q5_1: return tokens_row<K, DType::Q5_1>;
    case DType::IQ4_NL: return tokens_row<K, DType::IQ4_NL>;
    default: return nullptr;
  }
}

}  // namespace

DotQ8Tokens dot_q8_tokens_fn(DType t, int64_t n) {
  (void)dot_q8_row(t, n);  // the same checks, the same errors
#if defined(__x86_64__) || defined(_M_X64)
  if (q8_path() != KernelPath::Scalar) return tokens_fn_of<&detail::kQ8Avx2>(t);
#endif
  return tokens_fn_of<&detail::kQ8Scalar>(t);
}

DotQ8Row dot_q8_row(DType t, int64_t n) {
  if (!has_dot_q8(t)) fail("{} has no int8-activation dot product; use quant::dot (f32 activations)", dtype_name(t));
  if (!row_fits(t, n))
    fail("cannot take a q8 dot product over {} weights of {}: rows must be whole blocks of {}", n, dtype_name(t),
         dtype_block_elems(t));
#if defined(__x86_64__) || defined(_M_X64)
  if (q8_path() != KernelPath::Scalar) {
    if (DotQ8Row f = row_fn_of<&detail::kQ8Avx2>(t)) return f;
  }
#endif
  if (q8_path() == KernelPath::Scalar) {
    if (DotQ8Row f = row_fn_of<&detail::kQ8Scalar>(t)) return f;
  }
  return t == DType::Q4_1 ? any_row<DType::Q4_1> : any_row<DType::Q5_1>;  // dot_q8 itself
}

float dot_q8(DType t, const void* row, const ActivationsQ8& a) { return dot_q8_with(kernels_for(q8_path()), t, row, a); }

float dot_q8_on(KernelPath p, DType t, const void* row, const ActivationsQ8& a) {
  if (!cpu_supports(p)) fail("this CPU cannot run the {} dot-product kernels", kernel_path_name(p));
  return dot_q8_with(kernels_for(p), t, row, a);
}

}  // namespace spill::quant
