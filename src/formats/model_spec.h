// Every hyperparameter of a model, resolved from config.json once at load. The forward pass reads
// this struct only; nothing is looked up by string after load.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spill {

// Decoder families spill runs. They share one forward (model/decoder.cpp) and differ in the
// switches below, which are set from the architecture here, not tested by name in the forward.
// DeepSeek-V3's multi-head latent attention has its own attention block (model/mla_attention.cpp).
enum class Arch { Llama, Qwen3, Qwen3Moe, Mixtral, Olmoe, GptOss, DeepseekV3, Glm4Moe };

enum class QkNorm {
  None,
  PerHead,        // Qwen3: RMSNorm over each head's head_dim
  WholeProjection // OLMoE: RMSNorm over all heads of q (and of k) together
};

enum class RopeKind { Default, Linear, Llama3, Yarn };

// How the router turns its logits into k experts and their weights.
enum class RouterKind {
  SoftmaxTopK,     // softmax over all experts, then the k largest (Qwen, Mixtral, OLMoE)
  TopKSoftmax,     // the k largest logits, then softmax over those k (gpt-oss)
  SigmoidGrouped,  // sigmoid scores; experts chosen by score + correction bias inside the best
                   // groups, weighted by the score alone (DeepSeek-V3 / GLM-4.x "noaux_tc")
};

struct RouterSpec {
  RouterKind kind = RouterKind::SoftmaxTopK;
  int64_t n_group = 1;               // SigmoidGrouped: experts split into n_group equal groups,
  int64_t topk_group = 1;            //   only the topk_group best groups (sum of their top-2) compete
  double routed_scaling_factor = 1.0;  // multiplies the final weights
  bool correction_bias = false;      // e_score_correction_bias: added for the choice only
};

// The expert (and dense MLP) activation.
enum class MlpActivation {
  SwiGLU,         // down(silu(gate) * up)
  ClampedSwiGLU,  // gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit),
                  // down((u + 1) * g * sigmoid(alpha * g))
};

enum class AttentionKind {
  Gqa,  // q/k/v projections, grouped-query attention over cached K and V
  Mla,  // DeepSeek's multi-head latent attention: one compressed latent + a shared rope key per
        // token is cached, the per-head keys and values are its up-projections
};

// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2).
struct MlaSpec {
  int64_t q_lora_rank = 0;     // 0: q straight from the hidden state (q_proj); else q_a -> norm -> q_b
  int64_t kv_lora_rank = 0;    // the cached latent's width
  int64_t qk_nope_head_dim = 0;  // per head, the part of q/k without positions
  int64_t qk_rope_head_dim = 0;  // per head (q) and shared (k), the rotary part
  int64_t v_head_dim = 0;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // What a token leaves in one layer's cache: the latent and the rope key.
  int64_t cache_values() const { return kv_lora_rank + qk_rope_head_dim; }
};

struct RopeSpec {
  RopeKind kind = RopeKind::Default;
  double theta = 10000.0;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position = 0;
  // yarn
  double beta_fast = 32.0, beta_slow = 1.0;
  double attention_factor = 1.0;  // multiplies cos and sin (yarn's mscale)
  bool truncate = true;
};

struct ModelSpec {
  Arch arch = Arch::Llama;
  std::string model_type;  // as config.json names it, for messages only

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;  // dense MLP width
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  QkNorm qk_norm = QkNorm::None;
  double clip_qkv = 0.0;  // OLMoE: clamp q, k, v to [-clip, clip] when > 0
  RopeSpec rope;
  // Rotary dimensions per head: head_dim, less with a partial rotary factor (GLM-4.x: half), the
  // rope part for MLA. Rotated dims come first in the head.
  int64_t rotary_dim = 0;  // 0: head_dim (see rope_dims())
  // Rotate adjacent pairs (x[2i], x[2i+1]) instead of halves (x[i], x[i + rotary_dim/2]):
  // DeepSeek-V3's rope_interleave. Both give the same attention scores when q and k agree.
  bool rope_interleaved = false;
  double attention_scale = 0.0;  // softmax scale of q.k; 0: head_dim^-0.5 (see softmax_scale())

  AttentionKind attention = AttentionKind::Gqa;
  MlaSpec mla;
  bool attention_sinks = false;    // gpt-oss: a learned per-head logit joins every softmax
  bool attention_out_bias = false;  // o_proj has a bias (gpt-oss; GLM has q/k/v biases only)
  int64_t sliding_window = 0;      // > 0: layers marked sliding see only the last sliding_window positions
  std::vector<bool> layer_is_sliding;  // per layer (empty: none)

  // Mixture of experts. n_experts == 0 for dense models.
  int64_t n_experts = 0;
  int64_t n_experts_per_token = 0;  // top-k
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;      // renormalise the top-k routing weights to sum to 1
  std::vector<bool> layer_is_moe;   // per layer: routed experts (true) or dense MLP (false)
  RouterSpec router;                // how logits become choices (renormalisation: norm_topk_prob)
  bool router_bias = false;         // the router has a bias on its logits (gpt-oss)
  // Always-on experts added to the routed output of every MoE layer (DeepSeek, GLM): one SwiGLU
  // of width n_shared_experts * moe_intermediate_size.
  int64_t n_shared_experts = 0;
  int64_t shared_intermediate_size() const { return n_shared_experts * moe_intermediate_size; }
  MlpActivation expert_activation = MlpActivation::SwiGLU;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;  // ClampedSwiGLU
  bool expert_bias = false;  // routed experts' gate/up and down have biases (gpt-oss)

  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;

  int64_t n_moe_layers() const {
    int64_t n = 0;
    for (bool b : layer_is_moe) n += b;
    return n;
  }
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // Values one token leaves in one layer's KV cache: K and V, or MLA's latent + rope key (576 on
  // DeepSeek-V3, against 2 x 128 heads x 192/128 expanded).
  int64_t kv_values_per_token() const { return attention == AttentionKind::Mla ? mla.cache_values() : 2 * kv_dim(); }
  int64_t rope_dims() const {
    if (attention == AttentionKind::Mla) return mla.qk_rope_head_dim;
    return rotary_dim > 0 ? rotary_dim : head_dim;
  }
  double softmax_scale() const;
  bool sliding(int64_t layer) const {
    return sliding_window > 0 && size_t(layer) < layer_is_sliding.size() && layer_is_sliding[size_t(layer)];
  }
};

// Sanity bounds on what a model may declare (config.json, GGUF metadata). Real models stay far below
// them (the largest today: vocabularies of ~262K, 160 layers, hidden size 18K, 512 experts, contexts
// of 10M); they exist so that a hostile or corrupt number fails at load with a message instead of
// allocating gigabytes (num_hidden_layers = 1e11) or overflowing arithmetic further down.
namespace model_limits {
inline constexpr int64_t kMaxVocab = int64_t(1) << 24;
inline constexpr int64_t kMaxWidth = int64_t(1) << 20;  // hidden, intermediate, head_dim, latent ranks
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxHeads = 4096;
inline constexpr int64_t kMaxExperts = 1 << 16;
inline constexpr int64_t kMaxPositions = int64_t(1) << 30;
}  // namespace model_limits

// Reads <dir>/config.json (and generation_config.json for EOS ids when present).
// Throws spill::Error naming the file and field on a missing field, a wrong type or an
// unsupported architecture.
ModelSpec load_model_spec(const std::string& dir);
ModelSpec parse_model_spec(const std::string& config_json_text, const std::string& where);

const char* arch_name(Arch arch);

}  // namespace spill
