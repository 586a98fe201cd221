// GGUF of the DeepSeek-V3 / Kimi-K2 (`deepseek2`), GLM-4.x (`glm4moe`) and gpt-oss (`gpt-oss`)
// families, with llama.cpp's names, metadata and layouts (MLA's kv_b split into attn_k_b / attn_v_b,
// post_attention_norm, exp_probs_b, attn_sinks, expert biases, MXFP4 experts):
//  - spill's writer on each transformers fixture (tests/data/parity), read back: the same spec and
//    bit-identical logits to the safetensors original (the same weight bytes; norms and routers
//    widened to F32, which is exact);
//  - files gguf-py wrote the way llama.cpp's converter does (tools/fixtures/make_family_ggufs.py:
//    the split and the legacy attn_kv_b MLA layouts, a GLM file with a NextN block) give the
//    logits of the safetensors original too;
//  - llama.cpp's own logits on spill's F32 files (tools/llamacpp/family_logits.py) agree with spill's
//    within what fp32 arithmetic in another order allows;
//  - hostile metadata for the new keys fails with the file and the key named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "engine/model_bundle.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "formats/npy.h"
#include "gguf_helpers.h"
#include "model/gguf_export.h"
#include "model/model.h"
#include "quant/quant.h"
#include "spill_process.h"
#include "test_models.h"

namespace spill {
namespace {

using test::run_spill;

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kParity = fs::path(SPILL_TEST_DATA) / "parity";
const fs::path kGguf = fs::path(SPILL_TEST_DATA) / "gguf";

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::vector<int32_t> fixture_ids(const std::string& fixture) {
  return read_json_file(kParity / fixture / "expected.json")["input_ids"].get<std::vector<int32_t>>();
}

// GPT-2's byte -> printable character map of byte-level BPE vocabularies.
std::string byte_symbol(int b) {
  int cp = b;
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

// The fixtures have no tokenizer; a GGUF needs one. A byte-level BPE of single bytes and one merge
// fits every fixture's vocabulary: all 256 bytes when it is that large, else the bytes valid UTF-8
// text can hold other than control characters (213), the rest of the ids padding.
void write_byte_tokenizer(const fs::path& dir, int64_t vocab) {
  json v = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    const bool rare = (b < 0x20 && b != '\t' && b != '\n' && b != '\r') || b == 0x7F || b == 0xC0 || b == 0xC1 || b >= 0xF5;
    if (vocab < 256 && rare) continue;
    v[byte_symbol(b)] = id++;
  }
  v[byte_symbol(' ') + "t"] = id++;  // one merge: llama.cpp refuses a BPE vocabulary without merges
  const json tok = {{"version", "1.0"},
                    {"added_tokens", json::array()},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                       {"use_regex", true}}},
                    {"post_processor", nullptr},
                    {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                                 {"use_regex", true}}},
                    {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                               {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                               {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", v},
                               {"merges", json::array({byte_symbol(' ') + " t"})}}}};
  std::ofstream(dir / "tokenizer.json") << tok.dump();
}

// The fixture's folder with a tokenizer next to it, as `spill quantize` wants one.
std::string folder_with_tokenizer(const testing::TempDir& tmp, const std::string& fixture) {
  const fs::path dir = tmp.sub(fixture + "-hf");
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(kParity / fixture / f, dir / f);
  write_byte_tokenizer(dir, load_model_spec((kParity / fixture).string()).vocab_size);
  return dir.string();
}

std::string write_spill_gguf(const testing::TempDir& tmp, const std::string& fixture) {
  const std::string hf = folder_with_tokenizer(tmp, fixture);
  auto model = Model::load(hf);
  const std::string out = tmp.sub(fixture + ".gguf");
  write_gguf(*model, out, {.hf_dir = hf, .name = "", .quant = ""});
  return out;
}

size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// Everything the forward reads, field by field (a GGUF is read into the same spec as config.json).
void expect_same_spec(const ModelSpec& a, const ModelSpec& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.attention_out_bias, b.attention_out_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.rope_dims(), b.rope_dims());
  EXPECT_EQ(a.rope_interleaved, b.rope_interleaved);
  EXPECT_EQ(a.softmax_scale(), b.softmax_scale());
  EXPECT_EQ(a.rope.kind, b.rope.kind);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.rope.factor, b.rope.factor);
  EXPECT_EQ(a.rope.attention_factor, b.rope.attention_factor);
  EXPECT_EQ(a.rope.original_max_position, b.rope.original_max_position);
  EXPECT_EQ(a.rope.beta_fast, b.rope.beta_fast);
  EXPECT_EQ(a.rope.beta_slow, b.rope.beta_slow);
  EXPECT_EQ(a.rope.truncate, b.rope.truncate);
  EXPECT_EQ(a.attention, b.attention);
  EXPECT_EQ(a.mla.q_lora_rank, b.mla.q_lora_rank);
  EXPECT_EQ(a.mla.kv_lora_rank, b.mla.kv_lora_rank);
  EXPECT_EQ(a.mla.qk_nope_head_dim, b.mla.qk_nope_head_dim);
  EXPECT_EQ(a.mla.qk_rope_head_dim, b.mla.qk_rope_head_dim);
  EXPECT_EQ(a.mla.v_head_dim, b.mla.v_head_dim);
  EXPECT_EQ(a.attention_sinks, b.attention_sinks);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  for (int64_t l = 0; l < a.n_layers; ++l) EXPECT_EQ(a.sliding(l), b.sliding(l)) << "layer " << l;
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.n_experts_per_token, b.n_experts_per_token);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.layer_is_moe, b.layer_is_moe);
  EXPECT_EQ(a.router.kind, b.router.kind);
  EXPECT_EQ(a.router.n_group, b.router.n_group);
  EXPECT_EQ(a.router.topk_group, b.router.topk_group);
  EXPECT_EQ(a.router.routed_scaling_factor, b.router.routed_scaling_factor);
  EXPECT_EQ(a.router.correction_bias, b.router.correction_bias);
  EXPECT_EQ(a.router_bias, b.router_bias);
  EXPECT_EQ(a.n_shared_experts, b.n_shared_experts);
  EXPECT_EQ(a.expert_activation, b.expert_activation);
  EXPECT_EQ(a.swiglu_alpha, b.swiglu_alpha);
  EXPECT_EQ(a.swiglu_limit, b.swiglu_limit);
  EXPECT_EQ(a.expert_bias, b.expert_bias);
}

class SpillWrittenFamily : public ::testing::TestWithParam<const char*> {};

TEST_P(SpillWrittenFamily, ReadsBackToTheSafetensorsModelBitForBit) {
  testing::TempDir tmp;
  const std::string fixture = GetParam();
  const std::string path = write_spill_gguf(tmp, fixture);
  auto hf = Model::load((kParity / fixture).string());
  auto gg = Model::load(path);
  expect_same_spec(hf->spec(), gg->spec());
  const std::vector<int32_t> ids = fixture_ids(fixture);
  const std::vector<float> a = testing::all_logits(*hf, ids), b = testing::all_logits(*gg, ids);
  EXPECT_EQ(differing(a, b), 0u) << "of " << a.size() << " logits";

  // llama.cpp's names and layouts are there.
  auto file = gguf::GgufFile::open(path);
  const ModelSpec& s = hf->spec();
  const std::string arch = file->metadata().string("general.architecture");
  if (s.arch == Arch::DeepseekV3) {
    EXPECT_EQ(arch, "deepseek2");
    const gguf::TensorInfo* k_b = file->find("blk.0.attn_k_b.weight");
    ASSERT_NE(k_b, nullptr);
    EXPECT_EQ(k_b->ne[0], s.mla.qk_nope_head_dim);  // ggml dims: {nope, kv_lora, heads}
    EXPECT_EQ(k_b->ne[1], s.mla.kv_lora_rank);
    EXPECT_EQ(k_b->ne[2], s.n_heads);
    EXPECT_EQ(file->find("blk.0.attn_kv_b.weight"), nullptr);
    EXPECT_EQ(file->metadata().integer("deepseek2.attention.head_count_kv"), 1);
    EXPECT_EQ(file->metadata().integer("deepseek2.attention.key_length"), s.mla.kv_lora_rank + s.mla.qk_rope_head_dim);
    // The joined kv_b equals the safetensors kv_b byte for byte.
    for (int64_t l = 0; l < s.n_layers; ++l) {
      const TensorView& x = hf->layers[size_t(l)].mla.kv_b;
      const TensorView& y = gg->layers[size_t(l)].mla.kv_b;
      ASSERT_EQ(x.dtype, y.dtype);
      EXPECT_EQ(0, std::memcmp(x.data, y.data, x.nbytes())) << "layer " << l;
    }
  } else if (s.arch == Arch::Glm4Moe) {
    EXPECT_EQ(arch, "glm4moe");
    EXPECT_NE(file->find("blk.0.post_attention_norm.weight"), nullptr);
    EXPECT_EQ(file->metadata().integer("glm4moe.rope.dimension_count"), s.rope_dims());
  } else {
    EXPECT_EQ(arch, "gpt-oss");
    EXPECT_NE(file->find("blk.0.attn_sinks.weight"), nullptr);
    EXPECT_NE(file->find("blk.0.ffn_gate_exps.bias"), nullptr);
    const bool mxfp4 = fixture == std::string("gpt_oss_mxfp4");
    EXPECT_EQ(file->find("blk.0.ffn_down_exps.weight")->ggml_type, mxfp4 ? 39 : 30);  // MXFP4 or BF16
  }
  const int64_t first_moe = std::find(s.layer_is_moe.begin(), s.layer_is_moe.end(), true) - s.layer_is_moe.begin();
  if (s.router.correction_bias) {
    EXPECT_NE(file->find("blk." + std::to_string(first_moe) + ".exp_probs_b.bias"), nullptr);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpillWrittenFamily,
                         ::testing::Values("deepseek_v3_per_expert", "deepseek_v3_fused", "deepseek_v3_noqlora_per_expert",
                                           "glm4_moe_per_expert", "glm4_moe_fused", "glm4_moe_noqknorm_per_expert",
                                           "gpt_oss_bf16", "gpt_oss_mxfp4"));

// ---- files gguf-py wrote with the converter's layouts -------------------------------------------

struct PyCase {
  const char* file;
  const char* fixture;
};

class ConverterLayoutFamily : public ::testing::TestWithParam<PyCase> {};

TEST_P(ConverterLayoutFamily, GivesTheSafetensorsLogits) {
  const PyCase c = GetParam();
  const fs::path path = kGguf / c.file;
  auto gg = Model::load(path.string());
  auto hf = Model::load((kParity / c.fixture).string());
  expect_same_spec(hf->spec(), gg->spec());
  const std::vector<int32_t> ids = fixture_ids(c.fixture);
  const std::vector<float> a = testing::all_logits(*hf, ids), b = testing::all_logits(*gg, ids);
  EXPECT_EQ(differing(a, b), 0u) << c.file;
}

INSTANTIATE_TEST_SUITE_P(
    Files, ConverterLayoutFamily,
    ::testing::Values(PyCase{"deepseek2-noqlora-split.gguf", "deepseek_v3_noqlora_per_expert"},
                      PyCase{"deepseek2-noqlora-kvb.gguf", "deepseek_v3_noqlora_per_expert"},
                      PyCase{"glm4moe-nextn.gguf", "glm4_moe_noqknorm_per_expert"}),
    [](const ::testing::TestParamInfo<PyCase>& info) {
      std::string n = info.param.file;
      for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return n;
    });

// attn_k_b and attn_v_b of different types (llama-quantize makes them so; this fixture's 16-wide
// key rows fit no block format, so F16 k_b against BF16 v_b) are joined into an F32 kv_b of the
// values each type holds: the path block formats take too (dequantize_row, exact in F32).
TEST(GgufFamilies, MixedTypeSplitMlaJoinsToF32) {
  testing::TempDir tmp;
  const std::string src = write_spill_gguf(tmp, "deepseek_v3_per_expert");
  auto file = gguf::GgufFile::open(src);
  gguf::Writer w;
  for (const auto& [key, value] : file->metadata().entries())
    if (key != "general.alignment") w.set(key, value);
  std::vector<std::vector<uint8_t>> keep;
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (t.name.find("attn_k_b") == std::string::npos) {
      w.add_raw_tensor(t.name, uint32_t(t.ggml_type), {t.ne.begin(), t.ne.begin() + t.n_dims}, t.view.data, t.nbytes);
      continue;
    }
    const int64_t cols = t.view.cols(), rows = t.view.rows();
    std::vector<float> f(static_cast<size_t>(cols));
    keep.emplace_back(size_t(rows * row_bytes(DType::F16, cols)));
    for (int64_t r = 0; r < rows; ++r) {
      quant::dequantize_row(t.view.dtype, t.view.row_data(r), f.data(), cols);
      quant::quantize_row(DType::F16, f.data(), keep.back().data() + r * row_bytes(DType::F16, cols), cols);
    }
    w.add_tensor(t.name, DType::F16, {t.view.shape[0], t.view.shape[1], t.view.shape[2]}, keep.back().data());
  }
  const std::string mixed = tmp.sub("mixed.gguf");
  w.write(mixed);
  // k_b F16 and v_b BF16: no common float type, so the join is F32.
  auto gg = Model::load(mixed);
  auto orig = Model::load(src);
  const TensorView& kv = gg->layers[0].mla.kv_b;
  EXPECT_EQ(kv.dtype, DType::F32);
  const ModelSpec& s = gg->spec();
  const int64_t per_head = s.mla.qk_nope_head_dim + s.mla.v_head_dim, L = s.mla.kv_lora_rank;
  std::vector<float> got(static_cast<size_t>(L)), want(static_cast<size_t>(L));
  for (int64_t r = 0; r < kv.rows(); ++r) {
    quant::dequantize_row(kv.dtype, kv.row_data(r), got.data(), L);
    quant::dequantize_row(orig->layers[0].mla.kv_b.dtype, orig->layers[0].mla.kv_b.row_data(r), want.data(), L);
    const bool key_row = r % per_head < s.mla.qk_nope_head_dim;
    for (int64_t c = 0; c < L; ++c) {
      // Key rows went through F16 (bf16 values with 8 bits of mantissa are exact in F16 unless tiny).
      const float w16 = f16_to_f32(f32_to_f16(want[size_t(c)]));
      ASSERT_EQ(got[size_t(c)], key_row ? w16 : want[size_t(c)]) << "row " << r << " col " << c;
    }
  }
}

// ---- hostile metadata ---------------------------------------------------------------------------

// The file at `src` rewritten with one change to its metadata (nullopt: the key removed).
std::string rewrite(const testing::TempDir& tmp, const std::string& src, const std::string& key,
                    std::optional<gguf::Value> value) {
  auto file = gguf::GgufFile::open(src);
  gguf::Writer w;
  bool seen = false;
  for (const auto& [k, v] : file->metadata().entries()) {
    if (k == "general.alignment") continue;
    if (k == key) {
      seen = true;
      if (value) w.set(k, *value);
      continue;
    }
    w.set(k, v);
  }
  if (!seen && value) w.set(key, *value);
  for (const gguf::TensorInfo& t : file->tensors())
    w.add_raw_tensor(t.name, uint32_t(t.ggml_type), {t.ne.begin(), t.ne.begin() + t.n_dims}, t.view.data, t.nbytes);
  static int n = 0;
  const std::string out = tmp.sub("hostile-" + std::to_string(n++) + ".gguf");
  w.write(out);
  return out;
}

std::string load_error(const std::string& path) {
  try {
    Model::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

struct Hostile {
  const char* key;                  // without the "<arch>." prefix
  std::optional<gguf::Value> value;  // nullopt: removed
  const char* says;                  // part of the message
};

void expect_refused(const testing::TempDir& tmp, const std::string& src, const std::string& arch,
                    const std::vector<Hostile>& cases) {
  for (const Hostile& h : cases) {
    const std::string key = arch + "." + h.key;
    const std::string path = rewrite(tmp, src, key, h.value);
    const std::string msg = load_error(path);
    EXPECT_NE(msg.find(path), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find(h.says), std::string::npos) << key << ": " << msg;
  }
}

TEST(GgufFamilies, HostileDeepseek2MetadataIsRefusedByName) {
  testing::TempDir tmp;
  const std::string src = write_spill_gguf(tmp, "deepseek_v3_per_expert");
  using gguf::Value;
  expect_refused(
      tmp, src, "deepseek2",
      {{"attention.kv_lora_rank", std::nullopt, "missing metadata key 'deepseek2.attention.kv_lora_rank'"},
       {"attention.kv_lora_rank", Value::string("32"), "'deepseek2.attention.kv_lora_rank' is a string"},
       {"attention.kv_lora_rank", Value::u32(0), "'deepseek2.attention.kv_lora_rank' is 0, outside"},
       {"attention.q_lora_rank", std::nullopt, "'blk.0.attn_q_a.weight' is there but metadata key"},
       {"attention.key_length", Value::u32(24), "an MLA file has kv_lora_rank + rope = 40"},
       {"attention.key_length_mla", Value::u32(8), "is not wider than its rope part"},
       {"attention.value_length_mla", Value::u32(99), "attn_v_b.weight' has shape"},
       {"rope.dimension_count", std::nullopt, "missing metadata key 'deepseek2.rope.dimension_count'"},
       {"rope.dimension_count", Value::u32(7), "must be even"},
       {"expert_gating_func", Value::u32(1), "'deepseek2.expert_gating_func' is 1 (softmax)"},
       {"expert_gating_func", std::nullopt, "missing, read as softmax"},
       {"expert_group_count", Value::u32(3), "metadata key 'deepseek2.expert_count' (16) is not a multiple of 'deepseek2.expert_group_count' (3)"},
       {"expert_group_used_count", Value::u32(5), "'deepseek2.expert_group_used_count' is 5, outside 1..4"},
       {"expert_group_used_count", std::nullopt, "missing metadata key 'deepseek2.expert_group_used_count'"},
       {"expert_shared_count", std::nullopt, "missing metadata key 'deepseek2.expert_shared_count'"},
       {"expert_used_count", Value::u32(17), "'deepseek2.expert_used_count' is 17, outside 1..16"},
       {"expert_count", Value::u32(8), "ffn_gate_inp.weight' has shape"},
       {"leading_dense_block_count", Value::u32(2), "ffn_gate.weight'"},
       {"leading_dense_block_count", Value::u32(9), "'deepseek2.leading_dense_block_count' is 9, outside 0..3"},
       {"expert_feed_forward_length", std::nullopt, "missing metadata key 'deepseek2.expert_feed_forward_length'"},
       {"rope.scaling.yarn_log_multiplier", Value::string("x"), "'deepseek2.rope.scaling.yarn_log_multiplier' is a string"},
       {"nextn_predict_layers", Value::u32(3), "'deepseek2.nextn_predict_layers' is 3, outside 0..2"}});
}

TEST(GgufFamilies, HostileGlm4MoeMetadataIsRefusedByName) {
  testing::TempDir tmp;
  const std::string src = write_spill_gguf(tmp, "glm4_moe_per_expert");
  using gguf::Value;
  expect_refused(tmp, src, "glm4moe",
                 {{"rope.dimension_count", std::nullopt, "missing metadata key 'glm4moe.rope.dimension_count'"},
                  {"rope.dimension_count", Value::u32(40), "must be even and within the head size (32)"},
                  {"expert_shared_count", std::nullopt, "missing metadata key 'glm4moe.expert_shared_count'"},
                  {"expert_shared_count", Value::u32(2), "ffn_gate_shexp.weight' has shape"},
                  {"expert_gating_func", Value::u32(1), "'glm4moe.expert_gating_func' is 1 (softmax)"},
                  {"expert_weights_norm", Value::u32(1), "'glm4moe.expert_weights_norm' is a u32"},
                  {"nextn_predict_layers", Value::u32(1), "tensor 'blk.2.nextn.eh_proj.weight' is missing"},
                  {"attention.key_length", Value::u32(30), "glm4moe.attention.value_length (32) differs from key_length (30)"},
                  {"attention.key_length", Value::u32(31), "the head size (31) must be positive and even"},
                  {"attention.key_length", std::nullopt, "value_length (32) differs from key_length (16)"}});
}

TEST(GgufFamilies, HostileGptOssMetadataIsRefusedByName) {
  testing::TempDir tmp;
  const std::string src = write_spill_gguf(tmp, "gpt_oss_mxfp4");
  using gguf::Value;
  expect_refused(
      tmp, src, "gpt-oss",
      {{"attention.sliding_window", std::nullopt, "missing metadata key 'gpt-oss.attention.sliding_window'"},
       {"attention.sliding_window", Value::u32(0), "'gpt-oss.attention.sliding_window' is 0, outside"},
       {"attention.sliding_window_pattern", Value::array(gguf::ValueType::Bool, {Value::boolean(true)}),
        "must be one bool per layer (3) or a period"},
       {"attention.sliding_window_pattern", Value::u32(0), "'gpt-oss.attention.sliding_window_pattern' is 0, outside"},
       {"expert_feed_forward_length", std::nullopt, "missing metadata key 'gpt-oss.expert_feed_forward_length'"},
       {"expert_feed_forward_length", Value::u32(64), "ffn_gate_exps.bias' has shape"},
       {"expert_used_count", Value::u32(0), "'gpt-oss.expert_used_count' is 0, outside 1..8"}});
}

// A sliding pattern given per layer, as some files do, is read as one bool per layer.
TEST(GgufFamilies, GptOssPerLayerSlidingPattern) {
  testing::TempDir tmp;
  const std::string src = write_spill_gguf(tmp, "gpt_oss_bf16");
  using gguf::Value;
  const std::string path = rewrite(tmp, src, "gpt-oss.attention.sliding_window_pattern",
                                   Value::array(gguf::ValueType::Bool, {Value::boolean(false), Value::boolean(true),
                                                                        Value::boolean(true)}));
  auto file = gguf::GgufFile::open(path);
  const ModelSpec s = gguf_model_spec(*file);
  EXPECT_FALSE(s.sliding(0));
  EXPECT_TRUE(s.sliding(1));
  EXPECT_TRUE(s.sliding(2));
  // The default period 2: even layers slide (llama.cpp's rule, transformers' default).
  const ModelSpec d = gguf_model_spec(*gguf::GgufFile::open(src));
  EXPECT_TRUE(d.sliding(0));
  EXPECT_FALSE(d.sliding(1));
  EXPECT_TRUE(d.sliding(2));
}

// ---- stop tokens --------------------------------------------------------------------------------

// The file at `src` with `specials` as control tokens (GGUF type 3) at the end of its vocabulary,
// pre-tokenizer `pre` and extra id keys: what a converted file of the family carries. Returns the
// path and the specials' ids.
std::pair<std::string, std::map<std::string, int32_t>> with_specials(
    const testing::TempDir& tmp, const std::string& src, const std::string& pre,
    const std::vector<std::string>& specials, const std::vector<std::pair<std::string, std::string>>& id_keys) {
  auto file = gguf::GgufFile::open(src);
  const gguf::Metadata& md = file->metadata();
  std::vector<std::string> tokens;
  for (const gguf::Value& v : *md.string_array("tokenizer.ggml.tokens")) tokens.push_back(v.s);
  std::vector<int32_t> types;
  for (int64_t t : md.integer_array("tokenizer.ggml.token_type")) types.push_back(int32_t(t));
  // spill's writer pads the vocabulary to the model's width with unused entries; the specials
  // take the last of them.
  std::map<std::string, int32_t> ids;
  size_t at = tokens.size() - specials.size();
  for (const std::string& t : specials) {
    EXPECT_EQ(types.at(at), 5) << "id " << at << " is not padding";
    ids[t] = int32_t(at);
    tokens[at] = t;
    types[at++] = 3;
  }
  using gguf::Value;
  std::string path = rewrite(tmp, src, "tokenizer.ggml.tokens", Value::strings(tokens));
  path = rewrite(tmp, path, "tokenizer.ggml.token_type", Value::i32s(types));
  path = rewrite(tmp, path, "tokenizer.ggml.pre", Value::string(pre));
  for (const auto& [key, token] : id_keys) path = rewrite(tmp, path, key, Value::u32(uint32_t(ids.at(token))));
  return {path, ids};
}

bool stops(const ModelSpec& s, int32_t id) {
  return std::find(s.eos_token_ids.begin(), s.eos_token_ids.end(), id) != s.eos_token_ids.end();
}

// gpt-oss (harmony): a turn ends at <|return|> (the answer) or <|call|> (a tool call); <|end|>
// closes the analysis message the final answer follows, so it must not stop generation. Its
// control tokens in a rendered prompt are single ids.
TEST(GgufFamilies, HarmonyStopsAtReturnAndCallButNotAtEnd) {
  testing::TempDir tmp;
  const std::string src = write_spill_gguf(tmp, "gpt_oss_bf16");
  const auto [path, ids] = with_specials(
      tmp, src, "gpt-4o",
      {"<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
       "<|message|>", "<|call|>"},
      {{"tokenizer.ggml.bos_token_id", "<|startoftext|>"}, {"tokenizer.ggml.eos_token_id", "<|return|>"}});
  ModelBundle b = open_model_bundle(path, true);
  const ModelSpec& s = b.model->spec();
  EXPECT_TRUE(stops(s, ids.at("<|return|>")));
  EXPECT_TRUE(stops(s, ids.at("<|call|>")));
  EXPECT_TRUE(stops(s, ids.at("<|endoftext|>")));
  EXPECT_FALSE(stops(s, ids.at("<|end|>")));
  for (const char* t : {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|startoftext|>"})
    EXPECT_FALSE(stops(s, ids.at(t))) << t;
  const std::vector<int32_t> got =
      b.tokenizer->encode("<|start|>assistant<|channel|>final<|message|>hi<|end|><|call|>");
  std::vector<int32_t> specials;
  for (int32_t id : got)
    if (b.tokenizer->is_special(id)) specials.push_back(id);
  EXPECT_EQ(specials, (std::vector<int32_t>{ids.at("<|start|>"), ids.at("<|channel|>"), ids.at("<|message|>"),
                                            ids.at("<|end|>"), ids.at("<|call|>")}));
  // A vocabulary with <|end|> but not the harmony pair (Phi-3's) keeps <|end|> as a stop.
  const auto [phi, phi_ids] = with_specials(tmp, src, "gpt-4o", {"<|endoftext|>", "<|end|>"}, {});
  EXPECT_TRUE(stops(gguf_model_spec(*gguf::GgufFile::open(phi)), phi_ids.at("<|end|>")));
}

// GLM-4.5: the converter names <|user|> the end of turn and <|observation|> the end of message (a
// tool call waiting for its result); both stop generation, with <|endoftext|>. [gMASK]<sop>, which
// the template writes, is read as its two control tokens.
TEST(GgufFamilies, GlmStopsAtUserAndObservation) {
  testing::TempDir tmp;
  const std::string src = write_spill_gguf(tmp, "glm4_moe_per_expert");
  const auto [path, ids] = with_specials(
      tmp, src, "glm4", {"<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"},
      {{"tokenizer.ggml.eos_token_id", "<|endoftext|>"}, {"tokenizer.ggml.bos_token_id", "[gMASK]"},
       {"tokenizer.ggml.eot_token_id", "<|user|>"}, {"tokenizer.ggml.eom_token_id", "<|observation|>"}});
  ModelBundle b = open_model_bundle(path, true);
  const ModelSpec& s = b.model->spec();
  for (const char* t : {"<|endoftext|>", "<|user|>", "<|observation|>"}) EXPECT_TRUE(stops(s, ids.at(t))) << t;
  for (const char* t : {"[gMASK]", "<sop>", "<|assistant|>", "<|system|>"}) EXPECT_FALSE(stops(s, ids.at(t))) << t;
  const std::vector<int32_t> got = b.tokenizer->encode("[gMASK]<sop><|user|>\nhi<|assistant|>");
  ASSERT_GE(got.size(), 4u);
  EXPECT_EQ(got[0], ids.at("[gMASK]"));
  EXPECT_EQ(got[1], ids.at("<sop>"));
  EXPECT_EQ(got[2], ids.at("<|user|>"));
  EXPECT_EQ(got.back(), ids.at("<|assistant|>"));
}

// ---- llama.cpp's logits on spill's files ---------------------------------------------------------

// tests/data/gguf/llamacpp/<fixture>.npy: llama.cpp's logits (CPU build, F32 KV cache, no flash
// attention) at each of its greedy steps on the F32 copy of spill's GGUF of the fixture, made by
// tools/llamacpp/family_logits.py; <fixture>.json: the prompt and llama.cpp's greedy ids. spill
// computes the same positions from the fixture. Both are fp32 throughout (the weights are the
// BF16 values exactly), in different orders of summation and with different exp/silu code, so they
// may differ by fp32 rounding only: the bound is the project's fp32 parity bound against
// transformers (1e-4 of the largest logit), and greedy tokens agree wherever llama.cpp's top two
// are further apart than twice that.
class LlamaCppLogits : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaCppLogits, AgreeWithSpillWithinFp32Rounding) {
  const std::string fixture = GetParam();
  const fs::path base = kGguf / "llamacpp" / fixture;
  const json meta = read_json_file(base.string() + ".json");
  const std::vector<int32_t> ids = meta["ids"].get<std::vector<int32_t>>();
  const int64_t n_prompt = meta["n_prompt"].get<int64_t>();
  const NpyArray llama = read_npy_f32(base.string() + ".npy");
  ModelSpec spec = load_model_spec((kParity / fixture).string());
  // gpt-oss's YaRN ramp is not truncated (transformers, spill); llama.cpp's rope always truncates
  // it to whole dims. The comparison is of everything else, so spill computes llama.cpp's ramp here.
  if (spec.arch == Arch::GptOss) spec.rope.truncate = true;
  auto model = Model::from_source(spec, open_safetensors_source((kParity / fixture).string(), spec));
  const std::vector<float> logits = testing::all_logits(*model, ids);
  const int64_t V = spec.vocab_size, steps = int64_t(ids.size()) - n_prompt;
  ASSERT_EQ(llama.shape, (std::vector<int64_t>{steps, V}));
  float scale = 0, worst = 0;
  for (float x : llama.data) scale = std::max(scale, std::abs(x));
  const float bound = 1e-4f * scale;
  for (int64_t t = 0; t < steps; ++t) {
    const float* s = logits.data() + (n_prompt - 1 + t) * V;
    const float* l = llama.data.data() + t * V;
    int64_t best = 0;
    for (int64_t v = 0; v < V; ++v) {
      worst = std::max(worst, std::abs(s[v] - l[v]));
      if (s[v] > s[best]) best = v;
    }
    float top = -INFINITY, second = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      if (l[v] > top) {
        second = top;
        top = l[v];
      } else if (l[v] > second) {
        second = l[v];
      }
    }
    if (top - second > 2 * bound) {
      EXPECT_EQ(best, ids[size_t(n_prompt + t)]) << "step " << t;
    }
  }
  EXPECT_LE(worst, bound) << "largest logit " << scale;
  RecordProperty("max_abs_logit_difference", std::to_string(worst));
  RecordProperty("largest_abs_logit", std::to_string(scale));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaCppLogits,
                         ::testing::Values("deepseek_v3_per_expert", "deepseek_v3_noqlora_per_expert",
                                           "glm4_moe_per_expert", "glm4_moe_noqknorm_per_expert", "gpt_oss_bf16"));

// ---- spill info on these files ------------------------------------------------------------------

std::string line_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return line;
  return "(no line '" + prefix + "')";
}

// The whitespace-separated fields of a line.
std::vector<std::string> fields(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string f; in >> f;) out.push_back(f);
  return out;
}

// spill info on a GGUF: the parameters of every class equal the safetensors model's; the bytes too
// for the classes whose tensors keep their type (the converter's layout widens norms, routers and
// biases to F32, exactly, so those classes grow by 2 bytes per such parameter); the KV cache per
// token is MLA's latent + rope key, not the expanded heads.
TEST(GgufFamilies, InfoReportsBytesByClassAndLatentKv) {
  if (!std::getenv("SPILL_BIN")) GTEST_SKIP() << "SPILL_BIN not set (run through ctest)";
  testing::TempDir tmp;
  for (const char* fixture : {"deepseek_v3_per_expert", "glm4_moe_per_expert", "gpt_oss_mxfp4"}) {
    const std::string path = write_spill_gguf(tmp, fixture);
    auto [rc_a, from_gguf] = run_spill("info --model " + path);
    auto [rc_b, from_dir] = run_spill("info --model " + (kParity / fixture).string());
    ASSERT_EQ(rc_a, 0) << from_gguf;
    ASSERT_EQ(rc_b, 0) << from_dir;
    const ModelSpec s = load_model_spec((kParity / fixture).string());
    const bool f32_biases_in_attention = s.attention_bias || s.attention_sinks;
    for (const char* cls : {"attention", "dense MLP", "shared experts", "routed experts", "embeddings"}) {
      const std::vector<std::string> g = fields(line_starting(from_gguf, std::string(cls) + " ")),
                                     d = fields(line_starting(from_dir, std::string(cls) + " "));
      const size_t at = std::string(cls).find(' ') == std::string::npos ? 1 : 2;  // fields of the name
      ASSERT_GT(g.size(), at + 1) << from_gguf;
      ASSERT_GT(d.size(), at + 1) << from_dir;
      EXPECT_EQ(g[at], d[at]) << fixture << " " << cls << ": parameters";
      const bool widened = (std::string(cls) == "attention" && f32_biases_in_attention) ||
                           (std::string(cls) == "routed experts" && s.expert_bias);
      if (!widened) {
        EXPECT_EQ(g[at + 1], d[at + 1]) << fixture << " " << cls << ": bytes";
      }
    }
    EXPECT_EQ(line_starting(from_gguf, "experts "), line_starting(from_dir, "experts ")) << fixture;
    if (!s.expert_bias) {
      EXPECT_EQ(line_starting(from_gguf, "bytes per routed expert"), line_starting(from_dir, "bytes per routed expert"));
    }
    const int64_t kv = s.attention == AttentionKind::Mla ? s.mla.kv_lora_rank + s.mla.qk_rope_head_dim
                                                         : 2 * s.n_kv_heads * s.head_dim;
    // Sliding-window layers (gpt-oss) keep a window, reported apart from the full-attention layers.
    int64_t sliding_layers = 0;
    for (int64_t l = 0; l < s.n_layers; ++l) sliding_layers += s.sliding(l) ? 1 : 0;
    std::string want = std::to_string(kv) + " values per token per layer (" +
                       (s.attention == AttentionKind::Mla ? "latent + rope key" : "K + V") + "), " +
                       std::to_string(kv * 4 * (s.n_layers - sliding_layers)) + " bytes per token";
    if (sliding_layers > 0)
      want += " in f32 over " + std::to_string(s.n_layers - sliding_layers) + " full-attention layers, plus " +
              std::to_string(kv * 4 * sliding_layers) + " bytes per token of the last " + std::to_string(s.sliding_window) +
              " over " + std::to_string(sliding_layers) + " sliding-window layers";
    EXPECT_NE(line_starting(from_gguf, "KV cache ").find(want), std::string::npos) << from_gguf;
    EXPECT_EQ(line_starting(from_gguf, "KV cache "), line_starting(from_dir, "KV cache "));
  }
}

}  // namespace
}  // namespace spill
