// Internal to the Jinja interpreter: Python's str semantics shared by the str methods
// (jinja_strings.cpp) and jinja2's filters (jinja_builtins.cpp), and Python-style argument binding.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_value.h"

namespace spill::jinja::detail {

// Binds call arguments to named parameters the way Python binds them to a def: positional first,
// then keywords; the first `required` must be given ("f() missing 1 required positional
// argument: 'name'"), the rest are nullopt when absent.
std::vector<std::optional<Value>> bind(std::string_view func, CallArgs& args,
                                       std::initializer_list<std::string_view> names, size_t required = 0);
Value arg_or(const std::optional<Value>& v, Value fallback);
// An int or bool as an index; anything else raises TypeError ("'str' object cannot be
// interpreted as an integer<what>").
int64_t to_index(const Value& v, std::string_view what);
// A str argument; anything else raises TypeError ("<what> must be str, not int").
std::string as_text(const Value& v, std::string_view what);
// Decimal digits as an index, saturating at INT64_MAX.
int64_t parse_index(std::string_view digits);

std::string capitalize(std::string_view s);  // str.capitalize()
// str.replace(old, new, count); count < 0 replaces all.
std::string replace_all(std::string_view s, std::string_view old, std::string_view replacement, int64_t count);
// str.split(sep, maxsplit) / str.rsplit with an explicit separator.
Seq split_sep(std::string_view s, std::string_view sep, int64_t maxsplit, bool from_right);
std::vector<std::u32string> splitlines(const std::u32string& u, bool keepends);  // str.splitlines()
// format()-style padding to `width` code points ('<', '>' or '^').
std::string pad(std::string_view s, int64_t width, char32_t fill, char align);
std::string center(std::string_view s, int64_t width, char32_t fill);  // str.center()
std::optional<double> parse_float(std::string_view text);              // float(str)
std::optional<int64_t> parse_int(std::string_view text, int base);     // int(str, base)
std::string html_escape(std::string_view s);                           // markupsafe.escape()
// str.islower() (want_lower) / str.isupper() of str(v).
bool cased_test(const Value& v, bool want_lower);

}  // namespace spill::jinja::detail
