// Models, tokenizers and chat templates from GGUF files against the same model from its Hugging
// Face folder. The weights are the same bytes (BF16 both ways; norms F32 in llama.cpp's files,
// which is exact), and spill's matmul accumulates every dtype in one order, so the logits must be
// bit-identical, including for `llama`-arch files whose q/k rows spill un-permutes.
//
// Two kinds of files: ones spill's writer makes here from tests/test_models.h models (always
// run), and ones llama.cpp's convert_hf_to_gguf.py made under /work/gguf (skipped with a message
// where absent; tools/gpu/convert_gguf.sh makes them, see /work/gguf/README.md).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/model_bundle.h"
#include "formats/gguf.h"
#include "gguf_helpers.h"
#include "model/model.h"
#include "quant/quant_mix.h"
#include "spill_process.h"
#include "test_models.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace spill {
namespace {

using test::run_spill;
using testing::spill_tiny_dir;

namespace fs = std::filesystem;

const std::vector<int32_t> kIds = {5, 17, 200, 3, 99, 42, 250, 7, 7, 128, 64, 1, 0, 255, 33, 18, 77, 190, 2};

void expect_same_logits(const Model& a, const Model& b, const std::vector<int32_t>& ids) {
  const std::vector<float> la = testing::all_logits(a, ids), lb = testing::all_logits(b, ids);
  ASSERT_EQ(la.size(), lb.size());
  size_t differ = 0;
  for (size_t i = 0; i < la.size(); ++i) differ += la[i] != lb[i];
  EXPECT_EQ(differ, 0u) << "of " << la.size() << " logits, e.g. " << la[0] << " vs " << lb[0];
}

TEST(GgufModel, WrittenQwen3MoeEqualsItsSafetensors) {
  testing::TempDir dir;
  testing::write_random_model(dir.sub("hf"), {.vocab_size = 256, .n_layers = 3, .dense_layers = {1}, .seed = 11});
  testing::hf_to_gguf(dir.sub("hf"), dir.sub("m.gguf"), "qwen3moe");
  auto hf = Model::load(dir.sub("hf"));
  auto gg = Model::load(dir.sub("m.gguf"));
  EXPECT_EQ(gg->spec().arch, Arch::Qwen3Moe);
  EXPECT_EQ(gg->spec().layer_is_moe, hf->spec().layer_is_moe);
  EXPECT_EQ(gg->spec().rms_norm_eps, 1e-6);  // recovered exactly from the f32 the file stores
  EXPECT_TRUE(gg->spec().norm_topk_prob);
  // expert e of a fused GGUF tensor is served from the mapped file: its own contiguous slice
  const auto* exps = gg->source().tensors().at("blk.0.ffn_up_exps.weight").data;
  const TensorView& up3 = gg->layers[0].experts[3].up;
  EXPECT_EQ(up3.data, static_cast<const uint8_t*>(exps) + 3 * up3.nbytes());
  expect_same_logits(*hf, *gg, kIds);
}

TEST(GgufModel, WrittenQwen3DenseTiedEqualsItsSafetensors) {
  testing::TempDir dir;
  testing::write_random_model(dir.sub("hf"), {.n_experts = 0, .tie_word_embeddings = true, .seed = 5});
  testing::hf_to_gguf(dir.sub("hf"), dir.sub("m.gguf"), "qwen3", {.alignment = 64});
  auto hf = Model::load(dir.sub("hf"));
  auto gg = Model::load(dir.sub("m.gguf"));
  EXPECT_TRUE(gg->spec().tie_word_embeddings);
  expect_same_logits(*hf, *gg, kIds);
}

// A `llama` file holds q/k rows permuted for ggml's interleaved rope; spill un-permutes them, so
// the model computes what the Hugging Face weights compute with rotate-half rope.
TEST(GgufModel, LlamaArchRowsAreUnpermuted) {
  testing::TempDir dir;
  testing::write_random_model(dir.sub("hf"), {.n_heads = 4, .n_kv_heads = 2, .n_experts = 0, .seed = 3});
  testing::hf_to_gguf(dir.sub("hf"), dir.sub("m.gguf"), "llama");
  auto gg = Model::load(dir.sub("m.gguf"));
  EXPECT_EQ(gg->spec().arch, Arch::Llama);
  // The same weights as a Llama (no q/k norm) from the safetensors folder.
  ModelSpec spec = load_model_spec(dir.sub("hf"));
  spec.arch = Arch::Llama;
  spec.qk_norm = QkNorm::None;
  auto hf = Model::from_source(spec, open_safetensors_source(dir.sub("hf"), spec));
  expect_same_logits(*hf, *gg, kIds);
  // Not a vacuous comparison: read without un-permuting (as qwen3, whose files are not permuted)
  // the rows give different logits.
  auto raw = gguf::GgufFile::open(dir.sub("m.gguf"));
  ModelSpec as_is = gguf_model_spec(*raw);
  as_is.arch = Arch::Qwen3;  // same forward as Llama without q/k norm, but no un-permutation
  std::shared_ptr<const gguf::GgufFile> shared = std::move(raw);
  auto unpermuted = Model::from_source(as_is, open_gguf_source(shared, as_is));
  EXPECT_NE(testing::all_logits(*unpermuted, kIds), testing::all_logits(*hf, kIds));
}

// The un-permutation moves whole rows, so it holds for block formats: a Q8_0 `llama` file with the
// converter's row order computes bit for bit what the same Q8_0 rows in Hugging Face order compute.
TEST(GgufModel, LlamaArchQuantizedRowsAreUnpermuted) {
  testing::TempDir dir;
  testing::write_random_model(dir.sub("hf"), {.n_heads = 4, .n_kv_heads = 2, .n_experts = 0, .seed = 9});
  testing::hf_to_gguf(dir.sub("hf"), dir.sub("permuted.gguf"), "llama", {.matrices = DType::Q8_0});
  testing::hf_to_gguf(dir.sub("hf"), dir.sub("hf_order.gguf"), "llama",
                      {.matrices = DType::Q8_0, .permute_llama = false});
  auto gg = Model::load(dir.sub("permuted.gguf"));
  EXPECT_EQ(gg->layers[0].q.dtype, DType::Q8_0);
  std::shared_ptr<const gguf::GgufFile> plain = gguf::GgufFile::open(dir.sub("hf_order.gguf"));
  ModelSpec spec = gguf_model_spec(*plain);
  spec.arch = Arch::Qwen3;  // the same forward (no q/k norm in the file), rows taken as they are
  auto reference = Model::from_source(spec, open_gguf_source(plain, spec));
  expect_same_logits(*reference, *gg, kIds);
}

void write_with_arch(const std::string& path, const std::string& arch, const std::string& tokenizer_model = "gpt2") {
  gguf::Writer w;
  static std::vector<float> embd(64 * 8);
  w.set("general.architecture", gguf::Value::string(arch));
  w.set("tokenizer.ggml.model", gguf::Value::string(tokenizer_model));
  w.add_tensor("token_embd.weight", DType::F32, {8, 64}, embd.data());
  w.write(path);
}

// The error opening `path` as a model bundle gives, or "" when it opens.
std::string bundle_load_error(const std::string& path) {
  try {
    open_model_bundle(path, true);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GgufModel, UnsupportedArchitectureAndTokenizerAreRefusedUpFront) {
  testing::TempDir dir;
  write_with_arch(dir.sub("a.gguf"), "gemma3");
  EXPECT_NE(bundle_load_error(dir.sub("a.gguf")).find("general.architecture 'gemma3' is not supported"), std::string::npos);
  testing::write_random_model(dir.sub("hf"), {.n_experts = 0, .seed = 2});
  testing::hf_to_gguf(dir.sub("hf"), dir.sub("m.gguf"), "qwen3");
  const std::string msg = bundle_load_error(dir.sub("m.gguf"));
  EXPECT_NE(msg.find("no tokenizer"), std::string::npos) << msg;
}

// Hyperparameters from `<arch>.*` keys: a minimal qwen3moe header plus the keys under test.
ModelSpec spec_with(const testing::TempDir& dir, const std::vector<std::pair<std::string, gguf::Value>>& extra,
                    bool rope_freqs = false) {
  gguf::Writer w;
  static std::vector<float> embd(64 * 8), freqs(8);
  w.set("general.architecture", gguf::Value::string("qwen3moe"));
  for (auto [k, v] : std::vector<std::pair<std::string, gguf::Value>>{
           {"qwen3moe.block_count", gguf::Value::u32(2)}, {"qwen3moe.embedding_length", gguf::Value::u32(64)},
           {"qwen3moe.attention.head_count", gguf::Value::u32(4)}, {"qwen3moe.expert_count", gguf::Value::u32(8)},
           {"qwen3moe.expert_used_count", gguf::Value::u32(2)},
           {"qwen3moe.expert_feed_forward_length", gguf::Value::u32(32)}})
    w.set(k, v);
  for (const auto& [k, v] : extra) w.set(k, v);
  w.add_tensor("token_embd.weight", DType::F32, {8, 64}, embd.data());
  w.add_tensor("blk.0.ffn_gate_inp.weight", DType::F32, {8, 64}, embd.data());
  if (rope_freqs) w.add_tensor("rope_freqs.weight", DType::F32, {8}, freqs.data());
  w.write(dir.sub("s.gguf"));
  return gguf_model_spec(*gguf::GgufFile::open(dir.sub("s.gguf")));
}

TEST(GgufModel, SpecFromMetadata) {
  testing::TempDir dir;
  ModelSpec s = spec_with(dir, {{"qwen3moe.rope.scaling.type", gguf::Value::string("yarn")},
                                {"qwen3moe.rope.scaling.factor", gguf::Value::f32(4.0f)},
                                {"qwen3moe.rope.scaling.original_context_length", gguf::Value::u32(32768)},
                                {"qwen3moe.rope.freq_base", gguf::Value::f32(1000000.0f)},
                                {"qwen3moe.context_length", gguf::Value::u32(131072)},
                                {"qwen3moe.feed_forward_length", gguf::Value::u32(64)}});
  EXPECT_EQ(s.rope.kind, RopeKind::Yarn);
  EXPECT_EQ(s.rope.factor, 4.0);
  EXPECT_EQ(s.rope.original_max_position, 32768);
  EXPECT_EQ(s.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(s.rope.attention_factor, 0.1 * std::log(4.0) + 1.0);  // transformers' yarn default
  EXPECT_EQ(s.head_dim, 16);  // embedding_length / head_count without key_length
  EXPECT_EQ(s.n_kv_heads, 4);
  // layer 0 has a router, layer 1 does not: a dense layer (qwen3moe's mlp_only_layers)
  EXPECT_EQ(s.layer_is_moe, (std::vector<bool>{true, false}));
  auto message = [&](const std::vector<std::pair<std::string, gguf::Value>>& extra, bool freqs = false) {
    try {
      spec_with(dir, extra, freqs);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({{"qwen3moe.feed_forward_length", gguf::Value::u32(64)}}, true).find("rope_freqs.weight"),
            std::string::npos);
  EXPECT_NE(message({{"qwen3moe.attention.value_length", gguf::Value::u32(8)}}).find("value_length"), std::string::npos);
  EXPECT_NE(message({{"qwen3moe.rope.scaling.type", gguf::Value::string("longrope")}}).find("'longrope'"),
            std::string::npos);
  EXPECT_NE(message({{"qwen3moe.expert_used_count", gguf::Value::u32(9)}}).find("expert_used_count (9)"),
            std::string::npos);
  EXPECT_NE(message({{"qwen3moe.block_count", gguf::Value::string("2")}}).find("'qwen3moe.block_count' is a string"),
            std::string::npos);
  // a dense layer needs feed_forward_length
  EXPECT_NE(message({}).find("feed_forward_length"), std::string::npos);
}

// ---- files made by llama.cpp's converter ------------------------------------------------------

const char* gguf_dir() {
  const char* env = std::getenv("SPILL_GGUF_DIR");
  return env ? env : "/work/gguf";
}

#define REQUIRE_FILE(path)                                                                            \
  if (!fs::exists(path))                                                                              \
  GTEST_SKIP() << path << " is absent (llama.cpp-converted test files; tools/gpu/convert_gguf.sh makes " \
                          "them, SPILL_GGUF_DIR points at them)"

class ConvertedGguf : public ::testing::TestWithParam<std::string> {};

TEST_P(ConvertedGguf, LogitsEqualTheSafetensorsOriginal) {
  const std::string arch = GetParam();
  const std::string gguf_path = fmt::format("{}/{}-bf16.gguf", gguf_dir(), arch);
  const std::string hf_dir = fmt::format("{}/hf/{}", gguf_dir(), arch);
  REQUIRE_FILE(gguf_path);
  REQUIRE_FILE(hf_dir);
  auto gg = Model::load(gguf_path);
  ModelSpec spec = load_model_spec(hf_dir);
  // llama.cpp's converter writes 1e-5 as OLMoE's norm epsilon whatever config.json says
  // (conversion/olmo.py, OlmoeModel.set_gguf_parameters); llama.cpp runs the file with 1e-5, and
  // so does spill. Compare against the original at the file's epsilon.
  if (arch.starts_with("olmoe")) {
    EXPECT_EQ(gg->spec().rms_norm_eps, 1e-5);
    spec.rms_norm_eps = gg->spec().rms_norm_eps;
  }
  EXPECT_EQ(gg->spec().rms_norm_eps, spec.rms_norm_eps);
  EXPECT_EQ(gg->spec().n_experts, spec.n_experts);
  EXPECT_EQ(gg->spec().norm_topk_prob, spec.norm_topk_prob);
  EXPECT_EQ(gg->spec().tie_word_embeddings, spec.tie_word_embeddings);
  EXPECT_EQ(gg->spec().moe_intermediate_size, spec.moe_intermediate_size);
  EXPECT_EQ(gg->spec().max_position_embeddings, spec.max_position_embeddings);
  auto hf = Model::from_source(spec, open_safetensors_source(hf_dir, spec));
  std::vector<int32_t> ids = kIds;
  for (int32_t i = 0; i < 40; ++i) ids.push_back((i * 977 + 13) % 8192);
  expect_same_logits(*hf, *gg, ids);
}

INSTANTIATE_TEST_SUITE_P(Archs, ConvertedGguf,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe", "olmoe_mha", "qwen3", "llama"));

std::string spill_tiny_gguf() { return fmt::format("{}/spill-tiny-bf16.gguf", gguf_dir()); }
TEST(ConvertedGgufSpillTiny, LogitsEqualTheBundledModel) {
  REQUIRE_FILE(spill_tiny_gguf());
  auto gg = Model::load(spill_tiny_gguf());
  auto hf = Model::load(spill_tiny_dir());
  expect_same_logits(*hf, *gg, kIds);
  std::vector<int32_t> a = gg->spec().eos_token_ids, b = hf->spec().eos_token_ids;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
}

// llama-quantize's k-quant mixes of spill-tiny: its experts are 128 wide, so every mix stores the
// routed experts' down projection (128-weight rows) in a legacy 32-weight type (Q4_0, Q5_0, Q5_1,
// IQ4_NL) or Q8_0. Each file loads, every layer's experts have the type llama-quantize's mix gives
// them (spill's preset table, itself checked against these files by quant_mix_llama_test), and the
// forward gives finite logits. (Their logits against llama.cpp's: tools/llamacpp/README.md.)
class LlamaQuantizedSpillTiny : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaQuantizedSpillTiny, LoadsWithLegacyFallbackTypesAndRuns) {
  const std::string preset = GetParam();
  std::string upper = preset;
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  const std::string path = fmt::format("{}/spill-tiny-{}.gguf", gguf_dir(), upper);
  REQUIRE_FILE(path);
  auto gg = Model::load(path);
  const ModelSpec& sp = gg->spec();
  const quant::MixModelShape shape{.n_layers = int32_t(sp.n_layers), .n_heads = int32_t(sp.n_heads),
                                   .n_kv_heads = int32_t(sp.n_kv_heads), .n_experts = int32_t(sp.n_experts),
                                   .tied_embeddings = gg->lm_head.data == gg->embed.data};
  const quant::QuantMix mix = quant::parse_quant_mix(preset);
  int legacy = 0;
  for (int32_t l = 0; l < int32_t(sp.n_layers); ++l) {
    const ExpertWeights& e = gg->layers[size_t(l)].experts.at(0);
    const quant::TypeChoice want = quant::resolve_tensor_type(
        mix, shape, {.kind = quant::TensorKind::FfnDown, .ffn = quant::FfnOwner::Routed, .layer = l, .cols = e.down.cols()});
    EXPECT_EQ(dtype_name(e.down.dtype), dtype_name(want.type)) << path << " layer " << l;
    EXPECT_EQ(dtype_block_elems(e.down.dtype), 32) << path << " layer " << l;
    legacy += e.down.dtype != DType::Q8_0;
  }
  EXPECT_GT(legacy, 0) << path << ": no legacy 32-weight tensor";
  const std::vector<float> logits = testing::all_logits(*gg, kIds);
  ASSERT_EQ(logits.size(), kIds.size() * size_t(sp.vocab_size));
  for (float v : logits) ASSERT_TRUE(std::isfinite(v)) << path;
}

INSTANTIATE_TEST_SUITE_P(Mixes, LlamaQuantizedSpillTiny,
                         ::testing::Values("q5_k_m", "q4_k_m", "q3_k_m", "q2_k", "iq4_xs"));

// Awkward text: the tokenizer fixtures' cases plus code, whitespace runs, digits, CJK, emoji,
// combining marks (NFC), special tokens written in the text, and lone surrogates' neighbours.
std::vector<std::string> awkward_texts() {
  std::vector<std::string> t = {
      "",
      " ",
      "hello world",
      "  leading and trailing spaces   ",
      "tabs\tand\nnewlines\r\n\n\n  indented",
      "def f(x):\n    return x**2  # square\n\n\nclass A:\n\tpass",
      "1234567890 3.14159 1e-6 0x7fffffff 1,000,000",
      "I'm you're he'll she'd we've THEY'RE It'S",
      "日本語のテキストと中文和한국어",
      "emoji 🤖🚀👩‍👩‍👧 flags 🇫🇷",
      "e\xcc\x81 vs \xc3\xa9 (NFC) and ﬁ ligature",
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
      "<think>reasoning</think> <tool_call>{\"name\": \"f\"}</tool_call>",
      "<|endoftext|><|endoftext|>x<|im_end|",
      "a\u00a0b\u2003c\u3000d",
      "!!!???...,,,;;;:::---___+++===",
      "\xF0\x9F\x98\x80\xF0\x9F\x98\x81 mixed 😀 text",
  };
  const std::string cases = std::string(SPILL_TEST_DATA) + "/tokenizer/cases.json";
  if (fs::exists(cases)) {
    std::ifstream in(cases);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    std::function<void(const nlohmann::json&)> collect = [&](const nlohmann::json& v) {
      if (v.is_object()) {
        if (v.contains("text") && v["text"].is_string()) t.push_back(v["text"].get<std::string>());
        for (const auto& [k, x] : v.items()) collect(x);
      } else if (v.is_array()) {
        for (const auto& x : v) collect(x);
      }
    };
    collect(j);
  }
  return t;
}

// The tokenizer and template of spill-tiny as llama.cpp's converter wrote them: in the converted
// file under /work/gguf, and in tests/data/gguf/tiny-qwen3moe.gguf, which carries that file's
// metadata with the model shrunk (tools/fixtures/make_tiny_gguf.cpp), so these run everywhere.
class SpillTinyVocab : public ::testing::TestWithParam<std::string> {
 protected:
  std::string path() const {
    return GetParam() == "committed" ? std::string(SPILL_TEST_DATA) + "/gguf/tiny-qwen3moe.gguf" : spill_tiny_gguf();
  }
};

TEST_P(SpillTinyVocab, TokenizerEqualsTokenizerJson) {
  REQUIRE_FILE(path());
  auto file = gguf::GgufFile::open(path());
  const Tokenizer gg = gguf_tokenizer(*file);
  const Tokenizer hf = Tokenizer::from_file(spill_tiny_dir() + "/tokenizer.json");
  EXPECT_EQ(gg.vocab_size(), hf.vocab_size());
  size_t n = 0;
  for (const std::string& text : awkward_texts()) {
    std::vector<int32_t> a, b;
    try {
      b = hf.encode(text, true);
    } catch (const Error&) {
      EXPECT_THROW(gg.encode(text, true), Error) << text;  // invalid UTF-8 is refused by both
      continue;
    }
    a = gg.encode(text, true);
    EXPECT_EQ(a, b) << text;
    EXPECT_EQ(gg.decode(a), hf.decode(b)) << text;
    EXPECT_EQ(gg.decode(a, true), hf.decode(b, true)) << text;
    ++n;
  }
  EXPECT_GT(n, 20u);
  for (int32_t id = 0; id < hf.vocab_size(); ++id) {
    ASSERT_EQ(gg.token_text(id), hf.token_text(id)) << id;
    ASSERT_EQ(gg.is_special(id), hf.is_special(id)) << id;
  }
}

TEST_P(SpillTinyVocab, ChatTemplateRendersIdentically) {
  REQUIRE_FILE(path());
  const ChatTemplate gg = open_chat_template(path());
  const ChatTemplate hf = open_chat_template(spill_tiny_dir());
  ASSERT_TRUE(gg.has_template());
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
      "name": "read_file", "description": "Read a file", "parameters": {"type": "object",
      "properties": {"path": {"type": "string"}}, "required": ["path"]}}}])");
  const nlohmann::ordered_json conversations = nlohmann::ordered_json::parse(R"J([
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write fizzbuzz"},
     {"role": "assistant", "content": "for i in range(1, 101): ..."}, {"role": "user", "content": "thanks"}],
    [{"role": "user", "content": "show a.py"},
     {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "read_file",
       "arguments": {"path": "a.py"}}}]},
     {"role": "tool", "content": "print(1)"}]
  ])J");
  for (const auto& messages : conversations)
    for (bool gen : {false, true})
      for (bool with_tools : {false, true}) {
        const nlohmann::ordered_json t = with_tools ? tools : nlohmann::ordered_json();
        EXPECT_EQ(gg.render(messages, t, gen, nullptr), hf.render(messages, t, gen, nullptr)) << messages.dump();
      }
  EXPECT_EQ(gg.special_tokens().value("eos_token", ""), hf.special_tokens().value("eos_token", ""));
}

// ---- the spill executable on GGUF files ------------------------------------------------------

#define REQUIRE_SPILL_BIN() \
  if (!std::getenv("SPILL_BIN")) GTEST_SKIP() << "SPILL_BIN not set (run through ctest)"

TEST(GgufCli, GenerateInfoAndErrors) {
  REQUIRE_SPILL_BIN();
  const std::string tiny = std::string(SPILL_TEST_DATA) + "/gguf/tiny-qwen3moe.gguf";
  auto [rc, out] = run_spill("generate --model " + tiny + " -p 'def f(x):' -n 8 -t 0 -q");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.rfind("def f(x):", 0), 0u) << out;
  std::tie(rc, out) = run_spill("info --model " + tiny);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("qwen3moe (1 layers, hidden 16"), std::string::npos) << out;
  testing::TempDir dir;
  {
    std::ofstream f(dir.sub("bad.gguf"), std::ios::binary);
    f << "GGUF\x03";
  }
  std::tie(rc, out) = run_spill("generate --model " + dir.sub("bad.gguf") + " -p x -n 1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find(dir.sub("bad.gguf") + ": truncated"), std::string::npos) << out;
}

TEST(GgufCli, GreedyTextEqualsTheBundledModel) {
  REQUIRE_SPILL_BIN();
  REQUIRE_FILE(spill_tiny_gguf());
  const std::string args = " -p 'def fibonacci(n):' -n 48 -t 0 -q";
  const auto [rc_a, from_gguf] = run_spill("generate --model " + spill_tiny_gguf() + args);
  const auto [rc_b, from_dir] = run_spill("generate --model " + spill_tiny_dir() + args);
  EXPECT_EQ(rc_a, 0);
  EXPECT_EQ(rc_b, 0);
  EXPECT_EQ(from_gguf, from_dir);
}

INSTANTIATE_TEST_SUITE_P(Files, SpillTinyVocab, ::testing::Values("committed", "converted"));

// The committed file end to end through the bundle every command uses: model, tokenizer, EOS.
TEST(GgufBundle, CommittedFileOpensWithEverything) {
  const std::string path = std::string(SPILL_TEST_DATA) + "/gguf/tiny-qwen3moe.gguf";
  ModelBundle b = open_model_bundle(path, true);
  ASSERT_TRUE(b.tokenizer);
  const ModelSpec& s = b.model->spec();
  EXPECT_EQ(s.arch, Arch::Qwen3Moe);
  EXPECT_EQ(s.hidden_size, 16);
  EXPECT_EQ(s.vocab_size, 8192);
  EXPECT_TRUE(s.tie_word_embeddings);
  // eos 2 (<|im_end|>) from tokenizer.ggml.eos_token_id, then <|endoftext|> (0), a control token
  // that ends generation: what models/spill-tiny/generation_config.json lists.
  EXPECT_EQ(s.eos_token_ids, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(b.tokenizer->token_text(2), "<|im_end|>");
  EXPECT_FLOAT_EQ(b.sampling.temperature, 0.7f);  // general.sampling.temp
  const std::vector<float> logits = testing::all_logits(*b.model, b.tokenizer->encode("def f(x):\n    return x"));
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace spill
