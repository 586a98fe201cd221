#include "placement/measured_bytes.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/error.h"

namespace spill::placement {

namespace {

int64_t bytes_of(const TensorView& t) { return t.empty() ? 0 : int64_t(t.nbytes()); }

}  // namespace

void visit_weights(const Model& model, const WeightVisitor& visit) {
  auto one = [&](TensorClass c, int64_t layer, int64_t expert, const TensorView& t) {
    if (!t.empty()) visit(c, layer, expert, t);
  };
  const bool tied = !model.embed.empty() && model.embed.data == model.lm_head.data;
  one(tied ? TensorClass::LmHead : TensorClass::Embedding, -1, -1, model.embed);
  if (!tied) one(TensorClass::LmHead, -1, -1, model.lm_head);
  one(TensorClass::Norms, -1, -1, model.final_norm);
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const LayerWeights& w = model.layers[i];
    const int64_t l = int64_t(i);
    for (const TensorView* t : {&w.q, &w.k, &w.v, &w.o, &w.q_bias, &w.k_bias, &w.v_bias, &w.o_bias, &w.sinks,
                                &w.mla.q_a, &w.mla.q_b, &w.mla.q, &w.mla.kv_a, &w.mla.kv_b, &w.mla.o})
      one(TensorClass::Attention, l, -1, *t);
    for (const TensorView* t : {&w.attn_norm, &w.mlp_norm, &w.q_norm, &w.k_norm, &w.mla.q_a_norm, &w.mla.kv_a_norm})
      one(TensorClass::Norms, l, -1, *t);
    auto mlp = [&](TensorClass c, int64_t expert, const ExpertWeights& e) {
      for (const TensorView* t : {&e.gate, &e.up, &e.down, &e.gate_bias, &e.up_bias, &e.down_bias}) one(c, l, expert, *t);
    };
    mlp(TensorClass::DenseMlp, -1, w.dense);
    mlp(TensorClass::SharedExperts, -1, w.shared);
    for (const TensorView* t : {&w.router, &w.router_bias, &w.router_correction_bias}) one(TensorClass::Router, l, -1, *t);
    for (size_t e = 0; e < w.experts.size(); ++e) mlp(TensorClass::RoutedExperts, int64_t(e), w.experts[e]);
  }
}

ModelShape shape_of(const Model& model) {
  ModelShape shape{.spec = model.spec(), .source = model.where()};
  shape.shared.count = model.spec().n_shared_experts;
  shape.shared.intermediate_size = shape.shared.count > 0 ? model.spec().moe_intermediate_size : 0;
  return shape;
}

ModelBytes measure_weights(const Model& model) {
  const ModelSpec& s = model.spec();
  ModelBytes mb;
  mb.layers.resize(size_t(s.n_layers));
  mb.tied_embedding = !model.embed.empty() && model.embed.data == model.lm_head.data;
  mb.embedding_row = model.embed.empty() ? 0 : int64_t(model.embed.row_bytes());
  // Per (layer, expert) bytes, to check every expert of a layer has the same size.
  std::vector<std::vector<int64_t>> expert_bytes(size_t(s.n_layers));
  for (size_t l = 0; l < model.layers.size(); ++l) expert_bytes[l].assign(model.layers[l].experts.size(), 0);
  visit_weights(model, [&](TensorClass c, int64_t layer, int64_t expert, const TensorView& t) {
    const int64_t b = bytes_of(t);
    if (layer < 0) {
      mb.total[c] += b;
      if (c == TensorClass::Embedding) mb.embedding += b;
      else mb.lm_head += b;  // the head (or the tied table) and the final norm, as account_weights counts them
      return;
    }
    if (c == TensorClass::RoutedExperts) {
      expert_bytes[size_t(layer)][size_t(expert)] += b;
      return;
    }
    mb.layers[size_t(layer)].weights[c] += b;
  });
  for (size_t l = 0; l < mb.layers.size(); ++l) {
    LayerBytes& lb = mb.layers[l];
    const std::vector<int64_t>& eb = expert_bytes[l];
    if (!eb.empty()) {
      const auto [lo, hi] = std::minmax_element(eb.begin(), eb.end());
      if (*lo != *hi)
        fail("{}: layer {}'s routed experts are not all one size ({} to {} bytes); the plan addresses an expert by "
             "layer and index, so each layer's experts must share their types",
             model.where(), l, *lo, *hi);
      lb.n_routed_experts = int64_t(eb.size());
      lb.routed_expert_bytes = *hi;
      mb.routed_expert_bytes = std::max(mb.routed_expert_bytes, *hi);
    }
    mb.total += lb.weights;
    mb.total[TensorClass::RoutedExperts] += lb.routed_bytes();
  }
  if (s.n_moe_layers() > 0) mb.routed_expert_weights = 3 * s.moe_intermediate_size * s.hidden_size;
  return mb;
}

TensorClassTypes dominant_types(const Model& model) {
  std::map<std::pair<int, int>, int64_t> bytes;  // (class, dtype) -> bytes
  visit_weights(model, [&](TensorClass c, int64_t, int64_t, const TensorView& t) {
    if (t.rows() > 1) bytes[{int(c), int(t.dtype)}] += bytes_of(t);  // matrices: vectors are f32 whatever the mix
  });
  TensorClassTypes types;
  std::array<int64_t, kNumTensorClasses> best{};
  for (const auto& [key, b] : bytes)
    if (b > best[size_t(key.first)]) {
      best[size_t(key.first)] = b;
      types.types[size_t(key.first)] = DType(key.second);
    }
  return types;
}

}  // namespace spill::placement
