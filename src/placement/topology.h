// The machine as placement sees it: NUMA nodes (CPUs, free memory), GPUs (PCIe link, NUMA node,
// CPU affinity, NVLink), and the warnings that matter for host-resident experts: GPUs on
// different NUMA nodes (the reference deployment ran 1.17x-1.51x slower that way), or a node
// without free memory for the host share of a plan.
//
// Host side from hwloc (topology, PCI locality) and libnuma (free memory per node); GPU details
// from NVML, loaded from the driver at run time (libnvidia-ml.so.1), so `spill topo` answers on a
// machine without a GPU, and without a CUDA build where a driver is present. Bandwidth figures are
// filled in by the caller from backend/cuda/bandwidth (CUDA builds only).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spill::placement {

struct NumaNode {
  int id = 0;               // OS index
  std::string cpus;         // "0-15,32-47"
  int64_t total_bytes = 0;  // memory local to the node
  int64_t free_bytes = -1;  // -1: unknown
};

struct GpuTopology {
  std::string pci_bus_id;  // "0000:17:00.0", lower case
  std::string name;        // from NVML when present
  int numa_node = -1;      // -1: unknown (single-node machines report 0 or -1)
  std::string cpu_affinity;  // CPUs close to the GPU, "0-31"
  int pcie_gen = 0, pcie_width = 0;          // current link (it may idle lower)
  int pcie_max_gen = 0, pcie_max_width = 0;  // what the link can do
  double pcie_link_gbps = 0;                 // hwloc's figure for the current link, GB/s
  int64_t memory_total = 0, memory_free = 0;
  int nvlinks_active = 0;
  std::vector<std::string> nvlink_peers;  // PCI bus ids at the other end of active links
  int cuda_device = -1;                   // CUDA ordinal, when the CUDA runtime sees it
  // Measured by spill topo on CUDA builds (0: not measured).
  double hbm_read_gbps = 0, host_read_gbps = 0;
};

struct Topology {
  std::vector<NumaNode> nodes;
  std::vector<GpuTopology> gpus;
  std::string gpu_source;             // where the GPU details came from, or why there are none
  // NCCL for plans over several GPUs: "NCCL 2.28.3 (libnccl.so.2)", or why there is none ("" when
  // not looked for: a build without CUDA).
  std::string collectives;
  bool collectives_ok = false;
  std::vector<std::string> warnings;  // filled by check_topology
};

// Discovers the host (hwloc, libnuma) and the GPUs (hwloc PCI devices of NVIDIA's vendor id,
// NVML details when the driver library loads). Never throws for a missing GPU or driver.
Topology discover_topology();

// Host bytes a plan puts on the RAM of each GPU's NUMA node: host_bytes_per_gpu[i] is GPU i's.
// Adds warnings to topo: GPUs on different NUMA nodes; a node with less free memory than its
// GPUs' host share.
void check_topology(Topology& topo, const std::vector<int64_t>& host_bytes_per_gpu = {});

std::string format_topology(const Topology& topo);  // the table spill topo prints
std::string topology_to_json(const Topology& topo);

}  // namespace spill::placement
