// spill profile: run prompts through the model and count which experts each layer routes to,
// separately for prefill and decode tokens, with decode co-activation per step. The planner
// reads the result (spill plan --profile).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/json_limits.h"
#include "engine/engine.h"
#include "engine/open_engine.h"
#include "placement/profile.h"

namespace spill::cli {

namespace {

struct ProfileArgs {
  std::string model, prompts, out;
  int64_t max_tokens = 16;
  int32_t max_seqs = 16;
  int64_t max_batch_tokens = 2048;
  int threads = 0;
  DeviceChoice device{};
  std::optional<KvFormat> kv_format{};
};

std::vector<GenerationRequest> read_prompts(const std::string& path, const Tokenizer* tokenizer, int64_t max_tokens) {
  std::ifstream in(path);
  if (!in) fail("--prompts {}: cannot read it", path);
  std::vector<GenerationRequest> out;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, n);
    const nlohmann::json j = parse_json<nlohmann::json>(line, where);
    if (!j.is_object() || (j.contains("prompt") == j.contains("prompt_ids")))
      fail("{}: each line must be {{\"prompt\": \"text\"}} or {{\"prompt_ids\": [ids]}}, optionally with \"max_tokens\"", where);
    GenerationRequest r;
    if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) fail("{}: \"prompt\" must be a string", where);
      if (!tokenizer) fail("{}: \"prompt\" is text but the model has no tokenizer.json; give \"prompt_ids\"", where);
      r.prompt = tokenizer->encode(j["prompt"].get<std::string>(), /*add_special=*/true);
    } else {
      if (!j["prompt_ids"].is_array()) fail("{}: \"prompt_ids\" must be a list of token ids", where);
      for (const auto& v : j["prompt_ids"]) {
        if (!v.is_number_integer()) fail("{}: \"prompt_ids\" must hold integers", where);
        r.prompt.push_back(v.get<int32_t>());
      }
    }
    r.max_tokens = max_tokens;
    if (j.contains("max_tokens")) {
      if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() < 1)
        fail("{}: \"max_tokens\" must be a positive integer", where);
      r.max_tokens = j["max_tokens"].get<int64_t>();
    }
    r.sampling.temperature = 0;  // greedy: the same text gives the same profile
    r.ignore_eos = true;         // every prompt decodes its max_tokens
    out.push_back(std::move(r));
  }
  if (out.empty()) fail("--prompts {}: no prompts (one JSON object per line)", path);
  return out;
}

void run_profile(const ProfileArgs& a) {
  const std::string dir = a.model.empty() ? default_model_dir() : a.model;
  if (a.prompts.empty()) fail("--prompts is required: a JSONL file of {{\"prompt\": \"...\"}} lines");
  if (a.out.empty()) fail("--out is required: where to write the profile (JSON)");
  const ModelSpec spec = load_model_spec(dir);
  if (spec.n_moe_layers() == 0) fail("--model {}: a dense model has no experts to profile", dir);
  placement::RoutingRecorder recorder(spec, dir, a.prompts);
  std::vector<placement::StepChunkKind> kinds;
  EngineConfig config{.scheduler = {.max_running = a.max_seqs, .max_batch_tokens = a.max_batch_tokens},
                      .max_waiting = 1 << 20,
                      .prefix_caching = false,  // every token of every prompt runs through the router
                      .on_step =
                          [&](const StepTrace& t) {
                            kinds.clear();
                            for (const StepTraceChunk& c : t.chunks) kinds.push_back({c.n_tokens, c.decode});
                            recorder.end_step(kinds);
                          },
                      .observer = &recorder};
  auto engine = open_engine(dir, EngineOptions{.runner = {.device = a.device, .threads = a.threads, .kv_format = a.kv_format}}, config);
  std::vector<GenerationRequest> requests = read_prompts(a.prompts, engine->tokenizer(), a.max_tokens);
  std::vector<RequestStream> streams;
  for (GenerationRequest& r : requests) streams.push_back(engine->submit(std::move(r)));
  int64_t prompt_tokens = 0, generated = 0;
  for (RequestStream& s : streams) {
    RequestOutput o = s.collect();
    if (o.finish->reason == FinishReason::Error) fail("a prompt failed: {}", o.finish->error);
    prompt_tokens += o.finish->prompt_tokens;
    generated += o.finish->completion_tokens;
  }
  engine.reset();  // the engine thread is done with the recorder
  const placement::RoutingProfile p = recorder.snapshot();
  placement::save_profile(p, a.out);
  int64_t prefill = 0, decode = 0;
  for (const placement::LayerRouting& l : p.layers)
    if (l.moe) prefill = l.prefill_tokens, decode = l.decode_tokens;
  std::printf("profiled %zu prompts: %lld prompt tokens, %lld generated; per MoE layer %lld prefill + %lld decode tokens "
              "routed top-%lld over %lld steps\n",
              streams.size(), (long long)prompt_tokens, (long long)generated, (long long)prefill, (long long)decode,
              (long long)p.top_k, (long long)p.steps);
  std::printf("%-6s %-12s %-12s %s\n", "layer", "least used", "most used", "(share of decode tokens; prefill if none)");
  for (size_t l = 0; l < p.layers.size(); ++l) {
    if (!p.layers[l].moe) continue;
    double lo = 1, hi = 0;
    for (int64_t e = 0; e < p.n_experts; ++e) lo = std::min(lo, p.usage(int64_t(l), e)), hi = std::max(hi, p.usage(int64_t(l), e));
    std::printf("%-6zu %-12.4f %-12.4f\n", l, lo, hi);
  }
  std::printf("profile written to %s\n", a.out.c_str());
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("profile", "Count expert routings per layer on a prompts file (for spill plan --profile)");
  auto a = std::make_shared<ProfileArgs>();
  cmd->add_option("--model", a->model, "Hugging Face model folder (default: the bundled spill-tiny)");
  cmd->add_option("--prompts", a->prompts, "JSONL: {\"prompt\": \"...\"} or {\"prompt_ids\": [...]}, optional max_tokens")
      ->required();
  cmd->add_option("--out", a->out, "profile JSON to write")->required();
  cmd->add_option("--max-tokens", a->max_tokens, "greedy tokens decoded after each prompt (decode routings)")
      ->capture_default_str();
  cmd->add_option("--max-seqs", a->max_seqs, "sequences decoding at once")->capture_default_str();
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens, "tokens per step")->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (default: all)");
  add_device_option(cmd, a->device);
  add_kv_format_option(cmd, a->kv_format);
  cmd->callback([a] { run_profile(*a); });
}

}  // namespace spill::cli
