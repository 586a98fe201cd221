// Standalone check of spill's GPU discovery on a GPU machine, without the rest of spill's
// dependencies: nvcc -std=c++17 -Isrc src/backend/cuda/device_info.cu tools/gpu/list_gpus.cpp -o list_gpus
#include <cstdio>

#include "backend/cuda/device_info.h"

int main() {
  std::string why;
  const auto gpus = spill::list_gpus(&why);
  if (gpus.empty()) std::printf("no GPUs: %s\n", why.c_str());
  for (const auto& g : gpus)
    std::printf("GPU %d: %s sm_%d%d, %lld MiB total, %lld MiB free, %d SMs, PCI bus %d\n", g.index, g.name.c_str(),
                g.compute_major, g.compute_minor, (long long)(g.total_memory >> 20), (long long)(g.free_memory >> 20),
                g.multiprocessors, g.pci_bus);
  return gpus.empty() ? 1 : 0;
}
