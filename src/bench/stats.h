// Statistics of a benchmark run, defined the way vLLM's serving benchmark defines them, so that
// spill's numbers and vLLM's (or SGLang's, which copies them) can be compared directly:
//   TTFT  time from sending the request to the first streamed token (content or reasoning);
//   TPOT  per request, (end-to-end latency - TTFT) / (output tokens - 1): the first token excluded;
//         only requests with more than one output token have one;
//   ITL   every gap between consecutive streamed chunks after the first, pooled over requests;
//   E2EL  time from sending to the last token of the reply (vLLM times the last content chunk);
//   throughput: completed requests, output tokens, and input + output tokens per second of the
//         group's duration (first send to last reply).
// Percentiles interpolate linearly between order statistics (numpy.percentile's default), as vLLM's
// use of numpy does. On top, the figure a developer feels: per-stream decode speed of a request,
// 1 / TPOT in tokens per second, summarised by median and 5th percentile (the slowest 5%).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace spill::bench {

// One request as the client saw it. Times are seconds on the run's steady clock.
struct RequestRecord {
  std::string scenario;  // e.g. "agent-32k"
  std::string phase;     // warmup, agent, long-context, prefix-cache, pp, tg
  std::string group;     // the summary it belongs to: "c=4", "len=4096", "pp512@d0", ...
  double group_x = 0;    // that group's value on a chart's x axis (concurrency, prompt length, depth)
  int concurrency = 1;   // streams the scenario ran at once when this request was sent
  int session = 0;       // agent session (or user) number within the group
  int turn = 0;          // turn within the session (or repetition)
  int64_t content_tokens = 0;  // tokens of the message text the client built (exact, from the tokenizer)
  int64_t max_tokens = 0;      // asked for; output is fixed at this length when ignore_eos is on
  // From the server's usage block (or, without one, counted from the stream):
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t output_tokens = 0;
  bool usage_reported = false;
  double start_s = 0;       // when the request was sent
  double ttft_s = -1;       // < 0: no token arrived
  double latency_s = 0;     // send to the last token (to the end of the reply when none came)
  std::vector<double> itl_s;  // gaps between consecutive token-bearing chunks
  std::string finish_reason;
  int http_status = 0;
  std::string error;  // empty when the request succeeded

  bool ok() const { return error.empty() && http_status == 200; }
  // (latency - TTFT) / (output tokens - 1); < 0 when undefined (one token or none).
  double tpot_s() const;
};

// Summary of one sample of values.
struct Distribution {
  size_t count = 0;
  double mean = 0, stddev = 0, min = 0, max = 0;
  double p5 = 0, p25 = 0, median = 0, p75 = 0, p90 = 0, p95 = 0, p99 = 0;
};

// numpy.percentile(values, p) with the default linear method; values need not be sorted.
// Throws spill::Error on an empty sample or p outside [0, 100].
double percentile(std::span<const double> values, double p);
// Empty sample: count 0 and zeros. stddev is the population one (numpy.std's default, as vLLM).
Distribution describe(std::span<const double> values);

// vLLM's metrics over a group of requests (one concurrency level of one scenario, say).
struct GroupSummary {
  size_t completed = 0, failed = 0;
  int64_t input_tokens = 0, output_tokens = 0, cached_tokens = 0;
  double duration_s = 0;  // first send to last end among completed requests
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
  Distribution ttft_s, tpot_s, itl_s, e2el_s;
  Distribution stream_tok_s;  // per-request 1 / TPOT
};

GroupSummary summarize(std::span<const RequestRecord> records);

}  // namespace spill::bench
