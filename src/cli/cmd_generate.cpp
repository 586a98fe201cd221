// spill generate: complete a prompt on the CPU backend and stream the text to stdout.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "cli/commands.h"
#include "core/error.h"
#include "core/json_limits.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "model/runner.h"
#include "text/tokenizer.h"

namespace spill::cli {

namespace {

struct GenerateArgs {
  std::string model, prompt;
  int max_tokens = 128;
  int threads = 0;
  bool ignore_eos = false;
  bool quiet = false;
  SamplingParams sampling;
  bool temperature_given = false;
};

// Sampling defaults from the model's generation_config.json, as transformers applies them;
// flags given on the command line win.
void apply_generation_config(const std::string& dir, GenerateArgs& a) {
  const auto path = std::filesystem::path(dir) / "generation_config.json";
  if (!std::filesystem::exists(path)) return;
  std::ifstream in(path, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const nlohmann::json g = parse_json<nlohmann::json>(text, path.string());
  if (!g.is_object() || a.temperature_given) return;
  // Range-checked before narrowing (1e39 to float, 1e10 to int32_t): the sampler's own checks then
  // name what is wrong.
  auto number = [&](const char* key, double max) -> std::optional<double> {
    if (!g.contains(key) || !g[key].is_number()) return std::nullopt;
    const double x = g[key].get<double>();
    if (!(std::abs(x) <= max)) fail("{}: '{}' is {}, out of range (at most {})", path.string(), key, x, max);
    return x;
  };
  if (g.value("do_sample", false)) {
    if (auto t = number("temperature", 1e6)) a.sampling.temperature = float(*t);
    if (auto p = number("top_p", 1e6)) a.sampling.top_p = float(*p);
    if (g.contains("top_k") && g["top_k"].is_number_integer())
      if (auto k = number("top_k", double(INT32_MAX))) a.sampling.top_k = int32_t(*k);
  } else {
    a.sampling.temperature = 0;
  }
}

void run_generate(GenerateArgs a) {
  using clock = std::chrono::steady_clock;
  const std::string dir = a.model.empty() ? default_model_dir() : a.model;
  apply_generation_config(dir, a);
  a.sampling.validate();
  if (a.max_tokens < 0) fail("-n must be >= 0, got {}", a.max_tokens);
  auto model = Model::load(dir);
  const ModelSpec& spec = model->spec();
  const std::string tok_path = (std::filesystem::path(dir) / "tokenizer.json").string();
  if (!std::filesystem::exists(tok_path)) fail("{}: no tokenizer.json; spill generate needs one (use `spill logits` for ids)", dir);
  Tokenizer tokenizer = Tokenizer::from_file(tok_path);
  std::vector<int32_t> prompt = tokenizer.encode(a.prompt, /*add_special=*/true);
  if (prompt.empty()) fail("the prompt encodes to no tokens; give some text with --prompt");
  const int64_t total = int64_t(prompt.size()) + a.max_tokens;
  if (total > spec.max_position_embeddings)
    fail("prompt ({} tokens) + -n {} exceeds the model's context of {} tokens", prompt.size(), a.max_tokens,
         spec.max_position_embeddings);

  const int32_t block_size = 16;
  KvCacheConfig kv{.block_size = block_size, .n_blocks = (total + block_size - 1) / block_size};
  auto runner = make_cpu_runner(*model, kv, a.threads);
  std::vector<int32_t> table(static_cast<size_t>(kv.n_blocks));
  std::iota(table.begin(), table.end(), 0);

  SequenceSampler sampler(a.sampling, prompt, uint64_t(clock::now().time_since_epoch().count()));
  SamplerWorkspace workspace;
  StreamDecoder stream(tokenizer);
  ForwardBatch batch;
  batch.tokens = prompt;
  batch.seqs.push_back({.first_token = 0, .n_tokens = int32_t(prompt.size()), .start_pos = 0, .block_table = table,
                        .want_logits = true});
  std::vector<float> logits;

  const auto t0 = clock::now();
  auto t_first = t0;
  int generated = 0;
  int32_t pos = int32_t(prompt.size());
  std::fputs(a.prompt.c_str(), stdout);
  for (; generated < a.max_tokens; ++generated) {
    runner->forward(batch, logits);
    if (generated == 0) t_first = clock::now();
    const int32_t next = sampler.sample(logits, workspace).token;
    const bool eos = std::find(spec.eos_token_ids.begin(), spec.eos_token_ids.end(), next) != spec.eos_token_ids.end();
    if (eos && !a.ignore_eos) break;
    std::fputs(stream.push(next).c_str(), stdout);
    std::fflush(stdout);
    batch.tokens = {next};
    batch.seqs[0].n_tokens = 1;
    batch.seqs[0].start_pos = pos++;
  }
  std::fputs(stream.finish().c_str(), stdout);
  std::fputs("\n", stdout);
  const auto t_end = clock::now();
  if (!a.quiet) {
    const double prefill_s = std::chrono::duration<double>(t_first - t0).count();
    const double decode_s = std::chrono::duration<double>(t_end - t_first).count();
    fmt::print(stderr, "\n[spill] prompt {} tokens in {:.3f} s ({:.1f} tok/s); generated {} tokens, decode {:.1f} tok/s\n",
               prompt.size(), prefill_s, prompt.size() / std::max(prefill_s, 1e-9), generated,
               generated > 1 ? (generated - 1) / std::max(decode_s, 1e-9) : 0.0);
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Complete a prompt and stream the text to stdout (CPU backend)");
  auto a = std::make_shared<GenerateArgs>();
  cmd->add_option("--model", a->model, "Hugging Face model folder (default: the bundled spill-tiny)");
  cmd->add_option("--prompt,-p", a->prompt, "prompt text")->required();
  cmd->add_option("-n,--max-tokens", a->max_tokens, "tokens to generate")->capture_default_str();
  auto* temp = cmd->add_option("--temperature,-t", a->sampling.temperature,
                               "0 = greedy (default: the model's generation_config.json, else 1)");
  cmd->add_option("--top-k", a->sampling.top_k, "keep the k most likely tokens (0 = off)");
  cmd->add_option("--top-p", a->sampling.top_p, "nucleus sampling threshold (1 = off)");
  cmd->add_option("--min-p", a->sampling.min_p, "drop tokens below min_p x the top probability (0 = off)");
  cmd->add_option("--repetition-penalty", a->sampling.repetition_penalty, "1 = off");
  cmd->add_option("--presence-penalty", a->sampling.presence_penalty, "0 = off");
  cmd->add_option("--frequency-penalty", a->sampling.frequency_penalty, "0 = off");
  cmd->add_option("--seed", a->sampling.seed, "random seed: the same seed gives the same text");
  cmd->add_option("--threads", a->threads, "CPU threads (default: all)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--quiet,-q", a->quiet, "no timing line on stderr");
  cmd->callback([a, temp] {
    GenerateArgs args = *a;
    args.temperature_given = temp->count() > 0;
    run_generate(args);
  });
}

}  // namespace spill::cli
