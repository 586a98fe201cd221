#include "bench/seats.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace spill::bench {

namespace {

void check_inputs(int64_t n, double q, double rho) {
  if (n < 0) fail("seats: the team size must be >= 0, got {}", n);
  if (!(q > 0 && q < 1)) fail("seats: the activity q must be between 0 and 1 (exclusive), got {}", q);
  if (!(rho >= 0 && rho < 1)) fail("seats: the correlation must be in [0, 1), got {}", rho);
}

double log_choose(int64_t n, int64_t k) {
  return std::lgamma(double(n) + 1) - std::lgamma(double(k) + 1) - std::lgamma(double(n - k) + 1);
}

double log_beta(double a, double b) { return std::lgamma(a) + std::lgamma(b) - std::lgamma(a + b); }

}  // namespace

double active_pmf(int64_t n, double q, int64_t k, double rho) {
  check_inputs(n, q, rho);
  if (k < 0 || k > n) return 0;
  if (rho == 0) return std::exp(log_choose(n, k) + double(k) * std::log(q) + double(n - k) * std::log1p(-q));
  double scale = 1.0 / rho - 1.0;
  double alpha = q * scale, beta = (1 - q) * scale;
  return std::exp(log_choose(n, k) + log_beta(double(k) + alpha, double(n - k) + beta) - log_beta(alpha, beta));
}

double active_tail(int64_t n, double q, int64_t c, double rho) {
  check_inputs(n, q, rho);
  if (c >= n) return 0;
  // Sum the shorter side: P(X > c) = 1 - P(X <= c) loses digits when the tail is tiny.
  double upper = 0;
  for (int64_t k = std::max<int64_t>(c + 1, 0); k <= n; ++k) upper += active_pmf(n, q, k, rho);
  return std::min(1.0, upper);
}

int64_t team_size(double q, int64_t capacity, double risk, double rho) {
  if (capacity < 0) fail("seats: capacity must be >= 0 streams, got {}", capacity);
  if (!(risk > 0 && risk < 1)) fail("seats: the risk must be between 0 and 1 (exclusive), got {}", risk);
  check_inputs(capacity, q, rho);
  // The tail grows with n, so the first n that breaks the risk ends the search.
  int64_t n = capacity;
  while (active_tail(n + 1, q, capacity, rho) <= risk) {
    ++n;
    if (n > 10'000'000) fail("seats: team size above 10 million; check q ({}) and the risk ({})", q, risk);
  }
  return n;
}

int64_t servers_needed(int64_t developers, double q, int64_t capacity, double risk, double rho) {
  if (capacity <= 0) fail("seats: a server must carry at least one stream to be sized, got capacity {}", capacity);
  if (!(risk > 0 && risk < 1)) fail("seats: the risk must be between 0 and 1 (exclusive), got {}", risk);
  check_inputs(developers, q, rho);
  int64_t k = 0;
  while (active_tail(developers, q, k * capacity, rho) > risk) ++k;
  return k;
}

int capacity_at_slo(std::span<const StreamSpeed> levels, const CapacityRule& rule) {
  std::vector<StreamSpeed> sorted(levels.begin(), levels.end());
  std::sort(sorted.begin(), sorted.end(), [](const StreamSpeed& a, const StreamSpeed& b) { return a.concurrency < b.concurrency; });
  double needed = rule.slo_tok_s * (1 + rule.margin);
  int capacity = 0;
  for (const StreamSpeed& s : sorted) {
    double speed = rule.use_p5 ? s.p5_tok_s : s.median_tok_s;
    if (speed < needed) break;
    capacity = s.concurrency;
  }
  return capacity;
}

double monthly_server_cost(const CostInputs& cost) { return cost.server_cost_per_hour * cost.hours_per_month; }

double break_even_subscriptions(const CostInputs& cost) {
  if (!(cost.subscription_per_month > 0)) fail("seats: the subscription price must be > 0, got {}", cost.subscription_per_month);
  return monthly_server_cost(cost) / cost.subscription_per_month;
}

double saving_fraction(const CostInputs& cost, int64_t developers, int64_t servers) {
  if (developers <= 0) fail("seats: the number of developers must be > 0, got {}", developers);
  return 1.0 - double(servers) * monthly_server_cost(cost) / (double(developers) * cost.subscription_per_month);
}

// ---- activity logs -----------------------------------------------------------------------------

namespace {

int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  // Howard Hinnant's algorithm: days since 1970-01-01 of a proleptic Gregorian date.
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = unsigned(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + int64_t(doe) - 719468;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace((unsigned char)s[a])) ++a;
  while (b > a && std::isspace((unsigned char)s[b - 1])) --b;
  return s.substr(a, b - a);
}

}  // namespace

double parse_timestamp(const std::string& raw, const std::string& where) {
  std::string text = trim(raw);
  if (text.size() >= 2 && text.front() == '"' && text.back() == '"') text = text.substr(1, text.size() - 2);
  if (text.empty()) fail("{}: empty timestamp", where);
  bool numeric = std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit((unsigned char)c) || c == '.' || c == '-'; });
  if (numeric && text.find('-', 1) == std::string::npos) {
    try {
      size_t used = 0;
      double v = std::stod(text, &used);
      if (used == text.size()) return v;
    } catch (const std::exception&) {
    }
  }
  int y, mo, d, h = 0, mi = 0, s = 0;
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2d%n", &y, &mo, &d, &consumed) != 3 || consumed != 10)
    fail("{}: '{}' is not a timestamp; write Unix seconds or ISO 8601 such as 2026-10-06T09:15:02Z", where, raw);
  size_t pos = 10;
  double frac = 0;
  if (pos < text.size() && (text[pos] == 'T' || text[pos] == ' ')) {
    int c2 = 0;
    if (std::sscanf(text.c_str() + pos + 1, "%2d:%2d:%2d%n", &h, &mi, &s, &c2) != 3 || c2 != 8)
      fail("{}: '{}': the time must be HH:MM:SS", where, raw);
    pos += 9;
    if (pos < text.size() && text[pos] == '.') {
      size_t end = pos + 1;
      while (end < text.size() && std::isdigit((unsigned char)text[end])) ++end;
      frac = std::stod(text.substr(pos, end - pos));  // ".250"
      pos = end;
    }
  }
  double offset_s = 0;
  if (pos < text.size()) {
    std::string zone = text.substr(pos);
    int oh = 0, om = 0;
    if (zone == "Z" || zone == "z") {
    } else if ((zone[0] == '+' || zone[0] == '-') && std::sscanf(zone.c_str() + 1, "%2d:%2d", &oh, &om) == 2 && zone.size() == 6) {
      offset_s = (zone[0] == '+' ? 1 : -1) * (oh * 3600.0 + om * 60.0);
    } else {
      fail("{}: '{}': unknown time zone '{}' (use Z or +HH:MM)", where, raw, zone);
    }
  }
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60) fail("{}: '{}' is not a valid date and time", where, raw);
  double days = double(days_from_civil(y, unsigned(mo), unsigned(d)));
  return days * 86400.0 + h * 3600.0 + mi * 60.0 + s + frac - offset_s;
}

ActivityEstimate estimate_activity_text(const std::string& text, const ActivityOptions& options, const std::string& origin) {
  if (!(options.window_hours > 0 && options.window_hours <= 24)) fail("seats: --window-hours must be in (0, 24], got {}", options.window_hours);
  std::vector<std::pair<double, double>> intervals;
  std::istringstream in(text);
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    std::string where = fmt::format("{}:{}", origin, line_no);
    double start, end;
    if (t[0] == '{') {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(t);
      } catch (const std::exception& e) {
        fail("{}: not valid JSON ({})", where, e.what());
      }
      auto get = [&](const char* key) {
        if (!j.contains(key)) fail("{}: the object has no \"{}\"; each line needs \"start\" and \"end\"", where, key);
        const auto& v = j[key];
        if (v.is_number()) return v.get<double>();
        if (v.is_string()) return parse_timestamp(v.get<std::string>(), where);
        fail("{}: \"{}\" must be a number (Unix seconds) or an ISO 8601 string", where, key);
      };
      start = get("start");
      end = get("end");
    } else {
      std::string fields = t;
      std::replace(fields.begin(), fields.end(), ',', ' ');
      std::replace(fields.begin(), fields.end(), '\t', ' ');
      std::istringstream f(fields);
      std::string a, b, extra;
      f >> a >> b;
      if (b.empty()) fail("{}: expected two timestamps (start end), got '{}'", where, t);
      start = parse_timestamp(a, where);
      end = parse_timestamp(b, where);
    }
    if (end < start) fail("{}: the interval ends before it starts", where);
    intervals.emplace_back(start, end);
  }
  if (intervals.empty()) fail("{}: no generation intervals found; each line is `START END`", origin);
  std::sort(intervals.begin(), intervals.end());
  ActivityEstimate est;
  est.intervals = int64_t(intervals.size());
  est.window_hours = options.window_hours;
  double busy = 0, cur_start = intervals[0].first, cur_end = intervals[0].second, last_end = cur_end;
  std::vector<int64_t> days;
  auto day_of = [&](double t) { return int64_t(std::floor((t + options.utc_offset_hours * 3600.0) / 86400.0)); };
  for (const auto& [s, e] : intervals) {
    days.push_back(day_of(s));
    last_end = std::max(last_end, e);
    if (s > cur_end) {
      busy += cur_end - cur_start;
      cur_start = s;
      cur_end = e;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  busy += cur_end - cur_start;
  std::sort(days.begin(), days.end());
  days.erase(std::unique(days.begin(), days.end()), days.end());
  est.busy_hours = busy / 3600.0;
  est.span_hours = (last_end - intervals[0].first) / 3600.0;
  est.working_days = options.working_days > 0 ? options.working_days : int64_t(days.size());
  est.q = est.busy_hours / (double(est.working_days) * options.window_hours);
  est.fraction_of_span = est.span_hours > 0 ? est.busy_hours / est.span_hours : 0;
  if (!(est.q > 0 && est.q < 1))
    fail("{}: the estimated activity q = {:.3f} is not between 0 and 1 ({:.2f} busy hours over {} days of {} h); "
         "give --work-days or --window-hours that cover the log",
         origin, est.q, est.busy_hours, est.working_days, options.window_hours);
  return est;
}

ActivityEstimate estimate_activity(const std::string& path, const ActivityOptions& options) {
  std::ifstream f(path);
  if (!f) fail("--activity {}: cannot open the file", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return estimate_activity_text(ss.str(), options, path);
}

}  // namespace spill::bench
