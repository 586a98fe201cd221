// Prometheus text exposition: names, types, cumulative histogram buckets, label escaping.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <sstream>

#include "placement/memory.h"
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

// A GPU runner's traffic with host experts and a VRAM expert cache: every counter and gauge as
// given, the derived gauges as the quotients of the counters they come from.
TEST(ServerMetrics, ExpertSeriesCarryTheRunnersCountsAndTheirQuotients) {
  const ExpertTraffic t{.tokens = 1000,
                        .routings = 8000,
                        .host_routings = 1500,
                        .cache_routings = 500,
                        .host_bytes = int64_t(3) << 32,  // past 2^32: no 32-bit truncation on the way
                        .cpu_routings = 700,
                        .cpu_bytes = int64_t(7) << 32,
                        .staged_steps = 3,
                        .staged_bytes = int64_t(5) << 31,
                        .cache_copies = 40,
                        .cache_copy_bytes = 80'000'000,
                        .cache_evictions = 12,
                        .step_seconds = 2.5,
                        .vram_expert_bytes = int64_t(70) << 30,
                        .host_expert_bytes = int64_t(150) << 30,
                        .cache_bytes = int64_t(8) << 30,
                        .cache_slots = 64,
                        .cache_slots_used = 40};
  ServerMetrics m;
  const std::string text = m.render({.experts = t}, "moe");
  const auto s = samples(text);
  const std::string l = "{model_name=\"moe\"}";
  EXPECT_EQ(s.at("spill:expert_tokens_total" + l), double(t.tokens));
  EXPECT_EQ(s.at("spill:expert_routings_total" + l), double(t.routings));
  EXPECT_EQ(s.at("spill:expert_host_routings_total" + l), double(t.host_routings));
  EXPECT_EQ(s.at("spill:expert_cache_routings_total" + l), double(t.cache_routings));
  EXPECT_EQ(s.at("spill:expert_host_read_bytes_total" + l), double(t.host_bytes));
  EXPECT_EQ(s.at("spill:expert_cpu_routings_total" + l), double(t.cpu_routings));
  EXPECT_EQ(s.at("spill:expert_cpu_read_bytes_total" + l), double(t.cpu_bytes));
  EXPECT_EQ(s.at("spill:expert_staged_steps_total" + l), double(t.staged_steps));
  EXPECT_EQ(s.at("spill:expert_staged_bytes_total" + l), double(t.staged_bytes));
  EXPECT_EQ(s.at("spill:expert_cache_copies_total" + l), double(t.cache_copies));
  EXPECT_EQ(s.at("spill:expert_cache_copy_bytes_total" + l), double(t.cache_copy_bytes));
  EXPECT_EQ(s.at("spill:expert_cache_evictions_total" + l), double(t.cache_evictions));
  EXPECT_EQ(s.at("spill:expert_step_seconds_total" + l), t.step_seconds);
  EXPECT_EQ(s.at("spill:expert_bytes{model_name=\"moe\",place=\"vram\"}"), double(t.vram_expert_bytes));
  EXPECT_EQ(s.at("spill:expert_bytes{model_name=\"moe\",place=\"host\"}"), double(t.host_expert_bytes));
  EXPECT_EQ(s.at("spill:expert_bytes{model_name=\"moe\",place=\"cache\"}"), double(t.cache_bytes));
  EXPECT_EQ(s.at("spill:expert_cache_slots{model_name=\"moe\",state=\"total\"}"), double(t.cache_slots));
  EXPECT_EQ(s.at("spill:expert_cache_slots{model_name=\"moe\",state=\"used\"}"), double(t.cache_slots_used));
  EXPECT_EQ(s.at("spill:expert_host_routings_per_token" + l), double(t.host_routings) / double(t.tokens));
  EXPECT_EQ(s.at("spill:expert_cache_hit_ratio" + l),
            double(t.cache_routings) / double(t.cache_routings + t.host_routings));
  EXPECT_EQ(s.at("spill:expert_host_read_bytes_per_second" + l), double(t.host_bytes) / t.step_seconds);
  for (const char* counter : {"tokens", "routings", "host_routings", "cache_routings", "host_read_bytes",
                              "cache_copies", "cache_copy_bytes", "cache_evictions", "step_seconds"})
    EXPECT_NE(text.find(fmt::format("# TYPE spill:expert_{}_total counter\n", counter)), std::string::npos) << counter;
  for (const char* gauge :
       {"bytes", "cache_slots", "host_routings_per_token", "cache_hit_ratio", "host_read_bytes_per_second"})
    EXPECT_NE(text.find(fmt::format("# TYPE spill:expert_{} gauge\n", gauge)), std::string::npos) << gauge;
  // One HELP/TYPE per labelled family, not one per series.
  size_t families = 0;
  for (size_t at = text.find("# TYPE spill:expert_bytes gauge"); at != std::string::npos;
       at = text.find("# TYPE spill:expert_bytes gauge", at + 1))
    ++families;
  EXPECT_EQ(families, 1u);

  const ExpertRatios r = expert_ratios(t);
  EXPECT_EQ(
      expert_log_summary(t),
      fmt::format(" experts since start: host {:.2f}/token, {}/token, cache hit {:.1f}%", r.host_routings_per_token,
                  placement::format_bytes(int64_t(std::llround(r.host_bytes_per_token))), 100.0 * r.cache_hit_ratio));
}

// A model with routed experts and no traffic yet (or a CPU runner, which reads no host expert):
// every series is there, the quotients 0 rather than NaN. A dense model: none of them.
TEST(ServerMetrics, ExpertSeriesAreZeroForAnIdleMoeAndAbsentForADenseModel) {
  ServerMetrics m;
  const auto idle = samples(m.render({.experts = ExpertTraffic{}}, "moe"));
  for (const char* name :
       {"spill:expert_tokens_total", "spill:expert_routings_total", "spill:expert_host_routings_per_token",
        "spill:expert_cache_hit_ratio", "spill:expert_host_read_bytes_per_second"})
    EXPECT_EQ(idle.at(std::string(name) + "{model_name=\"moe\"}"), 0) << name;
  const std::string dense = m.render({}, "dense");
  EXPECT_EQ(dense.find("spill:expert_"), std::string::npos);
  // The CPU runner's traffic: routings, no host expert, so no expert part in the log line.
  EXPECT_EQ(expert_log_summary({.tokens = 10, .routings = 80, .step_seconds = 0.5}), "");
  // Host experts and no cache: no hit rate.
  EXPECT_EQ(expert_log_summary(
                {.tokens = 4, .routings = 32, .host_routings = 6, .host_bytes = 3 << 20, .host_expert_bytes = 1 << 30}),
            fmt::format(" experts since start: host {:.2f}/token, {}/token", 6.0 / 4.0,
                        placement::format_bytes(int64_t(3 << 20) / 4)));
}

}  // namespace
}  // namespace spill::server
