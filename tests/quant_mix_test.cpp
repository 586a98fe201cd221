// --quant: parsing, the row-width fallback, and quantize on load. The per-tensor types of the
// presets are checked against llama-quantize itself in quant_mix_llama_test.cpp (fixture made by
// tools/fixtures/make_quant_mix_fixture.py); here the parts that are spill's own.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/model.h"
#include "model/quantize_on_load.h"
#include "model/runner.h"
#include "quant/quant.h"
#include "quant/quant_mix.h"
#include "test_models.h"

namespace spill::quant {

namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("spill_qmix_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void expect_error(const std::string& spec, const std::string& fragment) {
  try {
    parse_quant_mix(spec);
    ADD_FAILURE() << "'" << spec << "' parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(QuantMix, ParsesPresetsClassesAndBoth) {
  for (Preset p : all_presets()) {
    const QuantMix m = parse_quant_mix(std::string(preset_name(p)));
    EXPECT_EQ(m.preset, p);
    EXPECT_EQ(m.str(), preset_name(p));
  }
  const QuantMix m = parse_quant_mix("Q4_K_M, experts=q3_k,attention=Q8_0,head=q6_k,embed=q8_0,shared=q6_k");
  EXPECT_EQ(m.preset, Preset::Q4_K_M);
  EXPECT_EQ(m.class_type[int(TensorClass::Experts)], DType::Q3_K);
  EXPECT_EQ(m.class_type[int(TensorClass::Attention)], DType::Q8_0);
  EXPECT_FALSE(m.class_type[int(TensorClass::Dense)].has_value());
  EXPECT_EQ(m.str(), "q4_k_m,experts=q3_k,shared=q6_k,attention=q8_0,embed=q8_0,head=q6_k");
  EXPECT_EQ(parse_quant_mix(m.str()).str(), m.str());
}

TEST(QuantMix, RejectsBadSpecsClearly) {
  expect_error("", "empty");
  expect_error("q4_k_x", "not a preset");
  expect_error("experts=q4", "not a type");
  expect_error("expert=q4_k", "not a tensor class");
  expect_error("norms=q8_0", "never quantized");
  expect_error("experts=q4_k,experts=q3_k", "given twice");
  expect_error("experts=q4_k,q4_k_m", "must come first");
  expect_error("q4_k_m,,experts=q3_k", "empty item");
}

// llama.cpp's fallback chain (tensor_type_fallback in its src/llama-quant.cpp) sends each
// 256-block type to a 32-block type and, when the row is not a multiple of 32 either, to F16.
TEST(QuantMix, RowWidthFallback) {
  const std::pair<DType, DType> chain[] = {{DType::Q6_K, DType::Q8_0}, {DType::Q5_K, DType::Q5_1},
                                           {DType::Q4_K, DType::Q5_0}, {DType::Q3_K, DType::Q4_0},
                                           {DType::Q2_K, DType::Q4_0}, {DType::IQ4_XS, DType::IQ4_NL}};
  for (auto [t, small] : chain) {
    EXPECT_EQ(fallback_type(t, 512), t);
    EXPECT_EQ(fallback_type(t, 128), small) << dtype_name(t);
    EXPECT_EQ(fallback_type(t, 100), DType::F16);
  }
  EXPECT_EQ(fallback_type(DType::Q8_0, 96), DType::Q8_0);
  EXPECT_EQ(fallback_type(DType::Q8_0, 48), DType::F16);
  EXPECT_EQ(fallback_type(DType::MXFP4, 48), DType::F16);
  EXPECT_EQ(fallback_type(DType::BF16, 7), DType::BF16);

  const MixModelShape shape{.n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .n_experts = 16};
  const TypeChoice c = resolve_tensor_type(parse_quant_mix("q4_k_m"), shape,
                                           {.kind = TensorKind::FfnGate, .ffn = FfnOwner::Routed, .layer = 1, .cols = 128});
  EXPECT_TRUE(c.fell_back());
  EXPECT_EQ(c.wanted, DType::Q4_K);
  EXPECT_EQ(c.type, DType::Q5_0);
  EXPECT_NE(c.fallback_reason.find("128 columns"), std::string::npos) << c.fallback_reason;
}

TEST(QuantMix, ClassesOverridePresetsAndNormsRoutersStay) {
  const MixModelShape shape{.n_layers = 8, .n_heads = 8, .n_kv_heads = 2, .n_experts = 16};
  const QuantMix mix = parse_quant_mix("q4_k_m,experts=q2_k,router=q8_0");
  auto type_of = [&](TensorSlot s) { return resolve_tensor_type(mix, shape, s); };
  EXPECT_EQ(type_of({.kind = TensorKind::FfnDown, .ffn = FfnOwner::Routed, .layer = 0, .cols = 512}).type,
            DType::Q2_K);
  EXPECT_EQ(type_of({.kind = TensorKind::Router, .layer = 0, .cols = 512}).type, DType::Q8_0);
  EXPECT_FALSE(type_of({.kind = TensorKind::Norm, .layer = 0, .cols = 512}).quantize);
  EXPECT_FALSE(type_of({.kind = TensorKind::Bias, .layer = 0, .cols = 512}).quantize);
  // Without router=..., a preset leaves the router as stored (llama.cpp never quantizes ffn_gate_inp).
  EXPECT_FALSE(resolve_tensor_type(parse_quant_mix("q4_k_m"), shape, {.kind = TensorKind::Router, .cols = 512}).quantize);
  // Classes alone: what is not named stays as stored.
  const QuantMix only = parse_quant_mix("experts=q3_k");
  EXPECT_FALSE(resolve_tensor_type(only, shape, {.kind = TensorKind::AttnQ, .layer = 0, .cols = 512}).quantize);
  EXPECT_EQ(resolve_tensor_type(only, shape, {.kind = TensorKind::FfnUp, .ffn = FfnOwner::Routed, .layer = 3, .cols = 512})
                .type,
            DType::Q3_K);
  // A tied embedding is the head: it takes the head's type.
  const MixModelShape tied{.n_layers = 8, .n_heads = 8, .n_kv_heads = 2, .n_experts = 16, .tied_embeddings = true};
  EXPECT_EQ(tensor_class({.kind = TensorKind::TokenEmbd, .cols = 512}, tied), TensorClass::Head);
  EXPECT_EQ(resolve_tensor_type(parse_quant_mix("q4_k_m"), tied, {.kind = TensorKind::TokenEmbd, .cols = 512}).type,
            DType::Q6_K);
  EXPECT_EQ(resolve_tensor_type(parse_quant_mix("q4_k_m"), shape, {.kind = TensorKind::TokenEmbd, .cols = 512}).type,
            DType::Q4_K);
}

// ---- quantize on load -----------------------------------------------------------------------

namespace {

// A small MoE whose widths are whole 256-blocks (hidden 256, experts 256 wide) except the
// attention output's input (q_dim 128), so k-quants apply and one class falls back.
spill::testing::RandomModelParams block_model(bool tied) {
  return {.vocab_size = 320, .hidden_size = 256, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1, .head_dim = 64,
          .n_experts = 4, .n_experts_per_token = 2, .moe_intermediate_size = 256, .tie_word_embeddings = tied,
          .seed = 11};
}

std::vector<float> dequantized(const TensorView& t) {
  std::vector<float> out(size_t(t.numel()));
  for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.dtype, t.row_data(r), out.data() + r * t.cols(), t.cols());
  return out;
}

}  // namespace

TEST(QuantizeOnLoad, EveryTensorIsQuantizeOfItsSourceRows) {
  for (bool tied : {false, true}) {
    const fs::path dir = temp_dir(tied ? "tied" : "untied");
    spill::testing::write_random_model(dir.string(), block_model(tied));
    auto original = Model::load(dir.string());
    auto model = Model::load(dir.string());
    const QuantMix mix = parse_quant_mix("q4_k_m,attention=q5_k");
    const std::vector<QuantPlanEntry> plan = plan_quantization(*model, mix);
    const QuantizeReport report = quantize_model(*model, mix, {.n_threads = 2});
    ASSERT_FALSE(plan.empty());
    int64_t checked = 0, fallbacks = 0;
    auto find_views = [&](const QuantPlanEntry& p, Model& m) -> const TensorView& {
      switch (p.key.role) {
        case WeightRole::Embed: return m.embed;
        case WeightRole::LmHead: return m.lm_head;
        case WeightRole::Q: return m.layers[size_t(p.key.layer)].q;
        case WeightRole::K: return m.layers[size_t(p.key.layer)].k;
        case WeightRole::V: return m.layers[size_t(p.key.layer)].v;
        case WeightRole::O: return m.layers[size_t(p.key.layer)].o;
        case WeightRole::Router: return m.layers[size_t(p.key.layer)].router;
        case WeightRole::ExpertGate: return m.layers[size_t(p.key.layer)].experts[size_t(p.key.expert)].gate;
        case WeightRole::ExpertUp: return m.layers[size_t(p.key.layer)].experts[size_t(p.key.expert)].up;
        case WeightRole::ExpertDown: return m.layers[size_t(p.key.layer)].experts[size_t(p.key.expert)].down;
        default: throw std::runtime_error("unexpected role in plan");
      }
    };
    for (const QuantPlanEntry& p : plan) {
      const TensorView& src = find_views(p, *original);
      const TensorView& got = find_views(p, *model);
      if (!p.choice.quantize) {  // kept as stored: same type, same bytes
        EXPECT_EQ(got.dtype, src.dtype) << p.name;
        EXPECT_EQ(0, std::memcmp(got.data, src.data, src.nbytes())) << p.name;
        continue;
      }
      ASSERT_EQ(got.dtype, p.choice.type) << p.name;
      ASSERT_EQ(got.shape, src.shape) << p.name;
      fallbacks += p.choice.fell_back();
      std::vector<float> row(size_t(src.cols()));
      std::vector<uint8_t> want(size_t(got.row_bytes()));
      for (int64_t r = 0; r < src.rows(); ++r) {
        dequantize_row(src.dtype, src.row_data(r), row.data(), src.cols());
        quantize_row(got.dtype, row.data(), want.data(), src.cols());
        ASSERT_EQ(0, std::memcmp(want.data(), got.row_data(r), want.size())) << p.name << " row " << r;
      }
      ++checked;
    }
    EXPECT_EQ(checked, report.n_tensors);
    EXPECT_EQ(fallbacks, report.n_fallbacks);
    // The attention output reads q_dim = 128 columns: Q5_K does not fit, Q5_1 stands in.
    EXPECT_EQ(model->layers[0].o.dtype, DType::Q5_1);
    EXPECT_EQ(model->layers[0].q.dtype, DType::Q5_K);
    if (tied) {
      EXPECT_EQ(model->lm_head.data, model->embed.data);
      EXPECT_EQ(model->embed.dtype, DType::Q6_K);
    } else {
      EXPECT_EQ(model->embed.dtype, DType::Q4_K);
      EXPECT_EQ(model->lm_head.dtype, DType::Q6_K);
    }
    EXPECT_EQ(model->layers[0].attn_norm.dtype, original->layers[0].attn_norm.dtype);
    EXPECT_EQ(model->layers[0].router.dtype, original->layers[0].router.dtype);  // routers stay as stored
    fs::remove_all(dir);
  }
}

// The forward over the quantized model equals the forward over a model whose weights are the
// dequantized values in F32: quantize on load changes the weights and nothing else. The two
// differ only in the summation order of the dot products (block by block with scales applied per
// block vs one f32 dot), a few fp32 roundings per output: 1e-4 of the logits' spread bounds that.
// The exact f32-activation path is the one compared (int8 activations are a separate bound, quant.h).
TEST(QuantizeOnLoad, ForwardEqualsDequantizedWeightsUsedDirectly) {
  struct F32Activations {
    spill::cpu::ActivationMode saved = spill::cpu::activation_mode();
    F32Activations() { spill::cpu::set_activation_mode(spill::cpu::ActivationMode::F32); }
    ~F32Activations() { spill::cpu::set_activation_mode(saved); }
  } f32_activations;
  const fs::path dir = temp_dir("forward");
  spill::testing::write_random_model(dir.string(), block_model(false));
  auto q = Model::load(dir.string());
  quantize_model(*q, parse_quant_mix("q4_k_m"), {.n_threads = 1});
  auto f = Model::load(dir.string());
  quantize_model(*f, parse_quant_mix("q4_k_m"), {.n_threads = 1});
  // Replace every quantized view of f by an F32 copy of its dequantized values.
  auto to_f32 = [&](TensorView& v) {
    if (v.empty() || dtype_is_float(v.dtype)) return;
    const std::vector<float> d = dequantized(v);
    uint8_t* buf = f->own_bytes(d.size() * 4);
    std::memcpy(buf, d.data(), d.size() * 4);
    v.data = buf;
    v.dtype = DType::F32;
  };
  to_f32(f->embed);
  to_f32(f->lm_head);
  for (LayerWeights& w : f->layers) {
    for (TensorView* t : {&w.q, &w.k, &w.v, &w.o, &w.router}) to_f32(*t);
    for (ExpertWeights& e : w.experts)
      for (TensorView* t : {&e.gate, &e.up, &e.down}) to_f32(*t);
  }
  ASSERT_EQ(q->layers[1].experts[0].down.dtype, DType::Q6_K);  // layer 1 of 2 is a "more bits" layer
  std::vector<int32_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + 5) % 320);
  auto logits_of = [&](const Model& m) {
    auto runner = make_cpu_runner(m, {.block_size = 16, .n_blocks = 3}, 1);
    std::vector<int32_t> table = {0, 1, 2};
    ForwardBatch b;
    b.tokens = ids;
    b.seqs.push_back({.first_token = 0, .n_tokens = int32_t(ids.size()), .start_pos = 0, .block_table = table,
                      .want_logits = true});
    b.all_logits = true;
    std::vector<float> out;
    runner->forward(b, out);
    return out;
  };
  const std::vector<float> lq = logits_of(*q), lf = logits_of(*f);
  ASSERT_EQ(lq.size(), lf.size());
  float spread = 0, worst = 0;
  for (float v : lf) spread = std::max(spread, std::fabs(v));
  for (size_t i = 0; i < lq.size(); ++i) worst = std::max(worst, std::fabs(lq[i] - lf[i]));
  EXPECT_LE(worst, 1e-4f * spread) << "spread " << spread;
  fs::remove_all(dir);
}

TEST(QuantizeOnLoad, ImportanceChangesTheChosenScales) {
  const fs::path dir = temp_dir("imatrix");
  spill::testing::write_random_model(dir.string(), block_model(false));
  auto plain = Model::load(dir.string());
  auto weighted = Model::load(dir.string());
  const QuantMix mix = parse_quant_mix("experts=q3_k");
  quantize_model(*plain, mix);
  ImportanceMatrix im;
  std::vector<float> w(256);
  for (size_t i = 0; i < w.size(); ++i) w[i] = i < 32 ? 100.0f : 0.01f;  // the first columns matter most
  im.set({WeightRole::ExpertGate, 0, 1}, w);
  quantize_model(*weighted, mix, {.importance = &im});
  const TensorView& a = plain->layers[0].experts[1].gate;
  const TensorView& b = weighted->layers[0].experts[1].gate;
  EXPECT_NE(0, std::memcmp(a.data, b.data, a.nbytes()));
  // Only the tensor with importance changes.
  EXPECT_EQ(0, std::memcmp(plain->layers[0].experts[0].gate.data, weighted->layers[0].experts[0].gate.data,
                           plain->layers[0].experts[0].gate.nbytes()));
  fs::remove_all(dir);
}

TEST(QuantizeOnLoad, RefusesImatrixWithoutQuant) {
  const fs::path dir = temp_dir("noquant");
  spill::testing::write_random_model(dir.string(), block_model(false));
  auto model = Model::load(dir.string());
  EXPECT_THROW(quantize_as_asked(*model, {.quant = "", .imatrix = "x.dat"}), Error);
  EXPECT_EQ(quantize_as_asked(*model, {}).n_tensors, 0);
  fs::remove_all(dir);
}

}  // namespace spill::quant
