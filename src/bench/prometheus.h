// Reading a server's Prometheus /metrics text, so a benchmark report can say what the server saw
// (requests, prompt / generated / cached tokens, prefix-cache hits, preemptions) next to what the
// client measured. spill's names carry the `spill:` prefix and vLLM's `vllm:`; both are read.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace spill::bench {

// series ("name{labels}" exactly as written, or "name") -> value. Comments and histograms' bucket
// lines are kept like any other series; malformed lines are skipped (a scrape is evidence, not input).
using MetricSamples = std::map<std::string, double>;
MetricSamples parse_prometheus(std::string_view text);

// The sum over every series of `name` (all label sets), or nullopt when no series has that name.
std::optional<double> metric_sum(const MetricSamples& samples, std::string_view name);

// The counters a report compares with its own totals, after - before, under the server's prefix
// (found from the scrape: "spill:" or "vllm:"). Missing counters stay nullopt.
struct ServerCounters {
  std::string prefix;  // "spill:", "vllm:" or "" when neither is present
  std::optional<double> requests;  // request_success_total over every finish reason
  std::optional<double> prompt_tokens, generation_tokens, cached_prompt_tokens;
  std::optional<double> prefix_cache_queries, prefix_cache_hits, preemptions;
};
ServerCounters counters_of(const MetricSamples& samples);
ServerCounters counter_delta(const ServerCounters& before, const ServerCounters& after);

}  // namespace spill::bench
