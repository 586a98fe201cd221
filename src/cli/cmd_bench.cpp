// spill bench: measure an OpenAI-compatible server the way a team sizing it needs (per-stream
// decode speed of agent turns by concurrency, long-context TTFT/TPOT, prefix cache, pp/tg), and
// write requests.jsonl, result.json, report.md and report.html. docs/BENCH.md explains it.
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "bench/client.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "bench/workload.h"
#include "cli/commands.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace spill::cli {

namespace {

struct BenchArgs {
  std::string url;
  std::vector<std::string> compare;
  std::string scenario = "tiny";
  std::vector<int> concurrency;
  int turns = 0, sessions = 0, users = 0, repeats = 0;
  int64_t context = 0, prefix_tokens = 0, output_tokens = 0, short_output = 0, long_output = 0;
  std::vector<int64_t> lengths, depths;
  double think_time = -1, rate = -1;
  bool natural = false, no_warmup = false, no_progress = false;
  std::string tokenizer, out, label;
  double slo = 40, margin = 0.10;
  bench::RunOptions run;
  std::vector<std::string> argv;
  bool has_overrides = false;  // a flag changed a scenario's sizes
};

std::string machine_description() {
  std::string cpu;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  utsname u{};
  uname(&u);
  return fmt::format("{}, {} CPUs, {} {} {}", cpu.empty() ? "unknown CPU" : cpu, sysconf(_SC_NPROCESSORS_ONLN), u.sysname, u.release, u.machine);
}

std::string default_out_dir() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "spill-bench-%Y%m%d-%H%M%S", &tm);
  return buf;
}

std::unique_ptr<bench::TokenCounter> make_counter(const BenchArgs& a, bench::ApiClient& client) {
  if (!a.tokenizer.empty()) {
    std::filesystem::path p(a.tokenizer);
    if (std::filesystem::is_directory(p)) p /= "tokenizer.json";
    return bench::make_local_counter(Tokenizer::from_file(p.string()), p.string());
  }
  // The server counts: one probe now, so a server without /tokenize fails before any work.
  client.tokenize_count("def probe():\n    return 1\n");
  bench::Endpoint e{.url = a.run.endpoint.url, .api_key = a.run.endpoint.api_key, .model = client.model(), .timeout_s = a.run.endpoint.timeout_s};
  auto counter_client = std::make_shared<bench::ApiClient>(e);
  return bench::make_function_counter([counter_client](const std::string& text) { return counter_client->tokenize_count(text); },
                                      a.run.endpoint.url + "/tokenize");
}

void apply_overrides(const BenchArgs& a, std::vector<bench::Scenario>& scenarios) {
  for (bench::Scenario& s : scenarios) {
    if (s.kind == bench::ScenarioKind::Agent) {
      if (!a.concurrency.empty()) s.concurrency = a.concurrency;
      if (a.turns > 0) s.turns = a.turns;
      if (a.sessions > 0) s.sessions_per_agent = a.sessions;
      if (a.context > 0) s.context_tokens = a.context;
      if (a.short_output > 0) s.short_output = a.short_output;
      if (a.long_output > 0) s.long_output = a.long_output;
      if (a.think_time >= 0) s.think_time_s = a.think_time;
      if (a.rate >= 0) s.session_rate = a.rate;
    }
    if (s.kind == bench::ScenarioKind::LongContext) {
      if (!a.lengths.empty()) s.lengths = a.lengths;
      if (a.repeats > 0) s.repeats = a.repeats;
    }
    if (s.kind == bench::ScenarioKind::PrefixCache) {
      if (a.prefix_tokens > 0) s.prefix_tokens = a.prefix_tokens;
      if (a.users > 0) s.users = a.users;
    }
    if (s.kind == bench::ScenarioKind::PpTg && !a.depths.empty()) s.depths = a.depths;
    if (a.output_tokens > 0 && s.kind != bench::ScenarioKind::Agent) s.output_tokens = a.output_tokens;
    if (a.has_overrides) s.description += "; sizes changed on the command line (result.json has them)";
  }
}

void run_compare(const BenchArgs& a) {
  std::vector<nlohmann::json> results;
  for (const std::string& p : a.compare) results.push_back(bench::load_result(p));
  std::string md = bench::markdown_report(results);
  std::fputs(md.c_str(), stdout);
  if (!a.out.empty()) {
    std::filesystem::create_directories(a.out);
    std::ofstream(std::filesystem::path(a.out) / "compare.md") << md;
    std::ofstream(std::filesystem::path(a.out) / "compare.html") << bench::html_report(results);
    std::fprintf(stderr, "bench: wrote %s/compare.md and compare.html\n", a.out.c_str());
  }
}

void run(BenchArgs& a) {
  if (!a.compare.empty()) {
    if (a.compare.size() < 2) fail("bench --compare needs at least two result.json files (or result folders)");
    run_compare(a);
    return;
  }
  if (a.url.empty()) fail("bench: give the server's URL, e.g. spill bench http://127.0.0.1:8080 (or --compare a.json b.json)");
  a.has_overrides = !a.concurrency.empty() || a.turns > 0 || a.sessions > 0 || a.context > 0 || a.short_output > 0 || a.long_output > 0 ||
                    a.think_time >= 0 || a.rate >= 0 || !a.lengths.empty() || a.repeats > 0 || a.prefix_tokens > 0 || a.users > 0 ||
                    !a.depths.empty() || a.output_tokens > 0;
  std::vector<bench::Scenario> scenarios = bench::select_scenarios(a.scenario);
  apply_overrides(a, scenarios);
  a.run.endpoint.url = a.url;
  a.run.ignore_eos = !a.natural;
  a.run.warmup = !a.no_warmup;
  a.run.progress = !a.no_progress;
  bench::ApiClient client(a.run.endpoint);
  bench::ServerInfo info = client.server_info();
  if (a.run.endpoint.model.empty()) a.run.endpoint.model = client.model();
  if (a.run.endpoint.model.empty()) fail("bench: {} lists no model in /v1/models; pass --model NAME", a.url);
  auto counter = make_counter(a, client);
  std::fprintf(stderr, "bench: %s server at %s, model %s, context %lld tokens; prompts counted by %s\n", info.kind.c_str(), a.url.c_str(),
               a.run.endpoint.model.c_str(), (long long)info.max_model_len, counter->describe().c_str());
  bench::BenchResult result = bench::run_bench(scenarios, a.run, *counter, info);
  bench::ReportOptions ro{.label = a.label, .command = "", .machine = machine_description(), .slo_tok_s = a.slo, .margin = a.margin};
  for (const std::string& s : a.argv) ro.command += (ro.command.empty() ? "" : " ") + s;
  std::string out = a.out.empty() ? default_out_dir() : a.out;
  bench::write_outputs(result, ro, out);
  std::ifstream md(std::filesystem::path(out) / "report.md");
  std::stringstream ss;
  ss << md.rdbuf();
  std::fputs(ss.str().c_str(), stdout);
  std::fprintf(stderr, "bench: wrote %s/{requests.jsonl,result.json,report.md,report.html}\n", out.c_str());
  size_t failed = 0;
  for (const auto& r : result.records) failed += r.ok() ? 0 : 1;
  if (failed > 0) fail("bench: {} of {} requests failed (see {}/requests.jsonl)", failed, result.records.size(), out);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "benchmark an OpenAI-compatible server: agent turns, long context, prefix cache (docs/BENCH.md)");
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("url", a->url, "the server, e.g. http://127.0.0.1:8080 (with or without /v1)");
  cmd->add_option("--compare", a->compare, "put result.json files (or result folders) side by side instead of running")->expected(2, 64);
  cmd->add_option("--scenario", a->scenario,
                  "comma-separated scenarios or groups: all (agent-4k ... agent-256k, long-context, prefix-cache, pp-tg), agents, "
                  "tiny (the same shapes for a 2K-context model)")
      ->capture_default_str();
  cmd->add_option("--concurrency", a->concurrency, "agent streams at once, a sweep: 1,2,3,4,6,8")->delimiter(',');
  cmd->add_option("--turns", a->turns, "turns per agent session");
  cmd->add_option("--sessions", a->sessions, "sessions each agent runs, one after another, per concurrency level");
  cmd->add_option("--context", a->context, "tokens of the shared project context of agent scenarios");
  cmd->add_option("--short-output", a->short_output, "tokens of a tool-call-like reply");
  cmd->add_option("--long-output", a->long_output, "tokens of a code-writing reply");
  cmd->add_option("--think-time", a->think_time, "mean seconds an agent waits between turns (exponential)");
  cmd->add_option("--rate", a->rate, "agent sessions arriving per second (Poisson), at most --concurrency at once; 0: closed loop");
  cmd->add_option("--lengths", a->lengths, "prompt lengths of long-context scenarios, e.g. 4096,131072")->delimiter(',');
  cmd->add_option("--repeats", a->repeats, "requests per prompt length");
  cmd->add_option("--prefix-tokens", a->prefix_tokens, "tokens of the shared cached prefix (prefix-cache)");
  cmd->add_option("--users", a->users, "users sharing the prefix at once (prefix-cache)");
  cmd->add_option("--depths", a->depths, "context depths of pp/tg, e.g. 0,4096")->delimiter(',');
  cmd->add_option("--output-tokens", a->output_tokens, "reply tokens of long-context and prefix-cache requests");
  cmd->add_flag("--natural", a->natural, "let replies end at EOS (max_tokens still caps them); default: fixed lengths with ignore_eos");
  cmd->add_option("--temperature", a->run.temperature, "sampling temperature")->capture_default_str();
  cmd->add_option("--seed", a->run.seed, "seed of every prompt, length and arrival")->capture_default_str();
  cmd->add_option("--api-key", a->run.endpoint.api_key, "sent as Authorization: Bearer KEY")->envname("SPILL_API_KEY");
  cmd->add_option("--model", a->run.endpoint.model, "the model field (default: the first id of /v1/models)");
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json (or a model folder) to count prompt tokens; default: the server's /tokenize");
  cmd->add_option("--max-model-len", a->run.max_model_len, "skip what does not fit this context (default: what /v1/models says)");
  cmd->add_option("--timeout", a->run.endpoint.timeout_s, "seconds one request may take")->capture_default_str();
  cmd->add_option("--out", a->out, "folder for requests.jsonl, result.json, report.md, report.html (default: spill-bench-DATE-TIME)");
  cmd->add_option("--label", a->label, "name of this run in comparisons (default: server kind and model)");
  cmd->add_option("--slo", a->slo, "per-stream tok/s line drawn on the chart")->capture_default_str();
  cmd->add_option("--margin", a->margin, "margin over the SLO drawn on the chart")->capture_default_str();
  cmd->add_flag("--no-warmup", a->no_warmup, "no request that fills the prefix cache before each scenario");
  cmd->add_flag("--no-progress", a->no_progress, "no progress line on stderr");
  cmd->callback([a, cmd] {
    a->argv = {"spill", "bench"};
    for (const auto* opt : cmd->get_options()) {
      if (opt->count() == 0 || opt->get_name() == "--help") continue;
      std::string joined;
      for (const auto& v : opt->results()) joined += (joined.empty() ? "" : ",") + v;
      if (joined.find(' ') != std::string::npos) joined = "'" + joined + "'";
      if (opt->get_name() == "url") a->argv.push_back(joined);
      else if (opt->get_name() == "--api-key") a->argv.push_back("--api-key ...");
      else a->argv.push_back(opt->get_name() + (opt->get_expected_min() == 0 ? "" : " " + joined));
    }
    run(*a);
  });
}

}  // namespace spill::cli
