#include "bench/runner.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <thread>

#include "bench/prometheus.h"
#include "core/error.h"

namespace spill::bench {

namespace {

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// What the progress line shows; workers update it, a printer thread reads it.
struct Progress {
  std::mutex mutex;
  std::string label;
  std::atomic<int64_t> planned{0}, done{0}, failed{0}, running{0}, output_tokens{0};
  std::vector<double> tok_s;  // per-stream decode speeds of this group so far
  Clock::time_point group_start = Clock::now();

  void start(std::string l, int64_t n) {
    std::lock_guard lock(mutex);
    label = std::move(l);
    planned = n;
    done = 0;
    failed = 0;
    running = 0;
    output_tokens = 0;
    tok_s.clear();
    group_start = Clock::now();
  }
  std::string line() {
    std::lock_guard lock(mutex);
    if (label.empty()) return "";
    double elapsed = std::chrono::duration<double>(Clock::now() - group_start).count();
    std::string speed = "-";
    if (!tok_s.empty()) speed = fmt::format("{:.1f}", percentile(tok_s, 50));
    return fmt::format("[{}] {}/{} requests, {} running, {} failed, {} tokens out, median {} tok/s/stream, {:.0f} s", label,
                       done.load(), planned.load(), running.load(), failed.load(), output_tokens.load(), speed, elapsed);
  }
};

class Runner {
 public:
  Runner(const RunOptions& options, TokenCounter& counter, BenchResult& result)
      : options_(options), counter_(counter), result_(result), run_start_(Clock::now()) {}

  void run(const std::vector<Scenario>& scenarios, int64_t max_len) {
    std::atomic<bool> stop_printer{false};
    std::thread printer;
    bool tty = isatty(2);
    if (options_.progress) {
      printer = std::thread([&] {
        auto last_plain = Clock::now();
        while (!stop_printer) {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          std::string line = progress_.line();
          if (line.empty()) continue;
          if (tty) {
            std::fprintf(stderr, "\r\033[K%s", line.c_str());
          } else if (Clock::now() - last_plain > std::chrono::seconds(10)) {
            std::fprintf(stderr, "%s\n", line.c_str());
            last_plain = Clock::now();
          }
          std::fflush(stderr);
        }
      });
    }
    try {
      for (const Scenario& s : scenarios) run_scenario(s, max_len);
    } catch (...) {
      stop_printer = true;
      if (printer.joinable()) printer.join();
      throw;
    }
    stop_printer = true;
    if (printer.joinable()) printer.join();
  }

 private:
  const RunOptions& options_;
  TokenCounter& counter_;
  BenchResult& result_;
  Clock::time_point run_start_;
  std::mutex records_mutex_;
  Progress progress_;

  std::string text(int64_t tokens, uint64_t seed) { return text_with_tokens(counter_, tokens, seed); }

  // The group's last progress line stays on screen.
  void finish_group() {
    if (!options_.progress) return;
    std::fprintf(stderr, "%s%s\n", isatty(2) ? "\r\033[K" : "", progress_.line().c_str());
  }

  // Sends one request and records it. Thread-safe.
  std::string send(ApiClient& client, RequestRecord rec, const ChatRequest& req) {
    std::string reply;
    ++progress_.running;
    client.chat_stream(req, run_start_, rec, &reply);
    --progress_.running;
    {
      std::lock_guard lock(progress_.mutex);
      if (rec.phase != "warmup" && rec.tpot_s() > 0) progress_.tok_s.push_back(1.0 / rec.tpot_s());
    }
    ++progress_.done;
    if (!rec.ok()) ++progress_.failed;
    progress_.output_tokens += rec.output_tokens;
    if (!rec.ok() && options_.progress)
      std::fprintf(stderr, "%sbench: %s %s request failed: %s\n", isatty(2) ? "\r\033[K" : "", rec.scenario.c_str(),
                   rec.group.c_str(), rec.error.c_str());
    std::lock_guard lock(records_mutex_);
    result_.records.push_back(std::move(rec));
    return reply;
  }

  ChatRequest request(std::vector<ChatMessage> messages, int64_t max_tokens, uint64_t seed) const {
    return ChatRequest{.messages = std::move(messages),
                       .max_tokens = max_tokens,
                       .ignore_eos = options_.ignore_eos,
                       .temperature = options_.temperature,
                       .seed = seed};
  }

  RequestRecord record(const Scenario& s, const std::string& phase, const std::string& group, double x, int concurrency) const {
    RequestRecord r;
    r.scenario = s.name;
    r.phase = phase;
    r.group = group;
    r.group_x = x;
    r.concurrency = concurrency;
    return r;
  }

  void warm(ApiClient& client, const Scenario& s, std::vector<ChatMessage> messages, int64_t content_tokens) {
    if (!options_.warmup) return;
    progress_.start(s.name + " warmup", 1);
    RequestRecord rec = record(s, "warmup", "warmup", 0, 1);
    rec.content_tokens = content_tokens;
    send(client, std::move(rec), request(std::move(messages), 1, options_.seed));
  }

  void run_scenario(const Scenario& s, int64_t max_len) {
    ScenarioResult sr;
    sr.scenario = s;
    if (max_len > 0) {
      if (s.kind == ScenarioKind::LongContext) {
        std::vector<int64_t> fit;
        for (int64_t l : sr.scenario.lengths)
          if (l + s.output_tokens + 16 <= max_len) fit.push_back(l);
          else sr.notes.push_back(fmt::format("prompt length {} left out: it does not fit the context of {} tokens", l, max_len));
        sr.scenario.lengths = fit;
        if (fit.empty()) sr.skipped = fmt::format("no prompt length fits the server's context of {} tokens", max_len);
      } else if (s.kind == ScenarioKind::PpTg) {
        std::vector<int64_t> fit;
        for (int64_t d : sr.scenario.depths)
          if (d + std::max(s.pp_tokens, kTgPromptTokens + s.tg_tokens) + 48 <= max_len) fit.push_back(d);
          else sr.notes.push_back(fmt::format("depth {} left out: it does not fit the context of {} tokens", d, max_len));
        sr.scenario.depths = fit;
        if (fit.empty()) sr.skipped = fmt::format("no depth fits the server's context of {} tokens", max_len);
      } else if (s.worst_case_tokens() > max_len) {
        sr.skipped = fmt::format("a request may need {} tokens and the server's context is {}", s.worst_case_tokens(), max_len);
      }
    }
    if (!sr.skipped.empty()) {
      if (options_.progress) std::fprintf(stderr, "bench: %s skipped: %s\n", s.name.c_str(), sr.skipped.c_str());
      result_.scenarios.push_back(std::move(sr));
      return;
    }
    switch (s.kind) {
      case ScenarioKind::Agent: run_agent(sr.scenario); break;
      case ScenarioKind::LongContext: run_long_context(sr.scenario); break;
      case ScenarioKind::PrefixCache: run_prefix_cache(sr.scenario); break;
      case ScenarioKind::PpTg: run_pp_tg(sr.scenario); break;
    }
    result_.scenarios.push_back(std::move(sr));
  }

  void run_agent(const Scenario& s) {
    uint64_t base = mix_seed(options_.seed, hash_name(s.name));
    std::string context = text(s.context_tokens, mix_seed(base, 0));
    {
      ApiClient client(options_.endpoint);
      warm(client, s, {{"system", context}, {"user", text(16, mix_seed(base, 1))}}, s.context_tokens + 16);
    }
    for (int c : s.concurrency) {
      if (c < 1) fail("bench: --concurrency values must be >= 1, got {}", c);
      // Plans and texts first, so the timed part only talks to the server.
      struct Session {
        std::vector<TurnPlan> plan;
        std::vector<std::string> user_texts;
        double arrival_s = 0;
        std::vector<double> think_s;
      };
      int n_sessions = c * s.sessions_per_agent;
      std::vector<Session> sessions(static_cast<size_t>(n_sessions), Session{});
      std::mt19937_64 arrivals(mix_seed(base, 1000 + uint64_t(c)));
      double t = 0;
      for (int i = 0; i < n_sessions; ++i) {
        Session& se = sessions[size_t(i)];
        uint64_t seed = mix_seed(base, uint64_t(c) * 1'000'003 + uint64_t(i));
        se.plan = plan_session(s, seed);
        std::mt19937_64 think(mix_seed(seed, 7));
        for (const TurnPlan& p : se.plan) {
          se.user_texts.push_back(text(p.user_tokens, p.text_seed));
          se.think_s.push_back(s.think_time_s > 0 ? std::exponential_distribution<double>(1.0 / s.think_time_s)(think) : 0.0);
        }
        if (s.session_rate > 0) {
          se.arrival_s = t;
          t += std::exponential_distribution<double>(s.session_rate)(arrivals);
        }
      }
      std::string group = fmt::format("c={}", c);
      progress_.start(fmt::format("{} {}", s.name, group), int64_t(n_sessions) * s.turns);
      std::atomic<int> next{0};
      Clock::time_point level_start = Clock::now();
      auto worker = [&] {
        ApiClient client(options_.endpoint);
        for (int i = next++; i < n_sessions; i = next++) {
          Session& se = sessions[size_t(i)];
          std::this_thread::sleep_until(level_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(se.arrival_s)));
          std::vector<ChatMessage> messages = {{"system", context}};
          for (size_t turn = 0; turn < se.plan.size(); ++turn) {
            messages.push_back({"user", se.user_texts[turn]});
            RequestRecord rec = record(s, "agent", group, c, c);
            rec.session = i;
            rec.turn = int(turn);
            rec.content_tokens = s.context_tokens;
            for (size_t k = 1; k < messages.size(); k += 2) rec.content_tokens += se.plan[k / 2].user_tokens;
            std::string reply = send(client, std::move(rec), request(messages, se.plan[turn].max_tokens, se.plan[turn].text_seed));
            messages.push_back({"assistant", reply});
            if (se.think_s[turn] > 0) std::this_thread::sleep_for(std::chrono::duration<double>(se.think_s[turn]));
          }
        }
      };
      std::vector<std::thread> threads;
      for (int a = 0; a < c; ++a) threads.emplace_back(worker);
      for (std::thread& th : threads) th.join();
      finish_group();
    }
  }

  void run_long_context(const Scenario& s) {
    uint64_t base = mix_seed(options_.seed, hash_name(s.name));
    ApiClient client(options_.endpoint);
    for (int64_t len : s.lengths) {
      std::vector<std::string> prompts;
      for (int r = 0; r < s.repeats; ++r) prompts.push_back(text(len, mix_seed(base, uint64_t(len) * 131 + uint64_t(r))));
      std::string group = fmt::format("len={}", len);
      progress_.start(s.name + " " + group, s.repeats);
      for (int r = 0; r < s.repeats; ++r) {
        RequestRecord rec = record(s, "long-context", group, double(len), 1);
        rec.turn = r;
        rec.content_tokens = len;
        send(client, std::move(rec), request({{"user", prompts[size_t(r)]}}, s.output_tokens, base + uint64_t(r)));
      }
      finish_group();
    }
  }

  void run_prefix_cache(const Scenario& s) {
    uint64_t base = mix_seed(options_.seed, hash_name(s.name));
    std::string prefix = text(s.prefix_tokens, mix_seed(base, 0));
    {
      ApiClient client(options_.endpoint);
      warm(client, s, {{"system", prefix}, {"user", text(s.suffix_tokens, mix_seed(base, 1))}}, s.prefix_tokens + s.suffix_tokens);
    }
    std::vector<std::vector<std::string>> suffixes(size_t(s.users));
    for (int u = 0; u < s.users; ++u)
      for (int r = 0; r < s.rounds; ++r) suffixes[size_t(u)].push_back(text(s.suffix_tokens, mix_seed(base, 100 + uint64_t(u) * 997 + uint64_t(r))));
    std::string group = fmt::format("users={}", s.users);
    progress_.start(s.name + " " + group, int64_t(s.users) * s.rounds);
    for (int r = 0; r < s.rounds; ++r) {
      std::vector<std::thread> threads;
      for (int u = 0; u < s.users; ++u) {
        threads.emplace_back([&, u] {
          ApiClient client(options_.endpoint);
          RequestRecord rec = record(s, "prefix-cache", group, s.users, s.users);
          rec.session = u;
          rec.turn = r;
          rec.content_tokens = s.prefix_tokens + s.suffix_tokens;
          send(client, std::move(rec), request({{"system", prefix}, {"user", suffixes[size_t(u)][size_t(r)]}}, s.output_tokens, base + uint64_t(u)));
        });
      }
      for (std::thread& th : threads) th.join();
    }
    finish_group();
  }

  static constexpr int64_t kTgPromptTokens = 128;

  void run_pp_tg(const Scenario& s) {
    uint64_t base = mix_seed(options_.seed, hash_name(s.name));
    ApiClient client(options_.endpoint);
    for (int64_t depth : s.depths) {
      std::string context = depth > 0 ? text(depth, mix_seed(base, uint64_t(depth))) : "";
      auto messages_with = [&](std::string user) {
        std::vector<ChatMessage> m;
        if (depth > 0) m.push_back({"system", context});
        m.push_back({"user", std::move(user)});
        return m;
      };
      if (depth > 0) warm(client, s, messages_with(text(16, mix_seed(base, 5))), depth + 16);
      std::vector<std::string> pp_texts, tg_texts;
      for (int r = 0; r < s.repetitions; ++r) {
        pp_texts.push_back(text(s.pp_tokens, mix_seed(base, uint64_t(depth) * 7919 + uint64_t(r))));
        // A prompt of code (not a few words) so that a code model answers with code and streams it
        // token by token; a reply the server holds back (a tool call) would hide the decode speed.
        tg_texts.push_back(text(kTgPromptTokens, mix_seed(base, uint64_t(depth) * 7919 + 500 + uint64_t(r))));
      }
      std::string pp_group = fmt::format("pp{}@d{}", s.pp_tokens, depth);
      progress_.start(s.name + " " + pp_group, s.repetitions);
      for (int r = 0; r < s.repetitions; ++r) {
        RequestRecord rec = record(s, "pp", pp_group, double(depth), 1);
        rec.turn = r;
        rec.content_tokens = depth + s.pp_tokens;
        send(client, std::move(rec), request(messages_with(pp_texts[size_t(r)]), 1, base + uint64_t(r)));
      }
      finish_group();
      std::string tg_group = fmt::format("tg{}@d{}", s.tg_tokens, depth);
      progress_.start(s.name + " " + tg_group, s.repetitions);
      for (int r = 0; r < s.repetitions; ++r) {
        RequestRecord rec = record(s, "tg", tg_group, double(depth), 1);
        rec.turn = r;
        rec.content_tokens = depth + kTgPromptTokens;
        send(client, std::move(rec), request(messages_with(tg_texts[size_t(r)]), s.tg_tokens, base + uint64_t(r)));
      }
      finish_group();
    }
  }
};

// Waits (up to 10 s) until the server reports nothing running or waiting, so that its counters
// include every request the client saw finish.
std::optional<std::string> settled_metrics(ApiClient& client) {
  auto deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    auto text = client.metrics_text();
    if (!text) return text;
    MetricSamples m = parse_prometheus(*text);
    ServerCounters c = counters_of(m);
    if (c.prefix.empty()) return text;
    double busy = metric_sum(m, c.prefix + "num_requests_running").value_or(0) + metric_sum(m, c.prefix + "num_requests_waiting").value_or(0);
    if (busy == 0 || Clock::now() > deadline) return text;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

BenchResult run_bench(const std::vector<Scenario>& scenarios, const RunOptions& options, TokenCounter& counter,
                      const ServerInfo& server) {
  BenchResult result;
  result.server = server;
  result.url = options.endpoint.url;
  result.tokenizer = counter.describe();
  result.options = options;
  result.started_utc = utc_now();
  ApiClient control(options.endpoint);
  result.metrics_before = settled_metrics(control);
  int64_t max_len = options.max_model_len > 0 ? options.max_model_len : server.max_model_len;
  auto start = Clock::now();
  Runner runner(options, counter, result);
  runner.run(scenarios, max_len);
  result.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  result.metrics_after = settled_metrics(control);
  return result;
}

}  // namespace spill::bench
