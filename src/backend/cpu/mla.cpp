// Multi-head latent attention over a paged cache of latents, with the key and value
// up-projections absorbed into the query and output sides (what DeepSeek's own inference and the
// efficient engines run at decode). Every token takes the same path, alone or in a prefill batch,
// so a token's result does not depend on the batch.
//
// For head h, with W_uk = rows [h*(nope+v), h*(nope+v)+nope) of kv_b and W_uv the next v rows:
//   k_nope(p) = W_uk c(p), v(p) = W_uv c(p)
//   q_nope . k_nope(p) = (W_uk^T q_nope) . c(p)         -> score against the latent directly
//   sum_p a(p) v(p)    = W_uv (sum_p a(p) c(p))          -> one up-projection per head, after
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace spill::cpu {

void mla_attention(ThreadPool& pool, const MlaAttentionParams& p, const PagedLatentKv& kv,
                   std::span<const AttentionChunk> chunks, const float* q, const float* latent, const TensorView& kv_b,
                   float* out) {
  const int64_t R = p.kv_lora_rank, nope = p.qk_nope_head_dim, rope = p.qk_rope_head_dim, vd = p.v_head_dim;
  const int64_t entry = R + rope, qk = nope + rope, per_head = nope + vd;
  if (kv.entry != entry) fail("MLA cache entries hold {} values, the attention needs {}", kv.entry, entry);
  if (kv_b.rows() != p.n_heads * per_head || kv_b.cols() != R)
    fail("MLA kv_b_proj is {} but {} heads x ({} + {}) rows of {} are needed", shape_str(kv_b), p.n_heads, nope, vd, R);
  // 1. Store the step's latents (normalised c and the rotated shared rope key) in their slots.
  for (const AttentionChunk& c : chunks)
    for (int32_t i = 0; i < c.n_tokens; ++i) {
      const int32_t pos = c.start_pos + i;
      std::memcpy(kv.at(c.block_table[size_t(pos / kv.block_size)], pos % kv.block_size),
                  latent + int64_t(c.first_token + i) * entry, size_t(entry) * sizeof(float));
    }
  struct Work {
    const AttentionChunk* chunk;
    int32_t index;
  };
  std::vector<Work> work;
  for (const AttentionChunk& c : chunks)
    for (int32_t i = 0; i < c.n_tokens; ++i) work.push_back({&c, i});
  pool.parallel_for(int64_t(work.size()) * p.n_heads, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(R)), q_lat(static_cast<size_t>(R)), o_lat(static_cast<size_t>(R));
    std::vector<float> scores;
    for (int64_t job = begin; job < end; ++job) {
      const Work& w = work[size_t(job / p.n_heads)];
      const int64_t h = job % p.n_heads;
      const AttentionChunk& c = *w.chunk;
      const int64_t token = c.first_token + w.index;
      const int32_t n_pos = c.start_pos + w.index + 1;
      const float* qh = q + (token * p.n_heads + h) * qk;
      // 2. Absorb W_uk into the query: q_lat = W_uk^T q_nope (rows of W_uk in ascending order).
      std::fill(q_lat.begin(), q_lat.end(), 0.0f);
      for (int64_t i = 0; i < nope; ++i) {
        load_row(kv_b, h * per_head + i, row.data());
        const float qi = qh[i];
        for (int64_t r = 0; r < R; ++r) q_lat[size_t(r)] += qi * row[size_t(r)];
      }
      // 3. Scores against the cached latents and rope keys, softmax.
      scores.resize(static_cast<size_t>(n_pos));
      float max_score = -INFINITY;
      for (int32_t pos = 0; pos < n_pos; ++pos) {
        const float* e = kv.at(c.block_table[size_t(pos / kv.block_size)], pos % kv.block_size);
        float s = 0;
        for (int64_t r = 0; r < R; ++r) s += q_lat[size_t(r)] * e[r];
        for (int64_t d = 0; d < rope; ++d) s += qh[nope + d] * e[R + d];
        s *= p.scale;
        scores[size_t(pos)] = s;
        max_score = std::max(max_score, s);
      }
      float denom = 0;
      for (float& s : scores) denom += s = std::exp(s - max_score);
      // 4. The weighted latent, then W_uv up-projects it to the head's value.
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int32_t pos = 0; pos < n_pos; ++pos) {
        const float* e = kv.at(c.block_table[size_t(pos / kv.block_size)], pos % kv.block_size);
        const float a = scores[size_t(pos)] / denom;
        for (int64_t r = 0; r < R; ++r) o_lat[size_t(r)] += a * e[r];
      }
      float* oh = out + (token * p.n_heads + h) * vd;
      for (int64_t j = 0; j < vd; ++j) oh[j] = dot_row(o_lat.data(), kv_b, h * per_head + nope + j);
    }
  });
}

}  // namespace spill::cpu
