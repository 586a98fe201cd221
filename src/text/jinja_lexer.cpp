// Template source -> tokens, following jinja2's lexer rule by rule: the same delimiters, the same
// whitespace control ("-" strips all whitespace on that side, "+" keeps it), trim_blocks (the
// newline after a block or comment tag is dropped), lstrip_blocks (spaces and tabs before a block
// or comment tag on its own line are dropped), raw blocks, and Python literals inside tags.
#include <fmt/format.h>

#include <array>
#include <cstdlib>

#include "text/jinja_ast.h"

namespace spill::jinja::detail {
namespace {

// One UTF-8 character at `pos`: its code point and byte length.
std::pair<char32_t, size_t> char_at(std::string_view s, size_t pos) {
  auto c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return {c, 1};
  size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
  if (pos + len > s.size()) return {0xfffd, 1};
  std::u32string one = decode_utf8(s.substr(pos, len));
  return {one.empty() ? 0xfffd : one[0], len};
}

// Python's str.rstrip() with no argument.
std::string_view rstrip_space(std::string_view s) {
  while (!s.empty()) {
    size_t start = s.size() - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    if (!is_space(char_at(s, start).first)) break;
    s = s.substr(0, start);
  }
  return s;
}

bool all_space(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto [c, len] = char_at(s, i);
    if (!is_space(c)) return false;
    i += len;
  }
  return true;
}

bool is_digit_ascii(char c) {
  return c >= '0' && c <= '9';
}

// Python's "unicode-escape" decoding of a string literal's body.
std::string unescape(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      out += c;
      continue;
    }
    if (static_cast<unsigned char>(body[i + 1]) >= 0x80) {
      // jinja2 turns non-ASCII characters into \xe9-style escapes before decoding escapes, so a
      // backslash in front of one leaves that escape's text: '\é' is the four characters \xe9.
      size_t len = 1;
      auto lead = static_cast<unsigned char>(body[i + 1]);
      if (lead >= 0xf0) {
        len = 4;
      } else if (lead >= 0xe0) {
        len = 3;
      } else if (lead >= 0xc0) {
        len = 2;
      }
      std::u32string one = decode_utf8(body.substr(i + 1, len));
      char32_t cp = one.empty() ? 0xfffd : one[0];
      out += cp <= 0xff     ? fmt::format("\\x{:02x}", uint32_t(cp))
             : cp <= 0xffff ? fmt::format("\\u{:04x}", uint32_t(cp))
                            : fmt::format("\\U{:08x}", uint32_t(cp));
      i += len;
      continue;
    }
    char e = body[++i];
    auto hex = [&](size_t digits) {
      const char* what = digits == 2 ? "\\xXX" : digits == 4 ? "\\uXXXX" : "\\UXXXXXXXX";
      if (i + digits >= body.size()) syntax_error(fmt::format("truncated {} escape", what), line);
      std::string h(body.substr(i + 1, digits));
      for (char d : h) {
        if (!std::isxdigit(static_cast<unsigned char>(d))) syntax_error(fmt::format("truncated {} escape", what), line);
      }
      i += digits;
      return char32_t(std::strtoul(h.c_str(), nullptr, 16));
    };
    switch (e) {
      case '\n':
        break;  // line continuation
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        append_utf8(out, hex(2));
        break;
      case 'u':
        append_utf8(out, hex(4));
        break;
      case 'U':
        append_utf8(out, hex(8));
        break;
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = char32_t(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            v = v * 8 + char32_t(body[++i] - '0');
          }
          append_utf8(out, v);
        } else {
          out += '\\';
          out += e;  // unknown escapes stay as written, as in Python
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view source, const Options& options) : options_(options) {
    // Newlines are normalized to \n; without keep_trailing_newline one final newline is dropped.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!options_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit_data(pos_, src_.substr(pos_));
        break;
      }
      lex_tag(tag);
    }
    Token eof;
    eof.type = TokenType::kEof;
    eof.line = line_at(src_.size());
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  const Options& options_;
  std::string src_;
  size_t pos_ = 0;
  bool line_starting_ = true;  // the previous match ended with a newline (or nothing came before)
  std::vector<Token> tokens_;
  size_t line_cursor_ = 0;
  int line_ = 1;

  int line_at(size_t pos) {
    if (pos < line_cursor_) {  // never needed in practice: positions only move forward
      line_cursor_ = 0;
      line_ = 1;
    }
    for (; line_cursor_ < pos && line_cursor_ < src_.size(); ++line_cursor_) {
      if (src_[line_cursor_] == '\n') ++line_;
    }
    return line_;
  }

  bool starts_with(size_t pos, std::string_view s) const { return src_.compare(pos, s.size(), s) == 0; }

  size_t skip_space(size_t pos) const {
    while (pos < src_.size()) {
      auto [c, len] = char_at(src_, pos);
      if (!is_space(c)) break;
      pos += len;
    }
    return pos;
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void push(TokenType type, std::string value, size_t pos) {
    Token t;
    t.type = type;
    t.value = std::move(value);
    t.line = line_at(pos);
    tokens_.push_back(std::move(t));
  }

  void emit_data(size_t pos, std::string_view text) {
    if (!text.empty()) push(TokenType::kData, std::string(text), pos);
  }

  // Whitespace control of the text before a tag: "-" strips it all, otherwise lstrip_blocks strips
  // the indentation of a block or comment tag that starts its line.
  std::string_view control_before(std::string_view text, char sign, bool is_variable) const {
    if (sign == '-') return rstrip_space(text);
    if (sign != '+' && options_.lstrip_blocks && !is_variable) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
      if (l_pos > 0 || line_starting_) {
        std::string_view tail = text.substr(l_pos);
        if (!tail.empty() && all_space(tail)) return text.substr(0, l_pos);
      }
    }
    return text;
  }

  // Matches a block end at `pos` ("+%}", "-%}" plus whitespace, or "%}" plus one newline with
  // trim_blocks); returns the end of the match or npos.
  size_t match_block_end(size_t pos) const {
    if (starts_with(pos, "+%}")) return pos + 3;
    if (starts_with(pos, "-%}")) return skip_space(pos + 3);
    if (starts_with(pos, "%}")) {
      pos += 2;
      if (options_.trim_blocks && pos < src_.size() && src_[pos] == '\n') ++pos;
      return pos;
    }
    return std::string::npos;
  }

  // `{%(-|+|)\s*raw\s*(-%}\s*|%})` at pos; returns the end of the match or npos.
  size_t match_raw_begin(size_t pos, char* sign) const {
    size_t j = pos + 2;
    *sign = 0;
    if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) *sign = src_[j++];
    j = skip_space(j);
    if (!starts_with(j, "raw")) return std::string::npos;
    j = skip_space(j + 3);
    if (starts_with(j, "-%}")) return skip_space(j + 3);
    if (starts_with(j, "%}")) return j + 2;
    return std::string::npos;
  }

  void lex_tag(size_t tag) {
    std::string_view text(src_.data() + pos_, tag - pos_);
    char kind = src_[tag + 1];
    size_t after = tag + 2;
    char sign = 0;
    if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after];

    if (kind == '%') {
      char raw_sign = 0;
      size_t raw_end = match_raw_begin(tag, &raw_sign);
      if (raw_end != std::string::npos) {
        emit_data(pos_, control_before(text, raw_sign, false));
        line_starting_ = src_[raw_end - 1] == '\n';
        lex_raw_body(raw_end);
        return;
      }
    }
    emit_data(pos_, control_before(text, sign, kind == '{'));
    size_t start = after + (sign ? 1 : 0);
    if (kind == '#') {
      lex_comment(tag, start);
    } else {
      lex_expression_tag(tag, start, kind == '%');
    }
  }

  void lex_raw_body(size_t from) {
    // `(.*?)({%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?))`
    for (size_t k = src_.find("{%", from); k != std::string::npos; k = src_.find("{%", k + 1)) {
      size_t j = k + 2;
      char sign = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) sign = src_[j++];
      j = skip_space(j);
      if (!starts_with(j, "endraw")) continue;
      j = skip_space(j + 6);
      size_t end = match_block_end(j);
      if (end == std::string::npos) continue;
      emit_data(from, control_before(std::string_view(src_).substr(from, k - from), sign, false));
      pos_ = end;
      line_starting_ = src_[end - 1] == '\n';
      return;
    }
    if (from >= src_.size()) {  // as for comments: nothing left to be missing an end
      pos_ = src_.size();
      return;
    }
    syntax_error("Missing end of raw directive", line_at(from));
  }

  void lex_comment(size_t tag, size_t from) {
    for (size_t k = from; k < src_.size(); ++k) {
      size_t end = std::string::npos;
      if (starts_with(k, "+#}")) {
        end = k + 3;
      } else if (starts_with(k, "-#}")) {
        end = skip_space(k + 3);
      } else if (starts_with(k, "#}")) {
        end = k + 2;
        if (options_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
      }
      if (end != std::string::npos) {
        pos_ = end;
        line_starting_ = src_[end - 1] == '\n';
        return;
      }
    }
    // jinja2's failure rule needs one more character: a comment opened at the very end is dropped.
    if (from >= src_.size()) {
      pos_ = src_.size();
      return;
    }
    syntax_error("Missing end of comment tag", line_at(tag));
  }

  void lex_expression_tag(size_t tag, size_t from, bool block) {
    push(block ? TokenType::kBlockBegin : TokenType::kVariableBegin, "", tag);
    std::vector<char> balancing;
    size_t pos = from;
    while (pos < src_.size()) {
      if (balancing.empty()) {
        size_t end = std::string::npos;
        if (block) {
          end = match_block_end(pos);
        } else if (starts_with(pos, "-}}")) {
          end = skip_space(pos + 3);
        } else if (starts_with(pos, "}}")) {
          end = pos + 2;
        }
        if (end != std::string::npos) {
          push(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", pos);
          pos_ = end;
          line_starting_ = src_[end - 1] == '\n';
          return;
        }
      }
      size_t next = skip_space(pos);
      if (next != pos) {
        pos = next;
        continue;
      }
      pos = lex_literal_or_operator(pos, balancing);
    }
    // The source ended inside the tag; the parser reports what it expected.
    pos_ = src_.size();
  }

  size_t lex_number(size_t pos) {
    // float: (?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+)
    auto digits = [&](size_t p) {  // (\d+_)*\d+ ; returns end or npos
      size_t q = p;
      if (q >= src_.size() || !is_digit_ascii(src_[q])) return std::string::npos;
      while (true) {
        while (q < src_.size() && is_digit_ascii(src_[q])) ++q;
        if (q + 1 < src_.size() && src_[q] == '_' && is_digit_ascii(src_[q + 1])) {
          ++q;
          continue;
        }
        return q;
      }
    };
    bool after_dot = pos > 0 && src_[pos - 1] == '.';
    size_t int_end = digits(pos);
    if (!after_dot && int_end != std::string::npos) {
      size_t q = int_end;
      size_t frac_end = std::string::npos;
      if (q < src_.size() && src_[q] == '.') frac_end = digits(q + 1);
      size_t exp_from = frac_end != std::string::npos ? frac_end : q;
      size_t exp_end = std::string::npos;
      if (exp_from < src_.size() && (src_[exp_from] == 'e' || src_[exp_from] == 'E')) {
        size_t r = exp_from + 1;
        if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
        exp_end = digits(r);
      }
      size_t end = exp_end != std::string::npos ? exp_end : frac_end;
      if (end != std::string::npos) {
        std::string text;
        for (size_t k = pos; k < end; ++k) {
          if (src_[k] != '_') text += src_[k];
        }
        Token t;
        t.type = TokenType::kFloat;
        t.value = src_.substr(pos, end - pos);
        t.float_value = std::strtod(text.c_str(), nullptr);
        t.line = line_at(pos);
        tokens_.push_back(std::move(t));
        return end;
      }
    }
    // integer: 0b.., 0o.., 0x.., [1-9](_?\d)*, 0(_?0)*
    size_t end = pos;
    int base = 10;
    auto run = [&](size_t p, auto valid) {
      size_t q = p;
      while (q < src_.size()) {
        if (valid(src_[q])) {
          ++q;
        } else if (src_[q] == '_' && q + 1 < src_.size() && valid(src_[q + 1])) {
          q += 2;
        } else {
          break;
        }
      }
      return q;
    };
    char c0 = src_[pos];
    char c1 = pos + 1 < src_.size() ? char(std::tolower(static_cast<unsigned char>(src_[pos + 1]))) : 0;
    auto bin = [](char c) { return c == '0' || c == '1'; };
    auto oct = [](char c) { return c >= '0' && c <= '7'; };
    auto hexd = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
    auto dec = [](char c) { return is_digit_ascii(c); };
    if (c0 == '0' && (c1 == 'b' || c1 == 'o' || c1 == 'x')) {
      base = c1 == 'b' ? 2 : c1 == 'o' ? 8 : 16;
      size_t q = pos + 2;
      if (q < src_.size() && src_[q] == '_') ++q;
      size_t e = base == 2 ? run(q, bin) : base == 8 ? run(q, oct) : run(q, hexd);
      end = e > q ? e : pos + 1;
      if (e <= q) base = 10;
    }
    if (end == pos) {
      end = c0 == '0' ? run(pos + 1, [](char c) { return c == '0'; }) : run(pos + 1, dec);
    }
    std::string text;
    for (size_t k = pos + (base == 10 ? 0 : 2); k < end; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    Token t;
    t.type = TokenType::kInteger;
    t.value = src_.substr(pos, end - pos);
    errno = 0;
    unsigned long long v = std::strtoull(text.c_str(), nullptr, base);
    if (errno == ERANGE || v > uint64_t(INT64_MAX)) {
      throw TemplateError{ErrorKind::kUnsupported, "integer literal " + t.value + " does not fit in 64 bits",
                          line_at(pos)};
    }
    t.int_value = int64_t(v);
    t.line = line_at(pos);
    tokens_.push_back(std::move(t));
    return end;
  }

  size_t lex_literal_or_operator(size_t pos, std::vector<char>& balancing) {
    char c = src_[pos];
    if (is_digit_ascii(c)) return lex_number(pos);
    if (is_identifier_char(char_at(src_, pos).first, true)) {
      size_t end = pos;
      while (end < src_.size()) {
        auto [cp, len] = char_at(src_, end);
        if (!is_identifier_char(cp, false)) break;
        end += len;
      }
      push(TokenType::kName, src_.substr(pos, end - pos), pos);
      return end;
    }
    if (c == '\'' || c == '"') {
      for (size_t j = pos + 1; j < src_.size(); ++j) {
        if (src_[j] == '\\') {
          ++j;
        } else if (src_[j] == c) {
          int line = line_at(pos);
          push(TokenType::kString, unescape(std::string_view(src_).substr(pos + 1, j - pos - 1), line), pos);
          return j + 1;
        }
      }
      // An unterminated string is no string token; like jinja2 it then fails as an unknown char.
    }
    static constexpr std::array<std::string_view, 6> kTwoChar = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwoChar) {
      if (starts_with(pos, op)) {
        push(TokenType::kOperator, std::string(op), pos);
        return pos + 2;
      }
    }
    static constexpr std::string_view kOneChar = "+-/*%~[](){}><=.:|,;";
    if (kOneChar.find(c) != std::string_view::npos) {
      if (c == '{' || c == '(' || c == '[') {
        balancing.push_back(c == '{' ? '}' : c == '(' ? ')' : ']');
      } else if (c == '}' || c == ')' || c == ']') {
        if (balancing.empty()) syntax_error(fmt::format("unexpected '{}'", c), line_at(pos));
        char expected = balancing.back();
        balancing.pop_back();
        if (expected != c) syntax_error(fmt::format("unexpected '{}', expected '{}'", c, expected), line_at(pos));
      }
      push(TokenType::kOperator, std::string(1, c), pos);
      return pos + 1;
    }
    auto [cp, len] = char_at(src_, pos);
    std::string ch;
    append_utf8(ch, cp);
    syntax_error(fmt::format("unexpected char {} at {}", repr_string(ch), utf8_length(src_.substr(0, pos))),
                 line_at(pos));
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const Options& options) {
  return Lexer(source, options).run();
}

}  // namespace spill::jinja::detail
