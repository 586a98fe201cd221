// The seat and cost model: how many developers a server carries, and what it costs against
// per-seat subscriptions.
//
// A server has a capacity: the number of streams it can generate at once while each still gets
// the speed a developer needs (the SLO, e.g. 40 tok/s at the 5th percentile, with a margin).
// A developer is generating with probability q at a random moment of the working day (the model
// writes for them a small part of the time; they read, think and type the rest). With n
// developers, the number generating at once is X; the team fits when P(X > capacity) <= risk.
//   independent people: X ~ Binomial(n, q);
//   one team on one schedule: X ~ BetaBinomial(n, alpha, beta) with mean n q and intra-team
//   correlation rho (alpha = q (1/rho - 1), beta = (1 - q)(1/rho - 1)): the variance grows by
//   1 + (n - 1) rho, so fewer people fit. rho = 0 is the binomial.
// Several servers behind one load balancer pool their capacity: k servers serve n developers when
// P(X_n > k capacity) <= risk.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace spill::bench {

// P(X > c) for X ~ Binomial(n, q); rho > 0 uses the beta-binomial with that correlation.
double active_tail(int64_t n, double q, int64_t c, double rho = 0);
// P(X = k), same distributions. For tests and the report's table.
double active_pmf(int64_t n, double q, int64_t k, double rho = 0);

// The largest team with P(X > capacity) <= risk (at least `capacity`: that many always fit).
int64_t team_size(double q, int64_t capacity, double risk, double rho = 0);
// The fewest servers of `capacity` streams each, pooled, that serve `developers` at the risk.
int64_t servers_needed(int64_t developers, double q, int64_t capacity, double risk, double rho = 0);

// One measured concurrency level: per-stream decode tok/s median and 5th percentile.
struct StreamSpeed {
  int concurrency = 0;
  double median_tok_s = 0;
  double p5_tok_s = 0;
};

struct CapacityRule {
  double slo_tok_s = 40;
  bool use_p5 = true;   // false: the median must hold the SLO
  double margin = 0.10;  // the speed must be at least slo * (1 + margin)
};

// The largest measured concurrency such that it and every smaller measured one hold
// slo * (1 + margin); 0 when even the smallest does not. Levels need not be sorted.
int capacity_at_slo(std::span<const StreamSpeed> levels, const CapacityRule& rule);

// Costs, per month, of k servers against n subscriptions.
struct CostInputs {
  double server_cost_per_hour = 3.73;
  double hours_per_month = 730;  // 24 * 365 / 12: the server runs day and night
  double subscription_per_month = 180;
};
double monthly_server_cost(const CostInputs& cost);
// How many subscriptions one server costs (the team size from which it is cheaper).
double break_even_subscriptions(const CostInputs& cost);
// 1 - (servers * monthly cost) / (developers * subscription): the saving, a fraction.
double saving_fraction(const CostInputs& cost, int64_t developers, int64_t servers);

// q from a log of generation intervals: the time the model spent generating for the person
// (the union of the intervals, so overlapping agents count once) over their working time
// (working days x window hours). Working days: distinct days (UTC plus utc_offset_hours) with
// any activity, unless working_days > 0 is given.
struct ActivityEstimate {
  double busy_hours = 0;
  double span_hours = 0;  // first start to last end
  int64_t intervals = 0;
  int64_t working_days = 0;
  double window_hours = 8;
  double q = 0;              // busy / (working_days * window_hours)
  double fraction_of_span = 0;  // busy / span
};
struct ActivityOptions {
  double window_hours = 8;
  int64_t working_days = 0;
  double utc_offset_hours = 0;
};
// Lines: `START END` (whitespace or comma separated) or JSON objects {"start": .., "end": ..};
// each time is Unix seconds or ISO 8601 (2026-10-06T09:15:02Z, with an optional fraction and
// +HH:MM offset). Blank lines and lines starting with # are skipped. Errors name file and line.
ActivityEstimate estimate_activity(const std::string& path, const ActivityOptions& options);
ActivityEstimate estimate_activity_text(const std::string& text, const ActivityOptions& options,
                                        const std::string& origin);
// Parses one timestamp as above into Unix seconds; throws spill::Error naming `where`.
double parse_timestamp(const std::string& text, const std::string& where);

}  // namespace spill::bench
