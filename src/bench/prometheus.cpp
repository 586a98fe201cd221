#include "bench/prometheus.h"

#include <cstdlib>
#include <string>

namespace spill::bench {

MetricSamples parse_prometheus(std::string_view text) {
  MetricSamples out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    // The series ends at the first space outside braces (label values may hold spaces).
    size_t split = std::string_view::npos;
    bool in_braces = false, in_quotes = false;
    for (size_t i = 0; i < line.size(); ++i) {
      char c = line[i];
      if (in_quotes) {
        if (c == '\\') ++i;
        else if (c == '"') in_quotes = false;
      } else if (c == '"' && in_braces) {
        in_quotes = true;
      } else if (c == '{') {
        in_braces = true;
      } else if (c == '}') {
        in_braces = false;
      } else if (c == ' ' && !in_braces) {
        split = i;
        break;
      }
    }
    if (split == std::string_view::npos) continue;
    std::string value(line.substr(split + 1));
    if (size_t sp = value.find(' '); sp != std::string::npos) value.resize(sp);  // drop a timestamp
    char* end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str()) continue;
    out[std::string(line.substr(0, split))] = v;
  }
  return out;
}

std::optional<double> metric_sum(const MetricSamples& samples, std::string_view name) {
  std::optional<double> sum;
  for (auto it = samples.lower_bound(std::string(name)); it != samples.end(); ++it) {
    std::string_view series = it->first;
    if (series.substr(0, name.size()) != name) break;
    if (series.size() != name.size() && series[name.size()] != '{') continue;
    sum = sum.value_or(0) + it->second;
  }
  return sum;
}

ServerCounters counters_of(const MetricSamples& samples) {
  ServerCounters c;
  for (const char* prefix : {"spill:", "vllm:"}) {
    if (metric_sum(samples, std::string(prefix) + "request_success_total") ||
        metric_sum(samples, std::string(prefix) + "prompt_tokens_total")) {
      c.prefix = prefix;
      break;
    }
  }
  if (c.prefix.empty()) return c;
  auto get = [&](const char* name) { return metric_sum(samples, c.prefix + name); };
  c.requests = get("request_success_total");
  c.prompt_tokens = get("prompt_tokens_total");
  c.generation_tokens = get("generation_tokens_total");
  c.cached_prompt_tokens = get("prompt_tokens_cached_total");
  c.prefix_cache_queries = get("prefix_cache_queries_total");
  c.prefix_cache_hits = get("prefix_cache_hits_total");
  c.preemptions = get("num_preemptions_total");
  return c;
}

ServerCounters counter_delta(const ServerCounters& before, const ServerCounters& after) {
  ServerCounters d;
  d.prefix = after.prefix;
  auto sub = [](const std::optional<double>& a, const std::optional<double>& b) -> std::optional<double> {
    if (!a || !b) return std::nullopt;
    return *b - *a;
  };
  d.requests = sub(before.requests, after.requests);
  d.prompt_tokens = sub(before.prompt_tokens, after.prompt_tokens);
  d.generation_tokens = sub(before.generation_tokens, after.generation_tokens);
  d.cached_prompt_tokens = sub(before.cached_prompt_tokens, after.cached_prompt_tokens);
  d.prefix_cache_queries = sub(before.prefix_cache_queries, after.prefix_cache_queries);
  d.prefix_cache_hits = sub(before.prefix_cache_hits, after.prefix_cache_hits);
  d.preemptions = sub(before.preemptions, after.preemptions);
  return d;
}

}  // namespace spill::bench
