// Read-bandwidth probe: one kernel streams a buffer with 16-byte loads, grid-stride, and folds
// what it read into one word per block so the loads cannot be dropped. Run on a device buffer it
// gives the HBM read ceiling; on mapped pinned host memory, the in-place PCIe read ceiling.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/bandwidth.h"
#include "core/error.h"
#include "core/strings.h"

namespace spill::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA: {} failed: {}", what, cudaGetErrorString(e));
}

__global__ void read_kernel(const uint4* __restrict__ data, size_t n, unsigned* __restrict__ sink) {
  unsigned acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // Four loads in flight per thread before they are used.
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = data[i], b = data[i + stride], c = data[i + 2 * stride], d = data[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = data[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  // Written only on an impossible value, so the compiler keeps the loads and the write costs nothing.
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// Reads `bytes` at `data` repeatedly for about `seconds`; returns GB/s.
double time_reads(const void* data, size_t bytes, double seconds, unsigned* sink, int blocks, double* spent) {
  const size_t n = bytes / sizeof(uint4);
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  read_kernel<<<blocks, 256>>>(static_cast<const uint4*>(data), n, sink);  // warm-up (TLBs, clocks)
  check(cudaGetLastError(), "read kernel launch");
  check(cudaDeviceSynchronize(), "warm-up read");
  // One timed pass to size the run, then enough passes to fill the time.
  check(cudaEventRecord(start), "cudaEventRecord");
  read_kernel<<<blocks, 256>>>(static_cast<const uint4*>(data), n, sink);
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float one_ms = 0;
  check(cudaEventElapsedTime(&one_ms, start, stop), "cudaEventElapsedTime");
  const int passes = std::max(1, int(seconds * 1e3 / std::max(one_ms, 1e-3f)));
  check(cudaEventRecord(start), "cudaEventRecord");
  for (int p = 0; p < passes; ++p) read_kernel<<<blocks, 256>>>(static_cast<const uint4*>(data), n, sink);
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  check(cudaGetLastError(), "read kernel");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  *spent = ms * 1e-3;
  return double(n * sizeof(uint4)) * passes / (double(ms) * 1e-3) / 1e9;
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_pci_bus_id(int device) {
  char buf[32] = {};
  if (cudaDeviceGetPCIBusId(buf, sizeof buf, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return ascii_lower(buf);
}

ReadBandwidth measure_read_bandwidth(int device, double seconds) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  // Enough blocks to keep every SM's load queue full; far larger buffers than the L2 cache.
  const int blocks = prop.multiProcessorCount * 8;
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  ReadBandwidth r;
  r.hbm_buffer_bytes = int64_t(std::min<size_t>(size_t(2) << 30, free_b / 4) / 4096 * 4096);
  r.host_buffer_bytes = int64_t(1) << 30;
  unsigned* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(unsigned) * size_t(blocks)), "cudaMalloc (sink)");

  void* dev = nullptr;
  check(cudaMalloc(&dev, size_t(r.hbm_buffer_bytes)), "cudaMalloc (HBM buffer)");
  check(cudaMemset(dev, 1, size_t(r.hbm_buffer_bytes)), "cudaMemset");
  r.hbm_read_gbps = time_reads(dev, size_t(r.hbm_buffer_bytes), seconds / 2, sink, blocks, &r.hbm_seconds);
  cudaFree(dev);

  cudaFree(sink);
  r.host_read_gbps = measure_host_read_gbps(device, r.host_buffer_bytes, seconds / 2, &r.host_seconds);
  return r;
}

double measure_host_read_gbps(int device, int64_t bytes, double seconds, double* spent) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const int blocks = prop.multiProcessorCount * 8;
  bytes = std::max<int64_t>(bytes, 1 << 20) / 4096 * 4096;
  unsigned* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(unsigned) * size_t(blocks)), "cudaMalloc (sink)");
  void* host = nullptr;
  if (const cudaError_t e = cudaHostAlloc(&host, size_t(bytes), cudaHostAllocMapped | cudaHostAllocPortable);
      e != cudaSuccess) {
    cudaFree(sink);
    check(e, "cudaHostAlloc (pinned host buffer)");
  }
  std::fill_n(static_cast<unsigned char*>(host), size_t(bytes), 1);  // first touch by this thread
  double gbps = 0, t = 0;
  void* mapped = nullptr;
  cudaError_t e = cudaHostGetDevicePointer(&mapped, host, 0);
  if (e == cudaSuccess) {
    try {
      gbps = time_reads(mapped, size_t(bytes), seconds, sink, blocks, &t);
    } catch (...) {
      cudaFreeHost(host);
      cudaFree(sink);
      throw;
    }
  }
  cudaFreeHost(host);
  cudaFree(sink);
  check(e, "cudaHostGetDevicePointer");
  if (spent) *spent = t;
  return gbps;
}

}  // namespace spill::cuda
