// Small ASCII string helpers the library shares (flag values, device names, JSON text).
// Written to C++17: CUDA sources may include it.
#pragma once
#include <string>
#include <string_view>

namespace spill {

// `s` with A-Z turned into a-z and every other byte as it is (flag values, PCI bus ids; not
// Unicode case folding, which the Jinja interpreter has in text/jinja_value.h).
inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return out;
}

// JSON's four whitespace characters (RFC 8259): space, tab, line feed, carriage return.
inline bool is_json_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace spill
