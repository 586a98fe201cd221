// The WeightSource of a GGUF file: roles to llama.cpp's tensor names, and the ModelSpec from the
// file's `<arch>.*` metadata.
//
// RoPE: llama.cpp's converter permutes the q and k rows of `llama`-arch checkpoints (Llama,
// Mistral, Mixtral) so that ggml's interleaved ("normal") rope, which rotates pairs (2i, 2i+1),
// computes what transformers' rotate-half rope computes on pairs (i, i + D/2). spill applies
// rotate-half to every architecture, so those rows are put back in the Hugging Face order here,
// once, into buffers this source owns. The permutation moves whole rows, so it is the same for
// block formats (a Q4_K row moves as its bytes). qwen3, qwen3moe and olmoe are NeoX-rope in
// llama.cpp (llama_model_rope_type) and their files keep Hugging Face's order.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/model_spec.h"
#include "model/weight_source.h"
#include "quant/quant.h"

namespace spill {

namespace {

// The GGUF stores float32 copies of values config.json wrote as decimals (1e-06, 10000.0). The
// shortest decimal that rounds to the same float is the value the config most likely said, and it
// makes a GGUF model compute exactly what its Hugging Face original computes in double.
double as_config_double(const gguf::Metadata& md, std::string_view key, double fallback) {
  const gguf::Value* v = md.find(key);
  if (!v) return fallback;
  if (v->type != gguf::ValueType::F32) return md.number(key);
  char buf[64];
  const float f = float(v->f);
  auto res = std::to_chars(buf, buf + sizeof(buf), f);
  double d = 0;
  std::from_chars(buf, res.ptr, d);
  return d;
}

bool has_tensor(const gguf::GgufFile& f, const std::string& name) { return f.find(name) != nullptr; }

std::string blk(int64_t layer, const char* suffix) { return "blk." + std::to_string(layer) + "." + suffix; }

}  // namespace

namespace {

// Typed reads of `<arch>.*` keys with the checks every family needs; errors name the file and key.
struct ArchKeys {
  const gguf::Metadata& md;
  const std::string& where;
  std::string p;  // "<arch>."

  std::string key(const char* k) const { return p + k; }
  int64_t required(const char* k) const { return md.integer(key(k)); }
  int64_t optional(const char* k, int64_t fallback) const { return md.integer(key(k), fallback); }
  // A count or width: an integer in [lo, hi] (hi far above real models, so a hostile file cannot
  // make spill allocate by it).
  int64_t count(const char* k, int64_t lo, int64_t hi) const { return in_range(k, required(k), lo, hi); }
  int64_t count(const char* k, int64_t lo, int64_t hi, int64_t fallback) const {
    return md.has(key(k)) ? count(k, lo, hi) : fallback;
  }
  int64_t in_range(const char* k, int64_t v, int64_t lo, int64_t hi) const {
    if (v < lo || v > hi)
      fail("{}: metadata key '{}' is {}, outside {}..{}; is the file corrupt?", where, key(k), v, lo, hi);
    return v;
  }
  double real(const char* k, double fallback) const {
    const double v = as_config_double(md, key(k), fallback);
    if (!std::isfinite(v)) fail("{}: metadata key '{}' must be a finite number", where, key(k));
    return v;
  }
};

using model_limits::kMaxExperts;
using model_limits::kMaxHeads;
using model_limits::kMaxLayers;
using model_limits::kMaxWidth;

// llama.cpp's expert_gating_func values (LLAMA_EXPERT_GATING_FUNC_TYPE_*).
constexpr int64_t kGatingSoftmax = 1, kGatingSigmoid = 2;

// DeepSeek-V3 / Kimi-K2 (`deepseek2`) and GLM-4.x (`glm4moe`): leading dense layers, routed experts
// with shared ones, the sigmoid router with group-limited choice and a correction bias
// (`exp_probs_b`), the routed weights renormalised (expert_weights_norm) and scaled
// (expert_weights_scale).
void sigmoid_moe_spec(const gguf::GgufFile& file, const ArchKeys& k, ModelSpec& s) {
  s.n_experts = k.count("expert_count", 1, kMaxExperts);
  s.n_experts_per_token = k.count("expert_used_count", 1, s.n_experts);
  s.moe_intermediate_size = k.count("expert_feed_forward_length", 1, kMaxWidth);
  s.n_shared_experts = k.count("expert_shared_count", 0, kMaxExperts);
  s.norm_topk_prob = k.md.boolean(k.key("expert_weights_norm"), false);
  // llama.cpp reads a missing gating function of a deepseek2 file as softmax (DeepSeek-V2's
  // router, group-limited by the max of each group), glm4moe's as sigmoid.
  const int64_t gating = k.optional("expert_gating_func", s.arch == Arch::Glm4Moe ? kGatingSigmoid : kGatingSoftmax);
  if (gating != kGatingSigmoid)
    fail("{}: metadata key '{}' is {} ({}); spill runs the sigmoid router of DeepSeek-V3 / Kimi-K2 / GLM-4.x "
         "({}); DeepSeek-V2's softmax router is not supported",
         k.where, k.key("expert_gating_func"), gating,
         k.md.has(k.key("expert_gating_func")) ? (gating == kGatingSoftmax ? "softmax" : "unknown") : "missing, read as softmax",
         kGatingSigmoid);
  s.router.kind = RouterKind::SigmoidGrouped;
  s.router.n_group = k.count("expert_group_count", 1, s.n_experts, 1);
  s.router.topk_group = k.count("expert_group_used_count", 1, s.router.n_group, s.router.n_group > 1 ? -1 : 1);
  if (s.router.topk_group < 0) (void)k.required("expert_group_used_count");  // groups without a used count
  if (s.n_experts % s.router.n_group != 0)
    fail("{}: metadata key '{}' ({}) is not a multiple of '{}' ({})", k.where, k.key("expert_count"), s.n_experts,
         k.key("expert_group_count"), s.router.n_group);
  if (s.router.n_group > 1 && s.n_experts / s.router.n_group < 2)
    fail("{}: groups of {} expert(s) ('{}' / '{}'): a group's score is the sum of its two best, so each needs two",
         k.where, s.n_experts / s.router.n_group, k.key("expert_count"), k.key("expert_group_count"));
  if (s.n_experts_per_token > s.router.topk_group * (s.n_experts / s.router.n_group))
    fail("{}: metadata key '{}' ({}) exceeds the experts of the {} chosen group(s)", k.where, k.key("expert_used_count"),
         s.n_experts_per_token, s.router.topk_group);
  const double scale = k.real("expert_weights_scale", 1.0);
  s.router.routed_scaling_factor = scale == 0.0 ? 1.0 : scale;  // llama.cpp: 0 means no scaling
  const int64_t dense = k.count("leading_dense_block_count", 0, s.n_layers, 0);
  s.layer_is_moe.assign(size_t(s.n_layers), false);
  for (int64_t l = dense; l < s.n_layers; ++l) s.layer_is_moe[size_t(l)] = true;
  // The correction bias selects experts without weighting them; a file without it routes on the
  // scores alone.
  s.router.correction_bias = dense < s.n_layers && has_tensor(file, blk(dense, "exp_probs_b.bias"));
}

// NextN / multi-token-prediction blocks (GLM-4.x, DeepSeek-V3 files written with them) follow the
// model's layers; spill does not run them (no speculative decoding), so they are left unread.
int64_t layers_before_nextn(const gguf::GgufFile& file, const ArchKeys& k, int64_t block_count) {
  const int64_t nextn = k.count("nextn_predict_layers", 0, block_count - 1, 0);
  for (int64_t l = block_count - nextn; l < block_count; ++l)
    if (!has_tensor(file, blk(l, "nextn.eh_proj.weight")))
      fail("{}: metadata key '{}' says the last {} block(s) are NextN layers, but tensor '{}' is missing", k.where,
           k.key("nextn_predict_layers"), nextn, blk(l, "nextn.eh_proj.weight"));
  return block_count - nextn;
}

// MLA as llama.cpp stores it. Newer converters split kv_b into attn_k_b (per head [kv_lora, nope]
// stored transposed, nope contiguous) and attn_v_b, and describe the attention as MQA over the
// latent: key_length = kv_lora + rope, value_length = kv_lora, with the real head sizes in
// key_length_mla / value_length_mla. Older files keep attn_kv_b and key_length = nope + rope,
// value_length = v.
void mla_spec(const gguf::GgufFile& file, const ArchKeys& k, ModelSpec& s) {
  s.attention = AttentionKind::Mla;
  MlaSpec& m = s.mla;
  m.kv_lora_rank = k.count("attention.kv_lora_rank", 1, kMaxWidth);
  m.qk_rope_head_dim = k.count("rope.dimension_count", 2, kMaxWidth);
  if (m.qk_rope_head_dim % 2 != 0)
    fail("{}: {} ({}) must be even", k.where, k.key("rope.dimension_count"), m.qk_rope_head_dim);
  m.q_lora_rank = k.count("attention.q_lora_rank", 0, kMaxWidth, 0);
  if (m.q_lora_rank == 0 && has_tensor(file, blk(0, "attn_q_a.weight")))
    fail("{}: tensor 'blk.0.attn_q_a.weight' is there but metadata key '{}' is missing or 0", k.where,
         k.key("attention.q_lora_rank"));
  if (m.q_lora_rank > 0 && has_tensor(file, blk(0, "attn_q.weight")))
    fail("{}: {} = {} but the file has 'blk.0.attn_q.weight' (a model without q compression)", k.where,
         k.key("attention.q_lora_rank"), m.q_lora_rank);
  const int64_t key_length = k.count("attention.key_length", 1, kMaxWidth);
  const int64_t value_length = k.count("attention.value_length", 1, kMaxWidth);
  if (k.md.has(k.key("attention.key_length_mla")) || k.md.has(k.key("attention.value_length_mla"))) {
    const int64_t qk = k.count("attention.key_length_mla", 1, kMaxWidth);
    m.v_head_dim = k.count("attention.value_length_mla", 1, kMaxWidth);
    if (key_length != m.kv_lora_rank + m.qk_rope_head_dim || value_length != m.kv_lora_rank)
      fail("{}: {} = {} and {} = {}, but an MLA file has kv_lora_rank + rope = {} and kv_lora_rank = {} there",
           k.where, k.key("attention.key_length"), key_length, k.key("attention.value_length"), value_length,
           m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank);
    m.qk_nope_head_dim = qk - m.qk_rope_head_dim;
  } else {
    m.qk_nope_head_dim = key_length - m.qk_rope_head_dim;
    m.v_head_dim = value_length;
  }
  if (m.qk_nope_head_dim < 1)
    fail("{}: the key head ({}) is not wider than its rope part ({}); {} is inconsistent", k.where,
         m.qk_nope_head_dim + m.qk_rope_head_dim, m.qk_rope_head_dim, k.key("rope.dimension_count"));
  s.head_dim = m.qk_head_dim();
  // head_count_kv is 1 in MLA files (the latent is one shared "head"); the model has a key and a
  // value per query head.
  s.n_kv_heads = s.n_heads;
  s.rope_interleaved = true;  // llama.cpp's deepseek2 rope rotates adjacent pairs, as rope_interleave does
  s.attention_scale = 1.0 / std::sqrt(double(m.qk_head_dim()));
}

}  // namespace

ModelSpec gguf_model_spec(const gguf::GgufFile& file) {
  const gguf::Metadata& md = file.metadata();
  const std::string& where = file.path();
  const std::string arch = md.string("general.architecture");
  const std::string p = arch + ".";
  const ArchKeys k{md, where, p};
  ModelSpec s;
  s.model_type = arch;
  const int64_t n_experts = md.integer(p + "expert_count", 0);
  if (arch == "qwen3moe") s.arch = Arch::Qwen3Moe;
  else if (arch == "qwen3") s.arch = Arch::Qwen3;
  else if (arch == "olmoe") s.arch = Arch::Olmoe;
  else if (arch == "llama") s.arch = n_experts > 0 ? Arch::Mixtral : Arch::Llama;
  else if (arch == "deepseek2") s.arch = Arch::DeepseekV3;
  else if (arch == "glm4moe") s.arch = Arch::Glm4Moe;
  else if (arch == "gpt-oss") s.arch = Arch::GptOss;
  else
    fail("{}: general.architecture '{}' is not supported (supported: llama (dense and Mixtral-style experts), "
         "qwen3, qwen3moe, olmoe, deepseek2 (DeepSeek-V3, Kimi-K2), glm4moe, gpt-oss)", where, arch);

  s.hidden_size = md.integer(p + "embedding_length");
  s.n_layers = md.integer(p + "block_count");
  s.n_heads = md.integer(p + "attention.head_count");
  s.n_kv_heads = md.integer(p + "attention.head_count_kv", s.n_heads);
  if (s.hidden_size <= 0 || s.n_layers <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 || s.n_layers > kMaxLayers ||
      s.hidden_size > kMaxWidth || s.n_heads > kMaxHeads)
    fail("{}: {}embedding_length, block_count, attention.head_count and head_count_kv must be positive (and "
         "below spill's bounds)", where, p);
  if (s.n_heads % s.n_kv_heads != 0)
    fail("{}: {}attention.head_count ({}) must be a multiple of head_count_kv ({})", where, p, s.n_heads, s.n_kv_heads);
  if (s.arch == Arch::Glm4Moe || s.arch == Arch::DeepseekV3) s.n_layers = layers_before_nextn(file, k, s.n_layers);
  if (s.arch == Arch::DeepseekV3) {
    mla_spec(file, k, s);
  } else {
    s.head_dim = md.integer(p + "attention.key_length", s.hidden_size / s.n_heads);
    if (s.head_dim <= 0 || s.head_dim % 2 != 0 || s.head_dim > kMaxWidth)
      fail("{}: the head size ({}) must be positive and even", where, s.head_dim);
    if (md.integer(p + "attention.value_length", s.head_dim) != s.head_dim)
      fail("{}: {}attention.value_length ({}) differs from key_length ({}); spill needs equal k and v head sizes",
           where, p, md.integer(p + "attention.value_length"), s.head_dim);
    // GLM-4.x rotates the first rope.dimension_count dims of each head (the converter writes
    // head_dim x partial_rotary_factor); the other families rotate the whole head.
    const int64_t rot = md.integer(p + "rope.dimension_count", s.arch == Arch::Glm4Moe ? -1 : s.head_dim);
    if (s.arch == Arch::Glm4Moe) {
      if (rot < 0) (void)k.required("rope.dimension_count");
      if (rot < 2 || rot > s.head_dim || rot % 2 != 0)
        fail("{}: {}rope.dimension_count ({}) must be even and within the head size ({})", where, p, rot, s.head_dim);
      s.rotary_dim = rot;
    } else if (rot != s.head_dim) {
      fail("{}: {}rope.dimension_count ({}) is not the head size ({}): partial rotary embeddings are not supported "
           "for {}", where, p, rot, s.head_dim, arch);
    }
  }

  const gguf::TensorInfo* embd = file.find("token_embd.weight");
  if (!embd) fail("{}: tensor 'token_embd.weight' is missing", where);
  s.vocab_size = embd->view.ndim == 2 ? embd->view.shape[0] : 0;
  if (md.has(p + "vocab_size") && md.integer(p + "vocab_size") != s.vocab_size)
    fail("{}: {}vocab_size ({}) differs from the rows of token_embd.weight ({})", where, p,
         md.integer(p + "vocab_size"), s.vocab_size);
  s.intermediate_size = md.integer(p + "feed_forward_length", 0);
  s.max_position_embeddings = md.integer(p + "context_length", 4096);
  s.rms_norm_eps = as_config_double(md, p + "attention.layer_norm_rms_epsilon", 1e-6);
  s.tie_word_embeddings = !has_tensor(file, "output.weight");
  s.attention_bias = has_tensor(file, blk(0, "attn_q.bias"));
  s.clip_qkv = as_config_double(md, p + "attention.clamp_kqv", 0.0);

  // RoPE
  s.rope.theta = as_config_double(md, p + "rope.freq_base", 10000.0);
  if (has_tensor(file, "rope_freqs.weight"))
    fail("{}: per-frequency rope factors (tensor 'rope_freqs.weight', Llama-3.1-style scaling) are not supported yet",
         where);
  const std::string scaling = md.string(p + "rope.scaling.type", "none");
  if (scaling == "linear" || scaling == "yarn") {
    s.rope.factor = as_config_double(md, p + "rope.scaling.factor", 1.0);
    if (!(s.rope.factor > 0)) fail("{}: {}rope.scaling.factor must be positive", where, p);
  }
  if (scaling == "linear") {
    s.rope.kind = RopeKind::Linear;
  } else if (scaling == "yarn") {
    s.rope.kind = RopeKind::Yarn;
    s.rope.original_max_position = md.integer(p + "rope.scaling.original_context_length", s.max_position_embeddings);
    if (s.rope.original_max_position <= 0) fail("{}: {}rope.scaling.original_context_length must be positive", where, p);
    s.rope.beta_fast = as_config_double(md, p + "rope.scaling.yarn_beta_fast", 32.0);
    s.rope.beta_slow = as_config_double(md, p + "rope.scaling.yarn_beta_slow", 1.0);
    // transformers' default attention factor for yarn: 0.1 ln(factor) + 1. DeepSeek's is
    // mscale(factor, mscale) / mscale(factor, mscale_all_dim), which the file does not keep: 1, as
    // llama.cpp assumes (mscale == mscale_all_dim on DeepSeek-V2/V3 and Kimi-K2).
    const double fallback =
        s.arch == Arch::DeepseekV3 || s.rope.factor <= 1 ? 1.0 : 0.1 * std::log(s.rope.factor) + 1.0;
    s.rope.attention_factor = as_config_double(md, p + "rope.scaling.attn_factor", fallback);
    // gpt-oss's YaRN ramp is not truncated to whole dims (its config says truncate: false);
    // llama.cpp's rope truncates it for every model.
    s.rope.truncate = s.arch != Arch::GptOss;
    if (s.arch == Arch::DeepseekV3) {
      // The converter writes 0.1 x mscale_all_dim; the softmax is sharpened by mscale(factor, all_dim)^2.
      const double log_mul = k.real("rope.scaling.yarn_log_multiplier", 0.0);
      if (log_mul != 0.0 && s.rope.factor > 1) {
        const double m = log_mul * std::log(s.rope.factor) + 1.0;
        s.attention_scale *= m * m;
      }
    }
  } else if (scaling != "none") {
    fail("{}: {}rope.scaling.type '{}' is not supported (supported: none, linear, yarn)", where, p, scaling);
  }

  switch (s.arch) {
    case Arch::Llama: break;
    case Arch::Qwen3: s.qk_norm = QkNorm::PerHead; break;
    case Arch::Qwen3Moe: s.qk_norm = QkNorm::PerHead; break;
    case Arch::Olmoe: s.qk_norm = QkNorm::WholeProjection; break;
    case Arch::Mixtral: break;
    case Arch::Glm4Moe:
      s.qk_norm = has_tensor(file, blk(0, "attn_q_norm.weight")) ? QkNorm::PerHead : QkNorm::None;
      sigmoid_moe_spec(file, k, s);
      break;
    case Arch::DeepseekV3:
      sigmoid_moe_spec(file, k, s);
      break;
    case Arch::GptOss: {
      // Every layer MoE: top-k of the router logits (with bias), softmax over the k, the clamped
      // SwiGLU with expert biases (alpha 1.702, limit 7: llama.cpp's constants, not in the file),
      // attention sinks and biases, sliding layers.
      s.n_experts = k.count("expert_count", 1, kMaxExperts);
      s.n_experts_per_token = k.count("expert_used_count", 1, s.n_experts);
      s.moe_intermediate_size = k.count("expert_feed_forward_length", 1, kMaxWidth);
      s.layer_is_moe.assign(size_t(s.n_layers), true);
      s.router.kind = RouterKind::TopKSoftmax;
      s.router_bias = true;
      s.expert_bias = true;
      s.expert_activation = MlpActivation::ClampedSwiGLU;
      s.swiglu_alpha = 1.702;
      s.swiglu_limit = 7.0;
      s.attention_sinks = true;
      s.attention_out_bias = s.attention_bias;
      s.sliding_window = k.count("attention.sliding_window", 1, int64_t(1) << 30);
      // llama.cpp: layer l slides when l % period < period - 1 (period 2 unless the file says).
      s.layer_is_sliding.assign(size_t(s.n_layers), false);
      const gguf::Value* pattern = md.find(p + "attention.sliding_window_pattern");
      if (pattern && pattern->type == gguf::ValueType::Array) {
        if (pattern->elem_type != gguf::ValueType::Bool || int64_t(pattern->items.size()) != s.n_layers)
          fail("{}: metadata key '{}attention.sliding_window_pattern' must be one bool per layer ({}) or a period",
               where, p, s.n_layers);
        for (size_t l = 0; l < pattern->items.size(); ++l) s.layer_is_sliding[l] = pattern->items[l].u != 0;
      } else {
        const int64_t period = k.count("attention.sliding_window_pattern", 1, kMaxLayers, 2);
        for (int64_t l = 0; l < s.n_layers; ++l) s.layer_is_sliding[size_t(l)] = l % period < period - 1;
      }
      break;
    }
  }
  if (s.arch == Arch::Qwen3Moe || s.arch == Arch::Olmoe || s.arch == Arch::Mixtral) {
    s.layer_is_moe.assign(size_t(s.n_layers), false);
    s.n_experts = n_experts;
    s.n_experts_per_token = md.integer(p + "expert_used_count");
    // qwen3moe files name the expert width; Mixtral and OLMoE experts are feed_forward_length wide.
    s.moe_intermediate_size = md.integer(p + "expert_feed_forward_length", s.intermediate_size);
    // What llama.cpp's graph for each architecture does with the top-k weights: qwen3moe and
    // llama (Mixtral) renormalise them to sum to 1, olmoe uses the softmax values as they are.
    // A file that says otherwise (expert_weights_norm) wins.
    s.norm_topk_prob = md.boolean(p + "expert_weights_norm", s.arch != Arch::Olmoe);
    for (int64_t l = 0; l < s.n_layers; ++l) s.layer_is_moe[size_t(l)] = has_tensor(file, blk(l, "ffn_gate_inp.weight"));
    if (s.n_experts <= 0) fail("{}: {}expert_count must be positive for a mixture-of-experts model", where, p);
    if (s.n_experts_per_token <= 0 || s.n_experts_per_token > s.n_experts)
      fail("{}: {}expert_used_count ({}) must be between 1 and expert_count ({})", where, p, s.n_experts_per_token,
           s.n_experts);
    if (s.moe_intermediate_size <= 0) fail("{}: the expert width ({}expert_feed_forward_length) must be positive", where, p);
  } else if (s.layer_is_moe.empty()) {
    if (n_experts > 0) fail("{}: {}expert_count = {}, but {} is a dense architecture", where, p, n_experts, arch);
    s.layer_is_moe.assign(size_t(s.n_layers), false);
  }
  bool any_dense = false;
  for (bool moe : s.layer_is_moe) any_dense |= !moe;
  if (any_dense && s.intermediate_size <= 0)
    fail("{}: {}feed_forward_length is missing or zero (needed by the dense layers)", where, p);
  if (const gguf::Value* v = md.find("tokenizer.ggml.bos_token_id"); v && v->is_integer())
    s.bos_token_id = int32_t(md.integer("tokenizer.ggml.bos_token_id"));
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (!md.has(key)) continue;
    const int64_t id = md.integer(key);
    if (id < 0 || id >= s.vocab_size) fail("{}: {} = {} is outside the vocabulary of {}", where, key, id, s.vocab_size);
    if (std::find(s.eos_token_ids.begin(), s.eos_token_ids.end(), int32_t(id)) == s.eos_token_ids.end())
      s.eos_token_ids.push_back(int32_t(id));
  }
  // GGUF keeps one eos id where generation_config.json often lists several (Qwen: <|im_end|> and
  // <|endoftext|>; Llama 3: <|end_of_text|>, <|eom_id|>, <|eot_id|>). As llama.cpp does, control
  // tokens whose text is one of the end-of-generation markers these families use end generation too.
  // gpt-oss's harmony format ends a turn with <|return|> (the answer) or <|call|> (a tool call).
  static const char* const kEndMarkers[] = {"<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>",
                                            "<|eom_id|>",    "<|end|>",    "<end_of_turn>",   "<|return|>",
                                            "<|call|>",      "<｜end▁of▁sentence｜>", "<|EOT|>", "[EOT]", "[EOS]"};
  if (const std::vector<gguf::Value>* tokens = md.string_array("tokenizer.ggml.tokens")) {
    const std::vector<int64_t> types = md.integer_array("tokenizer.ggml.token_type");
    int32_t end_id = -1;
    bool has_return = false, has_call = false;
    for (size_t id = 0; id < tokens->size() && id < types.size() && int64_t(id) < s.vocab_size; ++id) {
      if (types[id] != 3) continue;  // control tokens only
      const std::string& text = (*tokens)[id].s;
      for (const char* marker : kEndMarkers)
        if (text == marker &&
            std::find(s.eos_token_ids.begin(), s.eos_token_ids.end(), int32_t(id)) == s.eos_token_ids.end())
          s.eos_token_ids.push_back(int32_t(id));
      if (text == "<|end|>") end_id = int32_t(id);
      has_return |= text == "<|return|>";
      has_call |= text == "<|call|>";
    }
    // In harmony, <|end|> closes one message of a turn (the analysis before the final answer), so
    // with <|return|> and <|call|> present it must not stop generation (Phi-3's <|end|> still does).
    if (has_return && has_call && end_id >= 0)
      std::erase(s.eos_token_ids, end_id);
  }
  return s;
}

namespace {

class GgufSource final : public WeightSource {
 public:
  GgufSource(std::shared_ptr<const gguf::GgufFile> file, const ModelSpec& spec)
      : file_(std::move(file)),
        // glm4moe and gpt-oss files name the norm before the MLP post_attention_norm (as
        // transformers does), the others ffn_norm.
        mlp_norm_(spec.arch == Arch::Glm4Moe || spec.arch == Arch::GptOss ? "post_attention_norm.weight"
                                                                          : "ffn_norm.weight") {
    for (const gguf::TensorInfo& t : file_->tensors()) tensors_.emplace(t.name, t.view);
    if (spec.arch == Arch::Llama || spec.arch == Arch::Mixtral) unpermute_qk(spec);
    if (spec.attention == AttentionKind::Mla) join_mla_kv_b(spec);
  }

  const std::string& where() const override { return file_->path(); }
  const TensorView* find(const WeightKey& key) const override {
    const std::string name = name_of(key);
    if (name.empty()) return nullptr;
    auto it = tensors_.find(name);
    if (it != tensors_.end()) return &it->second;
    if (key.role == WeightRole::KVB)
      if (auto joined = kv_b_.find(key.layer); joined != kv_b_.end()) return &joined->second;
    return nullptr;
  }
  std::string describe(const WeightKey& key) const override {
    const std::string name = name_of(key);
    if (name.empty())
      return fmt::format("{}: {} (no such tensor in a GGUF file)", where(), weight_role_name(key.role));
    if (const gguf::TensorInfo* t = file_->find(name)) return fmt::format("{}: tensor '{}'", file_->file_of(*t), name);
    if (key.role == WeightRole::KVB) {
      const std::string k_b = blk(key.layer, "attn_k_b.weight"), v_b = blk(key.layer, "attn_v_b.weight");
      if (kv_b_.count(key.layer))
        return fmt::format("{}: tensors '{}' + '{}' (joined into kv_b at load)", where(), k_b, v_b);
      return fmt::format("{}: tensor '{}' (or '{}' + '{}')", where(), name, k_b, v_b);
    }
    return fmt::format("{}: tensor '{}'", where(), name);
  }
  const std::map<std::string, TensorView>& tensors() const override { return tensors_; }

 private:
  std::string name_of(const WeightKey& key) const {
    switch (key.role) {
      case WeightRole::Embed: return "token_embd.weight";
      case WeightRole::FinalNorm: return "output_norm.weight";
      case WeightRole::LmHead: return "output.weight";
      default: break;
    }
    const int64_t l = key.layer;
    switch (key.role) {
      case WeightRole::AttnNorm: return blk(l, "attn_norm.weight");
      case WeightRole::Q: return blk(l, "attn_q.weight");
      case WeightRole::K: return blk(l, "attn_k.weight");
      case WeightRole::V: return blk(l, "attn_v.weight");
      case WeightRole::O: return blk(l, "attn_output.weight");
      case WeightRole::QBias: return blk(l, "attn_q.bias");
      case WeightRole::KBias: return blk(l, "attn_k.bias");
      case WeightRole::VBias: return blk(l, "attn_v.bias");
      case WeightRole::OBias: return blk(l, "attn_output.bias");
      case WeightRole::QNorm: return blk(l, "attn_q_norm.weight");
      case WeightRole::KNorm: return blk(l, "attn_k_norm.weight");
      case WeightRole::MlpNorm: return blk(l, mlp_norm_);
      case WeightRole::Sinks: return blk(l, "attn_sinks.weight");
      case WeightRole::QA: return blk(l, "attn_q_a.weight");
      case WeightRole::QANorm: return blk(l, "attn_q_a_norm.weight");
      case WeightRole::QB: return blk(l, "attn_q_b.weight");
      case WeightRole::KVA: return blk(l, "attn_kv_a_mqa.weight");
      case WeightRole::KVANorm: return blk(l, "attn_kv_a_norm.weight");
      case WeightRole::KVB: return blk(l, "attn_kv_b.weight");  // older files; newer ones: joined (join_mla_kv_b)
      case WeightRole::RouterBias: return blk(l, "ffn_gate_inp.bias");
      case WeightRole::RouterCorrectionBias: return blk(l, "exp_probs_b.bias");
      case WeightRole::SharedGate: return blk(l, "ffn_gate_shexp.weight");
      case WeightRole::SharedUp: return blk(l, "ffn_up_shexp.weight");
      case WeightRole::SharedDown: return blk(l, "ffn_down_shexp.weight");
      case WeightRole::ExpertsGateBias: return blk(l, "ffn_gate_exps.bias");
      case WeightRole::ExpertsUpBias: return blk(l, "ffn_up_exps.bias");
      case WeightRole::ExpertsDownBias: return blk(l, "ffn_down_exps.bias");
      case WeightRole::DenseGate: return blk(l, "ffn_gate.weight");
      case WeightRole::DenseUp: return blk(l, "ffn_up.weight");
      case WeightRole::DenseDown: return blk(l, "ffn_down.weight");
      case WeightRole::Router: return blk(l, "ffn_gate_inp.weight");
      case WeightRole::ExpertsGate: return blk(l, "ffn_gate_exps.weight");
      case WeightRole::ExpertsUp: return blk(l, "ffn_up_exps.weight");
      case WeightRole::ExpertsDown: return blk(l, "ffn_down_exps.weight");
      // Early Mixtral GGUFs stored one tensor per expert: blk.N.ffn_gate.E.weight.
      case WeightRole::ExpertGate: return blk(l, ("ffn_gate." + std::to_string(key.expert) + ".weight").c_str());
      case WeightRole::ExpertUp: return blk(l, ("ffn_up." + std::to_string(key.expert) + ".weight").c_str());
      case WeightRole::ExpertDown: return blk(l, ("ffn_down." + std::to_string(key.expert) + ".weight").c_str());
      default: return {};  // ExpertsGateUp: GGUF keeps gate and up apart
    }
  }

  // Within each head of D rows, the file holds Hugging Face row j*D/2 + k at 2k + j (j = 0, 1).
  void unpermute_qk(const ModelSpec& spec) {
    const int64_t D = spec.head_dim;
    for (int64_t l = 0; l < spec.n_layers; ++l) {
      for (const char* name : {"attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias"}) {
        auto it = tensors_.find(blk(l, name));
        if (it == tensors_.end()) continue;
        TensorView& t = it->second;
        const int64_t n_rows = t.shape[0];
        if (t.ndim > 2 || n_rows % D != 0)
          fail("{}: tensor '{}' has shape {}, not [heads x {}, ...]", where(), it->first, shape_str(t), D);
        if (t.ndim == 1 && !dtype_is_float(t.dtype))
          fail("{}: tensor '{}': a bias must be F32, F16 or BF16, not {}", where(), it->first, dtype_name(t.dtype));
        // A 2-D tensor moves rows; a 1-D bias moves elements.
        const size_t unit = t.ndim == 2 ? size_t(t.row_bytes()) : size_t(dtype_traits(t.dtype).block_bytes);
        owned_.push_back(std::make_unique<uint8_t[]>(unit * size_t(n_rows)));
        uint8_t* dst = owned_.back().get();
        const auto* src = static_cast<const uint8_t*>(t.data);
        for (int64_t h = 0; h < n_rows / D; ++h)
          for (int64_t j = 0; j < 2; ++j)
            for (int64_t k = 0; k < D / 2; ++k)
              std::memcpy(dst + size_t(h * D + j * (D / 2) + k) * unit, src + size_t(h * D + 2 * k + j) * unit, unit);
        t.data = dst;
      }
    }
  }

  // Newer converters store MLA's kv_b split for the absorbed decode: attn_k_b [heads, kv_lora, nope]
  // (each head's key up-projection transposed, nope contiguous) and attn_v_b [heads, v, kv_lora].
  // spill's MLA reads the Hugging Face kv_b [heads * (nope + v), kv_lora] (per head, key rows then
  // value rows), so the two are joined back into it, once, in buffers this source owns: in their
  // own float type (moving values, exact), or as F32 when either is in a block format (a
  // transposed block row is not a row of blocks; ggml's dequantized values are exact in F32).
  void join_mla_kv_b(const ModelSpec& spec) {
    const int64_t H = spec.n_heads, L = spec.mla.kv_lora_rank, nope = spec.mla.qk_nope_head_dim,
                  V = spec.mla.v_head_dim, per_head = nope + V;
    for (int64_t l = 0; l < spec.n_layers; ++l) {
      if (tensors_.count(blk(l, "attn_kv_b.weight"))) continue;
      auto k_it = tensors_.find(blk(l, "attn_k_b.weight")), v_it = tensors_.find(blk(l, "attn_v_b.weight"));
      if (k_it == tensors_.end() || v_it == tensors_.end()) continue;  // the resolver reports what is missing
      const TensorView& k_b = k_it->second;
      const TensorView& v_b = v_it->second;
      auto expect = [&](const std::string& name, const TensorView& t, int64_t d0, int64_t d1, int64_t d2) {
        if (t.ndim != 3 || t.shape[0] != d0 || t.shape[1] != d1 || t.shape[2] != d2)
          fail("{}: tensor '{}' has shape {} (row-major) but the metadata implies [{}, {}, {}] (heads, {})", where(),
               name, shape_str(t), d0, d1, d2, &t == &k_b ? "kv_lora_rank, nope" : "v, kv_lora_rank");
      };
      expect(k_it->first, k_b, H, L, nope);
      expect(v_it->first, v_b, H, V, L);
      const bool same_float = k_b.dtype == v_b.dtype && dtype_is_float(k_b.dtype);
      const DType out_type = same_float ? k_b.dtype : DType::F32;
      const size_t es = size_t(dtype_traits(out_type).block_bytes);
      owned_.push_back(std::make_unique<uint8_t[]>(size_t(H * per_head * L) * es));
      uint8_t* out = owned_.back().get();
      std::vector<float> row(static_cast<size_t>(std::max(L, nope)));
      for (int64_t h = 0; h < H; ++h) {
        // Key rows: out[h * per_head + j][c] = k_b[h][c][j].
        for (int64_t c = 0; c < L; ++c) {
          const uint8_t* src = k_b.row_data(h * L + c);
          if (same_float) {
            for (int64_t j = 0; j < nope; ++j)
              std::memcpy(out + (size_t(h * per_head + j) * size_t(L) + size_t(c)) * es, src + size_t(j) * es, es);
          } else {
            quant::dequantize_row(k_b.dtype, src, row.data(), nope);
            for (int64_t j = 0; j < nope; ++j)
              reinterpret_cast<float*>(out)[size_t(h * per_head + j) * size_t(L) + size_t(c)] = row[size_t(j)];
          }
        }
        // Value rows: whole rows of kv_lora_rank values.
        for (int64_t j = 0; j < V; ++j) {
          uint8_t* dst = out + size_t(h * per_head + nope + j) * size_t(L) * es;
          if (same_float) std::memcpy(dst, v_b.row_data(h * V + j), size_t(L) * es);
          else quant::dequantize_row(v_b.dtype, v_b.row_data(h * V + j), reinterpret_cast<float*>(dst), L);
        }
      }
      TensorView joined = k_b;
      joined.dtype = out_type;
      joined.ndim = 2;
      joined.shape = {H * per_head, L, 0, 0};
      joined.data = out;
      kv_b_.emplace(int32_t(l), joined);
    }
  }

  std::shared_ptr<const gguf::GgufFile> file_;
  const char* mlp_norm_;
  std::map<std::string, TensorView> tensors_;
  std::map<int32_t, TensorView> kv_b_;             // MLA kv_b joined from attn_k_b + attn_v_b, by layer
  std::vector<std::unique_ptr<uint8_t[]>> owned_;  // un-permuted q/k rows, joined kv_b
};

}  // namespace

std::unique_ptr<WeightSource> open_gguf_source(std::shared_ptr<const gguf::GgufFile> file, const ModelSpec& spec) {
  return std::make_unique<GgufSource>(std::move(file), spec);
}

}  // namespace spill
