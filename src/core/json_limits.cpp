#include "core/json_limits.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace spill {

namespace {

// nlohmann's messages quote the token being read, which can be a whole (huge) string.
constexpr size_t kMaxDetailChars = 200;

std::string clip(std::string_view s, size_t max_chars) {
  if (s.size() <= max_chars) return std::string(s);
  // Cut at a UTF-8 boundary so the message stays valid UTF-8.
  size_t n = max_chars;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return fmt::format("{}... ({} bytes in all)", s.substr(0, n), s.size());
}

template <class JsonT>
std::optional<JsonT> parse_checked(std::string_view text, std::string& why, JsonLimits limits) {
  if (json_nesting_depth(text, limits.max_depth) > limits.max_depth) {
    why = fmt::format("nests arrays/objects deeper than {} levels", limits.max_depth);
    return std::nullopt;
  }
  try {
    return JsonT::parse(text);
  } catch (const nlohmann::json::exception& e) {
    why = "is not valid JSON: " + clip(e.what(), kMaxDetailChars);
    return std::nullopt;
  }
}

}  // namespace

int json_nesting_depth(std::string_view text, int stop_after) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > stop_after) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

template <class JsonT>
JsonT parse_json(std::string_view text, std::string_view what, JsonLimits limits) {
  std::string why;
  std::optional<JsonT> parsed = parse_checked<JsonT>(text, why, limits);
  if (!parsed) fail("{} {}", what, why);
  return std::move(*parsed);
}

template <class JsonT>
std::optional<JsonT> try_parse_json(std::string_view text, std::string* why, JsonLimits limits) {
  std::string reason;
  std::optional<JsonT> parsed = parse_checked<JsonT>(text, reason, limits);
  if (!parsed && why) *why = std::move(reason);
  return parsed;
}

template <class JsonT>
std::string describe_json(const JsonT& value, size_t max_chars) {
  if (value.is_string()) {
    const auto& s = value.template get_ref<const std::string&>();
    const JsonT shown = s.size() <= max_chars ? s : clip(s, max_chars);
    return "the string " + shown.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (value.is_array()) return fmt::format("an array of {} items", value.size());
  if (value.is_object()) return fmt::format("an object with {} keys", value.size());
  if (value.is_boolean()) return value.template get<bool>() ? "true" : "false";
  if (value.is_null()) return "null";
  return value.dump();  // a number: a few characters
}

template nlohmann::json parse_json<nlohmann::json>(std::string_view, std::string_view, JsonLimits);
template nlohmann::ordered_json parse_json<nlohmann::ordered_json>(std::string_view, std::string_view, JsonLimits);
template std::optional<nlohmann::json> try_parse_json<nlohmann::json>(std::string_view, std::string*, JsonLimits);
template std::optional<nlohmann::ordered_json> try_parse_json<nlohmann::ordered_json>(std::string_view, std::string*,
                                                                                       JsonLimits);
template std::string describe_json<nlohmann::json>(const nlohmann::json&, size_t);
template std::string describe_json<nlohmann::ordered_json>(const nlohmann::ordered_json&, size_t);

}  // namespace spill
