// Which access pattern lets a kernel read pinned, device-mapped host memory in place at the PCIe
// limit? The MoE kernels (backend/cuda/moe.cu) read host experts at ~23 GB/s where a streaming
// kernel reads the same kind of memory at ~50 GB/s (docs/perf/offload-h200-2026-12-01.md); this
// program reads one decode step's worth of expert bytes (one-shot kernels over a region that is
// not in L2) in several patterns and prints GB/s for each:
//   stream        grid-stride 16-byte loads, 4 in flight per thread (the ceiling kernel)
//   rows-cpasync  the MoE gate/up staging: a warp copies 4 rows of `row` bytes into shared memory
//                 by 16-byte cp.async.cg (lanes on consecutive chunks), 8 warps per block
//   rows-ldg      the same rows by 16-byte ld.global.nc into registers
//   rows-cpasync-ca  as rows-cpasync with cp.async.ca (through L1)
//   block-cpasync a block copies one contiguous span of 8 x 4 rows, its 256 threads on
//                 consecutive chunks
// over memory from cudaHostAlloc(Mapped) and from mmap + cudaHostRegister(Mapped) (what the
// expert store pins). Usage: host_read_patterns [--mib-per-step 21] [--row 1152] [--reps 20]
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

namespace {

constexpr int kWarps = 8, kRows = 4;

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
};

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
  for (const Row& r : rows)
    std::printf("| %-14s | %-22s | %6.1f | %5zu | %6.2f |\n", memory, r.name, r.gbps, blocks, double(step) / 1048576.0);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mib-per-step") && i + 1 < argc) args.mib_per_step = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--row") && i + 1 < argc) args.row = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) args.reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: host_read_patterns [--mib-per-step X] [--row BYTES] [--reps N]\n");
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
    std::memset(h, 1, args.pool_bytes);
    void* d;
    CHECK(cudaHostGetDevicePointer(&d, h, 0));
    run_all("cudaHostAlloc", static_cast<const uint8_t*>(d), args, sink);
    CHECK(cudaFreeHost(h));
  }
  {
    void* h = mmap(nullptr, args.pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED) return 1;
    std::memset(h, 1, args.pool_bytes);
    CHECK(cudaHostRegister(h, args.pool_bytes, cudaHostRegisterMapped));
    void* d;
    CHECK(cudaHostGetDevicePointer(&d, h, 0));
    run_all("mmap+register", static_cast<const uint8_t*>(d), args, sink);
    CHECK(cudaHostUnregister(h));
    munmap(h, args.pool_bytes);
  }
  return 0;
}
