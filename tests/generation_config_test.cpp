// The one reader of generation_config.json that serve, generate and run-batch share.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/generation_config.h"

using spill::SamplingParams;
using spill::sampling_defaults_from_json;

TEST(GenerationConfig, SamplesOnlyWithDoSample) {
  SamplingParams p = sampling_defaults_from_json(nlohmann::json::parse(
      R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1})"));
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  // transformers: without do_sample, greedy; the sampling fields are inert, the penalty is not.
  p = sampling_defaults_from_json(nlohmann::json::parse(R"({"temperature": 0.6, "top_k": 20, "repetition_penalty": 1.1})"));
  EXPECT_TRUE(p.greedy());
  EXPECT_EQ(p.top_k, SamplingParams{}.top_k);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
}

TEST(GenerationConfig, NumbersOutOfRangeAreIgnoredNotCast) {
  // 1e38 as int32_t would be undefined behaviour; 7 is no probability; NaN-like strings are not numbers.
  const SamplingParams p = sampling_defaults_from_json(nlohmann::json::parse(
      R"({"do_sample": true, "temperature": 0.7, "top_k": 1e38, "top_p": 7, "min_p": "0.1", "repetition_penalty": -3})"));
  EXPECT_FLOAT_EQ(p.temperature, 0.7f);
  EXPECT_EQ(p.top_k, SamplingParams{}.top_k);
  EXPECT_FLOAT_EQ(p.top_p, SamplingParams{}.top_p);
  EXPECT_FLOAT_EQ(p.min_p, SamplingParams{}.min_p);
  EXPECT_FLOAT_EQ(p.repetition_penalty, SamplingParams{}.repetition_penalty);
  const SamplingParams q = sampling_defaults_from_json(nlohmann::json::parse(R"({"do_sample": true, "top_k": 2.5})"));
  EXPECT_EQ(q.top_k, SamplingParams{}.top_k);
}

TEST(GenerationConfig, FileMissingOrBroken) {
  const auto dir = std::filesystem::temp_directory_path() / "spill_generation_config_test";
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir / "generation_config.json");
  EXPECT_FLOAT_EQ(spill::load_sampling_defaults(dir.string()).temperature, SamplingParams{}.temperature);
  std::ofstream(dir / "generation_config.json") << "{\"do_sample\": tru";
  try {
    (void)spill::load_sampling_defaults(dir.string());
    FAIL() << "a broken file must be refused";
  } catch (const spill::Error& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}
