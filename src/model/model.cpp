// Maps checkpoint tensor names to weight roles, per architecture, and checks every shape
// against config.json. This is the only place that knows Hugging Face tensor names.
#include "model/model.h"

#include <cstring>

#include "core/error.h"

namespace spill {

class WeightResolver {
 public:
  WeightResolver(Model& model) : m_(model), spec_(model.spec_), store_(model.store_) {}

  void resolve() {
    m_.embed = tensor("model.embed_tokens.weight", {spec_.vocab_size, spec_.hidden_size});
    m_.final_norm = tensor("model.norm.weight", {spec_.hidden_size});
    if (spec_.tie_word_embeddings || !store_.find("lm_head.weight")) {
      if (!spec_.tie_word_embeddings)
        fail("{}: missing tensor 'lm_head.weight' (config.json says tie_word_embeddings is false)", store_.dir());
      m_.lm_head = m_.embed;
    } else {
      m_.lm_head = tensor("lm_head.weight", {spec_.vocab_size, spec_.hidden_size});
    }
    m_.layers.resize(static_cast<size_t>(spec_.n_layers));
    for (int64_t l = 0; l < spec_.n_layers; ++l) resolve_layer(l, m_.layers[size_t(l)]);
  }

 private:
  Model& m_;
  const ModelSpec& spec_;
  const WeightStore& store_;

  TensorView tensor(const std::string& name, std::initializer_list<int64_t> shape) {
    const TensorView& t = store_.get(name);
    check_shape(name, t, shape);
    return t;
  }
  TensorView optional_tensor(const std::string& name, std::initializer_list<int64_t> shape) {
    const TensorView* t = store_.find(name);
    if (!t) return {};
    check_shape(name, *t, shape);
    return *t;
  }
  void check_shape(const std::string& name, const TensorView& t, std::initializer_list<int64_t> shape) {
    bool ok = t.ndim == int(shape.size());
    int d = 0;
    for (int64_t s : shape) ok = ok && t.shape[d++] == s;
    if (!ok) {
      std::string want = "[";
      d = 0;
      for (int64_t s : shape) want += (d++ ? ", " : "") + std::to_string(s);
      fail("{}: tensor '{}' has shape {} but config.json implies {}", store_.file_of(name), name, shape_str(t),
           want + "]");
    }
  }

  void resolve_layer(int64_t l, LayerWeights& w) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int64_t H = spec_.hidden_size, Q = spec_.q_dim(), KV = spec_.kv_dim();
    w.attn_norm = tensor(p + "input_layernorm.weight", {H});
    w.mlp_norm = tensor(p + "post_attention_layernorm.weight", {H});
    w.q = tensor(p + "self_attn.q_proj.weight", {Q, H});
    w.k = tensor(p + "self_attn.k_proj.weight", {KV, H});
    w.v = tensor(p + "self_attn.v_proj.weight", {KV, H});
    w.o = tensor(p + "self_attn.o_proj.weight", {H, Q});
    if (spec_.attention_bias) {
      w.q_bias = tensor(p + "self_attn.q_proj.bias", {Q});
      w.k_bias = tensor(p + "self_attn.k_proj.bias", {KV});
      w.v_bias = tensor(p + "self_attn.v_proj.bias", {KV});
      w.o_bias = optional_tensor(p + "self_attn.o_proj.bias", {H});
    }
    switch (spec_.qk_norm) {
      case QkNorm::None: break;
      case QkNorm::PerHead:
        w.q_norm = tensor(p + "self_attn.q_norm.weight", {spec_.head_dim});
        w.k_norm = tensor(p + "self_attn.k_norm.weight", {spec_.head_dim});
        break;
      case QkNorm::WholeProjection:
        w.q_norm = tensor(p + "self_attn.q_norm.weight", {Q});
        w.k_norm = tensor(p + "self_attn.k_norm.weight", {KV});
        break;
    }
    if (!spec_.layer_is_moe[size_t(l)]) {
      const int64_t I = spec_.intermediate_size;
      w.dense.gate = tensor(p + "mlp.gate_proj.weight", {I, H});
      w.dense.up = tensor(p + "mlp.up_proj.weight", {I, H});
      w.dense.down = tensor(p + "mlp.down_proj.weight", {H, I});
      return;
    }
    resolve_experts(p, w);
  }

  // Routed experts come in two layouts: one tensor per expert (the Hub's checkpoints), or
  // fused 3-D tensors over all experts (transformers 5's in-memory layout, which it also saves).
  void resolve_experts(const std::string& p, LayerWeights& w) {
    const int64_t E = spec_.n_experts, I = spec_.moe_intermediate_size, H = spec_.hidden_size;
    // Mixtral checkpoints say block_sparse_moe with w1 (gate), w3 (up), w2 (down).
    const bool mixtral_names = store_.find(p + "block_sparse_moe.gate.weight") != nullptr;
    const std::string moe = p + (mixtral_names ? "block_sparse_moe." : "mlp.");
    w.router = tensor(moe + "gate.weight", {E, H});
    w.experts.resize(static_cast<size_t>(E));
    if (store_.find(moe + "experts.gate_up_proj") || store_.find(moe + "experts.gate_up_proj.weight")) {
      resolve_fused(moe, w);
      return;
    }
    const char* gate = mixtral_names ? "w1" : "gate_proj";
    const char* up = mixtral_names ? "w3" : "up_proj";
    const char* down = mixtral_names ? "w2" : "down_proj";
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = moe + "experts." + std::to_string(e) + ".";
      w.experts[size_t(e)].gate = tensor(x + gate + ".weight", {I, H});
      w.experts[size_t(e)].up = tensor(x + up + ".weight", {I, H});
      w.experts[size_t(e)].down = tensor(x + down + ".weight", {H, I});
    }
  }

  void resolve_fused(const std::string& moe, LayerWeights& w) {
    const int64_t E = spec_.n_experts, I = spec_.moe_intermediate_size, H = spec_.hidden_size;
    auto named = [&](const std::string& base) {
      return store_.find(base) ? base : base + ".weight";
    };
    const std::string gu_name = named(moe + "experts.gate_up_proj");
    const std::string down_name = named(moe + "experts.down_proj");
    TensorView gate_up = store_.get(gu_name);
    TensorView down = store_.get(down_name);
    // Orientation from the shapes: [E, 2I, H] (rows are outputs, as spill's matmul wants) or
    // [E, H, 2I] (transposed; copied once here). When H == 2I the shape cannot tell, and the
    // transformers 5 orientation [E, 2I, H] is assumed.
    if (gate_up.ndim == 3 && gate_up.shape[0] == E && gate_up.shape[1] == H && gate_up.shape[2] == 2 * I &&
        H != 2 * I)
      gate_up = transposed_copy(gate_up);
    check_shape(gu_name, gate_up, {E, 2 * I, H});
    if (down.ndim == 3 && down.shape[0] == E && down.shape[1] == I && down.shape[2] == H && H != I)
      down = transposed_copy(down);
    check_shape(down_name, down, {E, H, I});
    for (int64_t e = 0; e < E; ++e) {
      TensorView gu = gate_up.slice0(e);  // [2I, H]: gate rows first, then up rows
      ExpertWeights& x = w.experts[size_t(e)];
      x.gate = gu;
      x.gate.shape[0] = I;
      x.up = x.gate;
      x.up.data = gu.row_data(I);
      x.down = down.slice0(e);
    }
  }

  // [E, R, C] -> [E, C, R], same dtype, owned by the model.
  TensorView transposed_copy(const TensorView& t) {
    const int64_t E = t.shape[0], R = t.shape[1], C = t.shape[2];
    if (!dtype_is_float(t.dtype))
      fail("{}: a fused expert tensor stored transposed must be F32, BF16 or F16, not {}", store_.dir(),
           dtype_name(t.dtype));
    const size_t es = size_t(dtype_traits(t.dtype).block_bytes);
    auto buf = std::make_unique<uint8_t[]>(t.nbytes());
    const auto* src = static_cast<const uint8_t*>(t.data);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c)
          std::memcpy(buf.get() + ((e * C + c) * R + r) * es, src + ((e * R + r) * C + c) * es, es);
    TensorView out = t;
    out.shape[1] = C;
    out.shape[2] = R;
    out.data = buf.get();
    m_.owned_.push_back(std::move(buf));
    return out;
  }
};

std::unique_ptr<Model> Model::load(const std::string& dir) {
  auto model = std::make_unique<Model>();
  model->spec_ = load_model_spec(dir);
  model->store_ = WeightStore::open_folder(dir);
  WeightResolver(*model).resolve();
  return model;
}

}  // namespace spill
