// list_gpus() for builds without the CUDA backend.
#ifndef SPILL_HAVE_CUDA
#include "backend/cuda/device_info.h"

namespace spill {

std::vector<GpuInfo> list_gpus(std::string* why_none) {
  if (why_none) *why_none = "spill was built without CUDA (-DSPILL_CUDA=OFF or no nvcc at configure time)";
  return {};
}

}  // namespace spill
#endif
