// An engine whose thread stopped after an internal error refuses new requests with
// EngineStoppedError (the server's 503), not the plain spill::Error of a bad request (400).
#include <gtest/gtest.h>

#include <stdexcept>

#include "engine/engine.h"
#include "model/model.h"
#include "model/runner.h"
#include "test_models.h"

namespace spill {
namespace {

TEST(EngineStopped, SubmitAfterAnInternalErrorIsEngineStoppedError) {
  testing::TempDir dir("spill-engine-stopped-test");
  write_random_model(dir.path(), testing::RandomModelParams{.vocab_size = 300, .dense_layers = {0}, .seed = 5});
  auto model = Model::load(dir.path());
  auto runner = make_cpu_runner(*model, {.block_size = 16, .n_blocks = 16}, 1);
  // A step hook that throws stands for any bug inside a step: the engine thread stops.
  EngineConfig config;
  config.on_step = [](const StepTrace&) { throw std::runtime_error("injected step failure"); };
  Engine engine(EngineParts{.model = std::move(model), .runner = std::move(runner)}, config);
  const GenerationRequest request{.prompt = {1, 2, 3}, .sampling = {.temperature = 0.0f}, .max_tokens = 2};
  RequestOutput first = engine.submit(request).collect();
  ASSERT_TRUE(first.finish);
  EXPECT_EQ(first.finish->reason, FinishReason::Error);
  EXPECT_NE(first.finish->error.find("injected step failure"), std::string::npos) << first.finish->error;
  try {
    (void)engine.submit(request);
    FAIL() << "a stopped engine must refuse new requests";
  } catch (const EngineStoppedError& e) {
    EXPECT_NE(std::string(e.what()).find("stopped"), std::string::npos) << e.what();
  }
  // A bad request is still the plain error, not EngineStoppedError.
  GenerationRequest empty = request;
  empty.prompt.clear();
  try {
    (void)engine.submit(empty);
    FAIL() << "an empty prompt must be refused";
  } catch (const EngineStoppedError&) {
    FAIL() << "a bad request is not an engine failure";
  } catch (const Error&) {
  }
}

}  // namespace
}  // namespace spill
