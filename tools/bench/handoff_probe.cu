// What a hand-over between two dependent ops costs at batch 1, and how much of it a persistent
// kernel would save: the number that decides whether spill's decode step should become one
// persistent kernel (docs/perf/NOTES.md, "Where the targets stand").
//
// A chain of P phases; phase p reads `bytes` of its own weights (independent of every other phase,
// from a ring larger than L2, so each phase's bytes come from HBM) and one value the previous phase
// wrote, and writes one value per block that the next phase reads. Two ways to run it:
//   kernels     one kernel per phase, G blocks, captured in a CUDA graph with programmatic dependent
//               launch: each kernel lets the next start at once, issues its weight loads, then waits
//               for the previous grid (griddepcontrol.wait): what spill's decode kernels do today;
//   persistent  one kernel of G blocks (one per SM, all resident) looping over the phases: each block
//               issues phase p's weight loads, then waits until all G blocks have finished phase p - 1
//               (an acquire load of that phase's counter), then reads, writes and counts itself done
//               (a release increment).
// Per row: us per phase and the weights' GB/s, for each way. The difference at 0 bytes is the cost
// of a kernel boundary over a grid-wide flag; at 1-21 MB, what is left of it once bytes stream.
//
// Usage: handoff_probe [--phases 384] [--reps 7]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/block_dot.cuh"

namespace {

using spill::cuda::allow_next_grid;
using spill::cuda::launch_overlapped;
using spill::cuda::wait_for_previous_grid;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "handoff_probe: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

constexpr int kThreads = 512;

// This block's share of a phase's weights, folded so the loads cannot be dropped (four in flight
// per thread before any is used).
__device__ __forceinline__ unsigned read_share(const uint4* w, size_t vecs) {
  unsigned acc = 0;
  size_t i = threadIdx.x;
  for (; i + 3 * kThreads < vecs; i += 4 * kThreads) {
    const uint4 a = w[i], b = w[i + kThreads], c = w[i + 2 * kThreads], d = w[i + 3 * kThreads];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < vecs; i += kThreads) {
    const uint4 a = w[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  return acc;
}

// Phase p's weights for block b: a ring of `ring_vecs` 16-byte words, each phase at its own offset.
__device__ __forceinline__ const uint4* share_of(const uint4* ring, size_t ring_vecs, size_t phase_vecs, int p, int b) {
  const size_t span = ring_vecs - phase_vecs;
  const size_t start = span == 0 ? 0 : (size_t(p) * phase_vecs) % span / 16 * 16;
  return ring + start + size_t(b) * (phase_vecs / gridDim.x);
}

__global__ void __launch_bounds__(kThreads) phase_kernel(const uint4* ring, size_t ring_vecs, size_t phase_vecs, int p,
                                                         const float* act_in, float* act_out, unsigned* sink) {
  allow_next_grid();
  // The weights do not depend on the previous phase: their loads go out before the wait.
  const unsigned acc = read_share(share_of(ring, ring_vecs, phase_vecs, p, blockIdx.x), phase_vecs / gridDim.x);
  wait_for_previous_grid();
  const float a = act_in[(blockIdx.x + 1) % gridDim.x];
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
  if (threadIdx.x == 0) act_out[blockIdx.x] = a + 1.0f;
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__global__ void __launch_bounds__(kThreads) persistent_kernel(const uint4* ring, size_t ring_vecs, size_t phase_vecs,
                                                              int phases, float* acts, unsigned* done, unsigned* sink) {
  const unsigned G = gridDim.x;
  for (int p = 0; p < phases; ++p) {
    const unsigned acc = read_share(share_of(ring, ring_vecs, phase_vecs, p, blockIdx.x), phase_vecs / G);
    if (p > 0) {
      if (threadIdx.x == 0)
        while (load_acquire(&done[p - 1]) < G) {
        }
      __syncthreads();
    }
    const float a = acts[size_t(p) * G + (blockIdx.x + 1) % G];
    if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
    if (threadIdx.x == 0) {
      acts[size_t(p + 1) * G + blockIdx.x] = a + 1.0f;
      add_release(&done[p], 1u);
    }
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int phases = 384, reps = 7;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--phases") && i + 1 < argc) phases = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--phases 384] [--reps 7]\n", argv[0]);
      return 2;
    }
  }
  if (phases < 2 || reps < 1) {
    std::fprintf(stderr, "--phases must be at least 2 and --reps at least 1\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("handoff_probe: no CUDA device; nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const int G = prop.multiProcessorCount;  // one block per SM: all resident, as the persistent kernel needs
  const size_t ring_bytes = size_t(1) << 30;
  const size_t ring_vecs = ring_bytes / 16;
  uint4* ring = nullptr;
  float* acts = nullptr;
  unsigned *done = nullptr, *sink = nullptr;
  check(cudaMalloc(&ring, ring_bytes), "cudaMalloc ring");
  check(cudaMemset(ring, 1, ring_bytes), "cudaMemset ring");
  check(cudaMalloc(&acts, sizeof(float) * size_t(phases + 1) * G), "cudaMalloc acts");
  check(cudaMemset(acts, 0, sizeof(float) * size_t(phases + 1) * G), "cudaMemset acts");
  check(cudaMalloc(&done, sizeof(unsigned) * size_t(phases)), "cudaMalloc done");
  check(cudaMalloc(&sink, sizeof(unsigned) * size_t(G)), "cudaMalloc sink");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t t0, t1;
  check(cudaEventCreate(&t0), "cudaEventCreate");
  check(cudaEventCreate(&t1), "cudaEventCreate");

  std::printf("GPU: %s, %d SMs; %d phases of one grid of %d blocks x %d threads; weights from a 1 GiB ring\n",
              prop.name, G, phases, G, kThreads);
  std::printf("| MB per phase | kernels + PDL, us/phase | GB/s | persistent, us/phase | GB/s | saved us/phase |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (double mb : {0.0, 1.0, 4.0, 11.2, 21.2}) {
    const size_t phase_vecs = std::max<size_t>(size_t(G), size_t(mb * 1e6 / 16) / size_t(G) * size_t(G));
    const size_t vecs = mb == 0.0 ? 0 : phase_vecs;
    // kernels: one graph of `phases` launches.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    for (int p = 0; p < phases; ++p)
      check(launch_overlapped(phase_kernel, dim3(G), dim3(kThreads), 0, stream, ring, ring_vecs, vecs, p,
                              acts + size_t(p) * G, acts + size_t(p + 1) * G, sink),
            "phase launch");
    check(cudaStreamEndCapture(stream, &graph), "end capture");
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    std::vector<float> k_ms, p_ms;
    for (int r = 0; r < reps + 1; ++r) {
      check(cudaEventRecord(t0, stream), "record");
      check(cudaGraphLaunch(exec, stream), "graph launch");
      check(cudaEventRecord(t1, stream), "record");
      check(cudaEventSynchronize(t1), "sync");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, t0, t1), "elapsed");
      if (r > 0) k_ms.push_back(ms);  // the first replay warms up
    }
    for (int r = 0; r < reps + 1; ++r) {
      check(cudaMemsetAsync(done, 0, sizeof(unsigned) * size_t(phases), stream), "clear counters");
      check(cudaEventRecord(t0, stream), "record");
      persistent_kernel<<<G, kThreads, 0, stream>>>(ring, ring_vecs, vecs, phases, acts, done, sink);
      check(cudaGetLastError(), "persistent launch");
      check(cudaEventRecord(t1, stream), "record");
      check(cudaEventSynchronize(t1), "sync");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, t0, t1), "elapsed");
      if (r > 0) p_ms.push_back(ms);
    }
    const double k_us = median(k_ms) * 1e3 / phases, p_us = median(p_ms) * 1e3 / phases;
    const double bytes = double(vecs) * 16;
    std::printf("| %.1f | %.2f | %.0f | %.2f | %.0f | %.2f |\n", mb, k_us, bytes / (k_us * 1e-6) / 1e9, p_us,
                bytes / (p_us * 1e-6) / 1e9, k_us - p_us);
    check(cudaGraphExecDestroy(exec), "destroy exec");
    check(cudaGraphDestroy(graph), "destroy graph");
  }
  // The chain's values are checked: every phase added one to what its neighbour had, in both ways.
  std::vector<float> last(static_cast<size_t>(G));
  check(cudaMemcpy(last.data(), acts + size_t(phases) * G, sizeof(float) * size_t(G), cudaMemcpyDeviceToHost), "copy");
  for (int b = 0; b < G; ++b)
    if (last[size_t(b)] != float(phases)) {
      std::fprintf(stderr, "handoff_probe: block %d ended the chain at %g, not %d: a hand-over lost an update\n", b,
                   double(last[size_t(b)]), phases);
      return 1;
    }
  std::printf("chain values check: every block ended at %d\n", phases);
  return 0;
}
