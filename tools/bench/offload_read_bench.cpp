// Benchmark of in-place host expert reads through the expert store (src/offload/) and the MoE
// kernels: the S30 expert shape (../shared/shapes/s30.json: hidden 2048, width 768, 128 experts,
// top-8; Q4_K gate, up and down), with 0%, 30% and 100% of each layer's experts in pinned host
// memory (the store's copies), and 100% read in place from a GGUF file's registered pages, at
// batch 1..8. Per row: host and VRAM bytes a step reads (the distinct routed experts' bytes), the
// step time, the prediction host bytes / host ceiling + VRAM bytes / HBM ceiling (the nominal
// 50 GB/s and 4.53 TB/s, and the ceilings measured here by backend/cuda/bandwidth), achieved GB/s.
// Also the two ways to make pinned memory on the GPU's NUMA node, timed.
//
// Method: L layers of experts (distinct device/host copies, so L2 cannot serve a layer from the
// last); each step routes every layer's tokens uniformly at random (distinct experts per token);
// S steps with fresh ids are captured in one CUDA graph; time per step = median replay / S.
//
// Usage: offload_read_bench [--shape s30.json] [--layers 8] [--gguf-layers 4] [--steps 8] [--reps 15]
//                           [--alloc-gib 2] [--batches 1,2,4,8]
#include <cuda_runtime.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/bandwidth.h"
#include "backend/cuda/moe.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "offload/expert_store.h"
#include "quant/random_blocks.h"

using namespace spill;

#define CHECK(call)                                                                               \
  do {                                                                                            \
    cudaError_t err_ = (call);                                                                    \
    if (err_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Options {
  std::string shape_path = "../shared/shapes/s30.json";
  int layers = 8, gguf_layers = 4, steps = 8, reps = 15;
  double alloc_gib = 2;
  std::vector<int> batches{1, 2, 3, 4, 5, 6, 7, 8};
};

struct Shape {
  int64_t hidden = 2048, width = 768, experts = 128, top_k = 8;
  DType type = DType::Q4_K;
  int64_t gate_bytes() const { return width * row_bytes(type, hidden); }
  int64_t down_bytes() const { return hidden * row_bytes(type, width); }
  int64_t expert_bytes() const { return 2 * gate_bytes() + down_bytes(); }
};

Shape read_shape(const std::string& path) {
  std::ifstream in(path);
  Shape s;
  if (!in) {
    std::printf("(no %s; using S30's expert shape)\n", path.c_str());
    return s;
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str());
  s.hidden = j.at("hidden_size");
  s.width = j.at("moe_intermediate_size");
  s.experts = j.at("num_experts");
  s.top_k = j.at("num_experts_per_tok");
  return s;
}

// One layer's fused expert tensors, shared by every layer's source (the store copies each layer
// to its own place, so the layers the kernels read are distinct).
struct SourceLayer {
  std::vector<uint8_t> gate, up, down;
  explicit SourceLayer(const Shape& s) {
    gate.resize(size_t(s.experts * s.gate_bytes()));
    up.resize(gate.size());
    down.resize(size_t(s.experts * s.down_bytes()));
    const int64_t gb = s.width * s.hidden / 256, db = s.hidden * s.width / 256;
    quant::fill_random_blocks(s.type, gate.data(), s.experts * gb, 11);
    quant::fill_random_blocks(s.type, up.data(), s.experts * gb, 12);
    quant::fill_random_blocks(s.type, down.data(), s.experts * db, 13);
  }
};

offload::MoeLayerSource layer_source(const Shape& s, int64_t layer, const uint8_t* gate, const uint8_t* up,
                                     const uint8_t* down) {
  offload::MoeLayerSource ml{.layer = layer, .hidden = s.hidden, .width = s.width, .gate_up_type = s.type, .down_type = s.type};
  for (int64_t e = 0; e < s.experts; ++e)
    ml.experts.push_back({gate + e * s.gate_bytes(), up + e * s.gate_bytes(), down + e * s.down_bytes()});
  return ml;
}

offload::PlacementPlan plan_for(const Shape& s, int layers, double share) {
  return offload::uniform_plan({.n_layers = layers, .n_experts = s.experts, .top_k = s.top_k, .hidden_size = s.hidden,
                                .moe_intermediate_size = s.width, .expert_type = s.type, .expert_bytes = s.expert_bytes(),
                                .host_share = share, .seed = 5});
}

struct Ceilings {
  double hbm = 4530, host = 50;  // GB/s
};

struct Row {
  std::string placement;
  int batch = 0;
  double host_experts = 0, host_mb = 0, vram_mb = 0, us = 0, pred_nominal_us = 0, pred_measured_us = 0;
};

// Times steps of `layers` MoE calls over the store's tables at batch n.
Row time_store(const offload::ExpertStore& store, const Shape& s, int layers, int n, const Options& o) {
  const cuda::MoeShape shape = store.shape(0);
  const cuda::MoePlan plan = cuda::plan_moe(shape, n);
  std::mt19937 rng(uint32_t(1000 + n));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(size_t(n * s.hidden)), w(size_t(n * s.top_k));
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = 1.0f / float(s.top_k);
  // ids[step][layer][token][slot]; bytes per step from the distinct experts each layer routes to.
  const size_t per_call = size_t(n * s.top_k);
  std::vector<int32_t> ids(size_t(o.steps) * size_t(layers) * per_call);
  std::vector<int32_t> order(size_t(s.experts));
  double host_bytes = 0, vram_bytes = 0, host_experts = 0;
  for (int st = 0; st < o.steps; ++st)
    for (int l = 0; l < layers; ++l) {
      int32_t* call = ids.data() + (size_t(st) * size_t(layers) + size_t(l)) * per_call;
      std::set<int32_t> distinct;
      for (int t = 0; t < n; ++t) {
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        for (int64_t j = 0; j < s.top_k; ++j) call[t * s.top_k + j] = order[size_t(j)], distinct.insert(order[size_t(j)]);
      }
      for (int32_t e : distinct) {
        const bool host = store.home(l, e) != offload::Home::Vram;
        (host ? host_bytes : vram_bytes) += double(s.expert_bytes());
        host_experts += host;
      }
    }
  host_bytes /= o.steps, vram_bytes /= o.steps, host_experts /= o.steps;

  void *dx, *dw, *dids, *dout, *ws;
  CHECK(cudaMalloc(&dx, x.size() * 4));
  CHECK(cudaMalloc(&dw, w.size() * 4));
  CHECK(cudaMalloc(&dids, ids.size() * 4));
  CHECK(cudaMalloc(&dout, x.size() * 4));
  CHECK(cudaMalloc(&ws, size_t(plan.workspace_bytes)));
  CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::init_moe_workspace(plan, ws, stream);
  auto one_pass = [&] {
    for (int st = 0; st < o.steps; ++st)
      for (int l = 0; l < layers; ++l)
        cuda::moe_experts(plan,
                          {.table = store.device_table(l), .x = static_cast<float*>(dx), .n = n,
                           .ids = static_cast<int32_t*>(dids) + (size_t(st) * size_t(layers) + size_t(l)) * per_call,
                           .weights = static_cast<float*>(dw), .out = static_cast<float*>(dout), .workspace = ws},
                          stream);
  };
  one_pass();  // sets the kernels' attributes outside the capture
  CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  one_pass();
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) CHECK(cudaGraphLaunch(exec, stream));
  std::vector<float> ms;
  for (int i = 0; i < o.reps; ++i) {
    CHECK(cudaEventRecord(a, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  for (void* p : {dx, dw, dids, dout, ws}) CHECK(cudaFree(p));
  Row r;
  r.batch = n;
  r.host_experts = host_experts;
  r.host_mb = host_bytes / 1e6;
  r.vram_mb = vram_bytes / 1e6;
  r.us = double(ms[ms.size() / 2]) * 1000.0 / o.steps;
  return r;
}

void print_header() {
  std::printf("%-22s %5s %9s %9s %9s %9s %9s %7s %9s %7s %9s %9s\n", "placement", "batch", "host exp", "host MB",
              "VRAM MB", "step us", "pred us", "of pred", "pred(m)us", "of (m)", "host GB/s", "HBM GB/s");
}
void print_row(const Row& r) {
  std::printf("%-22s %5d %9.1f %9.2f %9.2f %9.1f %9.1f %6.0f%% %9.1f %6.0f%% %9.1f %9.1f\n", r.placement.c_str(), r.batch,
              r.host_experts, r.host_mb, r.vram_mb, r.us, r.pred_nominal_us, 100.0 * r.pred_nominal_us / r.us,
              r.pred_measured_us, 100.0 * r.pred_measured_us / r.us, r.host_mb * 1e-3 / (r.us * 1e-6),
              r.vram_mb * 1e-3 / (r.us * 1e-6));
}
void print_rows(const std::vector<Row>& rows) {
  print_header();
  for (const Row& r : rows) print_row(r);
}

void finish(Row& r, const std::string& name, const Ceilings& measured) {
  r.placement = name;
  r.pred_nominal_us = (r.host_mb * 1e6 / 50e9 + r.vram_mb * 1e6 / 4530e9) * 1e6;
  r.pred_measured_us = (r.host_mb * 1e6 / (measured.host * 1e9) + r.vram_mb * 1e6 / (measured.hbm * 1e9)) * 1e6;
}

// Pinned memory on node `node`, two ways: numa_alloc_onnode + touch + cudaHostRegister, and
// cudaHostAlloc (the driver's pages, wherever the calling thread's policy puts them) checked page
// by page with move_pages.
void pinned_allocation(double gib, int node) {
  const size_t bytes = size_t(gib * double(size_t(1) << 30));
  auto node_share = [&](void* p) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE)), n = std::min<size_t>(4096, bytes / page);
    std::vector<void*> pages(n);
    std::vector<int> status(n, -1);
    for (size_t i = 0; i < n; ++i) pages[i] = static_cast<char*>(p) + (i * (bytes / n)) / page * page;
    if (move_pages(0, n, pages.data(), nullptr, status.data(), 0) != 0) return -1.0;
    size_t on = 0;
    for (int s : status) on += s == node;
    return double(on) / double(n);
  };
  std::printf("\npinned host memory, %.1f GiB for NUMA node %d:\n", gib, node);
  {
    Clock::time_point t = Clock::now();
    void* p = numa_alloc_onnode(bytes, node);
    const double alloc = since(t);
    t = Clock::now();
    std::vector<std::thread> th;
    const unsigned nt = std::clamp(std::thread::hardware_concurrency() / 2, 1u, 16u);
    for (unsigned i = 0; i < nt; ++i)
      th.emplace_back([&, i] {
        numa_run_on_node(node);
        const size_t chunk = bytes / nt, begin = i * chunk, end = i + 1 == nt ? bytes : begin + chunk;
        std::memset(static_cast<char*>(p) + begin, 0, end - begin);
      });
    for (auto& x : th) x.join();
    const double touch = since(t);
    t = Clock::now();
    CHECK(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    const double reg = since(t);
    std::printf("  numa_alloc_onnode + touch (%u threads) + cudaHostRegister: %.3f + %.3f + %.3f = %.3f s, %.0f%% of "
                "sampled pages on node %d\n",
                nt, alloc, touch, reg, alloc + touch + reg, 100.0 * node_share(p), node);
    CHECK(cudaHostUnregister(p));
    numa_free(p, bytes);
  }
  {
    Clock::time_point t = Clock::now();
    void* p = nullptr;
    CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    const double alloc = since(t);
    std::printf("  cudaHostAlloc (mapped): %.3f s, %.0f%% of sampled pages on node %d (mbind afterwards cannot move "
                "pinned pages)\n",
                alloc, 100.0 * node_share(p), node);
    CHECK(cudaFreeHost(p));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a stalled run still shows how far it got
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--shape") o.shape_path = next();
    else if (a == "--layers") o.layers = std::stoi(next());
    else if (a == "--gguf-layers") o.gguf_layers = std::stoi(next());
    else if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--reps") o.reps = std::stoi(next());
    else if (a == "--alloc-gib") o.alloc_gib = std::stod(next());
    else if (a == "--batches") {
      o.batches.clear();
      std::stringstream ss(next());
      for (std::string item; std::getline(ss, item, ',');) o.batches.push_back(std::stoi(item));
    } else {
      std::fprintf(stderr, "usage: %s [--shape s30.json] [--layers N] [--gguf-layers N] [--steps N] [--reps N] "
                   "[--alloc-gib G] [--batches 1,2,4,8]\n", argv[0]);
      return 2;
    }
  }
  try {
    const Shape s = read_shape(o.shape_path);
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("offload_read_bench: %s; experts hidden %lld, width %lld, %lld experts top-%lld, Q4_K, %.2f MB each; %d "
                "layers, %d steps per graph, median of %d\n",
                prop.name, (long long)s.hidden, (long long)s.width, (long long)s.experts, (long long)s.top_k,
                double(s.expert_bytes()) / 1e6, o.layers, o.steps, o.reps);
    std::printf("measuring the ceilings...\n");
    const cuda::ReadBandwidth bw = cuda::measure_read_bandwidth(0, 1.0);
    const Ceilings measured{.hbm = bw.hbm_read_gbps, .host = bw.host_read_gbps};
    std::printf("measured ceilings: HBM read %.0f GB/s, in-place pinned host read %.1f GB/s (nominal 4530, 50)\n",
                measured.hbm, measured.host);

    const SourceLayer src(s);
    offload::ExpertSources sources{.where = "random S30 experts", .n_layers = o.layers, .top_k = s.top_k};
    for (int l = 0; l < o.layers; ++l) sources.moe_layers.push_back(layer_source(s, l, src.gate.data(), src.up.data(), src.down.data()));

    std::vector<Row> rows;
    for (double share : {0.0, 0.3, 1.0}) {
      std::printf("building the store with %.0f%% of experts on host...\n", share * 100);
      const auto store = offload::ExpertStore::build(sources, plan_for(s, o.layers, share));
      std::printf("\n%.0f%% on host (pinned copies):\n%s", share * 100, store->report().summary().c_str());
      for (int n : o.batches) {
        Row r = time_store(*store, s, o.layers, n, o);
        finish(r, fmt::format("{:.0f}% host (pinned)", share * 100), measured);
        std::printf("  row: ");
        print_row(r);
        rows.push_back(r);
      }
    }
    if (o.gguf_layers > 0) try {
      // The same experts in a GGUF file, every expert read in place from its registered pages.
      const std::string path = (std::filesystem::temp_directory_path() / ("spill-offload-bench-" + std::to_string(getpid()) + ".gguf")).string();
      Clock::time_point t = Clock::now();
      {
        gguf::Writer w;
        w.set("general.architecture", gguf::Value::string("spill-offload-bench"));
        for (int l = 0; l < o.gguf_layers; ++l) {
          const std::string blk = "blk." + std::to_string(l) + ".";
          w.add_tensor(blk + "ffn_gate_exps.weight", s.type, {s.experts, s.width, s.hidden}, src.gate.data());
          w.add_tensor(blk + "ffn_up_exps.weight", s.type, {s.experts, s.width, s.hidden}, src.up.data());
          w.add_tensor(blk + "ffn_down_exps.weight", s.type, {s.experts, s.hidden, s.width}, src.down.data());
        }
        w.write(path);
      }
      std::printf("\nGGUF of %d layers written to %s in %.2f s\n", o.gguf_layers, path.c_str(), since(t));
      {
        const auto file = gguf::GgufFile::open(path);
        offload::ExpertSources gs{.where = path, .n_layers = o.gguf_layers, .top_k = s.top_k};
        for (int l = 0; l < o.gguf_layers; ++l) {
          const std::string blk = "blk." + std::to_string(l) + ".";
          gs.moe_layers.push_back(layer_source(s, l, static_cast<const uint8_t*>(file->find(blk + "ffn_gate_exps.weight")->view.data),
                                               static_cast<const uint8_t*>(file->find(blk + "ffn_up_exps.weight")->view.data),
                                               static_cast<const uint8_t*>(file->find(blk + "ffn_down_exps.weight")->view.data)));
        }
        for (double share : {0.3, 1.0}) {
          const auto store = offload::ExpertStore::build(gs, plan_for(s, o.gguf_layers, share), {.in_place = true});
          std::printf("%.0f%% on host, in place from the GGUF:\n%s", share * 100, store->report().summary().c_str());
          for (int n : o.batches) {
            Row r = time_store(*store, s, o.gguf_layers, n, o);
            finish(r, fmt::format("{:.0f}% host (GGUF) L{}", share * 100, o.gguf_layers), measured);
            std::printf("  row: ");
            print_row(r);
            rows.push_back(r);
          }
        }
      }
      std::filesystem::remove(path);
    } catch (const Error& e) {
      std::printf("in-place run from a GGUF skipped: %s\n", e.what());
    }
    std::printf("\n");
    print_rows(rows);
    std::printf("pred: host bytes / 50 GB/s + VRAM bytes / 4530 GB/s; pred(m): the same with the measured ceilings; "
                "\"of pred\": pred / measured step time\n");
    if (o.alloc_gib > 0) {
      std::ifstream in("/sys/bus/pci/devices/" + cuda::cuda_pci_bus_id(0) + "/numa_node");
      int node = 0;
      if (!(in >> node) || node < 0) node = 0;
      if (numa_available() >= 0) pinned_allocation(o.alloc_gib, node);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
