// The one role resolver: asks a WeightSource for every weight role the spec implies and checks each
// shape against the configuration. Tensor names belong to the sources (safetensors_source.cpp, ...).
#include "model/model.h"

#include <cstring>

#include "core/error.h"
#include "formats/gguf.h"

namespace spill {

class WeightResolver {
 public:
  WeightResolver(Model& model) : m_(model), spec_(model.spec_), src_(*model.source_) {}

  void resolve() {
    m_.embed = tensor({WeightRole::Embed}, {spec_.vocab_size, spec_.hidden_size});
    m_.final_norm = tensor({WeightRole::FinalNorm}, {spec_.hidden_size});
    const bool has_head = src_.find({WeightRole::LmHead}) != nullptr;
    if (spec_.tie_word_embeddings || !has_head) {
      if (!spec_.tie_word_embeddings)
        fail("{} is missing, and the model's configuration says the LM head is not tied to the embedding",
             src_.describe({WeightRole::LmHead}));
      m_.lm_head = m_.embed;
    } else {
      m_.lm_head = tensor({WeightRole::LmHead}, {spec_.vocab_size, spec_.hidden_size});
    }
    m_.layers.resize(static_cast<size_t>(spec_.n_layers));
    for (int64_t l = 0; l < spec_.n_layers; ++l) resolve_layer(int32_t(l), m_.layers[size_t(l)]);
  }

 private:
  Model& m_;
  const ModelSpec& spec_;
  const WeightSource& src_;

  TensorView tensor(const WeightKey& key, std::initializer_list<int64_t> shape) {
    const TensorView* t = src_.find(key);
    if (!t)
      fail("{}: missing (the {} of layer {}; the checkpoint is incomplete or not of the architecture its "
           "configuration names)", src_.describe(key), weight_role_name(key.role), key.layer);
    check_shape(key, *t, shape);
    return *t;
  }
  TensorView optional_tensor(const WeightKey& key, std::initializer_list<int64_t> shape) {
    const TensorView* t = src_.find(key);
    if (!t) return {};
    check_shape(key, *t, shape);
    return *t;
  }
  void check_shape(const WeightKey& key, const TensorView& t, std::initializer_list<int64_t> shape) {
    bool ok = t.ndim == int(shape.size());
    int d = 0;
    for (int64_t s : shape) ok = ok && t.shape[d++] == s;
    if (!ok) {
      std::string want = "[";
      d = 0;
      for (int64_t s : shape) want += (d++ ? ", " : "") + std::to_string(s);
      fail("{} has shape {} but the model's configuration (config.json or GGUF metadata) implies {}", src_.describe(key),
           shape_str(t), want + "]");
    }
    if (!row_fits(t.dtype, t.cols()))
      fail("{}: rows of {} weights are not whole {} blocks of {}", src_.describe(key), t.cols(),
           dtype_name(t.dtype), dtype_block_elems(t.dtype));
  }

  void resolve_layer(int32_t l, LayerWeights& w) {
    const int64_t H = spec_.hidden_size;
    auto key = [l](WeightRole r) { return WeightKey{r, l}; };
    w.attn_norm = tensor(key(WeightRole::AttnNorm), {H});
    w.mlp_norm = tensor(key(WeightRole::MlpNorm), {H});
    if (spec_.attention == AttentionKind::Mla)
      resolve_mla(l, w.mla);
    else
      resolve_gqa(l, w);
    if (spec_.attention_sinks) w.sinks = tensor(key(WeightRole::Sinks), {spec_.n_heads});
    if (!spec_.layer_is_moe[size_t(l)]) {
      const int64_t I = spec_.intermediate_size;
      w.dense.gate = tensor(key(WeightRole::DenseGate), {I, H});
      w.dense.up = tensor(key(WeightRole::DenseUp), {I, H});
      w.dense.down = tensor(key(WeightRole::DenseDown), {H, I});
      return;
    }
    resolve_experts(l, w);
    if (spec_.n_shared_experts > 0) {
      const int64_t S = spec_.shared_intermediate_size();
      w.shared.gate = tensor(key(WeightRole::SharedGate), {S, H});
      w.shared.up = tensor(key(WeightRole::SharedUp), {S, H});
      w.shared.down = tensor(key(WeightRole::SharedDown), {H, S});
    }
  }

  void resolve_gqa(int32_t l, LayerWeights& w) {
    const int64_t H = spec_.hidden_size, Q = spec_.q_dim(), KV = spec_.kv_dim();
    auto key = [l](WeightRole r) { return WeightKey{r, l}; };
    w.q = tensor(key(WeightRole::Q), {Q, H});
    w.k = tensor(key(WeightRole::K), {KV, H});
    w.v = tensor(key(WeightRole::V), {KV, H});
    w.o = tensor(key(WeightRole::O), {H, Q});
    if (spec_.attention_bias) {
      w.q_bias = tensor(key(WeightRole::QBias), {Q});
      w.k_bias = tensor(key(WeightRole::KBias), {KV});
      w.v_bias = tensor(key(WeightRole::VBias), {KV});
      w.o_bias = spec_.attention_out_bias ? tensor(key(WeightRole::OBias), {H}) : optional_tensor(key(WeightRole::OBias), {H});
    }
    switch (spec_.qk_norm) {
      case QkNorm::None: break;
      case QkNorm::PerHead:
        w.q_norm = tensor(key(WeightRole::QNorm), {spec_.head_dim});
        w.k_norm = tensor(key(WeightRole::KNorm), {spec_.head_dim});
        break;
      case QkNorm::WholeProjection:
        w.q_norm = tensor(key(WeightRole::QNorm), {Q});
        w.k_norm = tensor(key(WeightRole::KNorm), {KV});
        break;
    }
  }

  void resolve_mla(int32_t l, MlaWeights& w) {
    const MlaSpec& m = spec_.mla;
    const int64_t H = spec_.hidden_size, heads = spec_.n_heads;
    auto key = [l](WeightRole r) { return WeightKey{r, l}; };
    if (m.q_lora_rank > 0) {
      w.q_a = tensor(key(WeightRole::QA), {m.q_lora_rank, H});
      w.q_a_norm = tensor(key(WeightRole::QANorm), {m.q_lora_rank});
      w.q_b = tensor(key(WeightRole::QB), {heads * m.qk_head_dim(), m.q_lora_rank});
    } else {
      w.q = tensor(key(WeightRole::Q), {heads * m.qk_head_dim(), H});
    }
    w.kv_a = tensor(key(WeightRole::KVA), {m.kv_lora_rank + m.qk_rope_head_dim, H});
    w.kv_a_norm = tensor(key(WeightRole::KVANorm), {m.kv_lora_rank});
    w.kv_b = tensor(key(WeightRole::KVB), {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
    w.o = tensor(key(WeightRole::O), {H, heads * m.v_head_dim});
  }

  // Routed experts come one tensor per expert (the Hub's checkpoints), fused gate+up and down over
  // all experts (transformers 5, which also saves them so), or fused gate, up and down (GGUF).
  void resolve_experts(int32_t l, LayerWeights& w) {
    const int64_t E = spec_.n_experts, I = spec_.moe_intermediate_size, H = spec_.hidden_size;
    w.router = tensor({WeightRole::Router, l}, {E, H});
    w.router_bias = spec_.router_bias ? tensor({WeightRole::RouterBias, l}, {E}) : optional_tensor({WeightRole::RouterBias, l}, {E});
    if (spec_.router.correction_bias) w.router_correction_bias = tensor({WeightRole::RouterCorrectionBias, l}, {E});
    w.experts.resize(static_cast<size_t>(E));
    if (spec_.expert_bias) {
      const TensorView gate_bias = tensor({WeightRole::ExpertsGateBias, l}, {E, I});
      const TensorView up_bias = tensor({WeightRole::ExpertsUpBias, l}, {E, I});
      const TensorView down_bias = tensor({WeightRole::ExpertsDownBias, l}, {E, H});
      for (int64_t e = 0; e < E; ++e) {
        w.experts[size_t(e)].gate_bias = gate_bias.slice0(e);
        w.experts[size_t(e)].up_bias = up_bias.slice0(e);
        w.experts[size_t(e)].down_bias = down_bias.slice0(e);
      }
    }
    if (src_.find({WeightRole::ExpertsGateUp, l})) {
      TensorView gate_up = fused({WeightRole::ExpertsGateUp, l}, 2 * I, H);
      for (int64_t e = 0; e < E; ++e) {
        TensorView gu = gate_up.slice0(e);  // [2I, H]: gate rows first, then up rows
        ExpertWeights& x = w.experts[size_t(e)];
        x.gate = gu;
        x.gate.shape[0] = I;
        x.up = x.gate;
        x.up.data = gu.row_data(I);
      }
    } else if (src_.find({WeightRole::ExpertsGate, l})) {
      const TensorView gate = fused({WeightRole::ExpertsGate, l}, I, H);
      const TensorView up = fused({WeightRole::ExpertsUp, l}, I, H);
      for (int64_t e = 0; e < E; ++e) {
        w.experts[size_t(e)].gate = gate.slice0(e);
        w.experts[size_t(e)].up = up.slice0(e);
      }
    } else {
      for (int32_t e = 0; e < int32_t(E); ++e) {
        w.experts[size_t(e)].gate = tensor({WeightRole::ExpertGate, l, e}, {I, H});
        w.experts[size_t(e)].up = tensor({WeightRole::ExpertUp, l, e}, {I, H});
        w.experts[size_t(e)].down = tensor({WeightRole::ExpertDown, l, e}, {H, I});
      }
      return;
    }
    const TensorView down = fused({WeightRole::ExpertsDown, l}, H, I);
    for (int64_t e = 0; e < E; ++e) w.experts[size_t(e)].down = down.slice0(e);
  }

  // A fused [E, rows, cols] tensor (rows are outputs, as spill's matmul wants). Stored transposed,
  // [E, cols, rows], it is copied once here; when rows == cols the shape cannot tell, and the
  // [E, rows, cols] orientation of transformers 5 and GGUF is assumed.
  TensorView fused(const WeightKey& key, int64_t rows, int64_t cols) {
    const int64_t E = spec_.n_experts;
    const TensorView* found = src_.find(key);
    if (!found) fail("{}: missing (the {} of layer {})", src_.describe(key), weight_role_name(key.role), key.layer);
    TensorView t = *found;
    if (t.ndim == 3 && t.shape[0] == E && t.shape[1] == cols && t.shape[2] == rows && rows != cols)
      t = transposed_copy(key, t);
    check_shape(key, t, {E, rows, cols});
    return t;
  }

  // [E, R, C] -> [E, C, R], same dtype, owned by the model.
  TensorView transposed_copy(const WeightKey& key, const TensorView& t) {
    const int64_t E = t.shape[0], R = t.shape[1], C = t.shape[2];
    if (!dtype_is_float(t.dtype))
      fail("{}: a fused expert tensor stored transposed must be F32, BF16 or F16, not {}", src_.describe(key),
           dtype_name(t.dtype));
    const size_t es = size_t(dtype_traits(t.dtype).block_bytes);
    uint8_t* buf = m_.own_bytes(t.nbytes());
    const auto* src = static_cast<const uint8_t*>(t.data);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c)
          std::memcpy(buf + ((e * C + c) * R + r) * es, src + ((e * R + r) * C + c) * es, es);
    TensorView out = t;
    out.shape[1] = C;
    out.shape[2] = R;
    out.data = buf;
    return out;
  }
};

uint8_t* Model::own_bytes(size_t n) {
  owned_.push_back(std::make_unique<uint8_t[]>(n));
  return owned_.back().get();
}

std::unique_ptr<Model> Model::from_source(ModelSpec spec, std::unique_ptr<WeightSource> source) {
  auto model = std::make_unique<Model>();
  model->spec_ = std::move(spec);
  model->source_ = std::move(source);
  WeightResolver(*model).resolve();
  return model;
}

std::unique_ptr<Model> Model::load(const std::string& dir) {
  if (gguf::is_gguf_path(dir)) {
    std::shared_ptr<const gguf::GgufFile> file = gguf::GgufFile::open(dir);
    ModelSpec spec = gguf_model_spec(*file);
    auto source = open_gguf_source(std::move(file), spec);
    return from_source(std::move(spec), std::move(source));
  }
  ModelSpec spec = load_model_spec(dir);
  auto source = open_safetensors_source(dir, spec);
  return from_source(std::move(spec), std::move(source));
}

}  // namespace spill
