// spill generate: complete a prompt on the CPU backend and stream the text to stdout.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "engine/model_bundle.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "model/runner.h"
#include "text/tokenizer.h"

namespace spill::cli {

namespace {

struct GenerateArgs {
  ModelFlags model;
  std::string prompt;
  std::string prompt_ids;  // "1,2,3": token ids instead of text (no tokenizer needed)
  bool print_ids = false;  // print generated ids instead of text
  int max_tokens = 128;
  int threads = 0;
  bool ignore_eos = false;
  bool quiet = false;
  SamplingParams sampling;
  bool temperature_given = false;
};

// Sampling defaults the model ships with (generation_config.json, or a GGUF's general.sampling.*),
// as transformers applies them; flags given on the command line win.
void apply_sampling_defaults(const SamplingDefaults& d, GenerateArgs& a) {
  if (a.temperature_given) return;
  if (d.greedy) {
    a.sampling.temperature = 0;
    return;
  }
  if (d.temperature) a.sampling.temperature = *d.temperature;
  if (d.top_p) a.sampling.top_p = *d.top_p;
  if (d.top_k) a.sampling.top_k = *d.top_k;
}

void run_generate(GenerateArgs a) {
  using clock = std::chrono::steady_clock;
  const std::string dir = a.model.dir();
  if (a.max_tokens < 0) fail("-n must be >= 0, got {}", a.max_tokens);
  if (a.prompt.empty() == a.prompt_ids.empty()) fail("give the prompt once: --prompt TEXT or --prompt-ids 1,2,3");
  // Ids in and out need no tokenizer: the way other engines' tools are driven for comparisons.
  const bool ids_only = a.print_ids && !a.prompt_ids.empty();
  ModelBundle bundle = open_model_bundle(dir, /*require_tokenizer=*/!ids_only);
  apply_sampling_defaults(bundle.sampling, a);
  if (a.print_ids && !a.temperature_given) a.sampling.temperature = 0;  // ids for comparison: greedy
  a.sampling.validate();
  std::optional<Tokenizer> tokenizer = std::move(bundle.tokenizer);
  if (ids_only) tokenizer.reset();
  std::vector<int32_t> prompt =
      a.prompt_ids.empty() ? tokenizer->encode(a.prompt, /*add_special=*/true) : parse_token_ids(a.prompt_ids, "--prompt-ids");
  if (prompt.empty()) fail("the prompt encodes to no tokens; give some text with --prompt");
  std::unique_ptr<Model> model = std::move(bundle.model);
  quantize_as_flagged(*model, a.model, a.threads, a.quiet);
  const ModelSpec& spec = model->spec();
  for (int32_t id : prompt)
    if (id >= spec.vocab_size) fail("--prompt-ids: {} is not below the vocabulary size {}", id, spec.vocab_size);
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
  std::optional<StreamDecoder> stream;
  if (tokenizer && !a.print_ids) stream.emplace(*tokenizer);
  ForwardBatch batch;
  batch.tokens = prompt;
  batch.seqs.push_back({.first_token = 0, .n_tokens = int32_t(prompt.size()), .start_pos = 0, .block_table = table,
                        .want_logits = true});
  std::vector<float> logits;

  const auto t0 = clock::now();
  auto t_first = t0;
  int generated = 0;
  int32_t pos = int32_t(prompt.size());
  if (stream) std::fputs(a.prompt_ids.empty() ? a.prompt.c_str() : tokenizer->decode(prompt).c_str(), stdout);
  for (; generated < a.max_tokens; ++generated) {
    runner->forward(batch, logits);
    if (generated == 0) t_first = clock::now();
    const int32_t next = sampler.sample(logits, workspace).token;
    const bool eos = std::find(spec.eos_token_ids.begin(), spec.eos_token_ids.end(), next) != spec.eos_token_ids.end();
    if (eos && !a.ignore_eos) break;
    if (stream)
      std::fputs(stream->push(next).c_str(), stdout);
    else
      std::fputs(fmt::format("{}{}", generated ? "," : "", next).c_str(), stdout);
    std::fflush(stdout);
    batch.tokens = {next};
    batch.seqs[0].n_tokens = 1;
    batch.seqs[0].start_pos = pos++;
  }
  if (stream) std::fputs(stream->finish().c_str(), stdout);
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
  add_model_flags(cmd, a->model);
  cmd->add_option("--prompt,-p", a->prompt, "prompt text");
  cmd->add_option("--prompt-ids", a->prompt_ids, "the prompt as comma-separated token ids (instead of --prompt)");
  cmd->add_flag("--print-ids", a->print_ids, "print the generated token ids, comma-separated, instead of text (greedy unless --temperature is given)");
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
