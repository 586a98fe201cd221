#include "formats/model_spec.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json_limits.h"

namespace spill {

using json = nlohmann::json;

const char* arch_name(Arch arch) {
  switch (arch) {
    case Arch::Llama: return "llama";
    case Arch::Qwen3: return "qwen3";
    case Arch::Qwen3Moe: return "qwen3_moe";
    case Arch::Mixtral: return "mixtral";
    case Arch::Olmoe: return "olmoe";
    case Arch::GptOss: return "gpt_oss";
    case Arch::DeepseekV3: return "deepseek_v3";
    case Arch::Glm4Moe: return "glm4_moe";
  }
  return "?";
}

double ModelSpec::softmax_scale() const {
  if (attention_scale > 0) return attention_scale;
  const int64_t d = attention == AttentionKind::Mla ? mla.qk_head_dim() : head_dim;
  return 1.0 / std::sqrt(double(d));
}

namespace {

using model_limits::kMaxExperts;
using model_limits::kMaxHeads;
using model_limits::kMaxLayers;
using model_limits::kMaxPositions;
using model_limits::kMaxVocab;
using model_limits::kMaxWidth;

// Bound on a list of token ids in a config (eos_token_id: [...]).
constexpr size_t kMaxTokenIds = 1024;

// Typed access to config fields with errors that name the file and the field.
struct Fields {
  const json& j;
  const std::string& where;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

  int64_t integer(const char* key) const {
    if (!has(key)) fail("{}: missing field '{}'", where, key);
    return integer_of(j[key], key);
  }
  int64_t integer(const char* key, int64_t fallback) const { return has(key) ? integer_of(j[key], key) : fallback; }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_number()) fail("{}: field '{}' must be a number, got {}", where, key, describe_json(j[key]));
    const double x = j[key].get<double>();
    // JSON has no infinity, but 1e400 parses to one.
    if (!std::isfinite(x)) fail("{}: field '{}' must be a finite number, got {}", where, key, describe_json(j[key]));
    return x;
  }
  // A count or size: an integer in [lo, hi], the bounds spill supports (far above real models),
  // so that a corrupt or hostile file cannot make spill allocate by it.
  int64_t count(const char* key, int64_t lo, int64_t hi) const { return in_range(integer(key), key, lo, hi); }
  int64_t count(const char* key, int64_t lo, int64_t hi, int64_t fallback) const {
    return has(key) ? in_range(integer_of(j[key], key), key, lo, hi) : fallback;
  }
  int64_t in_range(int64_t v, const char* key, int64_t lo, int64_t hi) const {
    if (v < lo || v > hi)
      fail("{}: field '{}' is {}, outside the range spill accepts ({}..{}); is the file corrupt?", where, key, v, lo,
           hi);
    return v;
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_boolean()) fail("{}: field '{}' must be true or false, got {}", where, key, describe_json(j[key]));
    return j[key].get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_string()) fail("{}: field '{}' must be a string, got {}", where, key, describe_json(j[key]));
    return j[key].get<std::string>();
  }
  int64_t integer_of(const json& v, const char* key) const {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      fail("{}: field '{}' is {}, too large for a 64-bit integer", where, key, describe_json(v));
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      // Range first: converting 1e38 to int64_t would be undefined behaviour.
      const double d = v.get<double>();
      if (std::isfinite(d) && std::abs(d) < 9.0e18 && d == std::trunc(d)) return int64_t(d);
    }
    fail("{}: field '{}' must be an integer, got {}", where, key, describe_json(v));
  }
  // A token id: a 32-bit non-negative integer (ids index the vocabulary).
  int32_t token_id_of(const json& v, const char* key) const {
    return int32_t(in_range(integer_of(v, key), key, 0, INT32_MAX));
  }
  std::vector<int32_t> int_or_list(const char* key) const {
    std::vector<int32_t> out;
    if (!has(key)) return out;
    const json& v = j[key];
    if (v.is_array()) {
      if (v.size() > kMaxTokenIds) fail("{}: field '{}' lists {} ids, more than {}", where, key, v.size(), kMaxTokenIds);
      for (const json& e : v) out.push_back(token_id_of(e, key));
    } else {
      out.push_back(token_id_of(v, key));
    }
    return out;
  }
};

MlaSpec parse_mla(const Fields& f, const std::string& where) {
  MlaSpec m;
  m.q_lora_rank = f.count("q_lora_rank", 0, kMaxWidth, 0);  // null: no q compression
  m.kv_lora_rank = f.count("kv_lora_rank", 1, kMaxWidth);
  m.qk_nope_head_dim = f.count("qk_nope_head_dim", 0, kMaxWidth);
  m.qk_rope_head_dim = f.count("qk_rope_head_dim", 2, kMaxWidth);
  m.v_head_dim = f.count("v_head_dim", 1, kMaxWidth);
  if (m.qk_rope_head_dim % 2 != 0) fail("{}: qk_rope_head_dim ({}) must be even", where, m.qk_rope_head_dim);
  return m;
}

// gpt-oss: every layer MoE, top-k over the router logits then softmax over the k, the clamped
// SwiGLU with biases, attention sinks and biases, sliding and full layers.
void parse_gpt_oss(const json& config, const Fields& f, const std::string& where, ModelSpec& s) {
  s.n_experts = f.count("num_local_experts", 1, kMaxExperts);
  s.n_experts_per_token = f.has("num_experts_per_tok") ? f.integer("num_experts_per_tok") : f.integer("experts_per_token");
  s.moe_intermediate_size = s.intermediate_size;
  s.layer_is_moe.assign(size_t(s.n_layers), true);
  s.router.kind = RouterKind::TopKSoftmax;
  s.router_bias = true;
  s.expert_bias = true;
  s.expert_activation = MlpActivation::ClampedSwiGLU;
  s.swiglu_alpha = 1.702;  // fixed in gpt-oss (not in its config)
  s.swiglu_limit = f.number("swiglu_limit", 7.0);
  if (!(s.swiglu_limit > 0)) fail("{}: swiglu_limit must be positive, got {}", where, s.swiglu_limit);
  s.attention_sinks = true;
  s.attention_bias = f.boolean("attention_bias", true);
  s.attention_out_bias = s.attention_bias;
  s.sliding_window = f.count("sliding_window", 0, kMaxPositions, 0);
  s.layer_is_sliding.assign(size_t(s.n_layers), false);
  if (f.has("layer_types")) {
    const json& types = config["layer_types"];
    if (!types.is_array() || int64_t(types.size()) != s.n_layers)
      fail("{}: field 'layer_types' must list one type per layer ({} layers)", where, s.n_layers);
    for (size_t i = 0; i < types.size(); ++i) {
      const std::string t = types[i].is_string() ? types[i].get<std::string>() : "";
      if (t == "sliding_attention") s.layer_is_sliding[i] = true;
      else if (t != "full_attention")
        fail("{}: layer_types[{}] is {}; expected \"sliding_attention\" or \"full_attention\"", where, i,
             describe_json(types[i]));
    }
  } else {
    for (int64_t i = 0; i < s.n_layers; ++i) s.layer_is_sliding[size_t(i)] = i % 2 == 0;  // transformers' default
  }
  if (f.has("quantization_config")) {
    const json& q = config["quantization_config"];
    const std::string method = q.is_object() && q.contains("quant_method") && q["quant_method"].is_string()
                                   ? q["quant_method"].get<std::string>() : "";
    if (method != "mxfp4")
      fail("{}: quantization_config.quant_method {} is not supported for gpt_oss (spill reads mxfp4 experts)", where,
           method.empty() ? std::string("(missing)") : "'" + method + "'");
  }
}

// DeepSeek-V3 / Kimi-K2 / GLM-4.x MoE: routed experts from layer first_k_dense_replace on, shared
// experts beside them, the sigmoid router with group-limited choice and a correction bias.
void parse_sigmoid_moe(const Fields& f, const std::string& where, ModelSpec& s) {
  s.n_experts = f.count("n_routed_experts", 1, kMaxExperts);
  s.n_experts_per_token = f.integer("num_experts_per_tok");
  s.moe_intermediate_size = f.count("moe_intermediate_size", 1, kMaxWidth);
  s.n_shared_experts = f.count("n_shared_experts", 0, kMaxExperts, 0);
  s.norm_topk_prob = f.boolean("norm_topk_prob", false);
  const std::string topk_method = f.string("topk_method", "noaux_tc");
  if (topk_method != "noaux_tc")
    fail("{}: topk_method '{}' is not supported (spill routes DeepSeek-V3 / GLM models with 'noaux_tc')", where,
         topk_method);
  const std::string scoring = f.string("scoring_func", "sigmoid");
  if (scoring != "sigmoid") fail("{}: scoring_func '{}' is not supported (expected 'sigmoid')", where, scoring);
  s.router.kind = RouterKind::SigmoidGrouped;
  s.router.correction_bias = true;
  s.router.n_group = f.count("n_group", 1, kMaxExperts, 1);
  s.router.topk_group = f.count("topk_group", 1, kMaxExperts, 1);
  s.router.routed_scaling_factor = f.number("routed_scaling_factor", 1.0);
  if (s.n_experts % s.router.n_group != 0)
    fail("{}: n_routed_experts ({}) must be a multiple of n_group ({})", where, s.n_experts, s.router.n_group);
  if (s.router.topk_group > s.router.n_group)
    fail("{}: topk_group ({}) must not exceed n_group ({})", where, s.router.topk_group, s.router.n_group);
  if (s.router.n_group > 1 && s.n_experts / s.router.n_group < 2)
    fail("{}: groups of {} expert(s): a group's score is the sum of its two best, so each needs two", where,
         s.n_experts / s.router.n_group);
  if (s.n_experts_per_token > s.router.topk_group * (s.n_experts / s.router.n_group))
    fail("{}: num_experts_per_tok ({}) exceeds the experts of the {} chosen group(s)", where, s.n_experts_per_token,
         s.router.topk_group);
  if (f.integer("moe_layer_freq", 1) != 1) fail("{}: moe_layer_freq != 1 is not supported", where);
  const int64_t first_dense = f.count("first_k_dense_replace", 0, kMaxLayers, 0);
  for (int64_t i = 0; i < s.n_layers; ++i) s.layer_is_moe[size_t(i)] = i >= first_dense;
}

RopeSpec parse_rope(const json& config, const Fields& f, const std::string& where) {
  RopeSpec rope;
  // Classic Hub configs: rope_theta + rope_scaling. transformers 5 writes rope_parameters instead
  // (with rope_theta inside it); accept both.
  const json* params = nullptr;
  if (f.has("rope_scaling")) params = &config["rope_scaling"];
  if (f.has("rope_parameters")) params = &config["rope_parameters"];
  rope.theta = f.number("rope_theta", 10000.0);
  if (!params) return rope;
  if (!params->is_object()) fail("{}: 'rope_scaling' must be an object or null", where);
  Fields p{*params, where};
  rope.theta = p.number("rope_theta", rope.theta);
  std::string type = p.string("rope_type", p.string("type", "default"));
  if (type == "default") return rope;
  rope.factor = p.number("factor", 1.0);
  if (rope.factor <= 0) fail("{}: rope_scaling.factor must be positive", where);
  if (type == "linear") {
    rope.kind = RopeKind::Linear;
  } else if (type == "llama3") {
    rope.kind = RopeKind::Llama3;
    rope.low_freq_factor = p.number("low_freq_factor", 1.0);
    rope.high_freq_factor = p.number("high_freq_factor", 4.0);
    rope.original_max_position = p.integer("original_max_position_embeddings");
    if (rope.high_freq_factor <= rope.low_freq_factor)
      fail("{}: rope_scaling.high_freq_factor must exceed low_freq_factor", where);
  } else if (type == "yarn") {
    rope.kind = RopeKind::Yarn;
    rope.beta_fast = p.number("beta_fast", 32.0);
    rope.beta_slow = p.number("beta_slow", 1.0);
    rope.truncate = p.boolean("truncate", true);
    const int64_t max_pos = f.integer("max_position_embeddings");
    rope.original_max_position = p.integer("original_max_position_embeddings", max_pos);
    if (rope.original_max_position <= 0) fail("{}: rope_scaling.original_max_position_embeddings must be positive", where);
    // As transformers 5 does: without an explicit factor, the ratio of the configured context to
    // the original one is the scaling factor (DeepSeek-V3 style configs).
    rope.factor = p.has("factor") ? p.number("factor", 1.0) : double(max_pos) / double(rope.original_max_position);
    auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    if (p.has("attention_factor")) {
      rope.attention_factor = p.number("attention_factor", 1.0);
    } else if (p.number("mscale", 0.0) != 0.0 && p.number("mscale_all_dim", 0.0) != 0.0) {
      rope.attention_factor =
          get_mscale(rope.factor, p.number("mscale", 1.0)) / get_mscale(rope.factor, p.number("mscale_all_dim", 1.0));
    } else {
      rope.attention_factor = get_mscale(rope.factor, 1.0);
    }
  } else {
    fail("{}: rope_scaling type '{}' is not supported (supported: default, linear, llama3, yarn)", where, type);
  }
  return rope;
}

}  // namespace

ModelSpec parse_model_spec(const std::string& text, const std::string& where) {
  const json config = parse_json<json>(text, where);
  if (!config.is_object()) fail("{}: must be a JSON object", where);
  Fields f{config, where};
  ModelSpec s;
  s.model_type = f.string("model_type", "");
  if (s.model_type == "llama" || s.model_type == "mistral") s.arch = Arch::Llama;
  else if (s.model_type == "qwen3") s.arch = Arch::Qwen3;
  else if (s.model_type == "qwen3_moe") s.arch = Arch::Qwen3Moe;
  else if (s.model_type == "mixtral") s.arch = Arch::Mixtral;
  else if (s.model_type == "olmoe") s.arch = Arch::Olmoe;
  else if (s.model_type == "gpt_oss") s.arch = Arch::GptOss;
  else if (s.model_type == "deepseek_v3" || s.model_type == "kimi_k2") s.arch = Arch::DeepseekV3;
  else if (s.model_type == "glm4_moe") s.arch = Arch::Glm4Moe;
  else if (s.model_type.empty()) fail("{}: missing field 'model_type'", where);
  else fail("{}: model_type '{}' is not supported (supported: llama, mistral, qwen3, qwen3_moe, mixtral, olmoe, "
            "gpt_oss, deepseek_v3, kimi_k2, glm4_moe)", where, s.model_type);

  s.vocab_size = f.integer("vocab_size");
  s.hidden_size = f.integer("hidden_size");
  s.n_layers = f.integer("num_hidden_layers");
  s.n_heads = f.integer("num_attention_heads");
  s.n_kv_heads = f.integer("num_key_value_heads", s.n_heads);
  if (s.vocab_size <= 0 || s.hidden_size <= 0 || s.n_layers <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0)
    fail("{}: vocab_size, hidden_size, num_hidden_layers, num_attention_heads and num_key_value_heads must be positive", where);
  f.in_range(s.vocab_size, "vocab_size", 1, kMaxVocab);
  f.in_range(s.hidden_size, "hidden_size", 1, kMaxWidth);
  f.in_range(s.n_layers, "num_hidden_layers", 1, kMaxLayers);
  f.in_range(s.n_heads, "num_attention_heads", 1, kMaxHeads);
  f.in_range(s.n_kv_heads, "num_key_value_heads", 1, kMaxHeads);
  if (s.n_heads % s.n_kv_heads != 0)
    fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", where, s.n_heads, s.n_kv_heads);
  if (s.arch == Arch::DeepseekV3) {
    s.attention = AttentionKind::Mla;
    s.mla = parse_mla(f, where);
    // head_dim in a DeepSeek config is the rope part; q and k heads are nope + rope wide.
    s.head_dim = s.mla.qk_head_dim();
  } else {
    s.head_dim = f.count("head_dim", 0, kMaxWidth, s.hidden_size / s.n_heads);
  }
  if (s.head_dim <= 0 || s.head_dim % 2 != 0) fail("{}: head_dim ({}) must be positive and even", where, s.head_dim);
  s.intermediate_size = f.count("intermediate_size", 0, kMaxWidth, 0);
  s.max_position_embeddings = f.count("max_position_embeddings", 1, kMaxPositions, 4096);
  s.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  s.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  s.attention_bias = f.boolean("attention_bias", false);
  s.clip_qkv = f.number("clip_qkv", 0.0);
  if (f.boolean("mlp_bias", false)) fail("{}: mlp_bias = true is not supported", where);
  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu") fail("{}: hidden_act '{}' is not supported (spill runs SwiGLU MLPs: 'silu')", where, act);
  s.rope = parse_rope(config, f, where);
  if (s.attention == AttentionKind::Gqa) {
    // GLM-4.x rotates the first half of each head (partial_rotary_factor 0.5), as transformers
    // does: int(head_dim * factor) dims.
    const double partial = f.number("partial_rotary_factor", s.arch == Arch::Glm4Moe ? 0.5 : 1.0);
    if (!(partial > 0 && partial <= 1)) fail("{}: partial_rotary_factor must be in (0, 1], got {}", where, partial);
    s.rotary_dim = int64_t(double(s.head_dim) * partial);
    if (s.rotary_dim <= 0 || s.rotary_dim % 2 != 0)
      fail("{}: head_dim {} x partial_rotary_factor {} = {} rotary dims; they must be positive and even", where,
           s.head_dim, partial, s.rotary_dim);
  }

  s.layer_is_moe.assign(size_t(s.n_layers), false);
  // Hub configs say num_experts (Qwen, OLMoE) or num_local_experts (Mixtral); transformers 5 may
  // write either name for any of them.
  auto expert_count = [&] {
    return f.has("num_experts") ? f.count("num_experts", 0, kMaxExperts)
                                : f.count("num_local_experts", 0, kMaxExperts);
  };
  switch (s.arch) {
    case Arch::Llama:
      break;
    case Arch::Qwen3:
      s.qk_norm = QkNorm::PerHead;
      break;
    case Arch::Qwen3Moe: {
      s.qk_norm = QkNorm::PerHead;
      s.n_experts = expert_count();
      s.n_experts_per_token = f.integer("num_experts_per_tok");
      s.moe_intermediate_size = f.count("moe_intermediate_size", 0, kMaxWidth);
      // Not a Qwen3 field (its checkpoints have no shared expert): DeepSeek's always-on experts, which
      // benchmark shapes add to a qwen3_moe config (../shared/shapes/seed.json) to carry their bytes.
      s.n_shared_experts = f.count("n_shared_experts", 0, kMaxExperts, 0);
      s.norm_topk_prob = f.boolean("norm_topk_prob", false);
      const int64_t step = f.integer("decoder_sparse_step", 1);
      std::vector<int64_t> dense_layers;
      if (f.has("mlp_only_layers")) {
        if (!config["mlp_only_layers"].is_array()) fail("{}: field 'mlp_only_layers' must be a list of layer indices", where);
        for (const json& v : config["mlp_only_layers"]) dense_layers.push_back(f.integer_of(v, "mlp_only_layers"));
      }
      for (int64_t i = 0; i < s.n_layers; ++i) {
        bool dense = std::find(dense_layers.begin(), dense_layers.end(), i) != dense_layers.end();
        s.layer_is_moe[size_t(i)] = !dense && s.n_experts > 0 && step > 0 && (i + 1) % step == 0;
      }
      break;
    }
    case Arch::Mixtral:
      s.n_experts = expert_count();
      s.n_experts_per_token = f.integer("num_experts_per_tok");
      s.moe_intermediate_size = s.intermediate_size;
      s.norm_topk_prob = true;
      s.layer_is_moe.assign(size_t(s.n_layers), true);
      if (f.has("sliding_window") && f.integer("sliding_window") < s.max_position_embeddings)
        fail("{}: sliding_window attention is not supported yet (sliding_window = {})", where, f.integer("sliding_window"));
      break;
    case Arch::Olmoe:
      s.qk_norm = QkNorm::WholeProjection;
      s.n_experts = expert_count();
      s.n_experts_per_token = f.integer("num_experts_per_tok");
      s.moe_intermediate_size = s.intermediate_size;
      s.norm_topk_prob = f.boolean("norm_topk_prob", false);
      s.layer_is_moe.assign(size_t(s.n_layers), true);
      break;
    case Arch::GptOss:
      parse_gpt_oss(config, f, where, s);
      break;
    case Arch::DeepseekV3:
    case Arch::Glm4Moe:
      parse_sigmoid_moe(f, where, s);
      if (s.arch == Arch::DeepseekV3) {
        // DeepSeek's YaRN also sharpens the softmax: scale = qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2.
        s.rope_interleaved = f.boolean("rope_interleave", true);
        s.attention_scale = 1.0 / std::sqrt(double(s.mla.qk_head_dim()));
        if (s.rope.kind == RopeKind::Yarn) {
          const json* params = f.has("rope_parameters") ? &config["rope_parameters"] : &config["rope_scaling"];
          const double all_dim = Fields{*params, where}.number("mscale_all_dim", 0.0);
          if (all_dim != 0.0 && s.rope.factor > 1) {
            const double m = 0.1 * all_dim * std::log(s.rope.factor) + 1.0;
            s.attention_scale *= m * m;
          }
        }
      } else {
        s.qk_norm = f.boolean("use_qk_norm", false) ? QkNorm::PerHead : QkNorm::None;
      }
      break;
  }
  if (s.arch == Arch::Qwen3 || s.arch == Arch::Qwen3Moe) {
    if (f.boolean("use_sliding_window", false)) fail("{}: use_sliding_window = true is not supported yet", where);
  }
  if (s.n_experts > 0) {
    if (s.n_experts_per_token <= 0 || s.n_experts_per_token > s.n_experts)
      fail("{}: num_experts_per_tok ({}) must be between 1 and the number of experts ({})", where,
           s.n_experts_per_token, s.n_experts);
    if (s.moe_intermediate_size <= 0) fail("{}: the expert intermediate size must be positive", where);
  }
  bool any_dense = false;
  for (bool moe : s.layer_is_moe) any_dense |= !moe;
  if (any_dense && s.intermediate_size <= 0) fail("{}: missing field 'intermediate_size' (needed by dense layers)", where);
  s.eos_token_ids = f.int_or_list("eos_token_id");
  s.bos_token_id = f.has("bos_token_id") ? f.token_id_of(config["bos_token_id"], "bos_token_id") : -1;
  return s;
}

static std::string read_file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ModelSpec load_model_spec(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) fail("{}: no config.json (is this a Hugging Face model folder?)", dir);
  ModelSpec spec = parse_model_spec(read_file_text(config_path), config_path);
  // generation_config.json often lists more end-of-turn ids than config.json (e.g. <|im_end|>).
  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen_path)) {
    const json gen = parse_json<json>(read_file_text(gen_path), gen_path);
    if (gen.is_object()) {
      Fields g{gen, gen_path};
      for (int32_t id : g.int_or_list("eos_token_id"))
        if (std::find(spec.eos_token_ids.begin(), spec.eos_token_ids.end(), id) == spec.eos_token_ids.end())
          spec.eos_token_ids.push_back(id);
    }
  }
  return spec;
}

}  // namespace spill
