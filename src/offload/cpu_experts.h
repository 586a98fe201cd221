// Host experts computed by the CPU while the GPU reads the others over PCIe (docs/offload.md,
// "Host experts on the CPU and over PCIe at once").
//
// A host byte reaches the GPU at the link's rate (30-50 GB/s); the CPU reads the same DRAM at
// 60-100 GB/s. So a share of each layer's host experts is given to the CPU: a static choice per
// expert made at start-up (cpu_expert_split), so that a (token, expert) pair is always computed by the
// same side whatever else is in the batch (batch invariance holds without the CPU's kernels being
// bit-identical to the GPU's).
//
// Per decode call of a MoE layer (cuda::CpuExperts): the GPU's gate/up kernel writes the call's rows,
// ids and weights into a channel in mapped pinned memory and raises the call's number; one thread
// here (bound to the GPU's NUMA node, with a pool of workers it made there) sees it, runs the CPU
// runner's int8 expert path (cpu::moe_expert_outputs) for the pairs routed to its experts, writes each
// pair's weight * E(x) row back into the channel and raises `done`; the GPU's combine kernel waits
// for that and adds all pairs in slot order. The GPU's own experts, in VRAM and in host RAM, run
// meanwhile. No host synchronisation enters the step (it may be a CUDA graph replay).
//
// Ownership: CpuExperts owns the channel (cudaHostAlloc, mapped), the device masks and counter, and
// its thread; the expert bytes are the ExpertStore's (it must outlive this object). CUDA builds only.
#pragma once
#if SPILL_HAVE_CUDA
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/moe.h"
#include "core/thread_pool.h"

namespace spill::offload {

class ExpertStore;

// Which of a layer's host experts the CPU computes: `share` of them (0..1), spread evenly over the
// layer's host experts in index order (without a profile every expert is equally likely).
std::vector<uint8_t> cpu_expert_split(const std::vector<uint8_t>& on_host, double share);

// `--cpu-experts auto`: every host expert to the CPU (1) when its rate alone beats the link's alone
// by kAutoCpuMargin, else none (0). Not a balance of the two: measured on an H100 host
// (docs/perf/cpu-experts-2026-12-07.md), the CPU streaming host DRAM slows the GPU's in-place reads
// of the same DRAM so much that any split ran slower than either side alone.
inline constexpr double kAutoCpuMargin = 1.15;
double auto_cpu_share(double cpu_gbps, double link_gbps);

struct CpuExpertsOptions;
// How fast the CPU threads compute host experts at batch 1 (GB/s of expert bytes): one token
// through top_k of layer `model_layer`'s host experts, on the threads and node `options` give; the
// best of five windows of at least 20 ms after a warm-up (~120 ms; the best, because what else runs
// on the host only ever slows a window). 0 when the layer has too few host experts.
double measure_cpu_expert_gbps(const ExpertStore& store, int64_t model_layer, const CpuExpertsOptions& options);

struct CpuExpertsOptions {
  int cuda_device = 0;
  int threads = 0;        // CPU threads computing experts; <= 0: the GPU node's cores less two
  int numa_node = -2;     // -2: the GPU's node; -1: not bound
  uint64_t timeout_ns = 10'000'000'000ull;  // a GPU wait longer than this gives up (an error)
};

class CpuExperts {
 public:
  // layers: the runner's MoE layers in order, each the model layer index into `store`, and per
  // layer the CPU's experts (cpu_expert_split; empty or all zero: the GPU computes every expert of
  // that layer). Starts the thread. Throws spill::Error on failure.
  static std::unique_ptr<CpuExperts> start(const ExpertStore& store, const std::vector<int64_t>& model_layers,
                                           const std::vector<std::vector<uint8_t>>& cpu_experts,
                                           const CpuExpertsOptions& options);
  ~CpuExperts();
  CpuExperts(const CpuExperts&) = delete;
  CpuExperts& operator=(const CpuExperts&) = delete;

  // The MoeArgs::cpu of MoE layer `moe_index` (mask null where the CPU has none of its experts).
  cuda::CpuExperts args(int64_t moe_index) const;
  // After a step: throws spill::Error if a GPU wait timed out or the CPU thread failed (the step's
  // output is void, and the runner fails; the engine then ends every open request with an error).
  void check() const;

  int threads() const { return threads_; }
  int numa_node() const { return numa_node_; }
  int64_t cpu_experts() const { return n_cpu_experts_; }
  int64_t cpu_expert_bytes() const { return cpu_expert_bytes_; }
  // Calls served and pairs computed so far, and the CPU's time in them (for rates in logs).
  struct Counters {
    uint64_t calls = 0, pairs = 0, bytes = 0;
    double busy_seconds = 0;
  };
  Counters counters() const;
  std::string describe() const;

  // What the thread knows of one MoE layer.
  // Made by cpu_layer; movable, not copyable (views points into mats).
  struct Layer {
    cuda::MoeShape shape{};
    std::vector<cuda::ExpertWeights> host;  // host addresses, [n_experts]
    std::vector<uint8_t> cpu;               // [n_experts]: 1 where the CPU computes the expert
    std::vector<TensorView> mats;           // gate, up, down of each expert with host addresses
    std::vector<cpu::ExpertView> views;     // [n_experts], into mats: cpu::moe_expert_outputs's experts
    Layer() = default;
    Layer(Layer&&) = default;
    Layer& operator=(Layer&&) = default;
    Layer(const Layer&) = delete;
    Layer& operator=(const Layer&) = delete;
  };

 private:
  CpuExperts() = default;
  void run();  // the thread

  int device_ = 0, threads_ = 0, numa_node_ = -1;
  uint64_t timeout_ns_ = 0;
  int64_t hidden_ = 0, top_k_ = 0, n_experts_ = 0;
  std::vector<Layer> layers_;
  int64_t n_cpu_experts_ = 0, cpu_expert_bytes_ = 0;
  void* channel_host_ = nullptr;  // cudaHostAlloc: header, x, ids, weights, rows
  void* channel_dev_ = nullptr;
  size_t x_off_ = 0, ids_off_ = 0, weights_off_ = 0, rows_off_ = 0;
  void* device_mem_ = nullptr;  // cudaMalloc: masks [moe layers][words], then the call counter
  int64_t mask_words_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::string error_;  // written by the thread before failed_
  std::atomic<uint64_t> calls_{0}, pairs_{0}, bytes_{0}, busy_ns_{0};
};

// A layer as the CPU threads see it: the experts at their host addresses (null for those not in
// host RAM; none of those may be marked in cpu).
CpuExperts::Layer cpu_layer(const cuda::MoeShape& shape, std::vector<cuda::ExpertWeights> host, std::vector<uint8_t> cpu);

// One call's CPU rows, the work of the channel's thread: for every pair q of the n tokens whose id
// is an expert with layer.cpu set, rows[q] = weights[q] * E(x[q / top_k]) (hidden floats, from
// cpu::moe_expert_outputs: the CPU runner's int8 expert path); other rows are left alone. Returns
// the expert bytes read (each expert once however many pairs it has).
int64_t cpu_expert_rows(ThreadPool& pool, const CpuExperts::Layer& layer, const float* x, int64_t n,
                        const int32_t* ids, const float* weights, float* rows);

}  // namespace spill::offload
#endif
