// The engine on a tiny random checkpoint of each family with its own attention and router
// (the parity fixtures of gpt_oss with MXFP4 experts, deepseek_v3 with latent attention, glm4_moe):
// batched, chunked, prefix-cached and preempted sequences give exactly the tokens of a plain greedy
// loop over a fresh runner, which shares no code with the engine's scheduling, paging or caching.
// gpt_oss's sliding window (5) is shorter than every prompt here, so windows cross block and
// chunk boundaries; deepseek_v3's KV blocks hold latents.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "model/model.h"
#include "model/runner.h"

namespace spill {
namespace {

namespace fs = std::filesystem;

fs::path fixture(const std::string& name) { return fs::path(SPILL_TEST_DATA) / "parity" / name; }

class EngineFamilies : public ::testing::TestWithParam<const char*> {
 protected:
  std::string dir() const { return fixture(GetParam()).string(); }

  std::unique_ptr<Engine> make_engine(int64_t n_blocks, const EngineConfig& config = {}, int32_t block_size = 8) {
    auto model = Model::load(dir());
    auto runner = make_cpu_runner(*model, {.block_size = block_size, .n_blocks = n_blocks}, 2);
    return std::make_unique<Engine>(EngineParts{.model = std::move(model), .runner = std::move(runner)}, config);
  }

  std::vector<int32_t> reference_greedy(const std::vector<int32_t>& prompt, int64_t n_new) {
    auto model = Model::load(dir());
    const int32_t bs = 16;
    const int64_t n_blocks = (int64_t(prompt.size()) + n_new + bs - 1) / bs;
    auto runner = make_cpu_runner(*model, {.block_size = bs, .n_blocks = n_blocks}, 1);
    std::vector<int32_t> table(static_cast<size_t>(n_blocks));
    std::iota(table.begin(), table.end(), 0);
    ForwardBatch batch;
    batch.tokens = prompt;
    batch.seqs.push_back(
        {.first_token = 0, .n_tokens = int32_t(prompt.size()), .start_pos = 0, .block_table = table, .want_logits = true});
    std::vector<float> logits;
    std::vector<int32_t> out;
    int32_t pos = int32_t(prompt.size());
    for (int64_t i = 0; i < n_new; ++i) {
      runner->forward(batch, logits);
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      batch.tokens = {next};
      batch.seqs[0].n_tokens = 1;
      batch.seqs[0].start_pos = pos++;
    }
    return out;
  }

  std::vector<int32_t> random_prompt(int64_t n, uint64_t seed) {
    const int64_t vocab = Model::load(dir())->spec().vocab_size;
    std::mt19937_64 rng(seed);
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int32_t& t : p) t = int32_t(3 + rng() % uint64_t(vocab - 3));
    return p;
  }

  static GenerationRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
    // ignore_eos: the fixtures' random weights may well pick their EOS id.
    return {.prompt = std::move(prompt), .sampling = {.temperature = 0.0f}, .max_tokens = max_tokens, .ignore_eos = true};
  }

  static void expect_all_blocks_free(const Engine& engine) {
    EngineMetrics m;
    for (int i = 0; i < 1000; ++i) {
      m = engine.metrics();
      if (m.running == 0 && m.waiting == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(m.kv_blocks_in_use, 0) << "KV blocks leaked";
  }
};

TEST_P(EngineFamilies, BatchedAndChunkedOutputsEqualEachRequestAlone) {
  const std::vector<int64_t> lengths = {7, 1, 13, 24, 9, 31};
  const int64_t n_new = 6;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) prompts.push_back(random_prompt(lengths[i], 50 + i));
  auto engine = make_engine(64, {.scheduler = {.max_running = 6, .max_batch_tokens = 20}});
  std::vector<RequestStream> streams;
  for (const auto& p : prompts) streams.push_back(engine->submit(greedy(p, n_new)));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestOutput out = streams[i].collect();
    ASSERT_TRUE(out.finish);
    EXPECT_EQ(out.finish->reason, FinishReason::Length) << out.finish->error;
    EXPECT_EQ(out.token_ids, reference_greedy(prompts[i], n_new)) << "request " << i;
  }
  expect_all_blocks_free(*engine);
}

TEST_P(EngineFamilies, SharedPrefixIsReusedAndOutputsStayExact) {
  const auto prefix = random_prompt(20, 9);  // two full blocks of 8 + 4 tokens
  auto a = prefix, b = prefix;
  a.insert(a.end(), {5, 6, 7});
  b.insert(b.end(), {8, 9, 10, 11, 12, 13, 14});
  auto engine = make_engine(32);
  const RequestOutput out_a = engine->submit(greedy(a, 5)).collect();
  const RequestOutput out_b = engine->submit(greedy(b, 5)).collect();
  EXPECT_EQ(out_a.finish->cached_tokens, 0);
  EXPECT_EQ(out_b.finish->cached_tokens, 16);
  EXPECT_EQ(out_a.token_ids, reference_greedy(a, 5));
  EXPECT_EQ(out_b.token_ids, reference_greedy(b, 5));
  expect_all_blocks_free(*engine);
}

TEST_P(EngineFamilies, PreemptionKeepsEveryOutputExact) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(random_prompt(10 + 5 * i, 300 + uint64_t(i)));
  const int64_t n_new = 12;
  // Longest: 30 + 12 = 42 tokens = 6 blocks of 8; all five together need ~23. Pool: 9.
  auto engine = make_engine(9, {.scheduler = {.max_running = 5, .max_batch_tokens = 32}});
  std::vector<RequestStream> streams;
  for (const auto& p : prompts) streams.push_back(engine->submit(greedy(p, n_new)));
  int32_t preemptions = 0;
  for (size_t i = 0; i < streams.size(); ++i) {
    const RequestOutput out = streams[i].collect();
    ASSERT_TRUE(out.finish);
    EXPECT_EQ(out.finish->reason, FinishReason::Length) << out.finish->error;
    EXPECT_EQ(out.token_ids, reference_greedy(prompts[i], n_new)) << "request " << i;
    preemptions += out.finish->preemptions;
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small for all at once";
  expect_all_blocks_free(*engine);
}

INSTANTIATE_TEST_SUITE_P(Families, EngineFamilies,
                         ::testing::Values("gpt_oss_mxfp4", "deepseek_v3_per_expert", "glm4_moe_per_expert"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace spill
