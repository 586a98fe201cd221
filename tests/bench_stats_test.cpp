// spill bench's statistics on synthetic timelines whose answers follow from their construction,
// and the parsers that feed them (server-sent events, Prometheus text).
#include <gtest/gtest.h>

#include <cmath>

#include "bench/client.h"
#include "bench/prometheus.h"
#include "bench/stats.h"
#include "core/error.h"

namespace spill::bench {
namespace {

// Linear interpolation on an arithmetic progression c, 2c, ..., n c is exact:
// the p-th percentile is c (1 + p/100 (n - 1)).
double progression_percentile(double c, int n, double p) { return c * (1 + p / 100.0 * (n - 1)); }

TEST(BenchStats, PercentileInterpolatesLinearlyLikeNumpy) {
  std::vector<double> v;
  for (int k = 1; k <= 37; ++k) v.push_back(0.25 * k);
  std::vector<double> shuffled(v.rbegin(), v.rend());  // order must not matter
  for (double p : {0.0, 5.0, 25.0, 50.0, 90.0, 95.0, 99.0, 100.0})
    EXPECT_DOUBLE_EQ(percentile(shuffled, p), progression_percentile(0.25, 37, p)) << "p" << p;
  std::vector<double> one = {3.5};
  EXPECT_DOUBLE_EQ(percentile(one, 5), 3.5);
  EXPECT_THROW(percentile(std::vector<double>{}, 50), Error);
  EXPECT_THROW(percentile(one, 101), Error);
}

TEST(BenchStats, DescribeMeanAndPopulationStddev) {
  std::vector<double> v = {2, 4, 4, 4, 5, 5, 7, 9};  // mean 5, population variance 4
  Distribution d = describe(v);
  EXPECT_EQ(d.count, 8u);
  EXPECT_DOUBLE_EQ(d.mean, 5);
  EXPECT_DOUBLE_EQ(d.stddev, 2);
  EXPECT_DOUBLE_EQ(d.min, 2);
  EXPECT_DOUBLE_EQ(d.max, 9);
  EXPECT_EQ(describe(std::vector<double>{}).count, 0u);
}

// n requests; request i (0-based) starts at 0.5 i, its first token comes after 0.1 (i + 1) s, then
// 10 more tokens every g_i = 0.01 (i + 1) s. So TTFT, TPOT and every ITL are arithmetic progressions.
std::vector<RequestRecord> timeline(int n) {
  std::vector<RequestRecord> out;
  for (int i = 0; i < n; ++i) {
    RequestRecord r;
    r.http_status = 200;
    r.start_s = 0.5 * i;
    r.ttft_s = 0.1 * (i + 1);
    double gap = 0.01 * (i + 1);
    r.output_tokens = 11;
    r.prompt_tokens = 100 + i;
    r.cached_tokens = i;
    r.itl_s.assign(10, gap);
    r.latency_s = r.ttft_s + 10 * gap;
    out.push_back(r);
  }
  return out;
}

TEST(BenchStats, SummaryOfAKnownTimeline) {
  const int n = 21;
  std::vector<RequestRecord> recs = timeline(n);
  // Failed requests and one-token replies change counts only where they should.
  RequestRecord failed;
  failed.http_status = 503;
  failed.error = "HTTP 503";
  failed.start_s = 100;  // would stretch the duration if it were counted
  recs.push_back(failed);
  GroupSummary s = summarize(recs);
  EXPECT_EQ(s.completed, size_t(n));
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.output_tokens, 11 * n);
  EXPECT_EQ(s.input_tokens, 100 * n + n * (n - 1) / 2);
  EXPECT_EQ(s.cached_tokens, n * (n - 1) / 2);
  for (double p : {5.0, 50.0, 95.0, 99.0}) {
    SCOPED_TRACE(p);
    auto at = [&](const Distribution& d) { return p == 5 ? d.p5 : p == 50 ? d.median : p == 95 ? d.p95 : d.p99; };
    EXPECT_NEAR(at(s.ttft_s), progression_percentile(0.1, n, p), 1e-12);
    EXPECT_NEAR(at(s.tpot_s), progression_percentile(0.01, n, p), 1e-12);
  }
  // ITL pools 10 equal gaps per request: 210 values, 10 copies of each 0.01 k. Its median is
  // interpolated at rank 104.5: order statistics 104 and 105 (0-based), both request 10's 0.11.
  EXPECT_EQ(s.itl_s.count, size_t(10 * n));
  EXPECT_NEAR(s.itl_s.median, 0.11, 1e-12);
  EXPECT_NEAR(s.itl_s.mean, 0.01 * (n + 1) / 2.0, 1e-12);
  // E2EL_i = 0.1 (i + 1) + 0.1 (i + 1) = 0.2 (i + 1).
  EXPECT_NEAR(s.e2el_s.median, progression_percentile(0.2, n, 50), 1e-12);
  // Per-stream speed 1 / g_i = 100 / (i + 1): its median is the middle request's, and with
  // n = 21 the 5th percentile's rank is exactly 1, the second slowest: 100 / 20.
  EXPECT_NEAR(s.stream_tok_s.median, 100.0 / 11, 1e-9);
  EXPECT_NEAR(s.stream_tok_s.p5, 100.0 / 20, 1e-9);
  // Duration: first start 0, last end 0.5 * 20 + 0.2 * 21 = 14.2 s.
  EXPECT_NEAR(s.duration_s, 14.2, 1e-12);
  EXPECT_NEAR(s.request_throughput, n / 14.2, 1e-9);
  EXPECT_NEAR(s.output_throughput, 11.0 * n / 14.2, 1e-9);
  EXPECT_NEAR(s.total_token_throughput, double(s.input_tokens + s.output_tokens) / 14.2, 1e-9);
}

TEST(BenchStats, TpotExcludesTheFirstTokenAndNeedsTwo) {
  RequestRecord r;
  r.http_status = 200;
  r.ttft_s = 2.0;
  r.latency_s = 2.5;
  r.output_tokens = 6;  // 5 gaps after the first token
  EXPECT_DOUBLE_EQ(r.tpot_s(), 0.1);
  r.output_tokens = 1;
  EXPECT_LT(r.tpot_s(), 0);
  GroupSummary s = summarize(std::vector<RequestRecord>{r});
  EXPECT_EQ(s.tpot_s.count, 0u);
  EXPECT_EQ(s.ttft_s.count, 1u);
  EXPECT_DOUBLE_EQ(s.ttft_s.median, 2.0);
}

TEST(BenchSse, FoldsAStreamSplitAtAwkwardPlaces) {
  std::string body =
      ": ping\n\n"
      "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}],\"usage\":null}\n\n"
      "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"def\"},\"finish_reason\":null}],\"usage\":null}\r\n\r\n"
      "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n"
      "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" f\"},\"finish_reason\":null}]}\n\n"
      "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":57,\"completion_tokens\":3,\"total_tokens\":60,"
      "\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\n"
      "data: [DONE]\n\n";
  // Every split point: the fold must not depend on how the bytes arrive.
  for (size_t cut = 0; cut <= body.size(); cut += 7) {
    StreamState st;
    int64_t tokens = feed_sse(st, std::string_view(body).substr(0, cut));
    tokens += feed_sse(st, std::string_view(body).substr(cut));
    SCOPED_TRACE(cut);
    EXPECT_EQ(tokens, 3);
    EXPECT_EQ(st.token_chunks, 3);
    EXPECT_EQ(st.content, "def f");
    EXPECT_EQ(st.finish_reason, "length");
    EXPECT_TRUE(st.done);
    EXPECT_EQ(st.prompt_tokens.value_or(-1), 57);
    EXPECT_EQ(st.completion_tokens.value_or(-1), 3);
    EXPECT_EQ(st.cached_tokens.value_or(-1), 48);
    EXPECT_TRUE(st.error.empty());
  }
}

TEST(BenchSse, ReportsAnErrorEvent) {
  StreamState st;
  feed_sse(st, "data: {\"error\":{\"message\":\"engine failed\",\"type\":\"server_error\"}}\n\ndata: [DONE]\n\n");
  EXPECT_EQ(st.error, "engine failed");
  EXPECT_TRUE(st.done);
}

TEST(BenchPrometheus, SumsSeriesOfOneNameOnly) {
  std::string text =
      "# HELP spill:request_success_total Finished requests.\n"
      "# TYPE spill:request_success_total counter\n"
      "spill:request_success_total{model_name=\"m\",finished_reason=\"stop\"} 3\n"
      "spill:request_success_total{model_name=\"a b}\\\"c\",finished_reason=\"length\"} 4\n"
      "spill:request_success_total_extra 100\n"
      "spill:prompt_tokens_total{model_name=\"m\"} 1.5e3\n"
      "spill:prompt_tokens_cached_total{model_name=\"m\"} 640 1700000000\n"
      "spill:num_requests_running{model_name=\"m\"} 0\n"
      "garbage line without value\n";
  MetricSamples m = parse_prometheus(text);
  EXPECT_EQ(metric_sum(m, "spill:request_success_total").value_or(-1), 7);
  EXPECT_EQ(metric_sum(m, "spill:prompt_tokens_total").value_or(-1), 1500);
  EXPECT_EQ(metric_sum(m, "spill:prompt_tokens_cached_total").value_or(-1), 640);
  EXPECT_FALSE(metric_sum(m, "spill:generation_tokens_total").has_value());
  ServerCounters c = counters_of(m);
  EXPECT_EQ(c.prefix, "spill:");
  EXPECT_EQ(c.requests.value_or(-1), 7);
  ServerCounters later = c;
  later.requests = 10;
  later.prompt_tokens = 1600;
  ServerCounters d = counter_delta(c, later);
  EXPECT_EQ(d.requests.value_or(-1), 3);
  EXPECT_EQ(d.prompt_tokens.value_or(-1), 100);
  EXPECT_FALSE(d.generation_tokens.has_value());
  // vLLM's names are read the same way.
  ServerCounters v = counters_of(parse_prometheus("vllm:prompt_tokens_total{model_name=\"x\"} 12\n"));
  EXPECT_EQ(v.prefix, "vllm:");
  EXPECT_EQ(v.prompt_tokens.value_or(-1), 12);
}

}  // namespace
}  // namespace spill::bench
