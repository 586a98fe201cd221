// Parsing JSON that spill did not write: request bodies, strings inside them (tool-call
// arguments), model output (<tool_call> bodies), and the JSON files of a downloaded model folder
// (config.json, generation_config.json, tokenizer.json, tokenizer_config.json, the safetensors
// header). All of it goes through parse_json / try_parse_json, which refuse nesting deeper than a
// limit before nlohmann builds the value: nlohmann's parser is iterative, but copying, comparing,
// dumping and every walk spill writes over a value recurse, so depth is what overflows a stack.
//
// Error messages show a value with describe_json(), which is bounded in size, never dump().
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace spill {

// Deep enough for every real request, tool schema and model file (they nest < 20 levels).
inline constexpr int kJsonMaxDepth = 64;

struct JsonLimits {
  int max_depth = kJsonMaxDepth;
};

// Deepest nesting of arrays/objects in JSON text, counted outside strings, exact for valid JSON.
// Stops counting (and returns) as soon as it exceeds stop_after.
int json_nesting_depth(std::string_view text, int stop_after);

// Parses `text`; throws spill::Error "<what> is not valid JSON: <where and why>" or "<what> nests
// arrays/objects deeper than N levels". `what` names the source ("config.json at /m/config.json").
template <class JsonT>
JsonT parse_json(std::string_view text, std::string_view what, JsonLimits limits = {});

// The non-throwing form, for text that may legitimately not be JSON (model output, a string that
// might hold JSON). On failure returns nullopt and, when `why` is given, sets it to the reason
// (a predicate: "is not valid JSON: ...", "nests arrays/objects deeper than 64 levels").
template <class JsonT>
std::optional<JsonT> try_parse_json(std::string_view text, std::string* why = nullptr, JsonLimits limits = {});

// A short description of a value for an error message: scalars as JSON (strings cut to
// max_chars), arrays and objects by size ("an array of 3 items").
template <class JsonT>
std::string describe_json(const JsonT& value, size_t max_chars = 60);

}  // namespace spill
