// The engine end to end on a real (tiny, random) Qwen3-MoE model with the CPU runner: every
// greedy output is compared with a plain greedy loop over a fresh runner, which shares no code
// with the engine's scheduling, paging or caching.
#include "engine/engine.h"
#include "engine/open_engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <thread>

#include "model/model.h"
#include "model/runner.h"
#include "engine_harness.h"
#include "test_models.h"

namespace spill {
namespace {

using testing::RandomModelParams;
using testing::TempDir;
using testing::kTestThreads;
using testing::write_random_model;

// One model folder for the whole suite (written once; every engine maps it).
class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("spill-engine-test");
    params_ = RandomModelParams{.vocab_size = 300, .dense_layers = {0}, .seed = 11};
    write_random_model(dir_->path(), params_);
    harness_ = new testing::EngineHarness([] { return Model::load(model_dir()); }, kTestThreads);
  }
  static void TearDownTestSuite() {
    delete harness_;
    harness_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  static std::string model_dir() { return dir_->path(); }

  static std::unique_ptr<Engine> make_engine(int64_t n_blocks, const EngineConfig& config = {},
                                             int32_t block_size = 16) {
    return harness_->make_engine(n_blocks, config, block_size);
  }
  static std::vector<int32_t> reference_greedy(const std::vector<int32_t>& prompt, int64_t n_new) {
    return harness_->reference_greedy(prompt, n_new);
  }
  static std::vector<int32_t> random_prompt(int64_t n, uint64_t seed) { return harness_->random_prompt(n, seed); }
  static GenerationRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens) {
    return testing::EngineHarness::greedy_request(std::move(prompt), max_tokens);
  }
  static void expect_all_blocks_free(const Engine& engine) { testing::EngineHarness::expect_all_blocks_free(engine); }

  static TempDir* dir_;
  static RandomModelParams params_;
  static testing::EngineHarness* harness_;
};

TempDir* EngineTest::dir_ = nullptr;
RandomModelParams EngineTest::params_;
testing::EngineHarness* EngineTest::harness_ = nullptr;

using testing::TraceLog;

TEST_F(EngineTest, OneRequestMatchesThePlainGreedyLoop) {
  auto engine = make_engine(64);
  const auto prompt = random_prompt(21, 1);
  RequestOutput out = engine->submit(greedy_request(prompt, 10)).collect();
  ASSERT_TRUE(out.finish);
  EXPECT_EQ(out.finish->reason, FinishReason::Length) << out.finish->error;
  EXPECT_EQ(out.token_ids, reference_greedy(prompt, 10));
  EXPECT_EQ(out.finish->prompt_tokens, 21);
  EXPECT_EQ(out.finish->completion_tokens, 10);
  EXPECT_EQ(out.finish->cached_tokens, 0);
  EXPECT_GE(out.finish->timings.ttft_ms, 0.0);
  EXPECT_GE(out.finish->timings.total_ms, out.finish->timings.ttft_ms);
  expect_all_blocks_free(*engine);
}

// 16 requests of different lengths (block boundaries included) arriving in waves while others
// run, with a token budget that forces chunked prefill: each output equals the same request alone.
TEST_F(EngineTest, BatchedGreedyOutputsEqualEachRequestAlone) {
  const std::vector<int64_t> lengths = {1, 5, 15, 16, 17, 31, 32, 33, 47, 64, 70, 3, 9, 48, 2, 40};
  const int64_t n_new = 12;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) prompts.push_back(random_prompt(lengths[i], 100 + i));

  TraceLog log;
  EngineConfig config{.scheduler = {.max_running = 16, .max_batch_tokens = 48}, .on_step = log.hook()};
  auto engine = make_engine(256, config);
  std::vector<RequestStream> streams;
  std::vector<RequestOutput> outputs(prompts.size());
  for (size_t wave = 0; wave < 4; ++wave) {
    for (size_t i = wave * 4; i < wave * 4 + 4; ++i)
      streams.push_back(engine->submit(greedy_request(prompts[i], n_new)));
    // The next wave arrives once the first request of this wave has produced output.
    outputs[wave * 4].append(streams[wave * 4].next());
  }
  for (size_t i = 0; i < streams.size(); ++i) outputs[i].append(streams[i].collect());

  int max_batch = 0;
  for (const StepTrace& t : log.snapshot()) max_batch = std::max(max_batch, int(t.chunks.size()));
  EXPECT_GE(max_batch, 8) << "the requests were meant to run together";
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(outputs[i].finish);
    EXPECT_EQ(outputs[i].finish->reason, FinishReason::Length) << outputs[i].finish->error;
    EXPECT_EQ(outputs[i].token_ids, reference_greedy(prompts[i], n_new))
        << "request " << i << " (prompt " << lengths[i] << ")";
  }
  expect_all_blocks_free(*engine);
}

TEST_F(EngineTest, SharedPrefixIsReusedWithExactCachedCountsAndUnchangedOutput) {
  const auto prefix = random_prompt(100, 7);  // 6 full blocks of 16 + 4 tokens
  auto with_suffix = [&](std::vector<int32_t> suffix) {
    auto p = prefix;
    p.insert(p.end(), suffix.begin(), suffix.end());
    return p;
  };
  const auto a = with_suffix({1, 2, 3});
  const auto b = with_suffix({4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17});
  const auto c = prefix;  // exactly the shared prefix

  auto engine = make_engine(128);
  RequestOutput out_a = engine->submit(greedy_request(a, 8)).collect();
  EXPECT_EQ(out_a.finish->cached_tokens, 0);
  // a is finished: its full blocks stay cached while no one uses them.
  const EngineMetrics after_a = engine->metrics();
  EXPECT_EQ(after_a.kv_blocks_in_use, 0);
  EXPECT_GE(after_a.kv_blocks_cached, 6);

  RequestStream sb = engine->submit(greedy_request(b, 8));
  RequestStream sc = engine->submit(greedy_request(c, 8));
  RequestOutput out_b = sb.collect(), out_c = sc.collect();
  EXPECT_EQ(out_b.finish->cached_tokens, 96);
  // c's 100 tokens: 6 full blocks, all cached, none holds its last token.
  EXPECT_EQ(out_c.finish->cached_tokens, 96);
  // The same prompt again: its last full block holds the last prompt token, so it is recomputed.
  const auto d = with_suffix({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});  // 112 = 7 full blocks
  engine->submit(greedy_request(d, 2)).collect();
  RequestOutput out_d = engine->submit(greedy_request(d, 8)).collect();
  EXPECT_EQ(out_d.finish->cached_tokens, 96);

  EXPECT_EQ(out_a.token_ids, reference_greedy(a, 8));
  EXPECT_EQ(out_b.token_ids, reference_greedy(b, 8));
  EXPECT_EQ(out_c.token_ids, reference_greedy(c, 8));
  EXPECT_EQ(out_d.token_ids, reference_greedy(d, 8));

  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.prefix_hit_tokens, 96 + 96 + 96 + 96);
  EXPECT_EQ(m.prefix_query_tokens, int64_t(a.size() + b.size() + c.size() + 2 * d.size()));
  expect_all_blocks_free(*engine);

  // Without prefix caching: nothing cached, same outputs.
  auto uncached = make_engine(128, {.prefix_caching = false});
  uncached->submit(greedy_request(a, 8)).collect();
  RequestOutput again_b = uncached->submit(greedy_request(b, 8)).collect();
  EXPECT_EQ(again_b.finish->cached_tokens, 0);
  EXPECT_EQ(again_b.token_ids, out_b.token_ids);
}

TEST_F(EngineTest, SaltedRequestsDoNotShareCachedBlocks) {
  auto engine = make_engine(64);
  const auto p = random_prompt(40, 9);
  GenerationRequest r = greedy_request(p, 2);
  engine->submit(r).collect();
  r.cache_salt = 1234;
  EXPECT_EQ(engine->submit(r).collect().finish->cached_tokens, 0);
  r.cache_salt = 0;
  EXPECT_EQ(engine->submit(r).collect().finish->cached_tokens, 32);
}

// A long prompt under a small token budget runs over several steps while the decoding requests
// get one token in every one of those steps.
TEST_F(EngineTest, ChunkedPrefillKeepsOtherSequencesDecodingEveryStep) {
  TraceLog log;
  // The engine thread waits after its first step until all three decoders are queued (a slow test
  // thread could otherwise let the first run far ahead of the others), and after the first step in
  // which all three decode, until the long prompt is queued: otherwise the decoders can finish
  // before it arrives and there is nothing to observe.
  std::mutex gate_mutex;
  std::condition_variable gate_cv;
  bool decoders_queued = false, gate_open = false;
  auto record = log.hook();
  auto hook = [&](const StepTrace& t) {
    record(t);
    int decodes = 0;
    for (const StepTraceChunk& c : t.chunks) decodes += c.decode ? 1 : 0;
    std::unique_lock lock(gate_mutex);
    gate_cv.wait_for(lock, std::chrono::seconds(30), [&] { return decoders_queued; });
    if (decodes < 3) return;
    gate_cv.wait_for(lock, std::chrono::seconds(30), [&] { return gate_open; });
  };
  auto engine = make_engine(128, {.scheduler = {.max_running = 8, .max_batch_tokens = 16}, .on_step = hook});
  std::vector<RequestStream> decoders;
  std::vector<std::vector<int32_t>> decoder_prompts;
  for (int i = 0; i < 3; ++i) {
    decoder_prompts.push_back(random_prompt(6 + i, 200 + uint64_t(i)));
    decoders.push_back(engine->submit(greedy_request(decoder_prompts.back(), 40)));
  }
  {
    std::lock_guard lock(gate_mutex);
    decoders_queued = true;
  }
  gate_cv.notify_all();
  std::vector<RequestOutput> dec_out(3);
  for (int i = 0; i < 3; ++i) dec_out[size_t(i)].append(decoders[size_t(i)].next());  // all are decoding now
  const auto long_prompt = random_prompt(100, 300);
  RequestStream long_stream = engine->submit(greedy_request(long_prompt, 3));
  {
    std::lock_guard lock(gate_mutex);
    gate_open = true;
  }
  gate_cv.notify_all();
  RequestOutput long_out = long_stream.collect();
  for (int i = 0; i < 3; ++i) dec_out[size_t(i)].append(decoders[size_t(i)].collect());

  const uint64_t long_id = long_stream.id();
  int prefill_steps = 0;
  int64_t covered = 0;
  for (const StepTrace& t : log.snapshot()) {
    const StepTraceChunk* long_chunk = nullptr;
    for (const StepTraceChunk& c : t.chunks)
      if (c.seq_id == long_id && !c.decode) long_chunk = &c;
    if (!long_chunk) continue;
    ++prefill_steps;
    EXPECT_EQ(long_chunk->start_pos, covered) << "chunks follow each other";
    covered += long_chunk->n_tokens;
    EXPECT_LE(t.n_tokens, 16);
    int decoding = 0;
    for (const StepTraceChunk& c : t.chunks)
      if (c.seq_id != long_id) {
        EXPECT_TRUE(c.decode);
        EXPECT_EQ(c.n_tokens, 1);
        ++decoding;
      }
    EXPECT_EQ(decoding, 3) << "step " << t.step << ": every decoding sequence advances";
  }
  EXPECT_EQ(covered, 100);
  EXPECT_GE(prefill_steps, 100 / 13) << "the prompt was meant to take several steps";
  EXPECT_EQ(long_out.token_ids, reference_greedy(long_prompt, 3));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(dec_out[size_t(i)].token_ids, reference_greedy(decoder_prompts[size_t(i)], 40));
  expect_all_blocks_free(*engine);
}

// 8 requests that together need ~3x the KV pool: they are preempted and recomputed, and each
// still produces exactly its output alone.
TEST_F(EngineTest, PreemptionUnderAKvBudgetTooSmallKeepsEveryOutputExact) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(random_prompt(20 + 7 * i, 400 + uint64_t(i)));
  const int64_t n_new = 30;
  // Largest request: 69 + 30 = 99 tokens -> 7 blocks; together ~ 8 * 5.7 blocks. Pool: 14.
  auto engine = make_engine(14, {.scheduler = {.max_running = 8, .max_batch_tokens = 64}});
  std::vector<RequestStream> streams;
  for (const auto& p : prompts) streams.push_back(engine->submit(greedy_request(p, n_new)));
  int32_t preemptions = 0;
  for (size_t i = 0; i < streams.size(); ++i) {
    RequestOutput out = streams[i].collect();
    ASSERT_TRUE(out.finish);
    EXPECT_EQ(out.finish->reason, FinishReason::Length) << out.finish->error;
    EXPECT_EQ(out.token_ids, reference_greedy(prompts[i], n_new)) << "request " << i;
    preemptions += out.finish->preemptions;
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small for all at once";
  EXPECT_EQ(engine->metrics().preemptions, preemptions);
  expect_all_blocks_free(*engine);
}

TEST_F(EngineTest, CancellationEndsTheRequestAndFreesItsBlocksAtOnce) {
  auto engine = make_engine(64, {.max_model_len = 1000});
  RequestStream s = engine->submit(greedy_request(random_prompt(30, 5), 100000));
  RequestOutput first = s.next();
  EXPECT_FALSE(first.finish);
  EXPECT_GT(engine->metrics().kv_blocks_in_use, 0);
  s.cancel();
  RequestOutput rest = s.collect();
  ASSERT_TRUE(rest.finish);
  EXPECT_EQ(rest.finish->reason, FinishReason::Cancelled);
  // Blocks are released before the finish is delivered.
  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.kv_blocks_in_use, 0);
  EXPECT_EQ(m.kv_blocks_free, m.kv_blocks_total);
  EXPECT_EQ(m.requests_cancelled, 1);
  EXPECT_TRUE(s.finished());
  EXPECT_THROW(s.next(), Error);
  s.cancel();  // harmless after the end
  // A request cancelled while it waits never runs.
  auto busy = make_engine(64, {.scheduler = {.max_running = 1}, .max_model_len = 1000});
  RequestStream runner = busy->submit(greedy_request(random_prompt(5, 1), 100000));
  runner.next();
  RequestStream queued = busy->submit(greedy_request(random_prompt(5, 2), 5));
  queued.cancel();
  RequestOutput q = queued.collect();
  EXPECT_EQ(q.finish->reason, FinishReason::Cancelled);
  EXPECT_TRUE(q.token_ids.empty());
  runner.cancel();
  runner.collect();
  expect_all_blocks_free(*busy);
}

TEST_F(EngineTest, RequestsAreCheckedWithClearErrors) {
  auto engine = make_engine(8);  // 128 tokens of KV
  auto message = [&](GenerationRequest r) {
    try {
      engine->submit(std::move(r));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message(greedy_request({}, 4)).find("prompt is empty"), std::string::npos);
  EXPECT_NE(message(greedy_request(random_prompt(129, 1), 4)).find("more than the context limit of 128"),
            std::string::npos);
  EXPECT_NE(message(greedy_request({1, 300, 2}, 4)).find("id 300, outside the model's vocabulary"), std::string::npos);
  EXPECT_NE(message(greedy_request({1}, 0)).find("max_tokens"), std::string::npos);
  GenerationRequest bad_sampling = greedy_request({1}, 4);
  bad_sampling.sampling.top_p = 2.0f;
  EXPECT_NE(message(bad_sampling).find("top_p"), std::string::npos);
  GenerationRequest stops = greedy_request({1}, 4);
  stops.stop = {"x"};
  EXPECT_NE(message(stops).find("need a tokenizer"), std::string::npos);
  EXPECT_EQ(engine->metrics().requests_rejected, 6);
  EXPECT_THROW(make_engine(8, {.max_model_len = 129}), Error);
}

TEST_F(EngineTest, APromptExactlyFillingTheKvPoolGetsOneToken) {
  auto engine = make_engine(8);  // 128 tokens
  EXPECT_EQ(engine->max_model_len(), 128);
  const auto prompt = random_prompt(128, 77);
  RequestOutput out = engine->submit(greedy_request(prompt, 50)).collect();
  ASSERT_TRUE(out.finish);
  EXPECT_EQ(out.finish->reason, FinishReason::Length);
  EXPECT_EQ(out.token_ids, reference_greedy(prompt, 1));
  // One token short of full: two tokens (the first one's KV fills the last slot).
  const auto shorter = random_prompt(127, 78);
  out = engine->submit(greedy_request(shorter, 50)).collect();
  EXPECT_EQ(out.token_ids, reference_greedy(shorter, 2));
  expect_all_blocks_free(*engine);
}

TEST_F(EngineTest, AFullWaitingQueueRefusesFast) {
  auto engine = make_engine(64, {.scheduler = {.max_running = 1}, .max_waiting = 2, .max_model_len = 1000});
  RequestStream running = engine->submit(greedy_request(random_prompt(4, 1), 100000));
  running.next();  // it is running; the next two wait
  RequestStream w1 = engine->submit(greedy_request(random_prompt(4, 2), 3));
  RequestStream w2 = engine->submit(greedy_request(random_prompt(4, 3), 3));
  EXPECT_THROW(engine->submit(greedy_request(random_prompt(4, 4), 3)), QueueFullError);
  EXPECT_EQ(engine->metrics().waiting, 2);
  running.cancel();
  EXPECT_EQ(running.collect().finish->reason, FinishReason::Cancelled);
  EXPECT_EQ(w1.collect().finish->reason, FinishReason::Length);
  EXPECT_EQ(w2.collect().finish->reason, FinishReason::Length);
  expect_all_blocks_free(*engine);
}

TEST_F(EngineTest, StopTokensEndTheRequestAndIgnoreEosDoesNotApplyToThem) {
  auto engine = make_engine(64);
  const auto prompt = random_prompt(12, 31);
  const auto ref = reference_greedy(prompt, 10);
  GenerationRequest r = greedy_request(prompt, 10);
  r.stop_token_ids = {ref[3]};
  r.ignore_eos = true;
  RequestOutput out = engine->submit(r).collect();
  // Stops at the first occurrence of that token, which is reported as the last token.
  const size_t first = size_t(std::find(ref.begin(), ref.end(), ref[3]) - ref.begin());
  ASSERT_TRUE(out.finish);
  EXPECT_EQ(out.finish->reason, FinishReason::Stop);
  ASSERT_TRUE(out.finish->stop_token);
  EXPECT_EQ(*out.finish->stop_token, ref[3]);
  EXPECT_EQ(out.token_ids, std::vector<int32_t>(ref.begin(), ref.begin() + ptrdiff_t(first) + 1));
  EXPECT_EQ(out.finish->completion_tokens, int64_t(first) + 1);
  expect_all_blocks_free(*engine);
}

TEST_F(EngineTest, SeededSamplingIsTheSameAloneAndInABatch) {
  const auto prompt = random_prompt(25, 55);
  GenerationRequest r{
      .prompt = prompt, .sampling = {.temperature = 1.5f, .top_p = 0.95f, .seed = 4242}, .max_tokens = 16};
  auto engine = make_engine(128);
  const std::vector<int32_t> alone = engine->submit(r).collect().token_ids;
  std::vector<RequestStream> others;
  for (int i = 0; i < 5; ++i)
    others.push_back(engine->submit(greedy_request(random_prompt(10 + i, 60 + uint64_t(i)), 20)));
  RequestStream mine = engine->submit(r);
  for (int i = 0; i < 3; ++i)
    others.push_back(engine->submit({.prompt = random_prompt(7, 70 + uint64_t(i)), .max_tokens = 9}));
  EXPECT_EQ(mine.collect().token_ids, alone);
  for (auto& o : others) o.collect();
  // Without a seed two identical requests differ (with overwhelming probability).
  r.sampling.seed.reset();
  EXPECT_NE(engine->submit(r).collect().token_ids, engine->submit(r).collect().token_ids);
  expect_all_blocks_free(*engine);
}

TEST_F(EngineTest, LogprobsComeWithEveryToken) {
  auto engine = make_engine(32);
  GenerationRequest r = greedy_request(random_prompt(9, 3), 5);
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 3;
  RequestOutput out = engine->submit(r).collect();
  ASSERT_EQ(out.logprobs.size(), out.token_ids.size());
  for (size_t i = 0; i < out.token_ids.size(); ++i) {
    EXPECT_EQ(out.logprobs[i].token, out.token_ids[i]);
    ASSERT_EQ(out.logprobs[i].top.size(), 3u);
    EXPECT_EQ(out.logprobs[i].top[0].token, out.token_ids[i]);  // greedy picks the most likely
    EXPECT_FLOAT_EQ(out.logprobs[i].top[0].logprob, out.logprobs[i].logprob);
    EXPECT_LE(out.logprobs[i].logprob, 0.0f);
  }
}

TEST_F(EngineTest, StreamingDeliversIncrementsThatAddUpAndTimesOutWhenIdle) {
  auto engine = make_engine(64, {.scheduler = {.max_running = 1}, .max_model_len = 1000});
  const auto prompt = random_prompt(10, 8);
  RequestStream s = engine->submit(greedy_request(prompt, 20));
  std::vector<int32_t> tokens;
  int reads = 0;
  while (!s.finished()) {
    std::optional<RequestOutput> o = s.next_for(std::chrono::milliseconds(5000));
    ASSERT_TRUE(o);
    tokens.insert(tokens.end(), o->token_ids.begin(), o->token_ids.end());
    ++reads;
  }
  EXPECT_EQ(tokens, reference_greedy(prompt, 20));
  EXPECT_GE(reads, 1);
  // A request stuck behind a long one (max_running 1) has nothing to say for a while.
  RequestStream hog = engine->submit(greedy_request(prompt, 100000));
  RequestStream behind = engine->submit(greedy_request(prompt, 2));
  hog.next();
  EXPECT_FALSE(behind.next_for(std::chrono::milliseconds(20)));
  hog.cancel();
  hog.collect();
  EXPECT_EQ(behind.collect().token_ids, reference_greedy(prompt, 2));
}

TEST_F(EngineTest, ManyThreadsSubmitAtOnce) {
  auto engine = make_engine(96, {.scheduler = {.max_running = 6, .max_batch_tokens = 40}});
  std::vector<std::thread> threads;
  std::vector<std::vector<int32_t>> results(12), prompts(12);
  for (size_t i = 0; i < 12; ++i) prompts[i] = random_prompt(3 + int64_t(i) * 5, 900 + i);
  for (size_t i = 0; i < 12; ++i)
    threads.emplace_back([&, i] { results[i] = engine->submit(greedy_request(prompts[i], 6)).collect().token_ids; });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(results[i], reference_greedy(prompts[i], 6)) << i;
  expect_all_blocks_free(*engine);
}

TEST_F(EngineTest, DestroyingTheEngineEndsOpenRequests) {
  RequestStream s;
  {
    auto engine = make_engine(64, {.max_model_len = 1000});
    s = engine->submit(greedy_request(random_prompt(10, 1), 100000));
    s.next();
  }
  RequestOutput rest = s.collect();
  ASSERT_TRUE(rest.finish);
  EXPECT_EQ(rest.finish->reason, FinishReason::Cancelled);
  EXPECT_NE(rest.finish->error.find("shut down"), std::string::npos);
  s.cancel();  // the engine is gone: harmless
}

// Text, detokenization and stop strings need a tokenizer: GPT-2's, with a model of its vocabulary.
class EngineTextTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("spill-engine-text-test");
    write_random_model(dir_->path(), {.vocab_size = 50257,
                                      .hidden_size = 32,
                                      .n_layers = 1,
                                      .n_heads = 2,
                                      .n_kv_heads = 1,
                                      .n_experts = 4,
                                      .moe_intermediate_size = 16,
                                      .seed = 5});
    std::filesystem::copy_file(SPILL_TEST_DATA "/gpt2/tokenizer.json", dir_->sub("tokenizer.json"));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::unique_ptr<Engine> open(const EngineConfig& config = {}) {
    return open_engine(dir_->path(),
                       EngineOptions{.runner = {.device = {Device::Cpu}, .threads = kTestThreads, .kv = {.blocks = 64}}},
                       config);
  }
  static TempDir* dir_;
};

TempDir* EngineTextTest::dir_ = nullptr;

TEST_F(EngineTextTest, TextIsTheDecodeOfTheTokens) {
  auto engine = open();
  ASSERT_TRUE(engine->tokenizer());
  const Tokenizer& tok = *engine->tokenizer();
  const std::vector<int32_t> prompt = tok.encode("The quick brown fox");
  RequestOutput out = engine->submit({.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 24}).collect();
  ASSERT_EQ(out.token_ids.size(), 24u);
  EXPECT_EQ(out.text, tok.decode(out.token_ids, /*skip_special=*/true));
}

TEST_F(EngineTextTest, StopStringsCutTheTextAndNothingOfThemIsShown) {
  auto engine = open();
  const Tokenizer& tok = *engine->tokenizer();
  const std::vector<int32_t> prompt = tok.encode("Once upon a time");
  const GenerationRequest base{.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 32};
  RequestOutput full = engine->submit(base).collect();
  const std::string& text = full.text;
  ASSERT_GT(text.size(), 8u);
  // A stop string from the middle of the text, on UTF-8 character boundaries.
  auto is_boundary = [&](size_t i) { return i >= text.size() || (uint8_t(text[i]) & 0xC0) != 0x80; };
  size_t begin = text.size() / 2;
  while (!is_boundary(begin)) ++begin;
  size_t end = std::min(text.size(), begin + 3);
  while (!is_boundary(end)) ++end;
  const std::string stop = text.substr(begin, end - begin);
  ASSERT_FALSE(stop.empty());

  GenerationRequest r = base;
  r.stop = {"never-appears-in-this-text", stop};
  // Read increment by increment: no increment may show a stop string's beginning that the end
  // then cuts (the text only ever grows by what is final).
  RequestStream s = engine->submit(r);
  std::string shown;
  std::optional<RequestFinish> finish;
  std::vector<int32_t> tokens;
  while (!s.finished()) {
    RequestOutput o = s.next();
    shown += o.text;
    tokens.insert(tokens.end(), o.token_ids.begin(), o.token_ids.end());
    if (o.finish) finish = o.finish;
  }
  ASSERT_TRUE(finish);
  EXPECT_EQ(finish->reason, FinishReason::Stop);
  ASSERT_TRUE(finish->stop_string);
  EXPECT_EQ(*finish->stop_string, stop);
  EXPECT_EQ(shown, text.substr(0, text.find(stop)));
  // Generation stopped at the token that completed the stop string.
  ASSERT_LE(tokens.size(), full.token_ids.size());
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), full.token_ids.begin()));
  EXPECT_NE(tok.decode(tokens, true).find(stop), std::string::npos);
  EXPECT_EQ(tok.decode(std::vector<int32_t>(tokens.begin(), tokens.end() - 1), true).find(stop), std::string::npos);
}

TEST_F(EngineTextTest, StopTokensAreReportedAsTokensButNotAsText) {
  auto engine = open();
  const Tokenizer& tok = *engine->tokenizer();
  const std::vector<int32_t> prompt = tok.encode("Hello");
  RequestOutput full = engine->submit({.prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 6}).collect();
  GenerationRequest r{
      .prompt = prompt, .sampling = {.temperature = 0.0f}, .max_tokens = 6, .stop_token_ids = {full.token_ids[2]}};
  RequestOutput cut = engine->submit(r).collect();
  const size_t first =
      size_t(std::find(full.token_ids.begin(), full.token_ids.end(), full.token_ids[2]) - full.token_ids.begin());
  EXPECT_EQ(cut.token_ids.size(), first + 1);
  EXPECT_EQ(cut.text,
            tok.decode(std::vector<int32_t>(full.token_ids.begin(), full.token_ids.begin() + ptrdiff_t(first)), true));
}

}  // namespace
}  // namespace spill
