// Routed-expert traffic on the CPU: the runner's counts (ModelRunner::expert_traffic) and the
// engine's copy of them (EngineMetrics::experts), on a tiny random Qwen3-MoE with a dense layer
// between its MoE layers (so a layer count is not an MoE-layer count) and top-k equal to the
// number of experts.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_harness.h"
#include "model/model.h"
#include "model/runner.h"
#include "test_models.h"

namespace spill {
namespace {

// 3 layers, layer 1 dense: 2 MoE layers of 4 experts, each token routed to all 4. spill-tiny's
// vocabulary, so its tokenizer serves the model over HTTP.
testing::RandomModelParams expert_traffic_model_params() {
  return {.vocab_size = 8192,
          .hidden_size = 64,
          .n_layers = 3,
          .n_experts = 4,
          .n_experts_per_token = 4,
          .dense_layers = {1},
          .max_position_embeddings = 512,
          .seed = 23};
}

class ExpertTrafficTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("spill-expert-traffic");
    testing::write_random_model(dir_->path(), expert_traffic_model_params());
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
      std::filesystem::copy_file(testing::spill_tiny_dir() + "/" + file, dir_->sub(file));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string model_dir() { return dir_->path(); }
  // Routings one token makes: one per slot of top-k in every MoE layer.
  static int64_t routings_per_token() {
    const testing::RandomModelParams p = expert_traffic_model_params();
    return p.n_experts_per_token * (p.n_layers - int64_t(p.dense_layers.size()));
  }

  static testing::TempDir* dir_;
};

testing::TempDir* ExpertTrafficTest::dir_ = nullptr;

TEST_F(ExpertTrafficTest, CpuRunnerCountsEachTokenOnceAndEverySlotOfEveryMoeLayer) {
  auto model = Model::load(model_dir());
  ASSERT_EQ(model->spec().n_moe_layers(), 2);
  ASSERT_EQ(model->spec().n_layers, 3);
  const int64_t blocks = 4;  // 64 positions
  auto runner = make_cpu_runner(*model, {.block_size = 16, .n_blocks = hand_built_pool_blocks(model->spec(), blocks)},
                                testing::kTestThreads);
  EXPECT_EQ(runner->expert_traffic().tokens, 0);
  EXPECT_EQ(runner->expert_traffic().routings, 0);

  const HandBuiltTables tables = hand_built_tables(model->spec(), blocks);
  ForwardBatch batch;
  for (int32_t i = 0; i < 19; ++i) batch.tokens.push_back(3 + 7 * i);
  batch.seqs.push_back(
      {.first_token = 0, .n_tokens = 19, .start_pos = 0, .block_table = tables.tables[0], .want_logits = true});
  tables.attach(batch.seqs.back(), /*first_in_slot=*/true);
  std::vector<float> logits;
  runner->forward(batch, logits);
  ExpertTraffic t = runner->expert_traffic();
  EXPECT_EQ(t.tokens, 19);
  EXPECT_EQ(t.routings, 19 * routings_per_token());
  EXPECT_GT(t.step_seconds, 0.0);

  // One decode token, then every token's logits: each forward adds its tokens once.
  batch.tokens = {42};
  batch.seqs[0].n_tokens = 1;
  batch.seqs[0].start_pos = 19;
  batch.seqs[0].first_in_slot = false;
  batch.seqs[0].new_blocks = {};
  runner->forward(batch, logits);
  batch.tokens = {5, 6, 7};
  batch.seqs[0].n_tokens = 3;
  batch.seqs[0].start_pos = 20;
  batch.all_logits = true;
  runner->forward(batch, logits);
  const double seconds_before = t.step_seconds;
  t = runner->expert_traffic();
  EXPECT_EQ(t.tokens, 23);
  EXPECT_EQ(t.routings, 23 * routings_per_token());
  EXPECT_GT(t.step_seconds, seconds_before);
  // Every expert is where the weights are: no host reads, cache or placement gauges on the CPU.
  EXPECT_EQ(t.host_routings, 0);
  EXPECT_EQ(t.cache_routings, 0);
  EXPECT_EQ(t.host_bytes, 0);
  EXPECT_EQ(t.cache_copies, 0);
  EXPECT_EQ(t.cache_copy_bytes, 0);
  EXPECT_EQ(t.cache_evictions, 0);
  EXPECT_EQ(t.vram_expert_bytes, 0);
  EXPECT_EQ(t.host_expert_bytes, 0);
  EXPECT_EQ(t.cache_bytes, 0);
  EXPECT_EQ(t.cache_slots, 0);
  EXPECT_EQ(t.cache_slots_used, 0);

  // A refused batch counts nothing.
  batch.tokens = {8192};
  batch.seqs[0].n_tokens = 1;
  batch.seqs[0].start_pos = 23;
  EXPECT_THROW(runner->forward(batch, logits), Error);
  EXPECT_EQ(runner->expert_traffic().tokens, 23);
  EXPECT_EQ(runner->expert_traffic().routings, 23 * routings_per_token());
}

TEST_F(ExpertTrafficTest, ADenseModelReportsNoExpertTraffic) {
  testing::TempDir dense_dir("spill-expert-traffic-dense");
  testing::write_random_model(dense_dir.path(), {.vocab_size = 300, .n_experts = 0, .seed = 5});
  auto model = Model::load(dense_dir.path());
  auto runner = make_cpu_runner(*model, {.block_size = 16, .n_blocks = 2}, testing::kTestThreads);
  const HandBuiltTables tables = hand_built_tables(model->spec(), 2);
  ForwardBatch batch;
  batch.tokens = {1, 2, 3, 4, 5};
  batch.seqs.push_back(
      {.first_token = 0, .n_tokens = 5, .start_pos = 0, .block_table = tables.tables[0], .want_logits = true});
  tables.attach(batch.seqs.back(), /*first_in_slot=*/true);
  std::vector<float> logits;
  runner->forward(batch, logits);
  const ExpertTraffic t = runner->expert_traffic();
  EXPECT_EQ(t.tokens, 0);
  EXPECT_EQ(t.routings, 0);
  EXPECT_EQ(t.step_seconds, 0.0);
}

// Batched, chunked requests: the engine's copy equals what its steps ran (the step traces), and
// that is prompt + completion - 1 tokens per request (the last sampled token is never run).
TEST_F(ExpertTrafficTest, EngineMetricsCarryTheRunnersCountsAfterEachStep) {
  testing::EngineHarness harness([] { return Model::load(model_dir()); }, testing::kTestThreads);
  testing::TraceLog log;
  auto engine = harness.make_engine(
      64, {.scheduler = {.max_running = 4, .max_batch_tokens = 24}, .prefix_caching = false, .on_step = log.hook()});
  EXPECT_EQ(engine->metrics().experts.tokens, 0);
  const std::vector<int64_t> lengths = {1, 16, 33, 7};
  const int64_t n_new = 5;
  std::vector<RequestStream> streams;
  for (size_t i = 0; i < lengths.size(); ++i)
    streams.push_back(engine->submit(
        testing::EngineHarness::greedy_request(harness.random_prompt(lengths[i], 40 + i), n_new, /*ignore_eos=*/true)));
  int64_t expected_tokens = 0;
  for (RequestStream& s : streams) {
    const RequestOutput out = s.collect();
    ASSERT_TRUE(out.finish);
    EXPECT_EQ(out.finish->completion_tokens, n_new) << out.finish->error;
    expected_tokens += out.finish->prompt_tokens + out.finish->completion_tokens - 1;
  }
  const EngineMetrics m = engine->metrics();
  engine.reset();  // a step's on_step runs after its tokens reach the client: join the thread first
  int64_t traced_tokens = 0;
  for (const StepTrace& step : log.snapshot())
    for (const StepTraceChunk& c : step.chunks) traced_tokens += c.n_tokens;
  EXPECT_EQ(traced_tokens, expected_tokens);
  EXPECT_EQ(m.computed_tokens, expected_tokens);
  EXPECT_EQ(m.experts.tokens, expected_tokens);
  EXPECT_EQ(m.experts.routings, expected_tokens * routings_per_token());
  EXPECT_GT(m.experts.step_seconds, 0.0);
  EXPECT_EQ(m.experts.host_routings, 0);
}

}  // namespace
}  // namespace spill
