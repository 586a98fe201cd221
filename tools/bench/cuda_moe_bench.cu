// Benchmark of the CUDA decode kernels against the HBM read ceiling: the MoE expert path
// (backend/cuda/moe.h) at the S30 and S235 expert shapes (and the seed shape with --seed-shape),
// batch 1 to 8, with the expert table in VRAM and (batch 1 and 8) in mapped pinned host memory; and
// the dense Q8_0 GEMV at attention shapes. Prints a table.
//
// Method: several layers' worth of experts (random valid blocks) so that L2 (60 MB) cannot serve a
// step from the last; each step routes uniformly at random (distinct experts per token) and
// rotates to the next layer; steps are captured in one CUDA graph and replayed; time per step is
// the median replay over steps per replay. Bytes per step = the distinct routed experts' spans.
//
// Usage: cuda_moe_bench [--reps N] [--ceiling GBps] [--seed-shape] [--no-host] [--host-only] [--no-gemv]
//                       [--shape s30|s235|seed|none] [--max-batch N]   (--shape none: the GEMV table only)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/gemv.h"
#include "backend/cuda/moe.h"
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

int g_reps = 30;
bool g_seed_shape = false, g_host = true, g_gemv = true, g_host_only = false;
const char* g_only_shape = nullptr;  // "s30", "s235" or "seed": that shape alone
int g_max_batch = 8;
double g_ceiling_gbps = 4530.0;  // measured HBM read bandwidth of the H200 (issue 12)

struct Shape {
  const char* key;
  const char* name;
  int64_t hidden, width;
  int32_t experts, top_k;
  DType type;
  int layers;  // weight sets rotated through
};

// Median over reps of the graph's time, divided by steps per replay, in microseconds.
double time_graph(cudaGraphExec_t exec, cudaStream_t s, int steps, int reps) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, s));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return double(ms[ms.size() / 2]) * 1000.0 / steps;
}

__global__ void read_kernel(const uint4* p, int64_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

// HBM read bandwidth of a plain streaming read over 4 GiB, GB/s.
double measure_read_ceiling(cudaStream_t s) {
  const int64_t bytes = int64_t(4) << 30;
  void* buf;
  unsigned* sink;
  CHECK(cudaMalloc(&buf, size_t(bytes)));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(buf, 1, size_t(bytes)));
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  read_kernel<<<sms * 8, 512, 0, s>>>(static_cast<const uint4*>(buf), bytes / 16, sink);
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  const double us = time_graph(exec, s, 1, 10);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaFree(buf);
  cudaFree(sink);
  return double(bytes) / (us * 1e3);
}

struct MoeResult {
  double distinct = 0, mb = 0, us = 0, gbps = 0, host_us = 0, host_gbps = 0;
};

// One shape at one batch size: `steps` steps over the layers, each with its own random routing.
MoeResult bench_moe(const Shape& sh, int64_t batch, const std::vector<uint8_t*>& layer_spans, const uint8_t* host_pool,
                    int64_t host_pool_experts, cudaStream_t s) {
  const cuda::MoeShape shape{.hidden = sh.hidden, .width = sh.width, .n_experts = sh.experts, .top_k = sh.top_k,
                             .gate_up_type = sh.type, .down_type = sh.type};
  const cuda::MoePlan plan = cuda::plan_moe(shape, batch);
  const cuda::ExpertSpanLayout lay = cuda::expert_span_layout(shape);
  const int steps = int(layer_spans.size()) * 2;
  std::mt19937 rng(uint32_t(1000 + batch));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);

  // Per step: routing, table (VRAM), table (host pool), x, out, workspace.
  std::vector<int32_t> ids(size_t(steps * batch * sh.top_k));
  std::vector<float> weights(ids.size(), 1.0f / float(sh.top_k));
  std::vector<int32_t> order(size_t(sh.experts));
  double distinct_total = 0;
  std::vector<std::vector<int32_t>> step_experts(static_cast<size_t>(steps));
  for (int st = 0; st < steps; ++st) {
    std::set<int32_t> used;
    for (int64_t t = 0; t < batch; ++t) {
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (int j = 0; j < sh.top_k; ++j) {
        ids[size_t((st * batch + t) * sh.top_k + j)] = order[size_t(j)];
        used.insert(order[size_t(j)]);
      }
    }
    distinct_total += double(used.size());
    step_experts[size_t(st)].assign(used.begin(), used.end());
  }
  std::vector<cuda::ExpertWeights> tables(size_t(steps * sh.experts)), host_tables(tables.size());
  int64_t pool_next = 0;
  for (int st = 0; st < steps; ++st) {
    const uint8_t* base = layer_spans[size_t(st) % layer_spans.size()];
    for (int32_t e = 0; e < sh.experts; ++e) {
      const uint8_t* span = base + int64_t(e) * lay.bytes;
      tables[size_t(st * sh.experts + e)] = {span + lay.gate_offset, span + lay.up_offset, span + lay.down_offset};
    }
    // Host column: each routed expert of the step gets its own span of the pinned pool (while the
    // pool lasts, then it wraps): the same bytes per step as in VRAM, read over PCIe.
    for (int32_t e : step_experts[size_t(st)]) {
      const uint8_t* span = host_pool + (pool_next++ % host_pool_experts) * lay.bytes;
      host_tables[size_t(st * sh.experts + e)] = {span + lay.gate_offset, span + lay.up_offset, span + lay.down_offset};
    }
  }
  std::vector<float> x(size_t(batch * sh.hidden));
  for (float& v : x) v = dist(rng);

  void *d_ids, *d_w, *d_tables, *d_host_tables, *d_x, *d_out, *d_ws;
  CHECK(cudaMalloc(&d_ids, ids.size() * 4));
  CHECK(cudaMalloc(&d_w, weights.size() * 4));
  CHECK(cudaMalloc(&d_tables, tables.size() * sizeof(cuda::ExpertWeights)));
  CHECK(cudaMalloc(&d_host_tables, tables.size() * sizeof(cuda::ExpertWeights)));
  CHECK(cudaMalloc(&d_x, x.size() * 4));
  CHECK(cudaMalloc(&d_out, x.size() * 4));
  CHECK(cudaMalloc(&d_ws, size_t(plan.workspace_bytes)));
  CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_w, weights.data(), weights.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_tables, tables.data(), tables.size() * sizeof(cuda::ExpertWeights), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_host_tables, host_tables.data(), tables.size() * sizeof(cuda::ExpertWeights),
                   cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  cuda::init_moe_workspace(plan, d_ws, s);

  auto capture = [&](const void* table_base) {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int st = 0; st < steps; ++st)
      cuda::moe_experts(plan,
                        {.table = static_cast<const cuda::ExpertWeights*>(table_base) + st * sh.experts,
                         .x = static_cast<const float*>(d_x), .n = batch,
                         .ids = static_cast<const int32_t*>(d_ids) + st * batch * sh.top_k,
                         .weights = static_cast<const float*>(d_w) + st * batch * sh.top_k,
                         .out = static_cast<float*>(d_out), .workspace = d_ws},
                        s);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    cudaGraphDestroy(g);
    return exec;
  };
  MoeResult r;
  r.distinct = distinct_total / steps;
  r.mb = r.distinct * double(lay.bytes) / 1e6;
  cudaGraphExec_t exec = nullptr;
  if (!g_host_only) {
    exec = capture(d_tables);
    r.us = time_graph(exec, s, steps, g_reps);
    cudaGraphExecDestroy(exec);
    r.gbps = r.mb * 1e6 / (r.us * 1e3);
  }
  if (host_pool) {
    exec = capture(d_host_tables);
    r.host_us = time_graph(exec, s, steps, 3);
    cudaGraphExecDestroy(exec);
    r.host_gbps = r.mb * 1e6 / (r.host_us * 1e3);
  }
  CHECK(cudaGetLastError());
  for (void* p : {d_ids, d_w, d_tables, d_host_tables, d_x, d_out, d_ws}) cudaFree(p);
  return r;
}

struct GemvResult {
  double mb = 0, us = 0, gbps = 0;
};

GemvResult bench_gemv(DType type, int64_t in, int64_t out, int64_t n, cudaStream_t s) {
  const cuda::GemvPlan plan = cuda::plan_gemv(type, out, in, n);
  const int64_t bytes = out * row_bytes(type, in);
  const int copies = int(std::max<int64_t>(8, (int64_t(512) << 20) / bytes));
  std::vector<uint8_t> host(static_cast<size_t>(bytes));
  quant::fill_random_blocks(type, host.data(), bytes / dtype_traits(type).block_bytes, 5);
  std::vector<void*> w(static_cast<size_t>(copies));
  for (auto& p : w) {
    CHECK(cudaMalloc(&p, size_t(bytes)));
    CHECK(cudaMemcpy(p, host.data(), size_t(bytes), cudaMemcpyHostToDevice));
  }
  std::vector<float> x(size_t(n * in));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  void *d_x, *d_y, *d_ws;
  CHECK(cudaMalloc(&d_x, x.size() * 4));
  CHECK(cudaMalloc(&d_y, size_t(n * out) * 4));
  CHECK(cudaMalloc(&d_ws, size_t(std::max<int64_t>(plan.workspace_bytes, 16))));
  CHECK(cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  cuda::init_gemv_workspace(plan, d_ws, s);
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int c = 0; c < copies; ++c)
    cuda::gemv(plan, {.weights = w[size_t(c)], .x = d_x, .n = n, .y = static_cast<float*>(d_y), .workspace = d_ws}, s);
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  GemvResult r;
  r.mb = double(bytes) / 1e6;
  r.us = time_graph(exec, s, copies, g_reps);
  r.gbps = double(bytes) / (r.us * 1e3);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  for (void* p : w) cudaFree(p);
  for (void* p : {d_x, d_y, d_ws}) cudaFree(p);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--ceiling") && i + 1 < argc) g_ceiling_gbps = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--seed-shape")) g_seed_shape = true;
    else if (!std::strcmp(argv[i], "--no-host")) g_host = false;
    else if (!std::strcmp(argv[i], "--host-only")) g_host_only = true;  // for a profiler: host column only
    else if (!std::strcmp(argv[i], "--no-gemv")) g_gemv = false;
    else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) g_only_shape = argv[++i];
    else if (!std::strcmp(argv[i], "--max-batch") && i + 1 < argc) g_max_batch = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: cuda_moe_bench [--reps N] [--ceiling GBps] [--seed-shape] [--no-host] [--host-only] [--no-gemv]"
                   " [--shape s30|s235|seed] [--max-batch N]\n");
      return 2;
    }
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  const double read_gbps = measure_read_ceiling(s);
  std::printf("GPU: %s, %d SMs, L2 %d MB; plain streaming read here: %.0f GB/s; ceiling used: %.0f GB/s\n\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, read_gbps, g_ceiling_gbps);

  const Shape shapes[] = {
      {"s30", "S30  (H2048 I768 E128 k8 Q4_K)", 2048, 768, 128, 8, DType::Q4_K, 8},
      {"s235", "S235 (H4096 I1536 E128 k8 Q3_K)", 4096, 1536, 128, 8, DType::Q3_K, 8},
      {"seed", "seed (H5120 I2304 E384 k6 Q2_K)", 5120, 2304, 384, 6, DType::Q2_K, 4},
  };
  std::printf("MoE experts, one decode step of one layer (2 kernels per step; table in VRAM, and in mapped pinned host"
              " memory at batch 1 and 8)\n");
  std::printf("%-33s %5s %8s %9s %8s %9s %8s %7s %8s %11s %9s\n", "shape", "batch", "experts", "MB/step", "floor us",
              "us/step",
              "GB/s", "%HBM", "kernels", "host us", "host GB/s");
  for (const Shape& sh : shapes) {
    if (g_only_shape ? std::strcmp(g_only_shape, sh.key) != 0 : (sh.experts == 384 && !g_seed_shape)) continue;
    const cuda::MoeShape shape{.hidden = sh.hidden, .width = sh.width, .n_experts = sh.experts, .top_k = sh.top_k,
                               .gate_up_type = sh.type, .down_type = sh.type};
    const cuda::ExpertSpanLayout lay = cuda::expert_span_layout(shape);
    const int64_t layer_bytes = lay.bytes * sh.experts;
    std::vector<uint8_t> host(static_cast<size_t>(layer_bytes));
    std::vector<uint8_t*> layers(size_t(sh.layers));
    // One type for gate, up and down and spans without padding: the layer is one run of blocks.
    // Every layer gets the same bytes (distinct copies, so L2 still cannot serve one from another).
    quant::fill_random_blocks(sh.type, host.data(), layer_bytes / dtype_traits(sh.type).block_bytes, 1);
    for (int l = 0; l < sh.layers; ++l) {
      CHECK(cudaMalloc(&layers[size_t(l)], size_t(layer_bytes)));
      CHECK(cudaMemcpy(layers[size_t(l)], host.data(), size_t(layer_bytes), cudaMemcpyHostToDevice));
    }
    // Pinned pool for the host column: 2 steps' worth of batch-8 experts, at most.
    const int64_t pool_experts = std::min<int64_t>(sh.experts, 2 * 8 * sh.top_k);
    uint8_t* pool = nullptr;
    CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pool), size_t(pool_experts * lay.bytes), cudaHostAllocMapped));
    std::memcpy(pool, host.data(), size_t(pool_experts * lay.bytes));
    uint8_t* pool_dev = nullptr;
    CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pool_dev), pool, 0));
    for (int64_t batch = 1; batch <= g_max_batch; ++batch) {
      const bool host_column = g_host && (batch == 1 || batch == 8);
      const MoeResult r = bench_moe(sh, batch, layers, host_column ? pool_dev : nullptr, pool_experts, s);
      std::printf("%-33s %5lld %8.1f %9.2f %8.2f %9.2f %8.0f %6.1f%% %8d %11.1f %9.1f\n", sh.name, (long long)batch,
                  r.distinct, r.mb, r.mb * 1e3 / g_ceiling_gbps, r.us, r.gbps, 100.0 * r.gbps / g_ceiling_gbps,
                  cuda::kMoeLaunchesPerCall, r.host_us, r.host_gbps);
      std::fflush(stdout);
    }
    CHECK(cudaFreeHost(pool));
    for (uint8_t* p : layers) CHECK(cudaFree(p));
  }

  if (!g_gemv) {
    CHECK(cudaStreamDestroy(s));
    return 0;
  }
  std::printf("\nDense GEMV, Q8_0, y = x W^T (1 kernel; from batch 2 the tensor-core decode tile and the rounding of x: 2)\n");
  std::printf("%-22s %5s %9s %8s %9s %8s %7s\n", "in -> out", "batch", "MB", "floor us", "us", "GB/s", "%HBM");
  // S30's stacked q/k/v (2048 -> 5120), o (4096 -> 2048) and LM head (2048 -> 151936), S235's q
  // (4096 -> 8192), small ones.
  const int64_t gemv_shapes[][2] = {{2048, 5120}, {4096, 2048}, {2048, 151936}, {4096, 8192}, {2048, 4096},
                                    {4096, 512},  {2048, 512}};
  for (const auto& gs : gemv_shapes)
    for (int64_t n : {1, 2, 4, 8}) {
      const GemvResult r = bench_gemv(DType::Q8_0, gs[0], gs[1], n, s);
      char name[32];
      std::snprintf(name, sizeof name, "%lld -> %lld", (long long)gs[0], (long long)gs[1]);
      std::printf("%-22s %5lld %9.2f %8.2f %9.2f %8.0f %6.1f%%\n", name, (long long)n, r.mb,
                  r.mb * 1e3 / g_ceiling_gbps, r.us, r.gbps,
                  100.0 * r.gbps / g_ceiling_gbps);
    }
  CHECK(cudaStreamDestroy(s));
  return 0;
}
