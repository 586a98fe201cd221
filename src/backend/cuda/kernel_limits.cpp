#include "backend/cuda/kernel_limits.h"

#include <mutex>
#include <set>
#include <utility>

namespace spill::cuda {

cudaError_t allow_max_dynamic_smem(const void* kernel) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;  // (kernel, device) pairs already raised
  std::lock_guard lock(mu);
  if (done.count({kernel, device})) return cudaSuccess;
  int optin = 0;
  if (const cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      e != cudaSuccess)
    return e;
  cudaFuncAttributes attributes{};
  if (const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel); e != cudaSuccess) return e;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             optin - int(attributes.sharedSizeBytes));
  if (e == cudaSuccess) done.insert({kernel, device});
  return e;
}

}  // namespace spill::cuda
