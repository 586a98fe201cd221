#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/ops.h"

namespace spill::cpu {

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
  // 2. Every (token, head) pair attends causally over its sequence's positions, the last `window`
  //    of them on a sliding layer; a sink logit, when given, takes its share of the softmax and
  //    contributes no value.
  struct Work {
    const AttentionChunk* chunk;
    int32_t index;  // token within the chunk
  };
  std::vector<Work> work;
  for (const AttentionChunk& c : chunks)
    for (int32_t i = 0; i < c.n_tokens; ++i) work.push_back({&c, i});
  const float scale = params.scale > 0 ? params.scale : 1.0f / std::sqrt(float(D));
  pool.parallel_for(int64_t(work.size()) * n_heads, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t job = begin; job < end; ++job) {
      const Work& w = work[size_t(job / n_heads)];
      const int64_t h = job % n_heads, kvh = h / group;
      const AttentionChunk& c = *w.chunk;
      const int64_t token = c.first_token + w.index;
      const int32_t pos = c.start_pos + w.index;
      const int32_t first = params.window > 0 ? std::max(0, pos - params.window + 1) : 0;
      const int32_t n_pos = pos + 1 - first;
      const float* qh = q + (token * n_heads + h) * D;
      scores.resize(static_cast<size_t>(n_pos));
      float max_score = params.sinks ? params.sinks[h] : -INFINITY;
      for (int32_t i = 0; i < n_pos; ++i) {
        const int32_t p = first + i;
        const float* kp = kv.k_at(c.block_table[size_t(p / kv.block_size)], p % kv.block_size) + kvh * D;
        float s = 0;
        for (int64_t d = 0; d < D; ++d) s += qh[d] * kp[d];
        s *= scale;
        scores[size_t(i)] = s;
        max_score = std::max(max_score, s);
      }
      float denom = params.sinks ? std::exp(params.sinks[h] - max_score) : 0.0f;
      for (int32_t i = 0; i < n_pos; ++i) denom += scores[size_t(i)] = std::exp(scores[size_t(i)] - max_score);
      float* oh = out + (token * n_heads + h) * D;
      std::fill(oh, oh + D, 0.0f);
      for (int32_t i = 0; i < n_pos; ++i) {
        const int32_t p = first + i;
        const float* vp = kv.v_at(c.block_table[size_t(p / kv.block_size)], p % kv.block_size) + kvh * D;
        const float weight = scores[size_t(i)] / denom;
        for (int64_t d = 0; d < D; ++d) oh[d] += weight * vp[d];
      }
    }
  });
}

}  // namespace spill::cpu
