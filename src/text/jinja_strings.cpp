// Python's str as templates use it: the str methods (s.strip(), s.split(), ...), str.format,
// printf-style str % args, slicing, and the argument binding all builtins share.
#include "text/jinja_strings.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "text/jinja_interp.h"

namespace spill::jinja::detail {

// ---- argument binding --------------------------------------------------------------------------------

// Binds call arguments to named parameters the way Python binds them to a def.
std::vector<std::optional<Value>> bind(std::string_view func, CallArgs& args,
                                       std::initializer_list<std::string_view> names, size_t required) {
  std::vector<std::optional<Value>> out(names.size());
  if (args.positional.size() > names.size()) {
    type_error(fmt::format("{}() takes at most {} argument(s) ({} given)", func, names.size(), args.positional.size()));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (auto& [key, value] : args.keyword) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) type_error(fmt::format("{}() got an unexpected keyword argument '{}'", func, key));
    auto& slot = out[size_t(it - names.begin())];
    if (slot) type_error(fmt::format("{}() got multiple values for argument '{}'", func, key));
    slot = value;
  }
  std::vector<std::string> missing;
  for (size_t i = 0; i < required; ++i) {
    if (!out[i]) missing.push_back(repr_string(*(names.begin() + long(i))));
  }
  if (!missing.empty()) {
    std::string list = missing[0];
    for (size_t i = 1; i < missing.size(); ++i) list += (i + 1 == missing.size() ? " and " : ", ") + missing[i];
    type_error(fmt::format("{}() missing {} required positional argument{}: {}", func, missing.size(),
                           missing.size() == 1 ? "" : "s", list));
  }
  return out;
}

Value arg_or(const std::optional<Value>& v, Value fallback) {
  return v ? *v : std::move(fallback);
}

int64_t to_index(const Value& v, std::string_view what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_undefined()) fail_undefined(v);
  type_error(fmt::format("'{}' object cannot be interpreted as an integer{}", type_name(v), what));
}

std::string as_text(const Value& v, std::string_view what) {
  if (v.is_string()) return v.as_string();
  if (v.is_undefined()) fail_undefined(v);
  type_error(fmt::format("{} must be str, not {}", what, type_name(v)));
}

// Decimal digits as an index; values beyond int64 saturate (they index nothing anyway).
int64_t parse_index(std::string_view digits) {
  int64_t v = 0;
  for (char c : digits) {
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v)) return INT64_MAX;
  }
  return v;
}

// ---- string helpers -----------------------------------------------------------------------------------

std::string capitalize(std::string_view s) {
  std::u32string u = decode_utf8(s);
  if (u.empty()) return "";
  std::u32string out;
  append_title(out, u[0]);
  return encode_utf8(out) + lower_string(encode_utf8(std::u32string_view(u).substr(1)));
}

// str.title(): a cased character after an uncased one starts a word.
static std::string title_method(std::string_view s) {
  std::u32string out;
  bool previous_cased = false;
  for (char32_t c : decode_utf8(s)) {
    if (previous_cased) {
      std::u32string lowered = decode_utf8(lower_string(encode_utf8(std::u32string(1, c))));
      out += lowered;
    } else {
      append_title(out, c);
    }
    previous_cased = is_cased(c);
  }
  return encode_utf8(out);
}

std::string replace_all(std::string_view s, std::string_view old, std::string_view replacement, int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {
    std::u32string u = decode_utf8(s);
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (done < count) {
        out += replacement;
        ++done;
      }
      if (i < u.size()) append_utf8(out, u[i]);
      check_result_size(double(out.size()));
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(replacement);
    check_result_size(double(out.size()));
    pos = hit + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

// Python's slice index adjustment (PySlice_AdjustIndices) for one bound.
static void adjust_slice(int64_t length, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step,
                         int64_t* out_start, int64_t* out_stop) {
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += length;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= length) {
      x = step < 0 ? length - 1 : length;
    }
    return x;
  };
  *out_start = clamp(start, step < 0 ? length - 1 : 0);
  *out_stop = clamp(stop, step < 0 ? -1 : length);
}

// Code point bounds of str.find / count / startswith's optional start and end arguments.
static void str_bounds(const std::u32string& u, const std::optional<Value>& start, const std::optional<Value>& end,
                       size_t* b, size_t* e) {
  int64_t n = int64_t(u.size());
  auto fix = [&](const std::optional<Value>& v, int64_t dflt) {
    if (!v || v->is_none()) return dflt;
    int64_t x = to_index(*v, "");
    if (x < 0) x = std::max<int64_t>(0, x + n);
    return std::min(x, n);
  };
  *b = size_t(fix(start, 0));
  *e = size_t(fix(end, n));
}

static Seq split_whitespace(const std::u32string& u, int64_t maxsplit, bool from_right) {
  Seq parts;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (!from_right) {
    size_t i = 0, n = u.size();
    while (true) {
      while (i < n && is_space(u[i])) ++i;
      if (i == n) break;
      if (int64_t(parts.size()) == maxsplit) {
        parts.push_back(Value::string(encode_utf8(u.substr(i))));
        break;
      }
      size_t j = i;
      while (j < n && !is_space(u[j])) ++j;
      parts.push_back(Value::string(encode_utf8(u.substr(i, j - i))));
      i = j;
    }
    return parts;
  }
  int64_t i = int64_t(u.size()) - 1;
  while (true) {
    while (i >= 0 && is_space(u[size_t(i)])) --i;
    if (i < 0) break;
    if (int64_t(parts.size()) == maxsplit) {
      parts.push_back(Value::string(encode_utf8(u.substr(0, size_t(i + 1)))));
      break;
    }
    int64_t j = i;
    while (j >= 0 && !is_space(u[size_t(j)])) --j;
    parts.push_back(Value::string(encode_utf8(u.substr(size_t(j + 1), size_t(i - j)))));
    i = j;
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

Seq split_sep(std::string_view s, std::string_view sep, int64_t maxsplit, bool from_right) {
  if (sep.empty()) raise(ErrorKind::kValue, "empty separator");
  if (maxsplit < 0) maxsplit = INT64_MAX;
  Seq parts;
  if (!from_right) {
    size_t pos = 0;
    while (int64_t(parts.size()) < maxsplit) {
      size_t hit = s.find(sep, pos);
      if (hit == std::string_view::npos) break;
      parts.push_back(Value::string(std::string(s.substr(pos, hit - pos))));
      pos = hit + sep.size();
    }
    parts.push_back(Value::string(std::string(s.substr(pos))));
    return parts;
  }
  size_t end = s.size();
  while (int64_t(parts.size()) < maxsplit && end >= sep.size()) {
    size_t hit = s.rfind(sep, end - sep.size());
    if (hit == std::string_view::npos) break;
    parts.push_back(Value::string(std::string(s.substr(hit + sep.size(), end - hit - sep.size()))));
    end = hit;
  }
  parts.push_back(Value::string(std::string(s.substr(0, end))));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::u32string> splitlines(const std::u32string& u, bool keepends) {
  std::vector<std::u32string> lines;
  size_t i = 0, start = 0;
  while (i < u.size()) {
    if (is_linebreak(u[i])) {
      size_t eol = i + 1;
      if (u[i] == U'\r' && eol < u.size() && u[eol] == U'\n') ++eol;
      lines.push_back(u.substr(start, (keepends ? eol : i) - start));
      start = i = eol;
    } else {
      ++i;
    }
  }
  if (start < u.size()) lines.push_back(u.substr(start));
  return lines;
}

std::string pad(std::string_view s, int64_t width, char32_t fill, char align) {
  int64_t len = int64_t(utf8_length(s));
  if (width <= len) return std::string(s);
  check_result_size(double(width) * 4);
  int64_t total = width - len;
  int64_t left = align == '<' ? 0 : align == '>' ? total : total / 2;
  std::string f;
  append_utf8(f, fill);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += f;
  out += s;
  for (int64_t i = 0; i < total - left; ++i) out += f;
  return out;
}

// str.center's split of the padding, which differs from format()'s '^' for odd margins.
std::string center(std::string_view s, int64_t width, char32_t fill) {
  int64_t len = int64_t(utf8_length(s));
  if (width <= len) return std::string(s);
  check_result_size(double(width) * 4);
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  std::string f;
  append_utf8(f, fill);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += f;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += f;
  return out;
}

static char32_t fill_char(const std::optional<Value>& v) {
  if (!v) return U' ';
  std::string f = as_text(*v, "The fill character");
  std::u32string u = decode_utf8(f);
  if (u.size() != 1) type_error("The fill character must be exactly one character long");
  return u[0];
}

// Python's float(str): surrounding whitespace, underscores between digits, inf and nan.
std::optional<double> parse_float(std::string_view text) {
  std::string s = strip(text, true, true, Value());
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        return std::nullopt;
      }
      continue;
    }
    clean += s[i];
  }
  if (clean.empty()) return std::nullopt;
  std::string l = lower_string(clean);
  std::string_view body = l;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    double v = body == "nan" ? NAN : INFINITY;
    return l[0] == '-' ? -v : v;
  }
  for (char c : body) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-')) {
      return std::nullopt;
    }
  }
  char* end = nullptr;
  double v = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return v;
}

// Python's int(str, base).
std::optional<int64_t> parse_int(std::string_view text, int base) {
  std::string s = strip(text, true, true, Value());
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    char p = char(std::tolower(static_cast<unsigned char>(s[i + 1])));
    int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed && (base == 0 || base == prefixed)) {
      base = prefixed;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (i >= s.size()) return std::nullopt;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_' && prev_digit && i + 1 < s.size() && s[i + 1] != '_') {
      prev_digit = false;
      continue;
    }
    int d = std::isdigit(static_cast<unsigned char>(c))   ? c - '0'
            : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                                                          : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return std::nullopt;
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  return negative ? -v : v;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

bool cased_test(const Value& v, bool want_lower) {
  bool any_cased = false;
  for (char32_t c : decode_utf8(to_str(v))) {
    if (is_upper(c) || is_lower(c) || is_cased(c)) {
      if (want_lower ? !is_lower(c) : !is_upper(c)) return false;
      any_cased = true;
    }
  }
  return any_cased;
}

namespace {

// ---- str.format --------------------------------------------------------------------------------------------

struct FormatSpec {
  char32_t fill = U' ';
  char align = 0;
  char sign = 0;
  bool alternate = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;
  int64_t precision = -1;
  char type = 0;
};

// One more decimal digit of a format's width or precision, as Python reads them: the number must
// stay below 2^31 (Python's limit for %-formats; str.format's is larger, but any width past a few
// million fails the render's size limit anyway), and a longer one is Python's ValueError, not an
// integer overflow.
int64_t push_digit(int64_t v, char32_t digit, const char* too_big) {
  const int64_t d = int64_t(digit - U'0');
  if (v > (int64_t(INT32_MAX) - d) / 10) raise(ErrorKind::kValue, too_big);
  return v * 10 + d;
}

FormatSpec parse_spec(std::string_view spec_text) {
  FormatSpec spec;
  std::u32string s = decode_utf8(spec_text);
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == U'<' || c == U'>' || c == U'=' || c == U'^'; };
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s[0];
    spec.align = char(s[1]);
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = char(s[0]);
    i = 1;
  }
  if (i < s.size() && (s[i] == U'+' || s[i] == U'-' || s[i] == U' ')) spec.sign = char(s[i++]);
  if (i < s.size() && s[i] == U'#') {
    spec.alternate = true;
    ++i;
  }
  if (i < s.size() && s[i] == U'0') {
    spec.zero = true;
    ++i;
  }
  auto number = [&]() {
    int64_t v = -1;
    while (i < s.size() && s[i] >= U'0' && s[i] <= U'9')
      v = push_digit(v < 0 ? 0 : v, s[i++], "Too many decimal digits in format string");
    return v;
  };
  spec.width = number();
  if (i < s.size() && (s[i] == U',' || s[i] == U'_')) spec.grouping = char(s[i++]);
  if (i < s.size() && s[i] == U'.') {
    ++i;
    spec.precision = number();
    if (spec.precision < 0) raise(ErrorKind::kValue, "Format specifier missing precision");
  }
  if (i < s.size()) spec.type = char(s[i++]);
  if (i < s.size()) raise(ErrorKind::kValue, "Invalid format specifier");
  return spec;
}

std::string group_digits(const std::string& digits, char sep) {
  std::string out;
  int n = int(digits.size());
  for (int i = 0; i < n; ++i) {
    out += digits[size_t(i)];
    if (sep && (n - i - 1) > 0 && (n - i - 1) % 3 == 0) out += sep;
  }
  return out;
}

// Pads a formatted number whose sign has already been separated out.
std::string finish_number(const FormatSpec& spec, std::string sign, std::string body) {
  char align = spec.align ? spec.align : (spec.zero ? '=' : '>');
  char32_t fill = spec.zero && !spec.align ? U'0' : spec.fill;
  if (align == '=') {
    int64_t len = int64_t(utf8_length(sign) + utf8_length(body));
    std::string f;
    append_utf8(f, fill);
    std::string padding;
    for (int64_t i = len; i < spec.width; ++i) padding += f;
    return sign + padding + body;
  }
  return pad(sign + body, spec.width, fill, align == '^' ? '^' : align);
}

std::string format_value(const Value& v, std::string_view spec_text) {
  if (spec_text.empty()) return to_str(v);
  FormatSpec spec = parse_spec(spec_text);
  if (v.is_string()) {
    if (spec.type && spec.type != 's') {
      raise(ErrorKind::kValue, fmt::format("Unknown format code '{}' for object of type 'str'", spec.type));
    }
    std::string s = v.as_string();
    if (spec.precision >= 0) {
      std::u32string u = decode_utf8(s);
      if (int64_t(u.size()) > spec.precision) s = encode_utf8(u.substr(0, size_t(spec.precision)));
    }
    return pad(s, spec.width, spec.fill, spec.align ? spec.align : '<');
  }
  if (!v.is_number()) type_error(fmt::format("unsupported format string passed to {}.__format__", type_name(v)));
  char type = spec.type;
  bool integral = !v.is_float();
  if (integral && (type == 0 || std::strchr("bcdoxXn", type))) {
    int64_t x = v.as_int();
    std::string sign = x < 0 ? "-" : (spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "");
    uint64_t mag = x < 0 ? uint64_t(0) - uint64_t(x) : uint64_t(x);
    std::string body;
    switch (type) {
      case 'b': {
        for (uint64_t m = mag; m; m >>= 1) body.insert(body.begin(), char('0' + (m & 1)));
        if (body.empty()) body = "0";
        if (spec.alternate) sign += "0b";
        break;
      }
      case 'o':
        body = fmt::format("{:o}", mag);
        if (spec.alternate) sign += "0o";
        break;
      case 'x':
        body = fmt::format("{:x}", mag);
        if (spec.alternate) sign += "0x";
        break;
      case 'X':
        body = fmt::format("{:X}", mag);
        if (spec.alternate) sign += "0X";
        break;
      case 'c': {
        std::string c;
        append_utf8(c, char32_t(x));
        return pad(c, spec.width, spec.fill, spec.align ? spec.align : '<');
      }
      default:
        body = group_digits(std::to_string(mag), spec.grouping);
    }
    return finish_number(spec, sign, body);
  }
  if (type && !std::strchr("eEfFgG%", type)) {
    raise(ErrorKind::kValue, fmt::format("Unknown format code '{}' for object of type '{}'", type, type_name(v)));
  }
  double x = v.as_float();
  std::string sign = std::signbit(x) && !std::isnan(x) ? "-" : (spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "");
  double mag = std::fabs(x);
  std::string body;
  int64_t precision = spec.precision < 0 ? 6 : spec.precision;
  if (type == 0 && spec.precision < 0) {
    body = float_repr(mag);
  } else if (type == '%') {
    body = fmt::format("{:.{}f}%", mag * 100, precision);
  } else {
    char t = type == 0 ? 'g' : type;
    body = fmt::format(fmt::runtime(fmt::format("{{:{}.{}{}}}", spec.alternate ? "#" : "", precision, t)), mag);
    if (type == 0 && body.find_first_of(".einf") == std::string::npos) body += ".0";
  }
  if (spec.grouping) {
    size_t end = body.find_first_of(".eE%");
    if (end == std::string::npos) end = body.size();
    body = group_digits(body.substr(0, end), spec.grouping) + body.substr(end);
  }
  return finish_number(spec, sign, body);
}

std::string str_format(Interpreter& interp, std::string_view fmt_text, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  for (size_t i = 0; i < fmt_text.size(); ++i) {
    char c = fmt_text[i];
    if (c == '}') {
      if (i + 1 < fmt_text.size() && fmt_text[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      raise(ErrorKind::kValue, "Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt_text.size() && fmt_text[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    // {field!conv:spec}, with one level of nested {} in spec.
    size_t depth = 1, j = i + 1;
    for (; j < fmt_text.size() && depth; ++j) {
      if (fmt_text[j] == '{') ++depth;
      if (fmt_text[j] == '}') --depth;
    }
    if (depth) raise(ErrorKind::kValue, "expected '}' before end of string");
    std::string_view inner = fmt_text.substr(i + 1, j - i - 2);
    i = j - 1;
    size_t colon = std::string_view::npos, bang = std::string_view::npos;
    for (size_t k = 0; k < inner.size(); ++k) {
      if (inner[k] == '[') {
        k = inner.find(']', k);
        if (k == std::string_view::npos) break;
      } else if (inner[k] == '!' && bang == std::string_view::npos && colon == std::string_view::npos) {
        bang = k;
      } else if (inner[k] == ':' && colon == std::string_view::npos) {
        colon = k;
        break;
      }
    }
    std::string_view field = inner.substr(0, std::min(bang, colon));
    char conversion = 0;
    if (bang != std::string_view::npos) conversion = bang + 1 < inner.size() ? inner[bang + 1] : 0;
    std::string spec = colon == std::string_view::npos ? "" : std::string(inner.substr(colon + 1));
    if (spec.find('{') != std::string::npos) spec = str_format(interp, spec, args);
    // First part of the field name: index, name or empty; then .attr and [key] parts.
    size_t end = field.find_first_of(".[");
    std::string_view head = field.substr(0, end);
    Value value;
    if (head.empty()) {
      if (used_manual)
        raise(ErrorKind::kValue, "cannot switch from manual field specification to automatic field numbering");
      used_auto = true;
      if (auto_index >= args.positional.size()) {
        raise(ErrorKind::kUnsupported,
              fmt::format("Replacement index {} out of range for positional args tuple", auto_index));
      }
      value = args.positional[auto_index++];
    } else if (std::all_of(head.begin(), head.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      if (used_auto)
        raise(ErrorKind::kValue, "cannot switch from automatic field numbering to manual field specification");
      used_manual = true;
      size_t idx = size_t(parse_index(head));
      if (idx >= args.positional.size()) {
        raise(ErrorKind::kUnsupported, fmt::format("Replacement index {} out of range for positional args tuple", idx));
      }
      value = args.positional[idx];
    } else {
      auto it = std::find_if(args.keyword.begin(), args.keyword.end(), [&](auto& kv) { return kv.first == head; });
      if (it == args.keyword.end()) raise(ErrorKind::kUnsupported, fmt::format("KeyError: {}", repr_string(head)));
      value = it->second;
    }
    while (end != std::string_view::npos && end < field.size()) {
      if (field[end] == '.') {
        size_t next = field.find_first_of(".[", end + 1);
        value = interp.getattr(value, field.substr(end + 1, next - end - 1));
        end = next;
      } else {
        size_t close = field.find(']', end);
        std::string key(field.substr(end + 1, close - end - 1));
        bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char d) { return d >= '0' && d <= '9'; });
        value = interp.getitem(value, digits ? Value::integer(parse_index(key)) : Value::string(key));
        end = close + 1 < field.size() ? close + 1 : std::string_view::npos;
      }
    }
    if (conversion == 'r' || conversion == 'a') value = Value::string(repr(value));
    if (conversion == 's') value = Value::string(to_str(value));
    out += format_value(value, spec);
  }
  return out;
}

// ---- methods of str, dict and list -------------------------------------------------------------------------------

using Method = Value (*)(Interpreter&, const Value& self, CallArgs& args);

const std::string& self_str(const Value& self) {
  return self.as_string();
}

Value m_str_case(const Value& self, CallArgs& args, std::string (*fn)(std::string_view), std::string_view name) {
  bind(name, args, {});
  return Value::string(fn(self_str(self)));
}

Value m_strip(const Value& self, CallArgs& args, bool left, bool right) {
  auto a = bind("strip", args, {"chars"});
  return Value::string(strip(self_str(self), left, right, arg_or(a[0], Value::none())));
}

Value m_split(const Value& self, CallArgs& args, bool from_right) {
  auto a = bind("split", args, {"sep", "maxsplit"});
  int64_t maxsplit = a[1] ? to_index(*a[1], "") : -1;
  if (!a[0] || a[0]->is_none()) return Value::list(split_whitespace(decode_utf8(self_str(self)), maxsplit, from_right));
  return Value::list(split_sep(self_str(self), as_text(*a[0], "must be str or None, not"), maxsplit, from_right));
}

Value m_find(const Value& self, CallArgs& args, bool from_right, bool raise_if_missing) {
  auto a = bind(raise_if_missing ? "index" : "find", args, {"sub", "start", "end"});
  if (!a[0]) type_error("find() takes at least 1 argument (0 given)");
  std::u32string u = decode_utf8(self_str(self));
  std::u32string sub = decode_utf8(as_text(*a[0], "must be str, not"));
  size_t b, e;
  str_bounds(u, a[1], a[2], &b, &e);
  int64_t found = -1;
  if (b <= e && e - b >= sub.size()) {
    std::u32string_view window = std::u32string_view(u).substr(b, e - b);
    size_t hit = from_right ? window.rfind(sub) : window.find(sub);
    if (hit != std::u32string_view::npos) found = int64_t(b + hit);
  }
  if (found < 0 && raise_if_missing) raise(ErrorKind::kValue, "substring not found");
  return Value::integer(found);
}

Value m_affix(const Value& self, CallArgs& args, bool prefix) {
  auto a = bind(prefix ? "startswith" : "endswith", args, {"prefix", "start", "end"});
  if (!a[0]) type_error("startswith() takes at least 1 argument (0 given)");
  std::u32string u = decode_utf8(self_str(self));
  size_t b, e;
  str_bounds(u, a[1], a[2], &b, &e);
  std::u32string_view window = b <= e ? std::u32string_view(u).substr(b, e - b) : std::u32string_view();
  Seq candidates;
  if (a[0]->kind() == Kind::kTuple) {
    candidates = a[0]->items();
  } else if (a[0]->is_string()) {
    candidates.push_back(*a[0]);
  } else {
    type_error(fmt::format("{} first arg must be str or a tuple of str, not {}", prefix ? "startswith" : "endswith",
                           type_name(*a[0])));
  }
  if (b > u.size()) return Value::boolean(false);
  for (const Value& c : candidates) {
    std::u32string x = decode_utf8(as_text(c, "tuple for startswith must only contain str, not"));
    if (x.size() <= window.size() &&
        (prefix ? window.substr(0, x.size()) == x : window.substr(window.size() - x.size()) == x)) {
      return Value::boolean(true);
    }
  }
  return Value::boolean(false);
}

Value m_partition(const Value& self, CallArgs& args, bool from_right) {
  auto a = bind("partition", args, {"sep"});
  if (!a[0]) type_error("partition() takes exactly one argument (0 given)");
  std::string sep = as_text(*a[0], "must be str, not");
  if (sep.empty()) raise(ErrorKind::kValue, "empty separator");
  const std::string& s = self_str(self);
  size_t hit = from_right ? s.rfind(sep) : s.find(sep);
  if (hit == std::string::npos) {
    return from_right ? Value::tuple({Value::string(""), Value::string(""), self})
                      : Value::tuple({self, Value::string(""), Value::string("")});
  }
  return Value::tuple({Value::string(s.substr(0, hit)), Value::string(sep), Value::string(s.substr(hit + sep.size()))});
}

Value m_justify(const Value& self, CallArgs& args, char how) {
  auto a = bind("ljust", args, {"width", "fillchar"});
  if (!a[0]) type_error("ljust() takes at least 1 argument (0 given)");
  int64_t width = to_index(*a[0], "");
  char32_t fill = fill_char(a[1]);
  if (how == '^') return Value::string(center(self_str(self), width, fill));
  return Value::string(pad(self_str(self), width, fill, how));
}

Value m_is(const Value& self, CallArgs& args, bool (*pred)(char32_t)) {
  bind("is", args, {});
  std::u32string u = decode_utf8(self_str(self));
  return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), pred));
}

Value call_str_method(Interpreter& interp, std::string_view name, const Value& self, CallArgs& args) {
  const std::string& s = self_str(self);
  if (name == "upper") return m_str_case(self, args, upper_string, name);
  if (name == "lower" || name == "casefold") return m_str_case(self, args, lower_string, name);
  if (name == "capitalize") return m_str_case(self, args, capitalize, name);
  if (name == "title") return m_str_case(self, args, title_method, name);
  if (name == "swapcase") {
    bind(name, args, {});
    std::u32string u = decode_utf8(s);
    std::string out;
    for (char32_t c : u) {
      std::string one = encode_utf8(std::u32string(1, c));
      out += is_upper(c) ? lower_string(one) : is_lower(c) ? upper_string(one) : one;
    }
    return Value::string(std::move(out));
  }
  if (name == "strip") return m_strip(self, args, true, true);
  if (name == "lstrip") return m_strip(self, args, true, false);
  if (name == "rstrip") return m_strip(self, args, false, true);
  if (name == "split") return m_split(self, args, false);
  if (name == "rsplit") return m_split(self, args, true);
  if (name == "splitlines") {
    auto a = bind(name, args, {"keepends"});
    Seq out;
    for (const auto& line : splitlines(decode_utf8(s), a[0] && truthy(*a[0])))
      out.push_back(Value::string(encode_utf8(line)));
    return Value::list(std::move(out));
  }
  if (name == "startswith") return m_affix(self, args, true);
  if (name == "endswith") return m_affix(self, args, false);
  if (name == "find") return m_find(self, args, false, false);
  if (name == "rfind") return m_find(self, args, true, false);
  if (name == "index") return m_find(self, args, false, true);
  if (name == "rindex") return m_find(self, args, true, true);
  if (name == "count") {
    auto a = bind(name, args, {"sub", "start", "end"});
    if (!a[0]) type_error("count() takes at least 1 argument (0 given)");
    std::u32string u = decode_utf8(s);
    std::u32string sub = decode_utf8(as_text(*a[0], "must be str, not"));
    size_t b, e;
    str_bounds(u, a[1], a[2], &b, &e);
    if (b > e) return Value::integer(0);
    std::u32string_view window = std::u32string_view(u).substr(b, e - b);
    if (sub.empty()) return Value::integer(int64_t(window.size()) + 1);
    int64_t n = 0;
    for (size_t p = window.find(sub); p != std::u32string_view::npos; p = window.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "replace") {
    auto a = bind(name, args, {"old", "new", "count"});
    if (!a[0] || !a[1]) type_error("replace expected at least 2 arguments");
    int64_t count = a[2] ? to_index(*a[2], "") : -1;
    return Value::string(replace_all(s, as_text(*a[0], "replace() argument 1 must be str, not"),
                                     as_text(*a[1], "replace() argument 2 must be str, not"), count));
  }
  if (name == "join") {
    auto a = bind(name, args, {"iterable"});
    if (!a[0]) type_error("join() takes exactly one argument (0 given)");
    std::string out;
    Seq items = iterate(*a[0]);
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        type_error(fmt::format("sequence item {}: expected str instance, {} found", i, type_name(items[i])));
      }
      if (i) out += s;
      out += items[i].as_string();
      check_result_size(double(out.size()));
    }
    return Value::string(std::move(out));
  }
  if (name == "partition") return m_partition(self, args, false);
  if (name == "rpartition") return m_partition(self, args, true);
  if (name == "removeprefix" || name == "removesuffix") {
    auto a = bind(name, args, {"affix"});
    if (!a[0]) type_error(fmt::format("{}() takes exactly one argument (0 given)", name));
    std::string affix = as_text(*a[0], fmt::format("{}() argument must be str, not", name));
    if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) return Value::string(s.substr(affix.size()));
    if (name == "removesuffix" && !affix.empty() && s.size() >= affix.size() &&
        s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return Value::string(s.substr(0, s.size() - affix.size()));
    }
    return self;
  }
  if (name == "ljust") return m_justify(self, args, '<');
  if (name == "rjust") return m_justify(self, args, '>');
  if (name == "center") return m_justify(self, args, '^');
  if (name == "zfill") {
    auto a = bind(name, args, {"width"});
    if (!a[0]) type_error("zfill() takes exactly one argument (0 given)");
    int64_t width = to_index(*a[0], "");
    std::u32string u = decode_utf8(s);
    if (int64_t(u.size()) >= width) return self;
    check_result_size(double(width) * 4);
    size_t fill = size_t(width - int64_t(u.size()));
    size_t at = !u.empty() && (u[0] == U'+' || u[0] == U'-') ? 1 : 0;
    u.insert(at, fill, U'0');
    return Value::string(encode_utf8(u));
  }
  if (name == "format") return Value::string(str_format(interp, s, args));
  if (name == "isalnum") return m_is(self, args, is_alnum);
  if (name == "isalpha") return m_is(self, args, is_alpha);
  if (name == "isdigit") return m_is(self, args, is_digit);
  if (name == "isdecimal") return m_is(self, args, is_decimal);
  if (name == "isnumeric") return m_is(self, args, is_numeric);
  if (name == "isspace") return m_is(self, args, is_space);
  if (name == "isascii") {
    bind(name, args, {});
    return Value::boolean(is_ascii(s));
  }
  if (name == "islower" || name == "isupper") {
    bind(name, args, {});
    return Value::boolean(cased_test(self, name == "islower"));
  }
  if (name == "istitle") {
    bind(name, args, {});
    bool cased = false, previous_cased = false;
    for (char32_t c : decode_utf8(s)) {
      if (is_upper(c) || (is_cased(c) && !is_lower(c))) {
        if (previous_cased) return Value::boolean(false);
        previous_cased = cased = true;
      } else if (is_lower(c)) {
        if (!previous_cased) return Value::boolean(false);
        previous_cased = cased = true;
      } else {
        previous_cased = false;
      }
    }
    return Value::boolean(cased);
  }
  raise(ErrorKind::kUnsupported, fmt::format("str.{}() is not supported by spill's template engine", name));
}

Value call_dict_method(std::string_view name, const Value& self, CallArgs& args) {
  const Dict& d = self.as_dict();
  if (name == "get") {
    auto a = bind(name, args, {"key", "default"});
    if (!a[0]) type_error("get expected at least 1 argument, got 0");
    require_hashable(*a[0]);
    if (const Value* v = d.find(*a[0])) return *v;
    return arg_or(a[1], Value::none());
  }
  bind(name, args, {});
  Seq out;
  if (name == "items") {
    for (const auto& [k, v] : d.entries) out.push_back(Value::tuple({k, v}));
  } else if (name == "keys") {
    for (const auto& [k, v] : d.entries) out.push_back(k);
  } else if (name == "values") {
    for (const auto& [k, v] : d.entries) out.push_back(v);
  } else if (name == "copy") {
    return self;
  } else {
    raise(ErrorKind::kUnsupported, fmt::format("dict.{}() is not supported by spill's template engine", name));
  }
  return Value::list(std::move(out));
}

Value call_list_method(std::string_view name, const Value& self, CallArgs& args) {
  const Seq& items = self.items();
  if (name == "count") {
    auto a = bind(name, args, {"value"});
    if (!a[0]) type_error("count() takes exactly one argument (0 given)");
    return Value::integer(std::count_if(items.begin(), items.end(), [&](const Value& x) { return equals(x, *a[0]); }));
  }
  if (name == "index") {
    auto a = bind(name, args, {"value", "start", "stop"});
    if (!a[0]) type_error("index expected at least 1 argument, got 0");
    int64_t n = int64_t(items.size());
    auto fix = [&](const std::optional<Value>& v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = to_index(*v, "");
      if (x < 0) x = std::max<int64_t>(0, x + n);
      return std::min(x, n);
    };
    for (int64_t i = fix(a[1], 0); i < fix(a[2], n); ++i) {
      if (equals(items[size_t(i)], *a[0])) return Value::integer(i);
    }
    raise(ErrorKind::kValue,
          fmt::format("{} is not in {}", repr(*a[0]), self.kind() == Kind::kTuple ? "tuple" : "list"));
  }
  if (name == "copy") {
    bind(name, args, {});
    return Value::list(items);
  }
  raise(ErrorKind::kUnsupported, fmt::format("list.{}() is not supported", name));
}

bool in_list(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Python's own argument checks for these methods: most take positional arguments only, some none.
void check_method_arguments(const Value& self, std::string_view name, const CallArgs& args) {
  std::string qualified = type_name(self) + "." + std::string(name);
  bool no_arguments = in_list(
      name, {"capitalize", "casefold",  "isalnum",     "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier",
             "islower",    "isnumeric", "isprintable", "isspace", "istitle", "isupper",   "lower",   "swapcase",
             "title",      "upper",     "items",       "keys",    "values",  "copy"});
  bool takes_keywords =
      self.is_string() && in_list(name, {"split", "rsplit", "splitlines", "format", "encode", "expandtabs"});
  if (!args.keyword.empty() && !takes_keywords) type_error(qualified + "() takes no keyword arguments");
  if (no_arguments && !args.positional.empty()) {
    type_error(fmt::format("{}() takes no arguments ({} given)", qualified, args.positional.size()));
  }
}

Value bound(const Value& self, std::string_view name,
            Value (*call)(Interpreter&, std::string_view, const Value&, CallArgs&)) {
  std::string method(name);
  return Value::function(method, [self, method, call](Interpreter& interp, CallArgs& args) {
    check_method_arguments(self, method, args);
    return call(interp, method, self, args);
  });
}

Value unsafe_method(const Value& self, std::string_view name) {
  UndefinedInfo info;
  info.hint =
      fmt::format("access to attribute {} of {} object is unsafe.", repr_string(name), repr_string(type_name(self)));
  info.error = ErrorKind::kSecurity;
  return Value::undefined(std::move(info));
}

// ---- printf-style formatting ----------------------------------------------------------------------------------

template <class T>
std::string c_format(const std::string& format, T value) {
  int n = std::snprintf(nullptr, 0, format.c_str(), value);
  check_result_size(double(n));
  std::string out(size_t(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), format.c_str(), value);
  out.resize(size_t(n));
  return out;
}

std::string printf_number(const std::string& flags, int64_t width, int64_t precision, char conv, const Value& v) {
  check_result_size(double(width) + double(precision));
  std::string f = "%" + flags;
  if (width >= 0) f += std::to_string(width);
  if (precision >= 0) f += "." + std::to_string(precision);
  if (std::strchr("diuoxX", conv)) {
    if (v.is_float()) {
      if (conv != 'd' && conv != 'i' && conv != 'u') {
        type_error(fmt::format("%{} format: an integer is required, not float", conv));
      }
      double d = v.as_float();
      if (!std::isfinite(d)) raise(ErrorKind::kOverflow, "cannot convert float infinity to integer");
      return c_format(f + "lld", static_cast<long long>(d));
    }
    long long x = static_cast<long long>(v.as_int());
    if ((conv == 'o' || conv == 'x' || conv == 'X') && x < 0 && x != LLONG_MIN) {
      // Python prints the sign and the magnitude; C would print two's complement.
      std::string body = printf_number(flags, -1, precision, conv, Value::integer(-v.as_int()));
      return pad("-" + body, width, flags.find('0') != std::string::npos ? U'0' : U' ',
                 flags.find('-') != std::string::npos ? '<' : '>');
    }
    return c_format(f + "ll" + (conv == 'u' ? 'd' : conv), x);
  }
  return c_format(f + conv, v.as_float());
}

}  // namespace

std::string percent_format(Interpreter& interp, const std::string& format, const Value& args) {
  (void)interp;
  // Python: a tuple supplies the arguments; anything else is the single argument, and when it
  // supports [] (dict, list, Undefined) it is also the mapping for %(key)s, and unused arguments
  // are then no error.
  Seq positional;
  const bool tuple = args.kind() == Kind::kTuple;
  const bool mapping_like = !tuple && (args.is_dict() || args.kind() == Kind::kList || args.is_undefined());
  if (tuple) {
    positional = args.items();
  } else {
    positional.push_back(args);
  }
  size_t next_arg = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    size_t start = i++;
    if (i >= format.size()) raise(ErrorKind::kValue, "incomplete format");
    const Value* value = nullptr;
    Value keyed;
    if (format[i] == '(') {
      size_t close = format.find(')', i);
      if (close == std::string::npos) raise(ErrorKind::kValue, "incomplete format key");
      if (!mapping_like) type_error("format requires a mapping");
      std::string key = format.substr(i + 1, close - i - 1);
      if (args.is_undefined()) fail_undefined(args);
      if (!args.is_dict()) type_error("list indices must be integers or slices, not str");
      const Value* v = args.as_dict().find(std::string_view(key));
      if (!v) raise(ErrorKind::kUnsupported, fmt::format("KeyError: {}", repr_string(key)));
      keyed = *v;
      value = &keyed;
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() && std::strchr("-+ #0", format[i])) flags += format[i++];
    auto next_value = [&]() -> const Value& {
      if (next_arg >= positional.size()) type_error("not enough arguments for format string");
      return positional[next_arg++];
    };
    int64_t width = -1, precision = -1;
    if (i < format.size() && format[i] == '*') {
      width = to_index(next_value(), "");
      ++i;
    } else {
      while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) {
        width = push_digit(width < 0 ? 0 : width, char32_t(format[i++]), "width too big");
      }
    }
    if (i < format.size() && format[i] == '.') {
      ++i;
      precision = 0;
      if (i < format.size() && format[i] == '*') {
        precision = to_index(next_value(), "");
        ++i;
      } else {
        while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) {
          precision = push_digit(precision, char32_t(format[i++]), "precision too big");
        }
      }
    }
    while (i < format.size() && std::strchr("hlL", format[i])) ++i;
    if (i >= format.size()) raise(ErrorKind::kValue, "incomplete format");
    char conv = format[i];
    if (conv == '%') {
      if (value) {
        raise(ErrorKind::kValue, fmt::format("unsupported format character '%' (0x25) at index {}", i));
      }
      if (i != start + 1) {  // "%5%": Python takes an argument, then rejects the conversion
        next_value();
        raise(ErrorKind::kValue, fmt::format("unsupported format character '%' (0x25) at index {}", i));
      }
      out += '%';
      continue;
    }
    const Value& v = value ? *value : next_value();
    bool left = flags.find('-') != std::string::npos;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = conv == 's' ? to_str(v) : repr(v);
        if (precision >= 0) {
          std::u32string u = decode_utf8(s);
          if (int64_t(u.size()) > precision) s = encode_utf8(u.substr(0, size_t(precision)));
        }
        out += pad(s, width, U' ', left ? '<' : '>');
        break;
      }
      case 'c': {
        std::string s;
        if (v.is_string() && utf8_length(v.as_string()) == 1) {
          s = v.as_string();
        } else if (v.is_int()) {
          append_utf8(s, char32_t(v.as_int()));
        } else {
          type_error("%c requires int or char");
        }
        out += pad(s, width, U' ', left ? '<' : '>');
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'o':
      case 'x':
      case 'X':
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G':
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number()) {
          if (std::strchr("eEfFgG", conv)) type_error(fmt::format("must be real number, not {}", type_name(v)));
          type_error(fmt::format("%{} format: a real number is required, not {}", conv, type_name(v)));
        }
        out += printf_number(flags, width, precision, conv, v);
        break;
      default:
        raise(ErrorKind::kValue,
              fmt::format("unsupported format character {} (0x{:x}) at index {}", repr_string(std::string(1, conv)),
                          int(static_cast<unsigned char>(conv)), i));
    }
  }
  if (!used_mapping && next_arg < positional.size() && !mapping_like) {
    type_error("not all arguments converted during string formatting");
  }
  return out;
}
std::optional<Value> slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  auto index = [](const Value& v) -> std::optional<std::optional<int64_t>> {
    if (v.is_none()) return std::optional<int64_t>();
    if (v.is_int() || v.is_bool()) return std::optional<int64_t>(v.as_int());
    return std::nullopt;
  };
  auto b = index(start), e = index(stop), s = index(step);
  if (!b || !e || !s) return std::nullopt;
  int64_t st = s->value_or(1);
  if (st == 0) raise(ErrorKind::kValue, "slice step cannot be zero");
  auto pick = [&](int64_t n, auto&& take) {
    int64_t from, to;
    adjust_slice(n, *b, *e, st, &from, &to);
    for (int64_t i = from; st > 0 ? i < to : i > to; i += st) take(size_t(i));
  };
  if (obj.is_string()) {
    std::u32string u = decode_utf8(obj.as_string());
    std::u32string out;
    pick(int64_t(u.size()), [&](size_t i) { out.push_back(u[i]); });
    return Value::string(encode_utf8(out));
  }
  if (obj.kind() == Kind::kList || obj.kind() == Kind::kTuple) {
    const Seq& items = obj.items();
    Seq out;
    pick(int64_t(items.size()), [&](size_t i) { out.push_back(items[i]); });
    return obj.kind() == Kind::kList ? Value::list(std::move(out)) : Value::tuple(std::move(out));
  }
  return std::nullopt;
}
std::optional<Value> builtin_method(const Value& self, std::string_view name) {
  switch (self.kind()) {
    case Kind::kString:
      if (in_list(name,
                  {"capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
                   "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
                   "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
                   "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
                   "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
                   "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
                   "swapcase",   "title",        "translate",    "upper",   "zfill"})) {
        return bound(self, name, [](Interpreter& interp, std::string_view n, const Value& s, CallArgs& a) {
          return call_str_method(interp, n, s, a);
        });
      }
      return std::nullopt;
    case Kind::kDict:
      if (in_list(name, {"clear", "pop", "popitem", "setdefault", "update"})) return unsafe_method(self, name);
      if (in_list(name, {"get", "items", "keys", "values", "copy", "fromkeys"})) {
        return bound(self, name, [](Interpreter&, std::string_view n, const Value& s, CallArgs& a) {
          return call_dict_method(n, s, a);
        });
      }
      return std::nullopt;
    case Kind::kList:
      if (in_list(name, {"append", "clear", "pop", "reverse", "insert", "sort", "extend", "remove"})) {
        return unsafe_method(self, name);
      }
      [[fallthrough]];
    case Kind::kTuple:
      if (in_list(name, {"count", "index"}) || (self.kind() == Kind::kList && name == "copy")) {
        return bound(self, name, [](Interpreter&, std::string_view n, const Value& s, CallArgs& a) {
          return call_list_method(n, s, a);
        });
      }
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

}  // namespace spill::jinja::detail
