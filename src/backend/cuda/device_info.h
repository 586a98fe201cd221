// What GPUs this process can use. Compiled with CUDA when the CUDA backend is built; otherwise
// list_gpus() reports none.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spill {

struct GpuInfo {
  int index = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int64_t total_memory = 0, free_memory = 0;
  int multiprocessors = 0;
  int pci_bus = 0;
};

// Empty when spill was built without CUDA, no driver is present or no GPU is visible.
// why_none says which, for messages.
std::vector<GpuInfo> list_gpus(std::string* why_none = nullptr);

}  // namespace spill
