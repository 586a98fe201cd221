// Multi-head latent attention, top to bottom, as DeepSeek-V3 computes it:
//   q      = q_b(norm(q_a(h)))            (or q_proj(h) without q_lora_rank)    [n, heads, nope + rope]
//   c, k_r = kv_a(h)                      latent [kv_lora] and the shared rope key [rope]
//   c      = norm(c); rope on q's rope part and on k_r
//   cache  <- (c, k_r) per token: kv_lora + rope values, not the expanded heads
//   attention with kv_b's key half absorbed into q and its value half applied after (cpu::mla_attention)
//   out    = o_proj(attention)
#include "model/mla_attention.h"

#include <vector>

namespace spill {

// transformers builds q_a_layernorm and kv_a_layernorm with its RMSNorm's default eps, not the
// config's rms_norm_eps (equal on DeepSeek-V3's real config).
constexpr double kLatentNormEps = 1e-6;

void mla_attention_block(ThreadPool& pool, const MlaBlockArgs& a, const float* h, int64_t n, float* out) {
  const MlaSpec& m = a.spec.mla;
  const MlaWeights& w = a.weights;
  const int64_t heads = a.spec.n_heads, qk = m.qk_head_dim(), entry = m.cache_values();
  std::vector<float> q(static_cast<size_t>(n * heads * qk)), latent(static_cast<size_t>(n * entry));
  std::vector<float> attn(static_cast<size_t>(n * heads * m.v_head_dim));

  // Queries: through the low-rank bottleneck and its norm when the model has one.
  if (m.q_lora_rank > 0) {
    std::vector<float> q_lat(static_cast<size_t>(n * m.q_lora_rank));
    cpu::matmul(pool, h, n, w.q_a, q_lat.data());
    cpu::rmsnorm(q_lat.data(), n, m.q_lora_rank, w.q_a_norm, kLatentNormEps, q_lat.data());
    cpu::matmul(pool, q_lat.data(), n, w.q_b, q.data());
  } else {
    cpu::matmul(pool, h, n, w.q, q.data());
  }
  // The latent and the rope key; only the latent is normalised.
  cpu::matmul(pool, h, n, w.kv_a, latent.data());
  for (int64_t t = 0; t < n; ++t)
    cpu::rmsnorm(latent.data() + t * entry, 1, m.kv_lora_rank, w.kv_a_norm, kLatentNormEps, latent.data() + t * entry);
  // Positions: the last qk_rope_head_dim dims of each q head, and the one shared rope key.
  cpu::apply_rope(a.rope, q.data(), n, heads, qk, a.positions, m.qk_nope_head_dim);
  cpu::apply_rope(a.rope, latent.data(), n, 1, entry, a.positions, m.kv_lora_rank);
  if (a.observer) a.observer->on_tensor("mla_latent", a.layer, latent.data(), n, entry);

  const cpu::MlaAttentionParams params{.n_heads = heads,
                                       .kv_lora_rank = m.kv_lora_rank,
                                       .qk_nope_head_dim = m.qk_nope_head_dim,
                                       .qk_rope_head_dim = m.qk_rope_head_dim,
                                       .v_head_dim = m.v_head_dim,
                                       .scale = float(a.spec.softmax_scale())};
  cpu::mla_attention(pool, params, a.kv, a.chunks, q.data(), latent.data(), w.kv_b, attn.data());
  cpu::matmul(pool, attn.data(), n, w.o, out);
}

}  // namespace spill
