#include <cuda_runtime.h>

#include "backend/cuda/device_info.h"

namespace spill {

std::vector<GpuInfo> list_gpus(std::string* why_none) {
  std::vector<GpuInfo> gpus;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why_none) {
      // Without a driver the runtime says "driver version is insufficient": name the likely cause.
      const bool no_driver = err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice;
      *why_none = std::string(no_driver ? "no NVIDIA driver or GPU found" : "CUDA error") + " (CUDA: " +
                  cudaGetErrorString(err) + ")";
    }
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return gpus;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = prop.name;
    g.compute_major = prop.major;
    g.compute_minor = prop.minor;
    g.total_memory = int64_t(prop.totalGlobalMem);
    g.multiprocessors = prop.multiProcessorCount;
    g.pci_bus = prop.pciBusID;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      g.free_memory = int64_t(free_b);
    gpus.push_back(g);
  }
  if (gpus.empty() && why_none) *why_none = "no CUDA device is visible";
  return gpus;
}

}  // namespace spill
