#include "offload/cpu_experts.h"

#if SPILL_HAVE_CUDA
#include <fmt/format.h>
#include <numa.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "offload/expert_store.h"

namespace spill::offload {
namespace {

using Clock = std::chrono::steady_clock;

void cuda_ok(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) fail("CPU experts: {}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

size_t align64(size_t v) { return (v + 63) / 64 * 64; }

// Cores of a NUMA node (all of the machine's when node < 0 or libnuma cannot say).
int node_cores(int node) {
  const int all = int(std::max(1u, std::thread::hardware_concurrency()));
  if (node < 0 || numa_available() < 0) return all;
  struct bitmask* cpus = numa_allocate_cpumask();
  int n = 0;
  if (numa_node_to_cpus(node, cpus) == 0) n = int(numa_bitmask_weight(cpus));
  numa_free_cpumask(cpus);
  return n > 0 ? n : all;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

std::vector<uint8_t> cpu_expert_split(const std::vector<uint8_t>& on_host, double share) {
  std::vector<uint8_t> cpu(on_host.size(), 0);
  share = std::clamp(share, 0.0, 1.0);
  int64_t i = 0;  // index among the host experts
  for (size_t e = 0; e < on_host.size(); ++e) {
    if (!on_host[e]) continue;
    // Expert i of the host experts is the CPU's where floor((i + 1) * share) steps past floor(i * share):
    // round(share * count) of them, evenly spread.
    cpu[e] = std::floor(double(i + 1) * share + 1e-9) > std::floor(double(i) * share + 1e-9) ? 1 : 0;
    ++i;
  }
  return cpu;
}

double auto_cpu_share(double cpu_gbps, double link_gbps) {
  if (!(cpu_gbps > 0) || !(link_gbps > 0)) return 0.0;
  return cpu_gbps > kAutoCpuMargin * link_gbps ? 1.0 : 0.0;
}

CpuExperts::Layer cpu_layer(const cuda::MoeShape& shape, std::vector<cuda::ExpertWeights> host, std::vector<uint8_t> cpu) {
  CpuExperts::Layer l;
  l.shape = shape;
  l.host = std::move(host);
  l.cpu = std::move(cpu);
  const int64_t H = shape.hidden, I = shape.width;
  l.mats.reserve(3 * l.host.size());
  for (const cuda::ExpertWeights& w : l.host) {
    l.mats.push_back(TensorView::matrix(w.gate, shape.gate_up_type, I, H));
    l.mats.push_back(TensorView::matrix(w.up, shape.gate_up_type, I, H));
    l.mats.push_back(TensorView::matrix(w.down, shape.down_type, H, I));
  }
  for (size_t e = 0; e < l.host.size(); ++e) l.views.push_back({&l.mats[3 * e], &l.mats[3 * e + 1], &l.mats[3 * e + 2]});
  return l;
}

int64_t cpu_expert_rows(ThreadPool& pool, const CpuExperts::Layer& layer, const float* x, int64_t n,
                        const int32_t* ids, const float* weights, float* rows) {
  const int64_t H = layer.shape.hidden;
  int64_t bytes = 0, last = -1;
  cpu::moe_expert_outputs(pool, x, n, H, layer.shape.top_k, ids, layer.views, layer.cpu.data(),
                          [&](int64_t pair, const float* y) {
                            const float w = weights[pair];
                            float* out = rows + pair * H;
                            for (int64_t j = 0; j < H; ++j) out[j] = w * y[j];
                            if (ids[pair] != last) {  // experts come in order: each counted once
                              last = ids[pair];
                              const cpu::ExpertView& v = layer.views[size_t(last)];
                              bytes += int64_t(v.gate->nbytes() + v.up->nbytes() + v.down->nbytes());
                            }
                          });
  return bytes;
}

namespace {
int resolve_node(const CpuExpertsOptions& o) { return o.numa_node == -2 ? gpu_numa_node(o.cuda_device) : o.numa_node; }
int resolve_threads(const CpuExpertsOptions& o, int node) {
  return o.threads > 0 ? o.threads : std::max(1, node_cores(node) - 2);
}
}  // namespace

double measure_cpu_expert_gbps(const ExpertStore& store, int64_t model_layer, const CpuExpertsOptions& options) {
  const cuda::MoeShape shape = store.shape(model_layer);
  const std::vector<cuda::ExpertWeights>& host = store.cpu_table(model_layer);
  const int64_t H = shape.hidden, K = shape.top_k;
  std::vector<uint8_t> take(host.size(), 0);
  std::vector<int32_t> ids;
  for (size_t e = 0; e < host.size() && int64_t(ids.size()) < K; ++e)
    if (host[e].gate) {
      take[e] = 1;
      ids.push_back(int32_t(e));
    }
  const CpuExperts::Layer l = cpu_layer(shape, host, std::move(take));
  if (int64_t(ids.size()) < K) return 0.0;
  std::vector<float> x(static_cast<size_t>(H)), weights(static_cast<size_t>(K), 1.0f / float(K)), rows(static_cast<size_t>(K * H));
  for (int64_t i = 0; i < H; ++i) x[size_t(i)] = std::sin(0.1f * float(i));
  const int node = resolve_node(options);
  double gbps = 0.0;
  std::thread t([&] {
    if (node >= 0 && numa_available() >= 0) numa_run_on_node(node);
    ThreadPool pool(resolve_threads(options, node));
    for (int i = 0; i < 2; ++i) cpu_expert_rows(pool, l, x.data(), 1, ids.data(), weights.data(), rows.data());
    for (int window = 0; window < 5; ++window) {
      int64_t bytes = 0;
      const Clock::time_point t0 = Clock::now();
      int calls = 0;
      while (calls < 5 || Clock::now() - t0 < std::chrono::milliseconds(20)) {
        bytes += cpu_expert_rows(pool, l, x.data(), 1, ids.data(), weights.data(), rows.data());
        ++calls;
      }
      gbps = std::max(gbps, double(bytes) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
    }
  });
  t.join();
  return gbps;
}

std::unique_ptr<CpuExperts> CpuExperts::start(const ExpertStore& store, const std::vector<int64_t>& model_layers,
                                              const std::vector<std::vector<uint8_t>>& cpu_experts,
                                              const CpuExpertsOptions& options) {
  std::unique_ptr<CpuExperts> c(new CpuExperts());
  if (cpu_experts.size() != model_layers.size())
    fail("CPU experts: {} layers of choices for {} MoE layers (internal error)", cpu_experts.size(), model_layers.size());
  c->device_ = options.cuda_device;
  c->timeout_ns_ = options.timeout_ns;
  c->numa_node_ = resolve_node(options);
  c->threads_ = resolve_threads(options, c->numa_node_);
  for (size_t i = 0; i < model_layers.size(); ++i) {
    Layer l;
    const bool any = std::any_of(cpu_experts[i].begin(), cpu_experts[i].end(), [](uint8_t v) { return v != 0; });
    if (any) {
      l = cpu_layer(store.shape(model_layers[i]), store.cpu_table(model_layers[i]), cpu_experts[i]);
      if (l.cpu.size() != l.host.size())
        fail("CPU experts: layer {} has {} experts, the choice {} (internal error)", model_layers[i], l.host.size(), l.cpu.size());
      if (c->hidden_ == 0) c->hidden_ = l.shape.hidden, c->top_k_ = l.shape.top_k, c->n_experts_ = l.shape.n_experts;
      if (l.shape.hidden != c->hidden_ || l.shape.top_k != c->top_k_ || l.shape.n_experts != c->n_experts_)
        fail("CPU experts: MoE layers of different shapes are not supported (layer {})", model_layers[i]);
      for (size_t e = 0; e < l.cpu.size(); ++e) {
        if (!l.cpu[e]) continue;
        if (!l.host[e].gate || !l.host[e].up || !l.host[e].down)
          fail("CPU experts: expert {} of layer {} is not in host RAM; only host experts can be computed by the CPU",
               e, model_layers[i]);
        ++c->n_cpu_experts_;
        c->cpu_expert_bytes_ += cuda::expert_span_layout(l.shape).bytes;
      }
    }
    c->layers_.push_back(std::move(l));
  }
  if (c->n_cpu_experts_ == 0) return nullptr;

  // The channel: header, then the call's x, ids and weights, then the rows of its pairs.
  const int64_t T = cuda::kMoeCpuMaxTokens, H = c->hidden_, K = c->top_k_;
  c->x_off_ = align64(sizeof(cuda::CpuExpertChannel));
  c->ids_off_ = c->x_off_ + align64(size_t(T * H) * 4);
  c->weights_off_ = c->ids_off_ + align64(size_t(T * K) * 4);
  c->rows_off_ = c->weights_off_ + align64(size_t(T * K) * 4);
  const size_t bytes = c->rows_off_ + size_t(T * K * H) * 4;
  cuda_ok(cudaSetDevice(c->device_), "selecting the GPU");
  cuda_ok(cudaHostAlloc(&c->channel_host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
          fmt::format("allocating {} bytes of mapped pinned memory for the channel", bytes));
  std::memset(c->channel_host_, 0, bytes);
  cuda_ok(cudaHostGetDevicePointer(&c->channel_dev_, c->channel_host_, 0), "mapping the channel for the GPU");

  const int64_t M = int64_t(c->layers_.size());
  c->mask_words_ = (c->n_experts_ + 31) / 32;
  std::vector<uint32_t> masks(size_t(M * c->mask_words_ + 1), 0);  // then the call counter
  for (int64_t i = 0; i < M; ++i)
    for (size_t e = 0; e < c->layers_[size_t(i)].cpu.size(); ++e)
      if (c->layers_[size_t(i)].cpu[e]) masks[size_t(i * c->mask_words_) + e / 32] |= 1u << (e % 32);
  cuda_ok(cudaMalloc(&c->device_mem_, masks.size() * 4), "allocating the CPU experts' masks");
  cuda_ok(cudaMemcpy(c->device_mem_, masks.data(), masks.size() * 4, cudaMemcpyHostToDevice),
          "uploading the CPU experts' masks");

  c->thread_ = std::thread([p = c.get()] { p->run(); });
  return c;
}

CpuExperts::~CpuExperts() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (channel_host_) cudaFreeHost(channel_host_);
  if (device_mem_) cudaFree(device_mem_);
}

cuda::CpuExperts CpuExperts::args(int64_t moe_index) const {
  cuda::CpuExperts a;
  if (moe_index < 0 || moe_index >= int64_t(layers_.size()) || layers_[size_t(moe_index)].cpu.empty()) return a;
  auto* dev = static_cast<uint8_t*>(channel_dev_);
  const auto* mem = static_cast<const uint32_t*>(device_mem_);
  a.mask = mem + moe_index * mask_words_;
  a.channel = reinterpret_cast<cuda::CpuExpertChannel*>(dev);
  a.x = reinterpret_cast<float*>(dev + x_off_);
  a.ids = reinterpret_cast<int32_t*>(dev + ids_off_);
  a.weights = reinterpret_cast<float*>(dev + weights_off_);
  a.rows = reinterpret_cast<const float*>(dev + rows_off_);
  a.calls = const_cast<uint32_t*>(mem + int64_t(layers_.size()) * mask_words_);
  a.layer = int32_t(moe_index);
  a.timeout_ns = timeout_ns_;
  return a;
}

void CpuExperts::check() const {
  const auto* h = static_cast<const cuda::CpuExpertChannel*>(channel_host_);
  if (failed_.load(std::memory_order_acquire)) fail("CPU experts: {}", error_);
  if (h->gave_up != 0)
    fail("CPU experts: the GPU waited more than {:.1f} s for the CPU's expert rows of call {} and gave up; the CPU "
         "threads are stalled or the machine is overloaded (run without --cpu-experts)",
         double(timeout_ns_) / 1e9, h->gave_up);
}

CpuExperts::Counters CpuExperts::counters() const {
  return {calls_.load(), pairs_.load(), bytes_.load(), double(busy_ns_.load()) / 1e9};
}

std::string CpuExperts::describe() const {
  return fmt::format("CPU experts: {} host experts ({:.2f} GiB) computed by {} CPU threads{}, the others read over PCIe",
                     n_cpu_experts_, double(cpu_expert_bytes_) / double(1 << 30), threads_,
                     numa_node_ >= 0 ? fmt::format(" on NUMA node {}", numa_node_) : std::string());
}

void CpuExperts::run() {
  try {
    // The workers inherit this thread's node: the host experts were placed there.
    if (numa_node_ >= 0 && numa_available() >= 0) numa_run_on_node(numa_node_);
    ThreadPool pool(threads_);
    auto* base = static_cast<uint8_t*>(channel_host_);
    auto* h = reinterpret_cast<cuda::CpuExpertChannel*>(base);
    const auto* x = reinterpret_cast<const float*>(base + x_off_);
    const auto* ids = reinterpret_cast<const int32_t*>(base + ids_off_);
    const auto* weights = reinterpret_cast<const float*>(base + weights_off_);
    auto* rows = reinterpret_cast<float*>(base + rows_off_);
    uint32_t last = h->request;
    Clock::time_point active = Clock::now();
    // Spin while calls come (a decode step's host layers are tens of microseconds apart); after
    // kSpin without one, poll every kNap so an idle server does not hold a core.
    constexpr auto kSpin = std::chrono::milliseconds(20);
    constexpr auto kNap = std::chrono::microseconds(50);
    while (true) {
      const uint32_t request = h->request;
      if (request == last) {
        if (stop_.load(std::memory_order_relaxed)) break;
        if (Clock::now() - active > kSpin) std::this_thread::sleep_for(kNap);
        else cpu_relax();
        continue;
      }
      std::atomic_thread_fence(std::memory_order_acquire);  // the call's data were written before request
      const Clock::time_point t0 = Clock::now();
      const int32_t layer = h->layer, n = h->n;
      if (!failed_.load(std::memory_order_relaxed)) {
        try {
          if (layer < 0 || layer >= int32_t(layers_.size()) || layers_[size_t(layer)].cpu.empty() || n < 1 ||
              n > cuda::kMoeCpuMaxTokens)
            fail("call {} names layer {} with {} tokens (internal error)", request, layer, n);
          const int64_t bytes = cpu_expert_rows(pool, layers_[size_t(layer)], x, n, ids, weights, rows);
          int64_t pairs = 0;
          for (int64_t q = 0; q < int64_t(n) * top_k_; ++q)
            pairs += ids[q] >= 0 && ids[q] < n_experts_ && layers_[size_t(layer)].cpu[size_t(ids[q])];
          pairs_ += uint64_t(pairs);
          bytes_ += uint64_t(bytes);
        } catch (const std::exception& e) {
          error_ = e.what();
          failed_.store(true, std::memory_order_release);
        }
      }
      // Answer even after a failure, so the GPU never waits for its timeout; check() reports it.
      std::atomic_thread_fence(std::memory_order_release);
      h->done = request;
      last = request;
      active = Clock::now();
      calls_ += 1;
      busy_ns_ += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(active - t0).count());
    }
  } catch (const std::exception& e) {
    error_ = e.what();
    failed_.store(true, std::memory_order_release);
  }
}

}  // namespace spill::offload
#endif
