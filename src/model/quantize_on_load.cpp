#include "model/quantize_on_load.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace spill {

namespace {

using quant::FfnOwner;
using quant::TensorKind;

std::tuple<int, int, int> key_tuple(const WeightKey& k) { return {int(k.role), k.layer, k.expert}; }

// Every weight view of the model with its key, in model order (embedding, layers, head). The
// head is visited too; a tied head has the embedding's data and is skipped by the callers.
void for_each_weight(Model& m, const std::function<void(const WeightKey&, TensorView&)>& fn) {
  fn({WeightRole::Embed}, m.embed);
  for (size_t li = 0; li < m.layers.size(); ++li) {
    LayerWeights& w = m.layers[li];
    const int32_t l = int32_t(li);
    const std::pair<WeightRole, TensorView*> plain[] = {
        {WeightRole::AttnNorm, &w.attn_norm}, {WeightRole::Q, &w.q},           {WeightRole::K, &w.k},
        {WeightRole::V, &w.v},                {WeightRole::O, &w.o},           {WeightRole::QBias, &w.q_bias},
        {WeightRole::KBias, &w.k_bias},       {WeightRole::VBias, &w.v_bias},  {WeightRole::OBias, &w.o_bias},
        {WeightRole::QNorm, &w.q_norm},       {WeightRole::KNorm, &w.k_norm},  {WeightRole::MlpNorm, &w.mlp_norm},
        {WeightRole::DenseGate, &w.dense.gate}, {WeightRole::DenseUp, &w.dense.up},
        {WeightRole::DenseDown, &w.dense.down}, {WeightRole::Router, &w.router},
        {WeightRole::SharedGate, &w.shared.gate}, {WeightRole::SharedUp, &w.shared.up},
        {WeightRole::SharedDown, &w.shared.down},
    };
    for (auto& [role, view] : plain)
      if (!view->empty()) fn({role, l}, *view);
    // Expert by expert within each projection, so a layer's experts of one projection can sit
    // in one allocation, each a contiguous slice as in a GGUF file's 3-D tensor.
    for (WeightRole role : {WeightRole::ExpertGate, WeightRole::ExpertUp, WeightRole::ExpertDown})
      for (size_t e = 0; e < w.experts.size(); ++e) {
        ExpertWeights& x = w.experts[e];
        TensorView& v = role == WeightRole::ExpertGate ? x.gate : role == WeightRole::ExpertUp ? x.up : x.down;
        fn({role, l, int32_t(e)}, v);
      }
  }
  fn({WeightRole::FinalNorm}, m.final_norm);
  fn({WeightRole::LmHead}, m.lm_head);
}

quant::TensorSlot slot_of(const WeightKey& key, const TensorView& v) {
  quant::TensorSlot s{.kind = TensorKind::Norm, .layer = key.layer, .cols = v.cols()};
  auto ffn = [&](TensorKind k, FfnOwner o) { s.kind = k, s.ffn = o; };
  switch (key.role) {
    case WeightRole::Embed: s.kind = TensorKind::TokenEmbd; break;
    case WeightRole::LmHead: s.kind = TensorKind::Output; break;
    case WeightRole::Q: s.kind = TensorKind::AttnQ; break;
    case WeightRole::K: s.kind = TensorKind::AttnK; break;
    case WeightRole::V: s.kind = TensorKind::AttnV; break;
    case WeightRole::O: s.kind = TensorKind::AttnOutput; break;
    case WeightRole::QBias: case WeightRole::KBias: case WeightRole::VBias: case WeightRole::OBias:
      s.kind = TensorKind::Bias;
      break;
    case WeightRole::DenseGate: ffn(TensorKind::FfnGate, FfnOwner::Dense); break;
    case WeightRole::DenseUp: ffn(TensorKind::FfnUp, FfnOwner::Dense); break;
    case WeightRole::DenseDown: ffn(TensorKind::FfnDown, FfnOwner::Dense); break;
    case WeightRole::SharedGate: ffn(TensorKind::FfnGate, FfnOwner::Shared); break;
    case WeightRole::SharedUp: ffn(TensorKind::FfnUp, FfnOwner::Shared); break;
    case WeightRole::SharedDown: ffn(TensorKind::FfnDown, FfnOwner::Shared); break;
    case WeightRole::ExpertGate: case WeightRole::ExpertsGate: ffn(TensorKind::FfnGate, FfnOwner::Routed); break;
    case WeightRole::ExpertUp: case WeightRole::ExpertsUp: ffn(TensorKind::FfnUp, FfnOwner::Routed); break;
    case WeightRole::ExpertDown: case WeightRole::ExpertsDown: ffn(TensorKind::FfnDown, FfnOwner::Routed); break;
    case WeightRole::Router: s.kind = TensorKind::Router; break;
    default: s.kind = TensorKind::Norm; break;  // norms; a 1-D tensor is never quantized
  }
  if (v.ndim < 2) s.kind = s.kind == TensorKind::Bias ? TensorKind::Bias : TensorKind::Norm;
  return s;
}

quant::MixModelShape shape_of(const Model& m) {
  const ModelSpec& s = m.spec();
  return {.n_layers = int32_t(s.n_layers),
          .n_heads = int32_t(s.n_heads),
          .n_kv_heads = int32_t(s.n_kv_heads),
          .n_experts = int32_t(s.n_experts),
          .tied_embeddings = m.lm_head.data == m.embed.data};
}

// Source row -> stored row in a float type (the quantizers handle the block types).
void store_float_row(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(src[i]);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(src[i]);
      break;
    default: fail("internal: {} is not a float type", dtype_name(t));
  }
}

}  // namespace

void ImportanceMatrix::set(const WeightKey& key, std::vector<float> values) { values_[key_tuple(key)] = std::move(values); }

const float* ImportanceMatrix::find(const WeightKey& key) const {
  auto it = values_.find(key_tuple(key));
  return it == values_.end() ? nullptr : it->second.data();
}

std::vector<QuantPlanEntry> plan_quantization(const Model& model, const quant::QuantMix& mix) {
  const quant::MixModelShape shape = shape_of(model);
  std::vector<QuantPlanEntry> plan;
  for_each_weight(const_cast<Model&>(model), [&](const WeightKey& key, TensorView& v) {
    if (v.empty() || (key.role == WeightRole::LmHead && shape.tied_embeddings)) return;
    const quant::TensorSlot slot = slot_of(key, v);
    const std::optional<quant::TensorClass> cls = quant::tensor_class(slot, shape);
    if (!cls) return;
    plan.push_back({.key = key,
                    .name = model.source().describe(key),
                    .cls = *cls,
                    .from = v.dtype,
                    .rows = v.rows(),
                    .cols = v.cols(),
                    .choice = quant::resolve_tensor_type(mix, shape, slot)});
  });
  return plan;
}

QuantizeReport quantize_model(Model& model, const quant::QuantMix& mix, const QuantizeOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<QuantPlanEntry> plan = plan_quantization(model, mix);
  QuantizeReport report;
  const bool tied = model.lm_head.data == model.embed.data;

  // Allocate the quantized copies: the experts of one layer and projection together, every
  // other tensor alone.
  std::vector<uint8_t*> dst(plan.size(), nullptr);
  for (size_t i = 0; i < plan.size();) {
    size_t j = i + 1;
    const QuantPlanEntry& p = plan[i];
    if (p.key.expert >= 0)
      while (j < plan.size() && plan[j].key.role == p.key.role && plan[j].key.layer == p.key.layer) ++j;
    size_t total = 0;
    for (size_t k = i; k < j; ++k)
      if (plan[k].choice.quantize) total += size_t(plan[k].rows) * size_t(row_bytes(plan[k].choice.type, plan[k].cols));
    uint8_t* buf = total ? model.own_bytes(total) : nullptr;
    for (size_t k = i; k < j; ++k)
      if (plan[k].choice.quantize) {
        dst[k] = buf;
        buf += size_t(plan[k].rows) * size_t(row_bytes(plan[k].choice.type, plan[k].cols));
      }
    i = j;
  }

  // The views to replace, in plan order (for_each_weight visits in the same order).
  std::map<std::tuple<int, int, int>, TensorView*> views;
  for_each_weight(model, [&](const WeightKey& key, TensorView& v) { views[key_tuple(key)] = &v; });

  ThreadPool pool(options.n_threads);
  for (size_t i = 0; i < plan.size(); ++i) {
    const QuantPlanEntry& p = plan[i];
    if (!p.choice.quantize) continue;
    TensorView& view = *views.at(key_tuple(p.key));
    const TensorView src = view;
    const DType to = p.choice.type;
    const float* importance = options.importance ? options.importance->find(p.key) : nullptr;
    if (importance && dtype_is_float(to)) importance = nullptr;
    pool.parallel_for(p.rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(size_t(p.cols));
      for (int64_t r = r0; r < r1; ++r) {
        quant::dequantize_row(src.dtype, src.row_data(r), row.data(), p.cols);
        uint8_t* out = dst[i] + size_t(r) * size_t(row_bytes(to, p.cols));
        if (dtype_is_float(to))
          store_float_row(to, row.data(), out, p.cols);
        else
          quant::quantize_row(to, row.data(), out, p.cols, importance);
      }
    });
    report.n_tensors += 1;
    report.bytes_before += int64_t(src.nbytes());
    view.data = dst[i];
    view.dtype = to;
    report.bytes_after += int64_t(view.nbytes());
    report.n_fallbacks += p.choice.fell_back();
    if (p.key.role == WeightRole::Embed && tied) model.lm_head = view;
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

// ---- llama.cpp's legacy imatrix.dat ----------------------------------------------------------
//
// int32 n_entries; per entry: int32 name_len, name bytes, int32 ncall, int32 nval, float[nval]
// (sum over calls of the mean squared activation, i.e. mean x ncall); then int32 last_chunk and
// the dataset name, which spill does not need.

namespace {

// The GGUF name of each role spill quantizes, as llama.cpp names them (a 3-D expert tensor
// holds every expert: one row of columns per expert in the imatrix).
bool gguf_role(const std::string& name, WeightRole& role, int32_t& layer, bool& experts) {
  experts = false;
  layer = -1;
  if (name == "token_embd.weight") return role = WeightRole::Embed, true;
  if (name == "output.weight") return role = WeightRole::LmHead, true;
  int l = -1, used = 0;
  if (std::sscanf(name.c_str(), "blk.%d.%n", &l, &used) != 1 || used == 0) return false;
  layer = l;
  const std::string rest = name.substr(size_t(used));
  static const std::pair<const char*, WeightRole> kNames[] = {
      {"attn_q.weight", WeightRole::Q},         {"attn_k.weight", WeightRole::K},
      {"attn_v.weight", WeightRole::V},         {"attn_output.weight", WeightRole::O},
      {"ffn_gate.weight", WeightRole::DenseGate}, {"ffn_up.weight", WeightRole::DenseUp},
      {"ffn_down.weight", WeightRole::DenseDown}, {"ffn_gate_inp.weight", WeightRole::Router},
      {"ffn_gate_exps.weight", WeightRole::ExpertGate}, {"ffn_up_exps.weight", WeightRole::ExpertUp},
      {"ffn_down_exps.weight", WeightRole::ExpertDown},
  };
  for (auto& [n, r] : kNames)
    if (rest == n) {
      role = r;
      experts = r == WeightRole::ExpertGate || r == WeightRole::ExpertUp || r == WeightRole::ExpertDown;
      return true;
    }
  return false;
}

}  // namespace

ImportanceMatrix load_importance_matrix(const std::string& path, const Model& model) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--imatrix {}: cannot open the file", path);
  auto read_i32 = [&](const char* what) {
    int32_t v = 0;
    if (!in.read(reinterpret_cast<char*>(&v), 4)) fail("--imatrix {}: truncated while reading {}", path, what);
    return v;
  };
  // Column counts by key, from the model itself, to check every entry against.
  std::map<std::tuple<int, int, int>, int64_t> cols;
  for_each_weight(const_cast<Model&>(model), [&](const WeightKey& k, TensorView& v) {
    if (!v.empty()) cols[key_tuple(k)] = v.cols();
  });
  const int64_t n_experts = model.spec().n_experts;
  ImportanceMatrix im;
  const int32_t n_entries = read_i32("the entry count");
  if (n_entries < 0 || n_entries > 1000000)
    fail("--imatrix {}: {} entries is not a legacy imatrix.dat header (a GGUF imatrix is not read yet; convert it "
         "with llama-imatrix --output-format dat)",
         path, n_entries);
  for (int32_t i = 0; i < n_entries; ++i) {
    const int32_t len = read_i32("a name length");
    if (len <= 0 || len > 4096) fail("--imatrix {}: entry {} has a name length of {}", path, i, len);
    std::string name(size_t(len), '\0');
    if (!in.read(name.data(), len)) fail("--imatrix {}: truncated in the name of entry {}", path, i);
    const int32_t ncall = read_i32("a call count");
    const int32_t nval = read_i32("a value count");
    if (nval < 0 || nval > (1 << 28)) fail("--imatrix {}: entry '{}' has {} values", path, name, nval);
    std::vector<float> values(static_cast<size_t>(nval));
    if (!in.read(reinterpret_cast<char*>(values.data()), std::streamsize(nval) * 4))
      fail("--imatrix {}: truncated in the values of '{}'", path, name);
    if (ncall > 0)
      for (float& v : values) v /= float(ncall);
    WeightRole role;
    int32_t layer;
    bool experts;
    if (!gguf_role(name, role, layer, experts))
      fail("--imatrix {}: '{}' is not a tensor name spill knows (blk.N.attn_q.weight, blk.N.ffn_down_exps.weight, ...)",
           path, name);
    const int64_t n_mats = experts ? n_experts : 1;
    auto it = cols.find(key_tuple({role, layer, experts ? 0 : -1}));
    if (it == cols.end()) fail("--imatrix {}: '{}' names a tensor this model does not have", path, name);
    if (int64_t(nval) != it->second * n_mats)
      fail("--imatrix {}: '{}' has {} values; this model's tensor wants {} ({} columns x {})", path, name, nval,
           it->second * n_mats, it->second, n_mats);
    for (float v : values)
      if (!(v >= 0) || !std::isfinite(v)) fail("--imatrix {}: '{}' has a negative or non-finite value", path, name);
    for (int64_t e = 0; e < n_mats; ++e)
      im.set({role, layer, experts ? int32_t(e) : -1},
             std::vector<float>(values.begin() + e * it->second, values.begin() + (e + 1) * it->second));
  }
  return im;
}

QuantizeReport quantize_as_asked(Model& model, const QuantRequest& request) {
  if (request.quant.empty()) {
    if (!request.imatrix.empty())
      fail("--imatrix {} was given without --quant; the importance matrix only guides quantization", request.imatrix);
    return {};
  }
  const quant::QuantMix mix = quant::parse_quant_mix(request.quant);
  ImportanceMatrix importance;
  if (!request.imatrix.empty()) importance = load_importance_matrix(request.imatrix, model);
  return quantize_model(model, mix,
                        {.importance = request.imatrix.empty() ? nullptr : &importance, .n_threads = request.n_threads});
}

}  // namespace spill
