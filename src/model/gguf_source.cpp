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
#include "model/weight_source.h"

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

ModelSpec gguf_model_spec(const gguf::GgufFile& file) {
  const gguf::Metadata& md = file.metadata();
  const std::string& where = file.path();
  const std::string arch = md.string("general.architecture");
  const std::string p = arch + ".";
  ModelSpec s;
  s.model_type = arch;
  const int64_t n_experts = md.integer(p + "expert_count", 0);
  if (arch == "qwen3moe") s.arch = Arch::Qwen3Moe;
  else if (arch == "qwen3") s.arch = Arch::Qwen3;
  else if (arch == "olmoe") s.arch = Arch::Olmoe;
  else if (arch == "llama") s.arch = n_experts > 0 ? Arch::Mixtral : Arch::Llama;
  else
    fail("{}: general.architecture '{}' is not supported (supported: llama (dense and Mixtral-style experts), "
         "qwen3, qwen3moe, olmoe)", where, arch);

  s.hidden_size = md.integer(p + "embedding_length");
  s.n_layers = md.integer(p + "block_count");
  s.n_heads = md.integer(p + "attention.head_count");
  s.n_kv_heads = md.integer(p + "attention.head_count_kv", s.n_heads);
  if (s.hidden_size <= 0 || s.n_layers <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 || s.n_layers > 100000)
    fail("{}: {}embedding_length, block_count, attention.head_count and head_count_kv must be positive", where, p);
  if (s.n_heads % s.n_kv_heads != 0)
    fail("{}: {}attention.head_count ({}) must be a multiple of head_count_kv ({})", where, p, s.n_heads, s.n_kv_heads);
  s.head_dim = md.integer(p + "attention.key_length", s.hidden_size / s.n_heads);
  if (s.head_dim <= 0 || s.head_dim % 2 != 0)
    fail("{}: the head size ({}) must be positive and even", where, s.head_dim);
  if (md.integer(p + "attention.value_length", s.head_dim) != s.head_dim)
    fail("{}: {}attention.value_length ({}) differs from key_length ({}); spill needs equal k and v head sizes",
         where, p, md.integer(p + "attention.value_length"), s.head_dim);
  if (md.integer(p + "rope.dimension_count", s.head_dim) != s.head_dim)
    fail("{}: {}rope.dimension_count ({}) is not the head size ({}): partial rotary embeddings are not supported",
         where, p, md.integer(p + "rope.dimension_count"), s.head_dim);

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
    // transformers' default attention factor for yarn: 0.1 ln(factor) + 1.
    const double fallback = s.rope.factor <= 1 ? 1.0 : 0.1 * std::log(s.rope.factor) + 1.0;
    s.rope.attention_factor = as_config_double(md, p + "rope.scaling.attn_factor", fallback);
  } else if (scaling != "none") {
    fail("{}: {}rope.scaling.type '{}' is not supported (supported: none, linear, yarn)", where, p, scaling);
  }

  switch (s.arch) {
    case Arch::Llama: break;
    case Arch::Qwen3: s.qk_norm = QkNorm::PerHead; break;
    case Arch::Qwen3Moe: s.qk_norm = QkNorm::PerHead; break;
    case Arch::Olmoe: s.qk_norm = QkNorm::WholeProjection; break;
    case Arch::Mixtral: break;
    case Arch::GptOss:
    case Arch::DeepseekV3:
    case Arch::Glm4Moe: break;  // not read from GGUF metadata yet
  }
  s.layer_is_moe.assign(size_t(s.n_layers), false);
  if (s.arch == Arch::Qwen3Moe || s.arch == Arch::Olmoe || s.arch == Arch::Mixtral) {
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
  } else if (n_experts > 0) {
    fail("{}: {}expert_count = {}, but {} is a dense architecture", where, p, n_experts, arch);
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
  static const char* const kEndMarkers[] = {"<|endoftext|>", "<|im_end|>",  "<|end_of_text|>", "<|eot_id|>",
                                            "<|eom_id|>",    "<|end|>",     "<end_of_turn>",   "<|return|>",
                                            "<｜end▁of▁sentence｜>", "<|EOT|>"};
  if (const std::vector<gguf::Value>* tokens = md.string_array("tokenizer.ggml.tokens")) {
    const std::vector<int64_t> types = md.integer_array("tokenizer.ggml.token_type");
    for (size_t id = 0; id < tokens->size() && id < types.size() && int64_t(id) < s.vocab_size; ++id) {
      if (types[id] != 3) continue;  // control tokens only
      for (const char* marker : kEndMarkers)
        if ((*tokens)[id].s == marker &&
            std::find(s.eos_token_ids.begin(), s.eos_token_ids.end(), int32_t(id)) == s.eos_token_ids.end())
          s.eos_token_ids.push_back(int32_t(id));
    }
  }
  return s;
}

namespace {

class GgufSource final : public WeightSource {
 public:
  GgufSource(std::shared_ptr<const gguf::GgufFile> file, const ModelSpec& spec) : file_(std::move(file)) {
    for (const gguf::TensorInfo& t : file_->tensors()) tensors_.emplace(t.name, t.view);
    if (spec.arch == Arch::Llama || spec.arch == Arch::Mixtral) unpermute_qk(spec);
  }

  const std::string& where() const override { return file_->path(); }
  const TensorView* find(const WeightKey& key) const override {
    const std::string name = name_of(key);
    if (name.empty()) return nullptr;
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  std::string describe(const WeightKey& key) const override {
    const std::string name = name_of(key);
    if (name.empty())
      return fmt::format("{}: {} (no such tensor in a GGUF file)", where(), weight_role_name(key.role));
    if (const gguf::TensorInfo* t = file_->find(name)) return fmt::format("{}: tensor '{}'", file_->file_of(*t), name);
    return fmt::format("{}: tensor '{}'", where(), name);
  }
  const std::map<std::string, TensorView>& tensors() const override { return tensors_; }

 private:
  static std::string name_of(const WeightKey& key) {
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
      case WeightRole::MlpNorm: return blk(l, "ffn_norm.weight");
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

  std::shared_ptr<const gguf::GgufFile> file_;
  std::map<std::string, TensorView> tensors_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;  // un-permuted q/k rows
};

}  // namespace

std::unique_ptr<WeightSource> open_gguf_source(std::shared_ptr<const gguf::GgufFile> file, const ModelSpec& spec) {
  return std::make_unique<GgufSource>(std::move(file), spec);
}

}  // namespace spill
