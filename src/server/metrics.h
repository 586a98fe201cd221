// Prometheus metrics of the server, in the text exposition format (version 0.0.4).
//
// Names follow vLLM's (vllm:num_requests_running -> spill:num_requests_running, ...), so the
// dashboards and alerts people already have for vLLM work with a changed prefix. Every series
// carries model_name="<served model>", as vLLM's do.
//
// Two sources: what the engine knows at scrape time (running/waiting, KV usage, prefix-cache
// counters, preemptions, the routed experts' traffic) arrives as an EngineGauges snapshot; what
// the server sees per request (tokens, finish reasons, TTFT, inter-token latency, end-to-end
// latency) is recorded here as requests finish. All methods are thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/runner.h"

namespace spill::server {

// A cumulative histogram with fixed upper bounds (the +Inf bucket is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends _bucket{...,le="..."}, _sum and _count lines; labels is e.g. `model_name="m"`.
  void render(std::string& out, std::string_view name, std::string_view help, std::string_view labels) const;

  uint64_t count() const;
  double sum() const;

 private:
  std::vector<double> upper_bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> bucket_counts_;  // per bucket (not cumulative); last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// The engine's state at scrape time.
struct EngineGauges {
  int64_t requests_running = 0;
  int64_t requests_waiting = 0;
  double kv_cache_usage = 0;            // fraction of KV blocks in use, 0..1
  int64_t prefix_cache_queries = 0;     // prompt tokens looked up in the prefix cache, ever
  int64_t prefix_cache_hits = 0;        // of which found
  int64_t preemptions = 0;              // ever
  int64_t kv_blocks_total = 0;
  // The runner's counts of routed-expert reads; set when the model has routed experts (then the
  // spill:expert_* series are rendered, zeros included), none for a dense model.
  std::optional<ExpertTraffic> experts{};
};

// What /metrics derives from ExpertTraffic, and the server's log line prints. Each is 0 while its
// denominator is 0 (no token yet, no host expert routed, no step timed), as vLLM's prefix-cache
// hit rate is before any query.
struct ExpertRatios {
  double host_routings_per_token = 0;  // host_routings / tokens
  double host_bytes_per_token = 0;     // host_bytes / tokens
  double cache_hit_ratio = 0;          // cache_routings / (cache_routings + host_routings)
  double host_bytes_per_second = 0;    // host_bytes / step_seconds
};
ExpertRatios expert_ratios(const ExpertTraffic& t);
// The expert part of a generation request's log line, engine-wide since start (a runner's counts
// are not per request): " experts since start: host 1.37/token, 2.1 MiB/token, cache hit 43.2%"
// (the hit rate only with a VRAM expert cache). "" when no routed expert lives in host RAM.
std::string expert_log_summary(const ExpertTraffic& t);

// What the server records when a request ends.
struct FinishedRequestStats {
  std::string finish_reason;         // stop, length, tool_calls, abort, error
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t cached_tokens = 0;
  double e2e_seconds = 0;            // arrival to last token
  double ttft_seconds = -1;          // arrival to first token; < 0: no token came
  std::vector<double> inter_token_seconds;  // gaps between consecutive tokens
};

class ServerMetrics {
 public:
  ServerMetrics();

  void record_finished(const FinishedRequestStats& stats);
  // A request refused before it reached the engine (validation, queue full, ...), by HTTP status.
  void record_rejected(int http_status);

  std::string render(const EngineGauges& engine, std::string_view model_name) const;

  // Bucket bounds, seconds (vLLM's, with finer low buckets where spill's targets sit).
  static std::vector<double> ttft_buckets();
  static std::vector<double> inter_token_buckets();
  static std::vector<double> e2e_buckets();
  static std::vector<double> token_count_buckets();

 private:
  mutable std::mutex mutex_;
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  int64_t cached_prompt_tokens_ = 0;
  std::map<std::string, int64_t> finished_by_reason_;
  std::map<int, int64_t> rejected_by_status_;
  Histogram ttft_, inter_token_, e2e_, prompt_tokens_hist_, generation_tokens_hist_;
};

// Escapes a Prometheus label value (backslash, double quote, newline).
std::string escape_label_value(std::string_view value);

}  // namespace spill::server
