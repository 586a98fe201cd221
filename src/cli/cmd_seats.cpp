// spill seats: from a benchmark result (or given numbers) to a capacity, a team size per server,
// servers for N developers and the monthly cost against per-seat subscriptions, explained in
// plain words. The model is in src/bench/seats.h; docs/BENCH.md walks through an example.
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/report.h"
#include "bench/seats.h"
#include "cli/commands.h"
#include "core/error.h"

namespace spill::cli {

namespace {

struct SeatsArgs {
  std::string bench;
  std::string scenario;
  int capacity = 0;
  double slo = 40;
  std::string stat = "p5";
  double margin = 0.10;
  double q = 0.071;
  std::string activity;
  bench::ActivityOptions activity_options;
  std::vector<double> risks = {0.01, 0.05};
  double correlation = 0.05;
  std::vector<int64_t> developers = {100, 250};
  bench::CostInputs cost;
  std::string currency = "EUR";
  bool json_out = false;
};

// 2722.9 -> "2,723"
std::string grouped(double v) {
  auto n = int64_t(std::llround(v));
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string pct(double fraction, int digits = 1) { return fmt::format("{:.{}f}%", 100 * fraction, digits); }

void run(const SeatsArgs& a) {
  if (a.stat != "p5" && a.stat != "median") fail("seats: --stat must be p5 or median, got '{}'", a.stat);
  nlohmann::json out;
  std::string text;
  auto say = [&](const std::string& line) { text += line + "\n"; };

  // 1. Capacity.
  int capacity = a.capacity;
  bench::CapacityRule rule{.slo_tok_s = a.slo, .use_p5 = a.stat == "p5", .margin = a.margin};
  say("Capacity (streams one server generates at once while each holds the speed a developer needs)");
  if (!a.bench.empty()) {
    nlohmann::json r = bench::load_result(a.bench);
    int found = -1;
    for (const auto& s : r["scenarios"]) {
      if (s["kind"] != "agent" || s["groups"].empty()) continue;
      if (!a.scenario.empty() && s["name"] != a.scenario) continue;
      std::vector<bench::StreamSpeed> levels;
      std::string shown;
      for (const auto& g : s["groups"]) {
        const auto& d = g["summary"]["stream_tok_s"];
        if (d["count"].get<int64_t>() == 0) continue;
        levels.push_back({.concurrency = int(g["x"].get<double>()), .median_tok_s = d["median"], .p5_tok_s = d["p5"]});
        shown += fmt::format(" {}: {:.0f}/{:.0f}", levels.back().concurrency, levels.back().median_tok_s, levels.back().p5_tok_s);
      }
      int c = bench::capacity_at_slo(levels, rule);
      say(fmt::format("  {} (median/p5 tok/s by streams:{}) -> {} streams", s["name"].get<std::string>(), shown, c));
      found = found < 0 ? c : std::min(found, c);
    }
    if (found < 0) fail("seats: {} has no agent scenario with results{}; run spill bench with an agent scenario, or give --capacity",
                        a.bench, a.scenario.empty() ? "" : " named " + a.scenario);
    if (capacity == 0) capacity = found;
    say(fmt::format("  rule: the {} per-stream decode speed must be at least {:.1f} tok/s ({:.0f} tok/s SLO + {:.0f}% margin) at that "
                    "concurrency and every smaller one measured; the smallest over the scenarios counts",
                    a.stat, a.slo * (1 + a.margin), a.slo, 100 * a.margin));
  }
  if (capacity <= 0)
    fail("seats: no capacity: give --capacity N or --bench result.json{}", a.bench.empty() ? "" : " (no measured concurrency held the SLO)");
  say(fmt::format("  capacity: {} streams{}", capacity, a.bench.empty() || a.capacity ? " (given)" : ""));
  out["capacity"] = capacity;

  // 2. Activity.
  double q = a.q;
  say("");
  say("Activity q (the chance that one developer's agent is generating at a random moment of the working day)");
  if (!a.activity.empty()) {
    bench::ActivityEstimate e = bench::estimate_activity(a.activity, a.activity_options);
    q = e.q;
    say(fmt::format("  from {}: {} generation intervals, {:.2f} hours generating (overlaps counted once) over {} working days of {:g} h",
                    a.activity, e.intervals, e.busy_hours, e.working_days, e.window_hours));
    say(fmt::format("  that is {} of the whole log ({:.1f} h) and q = {} of the working time", pct(e.fraction_of_span), e.span_hours, pct(q)));
    out["activity"] = {{"busy_hours", e.busy_hours}, {"span_hours", e.span_hours}, {"working_days", e.working_days},
                       {"window_hours", e.window_hours}, {"intervals", e.intervals}};
  } else {
    say(fmt::format("  q = {} (given; the reference developer's week: about 2.8 hours of generation in 40 working hours)", pct(q)));
  }
  out["q"] = q;

  // 3. Team size.
  say("");
  say(fmt::format("Team size per server (at most the risk that more than {} developers are generating at once)", capacity));
  nlohmann::json teams = nlohmann::json::array();
  for (double risk : a.risks) {
    int64_t n = bench::team_size(q, capacity, risk, 0);
    double p = bench::active_tail(n, q, capacity, 0), p_next = bench::active_tail(n + 1, q, capacity, 0);
    std::string line = fmt::format("  risk {}: {} developers (P(more than {} at once) = {}; {} would be {})", pct(risk, 0), n, capacity,
                                   pct(p, 2), n + 1, pct(p_next, 2));
    nlohmann::json t = {{"risk", risk}, {"developers", n}, {"p_over", p}};
    if (a.correlation > 0) {
      int64_t nc = bench::team_size(q, capacity, risk, a.correlation);
      line += fmt::format("; one team on one schedule (correlation {:g}): {}", a.correlation, nc);
      t["developers_correlated"] = nc;
    }
    say(line);
    teams.push_back(t);
  }
  out["teams"] = teams;

  // 4. Servers for N developers, and 5. cost.
  const double monthly = bench::monthly_server_cost(a.cost);
  const double risk = a.risks.front();
  say("");
  say(fmt::format("Cost: one server at {:g} {}/h x {:g} h/month (day and night) = {} {} per month; that is {:.1f} subscriptions of {:g} {}, "
                  "so from {} developers on, one server is cheaper than their subscriptions",
                  a.cost.server_cost_per_hour, a.currency, a.cost.hours_per_month, grouped(monthly), a.currency,
                  bench::break_even_subscriptions(a.cost), a.cost.subscription_per_month, a.currency,
                  int64_t(std::ceil(bench::break_even_subscriptions(a.cost)))));
  out["monthly_server_cost"] = monthly;
  out["break_even_subscriptions"] = bench::break_even_subscriptions(a.cost);
  nlohmann::json fleets = nlohmann::json::array();
  for (int64_t devs : a.developers) {
    int64_t k = bench::servers_needed(devs, q, capacity, risk, 0);
    double saving = bench::saving_fraction(a.cost, devs, k);
    std::string line = fmt::format("  {} developers: {} servers ({} streams, P(more than {} at once) = {}), {} {} per month against {} {} "
                                   "of subscriptions: {} {}",
                                   devs, k, k * capacity, k * capacity, pct(bench::active_tail(devs, q, k * capacity, 0), 2),
                                   grouped(double(k) * monthly), a.currency, grouped(double(devs) * a.cost.subscription_per_month),
                                   a.currency, pct(std::fabs(saving), 0), saving >= 0 ? "cheaper" : "more expensive");
    nlohmann::json f = {{"developers", devs}, {"servers", k}, {"saving", saving}};
    if (a.correlation > 0) {
      int64_t kc = bench::servers_needed(devs, q, capacity, risk, a.correlation);
      line += fmt::format("; correlated: {} servers ({} {})", kc, pct(std::fabs(bench::saving_fraction(a.cost, devs, kc)), 0),
                          bench::saving_fraction(a.cost, devs, kc) >= 0 ? "cheaper" : "more expensive");
      f["servers_correlated"] = kc;
    }
    say(line);
    fleets.push_back(f);
  }
  out["fleets"] = fleets;

  say("");
  say("Assumptions, in plain words");
  say(fmt::format("- Each developer is generating with probability q = {} at a random moment of the working day, independently of the others: "
                  "the number generating at once is Binomial(n, q). People on one team keep one schedule (stand-ups, deadlines), so "
                  "they are not independent and the binomial is optimistic; the correlated figures use a beta-binomial with "
                  "intra-team correlation {:g} (same mean, variance larger by 1 + (n - 1) x {:g}).",
                  pct(q), a.correlation, a.correlation));
  say(fmt::format("- Going over {} streams does not refuse anyone: every stream slows down for that stretch. The risk is how often that happens.",
                  capacity));
  say(fmt::format("- Several servers share one queue (a load balancer), so their streams pool: k servers carry n developers when "
                  "P(more than k x {} at once) <= {}.",
                  capacity, pct(risk, 0)));
  say("- Costs are machine rental only: no one's time to run it, and a subscription includes a whole product.");
  if (a.json_out) {
    std::puts(out.dump(2).c_str());
  } else {
    std::fputs(text.c_str(), stdout);
  }
}

}  // namespace

void add_seats_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("seats", "how many developers a server carries at an SLO, servers for a team, cost against subscriptions");
  auto a = std::make_shared<SeatsArgs>();
  cmd->add_option("--bench", a->bench, "a spill bench result.json (or its folder): the capacity is read from its agent scenarios");
  cmd->add_option("--scenario", a->scenario, "only this agent scenario of --bench");
  cmd->add_option("--capacity", a->capacity, "streams a server holds at the SLO (instead of --bench)");
  cmd->add_option("--slo", a->slo, "per-stream decode tok/s a developer needs")->capture_default_str();
  cmd->add_option("--stat", a->stat, "which per-stream statistic must hold the SLO: p5 or median")->capture_default_str();
  cmd->add_option("--margin", a->margin, "fraction above the SLO the speed must keep")->capture_default_str();
  cmd->add_option("--q", a->q, "probability that a developer is generating at a random working moment")->capture_default_str();
  cmd->add_option("--activity", a->activity, "log of generation intervals (START END per line, Unix seconds or ISO 8601) to estimate q");
  cmd->add_option("--window-hours", a->activity_options.window_hours, "working hours per day (with --activity)")->capture_default_str();
  cmd->add_option("--work-days", a->activity_options.working_days, "working days the log covers (default: days with activity)");
  cmd->add_option("--utc-offset", a->activity_options.utc_offset_hours, "hours added to UTC to find the local day (with --activity)");
  cmd->add_option("--risk", a->risks, "accepted probabilities of more streams than the capacity, e.g. 0.01,0.05")->delimiter(',')->capture_default_str();
  cmd->add_option("--correlation", a->correlation, "intra-team correlation of the beta-binomial team model; 0: binomial only")->capture_default_str();
  cmd->add_option("--developers", a->developers, "team sizes to size servers for, e.g. 100,250")->delimiter(',')->capture_default_str();
  cmd->add_option("--cost-per-hour", a->cost.server_cost_per_hour, "server rental per hour")->capture_default_str();
  cmd->add_option("--hours-per-month", a->cost.hours_per_month, "hours a month the server runs")->capture_default_str();
  cmd->add_option("--subscription", a->cost.subscription_per_month, "per-seat subscription per month")->capture_default_str();
  cmd->add_option("--currency", a->currency, "currency name for the output")->capture_default_str();
  cmd->add_flag("--json", a->json_out, "print the figures as JSON");
  cmd->callback([a] {
    if (a->risks.empty()) fail("seats: --risk needs at least one value");
    run(*a);
  });
}

}  // namespace spill::cli
