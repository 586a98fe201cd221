// Runs scenarios against a server: builds every prompt first (so tokenizing never overlaps the
// timed part), then drives the streams (closed loop of N agents, or Poisson session arrivals
// capped at N at once), records every request, shows a progress line, and scrapes /metrics
// before and after.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "bench/client.h"
#include "bench/stats.h"
#include "bench/workload.h"

namespace spill::bench {

struct RunOptions {
  Endpoint endpoint;
  uint64_t seed = 1;
  bool ignore_eos = true;  // false: natural output lengths (max_tokens still caps them)
  double temperature = 0;
  bool warmup = true;      // one request per scenario that fills the prefix cache before timing
  bool progress = true;    // the progress line on stderr
  int64_t max_model_len = 0;  // 0: what /v1/models says (no check when it says nothing)
};

struct ScenarioResult {
  Scenario scenario;
  std::string skipped;  // why the scenario did not run (did not fit the context); empty when it ran
  std::vector<std::string> notes;  // parts left out (lengths beyond the context, ...)
};

struct BenchResult {
  ServerInfo server;
  std::string url;
  std::string tokenizer;  // what counted the prompt tokens
  std::string started_utc;
  double wall_s = 0;
  RunOptions options;
  std::vector<ScenarioResult> scenarios;
  std::vector<RequestRecord> records;  // in the order they finished
  std::optional<std::string> metrics_before, metrics_after;
};

// Throws spill::Error for setup problems (server unreachable, tokenizer); failed requests are
// recorded, not thrown.
BenchResult run_bench(const std::vector<Scenario>& scenarios, const RunOptions& options, TokenCounter& counter,
                      const ServerInfo& server);

}  // namespace spill::bench
