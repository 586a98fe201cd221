// Helpers of the CUDA kernel tests: GPU presence, device buffers, the int8-rounded activations the
// kernels dot with, and the error bound of that dot product over block-format weights.
#pragma once
#if SPILL_HAVE_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/device_info.h"
#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace spill::test {

// Empty when a GPU is usable; otherwise why not (the test skips with it).
inline std::string no_gpu_reason() {
  std::string why;
  return list_gpus(&why).empty() ? why : std::string();
}
#define SPILL_SKIP_WITHOUT_GPU()                                         \
  do {                                                                   \
    const std::string why_no_gpu = ::spill::test::no_gpu_reason();       \
    if (!why_no_gpu.empty()) GTEST_SKIP() << "no GPU: " << why_no_gpu;   \
  } while (0)

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

// A device buffer that frees itself and can be returned from a function.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n ? n : 16) != cudaSuccess) ptr = nullptr;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr); }
  void upload(const void* src, size_t n) { EXPECT_EQ(cudaMemcpy(ptr, src, n, cudaMemcpyHostToDevice), cudaSuccess); }
  // NaN everywhere, so an element the kernel never wrote fails the comparison.
  void poison() { EXPECT_EQ(cudaMemset(ptr, 0xFF, bytes), cudaSuccess); }
};

template <class T>
std::vector<T> download(const void* src, size_t count) {
  std::vector<T> v(count);
  cudaMemcpy(v.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

// Per weight of one row: the additive offset magnitude |ml| a format's sub-block subtracts
// (Q4_K, Q5_K: dmin * m; Q2_K: dmin * (scale >> 4); 0 for the others). The kernels compute
// dl * sum(q x) - ml * sum(x), so their rounding scales with |w| + |ml|, not |w| alone.
inline void offset_magnitudes(DType t, const void* row, int64_t cols, float* out) {
  const uint8_t* b = static_cast<const uint8_t*>(row);
  for (int64_t i = 0; i < cols; ++i) out[i] = 0.0f;
  if (t == DType::Q4_K || t == DType::Q5_K) {
    const int64_t bb = dtype_traits(t).block_bytes;
    for (int64_t blk = 0; blk < cols / 256; ++blk) {
      const uint8_t* p = b + blk * bb;
      uint16_t dmin_bits;
      std::memcpy(&dmin_bits, p + 2, 2);
      const float dmin = f16_to_f32(dmin_bits);
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        quant::unpack_scale_min_k4(j, p + 4, sc, m);
        for (int l = 0; l < 32; ++l) out[blk * 256 + 32 * j + l] = std::fabs(dmin * float(m));
      }
    }
  } else if (t == DType::Q2_K) {
    for (int64_t blk = 0; blk < cols / 256; ++blk) {
      const auto* q = reinterpret_cast<const quant::BlockQ2_K*>(b + blk * 84);
      const float dmin = f16_to_f32(q->dmin);
      for (int k = 0; k < 16; ++k)
        for (int l = 0; l < 16; ++l) out[blk * 256 + 16 * k + l] = std::fabs(dmin * float(q->scales[k] >> 4));
    }
  }
}

// Longest chain of f32 roundings any product w_i x'_i passes through in block_dot.cuh for a row
// segment of k_len weights (x' the int8-rounded activations): the unit's integer sum is exact and
// so is its conversion (|S| < 2^24); then d * S, dmin * M and their difference (3 roundings of the
// term), up to 7 adds of the activation block's units (8 units at most), the fma into the row's
// chain and 1 per later block of the chain (ceil(k_len / 256) blocks), `extra` for sums after the
// chain (split-K chunks, slots), and 3 for the reference dequantizer's own roundings of w.
// gamma = m * 2^-24 (Higham's gamma_m = m u / (1 - m u), with m u << 1).
inline double q8_dot_error_gamma(int64_t k_len, int64_t extra) {
  const int64_t blocks = (k_len + 255) / 256;
  const int64_t m = 3 + 7 + blocks + extra + 3;
  return double(m) * std::ldexp(1.0, -24);
}

// The activations as the kernels see them: quant::quantize_activations_q8's x'_i = d_b q_i per
// token row of n values, exactly (in float64).
inline std::vector<double> rounded_activations(const float* x, int64_t n) {
  quant::ActivationsQ8 a;
  quant::quantize_activations_q8(x, n, a);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(a.d[size_t(i / 256)]) * double(a.q[size_t(i)]);
  return out;
}

}  // namespace spill::test
#endif
