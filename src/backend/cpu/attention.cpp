// Paged attention on the CPU: a blocked flash-style kernel with an online softmax.
//
// Why blocked: attention of a prefill chunk of n queries over p positions is 4 * n * p * head_dim
// flops per head, and the keys and values it reads are the same for every query of the chunk. A
// kernel that walks K and V once per (query, head) re-reads p * head_dim * 8 bytes each time and is
// bound by memory (and, scalar, by one multiply-add per cycle). Here a block of consecutive queries
// (times the query heads that share one KV head) walks K and V once, in tiles of kTile positions:
// each tile of K is transposed once into a [head_dim][kTile] buffer so that the scores of a query
// are 8-wide multiply-adds over 8 positions with q broadcast, and each value row is read once per
// block. docs/perf/NOTES.md has the flop and byte counts.
//
// Batch invariance (ops.h): a query's arithmetic depends only on its own position, its own q and
// the cache, never on which other queries share its block or its step:
//   - tiles are aligned to absolute positions (multiples of kTile), so a query meets the same tiles
//     whatever block it is in;
//   - a score is one fma chain over d = 0, 1, ... from 0 (explicit fma, so no contraction choice
//     of the compiler can differ between the one-row and two-row paths), times the scale;
//   - a query's softmax state (running max m, running sum l, output accumulator o) is updated per
//     tile from the positions that query sees in that tile only, in ascending order; the tile's
//     partial sum of exp() is an 8-lane sum with the lane fixed by the position's place in the tile
//     (positions a query does not see add +0, which leaves a sum of non-negative terms unchanged)
//     and a fixed reduction tree.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "backend/cpu/ops.h"

namespace spill::cpu {
namespace {

// ---- 8 floats ---------------------------------------------------------------------------------
// The kernel is written once over this type: AVX2 + FMA intrinsics on x86-64-v3 (the default
// build), a plain array with std::fma elsewhere. Both do the same operations in the same order.
#if defined(__AVX2__) && defined(__FMA__)
struct F8 {
  __m256 v;
};
inline F8 load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline void store(float* p, F8 a) { _mm256_storeu_ps(p, a.v); }
inline F8 splat(float x) { return {_mm256_set1_ps(x)}; }
inline F8 zero8() { return {_mm256_setzero_ps()}; }
inline F8 fma(F8 a, F8 b, F8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline F8 mul(F8 a, F8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline F8 add(F8 a, F8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline F8 sub(F8 a, F8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline F8 div(F8 a, F8 b) { return {_mm256_div_ps(a.v, b.v)}; }
inline F8 max(F8 a, F8 b) { return {_mm256_max_ps(a.v, b.v)}; }
// Lanes where keep holds take a, the others b.
inline F8 select(F8 keep, F8 a, F8 b) { return {_mm256_blendv_ps(b.v, a.v, keep.v)}; }
// All-ones lanes where lo <= x < hi.
inline F8 in_range(F8 x, F8 lo, F8 hi) {
  return {_mm256_and_ps(_mm256_cmp_ps(x.v, lo.v, _CMP_GE_OQ), _mm256_cmp_ps(x.v, hi.v, _CMP_LT_OQ))};
}
inline F8 less_than(F8 a, F8 b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ)}; }
inline F8 round_nearest(F8 a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
// 2^n for integral n in [-126, 127].
inline F8 pow2(F8 n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n.v), _mm256_set1_epi32(127));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(e, 23))};
}
// Lanes summed as ((0+4) + (2+6)) + ((1+5) + (3+7)).
inline float sum8(F8 a) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
// out[i * stride + j] = rows[j][i] for an 8x8 block.
inline void transpose8(const float* const rows[8], float* out, int64_t stride) {
  __m256 r[8], t[8];
  for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(rows[j]);
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4)
    for (int i = 0; i < 2; ++i) {
      r[j + i] = _mm256_shuffle_ps(t[j + i], t[j + i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[j + i + 2] = _mm256_shuffle_ps(t[j + i], t[j + i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    }
  // r[0..3]: columns (0,4) (2,6) (1,5) (3,7) of rows 0-3 in their two halves; r[4..7] of rows 4-7.
  const int column[4] = {0, 2, 1, 3};
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + column[i] * stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(out + (column[i] + 4) * stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
inline float max8(F8 a) {
  const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
}
#else
struct F8 {
  float v[8];
};
template <class Fn>
inline F8 lanes(Fn fn) {
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = fn(i);
  return r;
}
inline F8 load(const float* p) { return lanes([&](int i) { return p[i]; }); }
inline void store(float* p, F8 a) { std::memcpy(p, a.v, sizeof a.v); }
inline F8 splat(float x) { return lanes([&](int) { return x; }); }
inline F8 zero8() { return splat(0.0f); }
inline F8 fma(F8 a, F8 b, F8 c) { return lanes([&](int i) { return std::fma(a.v[i], b.v[i], c.v[i]); }); }
inline F8 mul(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] * b.v[i]; }); }
inline F8 add(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] + b.v[i]; }); }
inline F8 sub(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] - b.v[i]; }); }
inline F8 div(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] / b.v[i]; }); }
inline F8 max(F8 a, F8 b) { return lanes([&](int i) { return std::max(a.v[i], b.v[i]); }); }
// Masks are 1.0f (keep) or 0.0f.
inline F8 select(F8 keep, F8 a, F8 b) { return lanes([&](int i) { return keep.v[i] != 0.0f ? a.v[i] : b.v[i]; }); }
inline F8 in_range(F8 x, F8 lo, F8 hi) {
  return lanes([&](int i) { return x.v[i] >= lo.v[i] && x.v[i] < hi.v[i] ? 1.0f : 0.0f; });
}
inline F8 less_than(F8 a, F8 b) { return lanes([&](int i) { return a.v[i] < b.v[i] ? 1.0f : 0.0f; }); }
inline F8 round_nearest(F8 a) { return lanes([&](int i) { return std::nearbyint(a.v[i]); }); }
inline F8 pow2(F8 n) {
  return lanes([&](int i) {
    const uint32_t bits = uint32_t(int32_t(n.v[i]) + 127) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  });
}
inline float sum8(F8 a) {
  return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7]));
}
inline float max8(F8 a) { return *std::max_element(a.v, a.v + 8); }
inline void transpose8(const float* const rows[8], float* out, int64_t stride) {
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) out[i * stride + j] = rows[j][i];
}
#endif

// exp(x) for x <= 0 (every argument here is a score minus a running max), within 2 ulp of the
// exact value down to x = -87.3 and 0 below (exp(-inf) = 0: a first tile rescales nothing).
// Range reduction x = n ln2 + r with ln2 split in two so n * ln2_hi is exact, then a degree-6
// polynomial for e^r on |r| <= ln2 / 2 (Cephes' expf coefficients).
inline F8 exp_nonpositive(F8 x) {
  const F8 underflow = less_than(x, splat(-87.33654f));
  x = max(x, splat(-87.33654f));
  const F8 n = round_nearest(mul(x, splat(1.44269504088896341f)));
  F8 r = fma(n, splat(-0.693359375f), x);
  r = fma(n, splat(2.12194440e-4f), r);
  F8 p = splat(1.9875691500e-4f);
  p = fma(p, r, splat(1.3981999507e-3f));
  p = fma(p, r, splat(8.3334519073e-3f));
  p = fma(p, r, splat(4.1665795894e-2f));
  p = fma(p, r, splat(1.6666665459e-1f));
  p = fma(p, r, splat(5.0000001201e-1f));
  p = fma(p, mul(r, r), add(r, splat(1.0f)));
  return select(underflow, zero8(), mul(p, pow2(n)));
}

constexpr int kTile = 32;          // positions per K/V tile: four F8 of scores per query row
constexpr int kVecs = kTile / 8;
constexpr int64_t kBlockRows = 32;  // query rows (tokens x heads of one KV head) that share a tile

// One unit of work: `n_tokens` consecutive tokens of one chunk, every query head of KV head kvh.
struct Block {
  const AttentionChunk* chunk;
  int32_t first, n_tokens;  // tokens [first, first + n_tokens) of the chunk
  int64_t kvh;
  int64_t cost;  // query rows times positions seen, for ordering the work
};

struct Scratch {
  std::vector<float> kt;      // [D][kTile] the tile's keys, transposed
  std::vector<float> zeros;   // [D]
  std::vector<float> vt;      // [kTile][Dp] the tile's values, padded to whole F8 (head_dim % 8 != 0 only)
  std::vector<float> scores;  // [rows][kTile] scores, then exp(score - m)
  std::vector<float> o;       // [rows][Dp] unnormalised output
  std::vector<float> m, l;    // [rows] running max and sum
  std::vector<float> alpha;   // [rows] this tile's rescale of o and l
  std::vector<int32_t> seen;  // [rows][2] the positions [a, b) of the tile a row sees
};

// scores[r][0..kTile) = (q_r . k_t) * scale for R rows; kt is [D][kTile].
template <int R>
void score_rows(const float* const* q, int64_t D, const float* kt, float scale, float* scores) {
  F8 acc[R][kVecs];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kVecs; ++j) acc[r][j] = zero8();
  for (int64_t d = 0; d < D; ++d) {
    F8 k[kVecs];
    for (int j = 0; j < kVecs; ++j) k[j] = load(kt + d * kTile + 8 * j);
    for (int r = 0; r < R; ++r) {
      const F8 qd = splat(q[r][d]);
      for (int j = 0; j < kVecs; ++j) acc[r][j] = fma(qd, k[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kVecs; ++j) store(scores + r * kTile + 8 * j, mul(acc[r][j], splat(scale)));
}

// o_r[d0, d0 + 8W) = o_r * alpha_r + sum over t in [a, b) of p_r[t] * v_t, in ascending t, for R
// rows that see the same positions of the tile; v_t = v_row(t). W is a constant so that the
// accumulators live in registers.
template <int R, int W, class VRow>
void accumulate_slice(float* const* o, const float* const* p, const float* alpha, int a, int b, int64_t d0,
                      const VRow& v_row) {
  F8 acc[R][W];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) acc[r][j] = mul(load(o[r] + d0 + 8 * j), splat(alpha[r]));
  for (int t = a; t < b; ++t) {
    const float* vp = v_row(t) + d0;
    F8 v[W];
    for (int j = 0; j < W; ++j) v[j] = load(vp + 8 * j);
    for (int r = 0; r < R; ++r) {
      const F8 pt = splat(p[r][t]);
      for (int j = 0; j < W; ++j) acc[r][j] = fma(pt, v[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j) store(o[r] + d0 + 8 * j, acc[r][j]);
}

// The same over all Dp floats of o: slices of 8 / R F8 (eight accumulators), then what is left.
template <int R, class VRow>
void accumulate_rows(float* const* o, const float* const* p, const float* alpha, int a, int b, int64_t Dp,
                     const VRow& v_row) {
  constexpr int W = 8 / R;
  int64_t d0 = 0;
  for (; d0 + 8 * W <= Dp; d0 += 8 * W) accumulate_slice<R, W>(o, p, alpha, a, b, d0, v_row);
  for (; d0 < Dp; d0 += 8) accumulate_slice<R, 1>(o, p, alpha, a, b, d0, v_row);
}

struct Problem {
  const PagedKv& kv;
  const float* q;
  int64_t n_heads, group, D, Dp;
  float scale;
  const AttentionParams& params;
  float* out;
};

void run_block(const Problem& pb, const Block& blk, Scratch& s) {
  const AttentionChunk& c = *blk.chunk;
  const PagedKv& kv = pb.kv;
  const int64_t D = pb.D, Dp = pb.Dp, group = pb.group;
  const int64_t rows = int64_t(blk.n_tokens) * group;
  const int32_t window = pb.params.window;
  // Row r: token blk.first + r / group of the chunk, head kvh * group + r % group.
  auto row_pos = [&](int64_t r) { return c.start_pos + blk.first + int32_t(r / group); };
  auto row_first = [&](int64_t r) { return window > 0 ? std::max(0, row_pos(r) - window + 1) : 0; };
  std::vector<const float*> q_rows(static_cast<size_t>(rows));
  std::vector<float*> o_rows(static_cast<size_t>(rows));
  s.o.assign(size_t(rows * Dp), 0.0f);
  s.scores.resize(size_t(rows * kTile));
  s.m.resize(size_t(rows));
  s.l.resize(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = c.first_token + blk.first + r / group, h = blk.kvh * group + r % group;
    q_rows[size_t(r)] = pb.q + (token * pb.n_heads + h) * D;
    o_rows[size_t(r)] = s.o.data() + r * Dp;
    // A sink is a logit that joins the softmax from the start: m = sink, l = exp(0) = 1, o = 0.
    s.m[size_t(r)] = pb.params.sinks ? pb.params.sinks[h] : -INFINITY;
    s.l[size_t(r)] = pb.params.sinks ? 1.0f : 0.0f;
  }
  const int32_t lo = row_first(0), hi = row_pos(rows - 1) + 1;  // positions any row sees
  s.kt.resize(size_t(D * kTile));
  s.zeros.assign(size_t(D), 0.0f);
  const float* zeros = s.zeros.data();  // the key row of a position no row of the block sees
  if (Dp != D) s.vt.assign(size_t(kTile * Dp), 0.0f);
  s.alpha.resize(size_t(rows));
  s.seen.resize(size_t(2 * rows));
  float* alpha = s.alpha.data();
  int32_t* a_of = s.seen.data();
  std::vector<const float*> p_rows(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) p_rows[size_t(r)] = s.scores.data() + r * kTile;
  const F8 lane_base[kVecs] = {
#if defined(__AVX2__) && defined(__FMA__)
      {_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7)}, {_mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15)},
      {_mm256_setr_ps(16, 17, 18, 19, 20, 21, 22, 23)}, {_mm256_setr_ps(24, 25, 26, 27, 28, 29, 30, 31)}};
#else
      {{0, 1, 2, 3, 4, 5, 6, 7}}, {{8, 9, 10, 11, 12, 13, 14, 15}}, {{16, 17, 18, 19, 20, 21, 22, 23}},
      {{24, 25, 26, 27, 28, 29, 30, 31}}};
#endif
  static_assert(kVecs == 4, "lane_base lists four F8");

  for (int32_t ts = lo / kTile * kTile; ts < hi; ts += kTile) {
    // 1. The tile's keys (positions this block sees; zeros elsewhere), transposed 8x8 at a time.
    const int32_t t_lo = std::max(ts, lo) - ts, t_hi = std::min(ts + kTile, hi) - ts;
    const float* v_rows[kTile];  // null where unseen (never read)
    for (int32_t t0 = 0; t0 < kTile; t0 += 8) {
      const float* k_rows[8];
      for (int32_t j = 0; j < 8; ++j) {
        const int32_t t = t0 + j;
        if (t < t_lo || t >= t_hi) {
          k_rows[j] = zeros;
          v_rows[t] = nullptr;
          continue;
        }
        const int64_t slot = int64_t(c.block_table[size_t((ts + t) / kv.block_size)]) * kv.block_size +
                             (ts + t) % kv.block_size;
        const int64_t at = slot * kv.n_kv_heads * D + blk.kvh * D;
        k_rows[j] = kv.k + at;
        v_rows[t] = kv.v + at;
        if (Dp != D) {
          std::memcpy(s.vt.data() + t * Dp, v_rows[t], size_t(D) * 4);
          v_rows[t] = s.vt.data() + t * Dp;
        }
      }
      int64_t d = 0;
      for (; d + 8 <= D; d += 8) {
        const float* at_d[8];
        for (int j = 0; j < 8; ++j) at_d[j] = k_rows[j] + d;
        transpose8(at_d, s.kt.data() + d * kTile + t0, kTile);
      }
      for (; d < D; ++d)
        for (int32_t j = 0; j < 8; ++j) s.kt[size_t(d * kTile + t0 + j)] = k_rows[j][d];
    }
    // 2. Scores of every row against the tile.
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) score_rows<2>(q_rows.data() + r, D, s.kt.data(), pb.scale, s.scores.data() + r * kTile);
    if (r < rows) score_rows<1>(q_rows.data() + r, D, s.kt.data(), pb.scale, s.scores.data() + r * kTile);
    // 3. Per row: the positions it sees in the tile, the new running max, exp(score - max) in
    //    place of the scores (0 where unseen), the rescale of its sum.
    for (r = 0; r < rows; ++r) {
      const int32_t a = std::max(ts, row_first(r)) - ts, b = std::min(ts + kTile, row_pos(r) + 1) - ts;
      if (a >= b) {
        a_of[2 * r] = a_of[2 * r + 1] = 0;
        continue;
      }
      a_of[2 * r] = a;
      a_of[2 * r + 1] = b;
      float* sc = s.scores.data() + r * kTile;
      const F8 fa = splat(float(a)), fb = splat(float(b));
      F8 keep[kVecs], sv[kVecs];
      F8 mx = splat(-INFINITY);
      for (int j = 0; j < kVecs; ++j) {
        keep[j] = in_range(lane_base[j], fa, fb);
        sv[j] = select(keep[j], load(sc + 8 * j), splat(-INFINITY));
        mx = max(mx, sv[j]);
      }
      const float m_old = s.m[size_t(r)], m_new = std::max(m_old, max8(mx));
      F8 e[kVecs];
      for (int j = 0; j < kVecs; ++j) {
        e[j] = select(keep[j], exp_nonpositive(sub(sv[j], splat(m_new))), zero8());
        store(sc + 8 * j, e[j]);
      }
      const float tile_sum = sum8(add(add(e[0], e[1]), add(e[2], e[3])));
      alpha[r] = max8(exp_nonpositive(splat(m_old - m_new)));  // every lane holds the same value
      s.l[size_t(r)] = s.l[size_t(r)] * alpha[r] + tile_sum;
      s.m[size_t(r)] = m_new;
    }
    // 4. o = o * alpha + p . v over the positions each row sees; two rows at once where they see
    //    the same ones (all but the diagonal tile, without a window).
    auto v_row = [&](int t) { return v_rows[t]; };
    for (r = 0; r < rows;) {
      const int32_t a = a_of[2 * r], b = a_of[2 * r + 1];
      if (a >= b) {
        ++r;
        continue;
      }
      if (r + 1 < rows && a_of[2 * r + 2] == a && a_of[2 * r + 3] == b) {
        accumulate_rows<2>(o_rows.data() + r, p_rows.data() + r, alpha + r, a, b, Dp, v_row);
        r += 2;
      } else {
        accumulate_rows<1>(o_rows.data() + r, p_rows.data() + r, alpha + r, a, b, Dp, v_row);
        r += 1;
      }
    }
  }
  // 5. out = o / l.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = c.first_token + blk.first + r / group, h = blk.kvh * group + r % group;
    float* oh = pb.out + (token * pb.n_heads + h) * D;
    const float* o = o_rows[size_t(r)];
    const F8 l = splat(s.l[size_t(r)]);
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) store(oh + d, div(load(o + d), l));
    for (; d < D; ++d) oh[d] = o[d] / s.l[size_t(r)];
  }
}

}  // namespace

void paged_attention(ThreadPool& pool, const PagedKv& kv, std::span<const AttentionChunk> chunks, const float* q,
                     const float* k, const float* v, int64_t n_heads, float* out, const AttentionParams& params) {
  const int64_t D = kv.head_dim, n_kv = kv.n_kv_heads, group = n_heads / n_kv;
  const int64_t kv_dim = n_kv * D;
  // 1. Store the step's new keys and values in their blocks.
  for (const AttentionChunk& c : chunks) {
    for (int32_t i = 0; i < c.n_tokens; ++i) {
      const int32_t pos = c.start_pos + i;
      const int32_t block = c.block_table[size_t(pos / kv.block_size)], slot = pos % kv.block_size;
      std::memcpy(kv.k_at(block, slot), k + int64_t(c.first_token + i) * kv_dim, size_t(kv_dim) * 4);
      std::memcpy(kv.v_at(block, slot), v + int64_t(c.first_token + i) * kv_dim, size_t(kv_dim) * 4);
    }
  }
  // 2. Blocks of consecutive queries of one chunk and one KV head, most expensive first, taken by
  //    the threads from a shared counter (causal prefill makes late blocks cost more than early ones).
  const int32_t tokens_per_block = int32_t(std::max<int64_t>(1, kBlockRows / group));
  std::vector<Block> blocks;
  for (const AttentionChunk& c : chunks)
    for (int32_t first = 0; first < c.n_tokens; first += tokens_per_block) {
      const int32_t n = std::min(tokens_per_block, c.n_tokens - first);
      const int32_t last_pos = c.start_pos + first + n - 1;
      const int64_t seen = params.window > 0 ? std::min<int64_t>(last_pos + 1, params.window + n) : last_pos + 1;
      for (int64_t kvh = 0; kvh < n_kv; ++kvh)
        blocks.push_back({.chunk = &c, .first = first, .n_tokens = n, .kvh = kvh, .cost = int64_t(n) * seen});
    }
  std::stable_sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) { return a.cost > b.cost; });
  const Problem problem{.kv = kv,
                        .q = q,
                        .n_heads = n_heads,
                        .group = group,
                        .D = D,
                        .Dp = (D + 7) / 8 * 8,
                        .scale = params.scale > 0 ? params.scale : 1.0f / std::sqrt(float(D)),
                        .params = params,
                        .out = out};
  std::atomic<size_t> next{0};
  pool.parallel_for(std::min<int64_t>(pool.size(), int64_t(blocks.size())), [&](int64_t, int64_t) {
    Scratch scratch;
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < blocks.size();
         i = next.fetch_add(1, std::memory_order_relaxed))
      run_block(problem, blocks[i], scratch);
  });
}

}  // namespace spill::cpu
