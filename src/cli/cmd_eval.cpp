// spill eval: perplexity of a model over a text, and against a reference model the KL divergence
// and top-1 agreement of its next-token distributions (llama-perplexity --kl-divergence's
// figures; src/model/eval.h says exactly which tokens count).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "engine/model_bundle.h"
#include "model/eval.h"
#include "model/runner.h"
#include "text/tokenizer.h"

namespace spill::cli {

namespace {

struct EvalArgs {
  ModelFlags model;
  std::string reference, reference_quant, text, json_out;
  EvalOptions eval;
  int threads = 0;
  DeviceChoice device{};
  std::optional<KvFormat> kv_format{};  // the evaluated model's; the reference keeps its backend's own
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--text {}: cannot read the file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void run_eval(EvalArgs a) {
  const std::string dir = a.model.dir();
  const std::string text = read_text(a.text);
  (void)resolve_device(a.device);  // an impossible --device fails before the model is loaded
  ModelBundle bundle = open_model_bundle(dir, /*require_tokenizer=*/true);
  const Tokenizer& tokenizer = *bundle.tokenizer;
  // As llama-perplexity: the whole text tokenized once, with the tokenizer's special tokens, and
  // when that adds a BOS every window starts with it.
  const std::vector<int32_t> tokens = tokenizer.encode(text, /*add_special=*/true);
  const std::vector<int32_t> empty = tokenizer.encode("", /*add_special=*/true);
  a.eval.bos_token = empty.empty() ? -1 : empty.front();
  if (eval_window_starts(int64_t(tokens.size()), a.eval).empty())
    fail("--text {}: {} tokens, fewer than one window of --ctx {}", a.text, tokens.size(), a.eval.ctx);

  // One window per step, in a pool of exactly its blocks.
  const int32_t block_size = 16;
  const int64_t window_blocks = (a.eval.ctx + block_size - 1) / block_size;
  RunnerOptions runner_options{
      .device = a.device,
      .threads = a.threads,
      .kv = {.block_size = block_size, .blocks = hand_built_pool_blocks(bundle.model->spec(), window_blocks)},
      .kv_format = a.kv_format,
      .limits = {.max_seqs = 1, .max_batch_tokens = a.eval.ctx, .max_model_len = a.eval.ctx}};
  std::unique_ptr<Model> model = std::move(bundle.model);
  quantize_as_flagged(*model, a.model, a.threads);
  auto runner = open_runner(*model, runner_options);
  std::unique_ptr<Model> ref_model;
  std::unique_ptr<ModelRunner> ref_runner;
  if (!a.reference.empty()) {
    ModelFlags rf;
    rf.model = a.reference;
    rf.quant = a.reference_quant;
    ref_model = open_model(rf, a.threads);
    runner_options.kv.blocks = hand_built_pool_blocks(ref_model->spec(), window_blocks);
    runner_options.kv_format.reset();  // --kv-format measures the evaluated model's cache against the default
    ref_runner = open_runner(*ref_model, runner_options);
  } else if (!a.reference_quant.empty()) {
    fail("--reference-quant was given without --reference");
  }
  const EvalResult r = evaluate(*runner, ref_runner.get(), tokens, a.eval);

  const int32_t stride = a.eval.stride > 0 ? a.eval.stride : a.eval.ctx;
  fmt::print("text           {} ({} tokens)\n", a.text, tokens.size());
  fmt::print("model          {}{}\n", dir, a.model.quant.empty() ? "" : " --quant " + a.model.quant);
  if (ref_model)
    fmt::print("reference      {}{}\n", a.reference, a.reference_quant.empty() ? "" : " --quant " + a.reference_quant);
  fmt::print("windows        {} of {} tokens every {}; {} scored tokens\n", r.n_windows, a.eval.ctx, stride,
             r.n_scored);
  fmt::print("PPL            {:.6f} ± {:.6f}\n", r.ppl, r.ppl_unc);
  if (r.has_reference) {
    fmt::print("PPL(ref)       {:.6f} ± {:.6f}\n", r.ref_ppl, r.ref_ppl_unc);
    fmt::print("mean KLD       {:.6f} ± {:.6f}\n", r.kld_mean, r.kld_unc);
    fmt::print("median KLD     {:.6f}\n", r.kld_median);
    fmt::print("99.0% KLD      {:.6f}\n", r.kld_p99);
    fmt::print("max KLD        {:.6f}\n", r.kld_max);
    fmt::print("same top       {:.3f} ± {:.3f} %\n", 100 * r.top1, 100 * r.top1_unc);
  }
  if (!a.json_out.empty()) {
    nlohmann::ordered_json j = {{"text", a.text},       {"model", dir},         {"quant", a.model.quant},
                                {"reference", a.reference}, {"reference_quant", a.reference_quant},
                                {"ctx", a.eval.ctx},     {"stride", stride},     {"n_tokens", tokens.size()},
                                {"n_windows", r.n_windows}, {"n_scored", r.n_scored}, {"ppl", r.ppl},
                                {"ppl_unc", r.ppl_unc}};
    if (r.has_reference) {
      j["ref_ppl"] = r.ref_ppl;
      j["kld_mean"] = r.kld_mean;
      j["kld_unc"] = r.kld_unc;
      j["kld_median"] = r.kld_median;
      j["kld_p99"] = r.kld_p99;
      j["kld_max"] = r.kld_max;
      j["top1"] = r.top1;
      j["top1_unc"] = r.top1_unc;
    }
    std::ofstream out(a.json_out);
    if (!out) fail("--json {}: cannot write the file", a.json_out);
    out << j.dump(2) << "\n";
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval", "Perplexity over a text; with --reference, KL divergence and top-1 agreement against another model");
  auto a = std::make_shared<EvalArgs>();
  add_model_flags(cmd, a->model);
  cmd->add_option("--reference", a->reference, "reference model folder (e.g. the BF16 original)");
  cmd->add_option("--reference-quant", a->reference_quant, "--quant for the reference model");
  cmd->add_option("--text", a->text, "text file to evaluate on")->required();
  cmd->add_option("--ctx", a->eval.ctx, "tokens per window")->capture_default_str();
  cmd->add_option("--stride", a->eval.stride, "a window every N tokens (default: --ctx, back to back)");
  cmd->add_option("--threads", a->threads, "CPU threads (default: all)");
  add_device_option(cmd, a->device);
  add_kv_format_option(cmd, a->kv_format);
  cmd->add_option("--json", a->json_out, "also write the figures to this JSON file");
  cmd->callback([a] { run_eval(*a); });
}

}  // namespace spill::cli
