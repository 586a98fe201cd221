#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "bench/prometheus.h"
#include "core/error.h"

namespace spill::bench {

using json = nlohmann::json;

// ---- JSON ---------------------------------------------------------------------------------------

namespace {

json dist_json(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean},     {"stddev", d.stddev}, {"min", d.min}, {"max", d.max},
          {"p5", d.p5},       {"p25", d.p25},       {"median", d.median}, {"p75", d.p75}, {"p90", d.p90},
          {"p95", d.p95},     {"p99", d.p99}};
}

json counters_json(const ServerCounters& c) {
  json j = {{"prefix", c.prefix}};
  auto put = [&](const char* k, const std::optional<double>& v) { j[k] = v ? json(*v) : json(nullptr); };
  put("requests", c.requests);
  put("prompt_tokens", c.prompt_tokens);
  put("generation_tokens", c.generation_tokens);
  put("cached_prompt_tokens", c.cached_prompt_tokens);
  put("prefix_cache_queries", c.prefix_cache_queries);
  put("prefix_cache_hits", c.prefix_cache_hits);
  put("preemptions", c.preemptions);
  return j;
}

json scenario_params(const Scenario& s) {
  json p;
  switch (s.kind) {
    case ScenarioKind::Agent:
      p = {{"context_tokens", s.context_tokens}, {"turns", s.turns},           {"sessions_per_agent", s.sessions_per_agent},
           {"user_min_tokens", s.user_min_tokens}, {"user_max_tokens", s.user_max_tokens}, {"short_output", s.short_output},
           {"long_output", s.long_output},       {"long_fraction", s.long_fraction}, {"think_time_s", s.think_time_s},
           {"session_rate", s.session_rate},     {"concurrency", s.concurrency}};
      break;
    case ScenarioKind::LongContext:
      p = {{"lengths", s.lengths}, {"output_tokens", s.output_tokens}, {"repeats", s.repeats}};
      break;
    case ScenarioKind::PrefixCache:
      p = {{"prefix_tokens", s.prefix_tokens}, {"users", s.users}, {"rounds", s.rounds}, {"suffix_tokens", s.suffix_tokens},
           {"output_tokens", s.output_tokens}};
      break;
    case ScenarioKind::PpTg:
      p = {{"pp_tokens", s.pp_tokens}, {"tg_tokens", s.tg_tokens}, {"depths", s.depths}, {"repetitions", s.repetitions}};
      break;
  }
  return p;
}

}  // namespace

json summary_json(const GroupSummary& s) {
  return {{"completed", s.completed},
          {"failed", s.failed},
          {"input_tokens", s.input_tokens},
          {"output_tokens", s.output_tokens},
          {"cached_tokens", s.cached_tokens},
          {"duration_s", s.duration_s},
          {"request_throughput", s.request_throughput},
          {"output_throughput", s.output_throughput},
          {"total_token_throughput", s.total_token_throughput},
          {"ttft_s", dist_json(s.ttft_s)},
          {"tpot_s", dist_json(s.tpot_s)},
          {"itl_s", dist_json(s.itl_s)},
          {"e2el_s", dist_json(s.e2el_s)},
          {"stream_tok_s", dist_json(s.stream_tok_s)}};
}

json record_json(const RequestRecord& r) {
  return {{"scenario", r.scenario},       {"phase", r.phase},           {"group", r.group},
          {"group_x", r.group_x},         {"concurrency", r.concurrency}, {"session", r.session},
          {"turn", r.turn},               {"content_tokens", r.content_tokens}, {"max_tokens", r.max_tokens},
          {"prompt_tokens", r.prompt_tokens}, {"cached_tokens", r.cached_tokens}, {"output_tokens", r.output_tokens},
          {"usage_reported", r.usage_reported}, {"start_s", r.start_s}, {"ttft_s", r.ttft_s},
          {"latency_s", r.latency_s},     {"tpot_s", r.tpot_s()},        {"itl_s", r.itl_s},
          {"finish_reason", r.finish_reason}, {"http_status", r.http_status}, {"error", r.error}};
}

RequestRecord record_from_json(const json& j) {
  RequestRecord r;
  r.scenario = j.value("scenario", "");
  r.phase = j.value("phase", "");
  r.group = j.value("group", "");
  r.group_x = j.value("group_x", 0.0);
  r.concurrency = j.value("concurrency", 1);
  r.session = j.value("session", 0);
  r.turn = j.value("turn", 0);
  r.content_tokens = j.value("content_tokens", int64_t(0));
  r.max_tokens = j.value("max_tokens", int64_t(0));
  r.prompt_tokens = j.value("prompt_tokens", int64_t(0));
  r.cached_tokens = j.value("cached_tokens", int64_t(0));
  r.output_tokens = j.value("output_tokens", int64_t(0));
  r.usage_reported = j.value("usage_reported", false);
  r.start_s = j.value("start_s", 0.0);
  r.ttft_s = j.value("ttft_s", -1.0);
  r.latency_s = j.value("latency_s", 0.0);
  if (j.contains("itl_s")) r.itl_s = j["itl_s"].get<std::vector<double>>();
  r.finish_reason = j.value("finish_reason", "");
  r.http_status = j.value("http_status", 0);
  r.error = j.value("error", "");
  return r;
}

json result_json(const BenchResult& result, const ReportOptions& options) {
  json out;
  out["format"] = "spill-bench/1";
  std::string label = options.label;
  if (label.empty()) label = result.server.kind + " " + result.server.model_id;
  out["label"] = label;
  out["url"] = result.url;
  out["server"] = {{"model", result.server.model_id}, {"kind", result.server.kind}, {"max_model_len", result.server.max_model_len}};
  out["tokenizer"] = result.tokenizer;
  out["started_utc"] = result.started_utc;
  out["wall_s"] = result.wall_s;
  out["command"] = options.command;
  out["machine"] = options.machine;
  out["options"] = {{"seed", result.options.seed},
                    {"ignore_eos", result.options.ignore_eos},
                    {"temperature", result.options.temperature},
                    {"warmup", result.options.warmup},
                    {"slo_tok_s", options.slo_tok_s},
                    {"margin", options.margin}};
  json scenarios = json::array();
  for (const ScenarioResult& sr : result.scenarios) {
    json s = {{"name", sr.scenario.name},
              {"kind", kind_name(sr.scenario.kind)},
              {"description", sr.scenario.description},
              {"params", scenario_params(sr.scenario)},
              {"skipped", sr.skipped},
              {"notes", sr.notes}};
    // Groups in the order they were sent.
    std::vector<const RequestRecord*> mine;
    for (const RequestRecord& r : result.records)
      if (r.scenario == sr.scenario.name && r.phase != "warmup") mine.push_back(&r);
    std::stable_sort(mine.begin(), mine.end(), [](auto* a, auto* b) { return a->start_s < b->start_s; });
    std::vector<std::string> order;
    std::map<std::string, std::vector<RequestRecord>> by_group;
    for (const RequestRecord* r : mine) {
      if (!by_group.count(r->group)) order.push_back(r->group);
      by_group[r->group].push_back(*r);
    }
    json groups = json::array();
    for (const std::string& g : order) {
      const auto& recs = by_group[g];
      groups.push_back({{"group", g}, {"x", recs.front().group_x}, {"phase", recs.front().phase}, {"summary", summary_json(summarize(recs))}});
    }
    s["groups"] = groups;
    scenarios.push_back(s);
  }
  out["scenarios"] = scenarios;
  json totals = {{"requests", 0}, {"failed", 0}, {"prompt_tokens", 0}, {"output_tokens", 0}, {"cached_tokens", 0}};
  int64_t req = 0, failed = 0, prompt = 0, output = 0, cached = 0;
  for (const RequestRecord& r : result.records) {
    if (!r.ok()) {
      ++failed;
      continue;
    }
    ++req;
    prompt += r.prompt_tokens;
    output += r.output_tokens;
    cached += r.cached_tokens;
  }
  out["client_totals"] = {{"requests", req}, {"failed", failed}, {"prompt_tokens", prompt}, {"output_tokens", output}, {"cached_tokens", cached}};
  if (result.metrics_before && result.metrics_after) {
    ServerCounters before = counters_of(parse_prometheus(*result.metrics_before));
    ServerCounters after = counters_of(parse_prometheus(*result.metrics_after));
    out["server_metrics"] = {{"before", counters_json(before)}, {"after", counters_json(after)}, {"delta", counters_json(counter_delta(before, after))}};
  } else {
    out["server_metrics"] = nullptr;
  }
  return out;
}

// ---- tables -------------------------------------------------------------------------------------

namespace {

struct Table {
  std::string title, note;
  std::vector<std::string> head;
  std::vector<std::vector<std::string>> rows;
};

std::string num(double v, int digits = 1) {
  if (!std::isfinite(v)) return "-";
  return fmt::format("{:.{}f}", v, digits);
}
std::string ms(double seconds) { return num(seconds * 1000, 1); }

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string md_table(const Table& t) {
  std::string out = "### " + t.title + "\n\n";
  if (!t.note.empty()) out += t.note + "\n\n";
  out += "|";
  for (const auto& h : t.head) out += " " + h + " |";
  out += "\n|";
  for (size_t i = 0; i < t.head.size(); ++i) out += i == 0 ? "---|" : "---:|";
  out += "\n";
  for (const auto& row : t.rows) {
    out += "|";
    for (const auto& c : row) out += " " + c + " |";
    out += "\n";
  }
  return out + "\n";
}

std::string html_table(const Table& t) {
  std::string out = "<h3>" + escape_html(t.title) + "</h3>\n";
  if (!t.note.empty()) out += "<p>" + escape_html(t.note) + "</p>\n";
  out += "<table><tr>";
  for (const auto& h : t.head) out += "<th>" + escape_html(h) + "</th>";
  out += "</tr>\n";
  for (const auto& row : t.rows) {
    out += "<tr>";
    for (size_t i = 0; i < row.size(); ++i) out += (i == 0 ? "<td class=l>" : "<td>") + escape_html(row[i]) + "</td>";
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

const json* find_scenario(const json& result, const std::string& name) {
  for (const json& s : result["scenarios"])
    if (s["name"] == name) return &s;
  return nullptr;
}

std::vector<std::string> scenario_names(const std::vector<json>& results) {
  std::vector<std::string> names;
  for (const json& r : results)
    for (const json& s : r["scenarios"])
      if (std::find(names.begin(), names.end(), s["name"].get<std::string>()) == names.end()) names.push_back(s["name"]);
  return names;
}

double d(const json& summary, const char* dist, const char* stat) { return summary[dist][stat].get<double>(); }

std::vector<Table> tables_of(const std::vector<json>& results) {
  std::vector<Table> tables;
  bool several = results.size() > 1;
  auto lead = [&](const json& r, std::vector<std::string> head) {
    if (several) head.insert(head.begin(), "run");
    (void)r;
    return head;
  };
  for (const std::string& name : scenario_names(results)) {
    Table t;
    std::string kind, description;
    std::vector<std::string> notes;
    for (const json& r : results) {
      const json* s = find_scenario(r, name);
      if (!s) continue;
      kind = (*s)["kind"];
      description = (*s)["description"];
      std::string label = r["label"];
      if (!(*s)["skipped"].get<std::string>().empty()) notes.push_back((several ? label + ": " : "") + "skipped: " + (*s)["skipped"].get<std::string>());
      for (const json& n : (*s)["notes"]) notes.push_back((several ? label + ": " : "") + n.get<std::string>());
      for (const json& g : (*s)["groups"]) {
        const json& sm = g["summary"];
        std::vector<std::string> row;
        if (several) row.push_back(label);
        std::string failed = std::to_string(sm["failed"].get<int64_t>());
        if (kind == "agent") {
          t.head = lead(r, {"streams", "requests", "tok/s per stream, median", "p5", "TTFT median s", "TTFT p95 s", "TPOT median ms",
                            "ITL p99 ms", "output tok/s, all streams", "failed"});
          row.insert(row.end(), {num(g["x"].get<double>(), 0), std::to_string(sm["completed"].get<int64_t>()), num(d(sm, "stream_tok_s", "median")),
                                 num(d(sm, "stream_tok_s", "p5")), num(d(sm, "ttft_s", "median"), 3), num(d(sm, "ttft_s", "p95"), 3),
                                 ms(d(sm, "tpot_s", "median")), ms(d(sm, "itl_s", "p99")), num(sm["output_throughput"].get<double>()), failed});
        } else if (kind == "long-context") {
          t.head = lead(r, {"prompt tokens", "TTFT s", "prefill tok/s", "TPOT median ms", "tok/s", "failed"});
          double ttft = d(sm, "ttft_s", "median");
          double x = g["x"].get<double>();
          row.insert(row.end(), {num(x, 0), num(ttft, 3), num(ttft > 0 ? x / ttft : NAN, 0), ms(d(sm, "tpot_s", "median")),
                                 num(d(sm, "stream_tok_s", "median")), failed});
        } else if (kind == "prefix-cache") {
          t.head = lead(r, {"users", "requests", "cached share of prompt", "TTFT p50 s", "TTFT p95 s", "TTFT p99 s", "TPOT median ms", "failed"});
          double input = double(sm["input_tokens"].get<int64_t>());
          row.insert(row.end(), {num(g["x"].get<double>(), 0), std::to_string(sm["completed"].get<int64_t>()),
                                 input > 0 ? num(100.0 * double(sm["cached_tokens"].get<int64_t>()) / input, 1) + "%" : "-",
                                 num(d(sm, "ttft_s", "median"), 3), num(d(sm, "ttft_s", "p95"), 3), num(d(sm, "ttft_s", "p99"), 3),
                                 ms(d(sm, "tpot_s", "median")), failed});
        } else if (kind == "pp-tg") {
          t.head = lead(r, {"test", "t/s mean", "t/s stddev", "repetitions", "cached tokens per request", "failed"});
          // pp: new prompt tokens over TTFT; tg: 1 / TPOT. Per request, then mean and stddev.
          const std::string phase = g["phase"];
          std::string group = g["group"];
          std::vector<double> rates;
          if (r.contains("_records")) {
            for (const json& rec : r["_records"]) {
              if (rec["scenario"] != name || rec["group"] != group || rec["error"] != "" || rec["http_status"] != 200) continue;
              if (phase == "pp") {
                double new_tokens = double(rec["prompt_tokens"].get<int64_t>() - rec["cached_tokens"].get<int64_t>());
                if (rec["ttft_s"].get<double>() > 0) rates.push_back(new_tokens / rec["ttft_s"].get<double>());
              } else if (rec["tpot_s"].get<double>() > 0) {
                rates.push_back(1.0 / rec["tpot_s"].get<double>());
              }
            }
          }
          Distribution dr = describe(rates);
          int64_t n = sm["completed"].get<int64_t>();
          row.insert(row.end(), {group, num(dr.mean, 2), num(dr.stddev, 2), std::to_string(n),
                                 n > 0 ? num(double(sm["cached_tokens"].get<int64_t>()) / double(n), 0) : "-", failed});
        }
        t.rows.push_back(row);
      }
    }
    t.title = name + " (" + description + ")";
    for (const auto& n : notes) t.note += (t.note.empty() ? "" : " ") + n + ".";
    if (kind == "pp-tg")
      t.note += (t.note.empty() ? "" : " ") +
                std::string("pp: prompt tokens not read from the cache over the time to the first token; tg: 1 / TPOT.");
    if (kind == "agent")
      t.note += (t.note.empty() ? "" : " ") + std::string("Per-stream speed: 1 / TPOT of each agent turn (first token excluded); p5 is the slowest 5%.");
    if (t.head.empty()) t.head = {"note"};
    tables.push_back(std::move(t));
  }
  // What the server saw, next to what the client counted.
  Table m;
  m.title = "What the server saw (/metrics after - before) and what the client counted";
  m.head = {"run", "counter", "client", "server"};
  bool any = false;
  for (const json& r : results) {
    const json& ct = r["client_totals"];
    const json& sm = r["server_metrics"];
    auto server = [&](const char* k) -> std::string {
      if (sm.is_null() || sm["delta"][k].is_null()) return "-";
      return num(sm["delta"][k].get<double>(), 0);
    };
    std::string label = r["label"];
    m.rows.push_back({label, "requests", std::to_string(ct["requests"].get<int64_t>()), server("requests")});
    m.rows.push_back({label, "prompt tokens", std::to_string(ct["prompt_tokens"].get<int64_t>()), server("prompt_tokens")});
    m.rows.push_back({label, "generated tokens", std::to_string(ct["output_tokens"].get<int64_t>()), server("generation_tokens")});
    m.rows.push_back({label, "cached prompt tokens", std::to_string(ct["cached_tokens"].get<int64_t>()), server("cached_prompt_tokens")});
    m.rows.push_back({label, "failed requests", std::to_string(ct["failed"].get<int64_t>()), "-"});
    if (!sm.is_null()) {
      m.rows.push_back({label, "prefix-cache hits / queries (tokens)", "-",
                        server("prefix_cache_hits") + " / " + server("prefix_cache_queries")});
      m.rows.push_back({label, "preemptions", "-", server("preemptions")});
      any = true;
    }
  }
  m.note = any ? "Counters of the server's /metrics (spill: or vllm: names), scraped before the first request and after the last."
               : "The server exposes no spill: or vllm: counters at /metrics, so only the client's totals are shown.";
  tables.push_back(std::move(m));
  return tables;
}

std::string header_md(const json& r) {
  return fmt::format("- **{}**: {} at {}, model `{}`, context {} tokens\n  started {}, {:.0f} s; tokenizer: {}; seed {}, "
                     "fixed output lengths: {}\n  machine: {}\n  command: `{}`\n",
                     r["label"].get<std::string>(), r["server"]["kind"].get<std::string>(), r["url"].get<std::string>(),
                     r["server"]["model"].get<std::string>(), r["server"]["max_model_len"].get<int64_t>(),
                     r["started_utc"].get<std::string>(), r["wall_s"].get<double>(), r["tokenizer"].get<std::string>(),
                     r["options"]["seed"].get<uint64_t>(), r["options"]["ignore_eos"].get<bool>() ? "yes (ignore_eos)" : "no",
                     r.value("machine", ""), r.value("command", ""));
}

// ---- SVG charts ---------------------------------------------------------------------------------

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
  bool dashed = false;
  int color = 0;
};

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

double nice_step(double range) {
  double raw = range / 5;
  double mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

std::string svg_chart(const std::string& title, const std::string& xlabel, const std::string& ylabel, const std::vector<Series>& series,
                      const std::vector<std::pair<double, std::string>>& hlines, bool log_x) {
  // The plot is 720 x 400; the legend goes under it, two entries a row, so long names fit.
  const double W = 760, L = 70, R = 30, T = 40, B = 50;
  const double H = 400 + 18 * double((series.size() + 1) / 2) + 10;
  const double plot_bottom = 400 - B;
  double xmin = INFINITY, xmax = -INFINITY, ymax = 0;
  std::set<double> xs;
  for (const Series& s : series)
    for (auto [x, y] : s.points) {
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymax = std::max(ymax, y);
      xs.insert(x);
    }
  for (const auto& h : hlines) ymax = std::max(ymax, h.first);
  std::string out = fmt::format("<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' viewBox='0 0 {} {}' font-family='sans-serif' font-size='12'>\n",
                                W, H, W, H);
  out += fmt::format("<text x='{}' y='22' font-size='15' font-weight='bold'>{}</text>\n", L, escape_html(title));
  if (xs.empty() || ymax <= 0) return out + fmt::format("<text x='{}' y='{}'>no data</text></svg>\n", L, plot_bottom / 2);
  if (log_x && xmin <= 0) log_x = false;
  auto fx = [&](double x) {
    if (xmax == xmin) return L + (W - L - R) / 2;
    double t = log_x ? (std::log(x) - std::log(xmin)) / (std::log(xmax) - std::log(xmin)) : (x - xmin) / (xmax - xmin);
    return L + t * (W - L - R);
  };
  double step = nice_step(ymax * 1.1);
  double ytop = std::ceil(ymax * 1.1 / step) * step;
  auto fy = [&](double y) { return plot_bottom - y / ytop * (plot_bottom - T); };
  out += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' fill='none' stroke='#999'/>\n", L, T, W - L - R, plot_bottom - T);
  for (double y = 0; y <= ytop + 1e-9; y += step) {
    out += fmt::format("<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#eee'/><text x='{}' y='{:.1f}' text-anchor='end'>{}</text>\n", L, W - R,
                       fy(y), fy(y), L - 6, fy(y) + 4, num(y, std::fmod(step, 1) == 0 ? 0 : step >= 0.1 ? 1 : 2));
  }
  for (double x : xs) {
    std::string lab = x >= 1024 && std::fmod(x, 1024) == 0 ? fmt::format("{}K", int64_t(x / 1024)) : num(x, 0);
    out += fmt::format("<line x1='{:.1f}' x2='{:.1f}' y1='{}' y2='{}' stroke='#999'/><text x='{:.1f}' y='{}' text-anchor='middle'>{}</text>\n", fx(x),
                       fx(x), plot_bottom, plot_bottom + 4, fx(x), plot_bottom + 18, lab);
  }
  out += fmt::format("<text x='{}' y='{}' text-anchor='middle'>{}</text>\n", L + (W - L - R) / 2, plot_bottom + 36, escape_html(xlabel));
  out += fmt::format("<text x='16' y='{}' text-anchor='middle' transform='rotate(-90 16 {})'>{}</text>\n", T + (plot_bottom - T) / 2,
                     T + (plot_bottom - T) / 2, escape_html(ylabel));
  for (size_t i = 0; i < hlines.size(); ++i) {
    const auto& [y, label] = hlines[i];
    // The first label under its line, the others above theirs, so close lines stay readable.
    double label_y = i == 0 ? fy(y) + 13 : fy(y) - 4;
    out += fmt::format("<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#000' stroke-dasharray='2,3'/>"
                       "<text x='{}' y='{:.1f}' text-anchor='end'>{}</text>\n",
                       L, W - R, fy(y), fy(y), W - R - 4, label_y, escape_html(label));
  }
  int legend = 0;
  for (const Series& s : series) {
    const char* color = kPalette[s.color % 8];
    std::string pts;
    for (auto [x, y] : s.points) pts += fmt::format("{:.1f},{:.1f} ", fx(x), fy(y));
    out += fmt::format("<polyline fill='none' stroke='{}' stroke-width='2' {} points='{}'/>\n", color,
                       s.dashed ? "stroke-dasharray='6,4'" : "", pts);
    for (auto [x, y] : s.points)
      out += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='3' fill='{}'><title>{}: {} at {}</title></circle>\n", fx(x), fy(y), color,
                         escape_html(s.name), num(y, 2), num(x, 0));
    double lx = L + (legend % 2) * (W - L - R) / 2, ly = 400 + 18 * (legend / 2);
    ++legend;
    out += fmt::format("<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='{}' stroke-width='2' {}/><text x='{}' y='{:.1f}'>{}</text>\n",
                       lx, lx + 24, ly, ly, color, s.dashed ? "stroke-dasharray='6,4'" : "", lx + 30, ly + 4, escape_html(s.name));
  }
  return out + "</svg>\n";
}

std::vector<std::string> charts_of(const std::vector<json>& results) {
  std::vector<std::string> charts;
  bool several = results.size() > 1;
  std::vector<Series> speed, ttft, tpot;
  int color = 0;
  double slo = results.front()["options"].value("slo_tok_s", 40.0);
  double margin = results.front()["options"].value("margin", 0.1);
  for (const json& r : results) {
    std::string label = r["label"];
    for (const json& s : r["scenarios"]) {
      std::string name = several ? label + " " + s["name"].get<std::string>() : s["name"].get<std::string>();
      if (s["kind"] == "agent" && !s["groups"].empty()) {
        Series med, p5;
        med.name = name + " median";
        p5.name = name + " p5";
        p5.dashed = true;
        med.color = p5.color = color;
        for (const json& g : s["groups"]) {
          const json& d = g["summary"]["stream_tok_s"];
          if (d["count"].get<int64_t>() == 0) continue;
          med.points.emplace_back(g["x"].get<double>(), d["median"].get<double>());
          p5.points.emplace_back(g["x"].get<double>(), d["p5"].get<double>());
        }
        speed.push_back(med);
        speed.push_back(p5);
        ++color;
      }
      if (s["kind"] == "long-context" && !s["groups"].empty()) {
        Series a, b;
        a.name = b.name = name;
        a.color = b.color = color;
        for (const json& g : s["groups"]) {
          const json& sm = g["summary"];
          if (sm["ttft_s"]["count"].get<int64_t>() > 0) a.points.emplace_back(g["x"].get<double>(), sm["ttft_s"]["median"].get<double>());
          if (sm["tpot_s"]["count"].get<int64_t>() > 0) b.points.emplace_back(g["x"].get<double>(), 1000 * sm["tpot_s"]["median"].get<double>());
        }
        ttft.push_back(a);
        tpot.push_back(b);
        ++color;
      }
    }
  }
  if (!speed.empty())
    charts.push_back(svg_chart("Per-stream decode speed of agent turns", "concurrent streams", "tok/s per stream", speed,
                               {{slo, fmt::format("SLO {} tok/s", num(slo, 0))}, {slo * (1 + margin), fmt::format("+{}% margin", num(margin * 100, 0))}},
                               false));
  if (!ttft.empty()) charts.push_back(svg_chart("Time to first token against prompt length", "prompt tokens", "TTFT, s", ttft, {}, true));
  if (!tpot.empty()) charts.push_back(svg_chart("Time per output token against context depth", "context tokens", "TPOT median, ms", tpot, {}, true));
  return charts;
}

}  // namespace

std::string markdown_report(const std::vector<json>& results) {
  std::string out = results.size() > 1 ? "# spill bench: comparison\n\n" : "# spill bench\n\n";
  for (const json& r : results) out += header_md(r);
  out += "\n";
  for (const Table& t : tables_of(results)) out += md_table(t);
  return out;
}

std::string html_report(const std::vector<json>& results) {
  std::string out =
      "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>spill bench</title>\n<style>"
      "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}table{border-collapse:collapse;margin-bottom:1.5em}"
      "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td.l{text-align:left}th{background:#f4f4f4}"
      "code{background:#f4f4f4}svg{display:block;margin:1em 0}</style></head><body>\n";
  out += results.size() > 1 ? "<h1>spill bench: comparison</h1>\n" : "<h1>spill bench</h1>\n";
  out += "<ul>\n";
  for (const json& r : results) {
    out += fmt::format("<li><b>{}</b>: {} at <code>{}</code>, model <code>{}</code>, context {} tokens; started {}, {:.0f} s; tokenizer {}; "
                       "seed {}; machine: {}; command: <code>{}</code></li>\n",
                       escape_html(r["label"]), escape_html(r["server"]["kind"]), escape_html(r["url"]), escape_html(r["server"]["model"]),
                       r["server"]["max_model_len"].get<int64_t>(), escape_html(r["started_utc"]), r["wall_s"].get<double>(),
                       escape_html(r["tokenizer"]), r["options"]["seed"].get<uint64_t>(), escape_html(r.value("machine", "")),
                       escape_html(r.value("command", "")));
  }
  out += "</ul>\n";
  for (const std::string& c : charts_of(results)) out += c;
  for (const Table& t : tables_of(results)) out += html_table(t);
  return out + "</body></html>\n";
}

void write_outputs(const BenchResult& result, const ReportOptions& options, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("bench: cannot create the output folder {}: {}", dir, ec.message());
  auto write = [&](const std::string& name, const std::string& text) {
    std::string path = (std::filesystem::path(dir) / name).string();
    std::ofstream f(path, std::ios::binary);
    if (!f) fail("bench: cannot write {}", path);
    f << text;
    if (!f) fail("bench: writing {} failed (disk full?)", path);
  };
  std::string lines;
  json records = json::array();
  for (const RequestRecord& r : result.records) {
    json j = record_json(r);
    lines += j.dump() + "\n";
    records.push_back(std::move(j));
  }
  write("requests.jsonl", lines);
  json res = result_json(result, options);
  write("result.json", res.dump(2) + "\n");
  res["_records"] = std::move(records);
  write("report.md", markdown_report({res}));
  write("report.html", html_report({res}));
}

json load_result(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "result.json";
  std::ifstream f(p);
  if (!f) fail("bench --compare: cannot open {}", p.string());
  json j;
  try {
    j = json::parse(f);
  } catch (const std::exception& e) {
    fail("bench --compare: {} is not JSON ({})", p.string(), e.what());
  }
  if (j.value("format", "") != "spill-bench/1") fail("bench --compare: {} is not a spill bench result (no \"format\": \"spill-bench/1\")", p.string());
  // The raw requests next to it feed the pp/tg rates.
  std::ifstream lines(p.parent_path() / "requests.jsonl");
  if (lines) {
    json records = json::array();
    std::string line;
    while (std::getline(lines, line))
      if (!line.empty()) records.push_back(json::parse(line));
    j["_records"] = records;
  }
  return j;
}

}  // namespace spill::bench
