// What the engine suites share (engine_test.cpp on a random Qwen3-MoE folder, engine_families_test.cpp
// on each family's fixtures and tiny random models): an engine over the CPU runner, the reference
// every output is compared with (a plain greedy loop over a fresh runner, one sequence, hand-built
// block tables: it shares no code with the engine's scheduling, paging, caching or sliding-window
// block freeing), prompts, and the check that every KV block came back.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "model/runner.h"

namespace spill::testing {

class EngineHarness {
 public:
  // open: a fresh Model of the model under test each call (the engine and the reference runner
  // each own theirs).
  explicit EngineHarness(std::function<std::unique_ptr<Model>()> open, int n_threads = 2)
      : open_(std::move(open)), n_threads_(n_threads) {}

  std::unique_ptr<Model> open_model() const { return open_(); }
  int64_t vocab_size() const {
    if (!vocab_size_) vocab_size_ = open_()->spec().vocab_size;
    return vocab_size_;
  }

  std::unique_ptr<Engine> make_engine(int64_t n_blocks, const EngineConfig& config = {}, int32_t block_size = 16) const {
    auto model = open_();
    auto runner = make_cpu_runner(*model, {.block_size = block_size, .n_blocks = n_blocks}, n_threads_);
    return std::make_unique<Engine>(EngineParts{.model = std::move(model), .runner = std::move(runner)}, config);
  }

  // Greedy decoding with a fresh runner, one sequence, contiguous blocks in every KV group (so
  // a sliding layer keeps its whole history): the reference. Memoised per prompt and length.
  std::vector<int32_t> reference_greedy(const std::vector<int32_t>& prompt, int64_t n_new) const {
    {
      std::lock_guard lock(memo_mutex_);
      auto it = memo_.find({prompt, n_new});
      if (it != memo_.end()) return it->second;
    }
    auto model = open_();
    const int32_t bs = 16;
    const int64_t blocks = (int64_t(prompt.size()) + n_new + bs - 1) / bs;
    auto runner = make_cpu_runner(*model, {.block_size = bs, .n_blocks = hand_built_pool_blocks(model->spec(), blocks)},
                                  n_threads_);
    const HandBuiltTables tables = hand_built_tables(model->spec(), blocks);
    ForwardBatch batch;
    batch.tokens = prompt;
    batch.seqs.push_back({.first_token = 0,
                          .n_tokens = int32_t(prompt.size()),
                          .start_pos = 0,
                          .block_table = tables.tables[0],
                          .want_logits = true});
    tables.attach(batch.seqs.back());
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
    std::lock_guard lock(memo_mutex_);
    memo_[{prompt, n_new}] = out;
    return out;
  }

  // n ids drawn from [first_id, vocab): first_id > 0 keeps clear of a fixture's special ids.
  std::vector<int32_t> random_prompt(int64_t n, uint64_t seed, int32_t first_id = 0) const {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int32_t& t : p) t = int32_t(first_id + int64_t(rng() % uint64_t(vocab_size() - first_id)));
    return p;
  }

  // ignore_eos: random weights may well pick their EOS id, which would end a comparison early.
  static GenerationRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens, bool ignore_eos = false) {
    return {.prompt = std::move(prompt), .sampling = {.temperature = 0.0f}, .max_tokens = max_tokens,
            .ignore_eos = ignore_eos};
  }

  // Waits until the engine is idle and checks that every block came back.
  static void expect_all_blocks_free(const Engine& engine) {
    EngineMetrics m;
    for (int i = 0; i < 1000; ++i) {
      m = engine.metrics();
      if (m.running == 0 && m.waiting == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(m.running, 0);
    EXPECT_EQ(m.waiting, 0);
    EXPECT_EQ(m.kv_blocks_in_use, 0) << "KV blocks leaked";
    EXPECT_EQ(m.kv_blocks_free, m.kv_blocks_total) << "KV blocks leaked";
  }

 private:
  std::function<std::unique_ptr<Model>()> open_;
  int n_threads_;
  mutable int64_t vocab_size_ = 0;
  mutable std::mutex memo_mutex_;
  mutable std::map<std::pair<std::vector<int32_t>, int64_t>, std::vector<int32_t>> memo_;
};

// Collects step traces from the engine thread (EngineConfig::on_step).
struct TraceLog {
  std::mutex mutex;
  std::vector<StepTrace> steps;
  std::function<void(const StepTrace&)> hook() {
    return [this](const StepTrace& t) {
      std::lock_guard lock(mutex);
      steps.push_back(t);
    };
  }
  std::vector<StepTrace> snapshot() {
    std::lock_guard lock(mutex);
    return steps;
  }
};

}  // namespace spill::testing
