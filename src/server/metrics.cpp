#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "placement/memory.h"

namespace spill::server {

namespace {

// Prometheus floats: integers without a fraction, others with enough digits to round-trip.
std::string format_value(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.1f}", v);
  return fmt::format("{}", v);
}

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void sample(std::string& out, std::string_view name, std::string_view labels, double value) {
  fmt::format_to(std::back_inserter(out), "{}{{{}}} {}\n", name, labels, format_value(value));
}

// A series of one sample: its HELP/TYPE header, then the sample.
void series(std::string& out, std::string_view name, std::string_view type, std::string_view help,
            std::string_view labels, double value) {
  header(out, name, type, help);
  sample(out, name, labels, value);
}

// The routed experts' block. Rendered for every model with routed experts, zeros included, and for
// no dense model, the way vLLM adds its speculative-decoding series whenever speculative decoding is
// configured: a dashboard or alert sees the same series on every MoE deployment from the first
// scrape (rate() needs the zero before the first increase), whether or not an expert lives in host
// RAM. The derived gauges are since start and 0 while their denominator is (as vLLM's prefix-cache
// hit rate is 0 before any query), never NaN; for a window, and for alerts that must not fire on
// "no host traffic", use the counters: rate(cache_routings) / (rate(cache_routings) + rate(host_routings)).
void render_experts(std::string& out, const ExpertTraffic& t, std::string_view labels) {
  auto counter = [&](std::string_view name, std::string_view help, double value) {
    series(out, name, "counter", help, labels, value);
  };
  auto gauge = [&](std::string_view name, std::string_view help, double value) {
    series(out, name, "gauge", help, labels, value);
  };
  auto labelled = [&](std::string_view name, std::string_view help, std::string_view key,
                      std::initializer_list<std::pair<std::string_view, double>> values) {
    header(out, name, "gauge", help);
    for (const auto& [label, value] : values) sample(out, name, fmt::format("{},{}=\"{}\"", labels, key, label), value);
  };
  counter("spill:expert_tokens_total", "Tokens run through the MoE layers (each token once, not per layer).",
          double(t.tokens));
  counter("spill:expert_routings_total", "(token, routed expert) pairs, summed over the MoE layers.",
          double(t.routings));
  counter("spill:expert_host_routings_total",
          "Routings to an expert in host RAM: read in place over PCIe, or computed by the CPU (--cpu-experts).",
          double(t.host_routings));
  counter("spill:expert_cpu_routings_total", "Of the host routings, those the CPU computed (--cpu-experts).",
          double(t.cpu_routings));
  counter("spill:expert_cpu_read_bytes_total",
          "Expert bytes the CPU read to compute host experts (--cpu-experts): a touched expert once per MoE call.",
          double(t.cpu_bytes));
  counter("spill:expert_cache_routings_total", "Routings to a host expert served from the VRAM expert cache.",
          double(t.cache_routings));
  counter("spill:expert_host_read_bytes_total",
          "Expert bytes read from host RAM: a touched host expert once per MoE call, or, on a staged (prefill) step, "
          "every host expert once.",
          double(t.host_bytes));
  counter("spill:expert_staged_steps_total", "Steps that copied every host expert to VRAM once (prefill chunks).",
          double(t.staged_steps));
  counter("spill:expert_staged_bytes_total", "Of the host bytes, those staged steps' copies.", double(t.staged_bytes));
  counter("spill:expert_cache_copies_total", "Host experts copied into the VRAM expert cache.", double(t.cache_copies));
  counter("spill:expert_cache_copy_bytes_total", "Bytes copied into the VRAM expert cache.",
          double(t.cache_copy_bytes));
  counter("spill:expert_cache_evictions_total", "Experts evicted from the VRAM expert cache.",
          double(t.cache_evictions));
  counter("spill:expert_step_seconds_total", "Host wall time of the steps the expert counters are of.", t.step_seconds);
  labelled(
      "spill:expert_bytes",
      "Routed-expert bytes by place: vram (placed on the GPU), host (read from host RAM), "
      "cache (the VRAM expert cache's slots).",
      "place",
      {{"vram", double(t.vram_expert_bytes)}, {"host", double(t.host_expert_bytes)}, {"cache", double(t.cache_bytes)}});
  labelled("spill:expert_cache_slots", "Slots of the VRAM expert cache: total, and used.", "state",
           {{"total", double(t.cache_slots)}, {"used", double(t.cache_slots_used)}});
  const ExpertRatios r = expert_ratios(t);
  gauge("spill:expert_host_routings_per_token",
        "Host-RAM expert routings per token since start (host_routings / tokens; 0 before the first token).",
        r.host_routings_per_token);
  gauge("spill:expert_cache_hit_ratio",
        "Of the routings to host experts, the fraction served from the VRAM expert cache since start "
        "(cache / (cache + host); 0 while none).",
        r.cache_hit_ratio);
  gauge("spill:expert_host_read_bytes_per_second",
        "Expert bytes read from host RAM per second of step time since start (0 before the first step).",
        r.host_bytes_per_second);
}

}  // namespace

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), bucket_counts_(upper_bounds_.size() + 1, 0) {
  std::sort(upper_bounds_.begin(), upper_bounds_.end());
}

void Histogram::observe(double value) {
  // Prometheus buckets are "less than or equal": value == bound counts in that bucket.
  const size_t bucket = size_t(std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  std::lock_guard lock(mutex_);
  ++bucket_counts_[bucket];
  sum_ += value;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

double Histogram::sum() const {
  std::lock_guard lock(mutex_);
  return sum_;
}

void Histogram::render(std::string& out, std::string_view name, std::string_view help, std::string_view labels) const {
  std::lock_guard lock(mutex_);
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    cumulative += bucket_counts_[i];
    const std::string le = i < upper_bounds_.size() ? format_value(upper_bounds_[i]) : "+Inf";
    fmt::format_to(std::back_inserter(out), "{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, le, cumulative);
  }
  sample(out, fmt::format("{}_sum", name), labels, sum_);
  sample(out, fmt::format("{}_count", name), labels, double(count_));
}

ExpertRatios expert_ratios(const ExpertTraffic& t) {
  auto ratio = [](double num, double den) { return den > 0 ? num / den : 0.0; };
  return {.host_routings_per_token = ratio(double(t.host_routings), double(t.tokens)),
          .host_bytes_per_token = ratio(double(t.host_bytes), double(t.tokens)),
          .cache_hit_ratio = ratio(double(t.cache_routings), double(t.cache_routings + t.host_routings)),
          .host_bytes_per_second = ratio(double(t.host_bytes), t.step_seconds)};
}

std::string expert_log_summary(const ExpertTraffic& t) {
  if (t.host_expert_bytes <= 0 && t.host_routings <= 0 && t.cache_routings <= 0) return "";
  const ExpertRatios r = expert_ratios(t);
  std::string out = fmt::format(" experts since start: host {:.2f}/token, {}/token", r.host_routings_per_token,
                                placement::format_bytes(int64_t(std::llround(r.host_bytes_per_token))));
  if (t.cache_slots > 0) out += fmt::format(", cache hit {:.1f}%", 100.0 * r.cache_hit_ratio);
  return out;
}

std::vector<double> ServerMetrics::ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,   0.75,  1.0,
          2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> ServerMetrics::inter_token_buckets() {
  return {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
          0.15,  0.2,    0.3,   0.4,    0.5,  0.75,  1.0,  2.5,   5.0,  7.5,  10.0, 20.0,  40.0, 80.0};
}

std::vector<double> ServerMetrics::e2e_buckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

std::vector<double> ServerMetrics::token_count_buckets() {
  std::vector<double> b;
  for (double decade = 1; decade <= 1e6; decade *= 10)
    for (double m : {1.0, 2.0, 5.0}) b.push_back(m * decade);
  return b;
}

ServerMetrics::ServerMetrics()
    : ttft_(ttft_buckets()),
      inter_token_(inter_token_buckets()),
      e2e_(e2e_buckets()),
      prompt_tokens_hist_(token_count_buckets()),
      generation_tokens_hist_(token_count_buckets()) {}

void ServerMetrics::record_finished(const FinishedRequestStats& stats) {
  {
    std::lock_guard lock(mutex_);
    prompt_tokens_ += stats.prompt_tokens;
    generation_tokens_ += stats.generation_tokens;
    cached_prompt_tokens_ += stats.cached_tokens;
    ++finished_by_reason_[stats.finish_reason];
  }
  if (stats.ttft_seconds >= 0) ttft_.observe(stats.ttft_seconds);
  for (double gap : stats.inter_token_seconds) inter_token_.observe(gap);
  e2e_.observe(stats.e2e_seconds);
  prompt_tokens_hist_.observe(double(stats.prompt_tokens));
  generation_tokens_hist_.observe(double(stats.generation_tokens));
}

void ServerMetrics::record_rejected(int http_status) {
  std::lock_guard lock(mutex_);
  ++rejected_by_status_[http_status];
}

std::string ServerMetrics::render(const EngineGauges& engine, std::string_view model_name) const {
  const std::string labels = fmt::format("model_name=\"{}\"", escape_label_value(model_name));
  std::string out;
  out.reserve(16384);

  auto gauge = [&](std::string_view name, std::string_view help, double value) {
    series(out, name, "gauge", help, labels, value);
  };
  auto counter = [&](std::string_view name, std::string_view help, double value) {
    series(out, name, "counter", help, labels, value);
  };

  gauge("spill:num_requests_running", "Requests in the running set (being prefilled or decoded).",
        double(engine.requests_running));
  gauge("spill:num_requests_waiting", "Requests waiting for admission.", double(engine.requests_waiting));
  gauge("spill:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", engine.kv_cache_usage);
  gauge("spill:kv_cache_blocks_total", "KV-cache blocks in the pool.", double(engine.kv_blocks_total));
  counter("spill:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          double(engine.prefix_cache_queries));
  counter("spill:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", double(engine.prefix_cache_hits));
  counter("spill:num_preemptions_total", "Times a running request was preempted to free KV blocks.",
          double(engine.preemptions));
  if (engine.experts) render_experts(out, *engine.experts, labels);

  {
    std::lock_guard lock(mutex_);
    counter("spill:prompt_tokens_total", "Prompt tokens of finished requests.", double(prompt_tokens_));
    counter("spill:generation_tokens_total", "Generated tokens of finished requests.", double(generation_tokens_));
    counter("spill:prompt_tokens_cached_total", "Prompt tokens of finished requests served from the prefix cache.",
            double(cached_prompt_tokens_));
    header(out, "spill:request_success_total", "counter", "Finished requests, by finish reason.");
    for (const char* reason : {"stop", "length", "tool_calls", "abort", "error"})
      if (!finished_by_reason_.contains(reason))
        sample(out, "spill:request_success_total", fmt::format("{},finished_reason=\"{}\"", labels, reason), 0);
    for (const auto& [reason, n] : finished_by_reason_)
      sample(out, "spill:request_success_total",
             fmt::format("{},finished_reason=\"{}\"", labels, escape_label_value(reason)), double(n));
    header(out, "spill:request_rejected_total", "counter", "Requests refused before generation, by HTTP status.");
    for (const auto& [status, n] : rejected_by_status_)
      sample(out, "spill:request_rejected_total", fmt::format("{},status=\"{}\"", labels, status), double(n));
  }

  ttft_.render(out, "spill:time_to_first_token_seconds", "Time from arrival to the first generated token.", labels);
  inter_token_.render(out, "spill:inter_token_latency_seconds", "Time between consecutive generated tokens.", labels);
  e2e_.render(out, "spill:e2e_request_latency_seconds", "Time from arrival to the last token.", labels);
  prompt_tokens_hist_.render(out, "spill:request_prompt_tokens", "Prompt tokens per finished request.", labels);
  generation_tokens_hist_.render(out, "spill:request_generation_tokens", "Generated tokens per finished request.",
                                 labels);
  return out;
}

}  // namespace spill::server
