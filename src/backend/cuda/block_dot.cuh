// The decode core shared by the quantized GEMV (gemv.cu) and the MoE expert kernels (moe.cu):
// per-format decoders of 32-weight units straight from the ggml block bytes, and the warp routine
// that stages a few weight rows in shared memory with coalesced 16-byte copies and dots them with
// up to 8 activation rows.
//
// CPU twin: quant::dequantize_row (src/quant/dequantize.cpp) gives the value of every weight; the
// tests compare these kernels with a float64 dot over those values.
//
// Arithmetic, fixed so that a row's result never depends on the batch:
//  * every weight is w = dl * q - ml, with q a small integer decoded exactly (the "magic" float
//    2^23 + q minus 2^23 + offset is exact), dl the sub-block scale and ml its offset (zero for the
//    formats whose offset is folded into q: Q8_0, Q6_K, Q3_K);
//  * a lane sums q * x over 8 consecutive weights (two fma chains of 4, then their sum), adds dl * that sum and
//    subtracts ml * sum(x) (Q4_K, Q5_K, Q2_K): the factored form costs one fma per weight and token;
//  * lane l takes the row's 32-weight units l, l + 32, ...; lanes are summed by one butterfly
//    (offsets 16, 8, 4, 2, 1) for every value, whichever lane ends up holding it.
// Every operation is an explicit _rn intrinsic so the compiler cannot contract differently in
// different instantiations (warp_dot_rows's token-group sizes give bit-identical results).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/dtype.h"

namespace spill::cuda {

constexpr int kRowsPerWarp = 4;   // rows a warp dots at once: x is loaded once for all four

// ---- small device helpers ---------------------------------------------------------------------

__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// 2^23 + b for each byte b of w, minus (2^23 + offset): the byte's value minus offset, exactly.
__device__ __forceinline__ void bytes_to_floats(uint32_t w, float offset, float out[4]) {
  const float bias = 8388608.0f + offset;
  out[0] = __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440)), bias);
  out[1] = __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7441)), bias);
  out[2] = __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7442)), bias);
  out[3] = __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7443)), bias);
}

// A 32-bit word from shared memory at any 2-byte-aligned address (block formats of 34, 110 and 210
// bytes leave rows only 2-byte aligned).
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  return __funnelshift_r(w[0], w[1], unsigned(a & 3) * 8u);
}
// Two consecutive words at a 2-byte-aligned address.
__device__ __forceinline__ void ld_u64_a2(const uint8_t* p, uint32_t& lo, uint32_t& hi) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
  const unsigned s = unsigned(a & 3) * 8u;
  const uint32_t w0 = w[0], w1 = w[1], w2 = w[2];
  lo = __funnelshift_r(w0, w1, s);
  hi = __funnelshift_r(w1, w2, s);
}
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// ---- per-format unit decoders -----------------------------------------------------------------
// A unit is 32 weights of one block that one lane decodes: four groups of 8 consecutive weights.
// load() reads the unit's bytes and scales once; group() yields 8 values of q and the group's
// (dl, ml); x_offset() is where in the block the group's first weight sits.

template <DType T>
struct Unit;

template <>
struct Unit<DType::Q8_0> {
  static constexpr int kUnitsPerBlock = 1, kBlockElems = 32, kBlockBytes = 34;
  static constexpr bool kHasMin = false;
  uint32_t q[8];
  float d;
  __device__ __forceinline__ void load(const uint8_t* b, int) {
    d = f16_bits_to_f32(ld_u16(b));
#pragma unroll
    for (int i = 0; i < 8; i += 2) ld_u64_a2(b + 2 + 4 * i, q[i], q[i + 1]);
  }
  __device__ static __forceinline__ int x_offset(int, int g) { return 8 * g; }
  __device__ __forceinline__ void group(int g, float v[8], float& dl, float& ml) const {
    // int8 as unsigned (q + 128) so the magic conversion applies; offset 128 restores the sign.
    bytes_to_floats(q[2 * g] ^ 0x80808080u, 128.0f, v);
    bytes_to_floats(q[2 * g + 1] ^ 0x80808080u, 128.0f, v + 4);
    dl = d;
    ml = 0.0f;
  }
};

// Q4_K and Q5_K: unit s of 8 covers qs bytes 32p + l0 .. +16 (p = s/2, l0 = 16 (s%2)): their low
// nibbles are sub-block 2p, their high nibbles sub-block 2p+1, at positions l0 .. l0+15.
template <bool kFiveBit>
struct UnitQ45K {
  static constexpr int kUnitsPerBlock = 8, kBlockElems = 256;
  static constexpr int kBlockBytes = kFiveBit ? 176 : 144;
  static constexpr int kQsOffset = kFiveBit ? 48 : 16;
  static constexpr bool kHasMin = true;
  uint32_t qs[4];
  uint32_t qh[4];  // Q5_K: the fifth bits of those 16 weights' bytes (qh[l0 .. l0+15])
  float dl[2], ml[2];
  int sub;  // 2p
  __device__ __forceinline__ void load(const uint8_t* b, int s) {
    const int p = s >> 1, l0 = 16 * (s & 1);
    const uint32_t head_x = *reinterpret_cast<const uint32_t*>(b);  // d, dmin (scales[12] follow)
    const uint4 q4 = *reinterpret_cast<const uint4*>(b + kQsOffset + 32 * p + l0);
    qs[0] = q4.x, qs[1] = q4.y, qs[2] = q4.z, qs[3] = q4.w;
    if constexpr (kFiveBit) {
      const uint4 h4 = *reinterpret_cast<const uint4*>(b + 16 + l0);
      qh[0] = h4.x, qh[1] = h4.y, qh[2] = h4.z, qh[3] = h4.w;
    }
    const float d = f16_bits_to_f32(uint16_t(head_x & 0xFFFF)), dmin = f16_bits_to_f32(uint16_t(head_x >> 16));
    // Scale bytes straight from shared memory: indexing the register copy by the run-time j put it
    // in local memory (a stack frame and LDL/STL per unit).
    const uint8_t* sc = b + 4;
    sub = 2 * p;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 2 * p + h;
      uint32_t scale, min;
      if (j < 4) {
        scale = sc[j] & 63;
        min = sc[j + 4] & 63;
      } else {
        scale = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
      }
      dl[h] = __fmul_rn(d, float(scale));
      ml[h] = __fmul_rn(dmin, float(min));
    }
  }
  __device__ static __forceinline__ int x_offset(int s, int g) {
    return 64 * (s >> 1) + 16 * (s & 1) + 8 * (g & 1) + 32 * (g >> 1);
  }
  __device__ __forceinline__ void group(int g, float v[8], float& d, float& m) const {
    const int half = g >> 1;  // 0: low nibbles (sub-block 2p), 1: high nibbles (2p+1)
    const int w = 2 * (g & 1);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t nib = (qs[w + i] >> (4 * half)) & 0x0F0F0F0Fu;
      if constexpr (kFiveBit) nib |= ((qh[w + i] >> (sub + half)) & 0x01010101u) << 4;
      bytes_to_floats(nib, 0.0f, v + 4 * i);
    }
    d = dl[half];
    m = ml[half];
  }
};
template <>
struct Unit<DType::Q4_K> : UnitQ45K<false> {};
template <>
struct Unit<DType::Q5_K> : UnitQ45K<true> {};

// Q6_K: unit s covers half h = s/4 (128 weights), positions l0 .. l0+7 (l0 = 8 (s%4)) of each of
// its four 32-weight quarters: ql[64h + l0], ql[64h + 32 + l0], qh[32h + l0], 8 bytes each.
template <>
struct Unit<DType::Q6_K> {
  static constexpr int kUnitsPerBlock = 8, kBlockElems = 256, kBlockBytes = 210;
  static constexpr bool kHasMin = false;
  uint32_t qa[2], qb[2], qh[2];
  float dl[4];
  __device__ __forceinline__ void load(const uint8_t* b, int s) {
    const int h = s >> 2, l0 = 8 * (s & 3), is = l0 >> 4;
    ld_u64_a2(b + 64 * h + l0, qa[0], qa[1]);
    ld_u64_a2(b + 64 * h + 32 + l0, qb[0], qb[1]);
    ld_u64_a2(b + 128 + 32 * h + l0, qh[0], qh[1]);
    const float d = f16_bits_to_f32(ld_u16(b + 208));
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h + is);
#pragma unroll
    for (int g = 0; g < 4; ++g) dl[g] = __fmul_rn(d, float(sc[2 * g]));
  }
  __device__ static __forceinline__ int x_offset(int s, int g) { return 128 * (s >> 2) + 32 * g + 8 * (s & 3); }
  __device__ __forceinline__ void group(int g, float v[8], float& d, float& m) const {
    const int nib_shift = 4 * (g >> 1), hi_shift = 2 * g;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t low = (g & 1) ? qb[i] : qa[i];
      const uint32_t q = ((low >> nib_shift) & 0x0F0F0F0Fu) | (((qh[i] >> hi_shift) & 0x03030303u) << 4);
      bytes_to_floats(q, 32.0f, v + 4 * i);
    }
    d = dl[g];
    m = 0.0f;
  }
};

// Q3_K and Q2_K share the 2-bit plane layout: byte L (0..31) of qs half H holds weights
// 128H + 32j + L in bit pair j. Unit s: H = s/4, bytes L0 .. L0+7 (L0 = 8 (s%4)); group j is
// sub-block 8H + 2j + L0/16.
template <>
struct Unit<DType::Q3_K> {
  static constexpr int kUnitsPerBlock = 8, kBlockElems = 256, kBlockBytes = 110;
  static constexpr bool kHasMin = false;
  uint32_t qs[2], hm[2];
  float dl[4];
  int hbit0;  // 4H: hmask bit of plane 0
  __device__ __forceinline__ void load(const uint8_t* b, int s) {
    const int H = s >> 2, L0 = 8 * (s & 3);
    ld_u64_a2(b + 32 + 32 * H + L0, qs[0], qs[1]);
    ld_u64_a2(b + L0, hm[0], hm[1]);
    hbit0 = 4 * H;
    const float d = f16_bits_to_f32(ld_u16(b + 108));
    const uint8_t* sc = b + 96;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = 8 * H + 2 * j + (L0 >> 4);
      const uint32_t low = k < 8 ? (sc[k] & 0xF) : (sc[k - 8] >> 4);
      const uint32_t high = (sc[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
      dl[j] = __fmul_rn(d, float(int(low | (high << 4)) - 32));
    }
  }
  __device__ static __forceinline__ int x_offset(int s, int g) { return 128 * (s >> 2) + 32 * g + 8 * (s & 3); }
  __device__ __forceinline__ void group(int g, float v[8], float& d, float& m) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // q + 4 = low two bits | (high bit << 2): the high bit set means +0, clear means -4.
      const uint32_t q = ((qs[i] >> (2 * g)) & 0x03030303u) | (((hm[i] >> (hbit0 + g)) & 0x01010101u) << 2);
      bytes_to_floats(q, 4.0f, v + 4 * i);
    }
    d = dl[g];
    m = 0.0f;
  }
};

template <>
struct Unit<DType::Q2_K> {
  static constexpr int kUnitsPerBlock = 8, kBlockElems = 256, kBlockBytes = 84;
  static constexpr bool kHasMin = true;
  uint32_t qs[2];
  float dl[4], ml[4];
  __device__ __forceinline__ void load(const uint8_t* b, int s) {
    const int H = s >> 2, L0 = 8 * (s & 3);
    ld_u64_a2(b + 16 + 32 * H + L0, qs[0], qs[1]);
    const float d = f16_bits_to_f32(ld_u16(b + 80)), dmin = f16_bits_to_f32(ld_u16(b + 82));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t sc = b[8 * H + 2 * j + (L0 >> 4)];
      dl[j] = __fmul_rn(d, float(sc & 0xF));
      ml[j] = __fmul_rn(dmin, float(sc >> 4));
    }
  }
  __device__ static __forceinline__ int x_offset(int s, int g) { return 128 * (s >> 2) + 32 * g + 8 * (s & 3); }
  __device__ __forceinline__ void group(int g, float v[8], float& d, float& m) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) bytes_to_floats((qs[i] >> (2 * g)) & 0x03030303u, 0.0f, v + 4 * i);
    d = dl[g];
    m = ml[g];
  }
};

// ---- activations ------------------------------------------------------------------------------

template <class XT>
__device__ __forceinline__ void load_x8(const XT* p, float x[8]);
template <>
__device__ __forceinline__ void load_x8<float>(const float* p, float x[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
template <>
__device__ __forceinline__ void load_x8<__nv_bfloat16>(const __nv_bfloat16* p, float x[8]) {
  const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __uint_as_float(w[i] << 16);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// ---- staging rows in shared memory ------------------------------------------------------------

// Shared bytes one staged row segment of `seg_bytes` takes: the segment may start anywhere inside
// its first 16-byte chunk, and is copied as whole aligned chunks.
__host__ __device__ constexpr int staged_row_stride(int seg_bytes) { return (seg_bytes + 15 + 15) / 16 * 16; }

// The warp copies each of its rows' segment [src, src + seg_bytes) into its shared slot with
// 16-byte cp.async (coalesced: consecutive lanes take consecutive chunks). Chunks cover
// [src & ~15, src + seg_bytes); bytes past the segment's end are never read (zero-filled), so a
// matrix's last row may end its allocation. The copies go out as one commit group per `part_bytes`
// of the rows (the bytes one pass of warp_dot_rows's lane loop decodes), so decoding can start on
// the first part while the others are in flight: wait_staged_part(i, parts) before decoding part i.
// Returns the number of parts; staged[r] is where row r's first byte lands.
__device__ __forceinline__ int stage_rows(const uint8_t* const src[kRowsPerWarp], int seg_bytes, int part_bytes,
                                          uint8_t* slot, int stride, const uint8_t* staged[kRowsPerWarp], int lane) {
  const int parts = (seg_bytes + part_bytes - 1) / part_bytes;
  int first_piece[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(src[r]);
    staged[r] = slot + r * stride + (start & 15);
    first_piece[r] = 0;
  }
  for (int part = 0; part < parts; ++part) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const uintptr_t start = reinterpret_cast<uintptr_t>(src[r]);
      const uintptr_t base = start & ~uintptr_t(15);
      const uintptr_t end = start + uintptr_t(seg_bytes);
      // Pieces whose first byte lies before the end of this part (a piece that straddles two parts
      // belongs to the earlier one, which needs it first).
      const uintptr_t part_end = start + uintptr_t(min((part + 1) * part_bytes, seg_bytes));
      const int last_piece = int((part_end - base + 15) / 16);
      uint8_t* dst = slot + r * stride;
      for (int c = first_piece[r] + lane; c < last_piece; c += 32) {
        const uintptr_t from = base + uintptr_t(c) * 16;
        if (end - from >= 16) {
          const unsigned dst_s = static_cast<unsigned>(__cvta_generic_to_shared(dst + c * 16));
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst_s), "l"(from));
        } else {
          // The segment's last bytes, where it ends inside a 16-byte chunk: byte loads, so
          // nothing past the end (maybe the end of the allocation) is touched.
          const uint8_t* p = reinterpret_cast<const uint8_t*>(from);
          for (int i = 0; i < 16; ++i) dst[c * 16 + i] = from + i < end ? p[i] : uint8_t(0);
        }
      }
      first_piece[r] = last_piece;
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  return parts;
}

// Waits until parts 0 .. part of stage_rows have landed for the whole warp.
__device__ __forceinline__ void wait_staged_part(int part, int parts) {
  switch (parts - 1 - part) {  // groups still allowed in flight (an immediate operand)
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
  }
  __syncwarp();
}

// Bytes of one row that one pass of the lane loop (32 units) decodes.
template <DType T>
__device__ __forceinline__ int part_bytes_of() {
  return 32 / Unit<T>::kUnitsPerBlock * Unit<T>::kBlockBytes;
}

// Programmatic dependent launch (sm_90): wait for the grids this one depends on (their writes are
// then visible), and let the next grid in the stream start its prologue early. Both are no-ops
// for a kernel launched without the programmatic-serialization attribute.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// ---- the warp dot -----------------------------------------------------------------------------

// Sums v over the 32 lanes of a warp for all R*NG values at once: the first log2(R*NG) butterfly
// steps halve the values each lane carries (so a step moves half as many values as the last), the
// rest are plain butterflies. Every value is summed over lane bit 4, then 3, 2, 1, 0: the same
// tree whatever R*NG is. Returns the value this lane ends up holding; owner_index() says which.
template <int V>
__device__ __forceinline__ float warp_reduce_transposed(float (&v)[V], int lane) {
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "V must be a power of two up to 32");
  int offset = 16;
#pragma unroll
  for (int half = V / 2; half >= 1; half /= 2, offset /= 2) {
    const bool upper = lane & offset;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const float send = upper ? v[i] : v[i + half];
      const float keep = upper ? v[i + half] : v[i];
      v[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, offset));
    }
  }
  float s = v[0];
  for (; offset >= 1; offset /= 2) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, offset));
  return s;
}
// Which of the V values warp_reduce_transposed left in `lane`.
template <int V>
__device__ __forceinline__ int owner_index(int lane) {
  int index = 0, offset = 16;
  for (int half = V / 2; half >= 1; half /= 2, offset /= 2)
    if (lane & offset) index += half;
  return index;
}

// Dots kRowsPerWarp staged rows of `k_len` weights (whole blocks) with NG activation rows
// (xs[t] points at the first of their k_len values). For each of its units a lane loads the
// unit's 32 activations of each token once (registers), then decodes the unit in each row in
// turn, so few values are live at once. emit(row, token, value) is called once per (row, token)
// by the lane that holds the sum.
template <DType T, int NG, class XT, class Emit>
__device__ __forceinline__ void warp_dot_rows(const uint8_t* const staged[kRowsPerWarp], int k_len,
                                              const XT* const xs[NG], int lane, int parts_to_wait, Emit&& emit) {
  using U = Unit<T>;
  float acc[kRowsPerWarp * NG];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp * NG; ++i) acc[i] = 0.0f;
  const int units = k_len / U::kBlockElems * U::kUnitsPerBlock;
  const int passes = (units + 31) / 32;
  for (int pass = 0; pass < passes; ++pass) {
    const int u = pass * 32 + lane;
    float x[NG][4][8];
    float sum_x[NG][4];
    const int block = u / U::kUnitsPerBlock, slot = u % U::kUnitsPerBlock;
    if (u < units) {  // activations first: they do not wait for the staged weights
#pragma unroll
      for (int t = 0; t < NG; ++t)
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          load_x8(xs[t] + block * U::kBlockElems + U::x_offset(slot, g), x[t][g]);
          if constexpr (U::kHasMin) {
            float sx = x[t][g][0];
#pragma unroll
            for (int i = 1; i < 8; ++i) sx = __fadd_rn(sx, x[t][g][i]);
            sum_x[t][g] = sx;
          }
        }
    }
    if (parts_to_wait) wait_staged_part(pass, parts_to_wait);
    if (u >= units) continue;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      U unit;
      unit.load(staged[r] + block * U::kBlockBytes, slot);
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        float q[8], dl, ml;
        unit.group(g, q, dl, ml);
#pragma unroll
        for (int t = 0; t < NG; ++t) {
          // Two chains of four (even and odd weights) for instruction-level parallelism.
          float s0 = __fmul_rn(q[0], x[t][g][0]), s1 = __fmul_rn(q[1], x[t][g][1]);
#pragma unroll
          for (int i = 2; i < 8; i += 2) {
            s0 = __fmaf_rn(q[i], x[t][g][i], s0);
            s1 = __fmaf_rn(q[i + 1], x[t][g][i + 1], s1);
          }
          const float s = __fadd_rn(s0, s1);
          float& a = acc[r * NG + t];
          a = __fmaf_rn(dl, s, a);
          if constexpr (U::kHasMin) a = __fmaf_rn(-ml, sum_x[t][g], a);
        }
      }
    }
  }
  const float total = warp_reduce_transposed<kRowsPerWarp * NG>(acc, lane);
  const int index = owner_index<kRowsPerWarp * NG>(lane);
  // Values are replicated over 32 / (R*NG) lanes; the lowest of each set emits.
  constexpr int kReplicas = 32 / (kRowsPerWarp * NG);
  if ((lane & (kReplicas - 1)) == 0) emit(index / NG, index % NG, total);
}

// Runs warp_dot_rows over n activation rows, one at a time: each row re-decodes the staged
// weights (cheap next to HBM) instead of holding several rows' activations in registers, which
// spilled and halved the warps an SM holds (docs/perf/NOTES.md). x_row(i) gives row i;
// emit(row, i, value) as in warp_dot_rows; group_done(i) after row i's emits. parts: what
// stage_rows returned (the first row waits for each part as it decodes it).
template <DType T, class XT, class XRow, class Emit, class GroupDone>
__device__ __forceinline__ void warp_dot_rows_all(const uint8_t* const staged[kRowsPerWarp], int k_len, int parts,
                                                  int n, XRow&& x_row, int lane, Emit&& emit,
                                                  GroupDone&& group_done) {
  for (int t = 0; t < n; ++t) {
    const XT* xs[1] = {x_row(t)};
    warp_dot_rows<T, 1, XT>(staged, k_len, xs, lane, t == 0 ? parts : 0,
                            [&](int r, int, float v) { emit(r, t, v); });
    group_done(t);
  }
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization,
// so it may start while the previous kernel in the stream finishes (see wait_for_previous_grid).
template <class... Params, class... Args>
__host__ cudaError_t launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                       cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Calls f(std::integral_constant<DType, T>) for the block formats the CUDA kernels decode.
template <class F>
__host__ bool dispatch_block_type(DType t, F&& f) {
  switch (t) {
    case DType::Q8_0: f(std::integral_constant<DType, DType::Q8_0>{}); return true;
    case DType::Q6_K: f(std::integral_constant<DType, DType::Q6_K>{}); return true;
    case DType::Q5_K: f(std::integral_constant<DType, DType::Q5_K>{}); return true;
    case DType::Q4_K: f(std::integral_constant<DType, DType::Q4_K>{}); return true;
    case DType::Q3_K: f(std::integral_constant<DType, DType::Q3_K>{}); return true;
    case DType::Q2_K: f(std::integral_constant<DType, DType::Q2_K>{}); return true;
    default: return false;
  }
}

}  // namespace spill::cuda
