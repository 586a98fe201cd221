// Which access patterns let a kernel read pinned, device-mapped host memory in place at the PCIe
// limit? Reads one decode step's worth of expert bytes (one-shot kernels over a region not in L2)
// in several patterns and prints GB/s for each (docs/perf/host-reads-2026-12-01.md):
//   stream              the ceiling probe's pattern (backend/cuda/bandwidth.cu), 528 and 2112 blocks
//   rows-cpasync        a warp stages 4 rows of `row` bytes into shared memory by 16-byte
//                       cp.async.cg, 8 warps per block; also at most 1-4 blocks per SM
//   stride S [matched]  the same rows at a shared row stride S; "matched": each row lands at its
//                       source's offset within 128 bytes (what stage_rows does). Any other offset
//                       splits the copies and halves the rate over PCIe
//   rows-cpasync-ca, rows-ldg, block-cpasync   through L1, into registers, one span per block
//   moe ...             the MoE gate/up kernel's layout, also launched with programmatic
//                       dependent launch, and with each warp's rows contiguous
// over memory from cudaHostAlloc(Mapped) and from mmap + cudaHostRegister(Mapped) (what the
// expert store pins), filled with ones or (--random) random bytes.
// Usage: host_read_patterns [--mib-per-step 21] [--row 1152] [--reps 20] [--random]
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/block_dot.cuh"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"

// A failed CUDA call throws spill::Error naming the call (main prints it).
#define CHECK(x) spill::cuda::check((x), #x)

namespace {

constexpr int kWarps = 8, kRows = 4;

// Rows of `row` bytes staged at a shared-memory row stride `stride`; match: each row's first byte
// lands at the same offset within 128 bytes as its source (stride a multiple of 128).
__global__ void __launch_bounds__(kWarps * 32) strided_rows_kernel(const uint8_t* data, int row, int stride, bool match,
                                                                   unsigned* sink) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint8_t* span = data + size_t(blockIdx.x) * kWarps * kRows * row;
  for (int r = 0; r < kRows; ++r) {
    const uint8_t* src = span + (warp * kRows + r) * row;
    const int shift = match ? int(reinterpret_cast<uintptr_t>(src) & 127) : 0;
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem + (warp * kRows + r) * stride + shift));
    for (int c = lane; c < row / 16; c += 32)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d + c * 16u), "l"(src + c * 16));
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncwarp();
  const unsigned acc = reinterpret_cast<const unsigned*>(smem + warp * kRows * stride)[lane];
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// The pattern of the ceiling probe's kernel (backend/cuda/bandwidth.cu, which times repeated passes
// over one buffer), here launched once per region.
__global__ void stream_kernel(const uint4* __restrict__ data, size_t n, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = data[i], b = data[i + stride], c = data[i + 2 * stride], d = data[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= data[i].x;
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// Mode 0: cp.async.cg, 1: cp.async.ca, 2: ld.global.nc into registers. Each warp: rows
// (4 * warp_index .. +4) of the block's span; row r of warp w at span + (w * 4 + r) * row.
template <int kMode>
__global__ void __launch_bounds__(kWarps * 32) rows_kernel(const uint8_t* data, int row, unsigned* sink) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = row / 16;
  const uint8_t* span = data + size_t(blockIdx.x) * kWarps * kRows * row;
  unsigned acc = 0;
  if constexpr (kMode == 2) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint4* src = reinterpret_cast<const uint4*>(span + (warp * kRows + r) * row);
      uint4 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = lane + 32 * j;
        v[j] = c < chunks ? __ldg(src + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
  } else {
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* src = span + (warp * kRows + r) * row;
      uint8_t* dst = smem + (warp * kRows + r) * row;
      const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
      for (int c = lane; c < chunks; c += 32) {
        if constexpr (kMode == 0)
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d + c * 16u), "l"(src + c * 16));
        else
          asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(d + c * 16u), "l"(src + c * 16));
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncwarp();
    acc = reinterpret_cast<const unsigned*>(smem + warp * kRows * row)[lane];
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// The MoE gate/up kernel's layout: grid (tiles, experts); block (x, y) stages rows [16x, 16x + 16)
// of expert y's gate and of its up matrix (`matrix` bytes further on), warp w rows 2w and 2w + 1 of
// each; experts `expert` bytes apart. kGateFirst = false: warp w takes gate rows 4w..4w+3 of the
// tile's 32 gate rows, then the up block (x - tiles/2) the same (each warp one contiguous span).
template <bool kInterleaved, bool kDependent = false>
__global__ void __launch_bounds__(kWarps * 32) moe_layout_kernel(const uint8_t* data, int row, int64_t matrix,
                                                                 int64_t expert, unsigned* sink) {
  extern __shared__ __align__(16) uint8_t smem[];
  if constexpr (kDependent) {  // as the MoE kernels start: wait for the previous grid, release the next
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint8_t* gate = data + int64_t(blockIdx.y) * expert;
  const uint8_t* up = gate + matrix;
  const uint8_t* src[kRows];
  if constexpr (kInterleaved) {
    const int64_t r0 = int64_t(blockIdx.x) * 16 + 2 * warp;
    src[0] = gate + r0 * row, src[1] = gate + (r0 + 1) * row, src[2] = up + r0 * row, src[3] = up + (r0 + 1) * row;
  } else {
    const int half = gridDim.x / 2;
    const uint8_t* m = blockIdx.x < half ? gate : up;
    const int64_t r0 = int64_t(blockIdx.x % half) * 32 + 4 * warp;
    for (int r = 0; r < kRows; ++r) src[r] = m + (r0 + r) * row;
  }
  const int chunks = row / 16;
  for (int r = 0; r < kRows; ++r) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem + (warp * kRows + r) * row));
    for (int c = lane; c < chunks; c += 32)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d + c * 16u), "l"(src[r] + c * 16));
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncwarp();
  const unsigned acc = reinterpret_cast<const unsigned*>(smem + warp * kRows * row)[lane];
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(kWarps * 32) block_kernel(const uint8_t* data, int span_bytes, unsigned* sink) {
  extern __shared__ __align__(16) uint8_t smem[];
  const uint8_t* span = data + size_t(blockIdx.x) * span_bytes;
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  for (int c = threadIdx.x; c < span_bytes / 16; c += blockDim.x)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d + c * 16u), "l"(span + c * 16));
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  const unsigned acc = reinterpret_cast<const unsigned*>(smem)[threadIdx.x];
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

struct Args {
  double mib_per_step = 21;
  int row = 1152;
  int reps = 20;
  size_t pool_bytes = size_t(1) << 30;
  bool random_bytes = false;  // pool filled with random bytes instead of ones
};

void fill(void* p, const Args& args) {
  if (!args.random_bytes) {
    std::memset(p, 1, args.pool_bytes);
    return;
  }
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto* w = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < args.pool_bytes / 8; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    w[i] = x;
  }
}

template <class Launch>
double time_pattern(const uint8_t* pool, size_t pool_bytes, size_t step_bytes, int reps, Launch launch) {
  const size_t regions = pool_bytes / step_bytes;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = -2; r < reps; ++r) {  // two warm-ups; each rep reads a region the last did not
    const uint8_t* region = pool + (size_t(r + 2) % regions) * step_bytes;
    CHECK(cudaEventRecord(a));
    launch(region);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (r >= 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return double(step_bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

void run_all(const char* memory, const uint8_t* pool, const Args& args, unsigned* sink) {
  const int row = args.row;
  const size_t block_bytes = size_t(kWarps) * kRows * row;
  const size_t blocks = size_t(args.mib_per_step * 1048576.0) / block_bytes;
  const size_t step = blocks * block_bytes;
  const size_t smem = block_bytes;
  CHECK(cudaFuncSetAttribute(rows_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  CHECK(cudaFuncSetAttribute(rows_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  CHECK(cudaFuncSetAttribute(block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  struct Row {
    const char* name;
    double gbps;
  };
  std::vector<Row> rows;
  for (int grid : {132 * 4, 132 * 16}) {
    const double g = time_pattern(pool, args.pool_bytes, step, args.reps, [&](const uint8_t* p) {
      stream_kernel<<<grid, 256>>>(reinterpret_cast<const uint4*>(p), step / 16, sink);
    });
    rows.push_back({grid == 132 * 4 ? "stream (528 blocks)" : "stream (2112 blocks)", g});
  }
  rows.push_back({"rows-cpasync", time_pattern(pool, args.pool_bytes, step, args.reps, [&](const uint8_t* p) {
                    rows_kernel<0><<<unsigned(blocks), kWarps * 32, smem>>>(p, row, sink);
                  })});
  // The same kernel with shared memory padded so that at most k blocks fit on an SM: does the
  // number of resident blocks (bytes requested per SM at once) set the rate?
  for (int k : {1, 2, 3, 4}) {
    static char names[4][32];
    std::snprintf(names[k - 1], sizeof names[k - 1], "rows-cpasync %d/SM", k);
    const size_t padded = std::max(smem, size_t(220 * 1024 / k));
    CHECK(cudaFuncSetAttribute(rows_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(padded)));
    rows.push_back({names[k - 1], time_pattern(pool, args.pool_bytes, step, args.reps, [&](const uint8_t* p) {
                      rows_kernel<0><<<unsigned(blocks), kWarps * 32, padded>>>(p, row, sink);
                    })});
  }
  {
    static char names[4][48];
    const int strides[4] = {row, (row + 30) / 16 * 16, (row + 16 + 127) / 128 * 128, (row + 127 + 127) / 128 * 128};
    const bool match[4] = {false, false, false, true};
    for (int i = 0; i < 4; ++i) {
      std::snprintf(names[i], sizeof names[i], "stride %d%s", strides[i], match[i] ? " matched" : "");
      const size_t sm = size_t(kWarps) * kRows * strides[i] + 128;
      CHECK(cudaFuncSetAttribute(strided_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sm)));
      rows.push_back({names[i], time_pattern(pool, args.pool_bytes, step, args.reps, [&](const uint8_t* p) {
                        strided_rows_kernel<<<unsigned(blocks), kWarps * 32, sm>>>(p, row, strides[i], match[i], sink);
                      })});
    }
  }
  rows.push_back({"rows-cpasync-ca", time_pattern(pool, args.pool_bytes, step, args.reps, [&](const uint8_t* p) {
                    rows_kernel<1><<<unsigned(blocks), kWarps * 32, smem>>>(p, row, sink);
                  })});
  if (row <= 32 * 4 * 16)
    rows.push_back({"rows-ldg", time_pattern(pool, args.pool_bytes, step, args.reps, [&](const uint8_t* p) {
                      rows_kernel<2><<<unsigned(blocks), kWarps * 32, 0>>>(p, row, sink);
                    })});
  rows.push_back({"block-cpasync", time_pattern(pool, args.pool_bytes, step, args.reps, [&](const uint8_t* p) {
                    block_kernel<<<unsigned(blocks), kWarps * 32, smem>>>(p, int(block_bytes), sink);
                  })});
  // 8 experts of the S30 shape: gate and up of width rows x row bytes each, three matrices per expert.
  {
    const int width = 768, experts = int(std::max<size_t>(1, step / (size_t(3) * width * row)));
    const int64_t matrix = int64_t(width) * row, expert = 3 * matrix;
    CHECK(cudaFuncSetAttribute(moe_layout_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaFuncSetAttribute(moe_layout_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const size_t moe_step = size_t(experts) * expert;
    const double moe_read = double(experts) * 2 * matrix;
    auto moe = [&](auto kernel) {
      const double g = time_pattern(pool, args.pool_bytes, moe_step, args.reps, [&](const uint8_t* p) {
        kernel<<<dim3(width / 16, experts), kWarps * 32, smem>>>(p, row, matrix, expert, sink);
      });
      return g * moe_read / double(moe_step);  // the kernel reads gate and up, 2 of the 3 matrices
    };
    rows.push_back({"moe gate/up layout", moe(moe_layout_kernel<true>)});
    // The same, launched as spill launches its kernels (programmatic dependent launch).
    CHECK(cudaFuncSetAttribute(moe_layout_kernel<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    {
      const double g = time_pattern(pool, args.pool_bytes, moe_step, args.reps, [&](const uint8_t* p) {
        CHECK(spill::cuda::launch_overlapped(moe_layout_kernel<true, true>, dim3(width / 16, experts),
                                             dim3(kWarps * 32), smem, nullptr, p, row, matrix, expert, sink));
      });
      rows.push_back({"moe layout, PDL launch", g * moe_read / double(moe_step)});
    }
    rows.push_back({"moe warp-contiguous", moe(moe_layout_kernel<false>)});
  }
  for (const Row& r : rows)
    std::printf("| %-14s | %-22s | %6.1f | %5zu | %6.2f |\n", memory, r.name, r.gbps, blocks, double(step) / 1048576.0);
}

}  // namespace

int run(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mib-per-step") && i + 1 < argc) args.mib_per_step = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--row") && i + 1 < argc) args.row = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) args.reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--random")) args.random_bytes = true;
    else {
      std::fprintf(stderr, "usage: host_read_patterns [--mib-per-step X] [--row BYTES] [--reps N] [--random]\n");
      return 2;
    }
  }
  if (args.row < 16 || args.row % 16 != 0) {
    std::fprintf(stderr, "--row must be a positive multiple of 16\n");
    return 2;
  }
  unsigned* sink;
  CHECK(cudaMalloc(&sink, 1 << 20));
  std::printf("in-place reads of %.1f MiB per kernel (rows of %d bytes), median of %d, from a 1 GiB pool\n",
              args.mib_per_step, args.row, args.reps);
  std::printf("| memory | pattern | GB/s | blocks | MiB |\n|---|---|---|---|---|\n");
  {
    void* h;
    CHECK(cudaHostAlloc(&h, args.pool_bytes, cudaHostAllocMapped));
    fill(h, args);
    void* d;
    CHECK(cudaHostGetDevicePointer(&d, h, 0));
    run_all("cudaHostAlloc", static_cast<const uint8_t*>(d), args, sink);
    CHECK(cudaFreeHost(h));
  }
  {
    void* h = mmap(nullptr, args.pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED) return 1;
    fill(h, args);
    CHECK(cudaHostRegister(h, args.pool_bytes, cudaHostRegisterMapped));
    void* d;
    CHECK(cudaHostGetDevicePointer(&d, h, 0));
    run_all("mmap+register", static_cast<const uint8_t*>(d), args, sink);
    CHECK(cudaHostUnregister(h));
    munmap(h, args.pool_bytes);
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const spill::Error& e) {
    std::fprintf(stderr, "host_read_patterns: %s\n", e.what());
    return 1;
  }
}
