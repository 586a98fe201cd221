// spill generate: complete a prompt on the CPU backend and stream the text to stdout.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "cli/commands.h"
#include "core/error.h"
#include "engine/generation_config.h"
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
  SamplingParams sampling;  // the model's defaults with the flags given on top
};

// The sampling flags as given; each one set overrides the model's generation_config.json.
struct SamplingFlags {
  SamplingParams values;
  std::vector<std::pair<CLI::Option*, void (*)(SamplingParams&, const SamplingParams&)>> options;
  void apply(SamplingParams& to) const {
    for (const auto& [option, copy] : options)
      if (option->count() > 0) copy(to, values);
  }
};

void run_generate(GenerateArgs a) {
  using clock = std::chrono::steady_clock;
  const std::string dir = a.model.empty() ? default_model_dir() : a.model;
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
  auto flags = std::make_shared<SamplingFlags>();
  SamplingParams& v = flags->values;
  auto flag = [&](CLI::Option* option, void (*copy)(SamplingParams&, const SamplingParams&)) {
    flags->options.emplace_back(option, copy);
  };
  flag(cmd->add_option("--temperature,-t", v.temperature, "0 = greedy (default: the model's generation_config.json, else 1)"),
       [](SamplingParams& to, const SamplingParams& from) { to.temperature = from.temperature; });
  flag(cmd->add_option("--top-k", v.top_k, "keep the k most likely tokens (0 = off)"),
       [](SamplingParams& to, const SamplingParams& from) { to.top_k = from.top_k; });
  flag(cmd->add_option("--top-p", v.top_p, "nucleus sampling threshold (1 = off)"),
       [](SamplingParams& to, const SamplingParams& from) { to.top_p = from.top_p; });
  flag(cmd->add_option("--min-p", v.min_p, "drop tokens below min_p x the top probability (0 = off)"),
       [](SamplingParams& to, const SamplingParams& from) { to.min_p = from.min_p; });
  flag(cmd->add_option("--repetition-penalty", v.repetition_penalty, "1 = off"),
       [](SamplingParams& to, const SamplingParams& from) { to.repetition_penalty = from.repetition_penalty; });
  flag(cmd->add_option("--presence-penalty", v.presence_penalty, "0 = off"),
       [](SamplingParams& to, const SamplingParams& from) { to.presence_penalty = from.presence_penalty; });
  flag(cmd->add_option("--frequency-penalty", v.frequency_penalty, "0 = off"),
       [](SamplingParams& to, const SamplingParams& from) { to.frequency_penalty = from.frequency_penalty; });
  flag(cmd->add_option("--seed", v.seed, "random seed: the same seed gives the same text"),
       [](SamplingParams& to, const SamplingParams& from) { to.seed = from.seed; });
  cmd->add_option("--threads", a->threads, "CPU threads (default: all)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--quiet,-q", a->quiet, "no timing line on stderr");
  cmd->callback([a, flags] {
    GenerateArgs args = *a;
    args.sampling = load_sampling_defaults(args.model.empty() ? default_model_dir() : args.model);
    flags->apply(args.sampling);
    run_generate(args);
  });
}

}  // namespace spill::cli
