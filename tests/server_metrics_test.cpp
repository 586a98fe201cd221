// Prometheus text exposition: names, types, cumulative histogram buckets, label escaping.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <sstream>

#include "server/metrics.h"

namespace spill::server {
namespace {

// name{labels} -> value, for every sample line; checks each line against the text format.
std::map<std::string, double> samples(const std::string& text) {
  static const std::regex line_re(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$)");
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, line_re)) << "not Prometheus text: " << line;
    if (m.empty()) continue;
    const std::string v = m[3];
    out[m[1].str() + m[2].str()] = v == "+Inf" ? INFINITY : std::stod(v);
  }
  return out;
}

TEST(ServerMetrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0, 10.0});
  for (double v : {0.05, 0.1, 0.5, 2.0, 20.0}) h.observe(v);
  std::string text;
  h.render(text, "x_seconds", "help", "model_name=\"m\"");
  const auto s = samples(text);
  EXPECT_EQ(s.at("x_seconds_bucket{model_name=\"m\",le=\"0.1\"}"), 2);  // le is inclusive
  EXPECT_EQ(s.at("x_seconds_bucket{model_name=\"m\",le=\"1.0\"}"), 3);
  EXPECT_EQ(s.at("x_seconds_bucket{model_name=\"m\",le=\"10.0\"}"), 4);
  EXPECT_EQ(s.at("x_seconds_bucket{model_name=\"m\",le=\"+Inf\"}"), 5);
  EXPECT_EQ(s.at("x_seconds_count{model_name=\"m\"}"), 5);
  EXPECT_NEAR(s.at("x_seconds_sum{model_name=\"m\"}"), 22.65, 1e-9);
  EXPECT_NE(text.find("# TYPE x_seconds histogram"), std::string::npos);
}

TEST(ServerMetrics, ServerMetricsRender) {
  ServerMetrics m;
  m.record_finished({.finish_reason = "stop",
                     .prompt_tokens = 100,
                     .generation_tokens = 10,
                     .cached_tokens = 64,
                     .e2e_seconds = 1.5,
                     .ttft_seconds = 0.2,
                     .inter_token_seconds = {0.01, 0.02}});
  m.record_finished({.finish_reason = "length", .prompt_tokens = 5, .generation_tokens = 1, .cached_tokens = 0,
                     .e2e_seconds = 0.1, .ttft_seconds = -1, .inter_token_seconds = {}});
  m.record_rejected(400);
  const std::string text = m.render({.requests_running = 2,
                                     .requests_waiting = 1,
                                     .kv_cache_usage = 0.25,
                                     .prefix_cache_queries = 1000,
                                     .prefix_cache_hits = 640,
                                     .preemptions = 3,
                                     .kv_blocks_total = 128},
                                    "spill-tiny");
  const auto s = samples(text);
  const std::string l = "{model_name=\"spill-tiny\"}";
  EXPECT_EQ(s.at("spill:num_requests_running" + l), 2);
  EXPECT_EQ(s.at("spill:num_requests_waiting" + l), 1);
  EXPECT_EQ(s.at("spill:kv_cache_usage_perc" + l), 0.25);
  EXPECT_EQ(s.at("spill:prefix_cache_queries_total" + l), 1000);
  EXPECT_EQ(s.at("spill:prefix_cache_hits_total" + l), 640);
  EXPECT_EQ(s.at("spill:prompt_tokens_total" + l), 105);
  EXPECT_EQ(s.at("spill:generation_tokens_total" + l), 11);
  EXPECT_EQ(s.at("spill:request_success_total{model_name=\"spill-tiny\",finished_reason=\"stop\"}"), 1);
  EXPECT_EQ(s.at("spill:request_success_total{model_name=\"spill-tiny\",finished_reason=\"length\"}"), 1);
  EXPECT_EQ(s.at("spill:request_success_total{model_name=\"spill-tiny\",finished_reason=\"tool_calls\"}"), 0);
  EXPECT_EQ(s.at("spill:request_rejected_total{model_name=\"spill-tiny\",status=\"400\"}"), 1);
  // TTFT only from the request that produced a token; ITL from its gaps; e2e from both.
  EXPECT_EQ(s.at("spill:time_to_first_token_seconds_count" + l), 1);
  EXPECT_EQ(s.at("spill:inter_token_latency_seconds_count" + l), 2);
  EXPECT_EQ(s.at("spill:e2e_request_latency_seconds_count" + l), 2);
  EXPECT_NE(text.find("# TYPE spill:time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("# TYPE spill:num_requests_running gauge"), std::string::npos);
  EXPECT_NE(text.find("# TYPE spill:prompt_tokens_total counter"), std::string::npos);
}

TEST(ServerMetrics, LabelValuesAreEscaped) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  ServerMetrics m;
  const auto s = samples(m.render({}, "we\"ird"));
  EXPECT_TRUE(s.contains("spill:num_requests_running{model_name=\"we\\\"ird\"}"));
}

}  // namespace
}  // namespace spill::server
