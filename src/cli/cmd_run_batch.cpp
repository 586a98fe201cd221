// spill run-batch: many prompts through the engine at once, without HTTP. Reads JSONL, writes
// one JSON result per prompt (in input order) and a summary line.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/json_limits.h"
#include "engine/engine.h"
#include "engine/generation_config.h"
#include "engine/open_engine.h"

namespace spill::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct RunBatchArgs {
  std::string model, prompts, output;
  std::string quant, imatrix;
  int64_t kv_blocks = 0;
  int64_t kv_mem = 0;
  int32_t block_size = 16;
  int32_t max_seqs = 64;
  int64_t max_batch_tokens = 2048;
  int64_t max_model_len = 0;
  int threads = 0;
  DeviceChoice device{};
  std::optional<KvFormat> kv_format{};  // --kv-format
  std::string plan;  // --plan
  offload::StartupPlacement placement;  // --gpu-mem, --host-experts, --host-mem
  int64_t max_tokens = 128;
  std::optional<float> temperature;  // --temperature; none: the model's generation_config.json
  SamplingParams defaults;           // the model's sampling defaults, with --temperature on top
  bool no_prefix_caching = false;
};

// One input line, parsed. Errors name the file, the line and the field.
struct BatchItem {
  size_t line = 0;
  json id;  // echoed back when the line has "id"
  GenerationRequest request;
};

struct LineFields {
  const json& j;
  std::string where;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  double number(const char* key) const {
    if (!j[key].is_number()) fail("{}: '{}' must be a number, got {}", where, key, describe_json(j[key]));
    return j[key].get<double>();
  }
  int64_t integer(const char* key) const {
    if (!j[key].is_number_integer()) fail("{}: '{}' must be an integer, got {}", where, key, describe_json(j[key]));
    return j[key].get<int64_t>();
  }
  bool boolean(const char* key) const {
    if (!j[key].is_boolean()) fail("{}: '{}' must be true or false, got {}", where, key, describe_json(j[key]));
    return j[key].get<bool>();
  }
  std::vector<int32_t> ids(const char* key) const {
    if (!j[key].is_array()) fail("{}: '{}' must be a list of token ids", where, key);
    std::vector<int32_t> out;
    for (const json& v : j[key]) {
      if (!v.is_number_integer()) fail("{}: '{}' must hold integers, got {}", where, key, describe_json(v));
      out.push_back(v.get<int32_t>());
    }
    return out;
  }
};

BatchItem parse_line(const std::string& text, size_t line_no, const std::string& path, const RunBatchArgs& a,
                     const Tokenizer* tokenizer) {
  const std::string where = fmt::format("{}:{}", path, line_no);
  const json j = parse_json<json>(text, where);
  if (!j.is_object()) fail("{}: each line must be a JSON object such as {{\"prompt\": \"...\"}}", where);
  static const char* known[] = {"id",
                                "prompt",
                                "prompt_ids",
                                "max_tokens",
                                "temperature",
                                "top_p",
                                "top_k",
                                "min_p",
                                "repetition_penalty",
                                "presence_penalty",
                                "frequency_penalty",
                                "seed",
                                "stop",
                                "stop_token_ids",
                                "ignore_eos",
                                "logprobs",
                                "top_logprobs",
                                "skip_special_tokens",
                                "cache_salt"};
  for (const auto& [key, value] : j.items())
    if (std::find(std::begin(known), std::end(known), key) == std::end(known))
      fail(
          "{}: unknown field '{}' (known: id, prompt, prompt_ids, max_tokens, temperature, top_p, top_k, min_p, "
          "repetition_penalty, presence_penalty, frequency_penalty, seed, stop, stop_token_ids, ignore_eos, logprobs, "
          "top_logprobs, skip_special_tokens, cache_salt)",
          where, key);
  LineFields f{j, where};
  BatchItem item;
  item.line = line_no;
  if (j.contains("id")) item.id = j["id"];
  GenerationRequest& r = item.request;
  if (f.has("prompt") == f.has("prompt_ids")) fail("{}: give exactly one of 'prompt' (text) or 'prompt_ids'", where);
  if (f.has("prompt")) {
    if (!j["prompt"].is_string()) fail("{}: 'prompt' must be a string", where);
    if (!tokenizer) fail("{}: 'prompt' is text but the model has no tokenizer.json; give 'prompt_ids'", where);
    r.prompt = tokenizer->encode(j["prompt"].get<std::string>(), /*add_special=*/true);
  } else {
    r.prompt = f.ids("prompt_ids");
  }
  r.max_tokens = f.has("max_tokens") ? f.integer("max_tokens") : a.max_tokens;
  r.sampling = a.defaults;
  if (f.has("temperature")) r.sampling.temperature = float(f.number("temperature"));
  if (f.has("top_p")) r.sampling.top_p = float(f.number("top_p"));
  if (f.has("top_k")) r.sampling.top_k = int32_t(f.integer("top_k"));
  if (f.has("min_p")) r.sampling.min_p = float(f.number("min_p"));
  if (f.has("repetition_penalty")) r.sampling.repetition_penalty = float(f.number("repetition_penalty"));
  if (f.has("presence_penalty")) r.sampling.presence_penalty = float(f.number("presence_penalty"));
  if (f.has("frequency_penalty")) r.sampling.frequency_penalty = float(f.number("frequency_penalty"));
  if (f.has("seed")) r.sampling.seed = uint64_t(f.integer("seed"));
  if (f.has("logprobs")) r.sampling.logprobs = f.boolean("logprobs");
  if (f.has("top_logprobs")) r.sampling.top_logprobs = int32_t(f.integer("top_logprobs"));
  if (f.has("stop")) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& v : s) {
        if (!v.is_string()) fail("{}: 'stop' must be a string or a list of strings", where);
        r.stop.push_back(v.get<std::string>());
      }
    } else {
      fail("{}: 'stop' must be a string or a list of strings", where);
    }
  }
  if (f.has("stop_token_ids")) r.stop_token_ids = f.ids("stop_token_ids");
  if (f.has("ignore_eos")) r.ignore_eos = f.boolean("ignore_eos");
  if (f.has("skip_special_tokens")) r.skip_special_tokens = f.boolean("skip_special_tokens");
  if (f.has("cache_salt")) r.cache_salt = uint64_t(f.integer("cache_salt"));
  return item;
}

using ordered_json = nlohmann::ordered_json;

ordered_json logprobs_json(const std::vector<SampledToken>& lps) {
  ordered_json out = ordered_json::array();
  for (const SampledToken& t : lps) {
    ordered_json top = ordered_json::array();
    for (const TokenLogprob& alt : t.top) top.push_back({{"token_id", alt.token}, {"logprob", alt.logprob}});
    out.push_back({{"token_id", t.token}, {"logprob", t.logprob}, {"top", top}});
  }
  return out;
}

void run_batch(RunBatchArgs a) {
  const std::string dir = a.model.empty() ? default_model_dir() : a.model;
  if (a.kv_blocks > 0 && a.kv_mem > 0) fail("give the KV cache size once: --kv-blocks or --kv-mem, not both");
  a.defaults = load_sampling_defaults(dir);
  if (a.temperature) a.defaults.temperature = *a.temperature;
  EngineOptions options;
  options.runner.device = a.device;
  options.runner.threads = a.threads;
  options.runner.kv = {.block_size = a.block_size, .blocks = a.kv_blocks, .bytes = a.kv_mem};
  options.runner.kv_format = a.kv_format;
  options.runner.expert_plan = a.plan;
  options.runner.placement = a.placement;
  options.quant = a.quant;
  options.imatrix = a.imatrix;

  std::ifstream in(a.prompts);
  if (!in) fail("{}: cannot read the prompts file", a.prompts);
  std::vector<std::string> lines;
  std::vector<size_t> line_numbers;
  {
    std::string line;
    for (size_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      lines.push_back(line);
      line_numbers.push_back(n);
    }
  }
  if (lines.empty()) fail("{}: no prompts (one JSON object per line, e.g. {{\"prompt\": \"Hello\"}})", a.prompts);

  EngineConfig config{.scheduler = {.max_running = a.max_seqs, .max_batch_tokens = a.max_batch_tokens},
                      .max_waiting = int64_t(lines.size()) + 1,
                      .max_model_len = a.max_model_len,
                      .prefix_caching = !a.no_prefix_caching};
  std::unique_ptr<Engine> engine = open_engine(dir, options, config);

  // Parse everything before submitting anything: a typo on line 900 should not cost a run.
  std::vector<BatchItem> items;
  for (size_t i = 0; i < lines.size(); ++i)
    items.push_back(parse_line(lines[i], line_numbers[i], a.prompts, a, engine->tokenizer()));

  FILE* out = stdout;
  std::unique_ptr<FILE, int (*)(FILE*)> file(nullptr, &std::fclose);
  if (!a.output.empty()) {
    file.reset(std::fopen(a.output.c_str(), "w"));
    if (!file) fail("{}: cannot write the results file", a.output);
    out = file.get();
  }

  const Clock::time_point start = Clock::now();
  std::vector<std::optional<RequestStream>> streams(items.size());
  std::vector<std::string> refused(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    try {
      streams[i] = engine->submit(std::move(items[i].request));
    } catch (const Error& e) {
      refused[i] = e.what();
    }
  }

  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0, n_ok = 0, n_failed = 0;
  std::vector<double> ttfts;
  for (size_t i = 0; i < items.size(); ++i) {
    ordered_json result = {{"index", i}, {"line", items[i].line}};
    if (!items[i].id.is_null()) result["id"] = items[i].id;
    if (!streams[i]) {
      result["finish_reason"] = "error";
      result["error"] = refused[i];
      ++n_failed;
    } else {
      RequestOutput o = streams[i]->collect();
      const RequestFinish& f = *o.finish;
      result["text"] = o.text;
      result["token_ids"] = o.token_ids;
      result["finish_reason"] = finish_reason_name(f.reason);
      if (f.stop_string) result["stop"] = *f.stop_string;
      if (f.stop_token) result["stop_token_id"] = *f.stop_token;
      if (!f.error.empty()) result["error"] = f.error;
      result["prompt_tokens"] = f.prompt_tokens;
      result["completion_tokens"] = f.completion_tokens;
      result["cached_tokens"] = f.cached_tokens;
      result["preemptions"] = f.preemptions;
      result["queue_ms"] = f.timings.queue_ms;
      result["ttft_ms"] = f.timings.ttft_ms;
      result["total_ms"] = f.timings.total_ms;
      if (!o.logprobs.empty()) result["logprobs"] = logprobs_json(o.logprobs);
      prompt_tokens += f.prompt_tokens;
      completion_tokens += f.completion_tokens;
      cached_tokens += f.cached_tokens;
      if (f.timings.ttft_ms >= 0) ttfts.push_back(f.timings.ttft_ms);
      (f.reason == FinishReason::Error ? n_failed : n_ok) += 1;
    }
    // error_handler::replace: model text is not guaranteed to be valid UTF-8 at a stop cut.
    std::fputs((result.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n").c_str(), out);
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  const EngineMetrics m = engine->metrics();
  std::sort(ttfts.begin(), ttfts.end());
  auto pct = [&](double p) { return ttfts.empty() ? -1.0 : ttfts[size_t(p * double(ttfts.size() - 1) + 0.5)]; };
  ordered_json summary = {{"requests", items.size()},
                          {"completed", n_ok},
                          {"failed", n_failed},
                          {"prompt_tokens", prompt_tokens},
                          {"completion_tokens", completion_tokens},
                          {"cached_tokens", cached_tokens},
                          {"wall_s", wall_s},
                          {"output_tokens_per_s", completion_tokens / std::max(wall_s, 1e-9)},
                          {"total_tokens_per_s", double(m.computed_tokens) / std::max(wall_s, 1e-9)},
                          {"ttft_ms_median", pct(0.5)},
                          {"ttft_ms_p95", pct(0.95)},
                          {"steps", m.steps},
                          {"preemptions", m.preemptions},
                          {"kv_block_size", m.kv_block_size},
                          {"kv_blocks", m.kv_blocks_total},
                          {"max_model_len", engine->max_model_len()},
                          {"prefix_cache_hit_rate",
                           m.prefix_query_tokens ? double(m.prefix_hit_tokens) / double(m.prefix_query_tokens) : 0.0}};
  std::fputs((ordered_json{{"summary", summary}}.dump() + "\n").c_str(), out);
  std::fflush(out);
}

}  // namespace

void add_run_batch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run-batch",
                                 "Run many prompts through the engine at once (continuous batching); "
                                 "results and timings as JSON lines");
  auto a = std::make_shared<RunBatchArgs>();
  cmd->add_option("--model", a->model, "Hugging Face model folder or GGUF file (default: the bundled spill-tiny)");
  cmd->add_option("--quant", a->quant, "quantize the weights at load (see spill info --help, docs/QUANT.md)");
  cmd->add_option("--imatrix", a->imatrix, "importance matrix for --quant (llama.cpp legacy imatrix.dat)");
  cmd->add_option("--prompts", a->prompts,
                  "JSONL file, one request per line: {\"prompt\": \"...\"} or {\"prompt_ids\": [...]}, with optional "
                  "max_tokens, temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos, "
                  "repetition_penalty, presence_penalty, frequency_penalty, logprobs, top_logprobs, id")
      ->required();
  cmd->add_option("--output,-o", a->output, "write the results here instead of stdout");
  auto* blocks = cmd->add_option("--kv-blocks", a->kv_blocks, "KV cache size in blocks");
  add_size_option(cmd, "--kv-mem", a->kv_mem, "KV cache size, instead of --kv-blocks")->excludes(blocks);
  cmd->add_option("--block-size", a->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_option("--max-seqs", a->max_seqs, "most sequences running at once")->capture_default_str();
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens, "token budget per step (prefill chunks + decodes)")
      ->capture_default_str();
  cmd->add_option("--max-model-len", a->max_model_len,
                  "longest prompt + output (default: the model's context, capped by the KV cache)");
  cmd->add_option("--max-tokens", a->max_tokens, "max_tokens for lines that do not say")->capture_default_str();
  cmd->add_option("--temperature", a->temperature,
                  "temperature for lines that do not say (0 = greedy; default: the model's generation_config.json)");
  cmd->add_flag("--no-prefix-caching", a->no_prefix_caching, "do not share KV blocks between requests");
  cmd->add_option("--threads", a->threads, "CPU threads (default: all)");
  add_device_option(cmd, a->device);
  add_kv_format_option(cmd, a->kv_format);
  add_plan_option(cmd, a->plan);
  add_placement_options(cmd, a->placement);
  cmd->callback([a] { run_batch(*a); });
}

}  // namespace spill::cli
