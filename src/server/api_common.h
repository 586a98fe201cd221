// What the OpenAI and the Anthropic front ends share: the error every handler throws, readers
// that check a JSON field's type and range and name the field when they refuse it, the
// API-independent description of what to generate, and the results both format.
//
// Request bodies are parsed as nlohmann::ordered_json: key order is what the client sent, which
// matters where JSON is re-printed into a prompt (tool schemas through `tojson`) and keeps
// responses in the documented field order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_limits.h"
#include "sampling/sampler.h"

namespace spill::server {

using Json = nlohmann::ordered_json;

// An error with its HTTP status. Each API prints it in its own shape:
//   OpenAI    {"error": {"message", "type", "param", "code"}}
//   Anthropic {"type": "error", "error": {"type", "message"}}
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the request field at fault; "" when none
  std::string code;   // OpenAI's machine-readable code, e.g. context_length_exceeded; "" when none
};

// 400 naming the field, e.g. invalid_field("temperature", "must be between 0 and 2, got 3").
[[noreturn]] void invalid_field(std::string_view param, std::string_view what);

// OpenAI's error.type for a status: invalid_request_error, authentication_error, ...
const char* openai_error_type(int status);
// Anthropic's error.type for a status: invalid_request_error, authentication_error, ...
const char* anthropic_error_type(int status);
Json openai_error_body(const ApiError& error);
Json anthropic_error_body(const ApiError& error);

// Parses a request body. Refuses (400, naming what is wrong and where) bodies that are not JSON,
// not a JSON object, or nested deeper than kMaxJsonDepth (deep nesting would only exhaust the
// stack of code that walks the value recursively).
inline constexpr int kMaxJsonDepth = kJsonMaxDepth;
Json parse_json_body(std::string_view body);

// ---- field readers: absent or null -> std::nullopt; wrong type or range -> invalid_field ----
// `name` is the field's key in obj; `param` the name shown in errors (e.g. "messages[2].content").
const Json* find_field(const Json& obj, std::string_view name);
std::optional<double> read_number(const Json& obj, std::string_view name, double lo, double hi,
                                  std::string_view param = {});
// Integers: JSON integers, or numbers with an integral value (5.0).
std::optional<int64_t> read_integer(const Json& obj, std::string_view name, int64_t lo, int64_t hi,
                                    std::string_view param = {});
std::optional<bool> read_bool(const Json& obj, std::string_view name, std::string_view param = {});
std::optional<std::string> read_string(const Json& obj, std::string_view name, std::string_view param = {});
// A string or an array of strings (OpenAI's `stop`), at most max_items.
std::vector<std::string> read_string_or_list(const Json& obj, std::string_view name, size_t max_items,
                                             std::string_view param = {});

// Sampling settings as the client gave them: unset fields fall back to the model's
// generation_config.json, then to SamplingParams' neutral defaults.
struct SamplingOverrides {
  std::optional<float> temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
};

// The model's own defaults (generation_config.json): what "temperature omitted" means.
// Read by engine/generation_config.h, the reader `spill generate` and `run-batch` use too.
struct GenerationDefaults {
  SamplingParams sampling;  // temperature 0 when do_sample is false, as transformers does
  // Reads <dir>/generation_config.json; a missing file gives SamplingParams' defaults.
  // Throws spill::Error naming the file when it is not valid JSON.
  static GenerationDefaults load(const std::string& model_dir);
  static GenerationDefaults from_json(const nlohmann::json& config);
};

// What to generate, whichever API asked. Validated: every value is in range.
struct GenerationOptions {
  SamplingOverrides sampling;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  std::optional<int64_t> max_tokens;  // none: up to the end of the context
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  int32_t n = 1;
};

SamplingParams resolve_sampling(const GenerationOptions& options, const GenerationDefaults& defaults);

// Reads the sampling fields both OpenAI endpoints share (temperature, top_p, top_k, min_p, seed,
// presence/frequency/repetition penalties, stop, stop_token_ids, ignore_eos, skip_special_tokens,
// n, logit_bias). max_tokens and logprobs differ between endpoints and are read by them.
void read_common_sampling_fields(const Json& body, GenerationOptions& options);

// ---- results both APIs format ----
struct UsageCounts {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

struct ToolCallResult {
  std::string id;
  std::string name;
  std::string arguments;  // JSON object text
};

// Random ids: "chatcmpl-" + 24 alphanumerics, "call_...", "msg_...", "toolu_...".
std::string random_id(std::string_view prefix, size_t n_chars = 24);

// Compact JSON text; invalid UTF-8 inside strings (a token that ends mid-character) becomes U+FFFD
// instead of throwing.
std::string dump_json(const Json& value);

}  // namespace spill::server
