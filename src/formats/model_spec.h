// Every hyperparameter of a model, resolved from config.json once at load. The forward pass reads
// this struct only; nothing is looked up by string after load.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spill {

// Decoder families spill runs. They share one forward (model/decoder.cpp) and differ in the
// switches below, which are set from the architecture here, not tested by name in the forward.
enum class Arch { Llama, Qwen3, Qwen3Moe, Mixtral, Olmoe };

enum class QkNorm {
  None,
  PerHead,        // Qwen3: RMSNorm over each head's head_dim
  WholeProjection // OLMoE: RMSNorm over all heads of q (and of k) together
};

enum class RopeKind { Default, Linear, Llama3, Yarn };

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

  // Mixture of experts. n_experts == 0 for dense models.
  int64_t n_experts = 0;
  int64_t n_experts_per_token = 0;  // top-k
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;      // renormalise the top-k routing weights to sum to 1
  std::vector<bool> layer_is_moe;   // per layer: routed experts (true) or dense MLP (false)

  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;

  int64_t n_moe_layers() const {
    int64_t n = 0;
    for (bool b : layer_is_moe) n += b;
    return n;
  }
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
};

// Reads <dir>/config.json (and generation_config.json for EOS ids when present).
// Throws spill::Error naming the file and field on a missing field, a wrong type or an
// unsupported architecture.
ModelSpec load_model_spec(const std::string& dir);
ModelSpec parse_model_spec(const std::string& config_json_text, const std::string& where);

const char* arch_name(Arch arch);

}  // namespace spill
