// spill's CPU forward against Hugging Face transformers, on random tiny checkpoints of every
// architecture and both expert layouts (fixtures made by tools/fixtures/make_parity_fixtures.py),
// and on the bundled spill-tiny (fixture made by tools/train/train_spill_tiny.py).
//
// Tolerances come from the arithmetic: both sides compute in fp32 from the same stored weights,
// differing only in summation order, so the logits agree to ~1e-6 of the row's largest logit
// (measured: under 9.4e-7 on every fixture but gpt_oss, whose experts are drawn to drive the
// clamped SwiGLU past its limit: activations of tens amplify the rounding layer by layer, 2e-7 ->
// 3e-6 in the hidden states and 7.7e-6 in the logits, growing smoothly as rounding does). The
// limit, 1e-5, is the bar of 1e-4 with a margin; a wrong norm, rope, mask or routing
// weight is off by 1e-2 or more (and shows in the first layer's hidden states).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "formats/npy.h"
#include "model/model.h"
#include "model/runner.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const fs::path kParityDir = fs::path(SPILL_TEST_DATA) / "parity";
const fs::path kSpillTinyFixture = fs::path(SPILL_TEST_DATA) / "spill-tiny" / "expected.json";

std::vector<std::string> parity_cases() {
  std::vector<std::string> names;
  if (fs::is_directory(kParityDir))
    for (const auto& entry : fs::directory_iterator(kParityDir))
      if (fs::exists(entry.path() / "expected.json")) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

struct RouterRecorder : spill::ForwardObserver {
  std::map<int, std::vector<std::vector<int32_t>>> topk;  // layer -> token -> ids
  std::map<std::string, std::map<int, std::vector<float>>> tensors;  // name -> layer -> [rows, cols]
  void on_router(int layer, int64_t n, int64_t k, const int32_t* ids, const float*) override {
    auto& rows = topk[layer];
    for (int64_t t = 0; t < n; ++t) rows.emplace_back(ids + t * k, ids + (t + 1) * k);
  }
  void on_tensor(const char* name, int layer, const float* data, int64_t rows, int64_t cols) override {
    tensors[name][layer].assign(data, data + rows * cols);
  }
};

// Hidden states layer by layer, where the fixture has them (make_family_fixtures.py writes
// attn_residual.npy and layer_out.npy, [layers, tokens, hidden]): the first layer and tensor that
// drift says where a family's forward goes wrong. Same fp32 arithmetic as the logits: the limit
// is relative to the largest value of the layer's tensor.
void check_hidden_states(const fs::path& dir, const RouterRecorder& rec, double tolerance) {
  for (const char* name : {"attn_residual", "layer_out"}) {
    const fs::path file = dir / (std::string(name) + ".npy");
    if (!fs::exists(file)) continue;
    const spill::NpyArray want = spill::read_npy_f32(file.string());
    ASSERT_EQ(want.shape.size(), 3u) << file;
    const int64_t L = want.shape[0], per_layer = want.shape[1] * want.shape[2];
    auto it = rec.tensors.find(name);
    ASSERT_NE(it, rec.tensors.end()) << "the forward reported no " << name;
    for (int64_t l = 0; l < L; ++l) {
      auto got = it->second.find(int(l));
      ASSERT_NE(got, it->second.end()) << name << " of layer " << l;
      ASSERT_EQ(int64_t(got->second.size()), per_layer) << name << " of layer " << l;
      double max_err = 0, max_ref = 0;
      for (int64_t i = 0; i < per_layer; ++i) {
        max_err = std::max(max_err, std::abs(double(got->second[size_t(i)]) - want.data[size_t(l * per_layer + i)]));
        max_ref = std::max(max_ref, std::abs(double(want.data[size_t(l * per_layer + i)])));
      }
      std::printf("    %s layer %lld: max relative error %.3g\n", name, static_cast<long long>(l), max_err / max_ref);
      EXPECT_LE(max_err / max_ref, tolerance) << name << " of layer " << l << " drifts first";
      if (max_err / max_ref > tolerance) return;  // later layers inherit the drift
    }
  }
}

// Runs a whole sequence through a fresh runner, one chunk, logits for every position.
std::vector<float> all_logits(spill::ModelRunner& runner, const std::vector<int32_t>& ids,
                              spill::ForwardObserver* observer = nullptr) {
  const int32_t bs = runner.kv_config().block_size;
  // One table per KV group (gpt-oss: full and sliding-window layers), on disjoint blocks.
  const spill::HandBuiltTables tables = spill::hand_built_tables(runner.spec(), (int64_t(ids.size()) + bs - 1) / bs);
  spill::ForwardBatch batch;
  batch.tokens = ids;
  batch.seqs.push_back(
      {.first_token = 0, .n_tokens = int32_t(ids.size()), .start_pos = 0, .block_table = tables.tables[0]});
  tables.attach(batch.seqs.back());
  batch.all_logits = true;
  std::vector<float> logits;
  runner.forward(batch, logits, observer);
  return logits;
}

int32_t argmax(const float* row, int64_t n) {
  return int32_t(std::max_element(row, row + n) - row);  // first maximum, as torch.argmax
}

// Greedy decoding through the KV cache: prefill the prompt, then one token per step.
std::vector<int32_t> greedy(spill::ModelRunner& runner, const std::vector<int32_t>& prompt, int n_new) {
  const int32_t bs = runner.kv_config().block_size;
  const int64_t vocab = runner.spec().vocab_size;
  const spill::HandBuiltTables tables =
      spill::hand_built_tables(runner.spec(), (int64_t(prompt.size()) + n_new + bs - 1) / bs);
  std::vector<int32_t> out;
  spill::ForwardBatch batch;
  batch.tokens = prompt;
  batch.seqs.push_back({.first_token = 0, .n_tokens = int32_t(prompt.size()), .start_pos = 0,
                        .block_table = tables.tables[0], .want_logits = true});
  tables.attach(batch.seqs.back());
  std::vector<float> logits;
  int32_t pos = int32_t(prompt.size());
  for (int i = 0; i < n_new; ++i) {
    runner.forward(batch, logits);
    const int32_t next = argmax(logits.data(), vocab);
    out.push_back(next);
    batch.tokens = {next};
    batch.seqs[0].n_tokens = 1;
    batch.seqs[0].start_pos = pos++;
  }
  return out;
}

// max |a - b| / max |b| over one row.
double row_relative_error(const float* got, const std::vector<float>& want) {
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    max_err = std::max(max_err, std::abs(double(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::abs(double(want[i])));
  }
  return max_err / max_ref;
}

void check_against_fixture(const fs::path& model_dir, const json& expected, double tolerance) {
  auto model = spill::Model::load(model_dir.string());
  const int64_t vocab = model->spec().vocab_size;
  const auto ids = expected["input_ids"].get<std::vector<int32_t>>();
  // Block size 5 puts block boundaries inside the sequence, so paging is exercised.
  auto runner = spill::make_cpu_runner(*model, {.block_size = 5, .n_blocks = 64});
  RouterRecorder router;
  const std::vector<float> logits = all_logits(*runner, ids, &router);

  std::vector<int64_t> positions;
  if (expected.contains("logits_positions")) {
    positions = expected["logits_positions"].get<std::vector<int64_t>>();
  } else {
    positions.resize(ids.size());
    std::iota(positions.begin(), positions.end(), 0);
  }
  ASSERT_EQ(expected["logits"].size(), positions.size());
  double worst = 0;
  for (size_t r = 0; r < positions.size(); ++r) {
    const auto want = expected["logits"][r].get<std::vector<float>>();
    ASSERT_EQ(int64_t(want.size()), vocab);
    const double err = row_relative_error(logits.data() + positions[r] * vocab, want);
    worst = std::max(worst, err);
    EXPECT_LE(err, tolerance) << "position " << positions[r];
  }
  ::testing::Test::RecordProperty("max_relative_error", std::to_string(worst));
  std::printf("    logits max relative error %.3g (limit %.0e)\n", worst, tolerance);

  check_hidden_states(model_dir, router, tolerance);

  if (expected.contains("router_topk") && !expected["router_topk"].is_null()) {
    const json& layers = expected["router_topk"];
    ASSERT_EQ(int64_t(layers.size()), model->spec().n_layers);
    for (size_t l = 0; l < layers.size(); ++l) {
      const auto want = layers[l].get<std::vector<std::vector<int32_t>>>();
      if (want.empty()) {
        EXPECT_FALSE(model->spec().layer_is_moe[l]) << "layer " << l;
        continue;
      }
      ASSERT_TRUE(router.topk.count(int(l))) << "layer " << l << " routed no tokens";
      EXPECT_EQ(router.topk[int(l)], want) << "expert ids differ at layer " << l;
    }
  }

  const auto prompt = expected["greedy_prompt"].get<std::vector<int32_t>>();
  const auto want_tokens = expected["greedy_tokens"].get<std::vector<int32_t>>();
  auto decode_runner = spill::make_cpu_runner(*model, {.block_size = 4, .n_blocks = 64});
  EXPECT_EQ(greedy(*decode_runner, prompt, int(want_tokens.size())), want_tokens);
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, MatchesTransformers) {
  const fs::path dir = kParityDir / GetParam();
  check_against_fixture(dir, read_json(dir / "expected.json"), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::ValuesIn(parity_cases()),
                         [](const auto& info) { return info.param; });

TEST(ParityFixtures, Present) {
  // Without fixtures the parameterised test above would silently run nothing.
  const auto cases = parity_cases();
  ASSERT_FALSE(cases.empty()) << kParityDir << " has no fixtures: run tools/fixtures/make_parity_fixtures.py "
                              << "(needs torch + transformers; see tools/README.md)";
  for (const char* arch : {"qwen3_moe", "mixtral", "olmoe", "qwen3", "llama", "gpt_oss", "deepseek_v3", "glm4_moe"}) {
    bool found = false;
    for (const auto& c : cases) found |= c.rfind(arch, 0) == 0;
    EXPECT_TRUE(found) << "no parity fixture for " << arch;
  }
  for (const char* layout : {"per_expert", "fused", "mxfp4"}) {
    bool found = false;
    for (const auto& c : cases) found |= c.find(layout) != std::string::npos;
    EXPECT_TRUE(found) << "no parity fixture with the " << layout << " expert layout";
  }
}

// spill-tiny is stored in bf16 and both sides compute in fp32 from those values: the same
// reasoning and limit as above (the bar for it is 1e-3).
TEST(SpillTinyParity, MatchesTransformers) {
  ASSERT_TRUE(fs::exists(kSpillTinyFixture)) << kSpillTinyFixture << " is missing: run tools/train/train_spill_tiny.py";
  check_against_fixture(fs::path(SPILL_SOURCE_DIR) / "models/spill-tiny", read_json(kSpillTinyFixture), 1e-5);
}

}  // namespace
