// The expert store: executes a StoreLayout on one GPU and owns every byte it placed.
//   - VRAM experts: one device allocation per layer, copied once at start-up.
//   - host experts read in place: the page-aligned covers of their file pages registered with the
//     driver (cudaHostRegisterMapped | cudaHostRegisterReadOnly); the pages stay the page cache's,
//     the store only pins them (no second copy in RAM). The Model keeps the mapping alive.
//   - host experts copied: one pinned allocation of exactly the layout's size on the GPU's NUMA node
//     (numa_alloc_onnode, filled on that node, then cudaHostRegisterMapped).
//   - per MoE layer a device table of cuda::ExpertWeights (device-visible addresses), the MoE
//     kernels' MoeArgs::table.
// Start-up is timed by phase and host memory measured (/proc/self/status) before and after.
// CUDA builds only (SPILL_HAVE_CUDA).
#pragma once
#if SPILL_HAVE_CUDA
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/moe.h"
#include "offload/expert_layout.h"
#include "offload/host_memory.h"
#include "offload/plan_file.h"

namespace spill::offload {

inline constexpr int kNumaNodeOfGpu = -2;

struct ExpertStoreOptions {
  int plan_gpu = 0;      // the plan's GPU whose layers this store holds
  int cuda_device = -1;  // -1: the calling thread's current device
  // Read host experts from the model file's pages where it holds them as the kernels read them.
  // Off by default for now: on the lent H200 (driver 580.159.04) cudaHostRegister of a page range
  // inside a larger read-only file mapping never returned (1 MiB registrations of a whole mapping
  // took 0.5-0.7 ms); see docs/offload.md. Copies into pinned memory are used instead.
  bool in_place = false;
  int numa_node = kNumaNodeOfGpu;  // pinned copies: the GPU's own node, -1 none (first touch), or a node id
};

// Seconds spent in each start-up phase.
struct StartupTimes {
  double plan_check = 0;     // check_plan against the model
  double layout = 0;         // /proc/self/maps and the layout
  double host_register = 0;  // registering in-place page covers and the pinned arena
  double host_alloc = 0;     // reserving the pinned arena on its node
  double host_copy = 0;      // filling it (first touch included)
  double vram_alloc = 0;
  double vram_copy = 0;
  double table_upload = 0;
  double total = 0;
};

struct ExpertStoreReport {
  int cuda_device = 0;
  int64_t moe_layers = 0;
  int64_t vram_experts = 0, vram_bytes = 0;
  int64_t host_in_place_experts = 0, host_in_place_bytes = 0, registered_bytes = 0, registrations = 0;
  int64_t host_copied_experts = 0, host_copy_bytes = 0;
  int64_t planned_host_bytes = 0;  // the plan's, for this GPU's layers
  int64_t table_bytes = 0;
  CopyReasons copy_reasons{};
  bool read_only_registration = false;  // the device takes cudaHostRegisterReadOnly
  int numa_node = -1;                   // where the pinned arena lives (-1: not bound)
  std::string pinned_allocator;         // how the arena was made
  ProcessMemory before{}, after{};      // this process before and after the build
  StartupTimes times{};

  int64_t host_bytes() const { return registered_bytes + host_copy_bytes; }
  std::string summary() const;  // a few lines for the start-up log
};

// How fast a kernel on `device` reads pinned host memory in place, measured on `bytes` of it on
// the GPU's NUMA node (where host experts go) for about `seconds`: the host ceiling the start-up
// plan's fit report and cost model use in place of a nominal figure (a PCIe Gen4 host carries
// ~30 GB/s where Gen5 carries ~50).
struct HostReadProbe {
  double gbps = 0;
  double seconds = 0;  // wall time of the probe, allocation and pinning included
  int numa_node = -1;  // where its buffer was (-1: not bound)
};
// The NUMA node the GPU's PCIe slot hangs off (sysfs), -1 when the kernel does not say.
int gpu_numa_node(int device);

HostReadProbe measure_host_reads(int device, int64_t bytes = int64_t(256) << 20, double seconds = 0.2);

class ExpertStore {
 public:
  // Checks the plan against the sources, lays the experts out and places them. Throws
  // spill::Error (a CUDA failure says which phase and what to do); nothing stays allocated then.
  static std::unique_ptr<ExpertStore> build(const ExpertSources& sources, const PlacementPlan& plan,
                                            const ExpertStoreOptions& options = {});
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  // Layer `layer`'s table in device memory: [n_experts] entries, the MoE kernels' MoeArgs::table.
  // nullptr for a dense layer or a layer of another GPU.
  const cuda::ExpertWeights* device_table(int64_t layer) const;
  // The same entries on the host (what was uploaded); empty for a layer without a table.
  const std::vector<cuda::ExpertWeights>& host_table(int64_t layer) const;
  // The layer's shape for cuda::plan_moe (hidden, width, experts, top-k, types).
  cuda::MoeShape shape(int64_t layer) const;
  // Host addresses (for CPU threads) of the layer's host experts, in the table's order; an expert
  // that is not in host RAM gets null matrices. Empty for a layer without a table.
  const std::vector<cuda::ExpertWeights>& cpu_table(int64_t layer) const;
  Home home(int64_t layer, int64_t expert) const;
  const StoreLayout& layout() const { return layout_; }
  const ExpertStoreReport& report() const { return report_; }

 private:
  ExpertStore() = default;
  struct LayerTable {
    int64_t layout_index = -1;  // into layout_.layers, -1: none
    cuda::MoeShape shape{};
    std::vector<cuda::ExpertWeights> host{};
    std::vector<cuda::ExpertWeights> cpu{};  // host addresses of the host experts
    const cuda::ExpertWeights* device = nullptr;
  };
  void release() noexcept;

  int device_ = 0;
  StoreLayout layout_;
  ExpertStoreReport report_;
  std::vector<LayerTable> tables_;          // [n_layers]
  std::vector<void*> vram_blocks_;          // cudaMalloc, one per layer with VRAM experts
  void* device_tables_ = nullptr;           // cudaMalloc, every layer's table
  std::vector<void*> registered_;           // cudaHostRegister'd in-place covers
  void* arena_ = nullptr;                   // the pinned copies
  size_t arena_bytes_ = 0;
  bool arena_numa_ = false, arena_registered_ = false;
};

}  // namespace spill::offload
#endif
