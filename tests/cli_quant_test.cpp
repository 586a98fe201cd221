// The quantization commands from outside, through the real executable: generate with ids in and
// out against transformers' greedy tokens, info --quant, eval, quantize -> GGUF -> dequant against
// spill's reference dequantizer of its quantizer, and a spill-written GGUF giving the same
// logits as the same mix quantized on load.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/npy.h"
#include "model/model.h"
#include "quant/quant.h"
#include "spill_process.h"

namespace fs = std::filesystem;

namespace {

using spill::test::run_command;
using spill::test::spill_bin;

std::string tiny() { return (fs::path(SPILL_SOURCE_DIR) / "models" / "spill-tiny").string(); }
std::string tmp(const std::string& name) {
  return (fs::temp_directory_path() / ("spill_cliq_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string join(const nlohmann::json& ids) {
  std::string s;
  for (int id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id);
  }
  return s;
}

#define NEED_BIN() \
  if (spill_bin().empty()) GTEST_SKIP() << "SPILL_BIN not set (run through ctest)"

TEST(CliQuant, GenerateIdsInIdsOutMatchesTransformersGreedy) {
  NEED_BIN();
  for (const char* c : {"llama_dense", "qwen3_moe_fused", "mixtral_per_expert"}) {
    const fs::path dir = fs::path(SPILL_TEST_DATA) / "parity" / c;
    std::ifstream in(dir / "expected.json");
    const auto e = nlohmann::json::parse(in);
    auto [status, text] = run_command(spill_bin() + " generate -q --ignore-eos --model " + dir.string() + " --prompt-ids " +
                              join(e["greedy_prompt"]) + " --print-ids -n " +
                              std::to_string(e["greedy_tokens"].size()));
    ASSERT_EQ(status, 0) << text;
    EXPECT_EQ(text, join(e["greedy_tokens"]) + "\n") << c;
  }
  auto [s, t] = run_command(spill_bin() + " generate --model " + (fs::path(SPILL_TEST_DATA) / "parity" / "llama_dense").string() +
                    " --prompt-ids 1,99999 --print-ids");
  EXPECT_EQ(s, 1);
  EXPECT_NE(t.find("99999"), std::string::npos) << t;
}

TEST(CliQuant, InfoQuantReportsTypesAndFallbacks) {
  NEED_BIN();
  auto [status, text] = run_command(spill_bin() + " info --model " + tiny() + " --quant q4_k_m");
  ASSERT_EQ(status, 0) << text;
  // spill-tiny's experts are 128 wide: their down projection's rows are half a 256-block.
  EXPECT_NE(text.find("experts expert down x64 (layers 0,1,3,4): Q4_K -> Q5_0"), std::string::npos) << text;
  EXPECT_NE(text.find("experts expert down x32 (layers 2,5): Q6_K -> Q8_0"), std::string::npos) << text;
  EXPECT_NE(text.find("Q4_K in layers 0,1,3,4; Q6_K in layers 2,5"), std::string::npos) << text;
  auto [s2, t2] = run_command(spill_bin() + " info --model " + tiny() + " --quant q4_k_m,experts=q9");
  EXPECT_EQ(s2, 1);
  EXPECT_NE(t2.find("'q9' is not a type"), std::string::npos) << t2;
}

TEST(CliQuant, EvalReportsPerplexityAndDivergence) {
  NEED_BIN();
  // The first 16 KB of the held-out text (38 windows of 128 tokens, 2394 scored): enough for every
  // figure checked below, in a sixth of the time of the whole file.
  const std::string text = tmp("heldout-16k.txt");
  {
    std::ifstream in(fs::path(SPILL_TEST_DATA) / "eval" / "heldout-python.txt", std::ios::binary);
    std::string head(16384, '\0');
    in.read(head.data(), std::streamsize(head.size()));
    head.resize(size_t(in.gcount()));
    head.resize(head.rfind('\n') + 1);  // whole lines
    std::ofstream(text, std::ios::binary) << head;
  }
  const std::string j1 = tmp("eval1.json"), j2 = tmp("eval2.json");
  auto [s1, t1] = run_command(spill_bin() + " eval --model " + tiny() + " --quant q4_k_m --reference " + tiny() +
                      " --text " + text + " --ctx 128 --json " + j1);
  ASSERT_EQ(s1, 0) << t1;
  auto [s2, t2] = run_command(spill_bin() + " eval --model " + tiny() + " --text " + text + " --ctx 128 --json " + j2);
  ASSERT_EQ(s2, 0) << t2;
  std::ifstream f1(j1), f2(j2);
  const auto a = nlohmann::json::parse(f1), b = nlohmann::json::parse(f2);
  fs::remove(j1), fs::remove(j2), fs::remove(text);
  EXPECT_EQ(a["n_scored"], a["n_windows"].get<int64_t>() * (128 - 1 - 64));
  EXPECT_DOUBLE_EQ(a["ref_ppl"].get<double>(), b["ppl"].get<double>());  // the reference is the unquantized model
  EXPECT_GT(a["kld_mean"].get<double>(), 0);
  EXPECT_GT(a["kld_p99"].get<double>(), a["kld_mean"].get<double>());
  EXPECT_GT(a["top1"].get<double>(), 0.5);
  EXPECT_NE(t1.find("mean KLD"), std::string::npos) << t1;
}

// spill quantize writes the quantized bytes; spill dequant reads them back from the GGUF by the
// file's own names and shapes. Each row equals dequantize(quantize(source row)) computed here.
TEST(CliQuant, QuantizeThenDequantEqualsTheReference) {
  NEED_BIN();
  const std::string gguf = tmp("q4km.gguf");
  auto [s, t] = run_command(spill_bin() + " quantize --model " + tiny() + " --quant q4_k_m --out " + gguf + " --threads 2");
  ASSERT_EQ(s, 0) << t;
  auto src = spill::Model::load(tiny());
  struct Case {
    const char* name;
    spill::DType type;
    std::vector<const spill::TensorView*> parts;  // the source views, one per expert for 3-D tensors
  };
  std::vector<Case> cases = {{"blk.2.attn_v.weight", spill::DType::Q6_K, {&src->layers[2].v}},
                             {"blk.0.attn_q.weight", spill::DType::Q4_K, {&src->layers[0].q}},
                             {"token_embd.weight", spill::DType::Q6_K, {&src->embed}}};
  Case gate{"blk.1.ffn_gate_exps.weight", spill::DType::Q4_K, {}}, down{"blk.3.ffn_down_exps.weight", spill::DType::Q5_0, {}};
  for (const auto& e : src->layers[1].experts) gate.parts.push_back(&e.gate);
  for (const auto& e : src->layers[3].experts) down.parts.push_back(&e.down);
  cases.push_back(gate);
  cases.push_back(down);
  for (const Case& c : cases) {
    const std::string npy = tmp("deq.npy");
    auto [s2, t2] = run_command(spill_bin() + " dequant --model " + gguf + " --tensor " + c.name + " --out " + npy);
    ASSERT_EQ(s2, 0) << t2;
    EXPECT_NE(t2.find(std::string(spill::dtype_name(c.type))), std::string::npos) << t2;
    const spill::NpyArray a = spill::read_npy_f32(npy);
    fs::remove(npy);
    const spill::TensorView& first = *c.parts.front();
    std::vector<int64_t> shape = {first.shape[0], first.shape[1]};
    if (c.parts.size() > 1) shape.insert(shape.begin(), int64_t(c.parts.size()));
    ASSERT_EQ(a.shape, shape) << c.name;
    const int64_t cols = first.cols();
    std::vector<float> row(static_cast<size_t>(cols)), want(static_cast<size_t>(cols));
    std::vector<uint8_t> q(size_t(spill::row_bytes(c.type, cols)));
    size_t at = 0;
    for (const spill::TensorView* v : c.parts)
      for (int64_t r = 0; r < v->rows(); ++r, at += size_t(cols)) {
        spill::quant::dequantize_row(v->dtype, v->row_data(r), row.data(), cols);
        spill::quant::quantize_row(c.type, row.data(), q.data(), cols);
        spill::quant::dequantize_row(c.type, q.data(), want.data(), cols);
        ASSERT_EQ(0, std::memcmp(want.data(), a.data.data() + at, size_t(cols) * 4)) << c.name << " row " << r;
      }
  }
  auto [s3, t3] = run_command(spill_bin() + " dequant --model " + gguf + " --tensor blk.0.attn_q --out /tmp/never.npy");
  EXPECT_EQ(s3, 1);
  EXPECT_NE(t3.find("blk.0.attn_q.weight"), std::string::npos) << t3;  // the near names are listed
  fs::remove(gguf);
}

// The GGUF holds the bytes quantize on load makes, norms and router widened to F32 (exactly), so
// the forward over the file is the forward over the quantized-on-load model, bit for bit.
TEST(CliQuant, SpillGgufGivesTheLogitsOfQuantizeOnLoad) {
  NEED_BIN();
  const std::string gguf = tmp("q3km.gguf"), a = tmp("a.npy"), b = tmp("b.npy");
  auto [s, t] = run_command(spill_bin() + " quantize --model " + tiny() + " --quant q3_k_m --out " + gguf + " --threads 2");
  ASSERT_EQ(s, 0) << t;
  const std::string ids = "1,872,90,3,4000,17,256,8191,2";
  auto [s1, t1] = run_command(spill_bin() + " logits --model " + gguf + " --ids " + ids + " --out " + a);
  ASSERT_EQ(s1, 0) << t1;
  auto [s2, t2] = run_command(spill_bin() + " logits --model " + tiny() + " --quant q3_k_m --ids " + ids + " --out " + b);
  ASSERT_EQ(s2, 0) << t2;
  const spill::NpyArray la = spill::read_npy_f32(a), lb = spill::read_npy_f32(b);
  EXPECT_EQ(la.shape, lb.shape);
  EXPECT_EQ(la.data, lb.data);
  fs::remove(gguf), fs::remove(a), fs::remove(b);
}

}  // namespace
