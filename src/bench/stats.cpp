#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace spill::bench {

double RequestRecord::tpot_s() const {
  if (output_tokens <= 1 || ttft_s < 0) return -1;
  return (latency_s - ttft_s) / double(output_tokens - 1);
}

namespace {

// Linear interpolation between the order statistics at rank p/100 * (n - 1).
double percentile_sorted(const std::vector<double>& sorted, double p) {
  double rank = p / 100.0 * double(sorted.size() - 1);
  size_t below = size_t(std::floor(rank));
  size_t above = std::min(below + 1, sorted.size() - 1);
  double frac = rank - double(below);
  return sorted[below] + (sorted[above] - sorted[below]) * frac;
}

}  // namespace

double percentile(std::span<const double> values, double p) {
  if (values.empty()) fail("percentile of an empty sample: no request in this group produced the value");
  if (!(p >= 0 && p <= 100)) fail("percentile {} is outside 0..100", p);
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  return percentile_sorted(sorted, p);
}

Distribution describe(std::span<const double> values) {
  Distribution d;
  d.count = values.size();
  if (values.empty()) return d;
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  double sum = 0;
  for (double v : sorted) sum += v;
  d.mean = sum / double(sorted.size());
  double sq = 0;
  for (double v : sorted) sq += (v - d.mean) * (v - d.mean);
  d.stddev = std::sqrt(sq / double(sorted.size()));
  d.min = sorted.front();
  d.max = sorted.back();
  d.p5 = percentile_sorted(sorted, 5);
  d.p25 = percentile_sorted(sorted, 25);
  d.median = percentile_sorted(sorted, 50);
  d.p75 = percentile_sorted(sorted, 75);
  d.p90 = percentile_sorted(sorted, 90);
  d.p95 = percentile_sorted(sorted, 95);
  d.p99 = percentile_sorted(sorted, 99);
  return d;
}

GroupSummary summarize(std::span<const RequestRecord> records) {
  GroupSummary s;
  std::vector<double> ttft, tpot, itl, e2el, tok_s;
  double first_start = std::numeric_limits<double>::infinity();
  double last_end = -std::numeric_limits<double>::infinity();
  for (const RequestRecord& r : records) {
    if (!r.ok()) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.input_tokens += r.prompt_tokens;
    s.output_tokens += r.output_tokens;
    s.cached_tokens += r.cached_tokens;
    first_start = std::min(first_start, r.start_s);
    last_end = std::max(last_end, r.start_s + r.latency_s);
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    e2el.push_back(r.latency_s);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    double t = r.tpot_s();
    if (t > 0) {
      tpot.push_back(t);
      tok_s.push_back(1.0 / t);
    }
  }
  if (s.completed > 0) {
    s.duration_s = last_end - first_start;
    if (s.duration_s > 0) {
      s.request_throughput = double(s.completed) / s.duration_s;
      s.output_throughput = double(s.output_tokens) / s.duration_s;
      s.total_token_throughput = double(s.input_tokens + s.output_tokens) / s.duration_s;
    }
  }
  s.ttft_s = describe(ttft);
  s.tpot_s = describe(tpot);
  s.itl_s = describe(itl);
  s.e2el_s = describe(e2el);
  s.stream_tok_s = describe(tok_s);
  return s;
}

}  // namespace spill::bench
