// spill topo: the machine as placement sees it (NUMA nodes, GPUs with their PCIe link, NUMA node,
// CPU affinity and NVLink), and on CUDA builds a two-second measurement of each GPU's HBM read
// bandwidth and in-place read bandwidth from pinned host memory. Without a GPU it answers for the
// CPU side and exits 0.
#include <fmt/format.h>
#include <numa.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/json_limits.h"
#include "placement/topology.h"
#ifdef SPILL_HAVE_CUDA
#include "backend/cuda/bandwidth.h"
#include "backend/cuda/collectives.h"
#endif

namespace spill::cli {

namespace {

struct TopoArgs {
  std::string json_out, plan;
  double seconds = 2.0;
  bool no_measure = false;
};

// Host bytes per GPU of a plan written by spill plan --out.
std::vector<int64_t> plan_host_bytes(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("--plan {}: cannot read it", path);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const nlohmann::json j = parse_json<nlohmann::json>(text, "--plan " + path);
  if (j.value("format", "") != "spill-placement-plan") fail("--plan {}: not a plan written by spill plan --out", path);
  std::vector<int64_t> out;
  for (const auto& g : j["gpus"]) out.push_back(g.value("host_expert_bytes", int64_t(0)));
  if (!out.empty() && j["embedding"].value("home", "") == "host") out[0] += j["embedding"].value("bytes", int64_t(0));
  return out;
}

void run_topo(const TopoArgs& a) {
  placement::Topology topo = placement::discover_topology();
#ifdef SPILL_HAVE_CUDA
  const int n = a.no_measure ? 0 : cuda::cuda_device_count();
  for (int d = 0; d < n; ++d) {
    const std::string bus = cuda::cuda_pci_bus_id(d);
    placement::GpuTopology* g = nullptr;
    for (placement::GpuTopology& t : topo.gpus)
      if (!bus.empty() && t.pci_bus_id == bus) g = &t;
    if (!g) {
      placement::GpuTopology seen;  // visible to CUDA but not on hwloc's PCI tree (containers)
      seen.pci_bus_id = bus.empty() ? "cuda:" + std::to_string(d) : bus;
      topo.gpus.push_back(seen);
      g = &topo.gpus.back();
    }
    g->cuda_device = d;
    // The host buffer goes on the GPU's own NUMA node, as host experts will.
    const bool bind = g->numa_node >= 0 && numa_available() >= 0;
    if (bind) {
      numa_run_on_node(g->numa_node);
      numa_set_preferred(g->numa_node);
    }
    std::fprintf(stderr, "spill topo: measuring GPU %d (%s) for %.1f s\n", d, g->pci_bus_id.c_str(), a.seconds);
    const cuda::ReadBandwidth r = cuda::measure_read_bandwidth(d, a.seconds);
    if (bind) {
      numa_run_on_node(-1);
      numa_set_localalloc();
    }
    g->hbm_read_gbps = r.hbm_read_gbps;
    g->host_read_gbps = r.host_read_gbps;
  }
  if (n == 0 && !a.no_measure) topo.gpu_source += "; no CUDA device visible, bandwidth not measured";
  const cuda::NcclInfo nccl = cuda::nccl_info();
  topo.collectives_ok = nccl.ok;
  topo.collectives = nccl.ok ? fmt::format("NCCL {} ({})", nccl.version, nccl.path) : "none: " + nccl.why;
#else
  topo.gpu_source += "; built without CUDA, bandwidth not measured";
#endif
  placement::check_topology(topo, a.plan.empty() ? std::vector<int64_t>{} : plan_host_bytes(a.plan));
  std::fputs(placement::format_topology(topo).c_str(), stdout);
  if (!a.json_out.empty()) {
    std::ofstream out(a.json_out, std::ios::trunc);
    if (!out) fail("--json {}: cannot write it", a.json_out);
    out << placement::topology_to_json(topo);
    std::printf("topology written to %s (spill plan --topo %s takes its bandwidth figures)\n", a.json_out.c_str(),
                a.json_out.c_str());
  }
}

}  // namespace

void add_topo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("topo",
                                 "NUMA nodes, GPUs (PCIe, NUMA node, CPU affinity, NVLink) and each GPU's HBM and in-place "
                                 "host read bandwidth");
  auto a = std::make_shared<TopoArgs>();
  cmd->add_option("--json", a->json_out, "also write the figures as JSON (for spill plan --topo)");
  cmd->add_option("--plan", a->plan, "check that each GPU's NUMA node has free memory for this plan's host share");
  cmd->add_option("--seconds", a->seconds, "measurement time per GPU")->capture_default_str();
  cmd->add_flag("--no-measure", a->no_measure, "skip the bandwidth measurement");
  cmd->callback([a] { run_topo(*a); });
}

}  // namespace spill::cli
