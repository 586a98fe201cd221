// Quantized matmul on int8 tensor cores for many tokens (prefill chunks, big batches): the
// weights' integer quants times the int8-rounded activations by mma.sync (exact int32 sums per
// scale group), then each unit's float value and its fma into the (row, token) chain, in K order,
// exactly as block_dot.cuh's warp_dot_q8 computes them for a few tokens. So a token gets the same
// bits from these kernels as from the decode kernels, alone or in any batch.
//
// Work split: a block of 4 warps (2 along rows x 2 along tokens) takes a tile of BM rows x BN
// tokens; each warp WM x WN mma tiles of 16 rows x 8 tokens. The K loop steps by 256 weights (one
// activation block): the tile's weight rows (in their block format) and its tokens' rounded
// activations are copied into shared memory with cp.async, two steps in flight. Per unit (32 or 64
// weights of one block, block_dot.cuh's Unit), each of its scale groups is one mma (k32, or k16
// for Q3_K's 16-weight groups), the group sums are scaled by the groups' integer scales, and the
// units' values d * S - dmin * M are added in K order; the step's sum is fma'd into the chain with
// the activation block's scale.
//
// Formats: Q8_0, Q5_K, Q4_K, Q3_K (whose scale groups are 16 or 32 consecutive weights). Q6_K and
// Q2_K group 8 weights of a unit per scale, which no int8 mma shape takes; they keep the decode
// kernels at every batch size.
//
// CPU twin: quant::quantize_activations_q8 + quant::dot_q8, as for the decode kernels.
#pragma once
#include "backend/cuda/block_dot.cuh"

namespace spill::cuda {

constexpr int kMmqThreads = 128;  // 4 warps: 2 along rows x 2 along tokens
constexpr int kMmqKTile = 256;    // weights per K step: one activation block
constexpr int kMmqActStride = kMmqKTile + 16;  // bytes per token row in shared memory (bank-conflict free)

__host__ __device__ constexpr bool mmq_format(DType t) {
  return t == DType::Q8_0 || t == DType::Q5_K || t == DType::Q4_K || t == DType::Q3_K;
}

// Activations rounded once per call (round_rows in gemv.cu): row r's int8 values q[r * cols + i],
// the scale of each block of 256 (d[r * d_stride + b]) and the sum of each 32 (s32[r * s_stride + g],
// for the formats with mins), as quantize_tokens computes them.
struct RoundedRows {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const int16_t* s32 = nullptr;
  int64_t cols = 0, d_stride = 0, s_stride = 0;
};
__host__ __device__ inline int64_t rounded_rows_bytes(int64_t rows, int64_t cols) {
  const int64_t q = (rows * cols + 15) / 16 * 16;
  const int64_t d = (rows * ((cols + 255) / 256) * 4 + 15) / 16 * 16;
  const int64_t s = (rows * (cols / 32) * 2 + 15) / 16 * 16;
  return q + d + s;
}
__host__ __device__ inline RoundedRows rounded_rows_at(void* base, int64_t rows, int64_t cols) {
  uint8_t* p = static_cast<uint8_t*>(base);
  RoundedRows r;
  r.cols = cols;
  r.d_stride = (cols + 255) / 256;
  r.s_stride = cols / 32;
  r.q = reinterpret_cast<const int8_t*>(p);
  p += (rows * cols + 15) / 16 * 16;
  r.d = reinterpret_cast<const float*>(p);
  p += (rows * r.d_stride * 4 + 15) / 16 * 16;
  r.s32 = reinterpret_cast<const int16_t*>(p);
  return r;
}

// What the tile loop needs of a format: units per K step, scale groups per unit (one mma each),
// their length, where group g of unit u starts among the K step's 256 activations, and the 4
// int8 weights k = 4 k4 .. 4 k4 + 3 of that group from the block's bytes in shared memory.
template <DType T>
struct MmqFormat;

template <>
struct MmqFormat<DType::Q8_0> {
  static constexpr int kUnits = 8, kGroups = 1, kGroupK = 32;
  __device__ static int block_of(int u) { return u; }
  __device__ static int slot_of(int) { return 0; }
  __device__ static int act_offset(int u, int) { return 32 * u; }
  __device__ static uint32_t a_word(const uint8_t* b, int, int, int k4) { return ld_u32_a2(b + 2 + 4 * k4); }
};

template <bool kFiveBit>
struct MmqFormatQ45K {
  static constexpr int kUnits = 4, kGroups = 2, kGroupK = 32;
  __device__ static int block_of(int) { return 0; }
  __device__ static int slot_of(int u) { return u; }
  __device__ static int act_offset(int u, int g) { return 64 * u + 32 * g; }
  __device__ static uint32_t a_word(const uint8_t* b, int s, int g, int k4) {
    constexpr int kQs = kFiveBit ? 48 : 16;
    uint32_t w = (ld_u32_a2(b + kQs + 32 * s + 4 * k4) >> (4 * g)) & 0x0F0F0F0Fu;
    if constexpr (kFiveBit) w |= ((ld_u32_a2(b + 16 + 4 * k4) >> (2 * s + g)) & 0x01010101u) << 4;
    return w;
  }
};
template <>
struct MmqFormat<DType::Q4_K> : MmqFormatQ45K<false> {};
template <>
struct MmqFormat<DType::Q5_K> : MmqFormatQ45K<true> {};

template <>
struct MmqFormat<DType::Q3_K> {
  static constexpr int kUnits = 4, kGroups = 4, kGroupK = 16;
  __device__ static int block_of(int) { return 0; }
  __device__ static int slot_of(int u) { return u; }
  __device__ static int act_offset(int u, int g) { return 128 * (u >> 1) + 32 * g + 16 * (u & 1); }
  __device__ static uint32_t a_word(const uint8_t* b, int s, int g, int k4) {
    const int H = s >> 1, L0 = 16 * (s & 1);
    const uint32_t qs = ld_u32_a2(b + 32 + 32 * H + L0 + 4 * k4);
    const uint32_t hm = ld_u32_a2(b + L0 + 4 * k4);
    const uint32_t clear = (~(hm >> (4 * H + g))) & 0x01010101u;
    return ((qs >> (2 * g)) & 0x03030303u) | (clear * 0xFCu);
  }
};

__device__ __forceinline__ void mma_s8_k32(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}
__device__ __forceinline__ void mma_s8_k16(int32_t (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};\n"
               : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
               : "r"(a0), "r"(a1), "r"(b0), "r"(0), "r"(0), "r"(0), "r"(0));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src));
}

// The tile of one block: BM weight rows x BN tokens.
template <DType T, int WM, int WN>
struct MmqTile {
  using F = MmqFormat<T>;
  using U = Unit<T>;
  static constexpr int BM = 2 * WM * 16, BN = 2 * WN * 8;
  static constexpr int kSegBytes = kMmqKTile / U::kBlockElems * U::kBlockBytes;  // one row's bytes per K step
  // A row's segment may start anywhere in its first 16 bytes; word loads read up to 8 bytes past.
  static constexpr int kRowStride = (kSegBytes + 15 + 8 + 15) / 16 * 16;
  static constexpr int kWeightBytes = BM * kRowStride;
  static constexpr int kActBytes = BN * kMmqActStride;
  static constexpr int kScaleBytes = BN * 4 + (U::kHasMin ? BN * 16 : 0);
  static constexpr int kStageBytes = kWeightBytes + kActBytes + kScaleBytes;
  static constexpr int kSmemBytes = 2 * kStageBytes + 2 * BM * 4;  // two stages, each row's head offset per stage
};

// Runs the K loop of one tile and emits each (tile row, tile token) result.
//   row_src(tr, kt): global address of tile row tr's bytes for K step kt (every tr < BM valid).
//   tok_row(tt): the rounded-activation row of tile token tt (every tt < BN valid).
//   k_steps: K steps of the row; chunk_steps: K steps per chunk (the GEMV's split; the chunks'
//   chains are added in chunk order); k_len: weights per row (the last K step may be short).
//   emit(i, tr, tt, value) for every tr < BM, tt < BN (the caller drops the padding); i is the
//   warp's m-tile that holds tr, and the m-tiles of one (row within the m-tile, token) come in turn.
template <DType T, int WM, int WN, class RowSrc, class TokRow, class Emit>
__device__ __forceinline__ void mmq_tile(uint8_t* smem, RowSrc&& row_src, TokRow&& tok_row, const RoundedRows& acts,
                                         int k_steps, int chunk_steps, int64_t k_len, Emit&& emit) {
  using Tile = MmqTile<T, WM, WN>;
  using F = MmqFormat<T>;
  using U = Unit<T>;
  constexpr int BM = Tile::BM, BN = Tile::BN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t4 = lane & 3;
  const int wr0 = (warp >> 1) * WM * 16, wt0 = (warp & 1) * WN * 8;
  int* heads = reinterpret_cast<int*>(smem + 2 * Tile::kStageBytes);

  auto stage = [&](int kt, int buf) {
    uint8_t* base = smem + buf * Tile::kStageBytes;
    // This step's weights (the last step of a Q8_0 row may be short).
    const int64_t k0 = int64_t(kt) * kMmqKTile;
    const int kl = int(k_len - k0 < kMmqKTile ? k_len - k0 : kMmqKTile);
    const int seg = kl / U::kBlockElems * U::kBlockBytes;
    // Weight rows: whole 16-byte chunks inside the segment by cp.async, the partial last one by
    // bytes (a matrix's last row may end its allocation).
    constexpr int kChunks = (Tile::kSegBytes + 15 + 15) / 16;
    for (int i = threadIdx.x; i < BM * kChunks; i += kMmqThreads) {
      const int tr = i / kChunks, c = i % kChunks;
      const uint8_t* src = row_src(tr, kt);
      const uintptr_t a = reinterpret_cast<uintptr_t>(src);
      const int head = int(a & 15);
      const uint8_t* aligned = src - head;
      uint8_t* dst = base + tr * Tile::kRowStride + 16 * c;
      const int end = head + seg;
      if (16 * c + 16 <= end) cp_async16(dst, aligned + 16 * c);
      else if (16 * c < end)
        for (int b = 0; b < 16; ++b) dst[b] = 16 * c + b < end && 16 * c + b >= head ? aligned[16 * c + b] : uint8_t(0);
      if (c == 0) heads[buf * BM + tr] = head;
    }
    // Activations: BN tokens x this step's (up to) 256 int8, their scale, their sums of 32.
    uint8_t* act = base + Tile::kWeightBytes;
    for (int i = threadIdx.x; i < BN * (kl / 16); i += kMmqThreads) {
      const int tt = i / (kl / 16), c = i % (kl / 16);
      cp_async16(act + tt * kMmqActStride + 16 * c, acts.q + tok_row(tt) * acts.cols + k0 + 16 * c);
    }
    float* dx = reinterpret_cast<float*>(act + Tile::kActBytes);
    for (int tt = threadIdx.x; tt < BN; tt += kMmqThreads) cp_async4(dx + tt, acts.d + tok_row(tt) * acts.d_stride + kt);
    if constexpr (U::kHasMin) {
      int16_t* sums = reinterpret_cast<int16_t*>(dx + BN);
      for (int tt = threadIdx.x; tt < BN; tt += kMmqThreads)
        cp_async16(sums + 8 * tt, acts.s32 + tok_row(tt) * acts.s_stride + 8 * int64_t(kt));
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };

  float acc[WM][WN][4], total[WM][WN][4], sum[WM][WN][4];
#pragma unroll
  for (int i = 0; i < WM; ++i)
#pragma unroll
    for (int j = 0; j < WN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = total[i][j][e] = sum[i][j][e] = 0.0f;

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
    const uint8_t* wbase = smem + buf * Tile::kStageBytes;
    const uint8_t* act = wbase + Tile::kWeightBytes;
    const float* dx = reinterpret_cast<const float*>(act + Tile::kActBytes);
    const int16_t* sums = reinterpret_cast<const int16_t*>(dx + BN);
    // This thread's rows (tile rows wr0 + 16 i + g + 8 h) and their first byte in shared memory.
    const uint8_t* rows[WM][2];
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int tr = wr0 + 16 * i + g + 8 * h;
        rows[i][h] = wbase + tr * Tile::kRowStride + heads[buf * BM + tr];
      }
    const int kl = int(k_len - int64_t(kt) * kMmqKTile < kMmqKTile ? k_len - int64_t(kt) * kMmqKTile : kMmqKTile);
    const int units = kl / U::kBlockElems * U::kUnitsPerBlock;
#pragma unroll
    for (int u = 0; u < F::kUnits; ++u) {
      if (u >= units) break;
      const int blk = F::block_of(u), slot = F::slot_of(u);
      // The rows' scales for this unit (Unit::load; its weight lanes go unused).
      float rd[WM][2], rdmin[WM][2];
      int32_t rsc[WM][2][F::kGroups], rmin[WM][2][2];
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          U unit;
          unit.load(rows[i][h] + blk * U::kBlockBytes, slot);
          rd[i][h] = unit.d;
          rdmin[i][h] = unit.dmin;
          if constexpr (T == DType::Q8_0) {
            rsc[i][h][0] = 1;
          } else {
#pragma unroll
            for (int q = 0; q < F::kGroups; ++q) rsc[i][h][q] = unit.sc[q];
          }
          if constexpr (U::kHasMin) {
            rmin[i][h][0] = int32_t(unit.mn_pack[0] & 0xFFu);
            rmin[i][h][1] = int32_t(unit.mn_pack[1] & 0xFFu);
          } else {
            rmin[i][h][0] = rmin[i][h][1] = 0;
          }
        }
      int32_t S[WM][WN][4];
#pragma unroll
      for (int q = 0; q < F::kGroups; ++q) {
        const int ao = F::act_offset(u, q);
        uint32_t bw[WN][2];
#pragma unroll
        for (int j = 0; j < WN; ++j) {
          const int8_t* tok = reinterpret_cast<const int8_t*>(act) + (wt0 + 8 * j + g) * kMmqActStride + ao + 4 * t4;
          bw[j][0] = *reinterpret_cast<const uint32_t*>(tok);
          bw[j][1] = F::kGroupK == 32 ? *reinterpret_cast<const uint32_t*>(tok + 16) : 0u;
        }
#pragma unroll
        for (int i = 0; i < WM; ++i) {
          const uint8_t* b0 = rows[i][0] + blk * U::kBlockBytes;
          const uint8_t* b1 = rows[i][1] + blk * U::kBlockBytes;
          uint32_t aw[4];
          aw[0] = F::a_word(b0, slot, q, t4);
          aw[1] = F::a_word(b1, slot, q, t4);
          if constexpr (F::kGroupK == 32) {
            aw[2] = F::a_word(b0, slot, q, 4 + t4);
            aw[3] = F::a_word(b1, slot, q, 4 + t4);
          }
#pragma unroll
          for (int j = 0; j < WN; ++j) {
            int32_t c[4];
            if constexpr (F::kGroupK == 32) mma_s8_k32(c, aw, bw[j][0], bw[j][1]);
            else mma_s8_k16(c, aw[0], aw[1], bw[j][0]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int32_t v = rsc[i][e >> 1][q] * c[e];
              S[i][j][e] = q == 0 ? v : S[i][j][e] + v;
            }
          }
        }
      }
      // The unit's value per (row, token) and its fma into the chain.
#pragma unroll
      for (int j = 0; j < WN; ++j)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const int tt = wt0 + 8 * j + 2 * t4 + e2;
          const float dxt = dx[tt];
          int32_t x0 = 0, x1 = 0;
          if constexpr (U::kHasMin) {
            x0 = sums[8 * tt + 2 * slot];
            x1 = sums[8 * tt + 2 * slot + 1];
          }
#pragma unroll
          for (int i = 0; i < WM; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int e = 2 * h + e2;
              float f = __fmul_rn(rd[i][h], __int2float_rn(S[i][j][e]));
              if constexpr (U::kHasMin) {
                const int32_t M = rmin[i][h][0] * x0 + rmin[i][h][1] * x1;
                f = __fsub_rn(f, __fmul_rn(rdmin[i][h], __int2float_rn(M)));
              }
              sum[i][j][e] = u == 0 ? f : __fadd_rn(sum[i][j][e], f);
              if (u + 1 == units) acc[i][j][e] = __fmaf_rn(dxt, sum[i][j][e], acc[i][j][e]);
            }
        }
    }
    // The end of a chunk: its chain joins the total in chunk order.
    if ((kt + 1) % chunk_steps == 0 || kt + 1 == k_steps) {
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
    __syncthreads();  // this stage is read before the next iteration's copies overwrite it
  }
  // m-tiles innermost: a caller whose m-tiles pair up (gate and up rows) sees a pair's values in turn.
#pragma unroll
  for (int j = 0; j < WN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int i = 0; i < WM; ++i)
        emit(i, wr0 + 16 * i + g + 8 * (e >> 1), wt0 + 8 * j + 2 * t4 + (e & 1), total[i][j][e]);
}

}  // namespace spill::cuda
