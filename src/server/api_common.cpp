#include "server/api_common.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "engine/generation_config.h"
#include "core/json_limits.h"

namespace spill::server {

void invalid_field(std::string_view param, std::string_view what) {
  throw ApiError{.status = 400, .message = fmt::format("'{}' {}", param, what), .param = std::string(param), .code = ""};
}

const char* openai_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

Json openai_error_body(const ApiError& error) {
  Json e = Json::object();
  e["message"] = error.message;
  e["type"] = openai_error_type(error.status);
  e["param"] = error.param.empty() ? Json(nullptr) : Json(error.param);
  e["code"] = error.code.empty() ? Json(nullptr) : Json(error.code);
  return Json{{"error", std::move(e)}};
}

Json anthropic_error_body(const ApiError& error) {
  Json body = Json::object();
  body["type"] = "error";
  body["error"] = Json{{"type", anthropic_error_type(error.status)}, {"message", error.message}};
  return body;
}

namespace {

std::string_view shown(std::string_view name, std::string_view param) { return param.empty() ? name : param; }

const char* json_type_name(const Json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

}  // namespace

Json parse_json_body(std::string_view body) {
  std::string why;
  std::optional<Json> maybe = try_parse_json<Json>(body, &why, JsonLimits{.max_depth = kMaxJsonDepth});
  if (!maybe)
    throw ApiError{.status = 400, .message = fmt::format("request body {}", why), .param = "", .code = ""};
  Json parsed = std::move(*maybe);
  if (!parsed.is_object())
    throw ApiError{.status = 400,
                   .message = fmt::format("request body must be a JSON object, got {}", json_type_name(parsed)),
                   .param = "",
                   .code = ""};
  return parsed;
}

const Json* find_field(const Json& obj, std::string_view name) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> read_number(const Json& obj, std::string_view name, double lo, double hi, std::string_view param) {
  const Json* v = find_field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) invalid_field(shown(name, param), fmt::format("must be a number, got {}", json_type_name(*v)));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    invalid_field(shown(name, param), fmt::format("must be between {} and {}, got {}", lo, hi, x));
  return x;
}

std::optional<int64_t> read_integer(const Json& obj, std::string_view name, int64_t lo, int64_t hi, std::string_view param) {
  const Json* v = find_field(obj, name);
  if (!v) return std::nullopt;
  const std::string_view p = shown(name, param);
  int64_t x = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      invalid_field(p, fmt::format("must be between {} and {}, got {}", lo, hi, u));
    x = int64_t(u);
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15)
      invalid_field(p, fmt::format("must be an integer, got {}", d));
    x = int64_t(d);
  } else {
    invalid_field(p, fmt::format("must be an integer, got {}", json_type_name(*v)));
  }
  if (x < lo || x > hi) invalid_field(p, fmt::format("must be between {} and {}, got {}", lo, hi, x));
  return x;
}

std::optional<bool> read_bool(const Json& obj, std::string_view name, std::string_view param) {
  const Json* v = find_field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) invalid_field(shown(name, param), fmt::format("must be a boolean, got {}", json_type_name(*v)));
  return v->get<bool>();
}

std::optional<std::string> read_string(const Json& obj, std::string_view name, std::string_view param) {
  const Json* v = find_field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) invalid_field(shown(name, param), fmt::format("must be a string, got {}", json_type_name(*v)));
  return v->get<std::string>();
}

std::vector<std::string> read_string_or_list(const Json& obj, std::string_view name, size_t max_items,
                                             std::string_view param) {
  const Json* v = find_field(obj, name);
  std::vector<std::string> out;
  if (!v) return out;
  const std::string_view p = shown(name, param);
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > max_items) invalid_field(p, fmt::format("may hold at most {} strings, got {}", max_items, v->size()));
    for (const Json& item : *v) {
      if (!item.is_string()) invalid_field(p, fmt::format("must be a string or an array of strings, found {} in the array", json_type_name(item)));
      out.push_back(item.get<std::string>());
    }
  } else {
    invalid_field(p, fmt::format("must be a string or an array of strings, got {}", json_type_name(*v)));
  }
  // An empty stop string would end every generation at once; clients mean "no stop".
  std::erase_if(out, [](const std::string& s) { return s.empty(); });
  return out;
}

GenerationDefaults GenerationDefaults::from_json(const nlohmann::json& g) {
  return GenerationDefaults{.sampling = sampling_defaults_from_json(g)};
}

GenerationDefaults GenerationDefaults::load(const std::string& model_dir) {
  return GenerationDefaults{.sampling = load_sampling_defaults(model_dir)};
}

SamplingParams resolve_sampling(const GenerationOptions& options, const GenerationDefaults& defaults) {
  SamplingParams p = defaults.sampling;
  const SamplingOverrides& o = options.sampling;
  if (o.temperature) p.temperature = *o.temperature;
  if (o.top_p) p.top_p = *o.top_p;
  if (o.top_k) p.top_k = *o.top_k;
  if (o.min_p) p.min_p = *o.min_p;
  if (o.repetition_penalty) p.repetition_penalty = *o.repetition_penalty;
  if (o.presence_penalty) p.presence_penalty = *o.presence_penalty;
  if (o.frequency_penalty) p.frequency_penalty = *o.frequency_penalty;
  if (o.seed) p.seed = *o.seed;
  p.logprobs = options.logprobs;
  p.top_logprobs = options.top_logprobs;
  return p;
}

void read_common_sampling_fields(const Json& body, GenerationOptions& g) {
  SamplingOverrides& s = g.sampling;
  if (auto v = read_number(body, "temperature", 0, 2)) s.temperature = float(*v);
  if (auto v = read_number(body, "top_p", 0, 1)) {
    // OpenAI accepts 0 and means "only the most likely token"; the sampler wants (0, 1].
    s.top_p = *v > 0 ? float(*v) : std::numeric_limits<float>::min();
  }
  if (auto v = read_integer(body, "top_k", -1, std::numeric_limits<int32_t>::max())) s.top_k = int32_t(*v);
  if (auto v = read_number(body, "min_p", 0, 1)) s.min_p = float(*v);
  if (auto v = read_number(body, "presence_penalty", -2, 2)) s.presence_penalty = float(*v);
  if (auto v = read_number(body, "frequency_penalty", -2, 2)) s.frequency_penalty = float(*v);
  if (auto v = read_number(body, "repetition_penalty", 0, 1e4)) {
    if (*v <= 0) invalid_field("repetition_penalty", fmt::format("must be greater than 0 (1 disables it), got {}", *v));
    s.repetition_penalty = float(*v);
  }
  if (const Json* seed = find_field(body, "seed")) {
    if (seed->is_number_unsigned()) s.seed = seed->get<uint64_t>();
    else if (auto v = read_integer(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
      s.seed = uint64_t(*v);
  }
  g.stop = read_string_or_list(body, "stop", 64);
  if (const Json* ids = find_field(body, "stop_token_ids")) {
    if (!ids->is_array()) invalid_field("stop_token_ids", "must be an array of token ids");
    for (const Json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max())
        invalid_field("stop_token_ids", "must be an array of non-negative integer token ids");
      g.stop_token_ids.push_back(id.get<int32_t>());
    }
  }
  if (auto v = read_bool(body, "ignore_eos")) g.ignore_eos = *v;
  if (auto v = read_bool(body, "skip_special_tokens")) g.skip_special_tokens = *v;
  if (auto v = read_integer(body, "min_tokens", 0, std::numeric_limits<int32_t>::max()); v && *v > 0)
    invalid_field("min_tokens", "is not supported by spill; omit it or pass 0");
  if (auto v = read_integer(body, "n", 1, 128)) g.n = int32_t(*v);
  if (const Json* bias = find_field(body, "logit_bias"); bias && !(bias->is_object() && bias->empty()))
    invalid_field("logit_bias", "is not supported by spill; omit it");
}

std::string random_id(std::string_view prefix, size_t n_chars) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id(prefix);
  for (size_t i = 0; i < n_chars; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

std::string dump_json(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace spill::server
