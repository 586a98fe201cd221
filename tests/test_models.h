// Tiny random models written at test time: a config.json and a model.safetensors with random BF16
// weights, in the layout of a Hugging Face checkpoint, so tests run the real loader and the real
// forward on a model small enough to run in milliseconds. Header-only so any test can use it.
//
//   spill::testing::write_random_model(dir, {.vocab_size = 300, .seed = 7});
//   auto model = spill::Model::load(dir);
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace spill::testing {

// Threads of the CPU runner in tests that run these models: two, the CI machine's cores.
inline constexpr int kTestThreads = 2;

// The bundled trained model, models/spill-tiny of the checkout the tests were built from.
inline std::string spill_tiny_dir() { return std::string(SPILL_SOURCE_DIR) + "/models/spill-tiny"; }

struct RandomModelParams {
  // qwen3_moe when n_experts > 0, else qwen3 (dense).
  int64_t vocab_size = 256;
  int64_t hidden_size = 64;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 2;
  int64_t head_dim = 16;
  int64_t n_experts = 8;
  int64_t n_experts_per_token = 2;
  int64_t moe_intermediate_size = 32;
  int64_t intermediate_size = 96;          // dense layers' MLP width
  std::vector<int64_t> dense_layers = {};  // qwen3_moe mlp_only_layers
  bool norm_topk_prob = true;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 4096;
  double rope_theta = 10000.0;
  std::vector<int32_t> eos_token_ids = {};  // empty: no EOS, generation runs to max_tokens
  uint64_t seed = 1;
  // Standard deviation of the output projection relative to 1/sqrt(hidden): larger spreads the
  // logits, so greedy picks are far from ties.
  double lm_head_gain = 4.0;
};

// Writes a safetensors file from named BF16 tensors (insertion order is kept in the data).
inline void write_safetensors_bf16(const std::string& path,
                                   const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                                   const std::vector<std::vector<uint16_t>>& data) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const uint64_t bytes = data[i].size() * 2;
    header[shapes[i].first] = {
        {"dtype", "BF16"}, {"shape", shapes[i].second}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // data starts 8-byte aligned, as HF writes it
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot write", path);
  const uint64_t n = text.size();
  uint8_t le[8];
  for (int b = 0; b < 8; ++b) le[b] = uint8_t(n >> (8 * b));
  out.write(reinterpret_cast<const char*>(le), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& d : data) {
    std::vector<uint8_t> bytes(d.size() * 2);
    for (size_t j = 0; j < d.size(); ++j) {
      bytes[2 * j] = uint8_t(d[j] & 0xff);
      bytes[2 * j + 1] = uint8_t(d[j] >> 8);
    }
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  if (!out) fail("{}: write failed", path);
}

// Creates dir (if needed) and writes config.json and model.safetensors. Same params, same files.
inline void write_random_model(const std::string& dir, const RandomModelParams& p) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const bool moe = p.n_experts > 0;
  nlohmann::json config = {
      {"architectures", {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"}},
      {"model_type", moe ? "qwen3_moe" : "qwen3"},
      {"vocab_size", p.vocab_size},
      {"hidden_size", p.hidden_size},
      {"num_hidden_layers", p.n_layers},
      {"num_attention_heads", p.n_heads},
      {"num_key_value_heads", p.n_kv_heads},
      {"head_dim", p.head_dim},
      {"intermediate_size", p.intermediate_size},
      {"max_position_embeddings", p.max_position_embeddings},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", p.rope_theta},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", p.tie_word_embeddings},
      {"attention_bias", false},
      {"torch_dtype", "bfloat16"},
  };
  if (moe) {
    config["num_experts"] = p.n_experts;
    config["num_experts_per_tok"] = p.n_experts_per_token;
    config["moe_intermediate_size"] = p.moe_intermediate_size;
    config["norm_topk_prob"] = p.norm_topk_prob;
    config["decoder_sparse_step"] = 1;
    config["mlp_only_layers"] = p.dense_layers;
  }
  if (!p.eos_token_ids.empty()) config["eos_token_id"] = p.eos_token_ids;
  {
    std::ofstream out(fs::path(dir) / "config.json");
    out << config.dump(2);
  }

  std::mt19937_64 rng(p.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  std::vector<std::vector<uint16_t>> data;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean, float stddev) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint16_t> values(static_cast<size_t>(n));
    for (uint16_t& v : values) v = f32_to_bf16(mean + stddev * normal(rng));
    shapes.emplace_back(name, std::move(shape));
    data.push_back(std::move(values));
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    add(name, {out, in}, 0.0f, float(1.0 / std::sqrt(double(in))));
  };
  const int64_t H = p.hidden_size, Q = p.n_heads * p.head_dim, KV = p.n_kv_heads * p.head_dim;
  add("model.embed_tokens.weight", {p.vocab_size, H}, 0.0f, 1.0f);
  for (int64_t l = 0; l < p.n_layers; ++l) {
    const std::string x = "model.layers." + std::to_string(l) + ".";
    add(x + "input_layernorm.weight", {H}, 1.0f, 0.1f);
    add(x + "post_attention_layernorm.weight", {H}, 1.0f, 0.1f);
    linear(x + "self_attn.q_proj.weight", Q, H);
    linear(x + "self_attn.k_proj.weight", KV, H);
    linear(x + "self_attn.v_proj.weight", KV, H);
    linear(x + "self_attn.o_proj.weight", H, Q);
    add(x + "self_attn.q_norm.weight", {p.head_dim}, 1.0f, 0.1f);
    add(x + "self_attn.k_norm.weight", {p.head_dim}, 1.0f, 0.1f);
    const bool dense = !moe || std::find(p.dense_layers.begin(), p.dense_layers.end(), l) != p.dense_layers.end();
    if (dense) {
      linear(x + "mlp.gate_proj.weight", p.intermediate_size, H);
      linear(x + "mlp.up_proj.weight", p.intermediate_size, H);
      linear(x + "mlp.down_proj.weight", H, p.intermediate_size);
    } else {
      linear(x + "mlp.gate.weight", p.n_experts, H);
      for (int64_t e = 0; e < p.n_experts; ++e) {
        const std::string ex = x + "mlp.experts." + std::to_string(e) + ".";
        linear(ex + "gate_proj.weight", p.moe_intermediate_size, H);
        linear(ex + "up_proj.weight", p.moe_intermediate_size, H);
        linear(ex + "down_proj.weight", H, p.moe_intermediate_size);
      }
    }
  }
  add("model.norm.weight", {H}, 1.0f, 0.1f);
  if (!p.tie_word_embeddings)
    add("lm_head.weight", {p.vocab_size, H}, 0.0f, float(p.lm_head_gain / std::sqrt(double(H))));
  write_safetensors_bf16((fs::path(dir) / "model.safetensors").string(), shapes, data);
}

// A fresh directory under the system temp folder, removed when the object goes out of scope.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "spill-test") {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path() const { return path_.string(); }
  std::string sub(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace spill::testing
