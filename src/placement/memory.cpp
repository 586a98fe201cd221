#include "placement/memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json_limits.h"

namespace spill::placement {

namespace {

int64_t optional_int(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return 0;
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < 0)
    fail("{}: \"{}\" must be a non-negative integer, got {}", where, key, j[key].dump());
  return j[key].get<int64_t>();
}

}  // namespace

ModelShape parse_model_shape(const std::string& config_json_text, const std::string& where) {
  ModelShape shape;
  shape.spec = parse_model_spec(config_json_text, where);
  shape.source = where;
  const nlohmann::json j = parse_json<nlohmann::json>(config_json_text, where);
  shape.shared.count = optional_int(j, "n_shared_experts", where);
  if (shape.shared.count > 0) {
    shape.shared.intermediate_size = optional_int(j, "shared_expert_intermediate_size", where);
    if (shape.shared.intermediate_size == 0) shape.shared.intermediate_size = shape.spec.moe_intermediate_size;
    if (shape.shared.intermediate_size == 0)
      fail("{}: n_shared_experts is {} but neither shared_expert_intermediate_size nor moe_intermediate_size gives "
           "their width",
           where, shape.shared.count);
  }
  return shape;
}

ModelShape load_model_shape(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path);
  std::ifstream in(p);
  if (!in) fail("{}: cannot read the model config (give a model folder or a config.json file)", p.string());
  std::stringstream text;
  text << in.rdbuf();
  return parse_model_shape(text.str(), p.string());
}

int64_t ClassBytes::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

ClassBytes& ClassBytes::operator+=(const ClassBytes& o) {
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] += o.bytes[i];
  return *this;
}

int64_t matrix_bytes(DType type, int64_t rows, int64_t cols) { return rows * row_bytes(storage_type(type, cols), cols); }

ModelBytes account_weights(const ModelShape& shape, const TensorClassTypes& types) {
  const ModelSpec& s = shape.spec;
  const std::string& where = shape.source;
  if (s.hidden_size <= 0 || s.n_layers <= 0 || s.vocab_size <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 ||
      s.head_dim <= 0)
    fail("{}: hidden size, layers, vocabulary, heads and head_dim must all be positive to count bytes", where);
  if (int64_t(s.layer_is_moe.size()) != s.n_layers)
    fail("{}: layer_is_moe has {} entries for {} layers", where, s.layer_is_moe.size(), s.n_layers);
  if (s.n_moe_layers() > 0 && (s.n_experts <= 0 || s.moe_intermediate_size <= 0))
    fail("{}: MoE layers need num_experts and moe_intermediate_size", where);

  ModelBytes mb;
  const int64_t H = s.hidden_size, Q = s.q_dim(), KV = s.kv_dim();
  auto note_fallback = [&](TensorClass c, int64_t cols, const char* what) {
    const DType wanted = types[c], got = storage_type(wanted, cols);
    if (wanted == got) return;
    const std::string n = fmt::format("{}: rows of {} weights are not whole {} blocks of {}; stored as {}", what, cols,
                                      dtype_name(wanted), dtype_block_elems(wanted), dtype_name(got));
    if (std::find(mb.notes.begin(), mb.notes.end(), n) == mb.notes.end()) mb.notes.push_back(n);
  };

  // Token embedding and output head ([vocab, hidden] each; one matrix when tied).
  mb.tied_embedding = s.tie_word_embeddings;
  const TensorClass embed_class = mb.tied_embedding ? TensorClass::LmHead : TensorClass::Embedding;
  mb.embedding_row = matrix_bytes(types[embed_class], 1, H);
  mb.embedding = mb.tied_embedding ? 0 : matrix_bytes(types[TensorClass::Embedding], s.vocab_size, H);
  note_fallback(embed_class, H, mb.tied_embedding ? "embedding (tied to the head)" : "embedding");
  const int64_t final_norm = matrix_bytes(types[TensorClass::Norms], 1, H);
  mb.lm_head = matrix_bytes(types[TensorClass::LmHead], s.vocab_size, H);
  note_fallback(TensorClass::LmHead, H, "lm head");
  mb.total[TensorClass::Embedding] = mb.embedding;
  mb.total[TensorClass::LmHead] = mb.lm_head;
  mb.total[TensorClass::Norms] = final_norm;
  mb.lm_head += final_norm;

  // One routed expert: gate and up [width, hidden], down [hidden, width].
  if (s.n_moe_layers() > 0) {
    const DType t = types[TensorClass::RoutedExperts];
    const int64_t I = s.moe_intermediate_size;
    mb.routed_expert_bytes = 2 * matrix_bytes(t, I, H) + matrix_bytes(t, H, I);
    if (s.expert_bias) mb.routed_expert_bytes += 4 * (2 * I + H);  // gate, up and down biases (f32)
    mb.routed_expert_weights = 3 * I * H;
    note_fallback(TensorClass::RoutedExperts, H, "routed experts' gate/up");
    note_fallback(TensorClass::RoutedExperts, I, "routed experts' down");
  }

  for (int64_t l = 0; l < s.n_layers; ++l) {
    LayerBytes lb;
    ClassBytes& w = lb.weights;
    const DType at = types[TensorClass::Attention];
    const DType nt = types[TensorClass::Norms];
    w[TensorClass::Norms] = 2 * matrix_bytes(nt, 1, H);
    if (s.attention == AttentionKind::Mla) {
      // q (through q_a -> norm -> q_b, or q_proj), kv_a (latent + rope key), kv_b, o.
      const MlaSpec& m = s.mla;
      const int64_t heads = s.n_heads, qk = m.qk_head_dim();
      int64_t a = 0;
      if (m.q_lora_rank > 0) {
        a += matrix_bytes(at, m.q_lora_rank, H) + matrix_bytes(at, heads * qk, m.q_lora_rank);
        w[TensorClass::Norms] += matrix_bytes(nt, 1, m.q_lora_rank);
        note_fallback(TensorClass::Attention, m.q_lora_rank, "MLA q_b");
      } else {
        a += matrix_bytes(at, heads * qk, H);
      }
      a += matrix_bytes(at, m.kv_lora_rank + m.qk_rope_head_dim, H);
      a += matrix_bytes(at, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
      a += matrix_bytes(at, H, heads * m.v_head_dim);
      w[TensorClass::Attention] = a;
      w[TensorClass::Norms] += matrix_bytes(nt, 1, m.kv_lora_rank);
      note_fallback(TensorClass::Attention, H, "MLA q/kv_a");
      note_fallback(TensorClass::Attention, m.kv_lora_rank, "MLA kv_b");
      note_fallback(TensorClass::Attention, heads * m.v_head_dim, "attention output");
    } else {
      w[TensorClass::Attention] = matrix_bytes(at, Q, H) + 2 * matrix_bytes(at, KV, H) + matrix_bytes(at, H, Q);
      if (s.attention_bias) w[TensorClass::Attention] += 4 * (Q + 2 * KV + H);  // f32 biases
      note_fallback(TensorClass::Attention, H, "attention q/k/v");
      note_fallback(TensorClass::Attention, Q, "attention output");
    }
    if (s.attention_sinks) w[TensorClass::Attention] += 4 * s.n_heads;  // f32 sink logits
    if (s.qk_norm == QkNorm::PerHead) w[TensorClass::Norms] += 2 * matrix_bytes(nt, 1, s.head_dim);
    if (s.qk_norm == QkNorm::WholeProjection) w[TensorClass::Norms] += matrix_bytes(nt, 1, Q) + matrix_bytes(nt, 1, KV);
    if (s.layer_is_moe[size_t(l)]) {
      w[TensorClass::Router] = matrix_bytes(types[TensorClass::Router], s.n_experts, H);
      if (s.router_bias) w[TensorClass::Router] += 4 * s.n_experts;
      if (s.router.correction_bias) w[TensorClass::Router] += 4 * s.n_experts;  // f32, as checkpoints store it
      note_fallback(TensorClass::Router, H, "router");
      if (shape.shared.count > 0) {
        const DType st = types[TensorClass::SharedExperts];
        const int64_t I = shape.shared.intermediate_size;
        w[TensorClass::SharedExperts] = shape.shared.count * (2 * matrix_bytes(st, I, H) + matrix_bytes(st, H, I));
        note_fallback(TensorClass::SharedExperts, I, "shared experts' down");
      }
      lb.n_routed_experts = s.n_experts;
      lb.routed_expert_bytes = mb.routed_expert_bytes;
    } else {
      if (s.intermediate_size <= 0) fail("{}: layer {} is dense but intermediate_size is not set", where, l);
      const DType dt = types[TensorClass::DenseMlp];
      const int64_t I = s.intermediate_size;
      w[TensorClass::DenseMlp] = 2 * matrix_bytes(dt, I, H) + matrix_bytes(dt, H, I);
      note_fallback(TensorClass::DenseMlp, I, "dense MLP down");
    }
    mb.total += w;
    mb.total[TensorClass::RoutedExperts] += lb.routed_bytes();
    mb.layers.push_back(lb);
  }
  return mb;
}

int64_t workspace_bytes(const ModelShape& shape, const WorkspaceParams& params) {
  const ModelSpec& s = shape.spec;
  const int64_t T = params.max_batch_tokens, H = s.hidden_size, Q = s.q_dim(), KV = s.kv_dim();
  const int64_t rows = std::min(params.max_logit_rows, T);
  // hidden state, norm output, MLP output; q and attention output; k and v (MLA: the q latent,
  // q, the latent + rope key, the attention output); positions.
  int64_t floats = 3 * T * H + 2 * T * Q + 2 * T * KV;
  if (s.attention == AttentionKind::Mla) {
    const MlaSpec& m = s.mla;
    floats = 3 * T * H + T * (m.q_lora_rank + s.n_heads * (m.qk_head_dim() + m.v_head_dim) + m.cache_values());
  }
  int64_t bytes = 4 * T;
  // The MLP block's scratch is reused across layers: the larger of the MoE and the dense one.
  int64_t moe = 0, dense = 0;
  if (s.n_moe_layers() > 0) {
    const int64_t k = s.n_experts_per_token, I = s.moe_intermediate_size;
    // router logits; per routed token: gathered input, gate and up, output.
    moe = T * s.n_experts + T * k * (2 * H + 2 * I);
    bytes += T * k * 8;  // expert ids (int32) and weights (f32)
    if (shape.shared.count > 0) moe += 2 * T * shape.shared.count * shape.shared.intermediate_size;
  }
  if (s.n_moe_layers() < s.n_layers) dense = 2 * T * s.intermediate_size;
  floats += std::max(moe, dense);
  floats += rows * (H + s.vocab_size);  // final rows and logits
  return bytes + 4 * floats;
}

double gib(int64_t bytes) { return double(bytes) / double(int64_t(1) << 30); }

std::string format_bytes(int64_t bytes) {
  const double b = double(bytes);
  if (std::abs(b) >= double(int64_t(1) << 30)) return fmt::format("{:.2f} GiB", b / double(int64_t(1) << 30));
  if (std::abs(b) >= double(1 << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  if (std::abs(b) >= double(1 << 10)) return fmt::format("{:.1f} KiB", b / double(1 << 10));
  return fmt::format("{} B", bytes);
}

// "95.6G", "80GiB", "512M", "1073741824": binary units (G = 2^30), as GPU memory is quoted.
std::vector<int64_t> parse_byte_sizes(const std::string& text, const char* flag) {
  std::vector<int64_t> sizes;
  for (size_t start = 0; start <= text.size();) {
    const size_t comma = text.find(',', start);
    sizes.push_back(parse_byte_size(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start), flag));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return sizes;
}

int64_t parse_byte_size(const std::string& text, const char* flag) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    fail("{}: \"{}\" is not a size; write bytes or a number with K, M, G or T (binary: 95.6G = 95.6 GiB)", flag, text);
  }
  std::string unit = text.substr(end);
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (unit.ends_with("IB")) unit.erase(unit.size() - 2);
  else if (unit.size() > 1 && unit.ends_with("B")) unit.pop_back();
  double scale = 1;
  if (unit == "K") scale = 1024.0;
  else if (unit == "M") scale = 1024.0 * 1024;
  else if (unit == "G") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") fail("{}: unknown unit in \"{}\"; use K, M, G or T", flag, text);
  if (!(value >= 0)) fail("{}: must not be negative, got \"{}\"", flag, text);
  if (!(value * scale < 0x1p62)) fail("{}: \"{}\" is too large", flag, text);
  return int64_t(value * scale + 0.5);
}

// "30%" or "0.3": a share in [0, 1].
double parse_share(const std::string& text, const char* flag) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    fail("{}: \"{}\" is not a share; write 30% or 0.3", flag, text);
  }
  const std::string rest = text.substr(end);
  if (rest == "%") value /= 100.0;
  else if (!rest.empty()) fail("{}: \"{}\" is not a share; write 30% or 0.3", flag, text);
  if (value < 0 || value > 1) fail("{}: {} is not between 0% and 100%", flag, text);
  return value;
}


}  // namespace spill::placement
