// spill generate: complete a prompt and stream the text to stdout.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "engine/generation_config.h"
#include "engine/model_bundle.h"
#include "sampling/sampler.h"
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
  DeviceChoice device{};
  std::optional<KvFormat> kv_format{};  // --kv-format
  std::string plan;  // --plan
  offload::StartupPlacement placement;  // --gpu-mem, --host-experts, --host-mem
  bool ignore_eos = false;
  bool quiet = false;
  SamplingParams sampling;  // the model's defaults with the flags given on top
};

// The sampling flags as given; each one set overrides the model's own defaults
// (generation_config.json, or a GGUF's general.sampling.*).
struct SamplingFlags {
  SamplingParams values;
  std::vector<std::pair<CLI::Option*, void (*)(SamplingParams&, const SamplingParams&)>> options;
  void apply(SamplingParams& to) const {
    for (const auto& [option, copy] : options)
      if (option->count() > 0) copy(to, values);
  }
  bool given(const char* name) const {
    for (const auto& [option, copy] : options)
      if (option->count() > 0 && option->check_name(name)) return true;
    return false;
  }
};

void run_generate(GenerateArgs a, const SamplingFlags& flags) {
  using clock = std::chrono::steady_clock;
  const std::string dir = a.model.dir();
  (void)resolve_device(a.device);  // an impossible --device fails before the model is loaded
  if (a.max_tokens < 0) fail("-n must be >= 0, got {}", a.max_tokens);
  if (a.prompt.empty() == a.prompt_ids.empty()) fail("give the prompt once: --prompt TEXT or --prompt-ids 1,2,3");
  // Ids in and out need no tokenizer: the way other engines' tools are driven for comparisons.
  const bool ids_only = a.print_ids && !a.prompt_ids.empty();
  if (!a.model.synthetic.empty() && !ids_only)
    fail("a --synthetic model has no tokenizer: drive it with --prompt-ids 1,2,3 --print-ids");
  ModelBundle bundle;
  if (a.model.synthetic.empty()) bundle = open_model_bundle(dir, /*require_tokenizer=*/!ids_only);
  else bundle.model = open_synthetic_model(a.model, a.threads, a.quiet, SyntheticFill::OnDemand);  // the runner prepares
  a.sampling = bundle.sampling;
  flags.apply(a.sampling);
  if (a.print_ids && !flags.given("--temperature")) a.sampling.temperature = 0;  // ids for comparison: greedy
  a.sampling.validate();
  std::optional<Tokenizer> tokenizer = std::move(bundle.tokenizer);
  if (ids_only) tokenizer.reset();
  std::vector<int32_t> prompt =
      a.prompt_ids.empty() ? tokenizer->encode(a.prompt, /*add_special=*/true) : parse_token_ids(a.prompt_ids, "--prompt-ids");
  if (prompt.empty()) fail("the prompt encodes to no tokens; give some text with --prompt");
  std::unique_ptr<Model> model = std::move(bundle.model);
  if (a.model.synthetic.empty()) quantize_as_flagged(*model, a.model, a.threads, a.quiet);
  const ModelSpec& spec = model->spec();
  for (int32_t id : prompt)
    if (id >= spec.vocab_size) fail("--prompt-ids: {} is not below the vocabulary size {}", id, spec.vocab_size);
  const int64_t total = int64_t(prompt.size()) + a.max_tokens;
  if (total > spec.max_position_embeddings)
    fail("prompt ({} tokens) + -n {} exceeds the model's context of {} tokens", prompt.size(), a.max_tokens,
         spec.max_position_embeddings);

  // One sequence: a pool of exactly the blocks it needs, a step of at most the prompt.
  const int32_t block_size = 16;
  const int64_t n_blocks = (total + block_size - 1) / block_size;
  auto runner = open_runner(*model, {.device = a.device,
                                     .threads = a.threads,
                                     .kv = {.block_size = block_size, .blocks = hand_built_pool_blocks(spec, n_blocks)},
                                     .kv_format = a.kv_format,
                                     .limits = {.max_seqs = 1,
                                                .max_batch_tokens = int64_t(prompt.size()),
                                                .max_model_len = total},
                                     .expert_plan = a.plan,
                                     .placement = a.placement});
  const HandBuiltTables tables = hand_built_tables(spec, n_blocks);  // one table per KV group
  const std::vector<int32_t>& table = tables.tables[0];

  SequenceSampler sampler(a.sampling, prompt, uint64_t(clock::now().time_since_epoch().count()));
  SequenceSampler* const samplers[] = {&sampler};
  StepResult step;
  std::optional<StreamDecoder> stream;
  if (tokenizer && !a.print_ids) stream.emplace(*tokenizer);
  ForwardBatch batch;
  batch.tokens = prompt;
  batch.seqs.push_back({.first_token = 0,
                        .n_tokens = int32_t(prompt.size()),
                        .start_pos = 0,
                        .block_table = table,
                        .want_logits = true,
                        .slot = 0,
                        .new_blocks = table,
                        .first_in_slot = true});
  tables.attach(batch.seqs.back(), /*first_in_slot=*/true);

  const auto t0 = clock::now();
  auto t_first = t0;
  int generated = 0;
  int32_t pos = int32_t(prompt.size());
  if (stream) std::fputs(a.prompt_ids.empty() ? a.prompt.c_str() : tokenizer->decode(prompt).c_str(), stdout);
  for (; generated < a.max_tokens; ++generated) {
    runner->forward_sample(batch, samplers, step);
    if (generated == 0) t_first = clock::now();
    if (!step.rows[0].ok()) fail("generate: {}", step.rows[0].error);
    const int32_t next = step.rows[0].sampled.token;
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
    batch.seqs[0].new_blocks = {};  // the whole table was given with the prompt
    batch.seqs[0].group_new_blocks = {};
    batch.seqs[0].first_in_slot = false;
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
  auto* cmd = app.add_subcommand("generate", "Complete a prompt and stream the text to stdout");
  auto a = std::make_shared<GenerateArgs>();
  add_model_flags(cmd, a->model);
  cmd->add_option("--prompt,-p", a->prompt, "prompt text");
  cmd->add_option("--prompt-ids", a->prompt_ids, "the prompt as comma-separated token ids (instead of --prompt)");
  cmd->add_flag("--print-ids", a->print_ids, "print the generated token ids, comma-separated, instead of text (greedy unless --temperature is given)");
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
  add_device_option(cmd, a->device);
  add_kv_format_option(cmd, a->kv_format);
  add_plan_option(cmd, a->plan);
  add_placement_options(cmd, a->placement);
  cmd->add_flag("--ignore-eos", a->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--quiet,-q", a->quiet, "no timing line on stderr");
  cmd->callback([a, flags] { run_generate(*a, *flags); });
}

}  // namespace spill::cli
