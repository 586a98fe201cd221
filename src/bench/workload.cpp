#include "bench/workload.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"

namespace spill::bench {

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ULL * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

namespace {

class LocalCounter final : public TokenCounter {
 public:
  LocalCounter(Tokenizer t, std::string origin) : tokenizer_(std::move(t)), origin_(std::move(origin)) {}
  int64_t count(const std::string& text) override { return int64_t(tokenizer_.encode(text, false).size()); }
  std::string describe() const override { return origin_; }

 private:
  Tokenizer tokenizer_;
  std::string origin_;
};

class FunctionCounter final : public TokenCounter {
 public:
  FunctionCounter(std::function<int64_t(const std::string&)> f, std::string origin) : f_(std::move(f)), origin_(std::move(origin)) {}
  int64_t count(const std::string& text) override { return f_(text); }
  std::string describe() const override { return origin_; }

 private:
  std::function<int64_t(const std::string&)> f_;
  std::string origin_;
};

constexpr std::array kNouns = {"cache", "block", "expert", "layer", "token", "request", "stream", "buffer", "router",
                               "weight", "tensor", "queue", "batch", "prefix", "session", "offset", "index", "shard",
                               "plan", "table", "page", "budget", "score", "count", "limit", "window", "state", "node"};
constexpr std::array kVerbs = {"load", "read", "write", "plan", "merge", "split", "route", "check", "build", "parse",
                               "count", "update", "resolve", "place", "evict", "fetch", "scan", "sort", "pack", "apply"};
constexpr std::array kOps = {"+", "-", "*", "//", "%"};

// One top-level Python block (a function or a small class); starts with a letter and ends with a
// blank line, so that consecutive blocks tokenize independently under byte-level pre-tokenizers.
std::string python_block(std::mt19937_64& rng) {
  auto pick = [&](const auto& list) { return std::string(list[rng() % list.size()]); };
  std::string noun = pick(kNouns), other = pick(kNouns), verb = pick(kVerbs);
  int n = int(rng() % 97) + 2;
  std::string out;
  if (rng() % 4 == 0) {
    std::string cls;
    for (const std::string& w : {noun, other}) cls += char(std::toupper((unsigned char)w[0])) + w.substr(1);
    out += fmt::format("class {}{}:\n    \"\"\"Keeps the {} of each {}.\"\"\"\n\n", cls, n, other, noun);
    out += fmt::format("    def __init__(self, {}, {}={}):\n        self.{} = {}\n        self.{} = {}\n\n", noun, other, n, noun,
                       noun, other, other);
    out += fmt::format("    def {}(self, {}):\n        return self.{} {} {} {} self.{}\n\n\n", verb, pick(kNouns), noun,
                       pick(kOps), n, pick(kOps), other);
    return out;
  }
  out += fmt::format("def {}_{}_{}({}, {}):\n", verb, noun, n, noun, other);
  out += fmt::format("    # {} the {} before the {} is read\n", verb, noun, other);
  int lines = int(rng() % 4) + 1;
  for (int i = 0; i < lines; ++i) {
    std::string var = pick(kNouns) + "_" + std::to_string(i);
    out += fmt::format("    {} = {} {} {} {} {}\n", var, noun, pick(kOps), other, pick(kOps), int(rng() % 1000));
    if (rng() % 3 == 0) out += fmt::format("    if {} > {}:\n        {} = {}\n", var, int(rng() % 512), var, other);
  }
  out += fmt::format("    return {}_{}\n\n\n", pick(kNouns), int(rng() % lines));
  return out;
}

// A comment of one-letter words, "# a b c ...": k tokens with byte-level BPE ("#", then " a", " b", ...),
// corrected by counting. A comment keeps the text Python, so code models answer it with code.
std::string letter_tail(int64_t k, uint64_t salt) {
  if (k <= 0) return "";
  std::string out = "#";
  for (int64_t i = 1; i < k; ++i) {
    out += ' ';
    out += char('a' + (uint64_t(i) + salt) % 26);
  }
  return out;
}

}  // namespace

std::unique_ptr<TokenCounter> make_local_counter(Tokenizer tokenizer, std::string origin) {
  return std::make_unique<LocalCounter>(std::move(tokenizer), std::move(origin));
}

std::unique_ptr<TokenCounter> make_function_counter(std::function<int64_t(const std::string&)> count, std::string origin) {
  return std::make_unique<FunctionCounter>(std::move(count), std::move(origin));
}

std::string text_with_tokens(TokenCounter& counter, int64_t tokens, uint64_t seed) {
  if (tokens < 0) fail("bench: a prompt cannot have {} tokens", tokens);
  if (tokens == 0) return "";
  std::mt19937_64 rng(seed);
  std::string text;
  int64_t have = 0;
  // Room for the tail, which absorbs the counting error of the block boundaries.
  const int64_t reserve = std::min<int64_t>(tokens, 16);
  // Whole blocks in batches (one count per batch keeps /tokenize calls few), then one by one.
  size_t batch = 8;
  while (have < tokens - reserve) {
    std::vector<std::string> blocks;
    for (size_t i = 0; i < batch; ++i) blocks.push_back(python_block(rng));
    std::string joined;
    for (const std::string& b : blocks) joined += b;
    int64_t n = counter.count(joined);
    if (have + n <= tokens - reserve) {
      text += joined;
      have += n;
      batch = std::min<size_t>(batch * 2, 512);
      continue;
    }
    bool added_any = false;
    for (const std::string& b : blocks) {
      int64_t nb = counter.count(b);
      if (have + nb > tokens - reserve) break;
      text += b;
      have += nb;
      added_any = true;
    }
    if (!added_any) break;
    batch = 1;
  }
  // Now fix the total exactly with the tail, counting the whole text each time.
  have = counter.count(text);
  int64_t k = tokens - have;
  uint64_t salt = seed % 26;
  for (int attempt = 0; attempt < 12; ++attempt) {
    if (k < 0) {
      // The blocks alone overshot (their boundaries merged differently): drop the last one.
      size_t cut = text.rfind("\n\n\n", text.size() >= 4 ? text.size() - 4 : 0);
      text.resize(cut == std::string::npos ? 0 : cut + 3);
      have = counter.count(text);
      k = tokens - have;
      continue;
    }
    std::string candidate = text + letter_tail(k, salt);
    int64_t got = counter.count(candidate);
    if (got == tokens) return candidate;
    k += tokens - got;
  }
  fail("bench: could not build a text of exactly {} tokens with {} (the tokenizer does not count \"#\" and one-letter "
       "words as one token each); pass another --tokenizer",
       tokens, counter.describe());
}

const char* kind_name(ScenarioKind kind) {
  switch (kind) {
    case ScenarioKind::Agent: return "agent";
    case ScenarioKind::LongContext: return "long-context";
    case ScenarioKind::PrefixCache: return "prefix-cache";
    case ScenarioKind::PpTg: return "pp-tg";
  }
  return "?";
}

int64_t Scenario::worst_case_tokens() const {
  // Chat templates add a few tokens per message; 16 per message bounds every template spill knows.
  constexpr int64_t kTemplatePerMessage = 16;
  switch (kind) {
    case ScenarioKind::Agent:
      return context_tokens + int64_t(turns) * (user_max_tokens + std::max(short_output, long_output) + 2 * kTemplatePerMessage) +
             kTemplatePerMessage;
    case ScenarioKind::LongContext:
      return (lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end())) + output_tokens + kTemplatePerMessage;
    case ScenarioKind::PrefixCache: return prefix_tokens + suffix_tokens + output_tokens + 2 * kTemplatePerMessage;
    case ScenarioKind::PpTg:
      // The tg prompt is 128 tokens of code (runner.cpp).
      return (depths.empty() ? 0 : *std::max_element(depths.begin(), depths.end())) + std::max(pp_tokens, 128 + tg_tokens) +
             2 * kTemplatePerMessage;
  }
  return 0;
}

namespace {

Scenario agent(const std::string& name, int64_t context, int turns, const std::string& what) {
  Scenario s;
  s.name = name;
  s.kind = ScenarioKind::Agent;
  s.context_tokens = context;
  s.turns = turns;
  s.description = what;
  return s;
}

std::vector<Scenario> make_named() {
  std::vector<Scenario> all;
  all.push_back(agent("agent-4k", 4096, 6, "short sessions: 4K-token project context, 6 turns"));
  all.push_back(agent("agent-16k", 16384, 6, "16K-token project context, 6 turns"));
  all.push_back(agent("agent-32k", 32768, 6, "32K-token project context, 6 turns"));
  all.push_back(agent("agent-64k", 65536, 5, "64K-token project context, 5 turns"));
  all.push_back(agent("agent-128k", 131072, 4, "128K-token project context, 4 turns"));
  all.push_back(agent("agent-256k", 253952, 3, "248K-token project context (256K with history), 3 turns"));
  {
    Scenario s;
    s.name = "long-context";
    s.kind = ScenarioKind::LongContext;
    s.description = "TTFT against prompt length and TPOT against context depth, uncached prompts";
    s.lengths = {4096, 16384, 32768, 65536, 131072, 262144 - 256};
    s.output_tokens = 128;
    all.push_back(s);
  }
  {
    Scenario s;
    s.name = "prefix-cache";
    s.kind = ScenarioKind::PrefixCache;
    s.description = "4 users on one cached 256K-token prefix, each with its own 256-token question";
    s.prefix_tokens = 262144 - 1024;
    s.users = 4;
    s.rounds = 2;
    s.suffix_tokens = 256;
    s.output_tokens = 128;
    all.push_back(s);
  }
  {
    Scenario s;
    s.name = "pp-tg";
    s.kind = ScenarioKind::PpTg;
    s.description = "single stream, llama-bench style: pp512 and tg128 at depth 0 and 4096";
    s.depths = {0, 4096};
    all.push_back(s);
  }
  // The same shapes for a 2K-context model on a CPU: small enough for CI.
  {
    Scenario s = agent("tiny-agent", 256, 3, "tiny: 256-token project context, 3 turns, replies of 8 or 32 tokens");
    s.user_min_tokens = 16;
    s.user_max_tokens = 64;
    s.short_output = 8;
    s.long_output = 32;
    s.concurrency = {1, 2, 4};
    all.push_back(s);
  }
  {
    Scenario s;
    s.name = "tiny-long-context";
    s.kind = ScenarioKind::LongContext;
    s.description = "tiny: TTFT and TPOT at 128 ... 1536 prompt tokens";
    s.lengths = {128, 512, 1024, 1536};
    s.output_tokens = 16;
    all.push_back(s);
  }
  {
    Scenario s;
    s.name = "tiny-prefix-cache";
    s.kind = ScenarioKind::PrefixCache;
    s.description = "tiny: 3 users on one cached 1024-token prefix";
    s.prefix_tokens = 1024;
    s.users = 3;
    s.rounds = 2;
    s.suffix_tokens = 32;
    s.output_tokens = 16;
    all.push_back(s);
  }
  {
    Scenario s;
    s.name = "tiny-pp-tg";
    s.kind = ScenarioKind::PpTg;
    s.description = "tiny: pp128 and tg32 at depth 0 and 512";
    s.pp_tokens = 128;
    s.tg_tokens = 32;
    s.depths = {0, 512};
    s.repetitions = 2;
    all.push_back(s);
  }
  return all;
}

}  // namespace

const std::vector<Scenario>& named_scenarios() {
  static const std::vector<Scenario> all = make_named();
  return all;
}

std::vector<Scenario> select_scenarios(const std::string& names) {
  std::vector<std::string> wanted;
  size_t pos = 0;
  while (pos <= names.size()) {
    size_t comma = names.find(',', pos);
    if (comma == std::string::npos) comma = names.size();
    std::string n = names.substr(pos, comma - pos);
    pos = comma + 1;
    if (n.empty()) continue;
    const auto& all = named_scenarios();
    auto is_tiny = [](const Scenario& s) { return s.name.rfind("tiny-", 0) == 0; };
    if (n == "all" || n == "agents" || n == "tiny") {
      for (const Scenario& s : all) {
        bool take = n == "tiny" ? is_tiny(s) : !is_tiny(s) && (n == "all" || s.kind == ScenarioKind::Agent);
        if (take) wanted.push_back(s.name);
      }
      continue;
    }
    if (std::none_of(all.begin(), all.end(), [&](const Scenario& s) { return s.name == n; })) {
      std::string known;
      for (const Scenario& s : all) known += (known.empty() ? "" : ", ") + s.name;
      fail("bench: unknown scenario '{}'; known: {} (and the groups all, agents, tiny)", n, known);
    }
    wanted.push_back(n);
  }
  if (wanted.empty()) fail("bench: --scenario is empty; name one of the scenarios or a group (all, agents, tiny)");
  std::vector<Scenario> out;
  for (const std::string& n : wanted) {
    if (std::any_of(out.begin(), out.end(), [&](const Scenario& s) { return s.name == n; })) continue;
    for (const Scenario& s : named_scenarios())
      if (s.name == n) out.push_back(s);
  }
  return out;
}

std::vector<TurnPlan> plan_session(const Scenario& scenario, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<TurnPlan> turns;
  for (int t = 0; t < scenario.turns; ++t) {
    TurnPlan p;
    int64_t span = scenario.user_max_tokens - scenario.user_min_tokens;
    p.user_tokens = scenario.user_min_tokens + (span > 0 ? int64_t(rng() % uint64_t(span + 1)) : 0);
    bool long_reply = std::uniform_real_distribution<double>(0, 1)(rng) < scenario.long_fraction;
    p.max_tokens = long_reply ? scenario.long_output : scenario.short_output;
    p.text_seed = rng();
    turns.push_back(p);
  }
  return turns;
}

}  // namespace spill::bench
