#include "backend/cuda/moe.h"

#include <algorithm>
#include <string>

#include "backend/cuda/block_dot.cuh"
#include "backend/cuda/kernel_limits.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/mmq.cuh"
#include "core/env.h"

namespace spill::cuda {
namespace {

constexpr int kGateUpWarps = 8;  // each warp: 2 gate rows and the same 2 up rows
constexpr int kGateUpRows = kGateUpWarps * 2;
constexpr int kDownWarps = 8;    // each warp: kDownQuads x 4 rows of down, all staged at once
constexpr int kDownQuads = 2;
constexpr int kDownRows = kDownWarps * kDownQuads * kRowsPerWarp;
constexpr int kMaxExperts = 4096;
constexpr int kMaxPairs = 8192;
constexpr int kActSmemBudget = 24 * 1024;  // shared bytes for one token group's rounded activations
constexpr int kMaxSmem = 227 * 1024;       // an sm_90 block's dynamic shared memory limit

// Tokens per group: as many as kActSmemBudget holds, up to kMaxTokenGroup; 2 for the one-token
// builds (calls of up to kMaxTokenGroup tokens, whose experts mostly get one), so that more of
// their blocks fit in an SM's shared memory.
int32_t token_group_for(int64_t k_len, int64_t n) {
  int32_t g = n <= kMaxTokenGroup ? 2 : kMaxTokenGroup;
  while (g > 1 && act_q8_bytes(g, int(k_len)) > kActSmemBudget) g /= 2;
  return g;
}

// Dynamic shared bytes of each kernel: staged rows, one token group's rounded activations, the
// pair list.
// Floats of chain scratch (block_dot.cuh) the kernels of a call of n tokens give each warp.
int chain_floats_for(DType t, int64_t n) { return chain_scratch_floats(t, n <= kMaxTokenGroup ? 1 : kMaxTokenGroup); }

size_t gate_up_smem(const MoeShape& s, int64_t n, int64_t pairs) {
  return size_t(kGateUpWarps) * kRowsPerWarp * staged_row_stride(int(row_bytes(s.gate_up_type, s.hidden))) + 16 +
         size_t(kGateUpWarps) * chain_floats_for(s.gate_up_type, n) * 4 +
         size_t(act_q8_bytes(token_group_for(s.hidden, n), int(s.hidden))) + size_t(pairs) * sizeof(int);
}
size_t down_smem(const MoeShape& s, int64_t n, int64_t pairs) {
  return size_t(kDownWarps) * kDownQuads * kRowsPerWarp *
             staged_row_stride(int(row_bytes(s.down_type, s.width))) +
         16 + size_t(kDownWarps) * chain_floats_for(s.down_type, n) * 4 +
         size_t(act_q8_bytes(token_group_for(s.width, n), int(s.width))) + size_t(pairs) * sizeof(int);
}

// Calls of more than kMaxTokenGroup tokens (prefill chunks) group their pairs by expert first, in
// one small kernel, instead of every block scanning every pair (quadratic in the pairs): for E
// experts, the active keys (experts with a pair, ascending; key E stands for invalid ids), where
// each key's pairs start in `sorted`, and the pairs themselves. A pair's arithmetic never depends
// on which pairs share its expert or their order, so the grouping changes no bits.
struct PairGroups {
  int32_t* n_active;  // [1]
  int32_t* active;    // [E + 1] keys with pairs, ascending
  int32_t* start;     // [E + 2] first index in sorted of each key (start[E + 1] = pairs)
  int32_t* sorted;    // [pairs] pair indices, grouped by key
  int4* tiles;  // [mmq_tile_bound] the tensor-core kernels' token tiles, one per block row y:
                // {key (-1: the invalid ids, -2: no tile), first index in sorted, pairs, tile of its key}
};

// The tensor-core path (mmq.cuh) of grouped calls: tiles of 32 expert rows (gate and up) or 64
// rows (down) x 32 of an expert's pairs.
constexpr int kMoeWN = 2;
constexpr int kMoeTileTokens = 2 * kMoeWN * 8;
// Token tiles a call of `pairs` pairs over `keys` keys can have: one per kMoeTileTokens pairs plus
// one partial tile per key with pairs.
__host__ __device__ constexpr int mmq_tile_bound(int pairs, int keys) {
  return (pairs + kMoeTileTokens - 1) / kMoeTileTokens + (pairs < keys ? pairs : keys);
}

struct MoeParams {
  const ExpertWeights* table;
  RoundedRows x_rounded;    // the tensor-core path: x rounded per token, act per pair
  RoundedRows act_rounded;
  const float* x;
  const int32_t* ids;
  const float* weights;
  float* out;
  float* act;       // [pairs][width]: silu(gate x) * up x per (token, slot)
  float* partial;   // [pairs][hidden]: weight * down(act) per (token, slot); the tensor-core path
                    // leaves the weight to moe_combine_kernel
  int32_t* counters;  // [hidden tiles]
  uint32_t* routings;  // [n_experts] or null: += pairs routed to each expert
  uint32_t* touches;   // [n_experts] or null: += 1 for each expert with a pair
  int64_t hidden, width;
  int32_t n_experts, top_k, pairs;
  int32_t stride;   // staged row stride in shared memory
  int32_t token_group, act_bytes;  // tokens rounded to int8 at once, and their shared bytes
  bool grouped;     // pairs grouped by moe_group_kernel (groups); else each block gathers its own
  PairGroups groups;
  CpuExperts cpu;   // mask null: the GPU computes every expert
};

__device__ __forceinline__ int expert_key(int32_t id, int32_t n_experts) {
  return id >= 0 && id < n_experts ? id : -1;  // all invalid ids form one group that contributes 0
}

constexpr int kGroupThreads = 1024;
// One block: counts per key, an exclusive scan, then each pair placed at its key's next free index.
__global__ void __launch_bounds__(kGroupThreads) moe_group_kernel(MoeParams p) {
  wait_for_previous_grid();  // the ids come from the router
  allow_next_grid();
  __shared__ int32_t count[kMaxExperts + 1];
  __shared__ int32_t cursor[kMaxExperts + 1];
  __shared__ int32_t warp_total[kGroupThreads / 32], warp_tiles[kGroupThreads / 32];
  const int keys = p.n_experts + 1;
  for (int k = threadIdx.x; k < keys; k += kGroupThreads) count[k] = 0;
  __syncthreads();
  for (int q = threadIdx.x; q < p.pairs; q += kGroupThreads) {
    const int key = expert_key(p.ids[q], p.n_experts);
    atomicAdd(&count[key < 0 ? p.n_experts : key], 1);
  }
  __syncthreads();
  // Exclusive scans over keys of count and of token tiles (of the tensor-core kernels): each
  // thread a contiguous run of keys, then the runs' totals.
  auto tiles_of = [](int c) { return (c + kMoeTileTokens - 1) / kMoeTileTokens; };
  const int per = (keys + kGroupThreads - 1) / kGroupThreads;
  const int k0 = threadIdx.x * per, k1 = min(keys, k0 + per);
  int run = 0, run_tiles = 0;
  for (int k = k0; k < k1; ++k) run += count[k], run_tiles += tiles_of(count[k]);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int incl = run, incl_tiles = run_tiles;
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o), vt = __shfl_up_sync(0xffffffffu, incl_tiles, o);
    if (lane >= o) incl += v, incl_tiles += vt;
  }
  if (lane == 31) warp_total[warp] = incl, warp_tiles[warp] = incl_tiles;
  __syncthreads();
  int base = incl - run, tile = incl_tiles - run_tiles, all_tiles = 0;
  for (int w = 0; w < kGroupThreads / 32; ++w) {
    if (w < warp) base += warp_total[w], tile += warp_tiles[w];
    all_tiles += warp_tiles[w];
  }
  for (int k = k0; k < k1; ++k) {
    cursor[k] = base;
    p.groups.start[k] = base;
    // Each token tile's record, so that a tensor-core block finds its tile in one load.
    for (int t = 0; t < tiles_of(count[k]); ++t)
      p.groups.tiles[tile + t] = make_int4(k == p.n_experts ? -1 : k, base + t * kMoeTileTokens,
                                           min(kMoeTileTokens, count[k] - t * kMoeTileTokens), t);
    tile += tiles_of(count[k]);
    base += count[k];
  }
  for (int y = all_tiles + threadIdx.x; y < mmq_tile_bound(p.pairs, keys); y += kGroupThreads)
    p.groups.tiles[y] = make_int4(-2, 0, 0, 0);
  if (threadIdx.x == 0) p.groups.start[keys] = p.pairs;
  __syncthreads();
  if (threadIdx.x == 0) {
    int a = 0;
    for (int k = 0; k < keys; ++k)
      if (count[k] > 0) p.groups.active[a++] = k;
    *p.groups.n_active = a;
  }
  for (int q = threadIdx.x; q < p.pairs; q += kGroupThreads) {
    const int key = expert_key(p.ids[q], p.n_experts);
    p.groups.sorted[atomicAdd(&cursor[key < 0 ? p.n_experts : key], 1)] = q;
  }
}

// Block y's group in grouped mode: its key (-1 for invalid ids) and its pairs copied into list;
// returns the count (0: no group for this block).
__device__ int grouped_pairs(const MoeParams& p, int y, int* list, int* shared_count, int* key_out) {
  if (threadIdx.x == 0) {
    const int n_active = *p.groups.n_active;
    int m = 0, key = -1;
    if (y < n_active) {
      const int k = p.groups.active[y];
      m = p.groups.start[k + 1] - p.groups.start[k];
      key = k == p.n_experts ? -1 : k;
    }
    *shared_count = m;
    *key_out = key;
  }
  __syncthreads();
  const int m = *shared_count;
  if (m > 0) {
    const int k = *key_out < 0 ? p.n_experts : *key_out;
    const int32_t* src = p.groups.sorted + p.groups.start[k];
    for (int i = threadIdx.x; i < m; i += blockDim.x) list[i] = src[i];
  }
  __syncthreads();
  return m;
}

// The grouping, on the device: this block's expert key (from ids[pair]), whether its pair is the
// first routed to that expert, and the expert's pairs in ascending order. Warp 0 reads the ids
// once, coalesced, and scans them with ballots. Returns the count of pairs in `list` (0 when this
// block is not the first, and the caller returns); *key_out is the key.
__device__ int gather_pairs(const MoeParams& p, int pair, int* list, int* shared_count, int* key_out) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    // Both first loads go out together: one memory round trip before the scan.
    const int32_t own_id = p.ids[pair];
    const int32_t first_id = lane < p.pairs ? p.ids[lane] : -1;
    const int key = expert_key(own_id, p.n_experts);
    int count = 0;
    bool first = true;
    for (int base = 0; base < p.pairs; base += 32) {
      const int q = base + lane;
      const int32_t id = base == 0 ? first_id : (q < p.pairs ? p.ids[q] : -1);
      const bool match = q < p.pairs && expert_key(id, p.n_experts) == key;
      const unsigned mask = __ballot_sync(0xffffffffu, match);
      if (mask & (pair - base >= 32 ? 0xffffffffu : pair - base <= 0 ? 0u : (1u << (pair - base)) - 1u))
        first = false;
      if (match) list[count + __popc(mask & ((1u << lane) - 1u))] = q;
      count += __popc(mask);
    }
    if (lane == 0) {
      *shared_count = first ? count : 0;
      *key_out = key;
    }
  }
  __syncthreads();
  return *shared_count;
}

// Whether the CPU computes expert `key`'s pairs in this call.
__device__ __forceinline__ bool cpu_key(const MoeParams& p, int key) {
  return p.cpu.mask && key >= 0 && ((p.cpu.mask[key >> 5] >> (key & 31)) & 1u);
}

// System-scope flag accesses on the mapped channel: a release store goes out to host memory at once
// (a plain or volatile store may wait in the GPU's write path until the kernel ends, which would
// start the CPU only after the whole gate/up kernel), and an acquire load reads host memory anew.
__device__ __forceinline__ void store_release_sys(volatile uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const volatile uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Block (0, 0) of the gate/up kernel hands the call to the CPU threads: the token rows, ids and
// weights into the mapped channel, then (after a system-scope fence, so the CPU sees them first)
// the call's number. Every step publishes, even with no pair for the CPU, so the CPU threads and
// the combine kernel count calls alike.
__device__ void publish_for_cpu(const MoeParams& p) {
  const int n = p.pairs / p.top_k;
  for (int64_t i = threadIdx.x; i < int64_t(n) * p.hidden; i += blockDim.x) p.cpu.x[i] = p.x[i];
  for (int i = threadIdx.x; i < p.pairs; i += blockDim.x) {
    p.cpu.ids[i] = p.ids[i];
    p.cpu.weights[i] = p.weights[i];
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t call = *p.cpu.calls + 1;
    *p.cpu.calls = call;
    p.cpu.channel->layer = p.cpu.layer;
    p.cpu.channel->n = n;
    __threadfence_system();
    store_release_sys(&p.cpu.channel->request, call);
  }
}

// Thread 0 of a block: waits until the CPU has written the rows of the last published call; false
// (and the call's number in gave_up, which the runner turns into an error) after cpu.timeout_ns.
__device__ bool wait_for_cpu(const MoeParams& p) {
  const uint32_t call = *p.cpu.calls;
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (load_acquire_sys(&p.cpu.channel->done) != call) {
    __nanosleep(256);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > p.cpu.timeout_ns) {
      store_release_sys(&p.cpu.channel->gave_up, call);
      return false;
    }
  }
  __threadfence_system();  // the rows were written before done
  return true;
}

__device__ __forceinline__ float silu(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))); }

template <DType T, int NT>
__global__ void __launch_bounds__(kGateUpWarps * 32, NT == 1 ? 3 : 2) moe_gate_up_kernel(MoeParams p) {
  using U = Unit<T>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float scratch[kGateUpWarps][kRowsPerWarp][kMaxTokenGroup];
  __shared__ int count, shared_key;
  // The ids come from the router, the previous kernel: wait for it first. Then the down kernel
  // may start its prologue (fetching its weights) as this grid's blocks retire.
  wait_for_previous_grid();
  allow_next_grid();
  if (p.cpu.mask && blockIdx.x == 0 && blockIdx.y == 0) publish_for_cpu(p);
  const int staged_bytes = kGateUpWarps * kRowsPerWarp * p.stride + 16 + kGateUpWarps * chain_scratch_floats(T, NT) * 4;
  int* list = reinterpret_cast<int*>(smem + staged_bytes + p.act_bytes);
  // This pair's expert and its table entry are fetched before the scan of the ids, so the table
  // read overlaps it instead of following it (one memory round trip less before the weights).
  ExpertWeights e{};
  int m;
  if (p.grouped) {
    m = grouped_pairs(p, blockIdx.y, list, &count, &shared_key);
    if (m > 0 && shared_key >= 0) e = p.table[shared_key];
  } else {
    const int own_key = expert_key(p.ids[blockIdx.y], p.n_experts);
    if (own_key >= 0) e = p.table[own_key];
    m = gather_pairs(p, blockIdx.y, list, &count, &shared_key);
  }
  const int key = shared_key;
  if (m == 0 || key < 0) return;
  // The expert's block of row tile 0 counts it: one atomic per expert the call reads.
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (p.routings) atomicAdd(&p.routings[key], unsigned(m));
    if (p.touches) atomicAdd(&p.touches[key], 1u);
  }
  if (cpu_key(p, key)) return;  // counted above: a host expert's routings, computed by the CPU

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = int64_t(blockIdx.x) * kGateUpRows + 2 * warp;
  const bool has_rows = row0 < p.width;
  const int64_t rb = p.hidden / U::kBlockElems * U::kBlockBytes;
  const uint8_t* staged[kRowsPerWarp];
  int parts = 0;
  if (has_rows) {
    const int64_t row1 = row0 + 1 < p.width ? row0 + 1 : row0;
    const uint8_t* gate = static_cast<const uint8_t*>(e.gate);
    const uint8_t* up = static_cast<const uint8_t*>(e.up);
    const uint8_t* src[kRowsPerWarp] = {gate + row0 * rb, gate + row1 * rb, up + row0 * rb, up + row1 * rb};
    parts = stage_rows(src, int(rb), part_bytes_of<T>(), smem + warp * kRowsPerWarp * p.stride, p.stride, staged, lane);
  }
  float* chain = reinterpret_cast<float*>(smem + kGateUpWarps * kRowsPerWarp * p.stride + 16) +
                 warp * chain_scratch_floats(T, NT);
  const ActQ8 xq = act_q8_at(smem + staged_bytes, p.token_group, int(p.hidden));
  for (int i0 = 0; i0 < m; i0 += p.token_group) {
    const int tokens = min(p.token_group, m - i0);
    __syncthreads();  // the previous group's activations are no longer read
    quantize_tokens([&](int t) { return p.x + int64_t(list[i0 + t] / p.top_k) * p.hidden; }, tokens, int(p.hidden), xq,
                    [](const float* q, float v[8]) { load_x8<float>(q, v); });
    __syncthreads();
    if (!has_rows) continue;
    warp_dot_q8_group<T, NT>(staged, int(p.hidden), xq, tokens, lane, i0 == 0 ? parts : 0, 0, chain,
                             [&](int r, int t, float v) { scratch[warp][r][t] = v; });
    __syncwarp();
    if (lane < 2 * tokens) {
      const int r = lane & 1, t = lane >> 1;
      if (row0 + r < p.width)
        p.act[int64_t(list[i0 + t]) * p.width + row0 + r] =
            __fmul_rn(silu(scratch[warp][r][t]), scratch[warp][2 + r][t]);
    }
    __syncwarp();
  }
}

template <DType T, int NT>
__global__ void __launch_bounds__(kDownWarps * 32, NT == 1 ? 3 : 2) moe_down_kernel(MoeParams p) {
  using U = Unit<T>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int count, shared_key;
  __shared__ unsigned seen[kMaxExperts / 32 + 1];  // bit per expert, last word's top bit: invalid ids
  __shared__ bool last_block;
  // The ids were written before the gate/up kernel started (it waited for them), so they can be
  // read now; the weights too. Only the activations need the gate/up kernel finished.
  allow_next_grid();
  const int staged_bytes =
      kDownWarps * kDownQuads * kRowsPerWarp * p.stride + 16 + kDownWarps * chain_scratch_floats(T, NT) * 4;
  int* list = reinterpret_cast<int*>(smem + staged_bytes + p.act_bytes);
  ExpertWeights e{};
  int m;
  if (p.grouped) {
    // The groups were complete before the gate/up kernel started (it waited for them).
    m = grouped_pairs(p, blockIdx.y, list, &count, &shared_key);
    if (m > 0 && shared_key >= 0) e = p.table[shared_key];
  } else {
    const int own_key = expert_key(p.ids[blockIdx.y], p.n_experts);  // as in gate/up: the table read
    if (own_key >= 0) e = p.table[own_key];                           // overlaps the scan of the ids
    m = gather_pairs(p, blockIdx.y, list, &count, &shared_key);
  }
  const int key = shared_key;
  if (p.cpu.mask && (m == 0 || cpu_key(p, key))) {
    // The combine kernel adds the slots; it must not start before the gate/up kernel that published
    // the call has finished, so every block of this grid waits for it before leaving.
    wait_for_previous_grid();
    return;
  }
  if (m == 0) return;

  // How many blocks take part in this tile: one per distinct key among the pairs.
  const int words = (p.n_experts + 31) / 32 + 1;
  if (!p.grouped) {
    for (int i = threadIdx.x; i < words; i += blockDim.x) seen[i] = 0;
    __syncthreads();
    for (int q = threadIdx.x; q < p.pairs; q += blockDim.x) {
      const int k = expert_key(p.ids[q], p.n_experts);
      if (k < 0) atomicOr(&seen[words - 1], 1u);
      else atomicOr(&seen[k / 32], 1u << (k % 32));
    }
    __syncthreads();
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile_row0 = int64_t(blockIdx.x) * kDownRows;
  const int64_t row0 = tile_row0 + warp * kDownQuads * kRowsPerWarp;
  if (key < 0) {
    // Pairs with no valid expert contribute zero rows.
    wait_for_previous_grid();
    for (int i = threadIdx.x; i < m * kDownRows; i += blockDim.x) {
      const int64_t row = tile_row0 + i % kDownRows;
      if (row < p.hidden) p.partial[int64_t(list[i / kDownRows]) * p.hidden + row] = 0.0f;
    }
  } else {
    // Both quads of the warp's rows go out before either is decoded: twice the bytes in flight
    // for the same prologue (down rows are short: a whole row is one or two passes).
    const uint8_t* staged[kDownQuads][kRowsPerWarp];
    int parts[kDownQuads] = {};
    const int64_t rb = p.width / U::kBlockElems * U::kBlockBytes;
    const uint8_t* down = static_cast<const uint8_t*>(e.down);
#pragma unroll
    for (int qd = 0; qd < kDownQuads; ++qd) {
      const int64_t quad_row0 = row0 + qd * kRowsPerWarp;
      if (quad_row0 >= p.hidden) continue;
      const uint8_t* src[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        src[r] = down + (quad_row0 + r < p.hidden ? quad_row0 + r : quad_row0) * rb;
      parts[qd] = stage_rows(src, int(rb), part_bytes_of<T>(),
                             smem + (warp * kDownQuads + qd) * kRowsPerWarp * p.stride, p.stride, staged[qd], lane);
    }
    wait_for_previous_grid();
    float* chain = reinterpret_cast<float*>(smem + kDownWarps * kDownQuads * kRowsPerWarp * p.stride + 16) +
                   warp * chain_scratch_floats(T, NT);
    const ActQ8 xq = act_q8_at(smem + staged_bytes, p.token_group, int(p.width));
    for (int i0 = 0; i0 < m; i0 += p.token_group) {
      const int tokens = min(p.token_group, m - i0);
      __syncthreads();
      quantize_tokens([&](int t) { return p.act + int64_t(list[i0 + t]) * p.width; }, tokens, int(p.width), xq,
                      [](const float* q, float v[8]) { load_x8_coherent(q, v); });
      __syncthreads();
#pragma unroll
      for (int qd = 0; qd < kDownQuads; ++qd) {
        const int64_t quad_row0 = row0 + qd * kRowsPerWarp;
        if (quad_row0 >= p.hidden) continue;
        const int later = qd + 1 < kDownQuads && quad_row0 + kRowsPerWarp < p.hidden ? parts[qd + 1] : 0;
        warp_dot_q8_group<T, NT>(staged[qd], int(p.width), xq, tokens, lane, i0 == 0 ? parts[qd] : 0, later, chain,
                                 [&](int r, int t, float v) {
                                   const int64_t row = quad_row0 + r;
                                   const int pair = list[i0 + t];
                                   if (row < p.hidden)
                                     p.partial[int64_t(pair) * p.hidden + row] = __fmul_rn(p.weights[pair], v);
                                 });
      }
    }
  }

  if (p.cpu.mask) return;  // moe_cpu_combine_kernel adds the slots, the CPU's rows among them
  // The last of this tile's blocks adds each token's partial rows in slot order.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int participants = 0;
    if (p.grouped) participants = *p.groups.n_active;
    else
      for (int i = 0; i < words; ++i) participants += __popc(seen[i]);
    last_block = atomicAdd(&p.counters[blockIdx.x], 1) == participants - 1;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  const int n = p.pairs / p.top_k;
  for (int i = threadIdx.x; i < n * kDownRows; i += blockDim.x) {
    const int64_t row = tile_row0 + i % kDownRows, t = i / kDownRows;
    if (row >= p.hidden) continue;
    const float* part = p.partial + t * p.top_k * p.hidden + row;
    float s = __ldcg(part);
    for (int j = 1; j < p.top_k; ++j) s = __fadd_rn(s, __ldcg(part + int64_t(j) * p.hidden));
    p.out[t * p.hidden + row] = s;
  }
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
}

// Block y of a tensor-core kernel: its expert key (-1: invalid ids), which of the key's token
// tiles, and that tile's pairs in `list` (kMoeTileTokens, the tail repeating the first), from the
// tile's record (moe_group_kernel). Returns the tile's pair count (0: no tile for this block).
__device__ int mmq_tile_pairs(const MoeParams& p, int y, int* list, int* key_out, int* tile_out) {
  const int4 r = p.groups.tiles[y];  // every thread: one broadcast load
  const int m = r.x == -2 ? 0 : r.z;
  *key_out = r.x;
  *tile_out = r.w;
  if (m == 0) return 0;
  for (int i = threadIdx.x; i < kMoeTileTokens; i += blockDim.x) list[i] = p.groups.sorted[r.y + (i < m ? i : 0)];
  __syncthreads();
  return m;
}

template <DType T>
__global__ void __launch_bounds__(kMmqThreads) moe_mmq_gate_up_kernel(MoeParams p) {
  using Tile = MmqTile<T, 2, kMoeWN>;  // per warp: m-tile 0 its 16 gate rows, m-tile 1 the same up rows
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int list[kMoeTileTokens];
  // Wait before letting the next kernel start: the down kernel reads the groups before its own wait
  // (they were written before this kernel started), which holds only once this kernel has waited for
  // the grouping, its predecessor when the activations come rounded by the RMSNorm.
  wait_for_previous_grid();  // the groups and the rounded activations
  allow_next_grid();
  int key, tile;
  const int m = mmq_tile_pairs(p, blockIdx.y, list, &key, &tile);
  if (m == 0 || key < 0) return;
  if (blockIdx.x == 0 && tile == 0 && threadIdx.x == 0) {
    const int count = p.groups.start[key + 1] - p.groups.start[key];
    if (p.routings) atomicAdd(&p.routings[key], unsigned(count));
    if (p.touches) atomicAdd(&p.touches[key], 1u);
  }
  const ExpertWeights e = p.table[key];
  const int64_t rb = p.hidden / Unit<T>::kBlockElems * Unit<T>::kBlockBytes;
  const int64_t e0 = int64_t(blockIdx.x) * (Tile::BM / 2);
  auto expert_row = [&](int tr) { return e0 + (tr / 32) * 16 + tr % 16; };  // tile row -> row of gate or up
  float gate = 0.0f;
  mmq_tile<T, 2, kMoeWN, false>(
      smem,
      [&](int tr) {
        const int64_t r = expert_row(tr) < p.width ? expert_row(tr) : p.width - 1;
        const uint8_t* base = static_cast<const uint8_t*>((tr / 16) % 2 ? e.up : e.gate);
        return base + r * rb;
      },
      [&](int tt) { return int64_t(list[tt] / p.top_k); }, p.x_rounded, int(p.hidden / kMmqKTile),
      int(p.hidden / kMmqKTile), p.hidden,
      [&](int i, int tr, int tt, float v) {
        if (i == 0) {
          gate = v;
          return;
        }
        const int64_t row = expert_row(tr);
        if (row < p.width && tt < m) p.act[int64_t(list[tt]) * p.width + row] = __fmul_rn(silu(gate), v);
      });
}

template <DType T>
__global__ void __launch_bounds__(kMmqThreads) moe_mmq_down_kernel(MoeParams p) {
  using Tile = MmqTile<T, 2, kMoeWN>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int list[kMoeTileTokens];
  allow_next_grid();
  wait_for_previous_grid();  // the rounded act rows
  int key, tile;
  const int m = mmq_tile_pairs(p, blockIdx.y, list, &key, &tile);
  if (m == 0) return;
  const int64_t row0 = int64_t(blockIdx.x) * Tile::BM;
  if (key < 0) {  // pairs with no valid expert contribute zero rows
    for (int i = threadIdx.x; i < m * Tile::BM; i += blockDim.x) {
      const int64_t row = row0 + i % Tile::BM;
      if (row < p.hidden) p.partial[int64_t(list[i / Tile::BM]) * p.hidden + row] = 0.0f;
    }
    return;
  }
  const uint8_t* down = static_cast<const uint8_t*>(p.table[key].down);
  const int64_t rb = p.width / Unit<T>::kBlockElems * Unit<T>::kBlockBytes;
  const int k_steps = int(p.width / kMmqKTile);
  mmq_tile<T, 2, kMoeWN, false>(
      smem,
      [&](int tr) {
        const int64_t r = row0 + tr < p.hidden ? row0 + tr : p.hidden - 1;
        return down + r * rb;
      },
      [&](int tt) { return int64_t(list[tt]); }, p.act_rounded, k_steps, k_steps, p.width,
      [&](int, int tr, int tt, float v) {
        const int64_t row = row0 + tr;
        if (row < p.hidden && tt < m) p.partial[int64_t(list[tt]) * p.hidden + row] = v;
      });
}

// The tensor-core decode tiles: calls of 2 .. 8 tokens (moe_tile_from()) whose formats have an
// MmqFormat. Each block gathers its expert's pairs in place as the one-token kernels do (the block of
// the first pair routed to an expert works, the others return), then runs mmq_tile over the
// expert's rows with the pairs as one token tile of 8 (a token routes to an expert once, so a
// decode step's expert has at most 8 pairs; more, from repeated ids, take further tiles): gate/up
// 64 expert rows (16 gate and the same 16 up rows per warp) x 8 pairs, down 64 rows x 8 pairs. The
// activations come rounded (x by the RMSNorm or round_rows, SiLU(gate) * up by round_rows between
// the two), and moe_combine_kernel adds the slots: the prefill tiles' arithmetic, so the same bits.
constexpr int kTileRowWarps = 4;
template <DType T>
using GateUpDecodeTile = MmqTile<T, 2, 1, kTileRowWarps>;
template <DType T>
using DownDecodeTile = MmqTile<T, 1, 1, kTileRowWarps>;

template <DType T>
__global__ void __launch_bounds__(kMmqThreads) moe_tile_gate_up_kernel(MoeParams p) {
  using Tile = GateUpDecodeTile<T>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int count, shared_key;
  int* list = reinterpret_cast<int*>(smem + Tile::kSmemBytes);
  // The ids come from the router: wait for it, then let the next kernel start its prologue.
  wait_for_previous_grid();
  allow_next_grid();
  ExpertWeights e{};
  const int own_key = expert_key(p.ids[blockIdx.y], p.n_experts);  // the table read overlaps the scan
  if (own_key >= 0) e = p.table[own_key];
  const int m = gather_pairs(p, blockIdx.y, list, &count, &shared_key);
  const int key = shared_key;
  if (m == 0 || key < 0) return;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (p.routings) atomicAdd(&p.routings[key], unsigned(m));
    if (p.touches) atomicAdd(&p.touches[key], 1u);
  }
  const int64_t rb = p.hidden / Unit<T>::kBlockElems * Unit<T>::kBlockBytes;
  const int64_t e0 = int64_t(blockIdx.x) * (Tile::BM / 2);
  auto expert_row = [&](int tr) { return e0 + (tr / 32) * 16 + tr % 16; };  // tile row -> row of gate or up
  const int k_steps = int(p.hidden / kMmqKTile);
  for (int i0 = 0; i0 < m; i0 += Tile::BN) {
    const int mt = min(Tile::BN, m - i0);
    float gate = 0.0f;
    mmq_tile<T, 2, 1, false, kTileRowWarps>(
        smem,
        [&](int tr) {
          const int64_t r = expert_row(tr) < p.width ? expert_row(tr) : p.width - 1;
          const uint8_t* base = static_cast<const uint8_t*>((tr / 16) % 2 ? e.up : e.gate);
          return base + r * rb;
        },
        [&](int tt) { return int64_t(list[i0 + (tt < mt ? tt : 0)] / p.top_k); }, p.x_rounded, k_steps, k_steps,
        p.hidden, [&](int i, int tr, int tt, float v) {
          if (i == 0) {
            gate = v;
            return;
          }
          const int64_t row = expert_row(tr);
          if (row < p.width && tt < mt) p.act[int64_t(list[i0 + tt]) * p.width + row] = __fmul_rn(silu(gate), v);
        });
  }
}

template <DType T>
__global__ void __launch_bounds__(kMmqThreads) moe_tile_down_kernel(MoeParams p) {
  using Tile = DownDecodeTile<T>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int count, shared_key;
  int* list = reinterpret_cast<int*>(smem + Tile::kSmemBytes);
  // The ids were written before the gate/up kernel started (it waited for them): the pairs, the
  // table and the first weights go out before waiting for the rounded activations.
  allow_next_grid();
  ExpertWeights e{};
  const int own_key = expert_key(p.ids[blockIdx.y], p.n_experts);
  if (own_key >= 0) e = p.table[own_key];
  const int m = gather_pairs(p, blockIdx.y, list, &count, &shared_key);
  const int key = shared_key;
  if (m == 0) return;
  const int64_t row0 = int64_t(blockIdx.x) * Tile::BM;
  if (key < 0) {  // pairs with no valid expert contribute zero rows
    wait_for_previous_grid();
    for (int i = threadIdx.x; i < m * Tile::BM; i += blockDim.x) {
      const int64_t row = row0 + i % Tile::BM;
      if (row < p.hidden) p.partial[int64_t(list[i / Tile::BM]) * p.hidden + row] = 0.0f;
    }
    return;
  }
  const uint8_t* down = static_cast<const uint8_t*>(e.down);
  const int64_t rb = p.width / Unit<T>::kBlockElems * Unit<T>::kBlockBytes;
  const int k_steps = int(p.width / kMmqKTile);
  for (int i0 = 0; i0 < m; i0 += Tile::BN) {
    const int mt = min(Tile::BN, m - i0);
    mmq_tile<T, 1, 1, false, kTileRowWarps, true>(
        smem,
        [&](int tr) {
          const int64_t r = row0 + tr < p.hidden ? row0 + tr : p.hidden - 1;
          return down + r * rb;
        },
        [&](int tt) { return int64_t(list[i0 + (tt < mt ? tt : 0)]); }, p.act_rounded, k_steps, k_steps, p.width,
        [&](int, int tr, int tt, float v) {
          const int64_t row = row0 + tr;
          if (row < p.hidden && tt < mt) p.partial[int64_t(list[i0 + tt]) * p.hidden + row] = v;
        });
  }
}

// out[t] = the sum of token t's partial rows times their routing weights, in slot order: the
// products and the sum the decode kernels' down blocks make (a pair with an invalid id adds the
// zero its tile wrote). The weights are applied here rather than in the tensor-core kernel's
// epilogue, where each waited on a global load.
__global__ void moe_combine_kernel(MoeParams p) {
  allow_next_grid();
  wait_for_previous_grid();
  const int n = p.pairs / p.top_k;
  // Four rows per thread in 16-byte words where the rows allow it (the same sums per element); a
  // token per blockIdx.y, so no division per element.
  const bool vec = p.hidden % 4 == 0 && ((reinterpret_cast<uintptr_t>(p.out) | reinterpret_cast<uintptr_t>(p.partial)) & 15) == 0;
  const int64_t words = vec ? p.hidden / 4 : p.hidden;
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    const float* part = p.partial + t * p.top_k * p.hidden;
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < words; c += int64_t(gridDim.x) * blockDim.x) {
      auto weighted = [&](int j, float v) {
        const int64_t pair = t * p.top_k + j;
        return expert_key(p.ids[pair], p.n_experts) < 0 ? v : __fmul_rn(p.weights[pair], v);
      };
      if (vec) {
        auto term = [&](int j) {
          float4 v = *reinterpret_cast<const float4*>(part + int64_t(j) * p.hidden + 4 * c);
          v.x = weighted(j, v.x), v.y = weighted(j, v.y), v.z = weighted(j, v.z), v.w = weighted(j, v.w);
          return v;
        };
        float4 s = term(0);
        for (int j = 1; j < p.top_k; ++j) {
          const float4 v = term(j);
          s.x = __fadd_rn(s.x, v.x), s.y = __fadd_rn(s.y, v.y), s.z = __fadd_rn(s.z, v.z), s.w = __fadd_rn(s.w, v.w);
        }
        *reinterpret_cast<float4*>(p.out + t * p.hidden + 4 * c) = s;
      } else {
        float s = weighted(0, part[c]);
        for (int j = 1; j < p.top_k; ++j) s = __fadd_rn(s, weighted(j, part[int64_t(j) * p.hidden + c]));
        p.out[t * p.hidden + c] = s;
      }
    }
  }
}

// With CPU experts: out[t] = the sum of token t's pair rows in slot order, where a pair of a CPU
// expert reads the CPU's row (already times its weight) from the channel, the others the down
// kernel's partial rows; the order and the additions of the down kernel's last block.
__global__ void moe_cpu_combine_kernel(MoeParams p) {
  __shared__ bool ok;
  allow_next_grid();
  wait_for_previous_grid();  // the down kernel's partials, and the gate/up kernel's publication
  if (threadIdx.x == 0) ok = wait_for_cpu(p);
  __syncthreads();
  const int n = p.pairs / p.top_k;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < p.hidden; c += int64_t(gridDim.x) * blockDim.x) {
      float s = 0.0f;
      for (int j = 0; j < p.top_k; ++j) {
        const int pair = t * p.top_k + j;
        const int key = expert_key(p.ids[pair], p.n_experts);
        float v = 0.0f;
        if (key >= 0) {
          const int64_t at = int64_t(pair) * p.hidden + c;
          v = cpu_key(p, key) ? (ok ? __ldcv(p.cpu.rows + at) : 0.0f) : __ldcg(p.partial + at);
        }
        s = j == 0 ? v : __fadd_rn(s, v);
      }
      p.out[int64_t(t) * p.hidden + c] = s;
    }
  }
}

bool decodable(DType t) { return dispatch_block_type(t, [](auto) {}); }

// Whether a call of n tokens runs a projection of type t on the tensor-core path: grouped calls
// whose experts get a few tokens each on average (below that, most of a 32-token tile is padding).
bool use_mmq(const MoeShape& s, DType t, int64_t n) {
  return mmq_format(t) && n > kMaxTokenGroup && n * s.top_k >= 4 * int64_t(s.n_experts) &&
         (t == s.gate_up_type ? s.hidden : s.width) % kMmqKTile == 0;
}

// The process default of the smallest call the tensor-core decode tiles take (SPILL_MOE_MMA_FROM: 2
// takes every call of 2 .. 8 tokens, 1 batch 1 too; 0, the default, none until the tiles are
// measured against the one-token kernels on a GPU). Read once per process.
int64_t moe_tile_from() {
  static const int64_t v = env_int("SPILL_MOE_MMA_FROM", 0, 0, kMaxTokenGroup);
  return v;
}
// Whether a call of n tokens runs a projection of type t on the tensor-core decode tiles (its format
// has an MmqFormat and its rows whole K steps); each projection chooses alone (Q4_K_M files pair
// Q4_K gate/up with a Q6_K down).
bool use_tile(const MoePlan& plan, DType t, int64_t n) {
  const MoeShape& s = plan.shape;
  return plan.tile_from > 0 && n >= plan.tile_from && n <= kMaxTokenGroup && mmq_format(t) &&
         (t == s.gate_up_type ? s.hidden : s.width) % kMmqKTile == 0;
}

int64_t align16(int64_t v) { return (v + 15) / 16 * 16; }

struct WorkspaceLayout {
  int64_t act = 0, partial = 0, groups = 0, tiles = 0, x_rounded = 0, act_rounded = 0, counters = 0, bytes = 0;
};
WorkspaceLayout workspace_layout(const MoePlan& plan) {
  const int64_t pairs = plan.max_tokens * plan.shape.top_k;
  const int64_t keys = plan.shape.n_experts + 1;
  WorkspaceLayout w;
  w.act = 0;
  w.partial = align16(pairs * plan.shape.width * 4);
  w.groups = w.partial + align16(pairs * plan.shape.hidden * 4);
  w.tiles = w.groups + align16((1 + keys + keys + 1 + pairs) * 4);
  w.x_rounded = w.tiles + int64_t(mmq_tile_bound(int(pairs), int(keys))) * 16;
  w.act_rounded = w.x_rounded + align16(rounded_rows_bytes(plan.max_tokens, plan.shape.hidden));
  w.counters = w.act_rounded + align16(rounded_rows_bytes(pairs, plan.shape.width));
  w.bytes = w.counters + align16((plan.shape.hidden + kDownRows - 1) / kDownRows * 4);
  return w;
}

}  // namespace

ExpertSpanLayout expert_span_layout(const MoeShape& s) {
  ExpertSpanLayout l;
  const int64_t gate_bytes = s.width * row_bytes(s.gate_up_type, s.hidden);
  l.gate_offset = 0;
  l.up_offset = align16(gate_bytes);
  l.down_offset = l.up_offset + align16(gate_bytes);
  l.bytes = l.down_offset + align16(s.hidden * row_bytes(s.down_type, s.width));
  return l;
}

MoePlan plan_moe(const MoeShape& s, int64_t max_tokens, int64_t tile_from) {
  auto shape_text = [&] {
    return "hidden " + std::to_string(s.hidden) + ", width " + std::to_string(s.width) + ", " +
           std::to_string(s.n_experts) + " experts, top-" + std::to_string(s.top_k) + ", gate/up " +
           std::string(dtype_name(s.gate_up_type)) + ", down " + std::string(dtype_name(s.down_type));
  };
  if (!decodable(s.gate_up_type) || !decodable(s.down_type))
    throw_error("the CUDA MoE kernels have no decoder for the expert weights' type (" + shape_text() +
                "); they decode Q8_0, Q6_K, Q5_K, Q4_K, Q3_K, Q2_K");
  if (s.hidden <= 0 || s.width <= 0 || !row_fits(s.gate_up_type, s.hidden) || !row_fits(s.down_type, s.width))
    throw_error("bad MoE shape (" + shape_text() + "): gate/up rows of hidden and down rows of width weights must be whole blocks");
  if (s.n_experts < 1 || s.n_experts > kMaxExperts || s.top_k < 1 || s.top_k > s.n_experts)
    throw_error("bad MoE routing shape (" + shape_text() + "): need 1 <= top_k <= n_experts <= " +
                std::to_string(kMaxExperts));
  if (max_tokens < 1 || max_tokens * s.top_k > kMaxPairs)
    throw_error("the CUDA MoE decode kernels take at most " + std::to_string(kMaxPairs) +
                " (token, expert) pairs per call; asked for " + std::to_string(max_tokens) + " tokens x top-" +
                std::to_string(s.top_k));
  if (gate_up_smem(s, max_tokens, max_tokens * s.top_k) > kMaxSmem ||
      down_smem(s, max_tokens, max_tokens * s.top_k) > kMaxSmem)
    throw_error("the CUDA MoE decode kernels stage whole expert rows in shared memory, and rows of this shape (" +
                shape_text() + ") with " + std::to_string(max_tokens) + " tokens need more than an sm_90 block's " +
                std::to_string(kMaxSmem / 1024) + " KiB; use a smaller hidden/width or fewer tokens per call");
  MoePlan plan;
  plan.shape = s;
  plan.max_tokens = max_tokens;
  plan.tile_from = std::clamp<int64_t>(tile_from < 0 ? moe_tile_from() : tile_from, 0, kMaxTokenGroup);
  plan.workspace_bytes = workspace_layout(plan).bytes;
  return plan;
}

int64_t moe_tokens_per_call(const MoeShape& shape) {
  return mmq_format(shape.gate_up_type) && mmq_format(shape.down_type) ? 1024 : 256;
}

bool moe_reads_rounded_x(const MoePlan& plan, int64_t n) {
  return use_mmq(plan.shape, plan.shape.gate_up_type, n) || use_tile(plan, plan.shape.gate_up_type, n);
}

int moe_launches(const MoePlan& plan, int64_t n, bool x_rounded, bool cpu_experts) {
  if (n <= kMaxTokenGroup) {
    if (cpu_experts && n <= kMoeCpuMaxTokens) return kMoeLaunchesPerCall + 1;
    // The decode tiles: gate/up (after x's rounding unless it comes rounded); down after the rounding
    // of SiLU(gate) * up, then the slot sum.
    int launches = kMoeLaunchesPerCall;
    if (use_tile(plan, plan.shape.gate_up_type, n) && !x_rounded) launches += 1;
    if (use_tile(plan, plan.shape.down_type, n)) launches += 2;
    return launches;
  }
  int launches = kMoeLaunchesPerCall + 1;
  if (use_mmq(plan.shape, plan.shape.gate_up_type, n) && !x_rounded) launches += 1;
  if (use_mmq(plan.shape, plan.shape.down_type, n)) launches += 2;
  return launches;
}

void init_moe_workspace(const MoePlan& plan, void* workspace, cudaStream_t stream) {
  const WorkspaceLayout w = workspace_layout(plan);
  check(cudaMemsetAsync(static_cast<uint8_t*>(workspace) + w.counters, 0, size_t(w.bytes - w.counters), stream),
        "clearing the MoE workspace");
}

void moe_experts(const MoePlan& plan, const MoeArgs& a, cudaStream_t stream) {
  const MoeShape& s = plan.shape;
  if (a.n < 1 || a.n > plan.max_tokens)
    throw_error("MoE called with " + std::to_string(a.n) + " tokens; its plan allows 1 to " +
                std::to_string(plan.max_tokens));
  if (reinterpret_cast<uintptr_t>(a.x) & 15) throw_error("MoE activations must be 16-byte aligned");
  const WorkspaceLayout w = workspace_layout(plan);
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  MoeParams p{};
  p.table = a.table;
  p.x = a.x;
  p.ids = a.ids;
  p.weights = a.weights;
  p.out = a.out;
  p.act = reinterpret_cast<float*>(ws + w.act);
  p.partial = reinterpret_cast<float*>(ws + w.partial);
  p.counters = reinterpret_cast<int32_t*>(ws + w.counters);
  p.routings = a.routings;
  p.touches = a.touches;
  p.hidden = s.hidden;
  p.width = s.width;
  p.n_experts = s.n_experts;
  p.top_k = s.top_k;
  p.pairs = int32_t(a.n * s.top_k);
  // Grouping first for calls past the one-token builds (prefill); decode steps gather in place.
  p.grouped = a.n > kMaxTokenGroup;
  if (a.cpu.mask && a.n <= kMoeCpuMaxTokens && !p.grouped) {
    if (!a.cpu.channel || !a.cpu.x || !a.cpu.ids || !a.cpu.weights || !a.cpu.rows || !a.cpu.calls)
      throw_error("MoE: CPU experts given without their channel (internal error)");
    p.cpu = a.cpu;
  }
  {
    int32_t* g = reinterpret_cast<int32_t*>(ws + w.groups);
    const int32_t keys = s.n_experts + 1;
    p.groups = {.n_active = g,
                .active = g + 1,
                .start = g + 1 + keys,
                .sorted = g + 1 + keys + keys + 1,
                .tiles = reinterpret_cast<int4*>(ws + w.tiles)};
  }
  const bool x_given = a.x_rounded.q != nullptr;
  if (x_given && (a.x_rounded.cols != s.hidden || a.x_rounded.d_stride != (s.hidden + kActBlock - 1) / kActBlock))
    throw_error("MoE: the rounded activations given have " + std::to_string(a.x_rounded.cols) +
                " columns; the experts take " + std::to_string(s.hidden));
  p.x_rounded = x_given ? a.x_rounded : rounded_rows_at(ws + w.x_rounded, a.n, s.hidden);
  p.act_rounded = rounded_rows_at(ws + w.act_rounded, p.pairs, s.width);
  const bool mmq_gate_up = use_mmq(s, s.gate_up_type, a.n), mmq_down = use_mmq(s, s.down_type, a.n);
  // A decode step of 2 .. 8 tokens: the tensor-core decode tiles over the pairs gathered in place
  // (not with CPU experts, whose hand-over lives in the one-token kernels).
  const bool tile_gate_up = !p.cpu.mask && use_tile(plan, s.gate_up_type, a.n);
  const bool tile_down = !p.cpu.mask && use_tile(plan, s.down_type, a.n);
  const size_t list_bytes = size_t(p.pairs) * sizeof(int);
  // Token tiles of the tensor-core kernels: at most one per 32 pairs plus one per active key.
  const unsigned mmq_tiles = unsigned(mmq_tile_bound(p.pairs, s.n_experts + 1));
  // Blocks per row tile: one per pair when each block gathers, one per active key when grouped.
  const unsigned group_blocks = unsigned(p.grouped ? std::min<int64_t>(p.pairs, s.n_experts + 1) : p.pairs);
  if (p.grouped)
    check(launch_overlapped(moe_group_kernel, dim3(1), dim3(kGroupThreads), 0, stream, p),
          "launching the MoE grouping kernel");

  if ((mmq_gate_up || tile_gate_up) && !x_given) round_rows(a.x, false, a.n, s.hidden, ws + w.x_rounded, stream);
  dispatch_block_type(s.gate_up_type, [&](auto type_constant) {
    constexpr DType T = decltype(type_constant)::value;
    if constexpr (mmq_format(T)) {
      if (mmq_gate_up) {
        using Tile = MmqTile<T, 2, kMoeWN>;
        check(allow_max_dynamic_smem(moe_mmq_gate_up_kernel<T>),
              "raising the MoE tensor-core gate/up kernel's shared memory limit");
        const dim3 grid(unsigned((s.width + Tile::BM / 2 - 1) / (Tile::BM / 2)), mmq_tiles);
        check(launch_overlapped(moe_mmq_gate_up_kernel<T>, grid, dim3(kMmqThreads), size_t(Tile::kSmemBytes), stream, p),
              "launching the MoE tensor-core gate/up kernel");
        return;
      }
      if (tile_gate_up) {
        using Tile = GateUpDecodeTile<T>;
        check(allow_max_dynamic_smem(moe_tile_gate_up_kernel<T>), "raising the MoE gate/up tile's shared memory limit");
        const dim3 grid(unsigned((s.width + Tile::BM / 2 - 1) / (Tile::BM / 2)), unsigned(p.pairs));
        check(launch_overlapped(moe_tile_gate_up_kernel<T>, grid, dim3(kMmqThreads), size_t(Tile::kSmemBytes) + list_bytes,
                                stream, p),
              "launching the MoE gate/up tile kernel");
        return;
      }
    }
    MoeParams q = p;
    q.stride = staged_row_stride(int(row_bytes(T, s.hidden)));
    q.token_group = token_group_for(s.hidden, a.n);
    q.act_bytes = act_q8_bytes(q.token_group, int(s.hidden));
    const size_t smem = gate_up_smem(s, a.n, p.pairs);
    const dim3 grid(unsigned((s.width + kGateUpRows - 1) / kGateUpRows), group_blocks);
    auto* kernel = a.n <= kMaxTokenGroup ? moe_gate_up_kernel<T, 1> : moe_gate_up_kernel<T, kMaxTokenGroup>;
    check(allow_max_dynamic_smem(kernel), "raising the MoE gate/up kernel's shared memory limit");
    check(launch_overlapped(kernel, grid, dim3(kGateUpWarps * 32), smem, stream, q),
          "launching the MoE gate/up kernel");
  });
  if (mmq_down || tile_down) round_rows(p.act, false, p.pairs, s.width, ws + w.act_rounded, stream);
  dispatch_block_type(s.down_type, [&](auto type_constant) {
    constexpr DType T = decltype(type_constant)::value;
    if constexpr (mmq_format(T)) {
      if (mmq_down) {
        using Tile = MmqTile<T, 2, kMoeWN>;
        check(allow_max_dynamic_smem(moe_mmq_down_kernel<T>),
              "raising the MoE tensor-core down kernel's shared memory limit");
        const dim3 grid(unsigned((s.hidden + Tile::BM - 1) / Tile::BM), mmq_tiles);
        check(launch_overlapped(moe_mmq_down_kernel<T>, grid, dim3(kMmqThreads), size_t(Tile::kSmemBytes), stream, p),
              "launching the MoE tensor-core down kernel");
        const int64_t words = s.hidden % 4 == 0 ? s.hidden / 4 : s.hidden;
        const dim3 combine_grid(unsigned(std::min<int64_t>((words + 255) / 256, 64)),
                                unsigned(std::min<int64_t>(a.n, 16384)));
        check(launch_overlapped(moe_combine_kernel, combine_grid, dim3(256), 0, stream, p),
              "launching the MoE combine kernel");
        return;
      }
      if (tile_down) {
        using Tile = DownDecodeTile<T>;
        check(allow_max_dynamic_smem(moe_tile_down_kernel<T>), "raising the MoE down tile's shared memory limit");
        const dim3 grid(unsigned((s.hidden + Tile::BM - 1) / Tile::BM), unsigned(p.pairs));
        check(launch_overlapped(moe_tile_down_kernel<T>, grid, dim3(kMmqThreads), size_t(Tile::kSmemBytes) + list_bytes,
                                stream, p),
              "launching the MoE down tile kernel");
        const int64_t words = s.hidden % 4 == 0 ? s.hidden / 4 : s.hidden;
        const dim3 combine_grid(unsigned(std::min<int64_t>((words + 255) / 256, 64)), unsigned(a.n));
        check(launch_overlapped(moe_combine_kernel, combine_grid, dim3(256), 0, stream, p),
              "launching the MoE combine kernel");
        return;
      }
    }
    MoeParams q = p;
    q.stride = staged_row_stride(int(row_bytes(T, s.width)));
    q.token_group = token_group_for(s.width, a.n);
    q.act_bytes = act_q8_bytes(q.token_group, int(s.width));
    const size_t smem = down_smem(s, a.n, p.pairs);
    const dim3 grid(unsigned((s.hidden + kDownRows - 1) / kDownRows), group_blocks);
    auto* kernel = a.n <= kMaxTokenGroup ? moe_down_kernel<T, 1> : moe_down_kernel<T, kMaxTokenGroup>;
    check(allow_max_dynamic_smem(kernel), "raising the MoE down kernel's shared memory limit");
    check(launch_overlapped(kernel, grid, dim3(kDownWarps * 32), smem, stream, q), "launching the MoE down kernel");
  });
  if (p.cpu.mask)
    check(launch_overlapped(moe_cpu_combine_kernel, dim3(unsigned((s.hidden + 255) / 256), unsigned(a.n)), dim3(256), 0,
                            stream, p),
          "launching the MoE kernel that adds the CPU experts' rows");
}

}  // namespace spill::cuda
