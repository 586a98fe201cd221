// Test helpers for GGUF: a raw header builder for hand-made hostile files, a Hugging Face folder
// -> GGUF conversion with spill's writer (llama.cpp's tensor names, ggml dims, the `llama` arch's
// q/k row permutation as convert_hf_to_gguf.py's LlamaModel.permute defines it), and logits.
#pragma once
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "formats/model_spec.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "model/runner.h"
#include "quant/quant.h"

namespace spill::testing {

// Raw little-endian bytes, for headers the writer would refuse to make.
struct RawGguf {
  std::vector<uint8_t> b;
  template <class T>
  RawGguf& put(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
  RawGguf& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  // magic, version, tensor count, kv count
  RawGguf& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  RawGguf& kv_u32(const std::string& key, uint32_t v) { return str(key).put<uint32_t>(4).put<uint32_t>(v); }
  RawGguf& kv_str(const std::string& key, const std::string& v) { return str(key).put<uint32_t>(8).str(v); }
  RawGguf& tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(uint32_t(ne.size()));
    for (int64_t n : ne) put<int64_t>(n);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  RawGguf& align(size_t a = 32) {
    b.resize((b.size() + a - 1) / a * a, 0);
    return *this;
  }
  RawGguf& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

// Writes `hf_dir` (config.json + safetensors) as a GGUF of architecture `gguf_arch` ("qwen3moe",
// "qwen3", "llama"), converting the way llama.cpp's converter does: routed experts stacked into
// 3-D tensors, dims reversed, and for "llama" the q/k rows of every head interleaved
// (reshape(n_head, 2, D/2, H).swapaxes(1, 2)). q/k norms are left out for "llama".
struct GgufConversion {
  uint32_t alignment = 32;
  DType matrices = DType::BF16;  // 2-D and 3-D weights are re-encoded in this type (quant::quantize_row)
  bool permute_llama = true;     // false writes `llama` q/k rows in Hugging Face order (for tests only)
};

inline void hf_to_gguf(const std::string& hf_dir, const std::string& out, const std::string& gguf_arch,
                       const GgufConversion& conv = {}) {
  const uint32_t alignment = conv.alignment;
  const ModelSpec s = load_model_spec(hf_dir);
  const WeightStore store = WeightStore::open_folder(hf_dir);
  gguf::Writer w(alignment);
  const std::string p = gguf_arch + ".";
  w.set("general.architecture", gguf::Value::string(gguf_arch));
  w.set(p + "block_count", gguf::Value::u32(uint32_t(s.n_layers)));
  w.set(p + "context_length", gguf::Value::u32(uint32_t(s.max_position_embeddings)));
  w.set(p + "embedding_length", gguf::Value::u32(uint32_t(s.hidden_size)));
  w.set(p + "feed_forward_length", gguf::Value::u32(uint32_t(s.intermediate_size)));
  w.set(p + "attention.head_count", gguf::Value::u32(uint32_t(s.n_heads)));
  w.set(p + "attention.head_count_kv", gguf::Value::u32(uint32_t(s.n_kv_heads)));
  w.set(p + "attention.key_length", gguf::Value::u32(uint32_t(s.head_dim)));
  w.set(p + "attention.value_length", gguf::Value::u32(uint32_t(s.head_dim)));
  w.set(p + "rope.freq_base", gguf::Value::f32(float(s.rope.theta)));
  w.set(p + "attention.layer_norm_rms_epsilon", gguf::Value::f32(float(s.rms_norm_eps)));
  if (s.n_experts) {
    w.set(p + "expert_count", gguf::Value::u32(uint32_t(s.n_experts)));
    w.set(p + "expert_used_count", gguf::Value::u32(uint32_t(s.n_experts_per_token)));
    w.set(p + "expert_feed_forward_length", gguf::Value::u32(uint32_t(s.moe_intermediate_size)));
  }
  static std::vector<std::vector<uint8_t>> keep;  // buffers the writer reads at write()
  keep.clear();
  auto bytes_of = [](const TensorView& t) {
    const auto* d = static_cast<const uint8_t*>(t.data);
    return std::vector<uint8_t>(d, d + t.nbytes());
  };
  auto add = [&](const std::string& name, const TensorView& t, std::vector<uint8_t> bytes) {
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
    DType dtype = t.dtype;
    if (t.ndim >= 2 && conv.matrices != t.dtype) {  // BF16 rows -> f32 -> the wanted type, row by row
      const int64_t cols = t.cols(), rows = t.rows();
      std::vector<uint8_t> q(size_t(rows * row_bytes(conv.matrices, cols)));
      std::vector<float> f(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        quant::dequantize_row(t.dtype, bytes.data() + r * t.row_bytes(), f.data(), cols);
        quant::quantize_row(conv.matrices, f.data(), q.data() + r * row_bytes(conv.matrices, cols), cols);
      }
      bytes = std::move(q);
      dtype = conv.matrices;
    }
    keep.push_back(std::move(bytes));
    w.add_tensor(name, dtype, shape, keep.back().data());
  };
  auto plain = [&](const std::string& name, const std::string& hf) {
    const TensorView& t = store.get(hf);
    add(name, t, bytes_of(t));
  };
  auto permuted = [&](const std::string& name, const std::string& hf, int64_t n_head) {
    const TensorView& t = store.get(hf);
    std::vector<uint8_t> src = bytes_of(t), dst(src.size());
    const size_t row = size_t(t.row_bytes());
    const int64_t D = t.shape[0] / n_head;
    for (int64_t h = 0; h < n_head; ++h)
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t k = 0; k < D / 2; ++k)  // converter: new[h, k, j] = old[h, j, k]
          std::memcpy(dst.data() + size_t(h * D + 2 * k + j) * row, src.data() + size_t(h * D + j * (D / 2) + k) * row, row);
    add(name, t, std::move(dst));
  };
  plain("token_embd.weight", "model.embed_tokens.weight");
  plain("output_norm.weight", "model.norm.weight");
  if (store.find("lm_head.weight")) plain("output.weight", "lm_head.weight");
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
    plain(b + "attn_norm.weight", h + "input_layernorm.weight");
    plain(b + "ffn_norm.weight", h + "post_attention_layernorm.weight");
    if (gguf_arch == "llama" && conv.permute_llama) {
      permuted(b + "attn_q.weight", h + "self_attn.q_proj.weight", s.n_heads);
      permuted(b + "attn_k.weight", h + "self_attn.k_proj.weight", s.n_kv_heads);
    } else {
      plain(b + "attn_q.weight", h + "self_attn.q_proj.weight");
      plain(b + "attn_k.weight", h + "self_attn.k_proj.weight");
      if (gguf_arch != "llama") {
        plain(b + "attn_q_norm.weight", h + "self_attn.q_norm.weight");
        plain(b + "attn_k_norm.weight", h + "self_attn.k_norm.weight");
      }
    }
    plain(b + "attn_v.weight", h + "self_attn.v_proj.weight");
    plain(b + "attn_output.weight", h + "self_attn.o_proj.weight");
    if (!s.layer_is_moe[size_t(l)]) {
      plain(b + "ffn_gate.weight", h + "mlp.gate_proj.weight");
      plain(b + "ffn_up.weight", h + "mlp.up_proj.weight");
      plain(b + "ffn_down.weight", h + "mlp.down_proj.weight");
      continue;
    }
    plain(b + "ffn_gate_inp.weight", h + "mlp.gate.weight");
    for (const char* proj : {"gate", "up", "down"}) {
      std::vector<uint8_t> stacked;
      TensorView t3;
      for (int64_t e = 0; e < s.n_experts; ++e) {
        const TensorView& t = store.get(h + "mlp.experts." + std::to_string(e) + "." + proj + "_proj.weight");
        const std::vector<uint8_t> one = bytes_of(t);
        stacked.insert(stacked.end(), one.begin(), one.end());
        t3 = t;
      }
      t3.ndim = 3;
      t3.shape = {s.n_experts, t3.shape[0], t3.shape[1], 0};
      add(b + "ffn_" + proj + "_exps.weight", t3, std::move(stacked));
    }
  }
  w.write(out);
}

// Float32 logits of every position of `ids`.
inline std::vector<float> all_logits(const Model& model, const std::vector<int32_t>& ids) {
  const int32_t block_size = 16;
  const int64_t blocks = (int64_t(ids.size()) + block_size - 1) / block_size;
  // A table per KV group (gpt-oss's sliding layers have their own).
  const HandBuiltTables tables = hand_built_tables(model.spec(), blocks);
  KvCacheConfig kv{.block_size = block_size, .n_blocks = hand_built_pool_blocks(model.spec(), blocks)};
  auto runner = make_cpu_runner(model, kv, 1);
  ForwardBatch batch;
  batch.tokens = ids;
  batch.seqs.push_back({.first_token = 0, .n_tokens = int32_t(ids.size()), .start_pos = 0, .block_table = {}, .want_logits = true});
  tables.attach(batch.seqs.back());
  batch.all_logits = true;
  std::vector<float> logits;
  runner->forward(batch, logits);
  return logits;
}

}  // namespace spill::testing
