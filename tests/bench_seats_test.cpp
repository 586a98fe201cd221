// The seat and cost model. The reference deployment's figures (../shared/seeds/) are reproduced
// from its inputs: q = 7.1%, capacity 4, 3.73 EUR/h, 180 EUR subscriptions. The distributions are
// checked against independent float64 formulas (products, not lgamma) and their known moments.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "bench/seats.h"
#include "core/error.h"

namespace spill::bench {
namespace {

// P(X = k), X ~ Binomial(n, q), by the multiplicative binomial coefficient in long double.
long double binomial_pmf_reference(int n, long double q, int k) {
  long double c = 1;
  for (int i = 1; i <= k; ++i) c = c * (n - k + i) / i;
  return c * std::pow(q, k) * std::pow(1 - q, n - k);
}

// The beta-binomial as a Polya urn: C(n, k) prod_{i<k} (a + i) prod_{j<n-k} (b + j) / prod_{m<n} (a + b + m).
long double beta_binomial_pmf_reference(int n, long double a, long double b, int k) {
  long double c = 1;
  for (int i = 1; i <= k; ++i) c = c * (n - k + i) / i;
  long double num = 1, den = 1;
  for (int i = 0; i < k; ++i) num *= a + i;
  for (int j = 0; j < n - k; ++j) num *= b + j;
  for (int m = 0; m < n; ++m) den *= a + b + m;
  return c * num / den;
}

TEST(BenchSeats, ReferenceTeamSizes) {
  // "q = 7.1% in an 8 h window. P(Binomial(19, q) > 4) <= 1%, and at 5%, 28 fit."
  EXPECT_EQ(team_size(0.071, 4, 0.01), 19);
  EXPECT_EQ(team_size(0.071, 4, 0.05), 28);
  EXPECT_LE(active_tail(19, 0.071, 4), 0.01);
  EXPECT_GT(active_tail(20, 0.071, 4), 0.01);
  EXPECT_LE(active_tail(28, 0.071, 4), 0.05);
  EXPECT_GT(active_tail(29, 0.071, 4), 0.05);
}

TEST(BenchSeats, ReferenceFleetsAndCosts) {
  // "100 developers fit on 4 servers, 39% cheaper ... 250 fit on 7, 58% cheaper."
  EXPECT_EQ(servers_needed(100, 0.071, 4, 0.01), 4);
  EXPECT_EQ(servers_needed(250, 0.071, 4, 0.01), 7);
  CostInputs cost;  // 3.73 EUR/h, 730 h/month, 180 EUR
  EXPECT_EQ(std::lround(monthly_server_cost(cost)), 2723);           // "about 2,723 euros a month"
  EXPECT_EQ(std::lround(10 * break_even_subscriptions(cost)), 151);  // "15.1 subscriptions of 180 euros"
  EXPECT_EQ(std::lround(100 * saving_fraction(cost, 100, 4)), 39);
  EXPECT_EQ(std::lround(100 * saving_fraction(cost, 250, 7)), 58);
  // 19 developers on one server: already cheaper than 19 subscriptions.
  EXPECT_GT(saving_fraction(cost, 19, 1), 0);
  EXPECT_LT(saving_fraction(cost, 15, 1), 0);
}

TEST(BenchSeats, BinomialMatchesAnIndependentFormula) {
  for (int n : {1, 5, 19, 28, 100, 250}) {
    for (int c : {0, 1, 4, 16, 28}) {
      long double ref = 0;
      for (int k = c + 1; k <= n; ++k) ref += binomial_pmf_reference(n, 0.071L, k);
      double got = active_tail(n, 0.071, c);
      EXPECT_NEAR(got, double(ref), 1e-12 * std::max(1.0, double(ref)) + 1e-300) << "n=" << n << " c=" << c;
      if (ref > 1e-200) {
        EXPECT_NEAR(got / double(ref), 1.0, 1e-10) << "n=" << n << " c=" << c;
      }
    }
  }
  EXPECT_EQ(active_tail(4, 0.071, 4), 0.0);  // never more than 4 of 4
}

TEST(BenchSeats, BetaBinomialMatchesThePolyaUrnAndItsMoments) {
  const double q = 0.071;
  for (double rho : {0.01, 0.05, 0.2}) {
    long double a = q * (1 / rho - 1), b = (1 - q) * (1 / rho - 1);
    for (int n : {1, 7, 19, 60}) {
      double total = 0, mean = 0, second = 0;
      for (int k = 0; k <= n; ++k) {
        double p = active_pmf(n, q, k, rho);
        long double ref = beta_binomial_pmf_reference(n, a, b, k);
        EXPECT_NEAR(p / double(ref), 1.0, 1e-9) << "rho=" << rho << " n=" << n << " k=" << k;
        total += p;
        mean += k * p;
        second += double(k) * k * p;
      }
      EXPECT_NEAR(total, 1.0, 1e-12);
      EXPECT_NEAR(mean, n * q, 1e-10 * n);
      // Var = n q (1 - q) (1 + (n - 1) rho): the overdispersion a shared schedule causes.
      EXPECT_NEAR(second - mean * mean, n * q * (1 - q) * (1 + (n - 1) * rho), 1e-9 * n * n);
    }
  }
}

TEST(BenchSeats, CorrelationOnlyShrinksTheTeam) {
  int64_t independent = team_size(0.071, 4, 0.01, 0);
  int64_t last = independent;
  for (double rho : {0.01, 0.05, 0.1, 0.3}) {
    int64_t n = team_size(0.071, 4, 0.01, rho);
    EXPECT_LE(n, last) << rho;
    last = n;
  }
  EXPECT_LT(last, independent);
  // A vanishing correlation is the binomial.
  EXPECT_NEAR(active_tail(19, 0.071, 4, 1e-9) / active_tail(19, 0.071, 4, 0), 1.0, 1e-6);
}

TEST(BenchSeats, CapacityFromTheReferenceSpeeds) {
  // Median / p5 tok/s per stream by concurrent agents, from the reference deployment.
  std::vector<StreamSpeed> seed = {{6, 40, 34}, {1, 186, 134}, {2, 95, 68}, {3, 70, 59}, {4, 59, 52}, {8, 31, 24}};
  EXPECT_EQ(capacity_at_slo(seed, {.slo_tok_s = 40, .use_p5 = true, .margin = 0.10}), 4);
  EXPECT_EQ(capacity_at_slo(seed, {.slo_tok_s = 40, .use_p5 = false, .margin = 0.10}), 4);
  EXPECT_EQ(capacity_at_slo(seed, {.slo_tok_s = 40, .use_p5 = false, .margin = 0.0}), 6);
  EXPECT_EQ(capacity_at_slo(seed, {.slo_tok_s = 200, .use_p5 = false, .margin = 0.0}), 0);
  // A level that fails stops the count even if a larger one passes again (noise).
  std::vector<StreamSpeed> bumpy = {{1, 100, 90}, {2, 80, 30}, {4, 60, 50}};
  EXPECT_EQ(capacity_at_slo(bumpy, {.slo_tok_s = 40, .use_p5 = true, .margin = 0.10}), 1);
}

TEST(BenchSeats, RefusesNonsense) {
  EXPECT_THROW(team_size(0, 4, 0.01), Error);
  EXPECT_THROW(team_size(0.071, 4, 1.5), Error);
  EXPECT_THROW(team_size(0.071, 4, 0.01, 1.0), Error);
  EXPECT_THROW(servers_needed(100, 0.071, 0, 0.01), Error);
}

TEST(BenchSeats, TimestampsInEveryAcceptedForm) {
  EXPECT_DOUBLE_EQ(parse_timestamp("86400", "t"), 86400);
  EXPECT_DOUBLE_EQ(parse_timestamp("1970-01-02T00:00:00Z", "t"), 86400);
  // 2000-03-01 follows a leap day: 11017 days after the epoch.
  EXPECT_DOUBLE_EQ(parse_timestamp("2000-03-01T00:00:00Z", "t"), 11017.0 * 86400);
  double utc = parse_timestamp("2026-10-06T09:15:02Z", "t");
  EXPECT_DOUBLE_EQ(parse_timestamp("2026-10-06T11:15:02+02:00", "t"), utc);
  EXPECT_DOUBLE_EQ(parse_timestamp("2026-10-06 09:15:02.250Z", "t"), utc + 0.25);
  EXPECT_DOUBLE_EQ(parse_timestamp(std::to_string(int64_t(utc)), "t"), utc);
  EXPECT_THROW(parse_timestamp("yesterday", "t"), Error);
  EXPECT_THROW(parse_timestamp("2026-13-01T00:00:00Z", "t"), Error);
  EXPECT_THROW(parse_timestamp("2026-10-06T09:15:02 CET", "t"), Error);
}

TEST(BenchSeats, ActivityLogGivesQ) {
  // A week of 5 working days. Each day: two overlapping agent runs 09:00-09:20 and 09:10-09:30
  // (30 min once overlaps count once), and 14:00-14:04:06 (246 s), written in three forms.
  // Busy per day 1800 + 246 = 2046 s; q = 5 * 2046 / (5 * 8 * 3600).
  std::string log = "# start end\n\n";
  for (int day = 5; day <= 9; ++day) {
    std::string d = fmt::format("2026-10-{:02d}", day);
    log += fmt::format("{}T09:00:00Z {}T09:20:00Z\n", d, d);
    log += fmt::format("{}T11:10:00+02:00,{}T11:30:00+02:00\n", d, d);
    double t = parse_timestamp(d + "T14:00:00Z", "t");
    log += fmt::format("{{\"start\": {}, \"end\": \"{}T14:04:06Z\"}}\n", int64_t(t), d);
  }
  ActivityEstimate e = estimate_activity_text(log, {}, "week.log");
  EXPECT_EQ(e.intervals, 15);
  EXPECT_EQ(e.working_days, 5);
  EXPECT_NEAR(e.busy_hours, 5 * 2046 / 3600.0, 1e-9);
  EXPECT_NEAR(e.q, 2046.0 / (8 * 3600), 1e-12);
  // Span: Monday 09:00 to Friday 14:04:06.
  EXPECT_NEAR(e.span_hours, (4 * 86400 + 5 * 3600 + 246) / 3600.0, 1e-9);
  ActivityEstimate six = estimate_activity_text(log, {.window_hours = 8, .working_days = 6, .utc_offset_hours = 0}, "week.log");
  EXPECT_NEAR(six.q, 5 * 2046.0 / (6 * 8 * 3600), 1e-12);
}

TEST(BenchSeats, ActivityLogErrorsNameTheLine) {
  try {
    estimate_activity_text("100 200\n300\n", {}, "a.log");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a.log:2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(estimate_activity_text("200 100\n", {}, "a.log"), Error);     // ends before it starts
  EXPECT_THROW(estimate_activity_text("# nothing\n", {}, "a.log"), Error);   // no interval
  EXPECT_THROW(estimate_activity_text("{\"start\": 1}\n", {}, "a.log"), Error);
  EXPECT_THROW(estimate_activity("/nonexistent/activity.log", {}), Error);
}

}  // namespace
}  // namespace spill::bench
