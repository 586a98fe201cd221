#include "placement/topology.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <hwloc.h>
#include <numa.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "core/strings.h"

namespace spill::placement {

namespace {

std::string cpulist(hwloc_const_bitmap_t set) {
  if (!set) return "";
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || !text) return "";
  std::string out(text);
  std::free(text);
  return out;
}

// "0000:17:00.0"
std::string bus_id(unsigned domain, unsigned bus, unsigned dev, unsigned func) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domain, bus, dev, func);
}

// NVML as the driver ships it (libnvidia-ml.so.1), loaded at run time: the CUDA toolkit spill
// builds with need not carry nvml.h, and a machine without a driver still runs spill topo.
// Only functions whose arguments are integers, strings and opaque handles are used, plus the
// PCI info struct, whose layout (NVML's nvmlPciInfo_t, v3) is checked against its own bus id.
class Nvml {
 public:
  using Device = void*;
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      why_ = "no NVIDIA driver library (libnvidia-ml.so.1)";
      return;
    }
    auto init = sym<int (*)()>("nvmlInit_v2");
    if (!init || init() != 0) {
      why_ = "NVML did not initialise (no GPU or driver not loaded)";
      return;
    }
    ok_ = true;
  }
  ~Nvml() {
    if (ok_)
      if (auto shutdown = sym<int (*)()>("nvmlShutdown")) shutdown();
    if (lib_) dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }

  template <class F>
  F sym(const char* name) const {
    return lib_ ? reinterpret_cast<F>(dlsym(lib_, name)) : nullptr;
  }

  unsigned count() const {
    unsigned n = 0;
    auto f = sym<int (*)(unsigned*)>("nvmlDeviceGetCount_v2");
    return f && f(&n) == 0 ? n : 0;
  }
  Device device(unsigned i) const {
    Device d = nullptr;
    auto f = sym<int (*)(unsigned, Device*)>("nvmlDeviceGetHandleByIndex_v2");
    return f && f(i, &d) == 0 ? d : nullptr;
  }
  // Bus id of a device, or of the far end of an NVLink (link >= 0).
  std::string pci_bus_id(Device d, int link = -1) const {
    struct PciInfo {  // nvmlPciInfo_t
      char bus_id_legacy[16];
      unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
      char bus_id[32];
      char slack[64];  // in case a later NVML grows the struct
    } info{};
    int rc = -1;
    if (link < 0) {
      if (auto f = sym<int (*)(Device, PciInfo*)>("nvmlDeviceGetPciInfo_v3")) rc = f(d, &info);
    } else if (auto f = sym<int (*)(Device, unsigned, PciInfo*)>("nvmlDeviceGetNvLinkRemotePciInfo_v2")) {
      rc = f(d, unsigned(link), &info);
    }
    if (rc != 0) return "";
    info.bus_id[31] = 0;
    const std::string from_fields = bus_id(info.domain, info.bus, info.device, 0);
    const std::string text = ascii_lower(info.bus_id);
    // NVML writes "00000000:17:00.0" (8-digit domain); compare the bus:device part.
    if (text.size() < 7 || text.substr(text.size() - 7, 5) != from_fields.substr(from_fields.size() - 7, 5)) return "";
    return from_fields;
  }
  std::string name(Device d) const {
    char buf[96] = {};
    auto f = sym<int (*)(Device, char*, unsigned)>("nvmlDeviceGetName");
    return f && f(d, buf, sizeof buf) == 0 ? std::string(buf) : "";
  }
  int uint_query(const char* fn, Device d) const {
    unsigned v = 0;
    auto f = sym<int (*)(Device, unsigned*)>(fn);
    return f && f(d, &v) == 0 ? int(v) : -1;
  }
  std::string cpu_affinity(Device d) const {
    unsigned long set[16] = {};
    auto f = sym<int (*)(Device, unsigned, unsigned long*)>("nvmlDeviceGetCpuAffinity");
    if (!f || f(d, 16, set) != 0) return "";
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    for (unsigned i = 0; i < 16; ++i) hwloc_bitmap_set_ith_ulong(b, i, set[i]);
    std::string out = cpulist(b);
    hwloc_bitmap_free(b);
    return out;
  }
  void memory(Device d, int64_t& total, int64_t& free_bytes) const {
    struct {
      unsigned long long total, free, used;
    } m{};
    auto f = sym<int (*)(Device, void*)>("nvmlDeviceGetMemoryInfo");
    if (f && f(d, &m) == 0) total = int64_t(m.total), free_bytes = int64_t(m.free);
  }
  bool nvlink_active(Device d, unsigned link) const {
    int state = 0;
    auto f = sym<int (*)(Device, unsigned, int*)>("nvmlDeviceGetNvLinkState");
    return f && f(d, link, &state) == 0 && state == 1;
  }

 private:
  void* lib_ = nullptr;
  bool ok_ = false;
  std::string why_;
};

}  // namespace

Topology discover_topology() {
  Topology t;
  // Host: NUMA nodes and their CPUs from hwloc; free memory from libnuma.
  hwloc_topology_t topo = nullptr;
  std::map<std::string, GpuTopology> by_bus;
  if (hwloc_topology_init(&topo) == 0) {
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo) == 0) {
      const int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
      for (int i = 0; i < n; ++i) {
        hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, unsigned(i));
        NumaNode nn{.id = int(node->os_index), .cpus = cpulist(node->cpuset),
                    .total_bytes = int64_t(node->attr->numanode.local_memory)};
        if (numa_available() >= 0) {
          long long free_b = -1;
          if (numa_node_size64(nn.id, &free_b) > 0) nn.free_bytes = free_b;
        }
        t.nodes.push_back(nn);
      }
      // NVIDIA display / 3D controllers (vendor 0x10de, class 0x03xx) on the PCI tree.
      for (hwloc_obj_t pci = hwloc_get_next_pcidev(topo, nullptr); pci; pci = hwloc_get_next_pcidev(topo, pci)) {
        const auto& a = pci->attr->pcidev;
        if (a.vendor_id != 0x10de || (a.class_id >> 8) != 0x03) continue;
        GpuTopology g;
        g.pci_bus_id = bus_id(a.domain, a.bus, a.dev, a.func);
        g.pcie_link_gbps = a.linkspeed;
        hwloc_obj_t host = hwloc_get_non_io_ancestor_obj(topo, pci);
        if (host && host->nodeset && hwloc_bitmap_weight(host->nodeset) == 1) g.numa_node = hwloc_bitmap_first(host->nodeset);
        if (host) g.cpu_affinity = cpulist(host->cpuset);
        by_bus[g.pci_bus_id] = g;
      }
    }
    hwloc_topology_destroy(topo);
  }

  // GPU details from NVML, joined with hwloc's view by PCI bus id.
  Nvml nvml;
  if (nvml.ok()) {
    t.gpu_source = "NVML (driver) and hwloc";
    std::vector<std::pair<Nvml::Device, std::string>> devices;
    for (unsigned i = 0; i < nvml.count(); ++i) {
      Nvml::Device d = nvml.device(i);
      if (!d) continue;
      std::string id = nvml.pci_bus_id(d);
      if (id.empty()) id = fmt::format("nvml:{}", i);
      GpuTopology& g = by_bus[id];
      g.pci_bus_id = id;
      g.name = nvml.name(d);
      g.pcie_gen = std::max(0, nvml.uint_query("nvmlDeviceGetCurrPcieLinkGeneration", d));
      g.pcie_width = std::max(0, nvml.uint_query("nvmlDeviceGetCurrPcieLinkWidth", d));
      g.pcie_max_gen = std::max(0, nvml.uint_query("nvmlDeviceGetMaxPcieLinkGeneration", d));
      g.pcie_max_width = std::max(0, nvml.uint_query("nvmlDeviceGetMaxPcieLinkWidth", d));
      const int node = nvml.uint_query("nvmlDeviceGetNumaNodeId", d);
      if (node >= 0 && g.numa_node < 0) g.numa_node = node;
      const std::string aff = nvml.cpu_affinity(d);
      if (!aff.empty()) g.cpu_affinity = aff;
      nvml.memory(d, g.memory_total, g.memory_free);
      for (unsigned link = 0; link < 18; ++link)  // NVML_NVLINK_MAX_LINKS
        if (nvml.nvlink_active(d, link)) {
          ++g.nvlinks_active;
          const std::string peer = nvml.pci_bus_id(d, int(link));
          if (!peer.empty() && std::find(g.nvlink_peers.begin(), g.nvlink_peers.end(), peer) == g.nvlink_peers.end())
            g.nvlink_peers.push_back(peer);
        }
    }
  } else {
    t.gpu_source = by_bus.empty() ? "no NVIDIA GPU on the PCI bus; " + nvml.why()
                                  : "hwloc PCI only (" + nvml.why() + ")";
  }
  for (auto& [id, g] : by_bus) t.gpus.push_back(g);
  return t;
}

void check_topology(Topology& t, const std::vector<int64_t>& host_bytes_per_gpu) {
  std::vector<int> nodes;
  for (const GpuTopology& g : t.gpus)
    if (g.numa_node >= 0 && std::find(nodes.begin(), nodes.end(), g.numa_node) == nodes.end()) nodes.push_back(g.numa_node);
  if (nodes.size() > 1)
    t.warnings.push_back(fmt::format(
        "the GPUs sit on {} different NUMA nodes: a GPU reading host experts across the CPU interconnect is slower (the "
        "reference deployment ran 1.17x-1.51x slower this way); keep each GPU's host experts on its own node",
        nodes.size()));
  std::map<int, int64_t> share;
  for (size_t i = 0; i < host_bytes_per_gpu.size() && i < t.gpus.size(); ++i)
    share[t.gpus[i].numa_node] += host_bytes_per_gpu[i];
  for (const auto& [node, bytes] : share) {
    for (const NumaNode& n : t.nodes)
      if (n.id == node && n.free_bytes >= 0 && n.free_bytes < bytes)
        t.warnings.push_back(fmt::format("NUMA node {} has {:.1f} GiB free but its GPUs' host share is {:.1f} GiB", node,
                                         double(n.free_bytes) / double(int64_t(1) << 30), double(bytes) / double(int64_t(1) << 30)));
  }
  int64_t total_share = 0, total_free = 0;
  for (int64_t b : host_bytes_per_gpu) total_share += b;
  for (const NumaNode& n : t.nodes) total_free += std::max<int64_t>(0, n.free_bytes);
  if (total_share > 0 && !t.nodes.empty() && total_free < total_share)
    t.warnings.push_back(fmt::format("the plan's host share is {:.1f} GiB but the NUMA nodes have {:.1f} GiB free in all",
                                     double(total_share) / double(int64_t(1) << 30), double(total_free) / double(int64_t(1) << 30)));
  if (t.gpus.size() > 1 && !t.collectives.empty() && !t.collectives_ok)
    t.warnings.push_back(fmt::format("{} GPUs but no NCCL ({}): plans over several GPUs need it", t.gpus.size(),
                                     t.collectives));
  if (host_bytes_per_gpu.size() > t.gpus.size())
    t.warnings.push_back(fmt::format("the plan names {} GPUs but {} are visible", host_bytes_per_gpu.size(), t.gpus.size()));
}

std::string format_topology(const Topology& t) {
  std::string out = "NUMA nodes:\n";
  out += fmt::format("  {:<6}{:<24}{:>12}{:>12}\n", "node", "CPUs", "total GiB", "free GiB");
  for (const NumaNode& n : t.nodes)
    out += fmt::format("  {:<6}{:<24}{:>12.1f}{:>12}\n", n.id, n.cpus, double(n.total_bytes) / double(int64_t(1) << 30),
                       n.free_bytes >= 0 ? fmt::format("{:.1f}", double(n.free_bytes) / double(int64_t(1) << 30)) : "?");
  out += fmt::format("GPUs ({}):\n", t.gpu_source);
  if (t.gpus.empty()) {
    out += "  none: CPU side only\n";
  } else {
    out += fmt::format("  {:<14}{:<26}{:>6}{:>12}{:>12}{:>6}  {:<16}{:>10}{:>10}{:>12}{:>12}\n", "PCI", "name", "cuda",
                       "PCIe now", "PCIe max", "NUMA", "CPUs", "mem GiB", "NVLinks", "HBM GB/s", "host GB/s");
    for (const GpuTopology& g : t.gpus) {
      auto link = [](int gen, int width) { return gen > 0 ? fmt::format("Gen{} x{}", gen, width) : std::string("?"); };
      out += fmt::format("  {:<14}{:<26}{:>6}{:>12}{:>12}{:>6}  {:<16}{:>10}{:>10}{:>12}{:>12}\n", g.pci_bus_id,
                         g.name.empty() ? "?" : g.name, g.cuda_device >= 0 ? std::to_string(g.cuda_device) : "-",
                         link(g.pcie_gen, g.pcie_width), link(g.pcie_max_gen, g.pcie_max_width),
                         g.numa_node >= 0 ? std::to_string(g.numa_node) : "?", g.cpu_affinity.empty() ? "?" : g.cpu_affinity,
                         g.memory_total ? fmt::format("{:.1f}", double(g.memory_total) / double(int64_t(1) << 30)) : "?",
                         g.nvlinks_active, g.hbm_read_gbps > 0 ? fmt::format("{:.0f}", g.hbm_read_gbps) : "-",
                         g.host_read_gbps > 0 ? fmt::format("{:.1f}", g.host_read_gbps) : "-");
      if (!g.nvlink_peers.empty()) out += fmt::format("    NVLink to {}\n", fmt::join(g.nvlink_peers, ", "));
    }
  }
  if (!t.collectives.empty()) out += fmt::format("collectives: {}\n", t.collectives);
  for (const std::string& w : t.warnings) out += "warning: " + w + "\n";
  return out;
}

std::string topology_to_json(const Topology& t) {
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array(), gpus = nlohmann::ordered_json::array();
  for (const NumaNode& n : t.nodes)
    nodes.push_back({{"node", n.id}, {"cpus", n.cpus}, {"total_bytes", n.total_bytes}, {"free_bytes", n.free_bytes}});
  for (const GpuTopology& g : t.gpus)
    gpus.push_back({{"pci_bus_id", g.pci_bus_id},        {"name", g.name},
                    {"cuda_device", g.cuda_device},      {"numa_node", g.numa_node},
                    {"cpu_affinity", g.cpu_affinity},    {"pcie_gen", g.pcie_gen},
                    {"pcie_width", g.pcie_width},        {"pcie_max_gen", g.pcie_max_gen},
                    {"pcie_max_width", g.pcie_max_width}, {"pcie_link_gbps", g.pcie_link_gbps},
                    {"memory_total", g.memory_total},    {"memory_free", g.memory_free},
                    {"nvlinks_active", g.nvlinks_active}, {"nvlink_peers", g.nvlink_peers},
                    {"hbm_read_gbps", g.hbm_read_gbps},  {"host_read_gbps", g.host_read_gbps}});
  nlohmann::ordered_json root = {{"format", "spill-topology"}, {"version", 1}, {"numa_nodes", nodes},
                                 {"gpus", gpus},               {"gpu_source", t.gpu_source},
                                 {"collectives", t.collectives}, {"warnings", t.warnings}};
  return root.dump(1) + "\n";
}

}  // namespace spill::placement
