#include "backend/cuda/ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_limits.h"
#include "core/env.h"

namespace spill::cuda {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

unsigned grid_dim(int64_t v, const char* op) {
  if (v <= 0 || v > 2147483647) throw_error(std::string(op) + ": grid of " + str(v) + " blocks is out of range");
  return unsigned(v);
}


__device__ __forceinline__ float bf16_bits(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

template <class W>
__device__ __forceinline__ float load_w(const W* p, int64_t i);
template <>
__device__ __forceinline__ float load_w<float>(const float* p, int64_t i) { return p[i]; }
template <>
__device__ __forceinline__ float load_w<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return bf16_bits(reinterpret_cast<const uint16_t*>(p)[i]);
}
template <>
__device__ __forceinline__ float load_w<__half>(const __half* p, int64_t i) { return __half2float(p[i]); }

template <class F>
void dispatch_float_type(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); break;
    case DType::BF16: f(__nv_bfloat16{}); break;
    case DType::F16: f(__half{}); break;
    default: throw_error(std::string(op) + ": no kernel for " + std::string(dtype_name(t)) + " weights (F32, BF16, F16)");
  }
}

// ---- block reductions (fixed order: per-thread strided partials, warp butterfly, warps in order) ----

constexpr int kBlock = 128;
constexpr int kWarpsPerBlock = kBlock / 32;

__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o >= 1; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum_f(float v) {
  for (int o = 16; o >= 1; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_max_f(float v) {
  for (int o = 16; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// 1 / sqrt(mean(x^2) + eps) of one row, for a block of kThreads threads; every thread gets it.
// The strided loads are unrolled so a thread's loads are in flight together (one block per row at
// batch 1 is a chain of memory latencies otherwise).
template <int kThreads>
__device__ float rms_scale(const float* x, int64_t dim, double eps) {
  __shared__ double warp_part[kThreads / 32];
  double s = 0;
#pragma unroll 8
  for (int64_t j = threadIdx.x; j < dim; j += kThreads) s = __fma_rn(double(x[j]), double(x[j]), s);
  s = warp_sum_d(s);
  if (threadIdx.x % 32 == 0) warp_part[threadIdx.x / 32] = s;
  __syncthreads();
  double total = warp_part[0];
  for (int w = 1; w < kThreads / 32; ++w) total = __dadd_rn(total, warp_part[w]);
  __syncthreads();  // warp_part may be reused by the caller's next call
  return float(1.0 / sqrt(total / double(dim) + eps));
}
constexpr int kNormBlock = 512;  // threads of the RMSNorm and RoPE kernels

// ---- launches ----------------------------------------------------------------------------------
// Programmatic dependent launch: every kernel here is launched so that it may start while the
// previous kernel on the stream finishes, and its first act is to wait for that kernel's memory
// (griddepcontrol.wait, before any load or store that could depend on it); right after, it lets
// the next kernel start its own prologue (a GEMV fetches its weights before waiting). The wait
// makes the order exactly that of plain stream order; only launch latency is hidden.
// SPILL_CUDA_PDL=0 launches plainly (for comparison).
bool overlap_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("SPILL_CUDA_PDL");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

__device__ __forceinline__ void overlap_prologue() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

template <class... Params, class... Args>
void launch(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = overlap_enabled() ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

// ---- embedding ---------------------------------------------------------------------------------

template <class W>
__global__ void embed_float_kernel(const W* table, int64_t hidden, const int32_t* ids, float* out) {
  overlap_prologue();
  const int64_t row = ids[blockIdx.x];
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
    out[int64_t(blockIdx.x) * hidden + j] = load_w(table, row * hidden + j);
}

// Q8_0: blocks of 34 bytes, an f16 scale then 32 int8; value = q * d.
__global__ void embed_q8_0_kernel(const uint8_t* table, int64_t hidden, const int32_t* ids, float* out) {
  overlap_prologue();
  const int64_t row = ids[blockIdx.x];
  const int64_t blocks = hidden / 32;
  const uint8_t* r = table + row * blocks * 34;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const uint8_t* b = r + (j / 32) * 34;
    const float d = __half2float(__ushort_as_half(uint16_t(b[0] | (b[1] << 8))));
    out[int64_t(blockIdx.x) * hidden + j] = __fmul_rn(float(int8_t(b[2 + j % 32])), d);
  }
}

// ---- norms ---------------------------------------------------------------------------------------

__global__ void rmsnorm_kernel(RmsNormArgs a) {
  overlap_prologue();
  const int64_t r = blockIdx.x;
  const int64_t i = a.rows ? a.rows[r] : r;
  float* x = a.x + i * a.ld_x;
  if (a.residual) {
    const float* res = a.residual + i * a.ld_x;
    const float* res2 = a.residual2 ? a.residual2 + i * a.ld_x : nullptr;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < a.dim; j += kNormBlock)
      x[j] = __fadd_rn(x[j], res2 ? __fadd_rn(res[j], res2[j]) : res[j]);
  }
  __syncthreads();
  const float scale = rms_scale<kNormBlock>(x, a.dim, a.eps);
  float* o = a.out + r * a.ld_out;
#pragma unroll 4
  for (int64_t j = threadIdx.x; j < a.dim; j += kNormBlock) o[j] = __fmul_rn(a.weight[j], __fmul_rn(x[j], scale));
}

// The norm's output row, in registers (thread t holds outputs 4 (t + c kNormVecBlock) .. + 4 of
// chunk c), rounded to int8 per block of 256 into RmsNormArgs::rounded. Block b = 4c + k is the 64
// threads 64k .. 64k + 63 of chunk c, two warps whose maxima meet in shared memory. The operations
// are round_block_q8's (gemv's round_rows): the max of |v| (a non-finite value marks the block),
// 127 / max, rint, the clamp to [-127, 127], scale max / 127 or NaN; so the bits are round_rows's.
constexpr int kNormVecBlock = 256;
template <int kChunks>
__device__ __forceinline__ void round_norm_row(const RmsNormArgs& a, int64_t r, const float4 (&v)[kChunks], int chunks) {
  static_assert(kNormVecBlock % 64 == 0, "a block of 256 outputs is 64 threads");
  __shared__ float warp_max[kChunks][kNormVecBlock / 32];
  __shared__ int warp_bad[kChunks][kNormVecBlock / 32];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const float e[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
    float amax = 0.0f;
    bool bad = false;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float m = fabsf(e[i]);
      amax = fmaxf(amax, m);
      bad |= !(m <= 3.402823466e38f);
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    bad = __any_sync(0xffffffffu, bad);
    if (lane == 0) {
      warp_max[c][warp] = amax;
      warp_bad[c][warp] = bad;
    }
  }
  __syncthreads();
  const RoundedRows rr = rounded_rows_at(a.rounded, a.n, a.dim);
  int8_t* q = const_cast<int8_t*>(rr.q) + r * a.dim;
  float* d = const_cast<float*>(rr.d) + r * rr.d_stride;
  const int w0 = warp / 2 * 2;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int at = int(threadIdx.x) + c * kNormVecBlock;
    if (at >= chunks) continue;
    const float amax = fmaxf(warp_max[c][w0], warp_max[c][w0 + 1]);
    const bool bad = warp_bad[c][w0] | warp_bad[c][w0 + 1];
    const float inv = amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const float e[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int qi = int(fminf(fmaxf(rintf(__fmul_rn(e[i], inv)), -127.0f), 127.0f));
      packed |= (uint32_t(qi) & 0xFFu) << (8 * i);
    }
    *reinterpret_cast<uint32_t*>(q + 4 * int64_t(at)) = packed;
    if (threadIdx.x % 64 == 0) d[4 * at / 256] = bad ? __int_as_float(0x7FC00000) : __fdiv_rn(amax, 127.0f);
  }
}

// Rows whose width is a multiple of 4 and at most kNormVecBlock * 4 * kChunks: every load of the row
// (x, the residual, the weights) is issued at once into registers as 16-byte words, so a row costs
// one memory round trip, the sum of squares, and the stores (at batch 1 a norm is a chain of
// latencies, not of bytes). Each thread sums its own values in order, in double; then the warp
// butterfly and the warps in order.
template <int kChunks>
__global__ void __launch_bounds__(kNormVecBlock) rmsnorm_vec_kernel(RmsNormArgs a) {
  overlap_prologue();
  const int64_t r = blockIdx.x;
  const int64_t i = a.rows ? a.rows[r] : r;
  float4* x = reinterpret_cast<float4*>(a.x + i * a.ld_x);
  const float4* res = a.residual ? reinterpret_cast<const float4*>(a.residual + i * a.ld_x) : nullptr;
  const float4* res2 = a.residual && a.residual2 ? reinterpret_cast<const float4*>(a.residual2 + i * a.ld_x) : nullptr;
  const float4* w = reinterpret_cast<const float4*>(a.weight);
  const int chunks = int(a.dim / 4);
  float4 v[kChunks], wv[kChunks], rv[kChunks], r2v[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int at = int(threadIdx.x) + c * kNormVecBlock;
    if (at < chunks) {
      v[c] = x[at];
      wv[c] = w[at];
      if (res) rv[c] = res[at];
      if (res2) r2v[c] = res2[at];
    }
  }
  double s = 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int at = int(threadIdx.x) + c * kNormVecBlock;
    if (at < chunks) {
      if (res2)
        rv[c] = make_float4(__fadd_rn(rv[c].x, r2v[c].x), __fadd_rn(rv[c].y, r2v[c].y), __fadd_rn(rv[c].z, r2v[c].z),
                            __fadd_rn(rv[c].w, r2v[c].w));
      if (res) {
        v[c] = make_float4(__fadd_rn(v[c].x, rv[c].x), __fadd_rn(v[c].y, rv[c].y), __fadd_rn(v[c].z, rv[c].z),
                           __fadd_rn(v[c].w, rv[c].w));
        x[at] = v[c];
      }
      s = __fma_rn(double(v[c].x), double(v[c].x), s);
      s = __fma_rn(double(v[c].y), double(v[c].y), s);
      s = __fma_rn(double(v[c].z), double(v[c].z), s);
      s = __fma_rn(double(v[c].w), double(v[c].w), s);
    }
  }
  __shared__ double warp_part[kNormVecBlock / 32];
  s = warp_sum_d(s);
  if (threadIdx.x % 32 == 0) warp_part[threadIdx.x / 32] = s;
  __syncthreads();
  double total = warp_part[0];
#pragma unroll
  for (int k = 1; k < kNormVecBlock / 32; ++k) total = __dadd_rn(total, warp_part[k]);
  const float scale = float(1.0 / sqrt(total / double(a.dim) + a.eps));
  float4* o = reinterpret_cast<float4*>(a.out + r * a.ld_out);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int at = int(threadIdx.x) + c * kNormVecBlock;
    if (at < chunks) {
      v[c] = make_float4(__fmul_rn(wv[c].x, __fmul_rn(v[c].x, scale)), __fmul_rn(wv[c].y, __fmul_rn(v[c].y, scale)),
                         __fmul_rn(wv[c].z, __fmul_rn(v[c].z, scale)), __fmul_rn(wv[c].w, __fmul_rn(v[c].w, scale)));
      o[at] = v[c];
    } else {
      v[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // past the row: zeros, as round_rows pads a last block
    }
  }
  if (a.rounded) round_norm_row<kChunks>(a, r, v, chunks);
}

// ---- RoPE + KV write -----------------------------------------------------------------------------

__device__ __forceinline__ float clip_value(float v, float c) { return c > 0 ? fminf(fmaxf(v, -c), c) : v; }

template <class KV>
__device__ __forceinline__ KV to_kv(float v);
template <>
__device__ __forceinline__ float to_kv<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 to_kv<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The FP8 cache's tag (e4m3 bytes and a scale per (slot, KV head); quant/fp8.h).
struct Fp8Kv {};

__device__ __forceinline__ uint8_t e4m3_of(float x) {
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// quant::quantize_kv_fp8 of one (token, KV head) vector that a warp holds, `count` values per lane
// (lane l: values count l .. count l + count - 1): the same operations (max |x| and whether all are
// finite over the warp, amax / 448 and 448 / amax, one product per value, cvt.rn.satfinite), so the
// same bytes. x holds at least `count` values (PL a bound known at compile time).
template <int PL>
__device__ __forceinline__ void store_kv_fp8(const float (&x)[PL], int count, uint8_t* dst, float* scale_dst, int lane) {
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int i = 0; i < PL; ++i)
    if (i < count) {
      finite = finite && isfinite(x[i]);
      amax = fmaxf(amax, fabsf(x[i]));
    }
  amax = warp_max_f(amax);
  finite = __all_sync(0xffffffffu, finite);
  const bool zero = !finite || amax == 0.0f;
  const float inv = zero ? 0.0f : __fdiv_rn(448.0f, amax);
  uint8_t q[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) q[i] = zero ? uint8_t(0) : e4m3_of(__fmul_rn(x[i], inv));
  if (count == PL && PL % 4 == 0) {
    // Whole words (the per-head kernel: 4 or 8 values a lane, 4- and 8-byte aligned).
#pragma unroll
    for (int j = 0; j < PL / 4; ++j)
      reinterpret_cast<uint32_t*>(dst)[j] = uint32_t(q[4 * j]) | (uint32_t(q[4 * j + 1]) << 8) |
                                            (uint32_t(q[4 * j + 2]) << 16) | (uint32_t(q[4 * j + 3]) << 24);
  } else {
#pragma unroll
    for (int i = 0; i < PL; ++i)
      if (i < count) dst[i] = q[i];
  }
  if (lane == 0) *scale_dst = !finite ? __int_as_float(0x7fc00000) : amax == 0.0f ? 0.0f : __fdiv_rn(amax, 448.0f);
}

template <class KV>
__device__ __forceinline__ float from_kv(KV v);
template <>
__device__ __forceinline__ float from_kv<float>(float v) { return v; }
template <>
__device__ __forceinline__ float from_kv<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// KV = Fp8Kv: the rotated k goes back into a.k, and once the block has rotated every head, a warp
// per KV head rounds k and v (store_kv_fp8, in chunks of 32 values per lane pass: head_dim a multiple
// of 32 up to kMaxHeadDim).
template <class KV>
__global__ void rope_kv_kernel(RopeKvArgs a) {
  constexpr bool kFp8 = std::is_same_v<KV, Fp8Kv>;
  using Store = std::conditional_t<kFp8, float, KV>;
  overlap_prologue();
  const int64_t t = blockIdx.x;
  const int64_t D = a.head_dim, half = D / 2;
  const float pos = float(a.positions[t]);
  Store* kc = kFp8 ? nullptr : static_cast<Store*>(a.k_cache) + a.slots[t] * a.n_kv_heads * D;
  Store* vc = kFp8 ? nullptr : static_cast<Store*>(a.v_cache) + a.slots[t] * a.n_kv_heads * D;
  if (a.q_norm) {
    float* q = a.q + t * a.ld_q;
    float* k = a.k + t * a.ld_k;
    if (a.norm_per_head) {
      // A warp per head (q heads, then k heads): lanes' strided squares, then the butterfly.
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      for (int64_t h = warp; h < a.n_heads + a.n_kv_heads; h += kNormBlock / 32) {
        float* x = h < a.n_heads ? q + h * D : k + (h - a.n_heads) * D;
        const float* w = h < a.n_heads ? a.q_norm : a.k_norm;
        double s = 0;
#pragma unroll 8
        for (int64_t j = lane; j < D; j += 32) s = __fma_rn(double(x[j]), double(x[j]), s);
        s = warp_sum_d(s);
        const float scale = float(1.0 / sqrt(s / double(D) + a.norm_eps));
        for (int64_t j = lane; j < D; j += 32) x[j] = __fmul_rn(w[j], __fmul_rn(x[j], scale));
      }
    } else {
      const int64_t qd = a.n_heads * D, kd = a.n_kv_heads * D;
      const float q_scale = rms_scale<kNormBlock>(q, qd, a.norm_eps);
      const float k_scale = rms_scale<kNormBlock>(k, kd, a.norm_eps);
      __syncthreads();  // every thread has read its squares before any is overwritten
      for (int64_t j = threadIdx.x; j < qd; j += blockDim.x) q[j] = __fmul_rn(a.q_norm[j], __fmul_rn(q[j], q_scale));
      for (int64_t j = threadIdx.x; j < kd; j += blockDim.x) k[j] = __fmul_rn(a.k_norm[j], __fmul_rn(k[j], k_scale));
    }
    __syncthreads();
  }
  // cos and sin once per frequency, shared by the heads.
  __shared__ float cos_s[kMaxHeadDim / 2], sin_s[kMaxHeadDim / 2];
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float sv, cv;
    sincosf(__fmul_rn(pos, a.inv_freq[i]), &sv, &cv);
    cos_s[i] = __fmul_rn(cv, a.attention_factor);
    sin_s[i] = __fmul_rn(sv, a.attention_factor);
  }
  __syncthreads();
  const int64_t rot_items = (a.n_heads + a.n_kv_heads) * half;
#pragma unroll 2
  for (int64_t it = threadIdx.x; it < rot_items; it += blockDim.x) {
    const int64_t h = it / half, i = it % half;
    const float c = cos_s[i], s = sin_s[i];
    if (h < a.n_heads) {
      float* v = a.q + t * a.ld_q + h * D;
      const float x0 = clip_value(v[i], a.clip), x1 = clip_value(v[i + half], a.clip);
      v[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
      v[i + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    } else {
      const int64_t kh = h - a.n_heads;
      float* v = a.k + t * a.ld_k + kh * D;
      const float x0 = clip_value(v[i], a.clip), x1 = clip_value(v[i + half], a.clip);
      const float r0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), r1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
      if constexpr (kFp8) {
        v[i] = r0;  // the pair (i, i + half) is this item's alone
        v[i + half] = r1;
      } else {
        kc[kh * D + i] = to_kv<KV>(r0);
        kc[kh * D + i + half] = to_kv<KV>(r1);
      }
    }
  }
  if constexpr (kFp8) {
    __syncthreads();  // every head rotated
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t slot = a.slots[t];
    for (int64_t hh = warp; hh < 2 * a.n_kv_heads; hh += blockDim.x / 32) {
      const bool is_v = hh >= a.n_kv_heads;
      const int64_t kh = is_v ? hh - a.n_kv_heads : hh;
      const float* src = is_v ? a.v + t * a.ld_v + kh * D : a.k + t * a.ld_k + kh * D;
      // kMaxHeadDim / 32 values per lane at most; lane l holds values l P .. l P + P - 1, P = D / 32.
      constexpr int kMaxPL = kMaxHeadDim / 32;
      float x[kMaxPL];
      const int pl = int(D / 32);
#pragma unroll
      for (int i = 0; i < kMaxPL; ++i) x[i] = i < pl ? (is_v ? clip_value(src[pl * lane + i], a.clip) : src[pl * lane + i]) : 0.0f;
      const int64_t at = slot * a.n_kv_heads + kh;
      store_kv_fp8<kMaxPL>(x, pl, static_cast<uint8_t*>(is_v ? a.v_cache : a.k_cache) + at * D + pl * lane,
                           (is_v ? a.v_scale : a.k_scale) + at, lane);
    }
  } else {
    for (int64_t j = threadIdx.x; j < a.n_kv_heads * D; j += blockDim.x)
      vc[j] = to_kv<KV>(clip_value(a.v[t * a.ld_v + j], a.clip));
  }
}

// head_dim = 32 * PL (64, 128, 256) with per-head norms or none: a warp per head, four heads per
// block, lane l holding dims [PL l, PL l + PL) in registers, so a token's heads run side by side and
// every load (q/k/v, the position, the frequencies, the norm weights) is issued at once. The
// rotation's partner of dim d (d +- head_dim / 2) is lane l ^ 16's value. The arithmetic is
// rope_kv_kernel's, bit for bit, except the per-head sum of squares, taken in this lane order.
constexpr int kRopeHeadsPerBlock = 4;
template <class KV, int PL>
__global__ void __launch_bounds__(kRopeHeadsPerBlock * 32) rope_kv_head_kernel(RopeKvArgs a) {
  constexpr int D = 32 * PL, half = D / 2;
  overlap_prologue();
  const int64_t t = blockIdx.x;
  const int lane = int(threadIdx.x % 32);
  const int h = int(blockIdx.y) * kRopeHeadsPerBlock + int(threadIdx.x / 32);
  const int nh = int(a.n_heads), nkv = int(a.n_kv_heads);
  if (h >= nh + nkv) return;
  const bool is_q = h < nh;
  const int kh = h - nh;
  float* src = is_q ? a.q + t * a.ld_q + int64_t(h) * D : a.k + t * a.ld_k + int64_t(kh) * D;
  const int d0 = PL * lane;
  float x[PL], vv[PL], w[PL], f[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    x[i] = src[d0 + i];
    f[i] = a.inv_freq[(d0 + i) % half];
    if (!is_q) vv[i] = a.v[t * a.ld_v + int64_t(kh) * D + d0 + i];
    if (a.q_norm) w[i] = (is_q ? a.q_norm : a.k_norm)[d0 + i];
  }
  const float pos = float(a.positions[t]);
  const int64_t slot = is_q ? 0 : a.slots[t];
  if (a.q_norm) {
    double s2 = 0;
#pragma unroll
    for (int i = 0; i < PL; ++i) s2 = __fma_rn(double(x[i]), double(x[i]), s2);
    s2 = warp_sum_d(s2);
    const float scale = float(1.0 / sqrt(s2 / double(D) + a.norm_eps));
#pragma unroll
    for (int i = 0; i < PL; ++i) x[i] = __fmul_rn(w[i], __fmul_rn(x[i], scale));
  }
  float out[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    float sv, cv;
    sincosf(__fmul_rn(pos, f[i]), &sv, &cv);
    const float c = __fmul_rn(cv, a.attention_factor), sn = __fmul_rn(sv, a.attention_factor);
    const float mine = clip_value(x[i], a.clip);
    const float partner = __shfl_xor_sync(0xffffffffu, mine, 16);
    out[i] = lane < 16 ? __fsub_rn(__fmul_rn(mine, c), __fmul_rn(partner, sn))
                       : __fadd_rn(__fmul_rn(mine, c), __fmul_rn(partner, sn));
  }
  if (is_q) {
#pragma unroll
    for (int i = 0; i < PL; ++i) src[d0 + i] = out[i];
  } else if constexpr (std::is_same_v<KV, Fp8Kv>) {
    const int64_t at = slot * nkv + kh;
    float vx[PL];
#pragma unroll
    for (int i = 0; i < PL; ++i) vx[i] = clip_value(vv[i], a.clip);
    store_kv_fp8<PL>(out, PL, static_cast<uint8_t*>(a.k_cache) + at * D + d0, a.k_scale + at, lane);
    store_kv_fp8<PL>(vx, PL, static_cast<uint8_t*>(a.v_cache) + at * D + d0, a.v_scale + at, lane);
  } else {
    KV* kc = static_cast<KV*>(a.k_cache) + slot * nkv * D + int64_t(kh) * D;
    KV* vc = static_cast<KV*>(a.v_cache) + slot * nkv * D + int64_t(kh) * D;
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      kc[d0 + i] = to_kv<KV>(out[i]);
      vc[d0 + i] = to_kv<KV>(clip_value(vv[i], a.clip));
    }
  }
}

// ---- paged attention -----------------------------------------------------------------------------
// One block of kWarpsPerBlock warps per (token, G query heads of one KV head, partition;
// attention_split in ops.h): the G heads share every K and V load (GQA). The partition is cut in
// tiles of 32 positions; tile i goes to warp i % kWarpsPerBlock. In a tile, lane j scores position
// j for each head (a sequential dot over head_dim), the warp takes each head's tile max and the
// butterfly sum of exp(score - max), and each lane accumulates its head_dim / 32 output values per
// head over the tile's positions in order (online softmax). The warps' states are merged in warp
// order, the partitions' in partition order (a second kernel when there are several). A head's
// arithmetic is the same for every G, so G is a speed choice only.

constexpr int kMaxPerLane = kMaxHeadDim / 32;

// q_g . k over head_dim for G heads, each in order d = 0, 1, ... (one fma chain per head); 16-byte
// loads of k when head_dim is a multiple of 8 (the same chains, so the same bits).
template <int G>
__device__ __forceinline__ void dot_q_k(const float (*q)[kMaxHeadDim], const float* k, int64_t D, float dot[G]) {
#pragma unroll
  for (int g = 0; g < G; ++g) dot[g] = 0.0f;
  if (D % 8 == 0) {
    const float4* k4 = reinterpret_cast<const float4*>(k);
#pragma unroll 4
    for (int64_t c = 0; c < D / 4; ++c) {
      const float4 w = k4[c];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        dot[g] = __fmaf_rn(q[g][4 * c], w.x, dot[g]);
        dot[g] = __fmaf_rn(q[g][4 * c + 1], w.y, dot[g]);
        dot[g] = __fmaf_rn(q[g][4 * c + 2], w.z, dot[g]);
        dot[g] = __fmaf_rn(q[g][4 * c + 3], w.w, dot[g]);
      }
    }
  } else {
    for (int64_t d = 0; d < D; ++d) {
      const float kd = k[d];
#pragma unroll
      for (int g = 0; g < G; ++g) dot[g] = __fmaf_rn(q[g][d], kd, dot[g]);
    }
  }
}
template <int G>
__device__ __forceinline__ void dot_q_k(const float (*q)[kMaxHeadDim], const __nv_bfloat16* k, int64_t D,
                                        float dot[G]) {
#pragma unroll
  for (int g = 0; g < G; ++g) dot[g] = 0.0f;
  if (D % 8 == 0) {
    const uint4* k8 = reinterpret_cast<const uint4*>(k);
#pragma unroll 4
    for (int64_t c = 0; c < D / 8; ++c) {
      const uint4 w = k8[c];
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float k0 = __uint_as_float(words[i] << 16), k1 = __uint_as_float(words[i] & 0xFFFF0000u);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          dot[g] = __fmaf_rn(q[g][8 * c + 2 * i], k0, dot[g]);
          dot[g] = __fmaf_rn(q[g][8 * c + 2 * i + 1], k1, dot[g]);
        }
      }
    }
  } else {
    for (int64_t d = 0; d < D; ++d) {
      const float kd = __bfloat162float(k[d]);
#pragma unroll
      for (int g = 0; g < G; ++g) dot[g] = __fmaf_rn(q[g][d], kd, dot[g]);
    }
  }
}

template <class KV, int G>
__global__ void __launch_bounds__(kBlock) attention_kernel(AttentionArgs a, int32_t n_parts_grid) {
  overlap_prologue();
  const int64_t head_groups = a.n_heads / G;
  const int64_t t = blockIdx.x / head_groups, h0 = (blockIdx.x % head_groups) * G;
  const int part = blockIdx.y;
  const int32_t n_pos = a.positions[t] + 1;
  const AttentionSplit split = attention_split(n_pos, a.min_partition);
  const int32_t n_parts = split.parts;
  if (part >= n_parts) return;
  const int64_t D = a.head_dim, kvh = h0 / (a.n_heads / a.n_kv_heads);
  const int64_t row_elems = a.n_kv_heads * D;
  const int32_t* table = a.block_tables + a.table_offset[t];
  const float scale = 1.0f / sqrtf(float(D));

  __shared__ float q_s[G][kMaxHeadDim];
  __shared__ float m_s[kWarpsPerBlock][G], l_s[kWarpsPerBlock][G];
  __shared__ float acc_s[kWarpsPerBlock][G][kMaxHeadDim];
  for (int64_t i = threadIdx.x; i < G * D; i += kBlock) q_s[i / D][i % D] = a.q[t * a.ld_q + h0 * D + i];
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t p_begin = part * split.length;
  const int32_t p_end = min(n_pos, p_begin + split.length);
  const int per_lane = int((D + 31) / 32);
  float m[G], l[G], acc[G][kMaxPerLane];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) acc[g][i] = 0.0f;
  }
  const KV* kc = static_cast<const KV*>(a.k_cache);
  const KV* vc = static_cast<const KV*>(a.v_cache);

  for (int32_t tile = p_begin + warp * 32; tile < p_end; tile += kWarpsPerBlock * 32) {
    const int32_t p = tile + lane;
    float s[G];
    // Lane j looks up position tile + j's slot once; the V loop below takes it by shuffle.
    const int64_t slot = p < p_end ? int64_t(table[p / a.block_size]) * a.block_size + p % a.block_size : 0;
    if (p < p_end) {
      dot_q_k<G>(q_s, kc + slot * row_elems + kvh * D, D, s);
#pragma unroll
      for (int g = 0; g < G; ++g) s[g] = __fmul_rn(s[g], scale);
    } else {
#pragma unroll
      for (int g = 0; g < G; ++g) s[g] = -INFINITY;
    }
    float pr[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float m_new = fmaxf(m[g], warp_max_f(s[g]));
      const float corr = expf(__fsub_rn(m[g], m_new));  // 0 on the first tile (m = -inf)
      pr[g] = p < p_end ? expf(__fsub_rn(s[g], m_new)) : 0.0f;
      l[g] = __fadd_rn(__fmul_rn(l[g], corr), warp_sum_f(pr[g]));
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) acc[g][i] = __fmul_rn(acc[g][i], corr);
      m[g] = m_new;
    }
    const int32_t count = min(32, p_end - tile);
#pragma unroll 8
    for (int j = 0; j < count; ++j) {
      const long long slot_j = __shfl_sync(0xffffffffu, static_cast<long long>(slot), j);
      const KV* v = vc + slot_j * row_elems + kvh * D;
      float vd[kMaxPerLane];
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int64_t d = lane + 32 * i;
        vd[i] = i < per_lane && d < D ? from_kv(v[d]) : 0.0f;
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float pj = __shfl_sync(0xffffffffu, pr[g], j);
#pragma unroll
        for (int i = 0; i < kMaxPerLane; ++i)
          if (i < per_lane) acc[g][i] = __fmaf_rn(pj, vd[i], acc[g][i]);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      m_s[warp][g] = m[g];
      l_s[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (i < per_lane && d < D) acc_s[warp][g][d] = acc[g][i];
    }
  }
  __syncthreads();
  // Merge the warps in order (a warp with no tile has m = -inf and weight 0).
  for (int64_t i = threadIdx.x; i < G * D; i += kBlock) {
    const int g = int(i / D);
    const int64_t d = i % D, h = h0 + g, th = t * a.n_heads + h;
    float M = m_s[0][g];
    for (int w = 1; w < kWarpsPerBlock; ++w) M = fmaxf(M, m_s[w][g]);
    float L = 0.0f, o = 0.0f;
    for (int w = 0; w < kWarpsPerBlock; ++w)
      if (m_s[w][g] != -INFINITY) {
        const float f = expf(__fsub_rn(m_s[w][g], M));
        L = __fadd_rn(L, __fmul_rn(l_s[w][g], f));
        o = __fmaf_rn(acc_s[w][g][d], f, o);
      }
    if (n_parts == 1) {
      a.out[t * a.n_heads * D + h * D + d] = __fdiv_rn(o, L);
    } else {
      float* ws = a.workspace + (th * n_parts_grid + part) * (D + 2);
      ws[2 + d] = o;
      if (d == 0) {
        ws[0] = M;
        ws[1] = L;
      }
    }
  }
}

// head_dim = 32 * PL (64, 128, 256): attention_kernel's arithmetic in its order (the same bits),
// with a tile's loads in flight together instead of in a chain of round trips. A lane's whole K row
// is loaded at once (16-byte words, at most 16 in flight), and the tile's V rows in two batches of
// 16 positions, lane l holding dims [PL l, PL l + PL) of each (one 4-16 byte load per row).
template <int kBytes>
struct VWords {
  static constexpr int kWords = kBytes / 4;
  uint32_t w[kWords];
};
template <int kBytes>
__device__ __forceinline__ VWords<kBytes> load_words(const void* p) {
  VWords<kBytes> r;
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 u = static_cast<const uint4*>(p)[i];
      r.w[4 * i] = u.x, r.w[4 * i + 1] = u.y, r.w[4 * i + 2] = u.z, r.w[4 * i + 3] = u.w;
    }
  } else if constexpr (kBytes == 8) {
    const uint2 u = *static_cast<const uint2*>(p);
    r.w[0] = u.x, r.w[1] = u.y;
  } else {
    r.w[0] = *static_cast<const uint32_t*>(p);
  }
  return r;
}
template <class KV, int PL>
__device__ __forceinline__ void words_to_floats(const VWords<PL * int(sizeof(KV))>& v, float out[PL]) {
  if constexpr (std::is_same_v<KV, float>) {
#pragma unroll
    for (int i = 0; i < PL; ++i) out[i] = __uint_as_float(v.w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < PL / 2; ++i) {
      out[2 * i] = __uint_as_float(v.w[i] << 16);
      out[2 * i + 1] = __uint_as_float(v.w[i] & 0xFFFF0000u);
    }
  }
}

// q . k over D = 32 PL for G heads, each one fma chain in d order (dot_q_k's), k loaded 16 at most
// 16-byte words at a time, all of them before the first multiply.
template <class KV, int G, int D>
__device__ __forceinline__ void dot_q_k_row(const float (*q)[D], const KV* k, bool live, float dot[G]) {
  constexpr int kPerWord = 16 / int(sizeof(KV));  // values per 16-byte word
  constexpr int kWords = D / kPerWord;
  constexpr int kBatch = kWords < 16 ? kWords : 16;
#pragma unroll
  for (int g = 0; g < G; ++g) dot[g] = 0.0f;
  const uint4* k4 = reinterpret_cast<const uint4*>(k);
#pragma unroll
  for (int b0 = 0; b0 < kWords; b0 += kBatch) {
    uint4 w[kBatch];
#pragma unroll
    for (int c = 0; c < kBatch; ++c) w[c] = live ? k4[b0 + c] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int c = 0; c < kBatch; ++c) {
      const uint32_t words[4] = {w[c].x, w[c].y, w[c].z, w[c].w};
      float kv[kPerWord];
      if constexpr (std::is_same_v<KV, float>) {
#pragma unroll
        for (int i = 0; i < 4; ++i) kv[i] = __uint_as_float(words[i]);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          kv[2 * i] = __uint_as_float(words[i] << 16);
          kv[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
        }
      }
      const int d0 = (b0 + c) * kPerWord;
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < kPerWord; ++i) dot[g] = __fmaf_rn(q[g][d0 + i], kv[i], dot[g]);
    }
  }
}

template <class KV, int G, int PL>
__global__ void __launch_bounds__(kBlock) attention_tile_kernel(AttentionArgs a, int32_t n_parts_grid) {
  constexpr int D = 32 * PL;
  constexpr int kVBatch = 16;
  overlap_prologue();
  const int32_t head_groups = int32_t(a.n_heads / G);
  const int32_t t = int32_t(blockIdx.x) / head_groups, h0 = (int32_t(blockIdx.x) % head_groups) * G;
  const int part = blockIdx.y;
  const int32_t n_pos = a.positions[t] + 1;
  const int32_t* table = a.block_tables + a.table_offset[t];
  const AttentionSplit split = attention_split(n_pos, a.min_partition);
  const int32_t n_parts = split.parts;
  if (part >= n_parts) return;
  const int32_t kvh = h0 / int32_t(a.n_heads / a.n_kv_heads);
  const int64_t row_elems = a.n_kv_heads * D;
  const float scale = 1.0f / sqrtf(float(D));

  __shared__ __align__(16) float q_s[G][D];
  __shared__ float m_s[kWarpsPerBlock][G], l_s[kWarpsPerBlock][G];
  __shared__ float acc_s[kWarpsPerBlock][G][D];
  for (int i = threadIdx.x; i < G * D; i += kBlock) q_s[i / D][i % D] = a.q[int64_t(t) * a.ld_q + int64_t(h0) * D + i];
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t p_begin = part * split.length;
  const int32_t p_end = min(n_pos, p_begin + split.length);
  float m[G], l[G], acc[G][PL];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < PL; ++i) acc[g][i] = 0.0f;
  }
  const KV* kc = static_cast<const KV*>(a.k_cache) + int64_t(kvh) * D;
  const KV* vc = static_cast<const KV*>(a.v_cache) + int64_t(kvh) * D + PL * lane;

  for (int32_t tile = p_begin + warp * 32; tile < p_end; tile += kWarpsPerBlock * 32) {
    const int32_t p = tile + lane;
    const bool live = p < p_end;
    const int64_t row = live ? (int64_t(table[p / a.block_size]) * a.block_size + p % a.block_size) * row_elems : 0;
    float s[G];
    dot_q_k_row<KV, G, D>(q_s, kc + row, live, s);
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = live ? __fmul_rn(s[g], scale) : -INFINITY;
    float pr[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float m_new = fmaxf(m[g], warp_max_f(s[g]));
      const float corr = expf(__fsub_rn(m[g], m_new));  // 0 on the first tile (m = -inf)
      pr[g] = live ? expf(__fsub_rn(s[g], m_new)) : 0.0f;
      l[g] = __fadd_rn(__fmul_rn(l[g], corr), warp_sum_f(pr[g]));
#pragma unroll
      for (int i = 0; i < PL; ++i) acc[g][i] = __fmul_rn(acc[g][i], corr);
      m[g] = m_new;
    }
    const int32_t count = min(32, p_end - tile);
#pragma unroll
    for (int j0 = 0; j0 < 32; j0 += kVBatch) {
      if (j0 >= count) break;
      VWords<PL * int(sizeof(KV))> vb[kVBatch];
#pragma unroll
      for (int jj = 0; jj < kVBatch; ++jj) {
        const long long row_j = __shfl_sync(0xffffffffu, static_cast<long long>(row), j0 + jj);
        if (j0 + jj < count) vb[jj] = load_words<PL * int(sizeof(KV))>(vc + row_j);
      }
#pragma unroll
      for (int jj = 0; jj < kVBatch; ++jj) {
        if (j0 + jj >= count) break;
        float vd[PL];
        words_to_floats<KV, PL>(vb[jj], vd);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float pj = __shfl_sync(0xffffffffu, pr[g], j0 + jj);
#pragma unroll
          for (int i = 0; i < PL; ++i) acc[g][i] = __fmaf_rn(pj, vd[i], acc[g][i]);
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      m_s[warp][g] = m[g];
      l_s[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < PL; ++i) acc_s[warp][g][PL * lane + i] = acc[g][i];
  }
  __syncthreads();
  // Merge the warps in order (a warp with no tile has m = -inf and weight 0).
  for (int i = threadIdx.x; i < G * D; i += kBlock) {
    const int g = i / D, d = i % D;
    const int64_t h = h0 + g, th = int64_t(t) * a.n_heads + h;
    float M = m_s[0][g];
#pragma unroll
    for (int w = 1; w < kWarpsPerBlock; ++w) M = fmaxf(M, m_s[w][g]);
    float L = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarpsPerBlock; ++w)
      if (m_s[w][g] != -INFINITY) {
        const float f = expf(__fsub_rn(m_s[w][g], M));
        L = __fadd_rn(L, __fmul_rn(l_s[w][g], f));
        o = __fmaf_rn(acc_s[w][g][d], f, o);
      }
    if (n_parts == 1) {
      a.out[int64_t(t) * a.n_heads * D + h * D + d] = __fdiv_rn(o, L);
    } else {
      float* ws = a.workspace + (th * n_parts_grid + part) * (D + 2);
      ws[2 + d] = o;
      if (d == 0) {
        ws[0] = M;
        ws[1] = L;
      }
    }
  }
}

// ---- paged attention on tensor cores (BF16 cache) --------------------------------------------------
// One block of kWarpsPerBlock warps per (kTokens tokens, kHeads <= 16 query heads of one KV head, partition);
// warp w takes the partition's 32-position tiles w, w + 4, ... Both products are mma.m16n8k16 with
// f32 accumulation: S[16 heads x 8 positions] = Q K^T over head_dim in steps of 16 (rows past
// kHeads are zero), and O[16 x D] += P V over 16 positions a step. So one warp instruction does
// what 128 lanes' fma chains do in attention_tile_kernel, whose chains of ~1,800 instructions per
// warp set that kernel's time at batch 1 (ncu: 13.6 us for 1 MB of KV, S30 at context 512).
//
// Arithmetic: q and the softmax weights p are rounded to bf16 for the products (K and V already are
// bf16), scores are scaled by 1/sqrt(D) and the softmax is the online one in f32 per 32-position
// tile, l summed over a row's own weights before rounding; warps and partitions merge as in the
// tile kernel. head_dim is taken in an order that lets each lane load 16-byte words of K: the
// product's k index 2t, 2t+1, 2t+8, 2t+9 of step 2m+h (t = lane % 4) is dimension 8 (t + 4m) +
// 4h + 0, 1, 2, 3, for q and k alike (a sum over the same pairs). V goes through shared memory
// (cp.async, rows zero-filled past the partition) and ldmatrix.trans gives its fragments.
// Batch-invariant: a row of the products never sees the other rows. In a prompt the block takes
// kTokens = 16 / kHeads consecutive tokens of one sequence whose partitions have the same length
// (their tiles are the same positions), so the m16 tiles are full and K and V are read once for all
// of them; each row masks at its own token's end and keeps its state exactly through a tile past it.
// Tokens that cannot share (other sequences, other lengths) take a pass each.

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void mma_bf16_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

constexpr int kMmaTile = 32;  // positions a warp takes at once
constexpr int64_t kAttentionShareMinTokens = 64;  // steps of at least this many tokens share m16 tiles

// Shared bytes of one warp's V tile: 32 rows of D bf16, padded by 16 bytes so that ldmatrix's eight
// row addresses fall in different banks.
__host__ __device__ constexpr int mma_v_row_bytes(int D) { return 2 * D + 16; }
__host__ __device__ constexpr int mma_attention_smem(int D) {
  const int v = kWarpsPerBlock * kMmaTile * mma_v_row_bytes(D);
  const int merge = kWarpsPerBlock * 16 * D * 4;  // the warps' O, reusing the V tiles' bytes
  return v > merge ? v : merge;
}
// An FP8 cache's V tiles arrive as bytes (cp.async, beside the bf16 tiles) and are converted into
// the bf16 tiles once Q K^T is done: 32 rows of D bytes per warp more.
__host__ __device__ constexpr int mma_attention_smem(int D, bool fp8) {
  return mma_attention_smem(D) + (fp8 ? kWarpsPerBlock * kMmaTile * D : 0);
}

// Eight e4m3 values (lowest byte first) times scale, as the bf16 pairs the BF16 cache would hold
// for them (quant::kv_fp8_to_bf16: the conversion is exact, then one product and one rounding).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t pair, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 v = __floats2bfloat162_rn(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint4 fp8x8_to_bf16x8(uint2 w, float scale) {
  return make_uint4(fp8x2_to_bf16x2(w.x & 0xFFFFu, scale), fp8x2_to_bf16x2(w.x >> 16, scale),
                    fp8x2_to_bf16x2(w.y & 0xFFFFu, scale), fp8x2_to_bf16x2(w.y >> 16, scale));
}

// The steps of a 32-position tile that attention_mma_kernel and attention_prompt_kernel share: one
// code for both, so that a prompt token's arithmetic is its decode arithmetic by construction.

// Q of an m16 tile as bf16 A fragments, rows g and g + 8 of the lane (zero past `rows`); row r is token
// t0 + r / kHeads, head h0 + r % kHeads.
template <int D>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qa)[D / 16][4], const AttentionArgs& a, int32_t t0,
                                                 int32_t rows, int32_t kHeads, int32_t h0, int g, int tq) {
#pragma unroll
  for (int m = 0; m < D / 32; ++m) {
    float x[2][8];
    const int d0 = 8 * (tq + 4 * m);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
#pragma unroll
      for (int i = 0; i < 8; ++i) x[r][i] = 0.0f;
      if (row < rows) {
        const float4* q = reinterpret_cast<const float4*>(a.q + int64_t(t0 + row / kHeads) * a.ld_q +
                                                          int64_t(h0 + row % kHeads) * D + d0);
        const float4 x0 = q[0], x1 = q[1];
        x[r][0] = x0.x, x[r][1] = x0.y, x[r][2] = x0.z, x[r][3] = x0.w;
        x[r][4] = x1.x, x[r][5] = x1.y, x[r][6] = x1.z, x[r][7] = x1.w;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      qa[2 * m + h][0] = pack_bf16x2(x[0][4 * h], x[0][4 * h + 1]);
      qa[2 * m + h][1] = pack_bf16x2(x[1][4 * h], x[1][4 * h + 1]);
      qa[2 * m + h][2] = pack_bf16x2(x[0][4 * h + 2], x[0][4 * h + 3]);
      qa[2 * m + h][3] = pack_bf16x2(x[1][4 * h + 2], x[1][4 * h + 3]);
    }
  }
}

// S of a tile (the lane holds positions 2 tq, 2 tq + 1 of each n tile of 8, rows g and g + 8) scaled
// by `scale`, -inf at and past each row's end; tile_max gets each row's max over the lane's values.
__device__ __forceinline__ void mask_tile_scores(float (&sc)[4][4], int32_t tile, const int32_t (&row_end)[2],
                                                 float scale, int tq, float (&tile_max)[2]) {
  tile_max[0] = tile_max[1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int32_t p = tile + 8 * j + 2 * tq + (e & 1);
      sc[j][e] = p < row_end[e >> 1] ? __fmul_rn(sc[j][e], scale) : -INFINITY;
      tile_max[e >> 1] = fmaxf(tile_max[e >> 1], sc[j][e]);
    }
}

// The online softmax over one tile: each row's max over its quad, the state's factor (0 on its first
// tile), l and O rescaled, the weights exp(s - m) into sc and summed into l in (n tile, element)
// order. A row that is not live keeps its state exactly (factor 1, weights 0).
template <int kOTiles>
__device__ __forceinline__ void online_softmax_step(float (&sc)[4][4], float (&tile_max)[2], const bool (&row_live)[2],
                                                    float (&m_run)[2], float (&l_run)[2], float (&o)[kOTiles][4]) {
  float corr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float m_new = row_live[r] ? fmaxf(m_run[r], tile_max[r]) : m_run[r];
    corr[r] = row_live[r] ? expf(__fsub_rn(m_run[r], m_new)) : 1.0f;  // 0 on the first tile
    m_run[r] = m_new;
    l_run[r] = __fmul_rn(l_run[r], corr[r]);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sc[j][e] = row_live[e >> 1] ? expf(__fsub_rn(sc[j][e], m_run[e >> 1])) : 0.0f;  // 0 past the row's end
      l_run[e >> 1] = __fadd_rn(l_run[e >> 1], sc[j][e]);
    }
#pragma unroll
  for (int j = 0; j < kOTiles; ++j) {
    o[j][0] = __fmul_rn(o[j][0], corr[0]);
    o[j][1] = __fmul_rn(o[j][1], corr[0]);
    o[j][2] = __fmul_rn(o[j][2], corr[1]);
    o[j][3] = __fmul_rn(o[j][3], corr[1]);
  }
}

// O += P V over the tile's 32 positions: P's A fragments are S's C fragments of n tiles 2kk and
// 2kk + 1, V's B fragments come by ldmatrix.trans from the bf16 tile in shared memory (rows of
// mma_v_row_bytes(D)).
template <int D>
__device__ __forceinline__ void accumulate_pv(float (&o)[D / 8][4], const float (&sc)[4][4], const uint8_t* v_tile,
                                              int lane) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const uint32_t pa[4] = {pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]),
                            pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                            pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
    // Lanes 0-7 address rows 16kk + 0..7 of dims 8j.., 8-15 rows 16kk + 8..15, 16-31 the same for 8(j+1)..
    const int r = 16 * kk + (lane & 15), dcol = 8 * (lane >> 4);
    const unsigned row_addr = unsigned(__cvta_generic_to_shared(v_tile + r * mma_v_row_bytes(D) + 2 * dcol));
#pragma unroll
    for (int j = 0; j < D / 8; j += 2) {
      uint32_t b0, b1, b2, b3;
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                   : "r"(row_addr + unsigned(16 * j)));
      mma_bf16_16x8x16(o[j], pa, b0, b1);
      mma_bf16_16x8x16(o[j + 1], pa, b2, b3);
    }
  }
}

// A row's l summed over its quad (every lane of the quad gets the same sum).
__device__ __forceinline__ void quad_sum(float (&l)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = __fadd_rn(l[r], __shfl_xor_sync(0xffffffffu, l[r], 1));
    l[r] = __fadd_rn(l[r], __shfl_xor_sync(0xffffffffu, l[r], 2));
  }
}

// The prompt build is held to 168 registers (3 blocks per SM instead of 2, 16 bytes spilled).
// kFp8: the cache holds e4m3 bytes and a scale per (slot, KV head); K words and V tiles are turned
// into the bf16 values quant::kv_fp8_to_bf16 gives as they arrive, and from there on the arithmetic
// is the BF16 cache's, so the bits are those of the BF16 kernel over a cache of those values.
template <int D, bool kShare, bool kFp8>
__global__ void __launch_bounds__(kBlock, kShare ? 3 : 1) attention_mma_kernel(AttentionArgs a, int32_t n_parts_grid, int32_t kHeads,
                                                               int32_t share_tokens) {
  const int32_t kTokens = kShare ? share_tokens : 1;  // a decode step's build keeps one token's code
  constexpr int kSteps = D / 16;    // k steps of Q K^T
  constexpr int kWords = D / 32;    // 16-byte words of a K row per lane and position
  constexpr int kOTiles = D / 8;    // n tiles of P V
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float m_s[kWarpsPerBlock][16], l_s[kWarpsPerBlock][16];
  __shared__ float f_s[16][kWarpsPerBlock], merge_m[16], merge_l[16];
  __shared__ unsigned merge_live[16];
  __shared__ int32_t merge_parts[16];
  overlap_prologue();
  const int32_t chunks = int32_t(a.n_heads / kHeads);
  const int32_t t_first = (int32_t(blockIdx.x) / chunks) * kTokens, h0 = (int32_t(blockIdx.x) % chunks) * kHeads;
  const int part = blockIdx.y;
  const int32_t kvh = h0 / int32_t(a.n_heads / a.n_kv_heads);
  const int64_t row_elems = a.n_kv_heads * D;
  const float scale = 1.0f / sqrtf(float(D));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
  // Element offsets: bf16 elements, or bytes of an FP8 cache (one byte per value).
  using Elem = std::conditional_t<kFp8, uint8_t, __nv_bfloat16>;
  const Elem* kc = static_cast<const Elem*>(a.k_cache) + int64_t(kvh) * D;
  const Elem* vc = static_cast<const Elem*>(a.v_cache) + int64_t(kvh) * D;
  uint8_t* v_tile = smem + warp * kMmaTile * mma_v_row_bytes(D);
  // FP8: the warp's V bytes as they arrive (32 rows of D), and the scales' column of this KV head.
  uint8_t* v_raw = smem + mma_attention_smem(D) + warp * kMmaTile * D;
  const float* ks_col = kFp8 ? a.k_scale + kvh : nullptr;
  const float* vs_col = kFp8 ? a.v_scale + kvh : nullptr;
  const int32_t length = attention_split(a.positions[t_first] + 1, a.min_partition).length;

  // The block's kTokens tokens share the m16 tiles (row r: token r / kHeads, head r % kHeads) when
  // they read the same positions: one sequence and one partition length. Otherwise each token takes
  // its own pass, as in a decode batch.
  bool shared = t_first + kTokens <= a.n;
  for (int32_t i = 1; i < kTokens && shared; ++i)
    shared = a.table_offset[t_first + i] == a.table_offset[t_first] &&
             attention_split(a.positions[t_first + i] + 1, a.min_partition).length == length;
  const int32_t passes = shared ? 1 : kTokens;
  for (int32_t pass = 0; pass < passes; ++pass) {
    const int32_t pt0 = t_first + pass, ptn = shared ? kTokens : 1;  // the pass's tokens pt0 ..
    if (pt0 >= a.n) break;
    const int32_t len = shared ? length : attention_split(a.positions[pt0] + 1, a.min_partition).length;
    const int32_t pb = part * len;
    // Each row's end (pb where the partition is past its token's context) and the pass's end.
    int32_t p_end_max = pb;
    for (int32_t i = 0; i < ptn; ++i) p_end_max = max(p_end_max, min(a.positions[pt0 + i] + 1, pb + len));
    if (p_end_max <= pb) continue;  // no token of the pass reaches this partition (block-uniform)
    const int32_t* table = a.block_tables + a.table_offset[pt0];
    const int rows = ptn * kHeads;
    int32_t row_end[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
      if constexpr (kShare) row_end[r] = row < rows ? max(pb, min(a.positions[pt0 + row / kHeads] + 1, pb + len)) : pb;
      else row_end[r] = p_end_max;
    }

    // Q as A fragments: rows g and g + 8 (zero past the pass's rows).
    uint32_t qa[kSteps][4];
    load_q_fragments<D>(qa, a, pt0, rows, kHeads, h0, g, tq);

    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // rows g, g + 8
    float o[kOTiles][4];
#pragma unroll
    for (int j = 0; j < kOTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    for (int32_t tile = pb + warp * kMmaTile; tile < p_end_max; tile += kWarpsPerBlock * kMmaTile) {
      // Lane r looks up position tile + r's cache slot: one block-table load and one division per
      // lane and tile. Every K and V load below takes its row's slot from that lane by shuffle (a
      // lane's loads cover up to 20 positions, each of which once cost its own lookup on the chain).
      const int32_t p_lane = tile + lane;
      const int64_t slot_lane =
          p_lane < p_end_max ? int64_t(table[p_lane / a.block_size]) * a.block_size + p_lane % a.block_size : 0;
      auto row_at = [&](int r) { return __shfl_sync(0xffffffffu, slot_lane, r) * row_elems; };
      // V rows of the tile into shared memory (zeros past the pass), in flight during Q K^T. FP8:
      // the bytes into v_raw, and lane r holds row r's scale.
      __syncwarp();  // the previous tile's ldmatrix reads are done
      float v_scale_r = 0.0f;
      {
        constexpr int kRowBytes = kFp8 ? D : 2 * D;
        constexpr int kChunks = kRowBytes / 16;  // 16-byte pieces per row
        const unsigned base = unsigned(__cvta_generic_to_shared(kFp8 ? v_raw : v_tile));
        static_assert(kMmaTile * kChunks % 32 == 0, "every lane takes the loop's shuffles");
#pragma unroll 4
        for (int i = lane; i < kMmaTile * kChunks; i += 32) {
          const int r = i / kChunks, c = i % kChunks;
          const bool live = tile + r < p_end_max;
          const Elem* src = vc + row_at(r) + (16 / sizeof(Elem)) * c;  // a dead row: slot 0, nothing read
          const int dst = kFp8 ? r * D + 16 * c : r * mma_v_row_bytes(D) + 16 * c;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(base + unsigned(dst)),
                       "l"(src), "r"(live ? 16 : 0));
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        if constexpr (kFp8) {
          if (p_lane < p_end_max) v_scale_r = vs_col[slot_lane * a.n_kv_heads];
        }
      }
      // S = Q K^T for the tile's four n tiles of 8 positions; lane holds positions 2 tq, 2 tq + 1 of each.
      // Every K word of the tile is requested before the first product (one round trip, not four).
      uint4 kw[4][kWords];
      if constexpr (kFp8) {
        uint2 kb[4][kWords];
        float ks[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool live = tile + 8 * j + g < p_end_max;
          const int64_t slot = __shfl_sync(0xffffffffu, slot_lane, 8 * j + g);
          const uint2* k2 = reinterpret_cast<const uint2*>(kc + slot * row_elems);
          ks[j] = live ? ks_col[slot * a.n_kv_heads] : 0.0f;
#pragma unroll
          for (int m = 0; m < kWords; ++m) kb[j][m] = live ? k2[tq + 4 * m] : make_uint2(0, 0);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int m = 0; m < kWords; ++m) kw[j][m] = fp8x8_to_bf16x8(kb[j][m], ks[j]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool live = tile + 8 * j + g < p_end_max;
          const uint4* k4 = reinterpret_cast<const uint4*>(kc + row_at(8 * j + g));
#pragma unroll
          for (int m = 0; m < kWords; ++m) kw[j][m] = live ? k4[tq + 4 * m] : make_uint4(0, 0, 0, 0);
        }
      }
      float sc[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int m = 0; m < kWords; ++m) {
          mma_bf16_16x8x16(sc[j], qa[2 * m], kw[j][m].x, kw[j][m].y);
          mma_bf16_16x8x16(sc[j], qa[2 * m + 1], kw[j][m].z, kw[j][m].w);
        }
      }
      // Online softmax per row over the tile: a row's values sit in the four lanes of a quad. A row
      // whose context ends before the tile keeps its state exactly (factor 1, weights 0), so it ends
      // with the bits of a pass that never saw the tile.
      const bool row_live[2] = {!kShare || tile < row_end[0], !kShare || tile < row_end[1]};
      float tile_max[2];
      mask_tile_scores(sc, tile, row_end, scale, tq, tile_max);
      online_softmax_step(sc, tile_max, row_live, m_run, l_run, o);
      // O += P V: P's A fragments are S's C fragments of n tiles 2kk and 2kk + 1.
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
      __syncwarp();
      if constexpr (kFp8) {
        // The tile's V bytes into bf16 rows: 16 values (one 16-byte word) per lane and pass.
        constexpr int kChunks = D / 16;
#pragma unroll
        for (int i = lane; i < kMmaTile * kChunks; i += 32) {
          const int r = i / kChunks, c = i % kChunks;
          const float sv = __shfl_sync(0xffffffffu, v_scale_r, r);
          const uint4 b = *reinterpret_cast<const uint4*>(v_raw + r * D + 16 * c);
          const uint4 lo = fp8x8_to_bf16x8(make_uint2(b.x, b.y), sv), hi = fp8x8_to_bf16x8(make_uint2(b.z, b.w), sv);
          uint4* dst = reinterpret_cast<uint4*>(v_tile + r * mma_v_row_bytes(D) + 32 * c);
          dst[0] = lo;
          dst[1] = hi;
        }
        __syncwarp();
      }
      accumulate_pv<D>(o, sc, v_tile, lane);
    }
    quad_sum(l_run);  // a row's l is the sum over its quad
    __syncthreads();  // every warp is done with its V tile: the bytes hold the warps' O now
    float* acc_s = reinterpret_cast<float*>(smem);  // [warp][16][D]
    if (tq == 0) {
      m_s[warp][g] = m_run[0], m_s[warp][g + 8] = m_run[1];
      l_s[warp][g] = l_run[0], l_s[warp][g + 8] = l_run[1];
    }
#pragma unroll
    for (int j = 0; j < kOTiles; ++j) {
      float* rg = acc_s + (warp * 16 + g) * D + 8 * j + 2 * tq;
      rg[0] = o[j][0], rg[1] = o[j][1];
      rg[8 * D] = o[j][2], rg[8 * D + 1] = o[j][3];
    }
    __syncthreads();
    // Merge the warps in order (a warp with no tile has m = -inf and weight 0). The factors of a row
    // are the same for all its D outputs: taken once per row here (the same operations as per element).
    if (threadIdx.x < rows) {
      const int r = threadIdx.x;
      float M = m_s[0][r];
#pragma unroll
      for (int w = 1; w < kWarpsPerBlock; ++w) M = fmaxf(M, m_s[w][r]);
      float L = 0.0f;
      unsigned live = 0;
#pragma unroll
      for (int w = 0; w < kWarpsPerBlock; ++w) {
        f_s[r][w] = 0.0f;
        if (m_s[w][r] != -INFINITY) {
          const float f = expf(__fsub_rn(m_s[w][r], M));
          L = __fadd_rn(L, __fmul_rn(l_s[w][r], f));
          f_s[r][w] = f;
          live |= 1u << w;
        }
      }
      merge_m[r] = M, merge_l[r] = L, merge_live[r] = live;
      merge_parts[r] = attention_split(a.positions[pt0 + r / kHeads] + 1, a.min_partition).parts;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows * D; i += kBlock) {
      const int r = i / D, d = i % D;
      const int32_t n_parts = merge_parts[r];
      if (part >= n_parts) continue;  // the partition is past this token's context
      const int32_t t = pt0 + r / kHeads;
      const int64_t h = h0 + r % kHeads, th = int64_t(t) * a.n_heads + h;
      const unsigned live = merge_live[r];
      float out = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarpsPerBlock; ++w)
        if (live & (1u << w)) out = __fmaf_rn(acc_s[(w * 16 + r) * D + d], f_s[r][w], out);
      if (n_parts == 1) {
        a.out[int64_t(t) * a.n_heads * D + h * D + d] = __fdiv_rn(out, merge_l[r]);
      } else {
        float* ws = a.workspace + (th * n_parts_grid + part) * (D + 2);
        ws[2 + d] = out;
        if (d == 0) {
          ws[0] = merge_m[r];
          ws[1] = merge_l[r];
        }
      }
    }
    __syncthreads();  // the merge has read the shared bytes before the next pass's V tiles
  }
}

// ---- prompt attention: a block's m16 query tiles share every staged K/V tile -----------------------
// attention_mma_kernel's prompt build fetches each K/V tile once per m16 tile of queries (2 tokens of
// S30's group of 8, one token of S235's 16) and lets a block's 4 warps split the positions: at a 32K
// context that is 40 TFLOP/s of bf16 products. Here every warp of a block owns its own m16 tile of
// consecutive tokens of one sequence, and the block stages each 32-position K/V tile once in shared
// memory for all of them (kWarps m16 tiles per fetch).
//
// Each token keeps the bits attention_mma_kernel gives it. There, state w (warp w of 4) walks the
// partition's tiles w, w + 4, ... with the online softmax, and the four states merge with their common
// max M: L = sum_w l_w f_w, O = sum_w o_w f_w (fma, w ascending), f_w = expf(m_w - M). A warp here
// cannot hold four states (64 registers of O each), so it walks the partition twice. Pass 1 takes
// Q K^T of every tile for each state's final max only (the max of its live tiles' maxima, exact in any
// order), so M and every f_w are known before any state is built. Pass 2 builds state 0 over tiles 0,
// 4, ... with the per-tile step of attention_mma_kernel, folds it into (L, O) with f_0, then state 1,
// and so on. One more Q K^T per tile (1.5x the products) buys K/V fetched once per kWarps m16 tiles.
// The block's tokens take passes by runs that read the same positions (one sequence, one partition
// length); a decode token in a mixed step is a run of its own. BF16 cache only.
__host__ __device__ constexpr int prompt_k_row_bytes(int D) { return 2 * D + 64; }  // a quarter-warp's 16-byte reads of K land in 8 distinct bank groups
__host__ __device__ constexpr int prompt_stage_bytes(int D) {
  return kMmaTile * (prompt_k_row_bytes(D) + mma_v_row_bytes(D));
}
__host__ __device__ constexpr int prompt_attention_smem(int D) { return 2 * prompt_stage_bytes(D); }  // two stages

template <int D, int kWarps>
__global__ void __launch_bounds__(32 * kWarps, 8 / kWarps) attention_prompt_kernel(AttentionArgs a, int32_t n_parts_grid,
                                                                                   int32_t kHeads, int32_t tile_tokens) {
  constexpr int kSteps = D / 16;   // k steps of Q K^T
  constexpr int kWords = D / 32;   // 16-byte words of a K row per lane and position
  constexpr int kOTiles = D / 8;   // n tiles of P V
  constexpr int kPieces = 2 * D / 16;  // 16-byte pieces of a K or V row
  constexpr int kStates = kWarpsPerBlock;  // the decode build's warps
  extern __shared__ __align__(16) uint8_t smem[];
  overlap_prologue();
  const int32_t chunks = int32_t(a.n_heads / kHeads);
  const int32_t block_tokens = kWarps * tile_tokens;
  const int32_t t_first = (int32_t(blockIdx.x) / chunks) * block_tokens, h0 = (int32_t(blockIdx.x) % chunks) * kHeads;
  const int32_t t_stop = min(int32_t(a.n), t_first + block_tokens);
  const int part = blockIdx.y;
  const int32_t kvh = h0 / int32_t(a.n_heads / a.n_kv_heads);
  const int64_t row_elems = a.n_kv_heads * D;
  const float scale = 1.0f / sqrtf(float(D));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
  const __nv_bfloat16* kc = static_cast<const __nv_bfloat16*>(a.k_cache) + int64_t(kvh) * D;
  const __nv_bfloat16* vc = static_cast<const __nv_bfloat16*>(a.v_cache) + int64_t(kvh) * D;

  for (int32_t run = t_first; run < t_stop;) {  // block-uniform
    // The pass's tokens run .. run_end - 1: the longest run from `run` reading the same positions.
    const int32_t offset = a.table_offset[run];
    const int32_t len = attention_split(a.positions[run] + 1, a.min_partition).length;
    int32_t run_end = run + 1;
    while (run_end < t_stop && a.table_offset[run_end] == offset &&
           attention_split(a.positions[run_end] + 1, a.min_partition).length == len)
      ++run_end;
    const int32_t pass_first = run;
    run = run_end;
    const int32_t pb = part * len;
    int32_t p_end_max = pb;
    for (int32_t t = pass_first; t < run_end; ++t) p_end_max = max(p_end_max, min(a.positions[t] + 1, pb + len));
    if (p_end_max <= pb) continue;  // no token of the pass reaches this partition
    const int32_t* table = a.block_tables + offset;
    // This warp's tokens and rows (row r: token wt0 + r / kHeads, head h0 + r % kHeads).
    const int32_t wt0 = pass_first + warp * tile_tokens;
    const int32_t rows = max(0, min(tile_tokens, run_end - wt0)) * kHeads;
    int32_t row_end[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
      row_end[r] = row < rows ? max(pb, min(a.positions[wt0 + row / kHeads] + 1, pb + len)) : pb;
    }
    // Q as A fragments: rows g and g + 8 (zero past the warp's rows).
    uint32_t qa[kSteps][4];
    load_q_fragments<D>(qa, a, wt0, rows, kHeads, h0, g, tq);

    // Steps: pass 1 takes tiles 0 .. n_tiles - 1 (K only); pass 2 takes state 0's tiles 0, 4, ..., then
    // state 1's 1, 5, ..., and so on (K and V).
    const int32_t n_tiles = (p_end_max - pb + kMmaTile - 1) / kMmaTile;
    const int32_t n_steps = 2 * n_tiles;
    auto step_tile = [&](int32_t s) {
      if (s < n_tiles) return s;
      s -= n_tiles;
      int32_t w = 0;
      for (; w < kStates - 1; ++w) {
        const int32_t count = n_tiles > w ? (n_tiles - w + kStates - 1) / kStates : 0;
        if (s < count) break;
        s -= count;
      }
      return w + kStates * s;
    };
    // Stage step s's tile (K, and V in pass 2) into buffer s % 2; rows past the pass's end are zeros.
    auto stage = [&](int32_t s) {
      if (s < n_steps) {
        const int32_t tile = pb + kMmaTile * step_tile(s);
        const int pieces = kMmaTile * kPieces * (s >= n_tiles ? 2 : 1);
        const unsigned k_base = unsigned(__cvta_generic_to_shared(smem + (s & 1) * prompt_stage_bytes(D)));
        const unsigned v_base = k_base + kMmaTile * prompt_k_row_bytes(D);
        for (int i = threadIdx.x; i < pieces; i += 32 * kWarps) {
          const bool is_v = i >= kMmaTile * kPieces;
          const int c = is_v ? i - kMmaTile * kPieces : i, r = c / kPieces, w16 = c % kPieces;
          const int32_t p = tile + r;
          const bool live = p < p_end_max;
          const int64_t slot = live ? int64_t(table[p / a.block_size]) * a.block_size + p % a.block_size : 0;
          const __nv_bfloat16* src = (is_v ? vc : kc) + slot * row_elems + 8 * w16;  // a dead row: slot 0, nothing read
          const unsigned dst = is_v ? v_base + unsigned(r * mma_v_row_bytes(D) + 16 * w16)
                                    : k_base + unsigned(r * prompt_k_row_bytes(D) + 16 * w16);
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(live ? 16 : 0));
        }
      }
      asm volatile("cp.async.commit_group;\n" ::: "memory");  // an empty group past the end keeps the count
    };

    float m_state[kStates][2];  // pass 1: each state's final max, rows g and g + 8
#pragma unroll
    for (int w = 0; w < kStates; ++w) m_state[w][0] = m_state[w][1] = -INFINITY;
    float M[2] = {-INFINITY, -INFINITY}, f_state[kStates][2] = {}, L[2] = {0.0f, 0.0f}, out[kOTiles][4];
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f}, o[kOTiles][4];
#pragma unroll
    for (int j = 0; j < kOTiles; ++j)
      out[j][0] = out[j][1] = out[j][2] = out[j][3] = o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    stage(0);
    for (int32_t s = 0; s < n_steps; ++s) {
      stage(s + 1);
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      __syncthreads();  // step s's tile has landed for every warp
      const uint8_t* k_tile = smem + (s & 1) * prompt_stage_bytes(D);
      const uint8_t* v_tile = k_tile + kMmaTile * prompt_k_row_bytes(D);
      const int32_t ti = step_tile(s), tile = pb + kMmaTile * ti;
      if (rows > 0) {  // warp-uniform
        // S = Q K^T for the tile's four n tiles of 8 positions, attention_mma_kernel's products.
        float sc[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
          const uint4* k4 = reinterpret_cast<const uint4*>(k_tile + (8 * j + g) * prompt_k_row_bytes(D));
#pragma unroll
          for (int m = 0; m < kWords; ++m) {
            const uint4 kw = k4[tq + 4 * m];
            mma_bf16_16x8x16(sc[j], qa[2 * m], kw.x, kw.y);
            mma_bf16_16x8x16(sc[j], qa[2 * m + 1], kw.z, kw.w);
          }
        }
        const bool row_live[2] = {tile < row_end[0], tile < row_end[1]};
        float tile_max[2];
        mask_tile_scores(sc, tile, row_end, scale, tq, tile_max);
        const int w_of_tile = ti % kStates;
        if (s < n_tiles) {
          // Pass 1: the state's max (each row's tile max over its quad, as online_softmax_step takes it).
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
          }
#pragma unroll
          for (int w = 0; w < kStates; ++w)
#pragma unroll
            for (int r = 0; r < 2; ++r)
              if (w == w_of_tile && row_live[r]) m_state[w][r] = fmaxf(m_state[w][r], tile_max[r]);
          if (s == n_tiles - 1) {
            // The merge's factors, as attention_mma_kernel takes them once its warps are done.
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              M[r] = m_state[0][r];
#pragma unroll
              for (int w = 1; w < kStates; ++w) M[r] = fmaxf(M[r], m_state[w][r]);
#pragma unroll
              for (int w = 0; w < kStates; ++w)
                f_state[w][r] = m_state[w][r] != -INFINITY ? expf(__fsub_rn(m_state[w][r], M[r])) : 0.0f;
            }
          }
        } else {
          // Pass 2: state w_of_tile's online step over this tile (attention_mma_kernel's, in its order).
          if (ti < kStates) {  // the state's first tile
            m_run[0] = m_run[1] = -INFINITY;
            l_run[0] = l_run[1] = 0.0f;
#pragma unroll
            for (int j = 0; j < kOTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
          }
          online_softmax_step(sc, tile_max, row_live, m_run, l_run, o);
          accumulate_pv<D>(o, sc, v_tile, lane);
          if (ti + kStates >= n_tiles) {
            // The state's last tile: its l is the sum over the quad; fold it into (L, O) with its factor.
            quad_sum(l_run);
#pragma unroll
            for (int w = 0; w < kStates; ++w) {
              if (w != w_of_tile) continue;
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                if (m_state[w][r] == -INFINITY) continue;  // a state with no tile of this row: weight 0
                L[r] = __fadd_rn(L[r], __fmul_rn(l_run[r], f_state[w][r]));
#pragma unroll
                for (int j = 0; j < kOTiles; ++j) {
                  out[j][2 * r] = __fmaf_rn(o[j][2 * r], f_state[w][r], out[j][2 * r]);
                  out[j][2 * r + 1] = __fmaf_rn(o[j][2 * r + 1], f_state[w][r], out[j][2 * r + 1]);
                }
              }
            }
          }
        }
      }
      __syncthreads();  // every warp is done with buffer s % 2 before step s + 2 stages into it
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");

    // The partition's state of each row: the output itself when the token has one partition.
    if (rows > 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = g + 8 * r;
        if (row >= rows) continue;
        const int32_t t = wt0 + row / kHeads;
        const int32_t n_parts = attention_split(a.positions[t] + 1, a.min_partition).parts;
        if (part >= n_parts) continue;  // the partition is past this token's context
        const int64_t h = h0 + row % kHeads, th = int64_t(t) * a.n_heads + h;
        if (n_parts == 1) {
          float* dst = a.out + int64_t(t) * a.n_heads * D + h * D;
#pragma unroll
          for (int j = 0; j < kOTiles; ++j) {
            dst[8 * j + 2 * tq] = __fdiv_rn(out[j][2 * r], L[r]);
            dst[8 * j + 2 * tq + 1] = __fdiv_rn(out[j][2 * r + 1], L[r]);
          }
        } else {
          float* ws = a.workspace + (th * n_parts_grid + part) * (D + 2);
#pragma unroll
          for (int j = 0; j < kOTiles; ++j) {
            ws[2 + 8 * j + 2 * tq] = out[j][2 * r];
            ws[2 + 8 * j + 2 * tq + 1] = out[j][2 * r + 1];
          }
          if (tq == 0) ws[0] = M[r], ws[1] = L[r];
        }
      }
    }
    __syncthreads();  // the next pass stages into the buffers this one read last
  }
}

// Merges the partitions of every (token, head) that has more than one, in partition order: a warp
// per (token, head), kMergeWarps of them per block. At batch 1 the merge is a few KB and pure latency,
// so every load a lane needs for the first kMergePrefetch partitions (m, l and its kPerLane values of
// each) is issued at once, before any arithmetic: one memory round trip for contexts of up to
// kMergePrefetch partitions. Per output the operations are those of the reference, in the same order:
// M the max of the m's, factor_p = expf(m_p - M), L = sum_p l_p * factor_p, o = sum_p v_p * factor_p
// (fma, ascending p), o / L.
constexpr int kMergeWarps = 4;
constexpr int kMergePrefetch = 8;
static_assert(kMaxAttentionPartitions <= 64, "the merge keeps two partitions' m and l per lane");
template <int kPerLane>  // head_dim <= 32 * kPerLane
__global__ void __launch_bounds__(32 * kMergeWarps) attention_merge_kernel(AttentionArgs a, int32_t n_parts_grid) {
  overlap_prologue();
  const int lane = threadIdx.x & 31;
  const int64_t th = int64_t(blockIdx.x) * kMergeWarps + (threadIdx.x >> 5);
  if (th >= int64_t(a.n) * a.n_heads) return;
  const int64_t t = th / a.n_heads, h = th % a.n_heads;
  const int32_t n_parts = attention_split(a.positions[t] + 1, a.min_partition).parts;
  if (n_parts <= 1) return;
  const int D = int(a.head_dim);
  const int stride = D + 2;
  const float* ws = a.workspace + th * n_parts_grid * stride;
  float m0 = -INFINITY, l0 = 0.0f, m1 = -INFINITY, l1 = 0.0f;  // partitions lane and lane + 32
  if (lane < n_parts) {
    m0 = ws[lane * stride];
    l0 = ws[lane * stride + 1];
  }
  if (lane + 32 < n_parts) {
    m1 = ws[(lane + 32) * stride];
    l1 = ws[(lane + 32) * stride + 1];
  }
  float v[kMergePrefetch][kPerLane];
#pragma unroll
  for (int p = 0; p < kMergePrefetch; ++p)
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + 32 * j;
      v[p][j] = p < n_parts && d < D ? ws[p * stride + 2 + d] : 0.0f;
    }
  const float M = warp_max_f(fmaxf(m0, m1));
  const float f0 = lane < n_parts ? expf(__fsub_rn(m0, M)) : 0.0f;
  const float f1 = lane + 32 < n_parts ? expf(__fsub_rn(m1, M)) : 0.0f;
  const float w0 = __fmul_rn(l0, f0), w1 = __fmul_rn(l1, f1);
  float L = 0.0f;
  for (int p = 0; p < n_parts; ++p) L = __fadd_rn(L, __shfl_sync(0xffffffffu, p < 32 ? w0 : w1, p & 31));
  float o[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) o[j] = 0.0f;
#pragma unroll
  for (int p = 0; p < kMergePrefetch; ++p) {
    const float f = __shfl_sync(0xffffffffu, f0, p);
    if (p < n_parts)
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) o[j] = __fmaf_rn(v[p][j], f, o[j]);
  }
  for (int p0 = kMergePrefetch; p0 < n_parts; p0 += kMergePrefetch) {
#pragma unroll
    for (int p = p0; p < p0 + kMergePrefetch; ++p)
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int d = lane + 32 * j;
        v[p - p0][j] = p < n_parts && d < D ? ws[p * stride + 2 + d] : 0.0f;
      }
#pragma unroll
    for (int p = p0; p < p0 + kMergePrefetch; ++p) {
      const float f = __shfl_sync(0xffffffffu, p < 32 ? f0 : f1, p & 31);
      if (p < n_parts)
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) o[j] = __fmaf_rn(v[p - p0][j], f, o[j]);
    }
  }
  float* out = a.out + t * a.n_heads * D + h * D;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < D) out[lane + 32 * j] = __fdiv_rn(o[j], L);
}

// The merge for this head size (after an attention kernel that wrote partitions).
void launch_attention_merge(const AttentionArgs& a, int32_t parts, cudaStream_t stream) {
  const dim3 grid(grid_dim((int64_t(a.n) * a.n_heads + kMergeWarps - 1) / kMergeWarps, "attention merge"));
  const dim3 block(32 * kMergeWarps);
  if (a.head_dim <= 64)
    launch("launching the attention merge kernel", attention_merge_kernel<2>, grid, block, 0, stream, a, parts);
  else if (a.head_dim <= 128)
    launch("launching the attention merge kernel", attention_merge_kernel<4>, grid, block, 0, stream, a, parts);
  else
    launch("launching the attention merge kernel", attention_merge_kernel<8>, grid, block, 0, stream, a, parts);
}

// ---- router ----------------------------------------------------------------------------------------
// One warp per token. Probabilities in shared memory; k rounds of a warp argmax (ties to the lower id).
__global__ void route_topk_kernel(const float* logits, int64_t n_experts, int64_t k, bool renormalise, int32_t* ids,
                                  float* weights, RouteShare share) {
  overlap_prologue();
  extern __shared__ float probs[];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x;
  const float* l = logits + t * n_experts;
  float mx = -INFINITY;
  for (int64_t e = lane; e < n_experts; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max_f(mx);
  float s = 0.0f;
  for (int64_t e = lane; e < n_experts; e += 32) {
    const float v = expf(__fsub_rn(l[e], mx));
    probs[e] = v;
    s = __fadd_rn(s, v);
  }
  s = warp_sum_f(s);
  for (int64_t e = lane; e < n_experts; e += 32) probs[e] = __fdiv_rn(probs[e], s);
  __syncwarp();
  float top_sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    float best = -1.0f;
    int32_t best_id = 0x7fffffff;
    for (int64_t e = lane; e < n_experts; e += 32)
      if (probs[e] > best) {  // ascending e: the first maximum of this lane is its lowest id
        best = probs[e];
        best_id = int32_t(e);
      }
    for (int o = 16; o >= 1; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oi < best_id)) {
        best = ob;
        best_id = oi;
      }
    }
    if (best_id == 0x7fffffff) best_id = 0, best = 0.0f;  // all NaN: never happens with finite logits
    if (lane == 0) {
      ids[t * k + j] = best_id;
      if (share.ids) share.ids[t * k + j] = share.owned[best_id] ? best_id : -1;
      weights[t * k + j] = best;
      probs[best_id] = -2.0f;  // taken
    }
    top_sum = __fadd_rn(top_sum, best);
    __syncwarp();
  }
  if (renormalise && lane == 0)
    for (int64_t j = 0; j < k; ++j) weights[t * k + j] = __fdiv_rn(weights[t * k + j], top_sum);
}

// route_topk_kernel for at most 32 * kPer experts, the probabilities in registers (lane l holds
// experts l, l + 32, ...): the same arithmetic in the same order, without the shared-memory round
// trips between the k rounds.
template <int kPer>
__global__ void route_topk_regs_kernel(const float* logits, int32_t n_experts, int32_t k, bool renormalise, int32_t* ids,
                                       float* weights, RouteShare share) {
  overlap_prologue();
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x;
  const float* l = logits + t * n_experts;
  float pr[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) pr[i] = lane + 32 * i < n_experts ? l[lane + 32 * i] : -INFINITY;
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i) mx = fmaxf(mx, pr[i]);
  mx = warp_max_f(mx);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + 32 * i < n_experts) {
      pr[i] = expf(__fsub_rn(pr[i], mx));
      s = __fadd_rn(s, pr[i]);
    }
  s = warp_sum_f(s);
#pragma unroll
  for (int i = 0; i < kPer; ++i) pr[i] = lane + 32 * i < n_experts ? __fdiv_rn(pr[i], s) : -3.0f;
  float top_sum = 0.0f;
  int32_t my_ids[8];
  float my_w[8];
  for (int32_t j = 0; j < k; ++j) {
    float best = -1.0f;
    int32_t best_id = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (pr[i] > best) {  // ascending e: the first maximum of this lane is its lowest id
        best = pr[i];
        best_id = lane + 32 * i;
      }
    for (int o = 16; o >= 1; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oi < best_id)) {
        best = ob;
        best_id = oi;
      }
    }
    if (best_id == 0x7fffffff) best_id = 0, best = 0.0f;  // all NaN: never happens with finite logits
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i == best_id) pr[i] = -2.0f;  // taken
    top_sum = __fadd_rn(top_sum, best);
    if (j < 8) {
      my_ids[j] = best_id;
      my_w[j] = best;
    } else if (lane == 0) {
      ids[t * k + j] = best_id;
      if (share.ids) share.ids[t * k + j] = share.owned[best_id] ? best_id : -1;
      weights[t * k + j] = best;  // renormalised below
    }
  }
  if (lane == 0) {
    for (int32_t j = 0; j < k && j < 8; ++j) {
      ids[t * k + j] = my_ids[j];
      if (share.ids) share.ids[t * k + j] = share.owned[my_ids[j]] ? my_ids[j] : -1;
      weights[t * k + j] = renormalise ? __fdiv_rn(my_w[j], top_sum) : my_w[j];
    }
    if (renormalise)
      for (int32_t j = 8; j < k; ++j) weights[t * k + j] = __fdiv_rn(weights[t * k + j], top_sum);
  }
}

// ---- elementwise -----------------------------------------------------------------------------------

__device__ __forceinline__ float silu(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, int64_t width, float* out) {
  overlap_prologue();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * width) return;
  const int64_t t = i / width, c = i % width;
  const float g = up ? gate[i] : gate[t * 2 * width + c];
  const float u = up ? up[i] : gate[t * 2 * width + width + c];
  out[i] = __fmul_rn(silu(g), u);
}

__global__ void add_kernel(float* x, const float* y, int64_t count) {
  overlap_prologue();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t rows, int64_t cols) {
  overlap_prologue();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * cols) y[i] = __fadd_rn(y[i], bias[i % cols]);
}

// ---- dense matmul of float weights -------------------------------------------------------------------
// One block of kBlock threads per (row, group of up to 8 tokens): thread i takes k = i, i + kBlock, ...
// (one fma chain per token), then the warp butterfly and the warps in order.
constexpr int kTokenGroup = 8;

template <class W>
__device__ __forceinline__ void block_dot_tokens(const W* w, int64_t cols, const float* x, int64_t ldx, int nt,
                                                 float out[kTokenGroup]) {
  __shared__ float part[kWarpsPerBlock][kTokenGroup];
  float acc[kTokenGroup];
#pragma unroll
  for (int t = 0; t < kTokenGroup; ++t) acc[t] = 0.0f;
#pragma unroll 16
  for (int64_t c = threadIdx.x; c < cols; c += kBlock) {
    const float wv = load_w(w, c);
#pragma unroll
    for (int t = 0; t < kTokenGroup; ++t)
      if (t < nt) acc[t] = __fmaf_rn(wv, x[t * ldx + c], acc[t]);
  }
#pragma unroll
  for (int t = 0; t < kTokenGroup; ++t) {
    const float s = warp_sum_f(acc[t]);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32][t] = s;
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kTokenGroup; ++t) {
    float s = part[0][t];
    for (int wp = 1; wp < kWarpsPerBlock; ++wp) s = __fadd_rn(s, part[wp][t]);
    out[t] = s;
  }
  __syncthreads();
}

// A block of kBlock threads per row and group of up to kTokenGroup tokens. Thread i holds the
// row's 16-byte vectors i, i + kBlock, ... of each chunk of kFloatPrefetch passes; the first chunk is
// loaded before waiting for the previous kernel (the weights do not depend on it), so at batch 1 the
// row's DRAM latency hides behind that kernel's tail. Each token's sum: the thread's fma chain over
// its elements in order, the warp butterfly, the warps in order; the order depends on (cols, kVec)
// only, never on n. (A warp per row gave each lane 4x the activation loads at batch 8: +10% step.)
constexpr int kFloatPrefetch = 8;  // 16-byte vectors per thread in flight at once

template <class W, int kVec>
struct FloatVec;  // a lane's kVec weights: one 16-byte load (kVec > 1) or one element
template <class W>
struct FloatVec<W, 1> {
  W raw;
  __device__ __forceinline__ void load(const W* p) { raw = *p; }
  __device__ __forceinline__ void unpack(float out[1]) const { out[0] = load_w(&raw, 0); }
};
template <class W, int kVec>
struct FloatVec {
  static_assert(kVec * sizeof(W) == 16, "a vector is 16 bytes");
  uint4 raw;
  __device__ __forceinline__ void load(const W* p) { raw = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void unpack(float out[kVec]) const {
    const uint32_t word[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<W, float>) {
        out[i] = __uint_as_float(word[i]);
      } else if constexpr (std::is_same_v<W, __nv_bfloat16>) {
        out[2 * i] = bf16_bits(uint16_t(word[i] & 0xffffu));
        out[2 * i + 1] = bf16_bits(uint16_t(word[i] >> 16));
      } else {
        out[2 * i] = __half2float(__ushort_as_half(uint16_t(word[i] & 0xffffu)));
        out[2 * i + 1] = __half2float(__ushort_as_half(uint16_t(word[i] >> 16)));
      }
    }
  }
};

template <int kVec>
__device__ __forceinline__ void load_x(const float* p, float out[kVec]) {
  if constexpr (kVec == 1) {
    out[0] = *p;
  } else {
#pragma unroll
    for (int i = 0; i < kVec; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + i);
      out[i] = v.x, out[i + 1] = v.y, out[i + 2] = v.z, out[i + 3] = v.w;
    }
  }
}

template <class W, int kVec>
__global__ void __launch_bounds__(kBlock) matmul_float_kernel(const W* w, int64_t rows, int64_t cols, const float* x,
                                                              int64_t n, const float* bias, float* y) {
  constexpr int64_t kPass = int64_t(kBlock) * kVec, kChunk = kPass * kFloatPrefetch;
  __shared__ float part[kWarpsPerBlock][kTokenGroup];
  const int64_t row = blockIdx.x, t0 = int64_t(blockIdx.y) * kTokenGroup;
  const int nt = int(min(int64_t(kTokenGroup), n - t0));
  const W* wr = w + row * cols;
  FloatVec<W, kVec> buf[kFloatPrefetch];
  auto load_chunk = [&](int64_t c0) {
#pragma unroll
    for (int p = 0; p < kFloatPrefetch; ++p) {
      const int64_t c = c0 + p * kPass + int64_t(threadIdx.x) * kVec;
      if (c < cols) buf[p].load(wr + c);
    }
  };
  load_chunk(0);
  overlap_prologue();
  float acc[kTokenGroup];
#pragma unroll
  for (int t = 0; t < kTokenGroup; ++t) acc[t] = 0.0f;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    if (c0 > 0) load_chunk(c0);
#pragma unroll
    for (int p = 0; p < kFloatPrefetch; ++p) {
      const int64_t c = c0 + p * kPass + int64_t(threadIdx.x) * kVec;
      if (c >= cols) break;
      float wv[kVec];
      buf[p].unpack(wv);
#pragma unroll
      for (int t = 0; t < kTokenGroup; ++t) {
        if (t >= nt) break;
        float xv[kVec];
        load_x<kVec>(x + (t0 + t) * cols + c, xv);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[t] = __fmaf_rn(wv[e], xv[e], acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTokenGroup; ++t) {
    const float s = warp_sum_f(acc[t]);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32][t] = s;
  }
  __syncthreads();
  if (threadIdx.x < nt) {
    const int t = int(threadIdx.x);
    float s = part[0][t];
    for (int wp = 1; wp < kWarpsPerBlock; ++wp) s = __fadd_rn(s, part[wp][t]);
    if (bias) s = __fadd_rn(s, bias[row]);
    y[(t0 + t) * rows + row] = s;
  }
}

// Many tokens (prefill): a block takes kFloatRows rows x kTokenGroup tokens, so each weight vector
// serves 8 tokens and each activation vector 8 rows (the one-row kernel re-reads a token's
// activations for every row: the router's 128 rows read 512 tokens' 4 MiB 128 times). Each thread
// holds the same columns in the same order as in matmul_float_kernel (vector m of the row at
// thread * kVec + m * kBlock * kVec), and the warp butterfly and the warps in order follow, so a
// (row, token) gets the same bits from either kernel: which one runs may depend on n.
constexpr int kFloatRows = 8;

template <class W, int kVec>
__global__ void __launch_bounds__(kBlock) matmul_float_rows_kernel(const W* w, int64_t rows, int64_t cols, const float* x,
                                                                   int64_t n, const float* bias, float* y) {
  constexpr int64_t kPass = int64_t(kBlock) * kVec;
  __shared__ float part[kWarpsPerBlock][kFloatRows][kTokenGroup];
  const int64_t r0 = int64_t(blockIdx.x) * kFloatRows, t0 = int64_t(blockIdx.y) * kTokenGroup;
  const int nt = int(min(int64_t(kTokenGroup), n - t0));
  const int nr = int(min(int64_t(kFloatRows), rows - r0));
  overlap_prologue();
  float acc[kFloatRows][kTokenGroup];
#pragma unroll
  for (int r = 0; r < kFloatRows; ++r)
#pragma unroll
    for (int t = 0; t < kTokenGroup; ++t) acc[r][t] = 0.0f;
  for (int64_t c = int64_t(threadIdx.x) * kVec; c < cols; c += kPass) {
    float wv[kFloatRows][kVec];
#pragma unroll
    for (int r = 0; r < kFloatRows; ++r) {
      if (r < nr) {
        FloatVec<W, kVec> v;
        v.load(w + (r0 + r) * cols + c);
        v.unpack(wv[r]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) wv[r][e] = 0.0f;
      }
    }
#pragma unroll
    for (int t = 0; t < kTokenGroup; ++t) {
      if (t >= nt) break;
      float xv[kVec];
      load_x<kVec>(x + (t0 + t) * cols + c, xv);
#pragma unroll
      for (int r = 0; r < kFloatRows; ++r)
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[r][t] = __fmaf_rn(wv[r][e], xv[e], acc[r][t]);
    }
  }
#pragma unroll
  for (int r = 0; r < kFloatRows; ++r)
#pragma unroll
    for (int t = 0; t < kTokenGroup; ++t) {
      const float s = warp_sum_f(acc[r][t]);
      if (threadIdx.x % 32 == 0) part[threadIdx.x / 32][r][t] = s;
    }
  __syncthreads();
  if (threadIdx.x < kFloatRows * kTokenGroup) {
    const int r = int(threadIdx.x) / kTokenGroup, t = int(threadIdx.x) % kTokenGroup;
    if (r < nr && t < nt) {
      float s = part[0][r][t];
      for (int wp = 1; wp < kWarpsPerBlock; ++wp) s = __fadd_rn(s, part[wp][r][t]);
      if (bias) s = __fadd_rn(s, bias[r0 + r]);
      y[(t0 + t) * rows + r0 + r] = s;
    }
  }
}

// ---- routed experts of float weights ---------------------------------------------------------------

__device__ __forceinline__ bool valid_expert(int32_t id, int32_t n) { return id >= 0 && id < n; }

// blockIdx.x: row of the expert width; blockIdx.y: (token, slot) pair.
template <class W>
__global__ void __launch_bounds__(kBlock) moe_float_gate_up_kernel(MoeFloatArgs a, float* act) {
  overlap_prologue();
  const int64_t i = blockIdx.x, pair = blockIdx.y;
  const int32_t id = a.ids[pair];
  if (!valid_expert(id, a.n_experts)) return;
  const ExpertWeights e = a.table[id];
  const float* x = a.x + (pair / a.top_k) * a.hidden;
  float g[kTokenGroup], u[kTokenGroup];
  block_dot_tokens(static_cast<const W*>(e.gate) + i * a.hidden, a.hidden, x, a.hidden, 1, g);
  block_dot_tokens(static_cast<const W*>(e.up) + i * a.hidden, a.hidden, x, a.hidden, 1, u);
  if (threadIdx.x == 0) act[pair * a.width + i] = __fmul_rn(silu(g[0]), u[0]);
}

template <class W>
__global__ void __launch_bounds__(kBlock) moe_float_down_kernel(MoeFloatArgs a, const float* act, float* partial) {
  overlap_prologue();
  const int64_t j = blockIdx.x, pair = blockIdx.y;
  const int32_t id = a.ids[pair];
  if (!valid_expert(id, a.n_experts)) {
    if (threadIdx.x == 0) partial[pair * a.hidden + j] = 0.0f;
    return;
  }
  const ExpertWeights e = a.table[id];
  float y[kTokenGroup];
  block_dot_tokens(static_cast<const W*>(e.down) + j * a.width, a.width, act + pair * a.width, a.width, 1, y);
  if (threadIdx.x == 0) partial[pair * a.hidden + j] = __fmul_rn(a.weights[pair], y[0]);
}

__global__ void moe_float_sum_kernel(MoeFloatArgs a, const float* partial) {
  overlap_prologue();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n * a.hidden) return;
  const int64_t t = i / a.hidden, j = i % a.hidden;
  const float* p = partial + t * a.top_k * a.hidden + j;
  float s = p[0];
  for (int32_t slot = 1; slot < a.top_k; ++slot) s = __fadd_rn(s, p[slot * a.hidden]);
  a.out[i] = s;
}

// ---- argmax -----------------------------------------------------------------------------------------

__global__ void argmax_kernel(const float* x, int64_t cols, int32_t* ids) {
  overlap_prologue();
  __shared__ float bv[kBlock];
  __shared__ int32_t bi[kBlock];
  const float* r = x + int64_t(blockIdx.x) * cols;
  float best = -INFINITY;
  int32_t idx = 0x7fffffff;
  for (int64_t c = threadIdx.x; c < cols; c += kBlock)
    if (r[c] > best || (idx == 0x7fffffff && r[c] == best)) {
      best = r[c];
      idx = int32_t(c);
    }
  bv[threadIdx.x] = best;
  bi[threadIdx.x] = idx;
  __syncthreads();
  for (int s = kBlock / 2; s >= 1; s >>= 1) {
    if (int(threadIdx.x) < s) {
      const float ov = bv[threadIdx.x + s];
      const int32_t oi = bi[threadIdx.x + s];
      if (ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x])) {
        bv[threadIdx.x] = ov;
        bi[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = bi[0] == 0x7fffffff ? 0 : bi[0];
}

unsigned blocks_for(int64_t count, int threads, const char* op) { return grid_dim((count + threads - 1) / threads, op); }

}  // namespace

// ---- host entry points ---------------------------------------------------------------------------

bool embed_rows_supported(DType type) {
  return type == DType::F32 || type == DType::BF16 || type == DType::F16 || type == DType::Q8_0;
}

void embed_rows(const void* table, DType type, int64_t vocab, int64_t hidden, const int32_t* ids, int64_t n,
                float* out, cudaStream_t stream) {
  if (n <= 0) return;
  if (!embed_rows_supported(type))
    throw_error(std::string("embedding rows: no device kernel for ") + std::string(dtype_name(type)) + " (F32, BF16, F16, Q8_0)");
  if (hidden <= 0 || !row_fits(type, hidden)) throw_error("embedding rows: bad width " + str(hidden));
  const unsigned grid = grid_dim(n, "embedding rows");
  if (type == DType::Q8_0) {
    launch("launching the embedding kernel", embed_q8_0_kernel, dim3(grid), dim3(256), 0, stream,
           static_cast<const uint8_t*>(table), hidden, ids, out);
  } else {
    dispatch_float_type(type, "embedding rows", [&](auto w) {
      using W = decltype(w);
      launch("launching the embedding kernel", embed_float_kernel<W>, dim3(grid), dim3(256), 0, stream,
             static_cast<const W*>(table), hidden, ids, out);
    });
  }
}

void rmsnorm(const RmsNormArgs& args, cudaStream_t stream) {
  if (args.n <= 0) return;
  if (args.dim <= 0 || !args.x || !args.weight || !args.out) throw_error("rmsnorm: bad arguments (dim " + str(args.dim) + ")");
  RmsNormArgs a = args;
  if (a.ld_x == 0) a.ld_x = a.dim;
  if (a.ld_out == 0) a.ld_out = a.dim;
  if (a.rounded && (a.dim % 32 != 0 || a.ld_out != a.dim || reinterpret_cast<uintptr_t>(a.rounded) % 16 != 0))
    throw_error("rmsnorm: rounding the output needs dim a multiple of 32 (" + str(a.dim) +
                "), contiguous rows and a 16-byte aligned buffer");
  const bool vec = a.dim % 4 == 0 && a.ld_x % 4 == 0 && a.ld_out % 4 == 0 &&
                   (reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.out) |
                    reinterpret_cast<uintptr_t>(a.weight) | reinterpret_cast<uintptr_t>(a.residual) |
                    reinterpret_cast<uintptr_t>(a.residual2)) % 16 == 0;
  const int64_t per_thread = (a.dim / 4 + kNormVecBlock - 1) / kNormVecBlock;
  const dim3 grid(grid_dim(a.n, "rmsnorm"));
  if (vec && per_thread <= 1)
    launch("launching the RMSNorm kernel", rmsnorm_vec_kernel<1>, grid, dim3(kNormVecBlock), 0, stream, a);
  else if (vec && per_thread <= 2)
    launch("launching the RMSNorm kernel", rmsnorm_vec_kernel<2>, grid, dim3(kNormVecBlock), 0, stream, a);
  else if (vec && per_thread <= 4)
    launch("launching the RMSNorm kernel", rmsnorm_vec_kernel<4>, grid, dim3(kNormVecBlock), 0, stream, a);
  else if (vec && per_thread <= 8)
    launch("launching the RMSNorm kernel", rmsnorm_vec_kernel<8>, grid, dim3(kNormVecBlock), 0, stream, a);
  else {
    RmsNormArgs plain = a;
    plain.rounded = nullptr;
    launch("launching the RMSNorm kernel", rmsnorm_kernel, grid, dim3(kNormBlock), 0, stream, plain);
    if (a.rounded) round_rows(a.out, false, a.n, a.dim, a.rounded, stream);  // (needs ld_out == dim)
  }
}

void rope_kv_write(const RopeKvArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  if (a.head_dim <= 0 || a.head_dim % 2 != 0 || a.head_dim > kMaxHeadDim)
    throw_error("RoPE: head_dim " + str(a.head_dim) + " must be even and at most " + str(kMaxHeadDim));
  if (a.n_heads <= 0 || a.n_kv_heads <= 0 || (a.q_norm == nullptr) != (a.k_norm == nullptr))
    throw_error("RoPE: bad head counts, or a q norm without a k norm");
  const unsigned grid = grid_dim(a.n, "RoPE");
  const int64_t D = a.head_dim;
  const bool fp8 = a.kv_type == KvFormat::Fp8E4m3;
  if (fp8 && (D % 32 != 0 || !a.k_scale || !a.v_scale))
    throw_error("RoPE: an FP8 KV cache needs head_dim a multiple of 32 (got " + str(D) + ") and its scales");
  if ((D == 64 || D == 128 || D == 256) && (!a.q_norm || a.norm_per_head)) {
    const dim3 head_grid(grid, unsigned((a.n_heads + a.n_kv_heads + kRopeHeadsPerBlock - 1) / kRopeHeadsPerBlock));
    const dim3 block(kRopeHeadsPerBlock * 32);
    auto go = [&](auto kv_tag, auto pl_tag) {
      using KV = decltype(kv_tag);
      constexpr int kPL = decltype(pl_tag)::value;
      launch("launching the RoPE/KV-write kernel", rope_kv_head_kernel<KV, kPL>, head_grid, block, 0, stream, a);
    };
    auto by_dim = [&](auto kv_tag) {
      if (D == 64) go(kv_tag, std::integral_constant<int, 2>{});
      else if (D == 128) go(kv_tag, std::integral_constant<int, 4>{});
      else go(kv_tag, std::integral_constant<int, 8>{});
    };
    if (a.kv_type == KvFormat::F32) by_dim(float{});
    else if (a.kv_type == KvFormat::BF16) by_dim(__nv_bfloat16{});
    else by_dim(Fp8Kv{});
    return;
  }
  if (a.kv_type == KvFormat::F32)
    launch("launching the RoPE/KV-write kernel", rope_kv_kernel<float>, dim3(grid), dim3(kNormBlock), 0, stream, a);
  else if (a.kv_type == KvFormat::BF16)
    launch("launching the RoPE/KV-write kernel", rope_kv_kernel<__nv_bfloat16>, dim3(grid), dim3(kNormBlock), 0, stream, a);
  else launch("launching the RoPE/KV-write kernel", rope_kv_kernel<Fp8Kv>, dim3(grid), dim3(kNormBlock), 0, stream, a);
}

namespace {
__global__ void f32_to_e4m3_kernel(const float* x, int64_t n, uint8_t* q) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) q[i] = e4m3_of(x[i]);
}
}  // namespace

void f32_to_e4m3(const float* x, int64_t n, uint8_t* q, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_e4m3_kernel<<<grid_dim((n + 255) / 256, "e4m3 conversion"), 256, 0, stream>>>(x, n, q);
  check(cudaGetLastError(), "launching the e4m3 conversion");
}

int32_t attention_min_partition() {
  static const int32_t v = int32_t(env_int("SPILL_CUDA_ATTN_MIN_PART", kMinAttentionPartition, 32, 4096) / 32 * 32);
  return v;
}

// Which prompt build of the tensor-core attention runs: 0 attention_mma_kernel's (2 tokens of a GQA
// group of 8 per K/V fetch), 4 or 8 attention_prompt_kernel with that many m16 tiles per block.
int attention_prompt_warps() {
  static const int v = [] {
    const int w = int(env_int("SPILL_CUDA_ATTN_PROMPT_WARPS", 0, 0, 8));
    if (w != 0 && w != 4 && w != 8)
      throw_error("SPILL_CUDA_ATTN_PROMPT_WARPS=" + str(w) + ": the prompt build takes 0 (off), 4 or 8 m16 tiles a block");
    return w;
  }();
  return v;
}

int32_t attention_grid_parts(int32_t max_positions) {
  return attention_grid_partitions(max_positions, attention_min_partition());
}

int64_t attention_workspace_floats(int64_t max_tokens, int64_t n_heads, int64_t head_dim, int32_t max_positions) {
  const int64_t parts = attention_grid_parts(max_positions);
  return parts <= 1 ? 0 : max_tokens * n_heads * parts * (head_dim + 2);
}

static int mma_heads_for(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  if ((head_dim != 64 && head_dim != 128) || n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return 0;
  const int64_t group = n_heads / n_kv_heads;
  if (group <= 16) return int(group);
  return group % 16 == 0 ? 16 : 0;
}

int attention_mma_heads(const AttentionArgs& a) {
  if (a.kv_type != KvFormat::BF16 && a.kv_type != KvFormat::Fp8E4m3) return 0;
  return mma_heads_for(a.n_heads, a.n_kv_heads, a.head_dim);
}

bool kv_fp8_supported(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  return mma_heads_for(n_heads, n_kv_heads, head_dim) > 0;
}

int attention_launches(int32_t max_positions) { return attention_grid_parts(max_positions) > 1 ? 2 : 1; }

void paged_attention(const AttentionArgs& args, cudaStream_t stream) {
  if (args.n <= 0) return;
  AttentionArgs a = args;
  a.min_partition = attention_min_partition();
  if (a.head_dim <= 0 || a.head_dim > kMaxHeadDim || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    throw_error("attention: bad head shape (" + str(a.n_heads) + " q heads, " + str(a.n_kv_heads) +
                " kv heads of " + str(a.head_dim) + "; head_dim at most " + str(kMaxHeadDim) + ")");
  if (a.max_positions <= 0 || a.block_size <= 0) throw_error("attention: bad max_positions or block size");
  const int32_t parts = std::max(attention_grid_parts(a.max_positions), a.min_grid_parts);
  if (parts > kMaxAttentionPartitions) throw_error("attention: more than " + str(kMaxAttentionPartitions) + " partitions");
  if (parts > 1 && !a.workspace) throw_error("attention: contexts over one partition need the workspace");
  if (const int heads = attention_mma_heads(a); heads > 0) {
    // A prompt's consecutive tokens fill the m16 tiles together (16 / heads of them) once a step has
    // enough tokens to be mostly prompt; a decode batch keeps a block per token (more blocks, and
    // its tokens are of different sequences). The bits are the same either way.
    const bool fp8 = a.kv_type == KvFormat::Fp8E4m3;
    if (fp8 && (!a.k_scale || !a.v_scale)) throw_error("attention: an FP8 KV cache needs its scales");
    // A prompt over a BF16 cache: the kernel whose warps' m16 tiles share each staged K/V tile, when
    // AttentionArgs::prompt_warps (or SPILL_CUDA_ATTN_PROMPT_WARPS) names its width, 4 or 8 m16 tiles a
    // block; the bits are the same as the other build's.
    if (const int width = a.prompt_warps >= 0 ? a.prompt_warps : attention_prompt_warps(); width > 0 && !fp8 && a.n >= kAttentionShareMinTokens) {
      const int32_t tile_tokens = 16 / heads;
      const dim3 grid(grid_dim((a.n + width * tile_tokens - 1) / (width * tile_tokens) * (a.n_heads / heads), "attention"),
                      unsigned(parts));
      auto go = [&](auto kernel, int D) {
        check(allow_max_dynamic_smem(kernel), "raising the prompt attention kernel's shared memory limit");
        launch("launching the prompt attention kernel", kernel, grid, dim3(32 * width), size_t(prompt_attention_smem(D)),
               stream, a, parts, int32_t(heads), tile_tokens);
      };
      if (width != 4 && width != 8) throw_error("attention: the prompt build takes 4 or 8 m16 tiles a block, not " + str(width));
      if (a.head_dim == 64) width == 8 ? go(attention_prompt_kernel<64, 8>, 64) : go(attention_prompt_kernel<64, 4>, 64);
      else width == 8 ? go(attention_prompt_kernel<128, 8>, 128) : go(attention_prompt_kernel<128, 4>, 128);
      if (parts > 1) launch_attention_merge(a, parts, stream);
      return;
    }
    const int32_t tokens = a.n >= kAttentionShareMinTokens && 16 % heads == 0 ? 16 / heads : 1;
    const dim3 grid(grid_dim((a.n + tokens - 1) / tokens * (a.n_heads / heads), "attention"), unsigned(parts));
    auto go = [&](auto kernel, int D) {
      const int smem = mma_attention_smem(D, fp8);
      check(allow_max_dynamic_smem(kernel),
            "raising the attention kernel's shared memory limit");
      launch("launching the attention kernel", kernel, grid, dim3(kBlock), size_t(smem), stream, a, parts, int32_t(heads),
             tokens);
    };
    auto by_dim = [&](auto fp8_tag) {
      constexpr bool kFp8 = decltype(fp8_tag)::value;
      if (a.head_dim == 64)
        go(tokens > 1 ? attention_mma_kernel<64, true, kFp8> : attention_mma_kernel<64, false, kFp8>, 64);
      else go(tokens > 1 ? attention_mma_kernel<128, true, kFp8> : attention_mma_kernel<128, false, kFp8>, 128);
    };
    if (fp8) by_dim(std::true_type{});
    else by_dim(std::false_type{});
    if (parts > 1) launch_attention_merge(a, parts, stream);
    return;
  }
  // Heads per block: the largest of 8, 4, 2, 1 that divides the GQA group, lowered while the grid
  // has fewer than ~2 blocks per SM (a small batch at a short context would leave the GPU idle);
  // SPILL_CUDA_ATTN_HEADS caps it, for comparisons: the bits are the same for every choice.
  const int64_t group = a.n_heads / a.n_kv_heads;
  int G = 8;
  while (group % G != 0) G /= 2;
  while (G > 1 && a.n * (a.n_heads / G) * parts < 264) G /= 2;
  static const int heads_cap = int(env_int("SPILL_CUDA_ATTN_HEADS", 8, 1, 8));  // read once, not per call
  G = std::min(G, heads_cap);
  while (group % G != 0) G /= 2;
  const dim3 grid(grid_dim(a.n * (a.n_heads / G), "attention"), unsigned(parts));
  const int64_t D = a.head_dim;
  auto go = [&](auto kv_tag, auto g_tag) {
    using KV = decltype(kv_tag);
    constexpr int kG = decltype(g_tag)::value;
    if (D == 64)
      launch("launching the attention kernel", attention_tile_kernel<KV, kG, 2>, grid, dim3(kBlock), 0, stream, a, parts);
    else if (D == 128)
      launch("launching the attention kernel", attention_tile_kernel<KV, kG, 4>, grid, dim3(kBlock), 0, stream, a, parts);
    else if (D == 256)
      launch("launching the attention kernel", attention_tile_kernel<KV, kG, 8>, grid, dim3(kBlock), 0, stream, a, parts);
    else
      launch("launching the attention kernel", attention_kernel<KV, kG>, grid, dim3(kBlock), 0, stream, a, parts);
  };
  auto by_heads = [&](auto kv_tag) {
    switch (G) {
      case 8: go(kv_tag, std::integral_constant<int, 8>{}); break;
      case 4: go(kv_tag, std::integral_constant<int, 4>{}); break;
      case 2: go(kv_tag, std::integral_constant<int, 2>{}); break;
      default: go(kv_tag, std::integral_constant<int, 1>{}); break;
    }
  };
  if (a.kv_type == KvFormat::F32) by_heads(float{});
  else if (a.kv_type == KvFormat::BF16) by_heads(__nv_bfloat16{});
  else
    throw_error("attention: an FP8 KV cache needs head_dim 64 or 128 and a GQA group of at most 16 query heads (or a "
                "multiple of 16); this model has " + str(a.n_heads) + " query heads over " + str(a.n_kv_heads) +
                " KV heads of " + str(a.head_dim) + ": use a BF16 cache");
  if (parts > 1) launch_attention_merge(a, parts, stream);
}

void route_topk(const float* logits, int64_t n, int64_t n_experts, int64_t k, bool renormalise, int32_t* ids,
                float* weights, cudaStream_t stream, RouteShare share) {
  if (n <= 0) return;
  if (n_experts <= 0 || n_experts > 8192 || k <= 0 || k > n_experts)
    throw_error("router: need 1 <= top_k (" + str(k) + ") <= n_experts (" + str(n_experts) + ") <= 8192");
  if ((share.ids == nullptr) != (share.owned == nullptr))
    throw_error("router: a GPU's share of the experts needs both its owned mask and its ids (internal error)");
  const dim3 grid(grid_dim(n, "router"));
  if (n_experts <= 128)
    launch("launching the router kernel", route_topk_regs_kernel<4>, grid, dim3(32), 0, stream, logits,
           int32_t(n_experts), int32_t(k), renormalise, ids, weights, share);
  else if (n_experts <= 256)
    launch("launching the router kernel", route_topk_regs_kernel<8>, grid, dim3(32), 0, stream, logits,
           int32_t(n_experts), int32_t(k), renormalise, ids, weights, share);
  else
    launch("launching the router kernel", route_topk_kernel, grid, dim3(32), size_t(n_experts) * sizeof(float), stream,
           logits, n_experts, k, renormalise, ids, weights, share);
}

void silu_mul(const float* gate, const float* up, int64_t n, int64_t width, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch("launching the SiLU*up kernel", silu_mul_kernel, dim3(blocks_for(n * width, 256, "silu*up")), dim3(256), 0, stream,
         gate, up, n, width, out);
}

void add_inplace(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  launch("launching the add kernel", add_kernel, dim3(blocks_for(count, 256, "add")), dim3(256), 0, stream, x, y, count);
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0) return;
  launch("launching the bias kernel", add_bias_kernel, dim3(blocks_for(rows * cols, 256, "bias")), dim3(256), 0, stream, y,
         bias, rows, cols);
}

bool matmul_float_supported(DType type) { return type == DType::F32 || type == DType::BF16 || type == DType::F16; }

void matmul_float(const void* w, DType type, int64_t rows, int64_t cols, const float* x, int64_t n,
                  const float* bias, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  if (rows <= 0 || cols <= 0) throw_error("matmul: bad shape " + str(rows) + " x " + str(cols));
  const dim3 grid(grid_dim(rows, "matmul"), grid_dim((n + kTokenGroup - 1) / kTokenGroup, "matmul"));
  const bool aligned = ((reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x)) & 15) == 0;
  dispatch_float_type(type, "matmul", [&](auto tag) {
    using W = decltype(tag);
    constexpr int kVec = int(16 / sizeof(W));
    // 16-byte loads where every row starts on 16 bytes, element loads otherwise: the shape and the
    // buffers decide, never the number of tokens, so a row's sum order is the same at any batch
    const bool vec = aligned && cols % kVec == 0;
    if (n > kTokenGroup) {
      // Several token groups: rows in blocks of kFloatRows (the same sums, fewer activation reads).
      const dim3 rows_grid(grid_dim((rows + kFloatRows - 1) / kFloatRows, "matmul"), grid.y);
      auto* kernel = vec ? matmul_float_rows_kernel<W, kVec> : matmul_float_rows_kernel<W, 1>;
      launch("launching the float matmul kernel", kernel, rows_grid, dim3(kBlock), 0, stream,
             static_cast<const W*>(w), rows, cols, x, n, bias, y);
      return;
    }
    auto* kernel = vec ? matmul_float_kernel<W, kVec> : matmul_float_kernel<W, 1>;
    launch("launching the float matmul kernel", kernel, grid, dim3(kBlock), 0, stream,
           static_cast<const W*>(w), rows, cols, x, n, bias, y);
  });
}

int64_t moe_float_workspace_bytes(int64_t max_tokens, int32_t top_k, int64_t hidden, int64_t width) {
  return max_tokens * top_k * (width + hidden) * int64_t(sizeof(float));
}

void moe_experts_float(const MoeFloatArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  if (a.hidden <= 0 || a.width <= 0 || a.top_k <= 0 || a.top_k > a.n_experts)
    throw_error("float MoE: bad shape (hidden " + str(a.hidden) + ", width " + str(a.width) + ", top-" +
                str(a.top_k) + " of " + str(a.n_experts) + ")");
  float* act = static_cast<float*>(a.workspace);
  float* partial = act + a.n * a.top_k * a.width;
  const unsigned pairs = grid_dim(a.n * a.top_k, "float MoE");
  dispatch_float_type(a.type, "float MoE", [&](auto tag) {
    using W = decltype(tag);
    launch("launching the float MoE gate/up kernel", moe_float_gate_up_kernel<W>, dim3(grid_dim(a.width, "float MoE"), pairs),
           dim3(kBlock), 0, stream, a, act);
    launch("launching the float MoE down kernel", moe_float_down_kernel<W>, dim3(grid_dim(a.hidden, "float MoE"), pairs),
           dim3(kBlock), 0, stream, a, static_cast<const float*>(act), partial);
  });
  launch("launching the float MoE sum kernel", moe_float_sum_kernel, dim3(blocks_for(a.n * a.hidden, 256, "float MoE")),
         dim3(256), 0, stream, a, static_cast<const float*>(partial));
}

void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, cudaStream_t stream) {
  if (rows <= 0) return;
  launch("launching the argmax kernel", argmax_kernel, dim3(grid_dim(rows, "argmax")), dim3(kBlock), 0, stream, x, cols, ids);
}

}  // namespace spill::cuda
