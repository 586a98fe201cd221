// The engine on a tiny random checkpoint of each family with its own attention and router
// (the parity fixtures of gpt_oss with MXFP4 experts, deepseek_v3 with latent attention, glm4_moe):
// batched, chunked, prefix-cached and preempted sequences give exactly the tokens of a plain greedy
// loop over a fresh runner, which shares no code with the engine's scheduling, paging or caching.
// gpt_oss's sliding window (5) is shorter than every prompt here, so windows cross block and
// chunk boundaries; deepseek_v3's KV blocks hold latents.
//
// Then gpt-oss's sliding layers on a tiny random model: the pool holds, per sequence, every block of
// its full-attention layers but only the blocks of its sliding layers' window, step after step,
// while every output stays bit-identical to the reference, whose sliding layers keep everything.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>

#include "engine/engine.h"
#include "engine_harness.h"
#include "formats/model_spec.h"
#include "model/model.h"
#include "model/runner.h"
#include "model/synthetic_source.h"

namespace spill {
namespace {

namespace fs = std::filesystem;
using testing::EngineHarness;
using testing::TraceLog;

fs::path fixture(const std::string& name) { return fs::path(SPILL_TEST_DATA) / "parity" / name; }

// Ids 0..2 are the fixtures' special tokens; prompts keep clear of them.
constexpr int32_t kFirstId = 3;

class EngineFamilies : public ::testing::TestWithParam<const char*> {
 protected:
  EngineFamilies() : harness_([dir = fixture(GetParam()).string()] { return Model::load(dir); }) {}

  std::unique_ptr<Engine> make_engine(int64_t n_blocks, const EngineConfig& config = {}, int32_t block_size = 8) {
    return harness_.make_engine(n_blocks, config, block_size);
  }
  std::vector<int32_t> reference_greedy(const std::vector<int32_t>& prompt, int64_t n_new) {
    return harness_.reference_greedy(prompt, n_new);
  }
  std::vector<int32_t> random_prompt(int64_t n, uint64_t seed) { return harness_.random_prompt(n, seed, kFirstId); }
  static GenerationRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
    return EngineHarness::greedy_request(std::move(prompt), max_tokens, /*ignore_eos=*/true);
  }

  EngineHarness harness_;
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
  EngineHarness::expect_all_blocks_free(*engine);
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
  EngineHarness::expect_all_blocks_free(*engine);
}

TEST_P(EngineFamilies, PreemptionKeepsEveryOutputExact) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(random_prompt(10 + 5 * i, 300 + uint64_t(i)));
  const int64_t n_new = 12;
  // Longest: 30 + 12 = 42 tokens = 6 blocks of 8 per KV group; all five together need ~23 per
  // group. Pool: 9 blocks per group the model has (gpt_oss: full and sliding layers).
  const int64_t groups = kv_groups(harness_.open_model()->spec()).size();
  auto engine = make_engine(9 * groups, {.scheduler = {.max_running = 5, .max_batch_tokens = 32}});
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
  EngineHarness::expect_all_blocks_free(*engine);
}

INSTANTIATE_TEST_SUITE_P(Families, EngineFamilies,
                         ::testing::Values("gpt_oss_mxfp4", "deepseek_v3_per_expert", "glm4_moe_per_expert"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// ---- gpt-oss's sliding layers keep a window, not the history ------------------------------------

// Sliding, full, sliding, full (two groups of two layers), a window of 5 positions.
constexpr int32_t kWindow = 5;
const char* kSlidingGptOss = R"({"model_type": "gpt_oss", "vocab_size": 89, "hidden_size": 32,
  "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 5,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "rope_theta": 150000, "max_position_embeddings": 4096})";

std::unique_ptr<Model> sliding_gpt_oss() {
  const ModelSpec spec = parse_model_spec(kSlidingGptOss, "tiny gpt-oss config");
  SyntheticOptions o;
  o.seed = 77;
  return Model::from_source(spec, make_synthetic_source(spec, o));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The blocks a chunk of n tokens at position c holds while it runs (the scheduler's free count is
// taken after the step's allocations, before its forward): the full group every block up to c + n,
// the sliding group those from the block of c's window start (c - window + 1) up to c + n; the
// blocks wholly before were handed back when the sequence's previous step committed.
int64_t blocks_while_running(int64_t c, int64_t n, int32_t bs) {
  const int64_t upto = ceil_div(c + n, bs);
  return upto + (upto - std::max<int64_t>(0, c - kWindow + 1) / bs);
}

class SlidingWindowKv : public ::testing::Test {
 protected:
  SlidingWindowKv() : harness_(sliding_gpt_oss) {}
  EngineHarness harness_;
  std::vector<int32_t> random_prompt(int64_t n, uint64_t seed) { return harness_.random_prompt(n, seed); }
  static GenerationRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
    return EngineHarness::greedy_request(std::move(prompt), max_tokens, /*ignore_eos=*/true);
  }
};

TEST_F(SlidingWindowKv, TheModelKeepsTwoGroupsAndBlocksHalfAsDeep) {
  const auto model = sliding_gpt_oss();
  const KvGroups g = kv_groups(model->spec());
  ASSERT_EQ(g.size(), 2);
  EXPECT_EQ(g.groups[0].window, 0);
  EXPECT_EQ(g.groups[0].layers, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(g.groups[1].window, kWindow);
  EXPECT_EQ(g.groups[1].layers, (std::vector<int32_t>{0, 2}));
  // A block holds 2 layers (one group's), not 4: K and V of 2 heads x 8 dims in f32, 4 positions.
  EXPECT_EQ(cpu_kv_bytes_per_block(model->spec(), 4), 2 * (2 * 2 * 8 * 4) * 4);
  auto runner = make_cpu_runner(*model, {.block_size = 4, .n_blocks = 10}, 1);
  EXPECT_EQ(runner->kv_config().group_windows, (std::vector<int32_t>{0, kWindow}));
  // 10 blocks: a sequence alone holds ceil(n / 4) full blocks + at most ceil(4 / 4) + 1 = 2 sliding
  // ones, so the longest is 8 blocks = 32 tokens.
  EXPECT_EQ(runner->kv_config().pool_tokens(), 32);
  EXPECT_EQ(runner->limits().max_model_len, 32);
}

// One long sequence: at every step the pool holds exactly what the window needs in the sliding
// group, far less than the history, and the tokens equal the reference's.
TEST_F(SlidingWindowKv, OneSequenceHoldsOnlyItsWindowOfSlidingBlocks) {
  const int32_t bs = 4;
  const int64_t n_blocks = 40;
  TraceLog log;
  auto engine = harness_.make_engine(n_blocks, {.scheduler = {.max_running = 2, .max_batch_tokens = 64},
                                                .on_step = log.hook()},
                                     bs);
  const auto prompt = random_prompt(9, 1);
  const int64_t n_new = 60;
  const RequestOutput out = engine->submit(greedy(prompt, n_new)).collect();
  ASSERT_TRUE(out.finish);
  EXPECT_EQ(out.finish->reason, FinishReason::Length) << out.finish->error;
  EXPECT_EQ(out.token_ids, harness_.reference_greedy(prompt, n_new));
  int64_t most_in_use = 0;
  for (const StepTrace& t : log.snapshot()) {
    ASSERT_EQ(t.chunks.size(), 1u);
    const StepTraceChunk& c = t.chunks[0];
    const int64_t in_use = n_blocks - t.free_blocks_after;
    EXPECT_EQ(in_use, blocks_while_running(c.start_pos, c.n_tokens, bs)) << "step " << t.step;
    // The sliding group: at most ceil((window - 1) / bs) + 1 blocks once the prompt is in.
    if (c.start_pos > 0) {
      EXPECT_LE(in_use - ceil_div(c.start_pos + 1, bs), ceil_div(kWindow - 1, bs) + 1);
    }
    most_in_use = std::max(most_in_use, in_use);
  }
  // 68 positions computed: 17 blocks in each group if the sliding layers kept everything, 17 + 2 here.
  EXPECT_EQ(most_in_use, 17 + 2);
  EngineHarness::expect_all_blocks_free(*engine);
}

// Batched requests with shared prefixes, chunked prefill, prefix caching and a pool too small for
// all of them at once (preemption): every output equals the reference, and every step's blocks in
// use stay within what its chunks' windows need.
TEST_F(SlidingWindowKv, CachingAndPreemptionKeepOutputsExactAndThePoolBounded) {
  const int32_t bs = 4;
  const int64_t n_blocks = 26;
  const auto shared = random_prompt(18, 2);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    auto p = i % 2 == 0 ? shared : random_prompt(5, 10 + uint64_t(i));
    const auto tail = random_prompt(3 + 4 * i, 20 + uint64_t(i));
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  const int64_t n_new = 24;
  // The first request runs alone, so that the others find its prefix cached. The engine thread
  // waits at the end of its last step until the other five are queued, so that they are admitted
  // together (else the first of them could run alone for steps and evict the window's blocks).
  TraceLog log;
  auto record = log.hook();
  std::mutex gate_mutex;
  std::condition_variable gate_cv;
  bool gate_open = false;
  const int64_t last_position_of_first = int64_t(prompts[0].size()) + n_new - 2;
  auto hook = [&](const StepTrace& t) {
    record(t);
    if (t.chunks.size() != 1 || t.chunks[0].start_pos != last_position_of_first) return;
    std::unique_lock lock(gate_mutex);
    gate_cv.wait_for(lock, std::chrono::seconds(30), [&] { return gate_open; });
  };
  auto engine = harness_.make_engine(n_blocks, {.scheduler = {.max_running = 4, .max_batch_tokens = 48},
                                                .on_step = hook},
                                     bs);
  std::vector<RequestStream> streams;
  const RequestOutput first = engine->submit(greedy(prompts[0], n_new)).collect();
  EXPECT_EQ(first.token_ids, harness_.reference_greedy(prompts[0], n_new));
  for (size_t i = 1; i < prompts.size(); ++i) streams.push_back(engine->submit(greedy(prompts[i], n_new)));
  {
    std::lock_guard lock(gate_mutex);
    gate_open = true;
  }
  gate_cv.notify_all();
  int32_t preemptions = 0;
  std::map<size_t, int64_t> cached_of;
  for (size_t i = 1; i < prompts.size(); ++i) {
    const RequestOutput out = streams[i - 1].collect();
    ASSERT_TRUE(out.finish);
    EXPECT_EQ(out.finish->reason, FinishReason::Length) << out.finish->error;
    EXPECT_EQ(out.token_ids, harness_.reference_greedy(prompts[i], n_new)) << "request " << i;
    preemptions += out.finish->preemptions;
    if (i % 2 == 0) {
      cached_of[i] = out.finish->cached_tokens;
    } else {
      EXPECT_EQ(out.finish->cached_tokens, 0);
    }
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small for all at once";
  // Requests 2 and 4 share the first 16 tokens (4 blocks) of request 0's prompt. Request 2 joins in
  // the first step after the gate, beside request 1, before anything evicts request 0's blocks: it
  // hits the full group's 4 blocks and the sliding group's block 3 (its window, 12..16). Request 4
  // hits the same 16 only if it joins while block 3 is still cached (the pool is short, so it may not).
  EXPECT_EQ(cached_of[2], 16);
  EXPECT_TRUE(cached_of[4] == 0 || cached_of[4] == 16) << cached_of[4];
  for (const StepTrace& t : log.snapshot()) {
    if (int64_t(t.chunks.size()) != t.n_running) continue;  // a sequence that sat out holds blocks too
    int64_t bound = 0;  // shared prefix blocks count once in the pool but in each chunk here
    for (const StepTraceChunk& c : t.chunks) bound += blocks_while_running(c.start_pos, c.n_tokens, bs);
    EXPECT_LE(n_blocks - t.free_blocks_after, bound) << "step " << t.step;
  }
  EngineHarness::expect_all_blocks_free(*engine);
}

// A prefix hit needs, in the sliding group, only the blocks inside the window of the hit's end: a
// request that follows a finished one with the same prompt start gets the full hit.
TEST_F(SlidingWindowKv, APrefixHitTakesTheWindowsBlocksOfTheSlidingGroup) {
  const int32_t bs = 4;
  auto engine = harness_.make_engine(64, {}, bs);
  const auto a = random_prompt(30, 3);
  auto b = a;
  b.insert(b.end(), {7, 8, 9});
  const RequestOutput out_a = engine->submit(greedy(a, 4)).collect();
  const RequestOutput out_b = engine->submit(greedy(b, 4)).collect();
  EXPECT_EQ(out_a.finish->cached_tokens, 0);
  // b shares a's 30 prompt tokens: 7 full blocks (28 tokens; the 8th holds a's own output), whose
  // sliding-group part the next query needs is block 6 alone (window 24..28).
  EXPECT_EQ(out_b.finish->cached_tokens, 28);
  EXPECT_EQ(out_a.token_ids, harness_.reference_greedy(a, 4));
  EXPECT_EQ(out_b.token_ids, harness_.reference_greedy(b, 4));
  EngineHarness::expect_all_blocks_free(*engine);
}

}  // namespace
}  // namespace spill
