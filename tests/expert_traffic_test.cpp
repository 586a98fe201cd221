// Routed-expert traffic end to end on the CPU: the runner's counts (ModelRunner::expert_traffic),
// the engine's copy of them (EngineMetrics::experts) and the spill:expert_* series of a real
// `spill serve` over HTTP, on a tiny random Qwen3-MoE with a dense layer between its MoE layers
// (so a layer count is not an MoE-layer count) and top-k equal to the number of experts.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/prometheus.h"
#include "engine/engine.h"
#include "engine_harness.h"
#include "model/model.h"
#include "model/runner.h"
#include "spill_process.h"
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

// ---- over HTTP: a real `spill serve` of the model -------------------------------------------

// A `spill serve` child process on a free port: stdout read up to its listening line, stderr to a
// file; SIGTERM and reaped when destroyed.
class ExpertMetricsServeProcess {
 public:
  ExpertMetricsServeProcess(const std::vector<std::string>& args, const std::string& stderr_path) {
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err >= 0) ::dup2(err, 2);
      std::vector<std::string> argv_strings = {test::spill_bin(), "serve"};
      argv_strings.insert(argv_strings.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (std::string& a : argv_strings) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    FILE* in = ::fdopen(out[0], "r");
    char line[512];
    const std::string marker = "listening on http://127.0.0.1:";
    while (in && std::fgets(line, sizeof line, in)) {
      const std::string text = line;
      if (const size_t at = text.find(marker); at != std::string::npos) {
        port_ = std::stoi(text.substr(at + marker.size()));
        break;
      }
    }
    if (in) std::fclose(in);  // the server prints nothing more on stdout
  }
  ~ExpertMetricsServeProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 300; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
  }
  ExpertMetricsServeProcess(const ExpertMetricsServeProcess&) = delete;
  ExpertMetricsServeProcess& operator=(const ExpertMetricsServeProcess&) = delete;

  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

std::string expert_test_file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_F(ExpertTrafficTest, MetricsEndpointServesTheExactCounts) {
  if (test::spill_bin().empty()) GTEST_SKIP() << "SPILL_BIN not set (run through ctest)";
  const std::string log_path = dir_->sub("serve.log");
  ExpertMetricsServeProcess server({"--model", model_dir(), "--port", "0", "--device", "cpu", "--threads",
                                    std::to_string(testing::kTestThreads), "--served-model-name", "moe"},
                                   log_path);
  ASSERT_GT(server.port(), 0) << "no listening line; server log:\n" << expert_test_file_text(log_path);
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(120);
  bool ready = false;
  for (int i = 0; i < 1200 && !ready; ++i) {
    const auto health = client.Get("/health");
    ready = health && health->status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(ready) << "the server did not become ready; its log:\n" << expert_test_file_text(log_path);

  // Before any request: the expert series are there, at zero.
  auto scrape = [&] {
    const auto r = client.Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? bench::parse_prometheus(r->body) : bench::MetricSamples{};
  };
  const std::string l = "{model_name=\"moe\"}";
  const bench::MetricSamples idle = scrape();
  ASSERT_TRUE(idle.contains("spill:expert_tokens_total" + l)) << "no spill:expert_tokens_total before a request";
  EXPECT_EQ(idle.at("spill:expert_tokens_total" + l), 0);
  EXPECT_EQ(idle.at("spill:expert_routings_total" + l), 0);

  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 37; ++i) prompt.push_back(100 + 13 * i);
  const int64_t max_tokens = 6;
  const nlohmann::json body = {
      {"model", "moe"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
  const auto r = client.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r) << "no response";
  ASSERT_EQ(r->status, 200) << r->body;
  const nlohmann::json reply = nlohmann::json::parse(r->body);
  const int64_t prompt_tokens = reply["usage"]["prompt_tokens"],
                completion_tokens = reply["usage"]["completion_tokens"];
  ASSERT_EQ(prompt_tokens, 37);
  ASSERT_EQ(completion_tokens, max_tokens);
  const int64_t tokens = prompt_tokens + completion_tokens - 1;  // the last sampled token is never run

  const bench::MetricSamples s = scrape();
  EXPECT_EQ(s.at("spill:expert_tokens_total" + l), double(tokens));
  EXPECT_EQ(s.at("spill:expert_routings_total" + l), double(tokens * routings_per_token()));
  EXPECT_GT(s.at("spill:expert_step_seconds_total" + l), 0.0);
  // The CPU reads every expert where it is: the host, cache and placement series are all 0.
  for (const char* name :
       {"spill:expert_host_routings_total", "spill:expert_cache_routings_total", "spill:expert_host_read_bytes_total",
        "spill:expert_cpu_routings_total", "spill:expert_cpu_read_bytes_total",
        "spill:expert_staged_steps_total", "spill:expert_staged_bytes_total", "spill:expert_cache_copies_total",
        "spill:expert_cache_copy_bytes_total", "spill:expert_cache_evictions_total",
        "spill:expert_host_routings_per_token", "spill:expert_cache_hit_ratio",
        "spill:expert_host_read_bytes_per_second"})
    EXPECT_EQ(s.at(name + l), 0) << name;
  for (const char* place : {"vram", "host", "cache"})
    EXPECT_EQ(s.at(fmt::format("spill:expert_bytes{{model_name=\"moe\",place=\"{}\"}}", place)), 0) << place;
  for (const char* state : {"total", "used"})
    EXPECT_EQ(s.at(fmt::format("spill:expert_cache_slots{{model_name=\"moe\",state=\"{}\"}}", state)), 0) << state;
  // No host experts: the request's log line has no expert part. The server writes that line on the
  // request's thread after the response has gone out, so it may land after the scrape above.
  std::string log = expert_test_file_text(log_path);
  for (int i = 0; i < 100 && log.find("POST /v1/completions 200") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    log = expert_test_file_text(log_path);
  }
  EXPECT_NE(log.find("POST /v1/completions 200"), std::string::npos) << log;
  EXPECT_EQ(log.find("experts since start"), std::string::npos) << log;
}

}  // namespace
}  // namespace spill
