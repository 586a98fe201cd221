// The workloads spill bench sends: named scenarios (agent turns over a shared project context,
// long prompts, a cached prefix shared by several users, llama-bench-style pp/tg), and the text
// they are made of, built to an exact token count with a real tokenizer. Everything is derived
// from one seed, so two runs with the same seed send the same prompts.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace spill::bench {

// Counts tokens of text the way the served model does (no special tokens added).
class TokenCounter {
 public:
  virtual ~TokenCounter() = default;
  virtual int64_t count(const std::string& text) = 0;
  virtual std::string describe() const = 0;
};
std::unique_ptr<TokenCounter> make_local_counter(Tokenizer tokenizer, std::string origin);
// Any callable counter (the server's /tokenize through an ApiClient, say).
std::unique_ptr<TokenCounter> make_function_counter(std::function<int64_t(const std::string&)> count, std::string origin);

// Python-like source text (functions and classes with seeded names and bodies), cut to exactly
// `tokens` tokens: whole top-level blocks while they fit, then a tail of one-letter words whose
// length is corrected against the counter until the whole text counts exactly. Throws
// spill::Error if the tokenizer cannot be brought to the exact count.
std::string text_with_tokens(TokenCounter& counter, int64_t tokens, uint64_t seed);

enum class ScenarioKind { Agent, LongContext, PrefixCache, PpTg };
const char* kind_name(ScenarioKind kind);

struct Scenario {
  std::string name;
  std::string description;
  ScenarioKind kind = ScenarioKind::Agent;

  // Agent turns: each session is a conversation over the shared project context (system
  // message); every turn adds a user message (a tool result or instruction) and the model's reply.
  int64_t context_tokens = 4096;
  int turns = 6;
  int sessions_per_agent = 1;
  int64_t user_min_tokens = 128, user_max_tokens = 1024;
  int64_t short_output = 64;   // a tool-call-like reply
  int64_t long_output = 512;   // a code-writing reply
  double long_fraction = 0.3;  // share of turns with the long reply
  double think_time_s = 0;     // mean pause between an agent's turns (exponential); 0: none
  double session_rate = 0;     // sessions per second, Poisson arrivals; 0: closed loop
  std::vector<int> concurrency = {1, 2, 3, 4, 6, 8};

  // Long context: one request per length (times `repeats`), distinct text so nothing is cached.
  std::vector<int64_t> lengths;
  int64_t output_tokens = 128;
  int repeats = 1;

  // Prefix cache: `users` at once send the cached prefix plus their own suffix, `rounds` times.
  int64_t prefix_tokens = 0;
  int users = 4;
  int rounds = 2;
  int64_t suffix_tokens = 256;

  // pp/tg: prefill of pp tokens after `depth` cached tokens, and generation of tg tokens.
  int64_t pp_tokens = 512, tg_tokens = 128;
  std::vector<int64_t> depths = {0};
  int repetitions = 3;

  // The longest prompt + output one request of this scenario may need (for --max-model-len checks).
  int64_t worst_case_tokens() const;
};

// The named scenarios, in report order. `all`: the six agent scenarios (4K ... 256K contexts)
// plus long-context, prefix-cache and pp-tg; `tiny`: the same shapes sized for a 2K-context
// model (the bundled spill-tiny), for CI and laptops.
const std::vector<Scenario>& named_scenarios();
// Expands a comma-separated list of names and aliases (all, tiny, agents); throws spill::Error
// naming an unknown one and listing the known ones.
std::vector<Scenario> select_scenarios(const std::string& names);

// The plan of one agent session: per turn the user message's tokens and the reply's max_tokens.
struct TurnPlan {
  int64_t user_tokens = 0;
  int64_t max_tokens = 0;
  uint64_t text_seed = 0;
};
std::vector<TurnPlan> plan_session(const Scenario& scenario, uint64_t seed);

// A stable 64-bit mix of values (splitmix64), for per-session, per-turn seeds.
uint64_t mix_seed(uint64_t a, uint64_t b);

}  // namespace spill::bench
