// The runner contract as the engine relies on it (src/model/runner.h): limits and slots are held
// to, a KV budget becomes the pool the runner reports, a fatal device error ends the engine
// cleanly, an ordinary forward failure or a row with nothing to sample fails only its own
// requests, and --device resolves as documented. The failures come from a test double that wraps
// the real CPU runner and breaks on cue.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "backend/cuda/device_info.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/open_engine.h"
#include "model/model.h"
#include "model/runner.h"
#include "test_models.h"

namespace spill {
namespace {

using testing::RandomModelParams;
using testing::TempDir;
using testing::kTestThreads;
using testing::write_random_model;

// The real CPU runner, with hooks before and after each forward. It does not override
// forward_sample, so the engine's steps go through the base class's host sampling.
class WrappedRunner final : public ModelRunner {
 public:
  explicit WrappedRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}
  const ModelSpec& spec() const override { return inner_->spec(); }
  const KvCacheConfig& kv_config() const override { return inner_->kv_config(); }
  const RunnerLimits& limits() const override { return inner_->limits(); }
  std::string describe() const override { return "wrapped " + inner_->describe(); }
  void forward(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer) override {
    ++calls;
    if (before) before(batch, calls);
    inner_->forward(batch, logits, observer);
    if (after) after(batch, logits);
  }

  int calls = 0;
  std::function<void(const ForwardBatch&, int call)> before;  // may throw
  std::function<void(const ForwardBatch&, std::vector<float>&)> after;

 private:
  std::unique_ptr<ModelRunner> inner_;
};

class EngineRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("spill-engine-runner-test");
    write_random_model(dir_->path(), RandomModelParams{.vocab_size = 300, .dense_layers = {0}, .seed = 23});
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // An engine over a WrappedRunner; *wrapped points at it (owned by the engine).
  static std::unique_ptr<Engine> make_engine(const EngineConfig& config, WrappedRunner** wrapped,
                                             std::function<void(WrappedRunner&)> setup = {}) {
    auto model = Model::load(dir_->path());
    auto runner = std::make_unique<WrappedRunner>(make_cpu_runner(*model, {.block_size = 16, .n_blocks = 64}, kTestThreads));
    *wrapped = runner.get();
    if (setup) setup(*runner);  // before the engine thread can call it
    return std::make_unique<Engine>(EngineParts{.model = std::move(model), .runner = std::move(runner)}, config);
  }

  static std::vector<int32_t> prompt(int32_t first, int n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) p[size_t(i)] = (first + 37 * i) % 300;
    return p;
  }
  static GenerationRequest greedy(std::vector<int32_t> p, int64_t max_tokens) {
    return {.prompt = std::move(p), .sampling = {.temperature = 0.0f}, .max_tokens = max_tokens};
  }

  // What an unbroken engine produces for a request.
  static std::vector<int32_t> reference(const GenerationRequest& r) {
    auto model = Model::load(dir_->path());
    auto runner = make_cpu_runner(*model, {.block_size = 16, .n_blocks = 64}, kTestThreads);
    Engine engine(EngineParts{.model = std::move(model), .runner = std::move(runner)}, {});
    RequestOutput o = engine.submit(r).collect();
    EXPECT_EQ(o.finish->reason, FinishReason::Length) << o.finish->error;
    return o.token_ids;
  }

  static TempDir* dir_;
};

TempDir* EngineRunnerTest::dir_ = nullptr;

// Holds the first forward until the test has submitted everything it means to.
struct Gate {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
};

TEST_F(EngineRunnerTest, AFatalDeviceErrorEndsEveryOpenRequestAndStopsTheEngine) {
  Gate gate;
  WrappedRunner* runner = nullptr;
  // One sequence runs at a time, so when the device fails one request is running and the rest wait.
  auto engine = make_engine({.scheduler = {.max_running = 1}}, &runner, [&](WrappedRunner& r) {
    r.before = [&gate](const ForwardBatch&, int call) {
      if (call == 1) gate.opened.wait();
      if (call == 3) throw DeviceFatalError("injected: the GPU fell off the bus");
    };
  });
  std::vector<RequestStream> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(engine->submit(greedy(prompt(10 * i + 1, 5 + i), 20)));
  gate.open.set_value();
  for (size_t i = 0; i < streams.size(); ++i) {
    RequestOutput o = streams[i].collect();
    ASSERT_TRUE(o.finish);
    EXPECT_EQ(o.finish->reason, FinishReason::Error) << "request " << i;
    EXPECT_NE(o.finish->error.find("injected: the GPU fell off the bus"), std::string::npos) << o.finish->error;
    EXPECT_NE(o.finish->error.find("device"), std::string::npos) << o.finish->error;
  }
  // The first request had run two steps (its prompt, one decode) before the device failed; the
  // others never ran.
  EXPECT_EQ(runner->calls, 3);
  try {
    (void)engine->submit(greedy(prompt(3, 4), 2));
    FAIL() << "a stopped engine must refuse new requests";
  } catch (const EngineStoppedError& e) {
    EXPECT_NE(std::string(e.what()).find("device"), std::string::npos) << e.what();
  }
  const EngineMetrics m = engine->metrics();
  EXPECT_EQ(m.requests_failed, 4);
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.kv_blocks_in_use, 0);
}

TEST_F(EngineRunnerTest, AnOrdinaryForwardFailureFailsOnlyThatStepsSequences) {
  const GenerationRequest third = greedy(prompt(200, 9), 6);
  const std::vector<int32_t> expected = reference(third);
  Gate gate;
  WrappedRunner* runner = nullptr;
  auto engine = make_engine({.scheduler = {.max_running = 2}}, &runner, [&](WrappedRunner& r) {
    r.before = [&gate](const ForwardBatch&, int call) {
      if (call == 1) gate.opened.wait();
      if (call == 2) throw std::runtime_error("injected: one step went wrong");
    };
  });
  // Step 1 runs the first prompt alone; step 2 (the one that fails) holds its decode and the
  // second prompt; the third waits for a free slot and runs after.
  RequestStream a = engine->submit(greedy(prompt(1, 5), 6));
  RequestStream b = engine->submit(greedy(prompt(50, 7), 6));
  RequestStream c = engine->submit(third);
  gate.open.set_value();
  for (RequestStream* s : {&a, &b}) {
    RequestOutput o = s->collect();
    EXPECT_EQ(o.finish->reason, FinishReason::Error);
    EXPECT_NE(o.finish->error.find("injected: one step went wrong"), std::string::npos) << o.finish->error;
  }
  RequestOutput oc = c.collect();
  EXPECT_EQ(oc.finish->reason, FinishReason::Length) << oc.finish->error;
  EXPECT_EQ(oc.token_ids, expected) << "the failed step must not have touched the third request";
  // The engine carries on.
  RequestOutput again = engine->submit(third).collect();
  EXPECT_EQ(again.token_ids, expected);
  EXPECT_EQ(engine->metrics().requests_failed, 2);
}

TEST_F(EngineRunnerTest, ARowWithNoFiniteLogitFailsOnlyItsRequest) {
  constexpr int32_t kMarker = 7;  // the poisoned request's prompt starts with it
  std::vector<int32_t> poisoned_prompt = prompt(kMarker, 6);
  const GenerationRequest healthy = greedy(prompt(120, 8), 5);
  const std::vector<int32_t> expected = reference(healthy);
  Gate gate;
  WrappedRunner* runner = nullptr;
  // The double tells requests apart by their slot: it learns a slot's occupant from the chunk
  // that starts it (first_in_slot), as a device runner keeps per-slot state.
  std::vector<bool> poisoned_slot(64, false);
  auto engine = make_engine({}, &runner, [&](WrappedRunner& r) {
    r.before = [&gate](const ForwardBatch&, int call) {
      if (call == 1) gate.opened.wait();
    };
    r.after = [&poisoned_slot](const ForwardBatch& batch, std::vector<float>& logits) {
      if (batch.n_logit_rows() == 0) return;
      const size_t vocab = logits.size() / size_t(batch.n_logit_rows());
      size_t row = 0;
      for (const SeqChunk& c : batch.seqs) {
        if (c.first_in_slot)
          poisoned_slot[size_t(c.slot)] = c.start_pos == 0 && batch.tokens[size_t(c.first_token)] == kMarker;
        if (!c.want_logits) continue;
        if (poisoned_slot[size_t(c.slot)])
          std::fill_n(logits.begin() + std::ptrdiff_t(row * vocab), vocab, std::numeric_limits<float>::quiet_NaN());
        ++row;
      }
    };
  });
  RequestStream first = engine->submit(healthy);
  RequestStream bad = engine->submit(greedy(poisoned_prompt, 5));
  RequestStream last = engine->submit(healthy);
  gate.open.set_value();
  RequestOutput ob = bad.collect();
  EXPECT_EQ(ob.finish->reason, FinishReason::Error);
  EXPECT_NE(ob.finish->error.find("NaN"), std::string::npos) << ob.finish->error;
  EXPECT_TRUE(ob.token_ids.empty());
  for (RequestStream* s : {&first, &last}) {
    RequestOutput o = s->collect();
    EXPECT_EQ(o.finish->reason, FinishReason::Length) << o.finish->error;
    EXPECT_EQ(o.token_ids, expected);
  }
  EXPECT_EQ(engine->metrics().requests_failed, 1);
}

TEST_F(EngineRunnerTest, TheDefaultForwardSampleChecksItsArguments) {
  auto model = Model::load(dir_->path());
  auto runner = make_cpu_runner(*model, {.block_size = 16, .n_blocks = 4}, kTestThreads);
  std::vector<int32_t> table = {0, 1};
  ForwardBatch batch;
  batch.tokens = {1, 2, 3};
  batch.seqs.push_back({.first_token = 0, .n_tokens = 3, .start_pos = 0, .block_table = table, .want_logits = true});
  SequenceSampler sampler({.temperature = 0.0f}, batch.tokens, 1);
  SequenceSampler* const one[] = {&sampler};
  StepResult out;
  EXPECT_THROW(runner->forward_sample(batch, {}, out), Error);  // one logit row, no sampler
  batch.all_logits = true;
  EXPECT_THROW(runner->forward_sample(batch, one, out), Error);  // every-token logits are forward()'s job
  batch.all_logits = false;
  runner->forward_sample(batch, one, out);
  ASSERT_EQ(out.rows.size(), 1u);
  EXPECT_TRUE(out.rows[0].ok());
  // The same token as the host's own greedy pick over forward()'s logits.
  std::vector<float> logits;
  runner->forward(batch, logits);
  EXPECT_EQ(out.rows[0].sampled.token, int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  EXPECT_EQ(sampler.n_sampled(), 1u);
}

TEST_F(EngineRunnerTest, TheCpuRunnerHoldsBatchesToItsLimitsAndSlots) {
  auto model = Model::load(dir_->path());
  auto runner = make_cpu_runner(
      *model, CpuRunnerConfig{.kv = {.block_size = 4, .blocks = 16},
                              .limits = {.max_seqs = 2, .max_batch_tokens = 8, .max_model_len = 12},
                              .n_threads = kTestThreads});
  EXPECT_EQ(runner->limits().max_seqs, 2);
  EXPECT_EQ(runner->limits().max_batch_tokens, 8);
  EXPECT_EQ(runner->limits().max_model_len, 12);
  std::vector<int32_t> t0 = {0, 1, 2, 3}, t1 = {4, 5, 6, 7}, t2 = {8, 9, 10, 11};  // 16 positions each
  std::vector<float> logits;
  auto batch_of = [](std::vector<std::pair<int32_t, std::span<const int32_t>>> chunks, int32_t tokens_each,
                     int32_t start_pos = 0) {
    ForwardBatch b;
    for (const auto& [slot, table] : chunks) {
      const int32_t first = int32_t(b.tokens.size());
      for (int32_t i = 0; i < tokens_each; ++i) b.tokens.push_back(5 + i);
      b.seqs.push_back({.first_token = first,
                        .n_tokens = tokens_each,
                        .start_pos = start_pos,
                        .block_table = table,
                        .want_logits = true,
                        .slot = slot});
    }
    return b;
  };
  auto refusal = [&](const ForwardBatch& b) {
    try {
      runner->forward(b, logits);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  auto says = [](const std::string& what, const char* part) {
    EXPECT_NE(what.find(part), std::string::npos) << "expected '" << part << "' in: " << what;
  };
  EXPECT_NO_THROW(runner->forward(batch_of({{0, t0}, {1, t1}}, 4), logits));
  EXPECT_EQ(logits.size(), 2u * size_t(model->spec().vocab_size));
  says(refusal(batch_of({{0, t0}, {1, t1}, {1, t2}}, 1)), "--max-seqs");     // 3 sequences, 2 slots
  says(refusal(batch_of({{0, t0}, {0, t1}}, 1)), "share a slot");
  says(refusal(batch_of({{2, t0}}, 1)), "slot 2 is outside [0, 2)");
  says(refusal(batch_of({{-1, t0}}, 1)), "slot -1 is outside [0, 2)");
  says(refusal(batch_of({{0, t0}, {1, t1}}, 5)), "--max-batch-tokens");      // 10 tokens, 8 allowed
  says(refusal(batch_of({{0, t0}}, 2, 11)), "--max-model-len");              // reaches position 12 of 12
  EXPECT_NO_THROW(runner->forward(batch_of({{1, t0}}, 1, 11), logits));      // position 11 is the last
}

TEST_F(EngineRunnerTest, TheEngineRefusesAConfigurationBeyondItsRunnersLimits) {
  auto engine_with = [&](const EngineConfig& config) {
    auto model = Model::load(dir_->path());
    auto runner = make_cpu_runner(*model, CpuRunnerConfig{.kv = {.block_size = 16, .blocks = 8},
                                                          .limits = {.max_seqs = 4, .max_batch_tokens = 64},
                                                          .n_threads = kTestThreads});
    return std::make_unique<Engine>(EngineParts{.model = std::move(model), .runner = std::move(runner)}, config);
  };
  auto message = [&](const EngineConfig& config) {
    try {
      engine_with(config);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.scheduler = {.max_running = 5, .max_batch_tokens = 64}}).find("--max-seqs"), std::string::npos);
  EXPECT_NE(message({.scheduler = {.max_running = 4, .max_batch_tokens = 65}}).find("--max-batch-tokens"),
            std::string::npos);
  EXPECT_EQ(message({.scheduler = {.max_running = 4, .max_batch_tokens = 64}}), "");
  // The context limit defaults to the runner's: here the pool (8 x 16 tokens) caps the model's 4096.
  auto engine = engine_with({.scheduler = {.max_running = 4, .max_batch_tokens = 64}});
  EXPECT_EQ(engine->max_model_len(), 128);
}

TEST_F(EngineRunnerTest, AKvBudgetBecomesThePoolTheRunnerReports) {
  auto model = Model::load(dir_->path());
  const ModelSpec& spec = model->spec();
  // K and V in f32, every layer: the runner's own figure, not the engine's.
  const int64_t per_block = 2 * spec.n_layers * spec.kv_dim() * 4 * 16;
  const int64_t budget = 10 * per_block + per_block / 2;
  auto runner = make_cpu_runner(*model, CpuRunnerConfig{.kv = {.block_size = 16, .bytes = budget}, .n_threads = 1});
  EXPECT_EQ(runner->kv_config().bytes_per_block, per_block);
  EXPECT_EQ(runner->kv_config().format, KvFormat::F32);
  EXPECT_EQ(runner->kv_config().n_blocks, 10);
  EXPECT_THROW(make_cpu_runner(*model, CpuRunnerConfig{.kv = {.block_size = 16, .bytes = per_block - 1}}), Error);
  EXPECT_THROW(make_cpu_runner(*model, CpuRunnerConfig{.kv = {.block_size = 16, .blocks = 4, .bytes = budget}}),
               Error);
  // Through the factory, the engine's pool is the runner's.
  auto engine = open_engine(
      dir_->path(), EngineOptions{.runner = {.device = {Device::Cpu}, .threads = 1, .kv = {.block_size = 16, .bytes = budget}}},
      {});
  EXPECT_EQ(engine->metrics().kv_blocks_total, 10);
  EXPECT_EQ(engine->metrics().kv_block_size, 16);
  EXPECT_EQ(engine->max_model_len(), 160);
}

TEST(Device, ParsingAcceptsTheDocumentedSpellingsAndNamesTheFlag) {
  EXPECT_EQ(parse_device("cpu").device, Device::Cpu);
  EXPECT_EQ(parse_device("AUTO").device, Device::Auto);
  EXPECT_EQ(parse_device("cuda").device, Device::Cuda);
  EXPECT_EQ(parse_device("cuda").cuda_index, 0);
  EXPECT_EQ(parse_device("cuda:3").cuda_index, 3);
  EXPECT_EQ(device_name(parse_device("cuda:3")), "cuda:3");
  EXPECT_TRUE(parse_device("cuda:3").cuda_list.empty());
  const DeviceChoice two = parse_device("CUDA:2,0");
  EXPECT_EQ(two.cuda_index, 2);
  EXPECT_EQ(two.cuda_list, (std::vector<int>{2, 0}));
  EXPECT_EQ(device_name(two), "cuda:2,0");
  for (const char* bad : {"", "tpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:x", "cuda:0,", "cuda:,1", "cuda:0,0",
                          "cuda:0,,1", "cuda:0;1"}) {
    try {
      (void)parse_device(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--device"), std::string::npos) << e.what();
    }
  }
}

TEST(Device, AutoIsCpuUnlessACudaRunnerAndAGpuAreThereAndCudaIsRefusedClearlyOtherwise) {
  EXPECT_EQ(resolve_device({Device::Cpu}).device, Device::Cpu);
  const DeviceChoice chosen = resolve_device({Device::Auto});
  ASSERT_NE(chosen.device, Device::Auto);
  if (chosen.device == Device::Cuda) {
    EXPECT_FALSE(list_gpus().empty()) << "auto chose cuda on a machine without a GPU";
    return;
  }
  // auto meant cpu: either this build has no CUDA runner or there is no usable GPU. Either way
  // --device cuda must say so instead of running somewhere else.
  try {
    (void)resolve_device({Device::Cuda});
    FAIL() << "--device cuda was accepted where auto resolves to cpu";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--device cuda:0"), std::string::npos) << what;
    EXPECT_TRUE(what.find("no CUDA runner") != std::string::npos || what.find("no usable GPU") != std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace spill
