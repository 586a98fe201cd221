// Quantized matmul on int8 tensor cores for many tokens (prefill chunks, big batches): the
// weights' integer quants times the int8-rounded activations by mma.sync (exact int32 sums per
// scale group), then each activation block's float value and its fma into the (row, token) chain,
// in K order, exactly as block_dot.cuh's warp_dot_q8 computes them for a few tokens. So a token
// gets the same bits from these kernels as from the decode kernels, alone or in any batch.
//
// Work split: a block of 4 warps (2 along rows x 2 along tokens) takes a tile of BM rows x BN
// tokens; each warp WM x WN mma tiles of 16 rows x 8 tokens. The K loop steps by 256 weights (one
// activation block): the tile's weight rows (in their block format) and its tokens' rounded
// activations are copied into shared memory with cp.async, two steps in flight; then the block
// converts the step's weights once to int8 rows in K order plus a scale record per row
// (MmqFormat), so that the warps take both operands by ldmatrix and spend their instructions on
// mma and the integer scaling. Per scale group (32 weights, or 16 for Q3_K) one mma gives the
// exact group sums; the K-quants scale them by integer multiply-adds into the block's S and get
// the min term M from one more mma (the mins broadcast over their group), so a row's block costs a
// handful of float operations per output: d * S - dmin * M, then fma with the activation scale.
//
// Formats: Q8_0, Q5_K, Q4_K, Q3_K. Q6_K and Q2_K (scale groups of 16, like Q3_K's) would convert
// the same way but have no MmqFormat yet: they keep the decode kernels at every batch size.
//
// CPU twin: quant::quantize_activations_q8 + quant::dot_q8, as for the decode kernels.
#pragma once
#include "backend/cuda/block_dot.cuh"
#include "backend/cuda/gemv.h"

namespace spill::cuda {

constexpr int kMmqThreads = 128;  // 4 warps: 2 along rows x 2 along tokens
constexpr int kMmqKTile = 256;    // weights per K step: one activation block
constexpr int kMmqActStride = kMmqKTile + 16;  // bytes per token row in shared memory (bank-conflict free)

__host__ __device__ constexpr bool mmq_format(DType t) {
  return t == DType::Q8_0 || t == DType::Q5_K || t == DType::Q4_K || t == DType::Q3_K;
}

// ---- the formats: each K step's raw bytes converted once to int8 weights and a scale record -----
// A tile row's K step (256 weights) becomes 256 int8 weights in K order (the stored quants: 0..15
// for Q4_K, 0..31 Q5_K, -4..3 Q3_K, Q8_0's own) and a 32-byte record of its scales: for the
// K-quants d, dmin (floats) and the integer scale sc and min m of each of its groups; for Q8_0 the
// 8 blocks' d. Groups are kGroupK consecutive weights; each is one mma (k32, or k16 for Q3_K).
struct ScaleRecord {
  union {
    struct {
      float d, dmin;
      int8_t sc[16];
      uint8_t m[8];
    } k;
    float block_d[8];  // Q8_0
  };
};
static_assert(sizeof(ScaleRecord) == 32);

template <DType T>
struct MmqFormat;

template <>
struct MmqFormat<DType::Q8_0> {
  static constexpr int kUnits = 8, kGroupK = 32;  // units per K step: one per block of 32
  __device__ static void convert(const uint8_t* step, int u, int8_t* row, ScaleRecord* rec) {
    const uint8_t* b = step + 34 * u;
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; i += 2) ld_u64_a2(b + 2 + 4 * i, w[i], w[i + 1]);
    uint4* dst = reinterpret_cast<uint4*>(row + 32 * u);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    rec->block_d[u] = f16_bits_to_f32(ld_u16(b));
  }
};

template <DType T>
struct MmqFormatQ45K {
  static constexpr int kUnits = 4, kGroupK = 32;  // unit s: sub-blocks 2s, 2s+1
  __device__ static void convert(const uint8_t* step, int s, int8_t* row, ScaleRecord* rec) {
    Unit<T> unit;
    unit.load(step, s);
    uint4* dst = reinterpret_cast<uint4*>(row + 64 * s);
#pragma unroll
    for (int i = 0; i < 4; ++i) dst[i] = make_uint4(unit.w[4 * i], unit.w[4 * i + 1], unit.w[4 * i + 2], unit.w[4 * i + 3]);
    rec->k.sc[2 * s] = int8_t(unit.sc[0]);
    rec->k.sc[2 * s + 1] = int8_t(unit.sc[1]);
    rec->k.m[2 * s] = uint8_t(unit.mn_pack[0] & 0xFFu);
    rec->k.m[2 * s + 1] = uint8_t(unit.mn_pack[1] & 0xFFu);
    if (s == 0) rec->k.d = unit.d, rec->k.dmin = unit.dmin;
  }
};
template <>
struct MmqFormat<DType::Q4_K> : MmqFormatQ45K<DType::Q4_K> {};
template <>
struct MmqFormat<DType::Q5_K> : MmqFormatQ45K<DType::Q5_K> {};

template <>
struct MmqFormat<DType::Q3_K> {
  static constexpr int kUnits = 4, kGroupK = 16;  // unit s: groups 8 (s / 2) + 2 j + s % 2, j = 0..3
  __device__ static void convert(const uint8_t* step, int s, int8_t* row, ScaleRecord* rec) {
    Unit<DType::Q3_K> unit;
    unit.load(step, s);
    const int H = s >> 1, L0 = 16 * (s & 1);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<uint4*>(row + 128 * H + 32 * j + L0) =
          make_uint4(unit.w[4 * j], unit.w[4 * j + 1], unit.w[4 * j + 2], unit.w[4 * j + 3]);
      rec->k.sc[8 * H + 2 * j + (s & 1)] = int8_t(unit.sc[j]);
    }
    if (s == 0) rec->k.d = unit.d, rec->k.dmin = 0.0f;
  }
};

// c = a b (+ c for the _acc forms), int8 inputs, exact int32 sums.
__device__ __forceinline__ void mma_s8_k32(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}
__device__ __forceinline__ void mma_s8_k32_acc(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_s8_k16(int32_t (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};\n"
               : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
               : "r"(a0), "r"(a1), "r"(b0), "r"(0), "r"(0), "r"(0), "r"(0));
}
// Two 8x8 matrices of 16-byte rows from shared memory (lane l < 16 gives row l % 8 of matrix l / 8).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(p))));
}
// Four 8x8 matrices of 16-byte rows from shared memory (lane l gives row l % 8 of matrix l / 8).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(p))));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src));
}

constexpr int kMmqTileStride = kMmqKTile + 16;  // bytes per converted weight row (ldmatrix without bank conflicts)

// The tile of one block: BM weight rows x BN tokens. Shared memory: two stages of raw bytes (the
// rows' K-step segments, the tokens' int8 activations and scales) filled by cp.async, and the
// converted int8 weights and scale records of the step being computed. RW of the 4 warps lie along
// the rows (2: 2 x 2 warps, the prefill tiles; 4: all four along the rows and one token tile of 8,
// the decode tile of gemv.cu).
template <DType T, int WM, int WN, int RW = 2>
struct MmqTile {
  using U = Unit<T>;
  static_assert(RW == 2 || RW == 4, "warps along the rows: 2 (2 x 2) or 4 (4 x 1)");
  static_assert(WN % 2 == 0 || (RW == 4 && WN == 1), "B fragments load two token tiles at a time, or one of 8");
  static constexpr int BM = RW * WM * 16, BN = (4 / RW) * WN * 8;
  static constexpr int kSegBytes = kMmqKTile / U::kBlockElems * U::kBlockBytes;  // one row's bytes per K step
  // A row's segment may start anywhere in its first 16 bytes; word loads read up to 8 bytes past.
  static constexpr int kRowStride = (kSegBytes + 15 + 8 + 15) / 16 * 16;
  static constexpr int kWeightBytes = BM * kRowStride;
  static constexpr int kActBytes = BN * kMmqActStride;
  static constexpr int kStageBytes = kWeightBytes + kActBytes + BN * 4;
  static constexpr int kConvertedBytes = BM * kMmqTileStride + BM * int(sizeof(ScaleRecord));
  static constexpr int kSmemBytes = 2 * kStageBytes + kConvertedBytes + 2 * BM * 4;  // + each row's head offset per stage
};

// Runs the K loop of one tile and emits each (tile row, tile token) result.
//   row_src(tr): global address of tile row tr's first byte (every tr < BM valid); its K step kt
//   starts kt * kSegBytes later.
//   tok_row(tt): the rounded-activation row of tile token tt (every tt < BN valid).
//   k_steps: K steps of the row; chunk_steps: K steps per chunk (the GEMV's split; the chunks'
//   chains are added in chunk order; kChunked false: one chunk); k_len: weights per row (the last
//   K step of a Q8_0 row may be short).
//   emit(i, tr, tt, value) for every tr < BM, tt < BN (the caller drops the padding); i is the
//   warp's m-tile that holds tr, and the m-tiles of one (row within the m-tile, token) come in turn.
// Per K step: the K-quants' group sums c are exact int32 (mma), S = sum_g sc_g c_g by integer
// multiply-adds and M = sum_g m_g (sum of the group's x) by an mma of the mins broadcast over their
// group, then the step's value d S - dmin M; Q8_0's value is the blocks' d c added in K order. The
// value is fma'd into the chain with the activation block's scale: block_dot.cuh's arithmetic.
//   kWaitInStage: the first K step's weight copies go out before wait_for_previous_grid(), its
//   activations after (a decode kernel whose activations the previous kernel writes).
template <DType T, int WM, int WN, bool kChunked, int RW = 2, bool kWaitInStage = false, class RowSrc, class TokRow,
          class Emit>
__device__ __forceinline__ void mmq_tile(uint8_t* smem, RowSrc&& row_src, TokRow&& tok_row, const RoundedRows& acts,
                                         int k_steps, int chunk_steps, int64_t k_len, Emit&& emit) {
  using Tile = MmqTile<T, WM, WN, RW>;
  using F = MmqFormat<T>;
  using U = Unit<T>;
  constexpr int BM = Tile::BM, BN = Tile::BN;
  constexpr bool kQ8 = T == DType::Q8_0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t4 = lane & 3;
  const int wr0 = (RW == 2 ? warp >> 1 : warp) * WM * 16, wt0 = (RW == 2 ? warp & 1 : 0) * WN * 8;
  int8_t* wtile = reinterpret_cast<int8_t*>(smem + 2 * Tile::kStageBytes);
  ScaleRecord* recs = reinterpret_cast<ScaleRecord*>(smem + 2 * Tile::kStageBytes + BM * kMmqTileStride);
  int* heads = reinterpret_cast<int*>(smem + 2 * Tile::kStageBytes + Tile::kConvertedBytes);

  // Each thread stages the same weight row, token and scale at every K step: their addresses are
  // taken once (the callers' row and token arithmetic stays out of the loop).
  constexpr int kRowThreads = kMmqThreads / BM, kTokThreads = kMmqThreads / BN;
  static_assert(kMmqThreads % BM == 0 && kMmqThreads % BN == 0, "whole threads per weight row and per token");
  static_assert(BN <= kMmqThreads, "one thread per token's activation scale");
  const int w_row = threadIdx.x / kRowThreads, w_part = threadIdx.x % kRowThreads;
  const int a_tok = threadIdx.x / kTokThreads, a_part = threadIdx.x % kTokThreads;
  const uint8_t* const w_src = row_src(w_row);
  const int8_t* const a_src = acts.q + tok_row(a_tok) * acts.cols;
  const float* const d_src = threadIdx.x < BN ? acts.d + tok_row(int(threadIdx.x)) * acts.d_stride : nullptr;
  // Whether every K step of this thread's row is whole 16-byte chunks.
  constexpr bool kAlignedSegs = Tile::kSegBytes % 16 == 0;
  const bool rows_aligned = (reinterpret_cast<uintptr_t>(w_src) & 15) == 0;
  const bool all_aligned = kAlignedSegs && __syncthreads_and(rows_aligned);  // every head 0

  auto step_len = [&](int kt) {
    const int64_t k0 = int64_t(kt) * kMmqKTile;
    return int(k_len - k0 < kMmqKTile ? k_len - k0 : kMmqKTile);
  };
  auto stage = [&](int kt, int buf) {
    uint8_t* base = smem + buf * Tile::kStageBytes;
    const int kl = step_len(kt);
    const int seg = kl / U::kBlockElems * U::kBlockBytes;
    // Weight rows: kRowThreads threads per row. A whole step of 16-byte aligned segments (every
    // step of a K-quant or Q8_0 row that starts on 16 bytes) is whole 16-byte chunks; otherwise the
    // row's segment may start anywhere in its first chunk and end inside its last, of which only
    // the segment's bytes are copied (a matrix's last row may end its allocation): its whole 4-byte
    // words by cp.async, a last 1-3 bytes by hand.
    uint8_t* dst = base + w_row * Tile::kRowStride;
    const uint8_t* src = w_src + kt * Tile::kSegBytes;
    if (kAlignedSegs && rows_aligned && kl == kMmqKTile) {
      constexpr int kFull = Tile::kSegBytes / 16;
#pragma unroll
      for (int i = 0; i < (kFull + kRowThreads - 1) / kRowThreads; ++i) {
        const int c = w_part + i * kRowThreads;
        if (c < kFull) cp_async16(dst + 16 * c, src + 16 * c);
      }
      if (w_part == 0) heads[buf * BM + w_row] = 0;
    } else {
      constexpr int kChunks = (Tile::kSegBytes + 15 + 15) / 16;
      const int head = int(reinterpret_cast<uintptr_t>(src) & 15);
      const uint8_t* aligned = src - head;
      const int end = head + seg;
#pragma unroll
      for (int c = w_part; c < kChunks; c += kRowThreads) {
        if (16 * c + 16 <= end) {
          cp_async16(dst + 16 * c, aligned + 16 * c);
        } else if (16 * c < end) {
          const int n = end - 16 * c;
          for (int b = 0; b + 4 <= n; b += 4) cp_async4(dst + 16 * c + b, aligned + 16 * c + b);
          for (int b = n & ~3; b < n; ++b) dst[16 * c + b] = aligned[16 * c + b];
        }
      }
      if (w_part == 0) heads[buf * BM + w_row] = head;
    }
    if (kWaitInStage && kt == 0) wait_for_previous_grid();
    // Activations: BN tokens x this step's (up to) 256 int8 and their scale.
    uint8_t* act = base + Tile::kWeightBytes;
    const int8_t* a_step = a_src + kt * kMmqKTile;
    if (kl == kMmqKTile) {
#pragma unroll
      for (int i = 0; i < kMmqKTile / 16 / kTokThreads; ++i) {
        const int c = a_part + i * kTokThreads;
        cp_async16(act + a_tok * kMmqActStride + 16 * c, a_step + 16 * c);
      }
    } else {
      for (int c = a_part; c < kl / 16; c += kTokThreads) cp_async16(act + a_tok * kMmqActStride + 16 * c, a_step + 16 * c);
    }
    if (threadIdx.x < BN) cp_async4(reinterpret_cast<float*>(act + Tile::kActBytes) + threadIdx.x, d_src + kt);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };

  float acc[WM][WN][4], total[WM][WN][4];
#pragma unroll
  for (int i = 0; i < WM; ++i)
#pragma unroll
    for (int j = 0; j < WN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = total[i][j][e] = 0.0f;

  stage(0, 0);
  for (int kt = 0; kt < k_steps; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < k_steps) {
      stage(kt + 1, buf ^ 1);
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }
    __syncthreads();
    const uint8_t* raw = smem + buf * Tile::kStageBytes;
    const int8_t* act = reinterpret_cast<const int8_t*>(raw + Tile::kWeightBytes);
    const float* dx = reinterpret_cast<const float*>(act + Tile::kActBytes);
    const int kl = step_len(kt);
    const int units = kQ8 ? kl / 32 : F::kUnits;
    // Convert the step's weights: every (row, unit) once for the whole block, a thread's units
    // loaded together (but Q3_K's one by one: together they take the MoE tiles from 153 registers
    // to 189, which leaves two blocks per SM instead of three).
    constexpr int kConverts = BM * F::kUnits / kMmqThreads;
    static_assert(BM * F::kUnits % kMmqThreads == 0, "whole units per thread");
    auto convert = [&](int c) {
      const int i = int(threadIdx.x) + c * kMmqThreads;
      const int tr = i / F::kUnits, u = i % F::kUnits;
      const int head = all_aligned ? 0 : heads[buf * BM + tr];
      if (u < units) F::convert(raw + tr * Tile::kRowStride + head, u, wtile + tr * kMmqTileStride, recs + tr);
    };
    if constexpr (T == DType::Q3_K) {
#pragma unroll 1
      for (int c = 0; c < kConverts; ++c) convert(c);
    } else {
#pragma unroll
      for (int c = 0; c < kConverts; ++c) convert(c);
    }
    __syncthreads();

    // This lane's ldmatrix row addresses: A rows wr0 + 16 i + (lane % 8) + 8 ((lane / 8) % 2) at
    // k + 16 (lane / 16); B tokens wt0 + 8 (2 jp + lane / 16) + lane % 8 at k + 16 ((lane / 8) % 2).
    const int8_t* a_base = wtile + (wr0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kMmqTileStride + 16 * (lane >> 4);
    const int8_t* b_base = act + (wt0 + 8 * (lane >> 4) + (lane & 7)) * kMmqActStride + 16 * ((lane >> 3) & 1);
    // The B fragments of the tile's tokens for weights 32 k32 .. 32 k32 + 31 (two n-tiles per ldmatrix).
    auto load_b = [&](int k32, uint32_t (&b)[WN][2]) {
      if constexpr (WN == 1) {  // one token tile: lanes 0-15 give the addresses of its two 8x8 halves
        ldmatrix_x2(b[0], b_base + 32 * k32);
      } else {
#pragma unroll
        for (int jp = 0; jp < WN / 2; ++jp) {
          uint32_t r[4];
          ldmatrix_x4(r, b_base + 16 * jp * kMmqActStride + 32 * k32);
          b[2 * jp][0] = r[0], b[2 * jp][1] = r[1], b[2 * jp + 1][0] = r[2], b[2 * jp + 1][1] = r[3];
        }
      }
    };
    float value[WM][WN][4];
    if constexpr (kQ8) {
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        if (q >= units) break;
        uint32_t b[WN][2];
        load_b(q, b);
#pragma unroll
        for (int i = 0; i < WM; ++i) {
          uint32_t a[4];
          ldmatrix_x4(a, a_base + 16 * i * kMmqTileStride + 32 * q);
          const float d0 = recs[wr0 + 16 * i + g].block_d[q], d1 = recs[wr0 + 16 * i + g + 8].block_d[q];
#pragma unroll
          for (int j = 0; j < WN; ++j) {
            int32_t c[4];
            mma_s8_k32(c, a, b[j][0], b[j][1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float f = __fmul_rn(e < 2 ? d0 : d1, small_int_to_float(c[e]));  // |c| <= 2^19
              value[i][j][e] = q == 0 ? f : __fadd_rn(value[i][j][e], f);
            }
          }
        }
      }
    } else {
      int32_t S[WM][WN][4], M[WM][WN][4];
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[i][j][e] = M[i][j][e] = 0;
      // 32 weights per iteration: one k32 group, or two k16 groups (Q3_K). The rows' integer scales
      // (and mins) are read a 4-byte word at a time, for 4 groups, and taken apart in registers.
      uint32_t sc_word[WM][2], m_word[WM][2];
#pragma unroll
      for (int k32 = 0; k32 < 8; ++k32) {
        constexpr int kGroupsPerK32 = 32 / F::kGroupK;
        if ((k32 * kGroupsPerK32) % 4 == 0) {
          const int w = k32 * kGroupsPerK32 / 4;
#pragma unroll
          for (int i = 0; i < WM; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const ScaleRecord& r = recs[wr0 + 16 * i + g + 8 * h];
              sc_word[i][h] = reinterpret_cast<const uint32_t*>(r.k.sc)[w];
              if constexpr (U::kHasMin) m_word[i][h] = reinterpret_cast<const uint32_t*>(r.k.m)[w];
            }
        }
        auto scale = [&](int i, int h, int group) {  // the signed 8-bit scale of a group of this word
          return int32_t(int8_t(uint8_t(sc_word[i][h] >> (8 * (group % 4)))));
        };
        uint32_t b[WN][2];
        load_b(k32, b);
#pragma unroll
        for (int i = 0; i < WM; ++i) {
          uint32_t a[4];
          ldmatrix_x4(a, a_base + 16 * i * kMmqTileStride + 32 * k32);
          if constexpr (F::kGroupK == 32) {
            const int32_t sc0 = scale(i, 0, k32), sc1 = scale(i, 1, k32);
            uint32_t am[4];
            if constexpr (U::kHasMin) {  // the group's min in all four bytes
              am[0] = am[2] = __byte_perm(m_word[i][0], 0, 0x1111u * unsigned(k32 % 4));
              am[1] = am[3] = __byte_perm(m_word[i][1], 0, 0x1111u * unsigned(k32 % 4));
            }
#pragma unroll
            for (int j = 0; j < WN; ++j) {
              int32_t c[4];
              mma_s8_k32(c, a, b[j][0], b[j][1]);
#pragma unroll
              for (int e = 0; e < 4; ++e) S[i][j][e] += (e < 2 ? sc0 : sc1) * c[e];
              if constexpr (U::kHasMin) mma_s8_k32_acc(M[i][j], am, b[j][0], b[j][1]);
            }
          } else {
            // Q3_K: group 2 k32 is k = 32 k32 .. +15 (a[0], a[1]; b[.][0]), group 2 k32 + 1 the next 16.
            const int32_t sa0 = scale(i, 0, 2 * k32), sa1 = scale(i, 1, 2 * k32);
            const int32_t sb0 = scale(i, 0, 2 * k32 + 1), sb1 = scale(i, 1, 2 * k32 + 1);
#pragma unroll
            for (int j = 0; j < WN; ++j) {
              int32_t c[4], c2[4];
              mma_s8_k16(c, a[0], a[1], b[j][0]);
              mma_s8_k16(c2, a[2], a[3], b[j][1]);
#pragma unroll
              for (int e = 0; e < 4; ++e) S[i][j][e] += (e < 2 ? sa0 : sa1) * c[e] + (e < 2 ? sb0 : sb1) * c2[e];
            }
          }
        }
      }
#pragma unroll
      for (int i = 0; i < WM; ++i) {
        const ScaleRecord& r0 = recs[wr0 + 16 * i + g];
        const ScaleRecord& r1 = recs[wr0 + 16 * i + g + 8];
#pragma unroll
        for (int j = 0; j < WN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const ScaleRecord& r = e < 2 ? r0 : r1;
            value[i][j][e] = block_value<U>(r.k.d, r.k.dmin, S[i][j][e], M[i][j][e]);
          }
      }
    }
    // The step's values into the chains.
#pragma unroll
    for (int j = 0; j < WN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float dxt = dx[wt0 + 8 * j + 2 * t4 + (e & 1)];
#pragma unroll
        for (int i = 0; i < WM; ++i) acc[i][j][e] = __fmaf_rn(dxt, value[i][j][e], acc[i][j][e]);
      }
    // The end of a chunk: its chain joins the total in chunk order.
    if (kChunked && ((kt + 1) % chunk_steps == 0 || kt + 1 == k_steps)) {
      const bool first = kt + 1 <= chunk_steps;
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            total[i][j][e] = first ? acc[i][j][e] : __fadd_rn(total[i][j][e], acc[i][j][e]);
            acc[i][j][e] = 0.0f;
          }
    }
    __syncthreads();  // this stage and the converted tile are read before the next step overwrites them
  }
  // m-tiles innermost: a caller whose m-tiles pair up (gate and up rows) sees a pair's values in turn.
#pragma unroll
  for (int j = 0; j < WN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int i = 0; i < WM; ++i)
        emit(i, wr0 + 16 * i + g + 8 * (e >> 1), wt0 + 8 * j + 2 * t4 + (e & 1), kChunked ? total[i][j][e] : acc[i][j][e]);
}

}  // namespace spill::cuda
