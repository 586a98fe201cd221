#include "backend/cuda/gemv.h"

#include <algorithm>
#include <string>
#include <utility>

#include "backend/cuda/block_dot.cuh"
#include "backend/cuda/kernel_limits.h"
#include "backend/cuda/mmq.cuh"
#include "backend/cuda/cuda_check.h"
#include "core/env.h"

namespace spill::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kTargetBlocks = 1024;        // ~8 blocks (32 warps) per SM on an H100/H200: decode is latency-bound
constexpr int kMaxSegmentBytes = 2304;     // staged bytes per row per chunk (a Q4_K row of 4096)

// The split policy's two constants, overridable for measurement (SPILL_GEMV_TARGET_BLOCKS,
// SPILL_GEMV_MAX_SEGMENT): fewer, longer chunks trade the split-K epilogue's round trips (a fence,
// an atomic, the partial sums read back) for fewer blocks in flight (measured on an H100: no setting
// beats these, docs/perf/NOTES.md). Read once per process.
int64_t target_blocks() {
  static const int64_t v = env_int("SPILL_GEMV_TARGET_BLOCKS", kTargetBlocks, 1, 1 << 20);
  return v;
}
int64_t max_segment_bytes() {
  static const int64_t v = env_int("SPILL_GEMV_MAX_SEGMENT", kMaxSegmentBytes, 256, 16384);
  return v;
}
constexpr int kActSmemBudget = 24 * 1024;  // shared bytes for one token group's rounded activations

struct GemvParams {
  const uint8_t* weights;
  const void* x;
  float* y;
  float* partial;   // [k_splits][n][rows]
  int32_t* counters;  // [row_tiles]
  int64_t rows, cols, row_bytes, k_chunk, n;
  int32_t k_splits, stride;
  int32_t token_group;  // tokens whose rounded activations shared memory holds at once
};

template <DType T, class XT, int NT>
__global__ void __launch_bounds__(kWarps * 32, NT == 1 ? 8 : 4) gemv_kernel(GemvParams p) {
  using U = Unit<T>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ bool last_block;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = blockIdx.y;
  const int64_t k0 = int64_t(split) * p.k_chunk;
  const int k_len = int(min(p.k_chunk, p.cols - k0));
  const int64_t row0 = int64_t(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp;
  const bool has_rows = row0 < p.rows;
  allow_next_grid();
  const uint8_t* staged[kRowsPerWarp];
  int parts = 0;
  if (has_rows) {
    const uint8_t* src[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = row0 + r < p.rows ? row0 + r : row0;  // past the end: repeat a valid row
      src[r] = p.weights + row * p.row_bytes + k0 / U::kBlockElems * U::kBlockBytes;
    }
    // The weights do not depend on the previous kernel: fetch them before waiting for it.
    parts = stage_rows(src, k_len / U::kBlockElems * U::kBlockBytes, part_bytes_of<T>(),
                       smem + warp * kRowsPerWarp * p.stride, p.stride, staged, lane);
  }
  wait_for_previous_grid();
  float* chain = reinterpret_cast<float*>(smem + kRowsPerBlock * p.stride + 16) + warp * chain_scratch_floats(T, NT);
  const ActQ8 xq = act_q8_at(smem + kRowsPerBlock * p.stride + 16 + kWarps * chain_scratch_floats(T, NT) * 4,
                             p.token_group, k_len);
  const XT* x = static_cast<const XT*>(p.x);
  for (int t0 = 0; t0 < p.n; t0 += p.token_group) {
    const int tokens = int(p.n - t0 < p.token_group ? p.n - t0 : p.token_group);
    __syncthreads();  // the previous group's activations are no longer read
    quantize_tokens([&](int t) { return x + (t0 + t) * p.cols + k0; }, tokens, k_len, xq,
                    [](const XT* q, float v[8]) { load_x8<XT>(q, v); });
    __syncthreads();
    if (!has_rows) continue;
    warp_dot_q8_group<T, NT>(staged, k_len, xq, tokens, lane, t0 == 0 ? parts : 0, 0, chain, [&](int r, int t, float v) {
      const int64_t row = row0 + r;
      if (row >= p.rows) return;
      if (p.k_splits == 1) p.y[(t0 + t) * p.rows + row] = v;
      else p.partial[(int64_t(split) * p.n + t0 + t) * p.rows + row] = v;
    });
  }
  if (p.k_splits == 1) return;
  // The last block of this row tile to finish adds the chunks' partial sums in chunk order.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(&p.counters[blockIdx.x], 1) == p.k_splits - 1;
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  const int64_t tile_row0 = int64_t(blockIdx.x) * kRowsPerBlock;
  for (int i = threadIdx.x; i < kRowsPerBlock * p.n; i += blockDim.x) {
    const int64_t row = tile_row0 + i % kRowsPerBlock, t = i / kRowsPerBlock;
    if (row >= p.rows) continue;
    float s = __ldcg(&p.partial[t * p.rows + row]);
    for (int c = 1; c < p.k_splits; ++c) s = __fadd_rn(s, __ldcg(&p.partial[(int64_t(c) * p.n + t) * p.rows + row]));
    p.y[t * p.rows + row] = s;
  }
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
}

// Rounds x [n, cols] to int8 per block of 256 (quantize_activations_q8, round_rows below): one
// block of kWarps warps per (token, up to kWarps blocks of 256), through the same device routine
// the GEMV and MoE kernels run on their shared memory. Launched overlapped: its blocks are resident
// and waiting when the previous kernel ends, and the GEMM after it may start the same way.
template <class XT>
__global__ void __launch_bounds__(kWarps * 32) round_rows_kernel(const XT* x, int64_t cols, int8_t* q, float* d) {
  wait_for_previous_grid();
  allow_next_grid();
  const int64_t t = blockIdx.y;
  const int64_t k0 = int64_t(blockIdx.x) * kWarps * kActBlock;
  const int k_len = int(cols - k0 < int64_t(kWarps) * kActBlock ? cols - k0 : int64_t(kWarps) * kActBlock);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i0 = warp * kActBlock + 8 * lane;
  if (warp * kActBlock >= k_len) return;
  const bool mine = i0 < k_len;
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (mine) load_x8<XT>(x + t * cols + k0 + i0, v);
  int r[8];
  const float scale = round_block_q8(v, r);
  if (mine) *reinterpret_cast<uint2*>(q + t * cols + k0 + i0) = pack_q8x8(r);
  if (lane == 0) d[t * ((cols + kActBlock - 1) / kActBlock) + (k0 + warp * kActBlock) / kActBlock] = scale;
}

struct MmqDenseParams {
  const uint8_t* weights;
  RoundedRows acts;
  float* y;
  int64_t rows, cols, row_bytes, n;
  int32_t k_steps, chunk_steps;
};

// The dense tile: 64 rows x 64 tokens per block (each K step's staging and conversion serve twice
// the products of a 32-token tile: S30 prefill 55.1 -> 52.0 ms) for Q8_0; 64 x 32 for the
// K-quants, whose 64-token tile needs more than 255 registers (Q3_K spilled 448 bytes).
constexpr int kDenseWM = 2;
template <DType T>
constexpr int kDenseWN = T == DType::Q8_0 ? 4 : 2;

template <DType T>
__global__ void __launch_bounds__(kMmqThreads) mmq_dense_kernel(MmqDenseParams p) {
  using Tile = MmqTile<T, kDenseWM, kDenseWN<T>>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int64_t row0 = int64_t(blockIdx.x) * Tile::BM, t0 = int64_t(blockIdx.y) * Tile::BN;
  allow_next_grid();
  wait_for_previous_grid();  // the activations come from the rounding kernel
  mmq_tile<T, kDenseWM, kDenseWN<T>, true>(
      smem,
      [&](int tr) {
        const int64_t r = row0 + tr < p.rows ? row0 + tr : p.rows - 1;  // past the end: repeat a valid row
        return p.weights + r * p.row_bytes;
      },
      [&](int tt) { return t0 + tt < p.n ? t0 + tt : p.n - 1; }, p.acts, p.k_steps, p.chunk_steps, p.cols,
      [&](int, int tr, int tt, float v) {
        if (row0 + tr < p.rows && t0 + tt < p.n) p.y[(t0 + tt) * p.rows + row0 + tr] = v;
      });
}

// The decode tile: 64 rows (4 warps along the rows, 16 each) x 8 tokens of one K-chunk of the
// plan's split, on int8 tensor cores. Each block's chunk chain is mmq_tile's (block_dot.cuh's
// arithmetic); the chunks' partials are added in chunk order by the last block of each (row tile,
// token tile), as gemv_kernel adds them, so a token gets the bits of every other path.
struct MmqDecodeParams {
  const uint8_t* weights;
  RoundedRows acts;
  float* y;
  float* partial;     // [k_splits][n][rows]
  int32_t* counters;  // [token tiles][row tiles]
  int64_t rows, cols, row_bytes, k_chunk, n;
  int32_t k_splits;
};
constexpr int kDecodeRowWarps = 4;
template <DType T>
using DecodeTile = MmqTile<T, 1, 1, kDecodeRowWarps>;

template <DType T>
__global__ void __launch_bounds__(kMmqThreads) mmq_decode_kernel(MmqDecodeParams p) {
  using Tile = DecodeTile<T>;
  using U = Unit<T>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ bool last_block;
  const int64_t row0 = int64_t(blockIdx.x) * Tile::BM, t0 = int64_t(blockIdx.z) * Tile::BN;
  const int split = int(blockIdx.y);
  const int64_t k0 = int64_t(split) * p.k_chunk;
  const int64_t k_len = min(p.k_chunk, p.cols - k0);
  const int64_t seg0 = k0 / U::kBlockElems * U::kBlockBytes;
  allow_next_grid();
  RoundedRows acts = p.acts;  // this chunk's columns: k0 is a whole number of activation blocks
  acts.q += k0;
  acts.d += k0 / kActBlock;
  const int k_steps = int((k_len + kMmqKTile - 1) / kMmqKTile);
  // The weights of the first K step are requested before waiting for the previous kernel (they do
  // not depend on it); the activations after.
  mmq_tile<T, 1, 1, false, kDecodeRowWarps, true>(
      smem,
      [&](int tr) {
        const int64_t r = row0 + tr < p.rows ? row0 + tr : p.rows - 1;  // past the end: repeat a valid row
        return p.weights + r * p.row_bytes + seg0;
      },
      [&](int tt) { return t0 + tt < p.n ? t0 + tt : p.n - 1; }, acts, k_steps, k_steps, k_len,
      [&](int, int tr, int tt, float v) {
        const int64_t row = row0 + tr, t = t0 + tt;
        if (row >= p.rows || t >= p.n) return;
        if (p.k_splits == 1) p.y[t * p.rows + row] = v;
        else p.partial[(int64_t(split) * p.n + t) * p.rows + row] = v;
      });
  if (p.k_splits == 1) return;
  // The last block of this (row tile, token tile) to finish adds the chunks' partial sums in chunk order.
  const int tile = int(blockIdx.z * gridDim.x + blockIdx.x);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(&p.counters[tile], 1) == p.k_splits - 1;
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  for (int i = threadIdx.x; i < Tile::BM * Tile::BN; i += blockDim.x) {
    const int64_t row = row0 + i % Tile::BM, t = t0 + i / Tile::BM;
    if (row >= p.rows || t >= p.n) continue;
    float s = __ldcg(&p.partial[t * p.rows + row]);
    for (int c = 1; c < p.k_splits; ++c) s = __fadd_rn(s, __ldcg(&p.partial[(int64_t(c) * p.n + t) * p.rows + row]));
    p.y[t * p.rows + row] = s;
  }
  if (threadIdx.x == 0) p.counters[tile] = 0;
}

// The process default of the smallest call the decode tile takes (SPILL_GEMV_MMA_FROM: 2 takes every
// call of 2 .. 31 tokens, 1 batch 1 too; 0, the default, none until the tile is measured against
// the __dp4a kernels on a GPU). Read once per process.
int64_t decode_mma_from() {
  static const int64_t v = env_int("SPILL_GEMV_MMA_FROM", 0, 0, kMmqMinTokens);
  return v;
}

int64_t segment_bytes(DType type, int64_t k) { return row_bytes(type, k); }

// Tokens per group: as many as kActSmemBudget holds, up to kMaxTokenGroup.
int32_t token_group_for(int64_t k_len) {
  int32_t g = kMaxTokenGroup;
  while (g > 1 && act_q8_bytes(g, int(k_len)) > kActSmemBudget) g /= 2;
  return g;
}

// Blocks of the one-token kernel the current GPU holds at once with chunks of k_chunk weights:
// its launch bounds allow 8 per SM; shared memory may allow fewer.
int64_t resident_blocks(DType type, int64_t k_chunk) {
  static const std::pair<int64_t, int64_t> gpu = [] {
    int device = 0, count = 132, smem = 228 * 1024;
    if (cudaGetDevice(&device) == cudaSuccess) {
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    }
    cudaGetLastError();  // a failed query leaves the defaults, not a sticky error
    return std::pair<int64_t, int64_t>(count, smem);
  }();
  const int64_t block_smem = int64_t(kRowsPerBlock) * staged_row_stride(int(segment_bytes(type, k_chunk))) + 16 +
                             kWarps * chain_scratch_floats(type, 1) * 4 + act_q8_bytes(1, int(k_chunk)) +
                             1024;  // + the runtime's reserve per block
  return gpu.first * std::clamp<int64_t>(gpu.second / block_smem, 1, 8);
}

// The workspace: the decode path's split-K partial rows and tile counters (for up to gemv_max_n
// tokens: calls of kMmqMinTokens or more take the tensor-core path when the format has one), then
// the rounded activations of the tensor-core path.
struct WorkspaceLayout {
  int64_t gemv_max_n = 0, counters = 0, counter_bytes = 0, rounded = 0, bytes = 0;
};
WorkspaceLayout workspace_layout(const GemvPlan& plan) {
  WorkspaceLayout w;
  w.gemv_max_n = plan.mmq ? std::min<int64_t>(plan.max_n, kMmqMinTokens - 1) : plan.max_n;
  const int64_t partial = plan.k_splits > 1 ? int64_t(plan.k_splits) * w.gemv_max_n * plan.rows * 4 : 0;
  w.counters = partial;
  // A counter per tile of 16 rows (gemv_kernel), or per 64 rows x 8 tokens (mmq_decode_kernel).
  const int64_t decode_tiles = plan.mma_from > 0 ? (plan.rows + 63) / 64 * ((w.gemv_max_n + 7) / 8) : 0;
  w.counter_bytes = plan.k_splits > 1 ? std::max(plan.row_tiles, decode_tiles) * 4 : 0;
  w.rounded = (w.counters + w.counter_bytes + 15) / 16 * 16;
  const bool rounds = plan.mmq || plan.mma_from > 0;
  w.bytes = rounds ? w.rounded + rounded_rows_bytes(plan.max_n, plan.cols) : w.counters + w.counter_bytes;
  return w;
}

// The fields both decode kernels' parameters share: the weights, the output, the K split and its
// workspace (the chunks' partial sums and the tiles' counters).
template <class P>
void set_split_params(P& p, const GemvPlan& plan, const GemvArgs& args, const WorkspaceLayout& w) {
  p.weights = static_cast<const uint8_t*>(args.weights);
  p.y = args.y;
  p.partial = static_cast<float*>(args.workspace);
  p.counters = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(args.workspace) + w.counters);
  p.rows = plan.rows;
  p.cols = plan.cols;
  p.row_bytes = row_bytes(plan.type, plan.cols);
  p.k_chunk = plan.k_chunk;
  p.n = args.n;
  p.k_splits = plan.k_splits;
}

}  // namespace

GemvPlan plan_gemv(DType type, int64_t rows, int64_t cols, int64_t max_n, int64_t mma_from) {
  const bool supported = dispatch_block_type(type, [](auto) {});
  if (!supported)
    throw_error("the CUDA GEMV has no kernel for " + std::string(dtype_name(type)) +
                " weights (it decodes Q8_0, Q6_K, Q5_K, Q4_K, Q3_K, Q2_K)");
  if (rows <= 0 || cols <= 0 || max_n <= 0 || !row_fits(type, cols))
    throw_error("bad GEMV shape " + std::to_string(rows) + " x " + std::to_string(cols) + " for " +
                std::string(dtype_name(type)) + " (cols must be a positive multiple of " +
                std::to_string(dtype_block_elems(type)) + "), max_n " + std::to_string(max_n));
  GemvPlan plan;
  plan.type = type;
  plan.rows = rows;
  plan.cols = cols;
  plan.max_n = max_n;
  plan.row_tiles = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t block_elems = dtype_block_elems(type), k_blocks = cols / block_elems;
  // Chunks: at least 512 weights (half a warp's lanes have a unit at the least), at most
  // kMaxSegmentBytes, and as many as it takes to reach kTargetBlocks blocks, but no more than fit
  // on the GPU at once: at batch 1 a block's time is its chain of dependent steps, so a grid of
  // 1.2 waves (the tail's blocks start when the first wave's end) costs nearly two.
  const int64_t min_blocks = std::min<int64_t>(k_blocks, std::max<int64_t>(1, 512 / block_elems));
  const int64_t max_blocks = std::max<int64_t>(min_blocks, max_segment_bytes() / dtype_traits(type).block_bytes);
  // A chunk holds whole activation blocks of 256 (their int8 scale is per block, from the row's
  // start): for Q8_0, a multiple of 8 weight blocks, unless it is the whole row.
  const int64_t per_act_block = std::max<int64_t>(1, kActBlock / block_elems);
  auto chunk_for_splits = [&](int64_t splits) {
    int64_t c = std::clamp((k_blocks + splits - 1) / splits, min_blocks, max_blocks);
    c = std::max<int64_t>(per_act_block, (c + per_act_block - 1) / per_act_block * per_act_block);
    if (c > max_blocks) c = std::max<int64_t>(per_act_block, max_blocks / per_act_block * per_act_block);
    return std::min(c, k_blocks);
  };
  int64_t chunk_blocks = chunk_for_splits(std::max<int64_t>(1, (target_blocks() + plan.row_tiles - 1) / plan.row_tiles));
  auto splits_of = [&](int64_t c) { return (k_blocks + c - 1) / c; };
  while (splits_of(chunk_blocks) > 1 &&
         plan.row_tiles * splits_of(chunk_blocks) > resident_blocks(type, chunk_blocks * block_elems)) {
    const int64_t next = chunk_for_splits(splits_of(chunk_blocks) - 1);
    if (splits_of(next) >= splits_of(chunk_blocks)) break;  // the segment cap allows no fewer chunks
    chunk_blocks = next;
  }
  plan.k_chunk = chunk_blocks * block_elems;
  plan.k_splits = int32_t((cols + plan.k_chunk - 1) / plan.k_chunk);
  plan.mmq = mmq_format(type) && max_n >= kMmqMinTokens;
  // The decode tile needs whole activation blocks per chunk (every chunk but a row's last starts on
  // one: chunk_for_splits above) and takes calls below kMmqMinTokens.
  const int64_t from = mma_from < 0 ? decode_mma_from() : mma_from;
  if (mmq_format(type) && from > 0 && from <= max_n && from < kMmqMinTokens) plan.mma_from = from;
  const WorkspaceLayout w = workspace_layout(plan);
  plan.workspace_bytes = w.bytes;
  return plan;
}

void init_gemv_workspace(const GemvPlan& plan, void* workspace, cudaStream_t stream) {
  const WorkspaceLayout w = workspace_layout(plan);
  if (w.counter_bytes == 0) return;
  check(cudaMemsetAsync(static_cast<uint8_t*>(workspace) + w.counters, 0, size_t(w.counter_bytes), stream),
        "clearing the GEMV workspace");
}

int gemv_launches(const GemvPlan& plan, int64_t n, bool rounded) {
  return gemv_reads_rounded(plan, n) && !rounded ? 2 : 1;
}

int64_t gemv_tokens_per_call(DType type) { return mmq_format(type) ? 1024 : 64; }

void gemv(const GemvPlan& plan, const GemvArgs& args, cudaStream_t stream) {
  if (args.n < 1 || args.n > plan.max_n)
    throw_error("GEMV called with " + std::to_string(args.n) + " activation rows; its plan allows 1 to " +
                std::to_string(plan.max_n));
  if ((reinterpret_cast<uintptr_t>(args.weights) | reinterpret_cast<uintptr_t>(args.x)) & 15)
    throw_error("GEMV weights and activations must be 16-byte aligned");
  if (plan.workspace_bytes > 0 && args.workspace == nullptr)
    throw_error("this GEMV needs its workspace (plan.workspace_bytes)");
  const WorkspaceLayout w = workspace_layout(plan);
  if (gemv_reads_rounded(plan, args.n)) {
    // Two tokens or more: the activations rounded once (here, or by the kernel that wrote them), then
    // the tensor-core tiles (the same bits).
    uint8_t* ws = static_cast<uint8_t*>(args.workspace);
    RoundedRows acts = args.rounded;
    if (acts.q) {
      if (acts.cols != plan.cols || acts.d_stride != (plan.cols + kActBlock - 1) / kActBlock)
        throw_error("GEMV: the rounded activations given have " + std::to_string(acts.cols) + " columns; the matrix has " +
                    std::to_string(plan.cols));
    } else {
      acts = rounded_rows_at(ws + w.rounded, args.n, plan.cols);
      round_rows(args.x, args.x_bf16, args.n, plan.cols, ws + w.rounded, stream);
    }
    if (!(plan.mmq && args.n >= kMmqMinTokens)) {
      // Fewer than kMmqMinTokens: the decode tile over the plan's K split.
      MmqDecodeParams p{};
      set_split_params(p, plan, args, w);
      p.acts = acts;
      dispatch_block_type(plan.type, [&](auto type_constant) {
        constexpr DType T = decltype(type_constant)::value;
        if constexpr (mmq_format(T)) {
          using Tile = DecodeTile<T>;
          auto* kernel = mmq_decode_kernel<T>;
          check(allow_max_dynamic_smem(kernel), "raising the tensor-core decode GEMV's shared memory limit");
          const dim3 grid(unsigned((plan.rows + Tile::BM - 1) / Tile::BM), unsigned(plan.k_splits),
                          unsigned((args.n + Tile::BN - 1) / Tile::BN));
          check(launch_overlapped(kernel, grid, dim3(kMmqThreads), size_t(Tile::kSmemBytes), stream, p),
                "launching the tensor-core decode GEMV");
        }
      });
      return;
    }
    MmqDenseParams p{};
    p.weights = static_cast<const uint8_t*>(args.weights);
    p.acts = acts;
    p.y = args.y;
    p.rows = plan.rows;
    p.cols = plan.cols;
    p.row_bytes = row_bytes(plan.type, plan.cols);
    p.n = args.n;
    p.k_steps = int32_t((plan.cols + kMmqKTile - 1) / kMmqKTile);
    p.chunk_steps = int32_t(plan.k_chunk / kMmqKTile);
    dispatch_block_type(plan.type, [&](auto type_constant) {
      constexpr DType T = decltype(type_constant)::value;
      if constexpr (mmq_format(T)) {
        using Tile = MmqTile<T, kDenseWM, kDenseWN<T>>;
        auto* kernel = mmq_dense_kernel<T>;
        check(allow_max_dynamic_smem(kernel),
              "raising the tensor-core GEMM's shared memory limit");
        const dim3 grid(unsigned((plan.rows + Tile::BM - 1) / Tile::BM), unsigned((args.n + Tile::BN - 1) / Tile::BN));
        check(launch_overlapped(kernel, grid, dim3(kMmqThreads), size_t(Tile::kSmemBytes), stream, p),
              "launching the tensor-core GEMM");
      }
    });
    return;
  }
  if (args.n > w.gemv_max_n)
    throw_error("GEMV called with " + std::to_string(args.n) + " activation rows; its decode path takes at most " +
                std::to_string(w.gemv_max_n));
  GemvParams p{};
  set_split_params(p, plan, args, w);
  p.x = args.x;
  p.stride = staged_row_stride(int(segment_bytes(plan.type, plan.k_chunk)));
  p.token_group = args.n == 1 ? 1 : token_group_for(plan.k_chunk);
  // +16: word loads may touch past a row's end
  const int nt = args.n == 1 ? 1 : kMaxTokenGroup;
  const size_t smem = size_t(kRowsPerBlock) * p.stride + 16 + size_t(kWarps) * chain_scratch_floats(plan.type, nt) * 4 +
                      size_t(act_q8_bytes(p.token_group, int(plan.k_chunk)));
  const dim3 grid(unsigned(plan.row_tiles), unsigned(plan.k_splits));
  dispatch_block_type(plan.type, [&](auto type_constant) {
    constexpr DType T = decltype(type_constant)::value;
    const dim3 block(kWarps * 32);
    // One token: the few-register build (more warps per SM); more: units decoded once per 8 tokens.
    using Bf16 = __nv_bfloat16;
    auto* kernel = args.x_bf16 ? (args.n == 1 ? gemv_kernel<T, Bf16, 1> : gemv_kernel<T, Bf16, kMaxTokenGroup>)
                               : (args.n == 1 ? gemv_kernel<T, float, 1> : gemv_kernel<T, float, kMaxTokenGroup>);
    check(allow_max_dynamic_smem(kernel), "raising the GEMV kernel's shared memory limit");
    check(launch_overlapped(kernel, grid, block, smem, stream, p), "launching the GEMV kernel");
  });
}

void quantize_activations_q8(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, cudaStream_t stream) {
  if (n < 1 || cols < 32 || cols % 32 != 0)
    throw_error("cannot round " + std::to_string(n) + " x " + std::to_string(cols) +
                " activations to int8: need n >= 1 and cols a positive multiple of 32");
  if (reinterpret_cast<uintptr_t>(x) & 15) throw_error("activations to round must be 16-byte aligned");
  const int64_t per_block = int64_t(kWarps) * kActBlock;
  const dim3 grid(unsigned((cols + per_block - 1) / per_block), unsigned(n));
  check(launch_overlapped(round_rows_kernel<float>, grid, dim3(kWarps * 32), 0, stream, x, cols, q, d),
        "launching the activation rounding kernel");
}

void round_rows(const void* x, bool x_bf16, int64_t n, int64_t cols, void* out, cudaStream_t stream) {
  if (n < 1 || cols < 32 || cols % 32 != 0)
    throw_error("cannot round " + std::to_string(n) + " x " + std::to_string(cols) +
                " activations to int8: need n >= 1 and cols a positive multiple of 32");
  const RoundedRows r = rounded_rows_at(out, n, cols);
  const int64_t per_block = int64_t(kWarps) * kActBlock;
  const dim3 grid(unsigned((cols + per_block - 1) / per_block), unsigned(n));
  int8_t* q = const_cast<int8_t*>(r.q);
  float* d = const_cast<float*>(r.d);
  const cudaError_t e =
      x_bf16 ? launch_overlapped(round_rows_kernel<__nv_bfloat16>, grid, dim3(kWarps * 32), 0, stream,
                                 static_cast<const __nv_bfloat16*>(x), cols, q, d)
             : launch_overlapped(round_rows_kernel<float>, grid, dim3(kWarps * 32), 0, stream, static_cast<const float*>(x),
                                 cols, q, d);
  check(e, "launching the activation rounding kernel");
}

}  // namespace spill::cuda
