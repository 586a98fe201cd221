// The `spill` executable from outside: `spill logits` writes the same logits the parity fixtures
// hold, as a .npy file other tools can read; `spill info` and bad flags give clear output.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/npy.h"
#include "spill_process.h"

namespace fs = std::filesystem;

namespace {

using spill::test::run_command;
using spill::test::spill_bin;

TEST(Npy, RoundTrip) {
  const fs::path path = fs::temp_directory_path() / ("spill_npy_" + std::to_string(::getpid()) + ".npy");
  const std::vector<float> data = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.125f};
  spill::write_npy_f32(path.string(), data.data(), {2, 3});
  const spill::NpyArray a = spill::read_npy_f32(path.string());
  fs::remove(path);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.data, data);
}

TEST(Cli, LogitsMatchFixture) {
  if (spill_bin().empty()) GTEST_SKIP() << "SPILL_BIN not set (run through ctest)";
  const fs::path dir = fs::path(SPILL_TEST_DATA) / "parity" / "llama_dense";
  std::ifstream in(dir / "expected.json");
  const auto expected = nlohmann::json::parse(in);
  std::string ids;
  for (int id : expected["input_ids"]) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(id);
  }
  const fs::path out = fs::temp_directory_path() / ("spill_cli_logits_" + std::to_string(::getpid()) + ".npy");
  auto [status, text] = run_command(spill_bin() + " logits --model " + dir.string() + " --ids " + ids + " --out " + out.string());
  ASSERT_EQ(status, 0) << text;
  const spill::NpyArray a = spill::read_npy_f32(out.string());
  fs::remove(out);
  ASSERT_EQ(a.shape.size(), 2u);
  ASSERT_EQ(a.shape[0], int64_t(expected["input_ids"].size()));
  ASSERT_EQ(a.shape[1], int64_t(expected["logits"][0].size()));
  for (size_t r = 0; r < expected["logits"].size(); ++r) {
    double max_err = 0, max_ref = 0;
    for (size_t c = 0; c < expected["logits"][r].size(); ++c) {
      const double want = expected["logits"][r][c].get<double>();
      max_err = std::max(max_err, std::abs(a.data[r * size_t(a.shape[1]) + c] - want));
      max_ref = std::max(max_ref, std::abs(want));
    }
    EXPECT_LE(max_err / max_ref, 1e-5) << "row " << r;  // fp32 on both sides: see parity_test.cpp
  }
}

TEST(Cli, InfoPrintsBytesByClass) {
  if (spill_bin().empty()) GTEST_SKIP() << "SPILL_BIN not set (run through ctest)";
  auto [status, text] = run_command(spill_bin() + " info --model " + (fs::path(SPILL_TEST_DATA) / "parity" / "qwen3_moe_fused").string());
  ASSERT_EQ(status, 0) << text;
  EXPECT_NE(text.find("qwen3_moe"), std::string::npos) << text;
  EXPECT_NE(text.find("routed experts"), std::string::npos) << text;
  EXPECT_NE(text.find("bytes per routed expert"), std::string::npos) << text;
}

TEST(Cli, BadIdsAndMissingModelAreClearErrors) {
  if (spill_bin().empty()) GTEST_SKIP() << "SPILL_BIN not set (run through ctest)";
  auto [s1, t1] = run_command(spill_bin() + " logits --model " + (fs::path(SPILL_TEST_DATA) / "parity" / "llama_dense").string() +
                      " --ids 1,x,3 --out /tmp/never.npy");
  EXPECT_EQ(s1, 1);
  EXPECT_NE(t1.find("'x' is not a token id"), std::string::npos) << t1;
  auto [s2, t2] = run_command(spill_bin() + " info --model /nonexistent/model");
  EXPECT_EQ(s2, 1);
  EXPECT_NE(t2.find("/nonexistent/model"), std::string::npos) << t2;
  auto [s3, t3] = run_command(spill_bin() + " logits --model " + (fs::path(SPILL_TEST_DATA) / "parity" / "llama_dense").string() +
                      " --ids 1,100000 --out /tmp/never.npy");
  EXPECT_EQ(s3, 1);
  EXPECT_NE(t3.find("outside the vocabulary"), std::string::npos) << t3;
}

// --plan places experts for a GPU runner: a missing file is refused at parse time, and on the CPU
// (where every weight is in host RAM already) the plan is refused by name rather than ignored.
TEST(Cli, ExpertPlanIsRefusedClearlyWhereItCannotApply) {
  if (spill_bin().empty()) GTEST_SKIP() << "SPILL_BIN not set (run through ctest)";
  const std::string model = (fs::path(SPILL_TEST_DATA) / "parity" / "llama_dense").string();
  auto [s1, t1] = run_command(spill_bin() + " generate --device cpu --model " + model + " --prompt-ids 1,2 --max-tokens 1 --plan /nonexistent/plan.json");
  EXPECT_NE(s1, 0);
  EXPECT_NE(t1.find("/nonexistent/plan.json"), std::string::npos) << t1;
  const std::string some_file = (fs::path(SPILL_TEST_DATA) / "parity" / "llama_dense" / "config.json").string();
  // The bundled model (no --model): it has a tokenizer.
  auto [s2, t2] = run_command(spill_bin() + " generate --device cpu --prompt hi --max-tokens 1 --plan " + some_file);
  EXPECT_EQ(s2, 1);
  EXPECT_NE(t2.find("on --device cpu every weight is in host RAM already"), std::string::npos) << t2;
  // The expert cache caches host experts for a GPU: on the CPU it is refused the same way.
  auto [s3, t3] = run_command(spill_bin() + " generate --device cpu --prompt hi --max-tokens 1 --expert-cache-mem 1G");
  EXPECT_EQ(s3, 1);
  EXPECT_NE(t3.find("--expert-cache-mem"), std::string::npos) << t3;
  EXPECT_NE(t3.find("on --device cpu every weight is in host RAM already"), std::string::npos) << t3;
}

TEST(Cli, KvFormatIsCheckedAndTheCpuKeepsF32) {
  if (spill_bin().empty()) GTEST_SKIP() << "SPILL_BIN not set (run through ctest)";
  // The CPU runner has one format: asking it for another is refused by name; f32 runs.
  auto [s1, t1] = run_command(spill_bin() + " generate --device cpu --prompt hi --max-tokens 1 --kv-format fp8");
  EXPECT_EQ(s1, 1);
  EXPECT_NE(t1.find("--kv-format fp8: the CPU runner keeps its KV cache in f32"), std::string::npos) << t1;
  auto [s2, t2] = run_command(spill_bin() + " generate --device cpu --prompt hi --max-tokens 1 --kv-format f32");
  EXPECT_EQ(s2, 0) << t2;
  // A misspelt format fails at parse time, naming the flag and the formats there are.
  auto [s3, t3] = run_command(spill_bin() + " generate --device cpu --prompt hi --max-tokens 1 --kv-format fp4");
  EXPECT_NE(s3, 0);
  EXPECT_NE(t3.find("--kv-format: unknown KV format \"fp4\""), std::string::npos) << t3;
  auto [s4, t4] = run_command(spill_bin() + " serve --device cpu --port 0 --kv-format int8");
  EXPECT_NE(s4, 0);
  EXPECT_NE(t4.find("unknown KV format \"int8\""), std::string::npos) << t4;
}

}  // namespace
