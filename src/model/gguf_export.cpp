#include "model/gguf_export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json_limits.h"
#include "formats/gguf_writer.h"
#include "quant/quant.h"
#include "quant/quant_mix.h"
#include "text/tokenizer.h"

namespace spill {

namespace fs = std::filesystem;
using json = nlohmann::json;
using gguf::Value;

std::string gguf_arch_name(const ModelSpec& spec) {
  switch (spec.arch) {
    case Arch::Qwen3Moe: return "qwen3moe";
    case Arch::Qwen3: return "qwen3";
    case Arch::Olmoe: return "olmoe";
    case Arch::Llama:
    case Arch::Mixtral: return "llama";  // llama.cpp runs Mixtral as llama with experts
    case Arch::GptOss: return "gpt-oss";
    case Arch::DeepseekV3: return "deepseek2";  // DeepSeek-V3 and Kimi-K2 are deepseek2 in llama.cpp
    case Arch::Glm4Moe: return "glm4moe";
  }
  return "llama";
}

namespace {

json read_json(const fs::path& path, bool required) {
  if (!fs::exists(path)) {
    if (required) fail("{}: missing; spill quantize needs it to write the tokenizer into the GGUF file", path.string());
    return json::object();
  }
  std::ifstream in(path, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse_json<json>(text, path.string());
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Added tokens that llama.cpp's converter marks as control even when not flagged special.
bool looks_special(const std::string& t) {
  return (t.starts_with("<|") && t.ends_with("|>")) || t == "<pad>" || t == "<mask>" || t == "<s>" || t == "</s>";
}

// The tokenizer as tokenizer.ggml.* wants it, and the pre-tokenizer name llama.cpp would give
// it. llama.cpp's converter names the pre-tokenizer by hashing what the Hugging Face tokenizer
// does to a probe text; spill does the same with the pipelines it knows: the name whose
// pipeline (Tokenizer::from_parts) encodes a probe text exactly as the folder's tokenizer.json.
TokenizerParts tokenizer_parts(const std::string& dir, const ModelSpec& spec) {
  const fs::path tok_path = fs::path(dir) / "tokenizer.json";
  const json tok = read_json(tok_path, true);
  const json cfg = read_json(fs::path(dir) / "tokenizer_config.json", false);
  if (!tok.contains("model") || tok["model"].value("type", "") != "BPE" || !tok["model"]["vocab"].is_object())
    fail("{}: only byte-level BPE tokenizers can be written to GGUF by spill", tok_path.string());
  TokenizerParts p;
  p.origin = tok_path.string();
  const int64_t V = spec.vocab_size;
  p.tokens.assign(size_t(V), "");
  p.token_types.assign(size_t(V), 0);
  for (auto& [text, id] : tok["model"]["vocab"].items()) {
    const int64_t i = id.get<int64_t>();
    if (i < 0 || i >= V) fail("{}: token '{}' has id {}, outside the model's vocabulary of {}", p.origin, text, i, V);
    p.tokens[size_t(i)] = text;
    p.token_types[size_t(i)] = 1;
  }
  for (const json& a : tok.value("added_tokens", json::array())) {
    const int64_t i = a.value("id", int64_t(-1));
    if (i < 0 || i >= V) continue;
    const std::string content = a.value("content", "");
    p.tokens[size_t(i)] = content;
    p.token_types[size_t(i)] = a.value("special", false) || looks_special(content) ? 3 : 4;
  }
  for (int64_t i = 0; i < V; ++i)
    if (p.token_types[size_t(i)] == 0) {  // ids the tokenizer does not use, as the converter pads them
      p.tokens[size_t(i)] = "[PAD" + std::to_string(i) + "]";
      p.token_types[size_t(i)] = 5;
    }
  for (const json& m : tok["model"].value("merges", json::array())) {
    if (m.is_string())
      p.merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2)
      p.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else
      fail("{}: a merge is neither \"a b\" nor [\"a\", \"b\"]", p.origin);
  }
  auto token_id = [&](const char* key) -> int32_t {
    if (!cfg.contains(key) || cfg[key].is_null()) return -1;
    const std::string t = cfg[key].is_string() ? cfg[key].get<std::string>() : cfg[key].value("content", "");
    for (int64_t i = 0; i < V; ++i)
      if (p.tokens[size_t(i)] == t) return int32_t(i);
    return -1;
  };
  p.bos_id = spec.bos_token_id >= 0 ? spec.bos_token_id : token_id("bos_token");
  p.eos_id = !spec.eos_token_ids.empty() ? spec.eos_token_ids.front() : token_id("eos_token");
  p.add_bos = cfg.value("add_bos_token", false);
  p.add_eos = cfg.value("add_eos_token", false);

  const Tokenizer hf = Tokenizer::from_file(tok_path.string());
  const std::string probe =
      "\n \n\n \t\t x  y   z\n🚀 (normal) ✅ 3 33 333 3333 33333 3.3 3..3 ?我想在apple工作1314151天～ ------======= "
      "нещо на Български '''``````\"\"\"......!!!!?? I've been 'told he's there, 'RE you sure? 'M not sure I'll "
      "make it, 'D you like some tea? We'Ve a'lL def f(x):\n    return x**2  # done\r\n";
  const std::vector<int32_t> want = hf.encode(probe);
  // GLM-4.5's regex is Llama 3's; llama.cpp names it glm4 (merges always applied), so for a GLM
  // model that name is tried where llama-bpe would be.
  std::vector<const char*> pres = {"qwen2", "llama-bpe", "deepseek-v3", "gpt-4o", "kimi-k2", "gpt-2", "olmo"};
  if (spec.arch == Arch::Glm4Moe) pres.insert(pres.begin() + 1, "glm4");
  for (const char* pre : pres) {
    p.pre = pre;
    try {
      if (Tokenizer::from_parts(p).encode(probe) == want) return p;
    } catch (const Error&) {
    }
  }
  fail("{}: its pre-tokenizer is none of those spill can name for llama.cpp (qwen2, llama-bpe, glm4, deepseek-v3, "
       "gpt-4o, kimi-k2, gpt-2, olmo): a GGUF file would tokenize differently, so spill does not write one",
       p.origin);
}

std::string chat_template(const std::string& dir) {
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja)) return read_file(jinja);
  const json cfg = read_json(fs::path(dir) / "tokenizer_config.json", false);
  if (cfg.contains("chat_template")) {
    const json& t = cfg["chat_template"];
    if (t.is_string()) return t.get<std::string>();
    if (t.is_array())
      for (const json& named : t)
        if (named.value("name", "") == "default") return named.value("template", "");
  }
  return {};
}

// The bytes of every tensor to write, kept alive until the writer is done.
class TensorBytes {
 public:
  const void* keep(std::vector<uint8_t> bytes) {
    store_.push_back(std::make_unique<std::vector<uint8_t>>(std::move(bytes)));
    return store_.back()->data();
  }

 private:
  std::vector<std::unique_ptr<std::vector<uint8_t>>> store_;
};

std::vector<int64_t> shape_of(const TensorView& t) { return {t.shape.begin(), t.shape.begin() + t.ndim}; }

}  // namespace

void write_gguf(const Model& model, const std::string& path, const GgufExportOptions& options) {
  const ModelSpec& s = model.spec();
  const std::string arch = gguf_arch_name(s);
  const std::string p = arch + ".";
  const bool sigmoid_moe = s.arch == Arch::DeepseekV3 || s.arch == Arch::Glm4Moe;
  const bool gpt_oss = s.arch == Arch::GptOss;
  // YaRN is written for the families whose llama.cpp graph reads it as spill computes it.
  if (s.rope.kind != RopeKind::Default && !(s.rope.kind == RopeKind::Yarn && (sigmoid_moe || gpt_oss)))
    fail("{}: {} RoPE scaling of a {} model is not written to GGUF by spill yet", model.where(),
         s.rope.kind == RopeKind::Yarn ? "YaRN" : "this", arch_name(s.arch));
  // DeepSeek-V3 / GLM-4.x: the first layers dense, the rest MoE (leading_dense_block_count); the
  // other families: all one or the other.
  int64_t leading_dense = 0;
  while (leading_dense < s.n_layers && !s.layer_is_moe[size_t(leading_dense)]) ++leading_dense;
  for (int64_t l = 0; l < s.n_layers; ++l)
    if (s.layer_is_moe[size_t(l)] != (sigmoid_moe ? l >= leading_dense : s.layer_is_moe.front()))
      fail("{}: layer {} is {} where llama.cpp's {} files can only say {}", model.where(), l,
           s.layer_is_moe[size_t(l)] ? "MoE" : "dense", arch,
           sigmoid_moe ? "'the first N layers are dense'" : "'every layer is MoE' or 'none is'");
  if (s.arch == Arch::DeepseekV3 && !s.rope_interleaved)
    fail("{}: rope_interleave = false: llama.cpp's deepseek2 rotates adjacent pairs, spill does not permute the rope "
         "rows for it", model.where());
  if (gpt_oss && (s.swiglu_alpha != 1.702 || s.swiglu_limit != 7.0))
    fail("{}: swiglu alpha {} / limit {}: llama.cpp's gpt-oss graph has 1.702 / 7 built in, and GGUF has no key for "
         "others", model.where(), s.swiglu_alpha, s.swiglu_limit);
  // gpt-oss sliding layers: llama.cpp's rule is l % period < period - 1 (period 2 unless written).
  int64_t swa_period = 0;
  if (gpt_oss) {
    for (int64_t period = 1; period <= s.n_layers + 1 && !swa_period; ++period) {
      bool fits = true;
      for (int64_t l = 0; l < s.n_layers; ++l) fits = fits && s.sliding(l) == (l % period < period - 1);
      if (fits) swa_period = period;
    }
    if (!swa_period)
      fail("{}: its sliding layers follow no period (l % p < p - 1), which is all llama.cpp's gpt-oss files can say",
           model.where());
  }

  gguf::Writer w;
  w.set("general.architecture", Value::string(arch));
  w.set("general.type", Value::string("model"));
  w.set("general.name", Value::string(options.name.empty() ? fs::path(options.hf_dir).lexically_normal().filename().string()
                                                            : options.name));
  const json gen = read_json(fs::path(options.hf_dir) / "generation_config.json", false);
  if (gen.contains("temperature") && gen["temperature"].is_number())
    w.set("general.sampling.temp", Value::f32(gen["temperature"].get<float>()));
  if (gen.contains("top_p") && gen["top_p"].is_number()) w.set("general.sampling.top_p", Value::f32(gen["top_p"].get<float>()));
  if (gen.contains("top_k") && gen["top_k"].is_number_integer())
    w.set("general.sampling.top_k", Value::i32(gen["top_k"].get<int32_t>()));
  const bool moe = s.n_experts > 0;
  auto u32 = [&](const char* key, int64_t v) { w.set(p + key, Value::u32(uint32_t(v))); };
  u32("block_count", s.n_layers);
  u32("context_length", s.max_position_embeddings);
  u32("embedding_length", s.hidden_size);
  // Mixtral and OLMoE experts are feed_forward_length wide in llama.cpp; the others have their own key.
  const bool own_expert_width = s.arch == Arch::Qwen3Moe || sigmoid_moe || gpt_oss;
  u32("feed_forward_length", moe && !own_expert_width ? s.moe_intermediate_size : s.intermediate_size);
  u32("attention.head_count", s.n_heads);
  // MLA is written as llama.cpp runs it: MQA over the one latent "head".
  u32("attention.head_count_kv", s.attention == AttentionKind::Mla ? 1 : s.n_kv_heads);
  w.set(p + "rope.freq_base", Value::f32(float(s.rope.theta)));
  w.set(p + "attention.layer_norm_rms_epsilon", Value::f32(float(s.rms_norm_eps)));
  if (moe) {
    u32("expert_count", s.n_experts);
    u32("expert_used_count", s.n_experts_per_token);
    if (own_expert_width) u32("expert_feed_forward_length", s.moe_intermediate_size);
    // What llama.cpp does by default: renormalise for qwen3moe and llama, not for olmoe.
    if (!sigmoid_moe && !gpt_oss && s.norm_topk_prob != (s.arch != Arch::Olmoe))
      w.set(p + "expert_weights_norm", Value::boolean(s.norm_topk_prob));
  }
  if (sigmoid_moe) {
    u32("leading_dense_block_count", leading_dense);
    u32("expert_shared_count", s.n_shared_experts);
    // All groups chosen is no group limit; llama.cpp asserts fewer chosen groups than groups.
    const bool grouped = s.router.topk_group < s.router.n_group;
    u32("expert_group_count", grouped ? s.router.n_group : 1);
    u32("expert_group_used_count", grouped ? s.router.topk_group : 1);
    u32("expert_gating_func", 2);  // sigmoid
    w.set(p + "expert_weights_scale", Value::f32(float(s.router.routed_scaling_factor)));
    w.set(p + "expert_weights_norm", Value::boolean(s.norm_topk_prob));
  }
  if (s.attention == AttentionKind::Mla) {
    const MlaSpec& m = s.mla;
    // q_lora_rank 0 (no q compression) is written too: llama.cpp requires the key of every
    // deepseek2 file but the "lite" shapes it recognises by layer count.
    u32("attention.q_lora_rank", m.q_lora_rank);
    u32("attention.kv_lora_rank", m.kv_lora_rank);
    u32("attention.key_length", m.kv_lora_rank + m.qk_rope_head_dim);
    u32("attention.value_length", m.kv_lora_rank);
    u32("attention.key_length_mla", m.qk_head_dim());
    u32("attention.value_length_mla", m.v_head_dim);
    u32("rope.dimension_count", m.qk_rope_head_dim);
    u32("vocab_size", s.vocab_size);
  } else {
    u32("attention.key_length", s.head_dim);
    u32("attention.value_length", s.head_dim);
  }
  if (s.arch == Arch::Glm4Moe) u32("rope.dimension_count", s.rope_dims());
  if (gpt_oss) {
    u32("attention.sliding_window", s.sliding_window);
    if (swa_period != 2) u32("attention.sliding_window_pattern", swa_period);
  }
  if (s.rope.kind == RopeKind::Yarn) {
    w.set(p + "rope.scaling.type", Value::string("yarn"));
    w.set(p + "rope.scaling.factor", Value::f32(float(s.rope.factor)));
    u32("rope.scaling.original_context_length", s.rope.original_max_position);
    w.set(p + "rope.scaling.yarn_beta_fast", Value::f32(float(s.rope.beta_fast)));
    w.set(p + "rope.scaling.yarn_beta_slow", Value::f32(float(s.rope.beta_slow)));
    // The cos/sin factor the reader assumes when the key is absent: 0.1 ln(factor) + 1, or 1 for deepseek2.
    const double implied = s.arch == Arch::DeepseekV3 || s.rope.factor <= 1 ? 1.0 : 0.1 * std::log(s.rope.factor) + 1.0;
    if (s.rope.attention_factor != implied)
      w.set(p + "rope.scaling.attn_factor", Value::f32(float(s.rope.attention_factor)));
    // DeepSeek's softmax scale is qk_head_dim^-0.5 m^2 with m = 0.1 mscale_all_dim ln(factor) + 1; the
    // converter writes 0.1 mscale_all_dim = (m - 1) / ln(factor).
    if (s.arch == Arch::DeepseekV3 && s.rope.factor > 1) {
      const double m = std::sqrt(s.softmax_scale() * std::sqrt(double(s.mla.qk_head_dim())));
      if (m != 1.0) w.set(p + "rope.scaling.yarn_log_multiplier", Value::f32(float((m - 1.0) / std::log(s.rope.factor))));
    }
  }
  if (arch == "llama") {
    w.set(p + "rope.dimension_count", Value::u32(uint32_t(s.head_dim)));
    w.set(p + "vocab_size", Value::u32(uint32_t(s.vocab_size)));
  }
  if (s.clip_qkv > 0) w.set(p + "attention.clamp_kqv", Value::f32(float(s.clip_qkv)));
  const quant::QuantMix mix = options.quant.empty() ? quant::QuantMix{} : quant::parse_quant_mix(options.quant);
  if (const int32_t ftype = quant::preset_llama_ftype(mix.preset); ftype >= 0)
    w.set("general.file_type", Value::u32(uint32_t(ftype)));
  w.set("general.quantization_version", Value::u32(2));
  if (!options.quant.empty()) w.set("spill.quant", Value::string(mix.str()));

  const TokenizerParts tok = tokenizer_parts(options.hf_dir, s);
  w.set("tokenizer.ggml.model", Value::string("gpt2"));
  w.set("tokenizer.ggml.pre", Value::string(tok.pre));
  w.set("tokenizer.ggml.tokens", Value::strings(tok.tokens));
  w.set("tokenizer.ggml.token_type", Value::i32s(tok.token_types));
  w.set("tokenizer.ggml.merges", Value::strings(tok.merges));
  if (tok.bos_id >= 0) w.set("tokenizer.ggml.bos_token_id", Value::u32(uint32_t(tok.bos_id)));
  if (tok.eos_id >= 0) w.set("tokenizer.ggml.eos_token_id", Value::u32(uint32_t(tok.eos_id)));
  {
    const json cfg = read_json(fs::path(options.hf_dir) / "tokenizer_config.json", false);
    if (cfg.contains("pad_token") && cfg["pad_token"].is_string())
      for (size_t i = 0; i < tok.tokens.size(); ++i)
        if (tok.tokens[i] == cfg["pad_token"].get<std::string>()) {
          w.set("tokenizer.ggml.padding_token_id", Value::u32(uint32_t(i)));
          break;
        }
  }
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(tok.add_bos));
  w.set("tokenizer.ggml.add_eos_token", Value::boolean(tok.add_eos));
  if (const std::string t = chat_template(options.hf_dir); !t.empty())
    w.set("tokenizer.chat_template", Value::string(t));

  // ---- tensors, in the converter's order and types: 1-D tensors and the router as F32 --------
  TensorBytes bytes;
  auto as_f32 = [&](const TensorView& t) {
    std::vector<uint8_t> out(size_t(t.numel()) * 4);
    for (int64_t r = 0; r < t.rows(); ++r) {
      const uint8_t* src = t.row_data(r);
      float* dst = reinterpret_cast<float*>(out.data()) + r * t.cols();
      for (int64_t i = 0; i < t.cols(); ++i)
        dst[i] = t.dtype == DType::F32   ? reinterpret_cast<const float*>(src)[i]
                 : t.dtype == DType::BF16 ? bf16_to_f32(reinterpret_cast<const uint16_t*>(src)[i])
                                          : f16_to_f32(reinterpret_cast<const uint16_t*>(src)[i]);
    }
    return bytes.keep(std::move(out));
  };
  auto add = [&](const std::string& name, const TensorView& t) {
    if (t.empty()) return;
    w.add_tensor(name, t.dtype, shape_of(t), t.data);
  };
  auto add_f32 = [&](const std::string& name, const TensorView& t) {
    if (t.empty()) return;
    if (!dtype_is_float(t.dtype)) return add(name, t);
    w.add_tensor(name, DType::F32, shape_of(t), as_f32(t));
  };
  // llama.cpp's llama arch wants q/k rows of each head interleaved for its RoPE: the inverse of
  // what spill's GGUF source undoes (file row 2k + j of a head = Hugging Face row j*D/2 + k).
  auto add_permuted = [&](const std::string& name, const TensorView& t) {
    if (t.empty()) return;
    if (arch != "llama") return t.ndim == 1 ? add_f32(name, t) : add(name, t);
    const int64_t D = s.head_dim, n = t.shape[0];
    const TensorView src_view = t.ndim == 1 && dtype_is_float(t.dtype) ? [&] {
      TensorView v = t;
      v.data = as_f32(t);
      v.dtype = DType::F32;
      return v;
    }() : t;
    const size_t unit = t.ndim == 2 ? size_t(src_view.row_bytes()) : size_t(dtype_traits(src_view.dtype).block_bytes);
    std::vector<uint8_t> out(unit * size_t(n));
    const auto* src = static_cast<const uint8_t*>(src_view.data);
    for (int64_t h = 0; h < n / D; ++h)
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t k = 0; k < D / 2; ++k)
          std::memcpy(out.data() + size_t(h * D + 2 * k + j) * unit, src + size_t(h * D + j * (D / 2) + k) * unit, unit);
    w.add_tensor(name, src_view.dtype, shape_of(src_view), bytes.keep(std::move(out)));
  };
  // The experts of one projection as one [E, rows, cols] tensor: in place when quantize on load
  // already laid them out back to back, else gathered.
  auto add_experts = [&](const std::string& name, const std::vector<ExpertWeights>& experts,
                         TensorView ExpertWeights::*proj) {
    const TensorView& first = experts.front().*proj;
    bool contiguous = true;
    for (size_t e = 0; e < experts.size(); ++e) {
      const TensorView& v = experts[e].*proj;
      if (v.dtype != first.dtype || v.shape != first.shape)
        fail("{}: {} expert {} is {} {}, expert 0 {} {}: one GGUF tensor needs one type and shape", model.where(), name,
             e, dtype_name(v.dtype), shape_str(v), dtype_name(first.dtype), shape_str(first));
      contiguous = contiguous && v.data == static_cast<const uint8_t*>(first.data) + e * first.nbytes();
    }
    const std::vector<int64_t> shape = {int64_t(experts.size()), first.shape[0], first.shape[1]};
    if (contiguous) return w.add_tensor(name, first.dtype, shape, first.data);
    std::vector<uint8_t> out(first.nbytes() * experts.size());
    for (size_t e = 0; e < experts.size(); ++e)
      std::memcpy(out.data() + e * first.nbytes(), (experts[e].*proj).data, first.nbytes());
    w.add_tensor(name, first.dtype, shape, bytes.keep(std::move(out)));
  };

  // MLA's kv_b [heads * (nope + v), kv_lora] split as the converter splits it for llama.cpp's
  // absorbed attention: attn_k_b [heads, kv_lora, nope] (each head's key rows transposed) and
  // attn_v_b [heads, v, kv_lora]. Moving values is exact for the float types kv_b is kept in.
  auto add_mla_kv_b = [&](const std::string& b, const TensorView& kv_b) {
    if (!dtype_is_float(kv_b.dtype))
      fail("{}: the MLA kv_b of {} is {}; spill writes attn_k_b / attn_v_b from F32, BF16 or F16 only", model.where(),
           b, dtype_name(kv_b.dtype));
    const int64_t H = s.n_heads, L = s.mla.kv_lora_rank, nope = s.mla.qk_nope_head_dim, V = s.mla.v_head_dim;
    const size_t es = size_t(dtype_traits(kv_b.dtype).block_bytes);
    std::vector<uint8_t> k_b(size_t(H * L * nope) * es), v_b(size_t(H * V * L) * es);
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t j = 0; j < nope; ++j) {
        const uint8_t* row = kv_b.row_data(h * (nope + V) + j);
        for (int64_t c = 0; c < L; ++c)
          std::memcpy(k_b.data() + (size_t((h * L + c) * nope + j)) * es, row + size_t(c) * es, es);
      }
      for (int64_t j = 0; j < V; ++j)
        std::memcpy(v_b.data() + size_t((h * V + j) * L) * es, kv_b.row_data(h * (nope + V) + nope + j), size_t(L) * es);
    }
    w.add_tensor(b + "attn_k_b.weight", kv_b.dtype, {H, L, nope}, bytes.keep(std::move(k_b)));
    w.add_tensor(b + "attn_v_b.weight", kv_b.dtype, {H, V, L}, bytes.keep(std::move(v_b)));
  };
  // Expert biases [E, width] as F32 (exact), as ggml's add_id wants them.
  auto add_expert_bias = [&](const std::string& name, const std::vector<ExpertWeights>& experts,
                             TensorView ExpertWeights::*bias) {
    const TensorView& first = experts.front().*bias;
    if (first.empty()) return;
    std::vector<uint8_t> out(size_t(first.numel()) * 4 * experts.size());
    for (size_t e = 0; e < experts.size(); ++e)
      quant::dequantize_row((experts[e].*bias).dtype, (experts[e].*bias).data,
                            reinterpret_cast<float*>(out.data()) + e * size_t(first.numel()), first.numel());
    w.add_tensor(name, DType::F32, {int64_t(experts.size()), first.numel()}, bytes.keep(std::move(out)));
  };

  const bool tied = model.lm_head.data == model.embed.data;
  add("token_embd.weight", model.embed);
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const LayerWeights& L = model.layers[size_t(l)];
    const std::string b = "blk." + std::to_string(l) + ".";
    add_f32(b + "attn_norm.weight", L.attn_norm);
    if (s.attention == AttentionKind::Mla) {
      add(b + "attn_q_a.weight", L.mla.q_a);
      add_f32(b + "attn_q_a_norm.weight", L.mla.q_a_norm);
      add(b + "attn_q_b.weight", L.mla.q_b);
      add(b + "attn_q.weight", L.mla.q);
      add(b + "attn_kv_a_mqa.weight", L.mla.kv_a);
      add_f32(b + "attn_kv_a_norm.weight", L.mla.kv_a_norm);
      add_mla_kv_b(b, L.mla.kv_b);
      add(b + "attn_output.weight", L.mla.o);
    }
    add_permuted(b + "attn_q.weight", L.q);
    add_permuted(b + "attn_k.weight", L.k);
    add(b + "attn_v.weight", L.v);
    add(b + "attn_output.weight", L.o);
    add_permuted(b + "attn_q.bias", L.q_bias);
    add_permuted(b + "attn_k.bias", L.k_bias);
    add_f32(b + "attn_v.bias", L.v_bias);
    add_f32(b + "attn_output.bias", L.o_bias);
    add_f32(b + "attn_q_norm.weight", L.q_norm);
    add_f32(b + "attn_k_norm.weight", L.k_norm);
    add_f32(b + "attn_sinks.weight", L.sinks);
    // glm4moe and gpt-oss name the norm before the MLP as transformers does.
    add_f32(b + (s.arch == Arch::Glm4Moe || gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"), L.mlp_norm);
    if (s.layer_is_moe[size_t(l)]) {
      add_f32(b + "ffn_gate_inp.weight", L.router);
      add_f32(b + "ffn_gate_inp.bias", L.router_bias);
      add_f32(b + "exp_probs_b.bias", L.router_correction_bias);
      add_experts(b + "ffn_gate_exps.weight", L.experts, &ExpertWeights::gate);
      add_experts(b + "ffn_up_exps.weight", L.experts, &ExpertWeights::up);
      add_experts(b + "ffn_down_exps.weight", L.experts, &ExpertWeights::down);
      add_expert_bias(b + "ffn_gate_exps.bias", L.experts, &ExpertWeights::gate_bias);
      add_expert_bias(b + "ffn_up_exps.bias", L.experts, &ExpertWeights::up_bias);
      add_expert_bias(b + "ffn_down_exps.bias", L.experts, &ExpertWeights::down_bias);
      add(b + "ffn_gate_shexp.weight", L.shared.gate);
      add(b + "ffn_up_shexp.weight", L.shared.up);
      add(b + "ffn_down_shexp.weight", L.shared.down);
    } else {
      add(b + "ffn_gate.weight", L.dense.gate);
      add(b + "ffn_up.weight", L.dense.up);
      add(b + "ffn_down.weight", L.dense.down);
    }
  }
  add_f32("output_norm.weight", model.final_norm);
  // llama.cpp's gpt-oss graph needs output.weight even when the head is tied.
  if (!tied || gpt_oss) add("output.weight", model.lm_head);
  w.write(path);
}

}  // namespace spill
