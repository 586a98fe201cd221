// Byte-level BPE from tokenizer.json. Each stage mirrors the HF `tokenizers` code it must agree
// with (named in the comments), because agreement on ids is the whole contract.
#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <chrono>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <variant>

#include "core/error.h"
#include "core/json_limits.h"

namespace spill {
namespace {

using json = nlohmann::json;

// ---- UTF-8 -------------------------------------------------------------------------------

// One step of reading UTF-8 at s[i], following Unicode's table of well-formed byte sequences
// (Table 3-7): Char = `len` bytes form one character; Invalid = the `len` bytes are a maximal
// invalid subpart (one U+FFFD, as Rust's from_utf8_lossy counts them); Truncated = the `len`
// bytes at the end of s are a valid start of a character that s cuts off.
enum class Utf8Kind { Char, Invalid, Truncated };
struct Utf8Step {
  Utf8Kind kind;
  size_t len;
};

Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto b0 = uint8_t(s[i]);
  if (b0 < 0x80) return {Utf8Kind::Char, 1};
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte; later ones are 80..BF
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {Utf8Kind::Invalid, 1};
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) return {Utf8Kind::Truncated, k};
    const auto b = uint8_t(s[i + k]);
    if (b < lo || b > hi) return {Utf8Kind::Invalid, k};
    lo = 0x80;
    hi = 0xBF;
  }
  return {Utf8Kind::Char, need};
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Appends s to out, replacing invalid sequences with U+FFFD. Returns the bytes consumed: all of
// s when `final`, otherwise all but a trailing unfinished character (which the caller keeps).
size_t append_utf8_lossy(std::string_view s, std::string& out, bool final) {
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Step step = utf8_step(s, i);
    if (step.kind == Utf8Kind::Char) {
      out.append(s.substr(i, step.len));
    } else if (step.kind == Utf8Kind::Truncated && !final) {
      return i;
    } else {
      out.append(kReplacement);
    }
    i += step.len;
  }
  return i;
}

// Offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t first_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step step = utf8_step(s, i);
    if (step.kind != Utf8Kind::Char) return i;
    i += step.len;
  }
  return std::string_view::npos;
}

// Decodes the character at s[i] of well-formed UTF-8; sets len to its byte count.
char32_t decode_char(std::string_view s, size_t i, size_t& len) {
  const auto b0 = uint8_t(s[i]);
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  len = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return uint8_t(c) < 0x80; });
}

// Rust's char::is_whitespace (the Unicode White_Space property), used by lstrip/rstrip.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Approximates the regex crate's \w (Alphabetic, marks, decimal digits, connector punctuation,
// join controls) with general categories; used only by single_word added tokens.
bool is_word_char(char32_t c) {
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(utf8proc_int32_t(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// The last character of s (well-formed UTF-8, non-empty).
char32_t last_char(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80) --i;
  size_t len = 0;
  return decode_char(s, i, len);
}

// ---- ByteLevel: every byte stands for a printable character (GPT-2's bytes_to_unicode) ----

struct ByteLevelTable {
  std::array<std::string, 256> byte_to_char;  // UTF-8 of the character that stands for each byte
  std::array<int16_t, 324> char_to_byte;      // code point -> byte, or -1

  ByteLevelTable() {
    char_to_byte.fill(-1);
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      // Printable Latin-1 bytes stand for themselves; the rest are moved to U+0100 and up.
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const char32_t cp = printable ? char32_t(b) : char32_t(256 + next_extra++);
      append_utf8(byte_to_char[b], cp);
      char_to_byte[cp] = int16_t(b);
    }
  }
};

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table;
  return table;
}

std::string to_byte_level(std::string_view s) {
  const ByteLevelTable& t = byte_level_table();
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) out += t.byte_to_char[uint8_t(c)];
  return out;
}

// HF's ByteLevel decoder: a token whose characters all stand for bytes becomes those bytes;
// any other token (e.g. "<｜begin▁of▁sentence｜>") is kept as its own UTF-8.
std::string from_byte_level(std::string_view token) {
  const ByteLevelTable& t = byte_level_table();
  std::string out;
  for (size_t i = 0; i < token.size();) {
    size_t len = 0;
    const char32_t cp = decode_char(token, i, len);
    if (cp >= t.char_to_byte.size() || t.char_to_byte[cp] < 0) return std::string(token);
    out += char(t.char_to_byte[cp]);
    i += len;
  }
  return out;
}

// ---- Regex (PCRE2 standing in for HF's Oniguruma) -----------------------------------------

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* stack) const { pcre2_jit_stack_free(stack); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* ctx) const { pcre2_match_context_free(ctx); }
};

// Oniguruma writes \uHHHH; PCRE2 spells it \x{HHHH}. Everything else passes through.
std::string onig_to_pcre2(std::string_view pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 >= pattern.size()) {
      out += pattern[i];
      continue;
    }
    const bool hex4 = pattern[i + 1] == 'u' && i + 5 < pattern.size() &&
                      std::all_of(pattern.begin() + i + 2, pattern.begin() + i + 6,
                                  [](char c) { return std::isxdigit(uint8_t(c)) != 0; });
    if (hex4) {
      out += "\\x{";
      out.append(pattern.substr(i + 2, 4));
      out += '}';
      i += 5;
    } else {
      out += pattern[i];
      out += pattern[i + 1];  // keep escape pairs together so "\\u" stays a literal backslash + u
      ++i;
    }
  }
  return out;
}

// A pattern that matches `literal` exactly (HF's Split with a String pattern).
std::string escape_literal(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    // In PCRE2 a backslash before any ASCII non-alphanumeric character makes it literal.
    if (uint8_t(c) < 0x80 && !std::isalnum(uint8_t(c))) out += '\\';
    out += c;
  }
  return out;
}

// The time one encode() may spend in pre-tokenizer regexes. PCRE2's match limit bounds each
// match, but a pattern whose every match rescans the rest of the text (a lookahead to the end)
// is quadratic in total while each match stays under it: seconds per line of a hostile
// tokenizer.json. Real patterns run at tens of MB/s, so 1 s plus 1 s per MB is generous.
class EncodeBudget {
 public:
  static void start(size_t text_bytes) {
    deadline() = std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(1.0 + double(text_bytes) / 1e6));
    budget_seconds() = 1.0 + double(text_bytes) / 1e6;
    ticks() = 0;
  }
  // Cheap: reads the clock on every 16th call.
  static void check(const std::string& where, size_t subject_bytes) {
    if ((++ticks() & 15) != 0) return;
    if (std::chrono::steady_clock::now() <= deadline()) return;
    fail("{}: the pre-tokenizer regex took longer than {:.1f} s on a {}-byte piece of text: the pattern rescans the "
         "text on every match (e.g. a lookahead to the end); fix the tokenizer.json",
         where, budget_seconds(), subject_bytes);
  }

 private:
  static std::chrono::steady_clock::time_point& deadline() {
    thread_local std::chrono::steady_clock::time_point d = std::chrono::steady_clock::time_point::max();
    return d;
  }
  static double& budget_seconds() {
    thread_local double s = 0;
    return s;
  }
  static unsigned& ticks() {
    thread_local unsigned t = 0;
    return t;
  }
};

class Regex {
 public:
  // `where` names the pattern (file and field) in error messages.
  Regex(const std::string& pattern, std::string where) : where_(std::move(where)) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    const std::string translated = onig_to_pcre2(pattern);
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), PCRE2_UTF | PCRE2_UCP,
                              &error, &offset, nullptr));
    if (!code_) {
      fail("{}: cannot compile regex {:?}: {} (at offset {})", where_, pattern, pcre2_message(error), offset);
    }
    // JIT is only a speed-up: without it (e.g. on a platform PCRE2 cannot JIT for) matching
    // falls back to the interpreter with identical results.
    pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);
  }

  // Calls on_match(start, end) for each non-empty match, left to right, without overlap
  // (the find_iter HF uses). The subject must be well-formed UTF-8.
  template <class OnMatch>
  void for_each_match(std::string_view subject, OnMatch&& on_match) const {
    MatchState& state = match_state();
    // PCRE2's default of 10M steps per match is too few for a single match over a multi-MB
    // whitespace run (\s*[\r\n]+ scans it, then \s+ takes it); tokenizer regexes are linear, so
    // allow steps in proportion to the text while still stopping a runaway pattern.
    pcre2_set_match_limit(state.context.get(),
                          uint32_t(std::min<size_t>(UINT32_MAX, 10'000'000 + 64 * subject.size())));
    const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
    size_t pos = 0;
    while (pos < subject.size()) {
      const int rc = pcre2_match(code_.get(), data, subject.size(), pos, PCRE2_NO_UTF_CHECK, state.match_data.get(),
                                 state.context.get());
      if (rc == PCRE2_ERROR_NOMATCH) return;
      // rc == 0 only says the one-pair ovector had no room for capture groups; the whole match
      // (all we need) is still there.
      if (rc < 0) fail("{}: regex match failed: {}", where_, pcre2_message(rc));
      EncodeBudget::check(where_, subject.size());
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.match_data.get());
      const size_t start = ov[0], end = ov[1];
      if (end > start) {
        on_match(start, end);
        pos = end;
      } else {
        if (start >= subject.size()) return;
        size_t len = 0;
        decode_char(subject, start, len);
        pos = start + len;
      }
    }
  }

 private:
  static std::string pcre2_message(int error) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error, buffer, sizeof buffer);
    return reinterpret_cast<const char*>(buffer);
  }

  // Per-thread match scratch, so one compiled pattern serves concurrent encode() calls. The JIT
  // stack is larger than PCRE2's 32 KiB default so megabyte-long runs of one character class
  // (whitespace, a single huge "word") cannot exhaust it.
  struct MatchState {
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data{pcre2_match_data_create(1, nullptr)};
    std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack{pcre2_jit_stack_create(64 << 10, 8 << 20, nullptr)};
    std::unique_ptr<pcre2_match_context, MatchContextDeleter> context{pcre2_match_context_create(nullptr)};
    MatchState() { pcre2_jit_stack_assign(context.get(), nullptr, jit_stack.get()); }
  };
  static MatchState& match_state() {
    thread_local MatchState state;
    return state;
  }

  std::unique_ptr<pcre2_code, CodeDeleter> code_;
  std::string where_;
};

// ByteLevel's own regex (HF pre_tokenizers/byte_level.rs), used when use_regex is true.
const Regex& gpt2_regex() {
  static const Regex regex(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                           "ByteLevel pre-tokenizer");
  return regex;
}

// ---- Pre-tokenizer steps ------------------------------------------------------------------

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitStep {
  Regex regex;
  SplitBehavior behavior;
  bool invert;
};
struct ByteLevelStep {
  bool add_prefix_space;
  bool use_regex;
};
using PreTokenizerStep = std::variant<SplitStep, ByteLevelStep>;

// HF NormalizedString::split: the pattern cuts s into alternating match / non-match spans,
// then the behavior decides which spans merge or disappear. Empty results are dropped.
void split_piece(const Regex& regex, SplitBehavior behavior, bool invert, std::string_view s,
                 std::vector<std::string>& out) {
  if (s.empty()) return;
  struct Span {
    size_t start, end;
    bool flag;  // first "is a match", then (after the behavior) "remove"
  };
  std::vector<Span> spans;
  size_t prev = 0;
  regex.for_each_match(s, [&](size_t start, size_t end) {
    if (prev != start) spans.push_back({prev, start, false});
    spans.push_back({start, end, true});
    prev = end;
  });
  if (prev != s.size()) spans.push_back({prev, s.size(), false});
  if (invert) {
    for (Span& span : spans) span.flag = !span.flag;
  }

  std::vector<Span> result;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Removed:
      result = spans;
      break;
    case SplitBehavior::Isolated:
      for (const Span& span : spans) result.push_back({span.start, span.end, false});
      break;
    case SplitBehavior::Contiguous:
      for (const Span& span : spans) {
        if (span.flag == previous_match && !result.empty()) {
          result.back().end = span.end;
        } else {
          result.push_back({span.start, span.end, false});
        }
        previous_match = span.flag;
      }
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const Span& span : spans) {
        if (span.flag && !previous_match && !result.empty()) {
          result.back().end = span.end;
        } else {
          result.push_back({span.start, span.end, false});
        }
        previous_match = span.flag;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->flag && !previous_match && !result.empty()) {
          result.back().start = it->start;
        } else {
          result.push_back({it->start, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(result.begin(), result.end());
      break;
  }
  for (const Span& span : result) {
    if (!span.flag && span.end > span.start) out.emplace_back(s.substr(span.start, span.end - span.start));
  }
}

void apply_step(const PreTokenizerStep& step, std::string_view piece, std::vector<std::string>& out) {
  if (const auto* split = std::get_if<SplitStep>(&step)) {
    split_piece(split->regex, split->behavior, split->invert, piece, out);
    return;
  }
  const auto& byte_level = std::get<ByteLevelStep>(step);
  std::string text(piece);
  // HF prepends the space to every piece that reaches ByteLevel, not only the first one.
  if (byte_level.add_prefix_space && !text.empty() && text.front() != ' ') text.insert(0, " ");
  const size_t first = out.size();
  if (byte_level.use_regex) {
    split_piece(gpt2_regex(), SplitBehavior::Isolated, false, text, out);
  } else if (!text.empty()) {
    out.push_back(std::move(text));
  }
  for (size_t i = first; i < out.size(); ++i) out[i] = to_byte_level(out[i]);
}

// ---- Added tokens ---------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A piece of text after added tokens are cut out: plain text (id < 0) or one added token.
struct Segment {
  std::string_view text;
  int32_t id = -1;
};

// Leftmost-longest, non-overlapping matching of added-token contents (what HF's Aho-Corasick
// trie with MatchKind::LeftmostLongest does), then HF's single_word/lstrip/rstrip rules.
// Candidates are bucketed by first byte, longest first: a few hundred tokens that almost all
// start with '<' cost a handful of compares per '<' in the text.
class AddedTokenMatcher {
 public:
  void add(std::string pattern, size_t token_index) {
    if (pattern.empty()) return;
    buckets_[uint8_t(pattern[0])].push_back({std::move(pattern), token_index});
    any_ = true;
  }
  void finish() {
    for (auto& bucket : buckets_) {
      std::stable_sort(bucket.begin(), bucket.end(),
                       [](const Candidate& a, const Candidate& b) { return a.pattern.size() > b.pattern.size(); });
    }
  }

  // `untrusted`: spans of s (sorted) where special tokens may not match; `no_special`: none may.
  void split(std::string_view s, const std::vector<AddedToken>& tokens, std::vector<Segment>& out,
             std::span<const TextSpan> untrusted = {}, bool no_special = false) const {
    if (s.empty()) return;
    if (!any_) {
      out.push_back({s, -1});
      return;
    }
    size_t start_offset = 0;  // end of the last emitted token
    for (size_t i = 0; i < s.size();) {
      const Candidate* found = nullptr;
      for (const Candidate& c : buckets_[uint8_t(s[i])]) {
        if (!s.substr(i).starts_with(c.pattern)) continue;
        // A special token is not read out of text a client wrote: there it stays plain text.
        if (tokens[c.token_index].special && (no_special || overlaps(untrusted, i, i + c.pattern.size()))) continue;
        found = &c;
        break;
      }
      if (!found) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + found->pattern.size();
      const AddedToken& token = tokens[found->token_index];
      i = stop;  // the next search starts after the match itself, stripping does not move it
      if (token.single_word) {
        const bool free_before = start == 0 || !is_word_char(last_char(s.substr(0, start)));
        size_t len = 0;
        const bool free_after = stop == s.size() || !is_word_char(decode_char(s, stop, len));
        if (!free_before || !free_after) continue;
      }
      if (token.lstrip) {
        size_t new_start = start;
        while (new_start > 0 && is_white_space(last_char(s.substr(0, new_start)))) {
          do --new_start;
          while (new_start > 0 && (uint8_t(s[new_start]) & 0xC0) == 0x80);
        }
        start = std::max(new_start, start_offset);  // never reach back into the previous token
      }
      if (token.rstrip) {
        size_t len = 0;
        while (stop < s.size() && is_white_space(decode_char(s, stop, len))) stop += len;
      }
      if (start_offset < start) out.push_back({s.substr(start_offset, start - start_offset), -1});
      out.push_back({s.substr(start, stop - start), token.id});
      start_offset = stop;
    }
    if (start_offset < s.size()) out.push_back({s.substr(start_offset), -1});
  }

 private:
  static bool overlaps(std::span<const TextSpan> spans, size_t begin, size_t end) {
    // First span that ends after begin.
    auto it = std::upper_bound(spans.begin(), spans.end(), begin,
                               [](size_t b, const TextSpan& span) { return b < span.end; });
    return it != spans.end() && it->begin < end;
  }
  struct Candidate {
    std::string pattern;
    size_t token_index;
  };
  std::array<std::vector<Candidate>, 256> buckets_;
  bool any_ = false;
};

// ---- JSON reading with errors that say where -------------------------------------------------

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class T>
using StringMap = std::unordered_map<std::string, T, StringHash, std::equal_to<>>;

constexpr std::string_view kSupported =
    "spill reads byte-level BPE tokenizer.json files (GPT-2, Llama-3, Qwen2/3, DeepSeek-V3, gpt-oss, GLM-4.5)";

// A field that is absent or JSON null.
bool missing(const json& obj, const char* key) {
  return !obj.contains(key) || obj.at(key).is_null();
}

}  // namespace

// ---- The loaded tokenizer -----------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string origin;  // file path, for messages

  std::vector<utf8proc_option_t> normalizers;  // applied in order
  std::vector<PreTokenizerStep> pre_tokenizer;

  // BPE model.
  StringMap<int32_t> vocab;  // token in byte-level spelling -> id
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id) -> rank, result
  bool ignore_merges = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;

  std::vector<AddedToken> added;
  StringMap<int32_t> added_ids;        // content -> id
  AddedTokenMatcher raw_added;         // tokens matched before normalization
  AddedTokenMatcher normalized_added;  // tokens matched in normalized text

  // Decode tables, indexed by id.
  std::vector<std::string> id_bytes;
  enum : uint8_t { kExists = 1, kSpecial = 2 };
  std::vector<uint8_t> id_flags;

  // Post-processor, for encode(add_special=true).
  std::vector<int32_t> special_prefix, special_suffix;
  std::string post_processor_problem;  // non-empty: add_special is refused with this message

  // Word -> ids cache. Bounded: when full it is cleared, so memory stays flat whatever text
  // comes in, and the hot words of the current traffic refill it at once.
  static constexpr size_t kCacheCapacity = 32768;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;

  std::string normalize(std::string_view text) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;
  std::vector<int32_t> merge_word(std::string_view word) const;
  void append_bytes(int32_t id, bool skip_special, std::string& out) const;
};

std::string Tokenizer::Impl::normalize(std::string_view text) const {
  // ASCII is invariant under every normalization form.
  if (normalizers.empty() || is_ascii(text)) return std::string(text);
  std::string current(text);
  for (utf8proc_option_t options : normalizers) {
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(current.data()),
                                            utf8proc_ssize_t(current.size()), &result, options);
    if (n < 0) fail("{}: cannot normalize text: {}", origin, utf8proc_errmsg(n));
    current.assign(reinterpret_cast<const char*>(result), size_t(n));
    std::free(result);
  }
  return current;
}

// Text with no added tokens in it: pre-tokenize, then BPE each piece.
void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::string> pieces{std::string(text)}, next;
  for (const PreTokenizerStep& step : pre_tokenizer) {
    next.clear();
    for (const std::string& piece : pieces) apply_step(step, piece, next);
    std::swap(pieces, next);
  }
  for (const std::string& piece : pieces) encode_word(piece, ids);
}

// HF BPE::tokenize_with_cache.
void Tokenizer::Impl::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (auto it = vocab.find(word); it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (auto it = cache.find(word); it != cache.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word_ids = merge_word(word);
  ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex);
    if (cache.size() >= kCacheCapacity) cache.clear();
    cache.emplace(std::string(word), std::move(word_ids));
  }
}

// HF BPE::merge_word + Word::merge_all: characters become symbols, then the lowest-ranked
// adjacent pair (leftmost on ties) merges until none is in the merge table. A heap of
// candidate pairs and a linked list of symbols make this O(n log n) for long words; heap
// entries made stale by an earlier merge are recognised and dropped when popped.
std::vector<int32_t> Tokenizer::Impl::merge_word(std::string_view word) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // neighbours in the list, -1 at the ends
    bool removed;        // merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    const auto n = int32_t(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, false});
  };

  // Characters missing from the vocab become unk_token (runs fused if fuse_unk), or are dropped
  // when the model has no unk_token, exactly as HF does.
  bool pending_unk = false;
  for (size_t i = 0; i < word.size();) {
    size_t len = 0;
    decode_char(word, i, len);
    if (auto it = vocab.find(word.substr(i, len)); it != vocab.end()) {
      if (pending_unk) add(unk_id);
      pending_unk = false;
      add(it->second);
    } else if (unk_id >= 0) {
      if (pending_unk && !fuse_unk) add(unk_id);
      pending_unk = true;
    }
    i += len;
  }
  if (pending_unk) add(unk_id);

  auto find_merge = [&](int32_t left, int32_t right) -> const Merge* {
    auto it = merges.find((uint64_t(uint32_t(left)) << 32) | uint32_t(right));
    return it == merges.end() ? nullptr : &it->second;
  };
  struct Candidate {
    int32_t rank, pos, merged_id;
  };
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  for (int32_t i = 0; i + 1 < int32_t(symbols.size()); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) queue.push({m->rank, i, m->merged_id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    const Symbol right = symbols[left.next];
    const Merge* m = find_merge(left.id, right.id);
    if (!m || m->merged_id != top.merged_id) continue;  // stale: a neighbour changed since

    const int32_t right_pos = left.next;
    left.id = top.merged_id;
    left.next = right.next;
    symbols[right_pos].removed = true;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* pm = find_merge(symbols[left.prev].id, left.id)) {
        queue.push({pm->rank, left.prev, pm->merged_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* nm = find_merge(left.id, symbols[left.next].id)) {
        queue.push({nm->rank, top.pos, nm->merged_id});
      }
    }
  }

  std::vector<int32_t> ids;
  for (const Symbol& s : symbols) {
    if (!s.removed) ids.push_back(s.id);
  }
  return ids;
}

void Tokenizer::Impl::append_bytes(int32_t id, bool skip_special, std::string& out) const {
  if (id < 0 || size_t(id) >= id_flags.size() || !(id_flags[id] & kExists)) return;
  if (skip_special && (id_flags[id] & kSpecial)) return;
  out += id_bytes[id];
}

// ---- Loading -----------------------------------------------------------------------------------

namespace {

class Loader {
 public:
  Loader(const std::string& origin, Tokenizer::Impl& impl) : origin_(origin), impl_(impl) {}

  [[noreturn]] void malformed(std::string_view field, std::string_view problem) const {
    fail("{}: malformed tokenizer.json: {}: {}", origin_, field, problem);
  }
  [[noreturn]] void unsupported(std::string_view field, std::string_view what) const {
    fail("{}: unsupported tokenizer: {} {}; {}", origin_, field, what, kSupported);
  }

  const json& object(const json& j, std::string_view field) const {
    if (!j.is_object()) malformed(field, fmt::format("expected an object, found {}", j.type_name()));
    return j;
  }
  std::string type_of(const json& j, std::string_view field) const {
    object(j, field);
    if (!j.contains("type") || !j.at("type").is_string()) malformed(field, "missing \"type\"");
    return j.at("type").get<std::string>();
  }
  bool flag(const json& obj, const char* key, bool default_value, std::string_view field) const {
    if (missing(obj, key)) return default_value;
    if (!obj.at(key).is_boolean()) malformed(fmt::format("{}.{}", field, key), "expected true or false");
    return obj.at(key).get<bool>();
  }
  std::string string(const json& j, std::string_view field) const {
    if (!j.is_string()) malformed(field, fmt::format("expected a string, found {}", j.type_name()));
    return j.get<std::string>();
  }
  // Ids index the decode tables, so they are bounded well above any real vocabulary (~260k)
  // but far below what would make those tables a memory bomb.
  static constexpr int64_t kMaxId = (1 << 24) - 1;
  static std::optional<int32_t> as_id(const json& j) {
    if (!j.is_number_integer() || j.get<int64_t>() < 0 || j.get<int64_t>() > kMaxId) return std::nullopt;
    return int32_t(j.get<int64_t>());
  }
  [[noreturn]] void bad_id(std::string_view field, const json& j) const {
    malformed(field, fmt::format("expected a token id (integer 0..{}), found {}", kMaxId, describe_json(j)));
  }
  int32_t id(const json& j, std::string_view field) const {
    if (auto v = as_id(j)) return *v;
    bad_id(field, j);
  }
  const json& array(const json& obj, const char* key, std::string_view field) const {
    if (!obj.contains(key) || !obj.at(key).is_array()) malformed(field, fmt::format("missing array \"{}\"", key));
    return obj.at(key);
  }

  // Sequences nest; a hostile file must not recurse us off the stack.
  void check_depth(const std::string& field, int depth) const {
    if (depth > 16) malformed(field, "Sequence nested more than 16 deep");
  }

  void load(const json& root) {
    object(root, "top level");
    if (missing(root, "model")) malformed("model", "missing; a tokenizer.json needs a \"model\" section");
    // Refusals first, so a SentencePiece file gets the clear "unsupported" answer and not a
    // complaint about some field further down.
    check_model(root.at("model"));
    if (!missing(root, "normalizer")) load_normalizer(root.at("normalizer"), "normalizer");
    if (!missing(root, "pre_tokenizer")) load_pre_tokenizer(root.at("pre_tokenizer"), "pre_tokenizer");
    if (!missing(root, "decoder")) check_decoder(root.at("decoder"), "decoder");
    load_vocab_and_merges(root.at("model"));
    if (!missing(root, "added_tokens")) load_added_tokens(root.at("added_tokens"));
    build_decode_tables();
    if (!missing(root, "post_processor")) load_post_processor(root.at("post_processor"), "post_processor");
  }

 private:
  // The model's kind and options; the vocab and merges come after the other sections pass.
  void check_model(const json& model) {
    std::string type;
    if (model.is_object() && !model.contains("type") && model.contains("merges")) {
      type = "BPE";  // files written before models carried a "type"
    } else {
      type = type_of(model, "model");
    }
    if (type == "Unigram") unsupported("model.type", "is Unigram (a SentencePiece model)");
    if (type != "BPE") unsupported("model.type", fmt::format("is {:?}; only BPE is supported", type));
    if (flag(model, "byte_fallback", false, "model")) {
      unsupported("model.byte_fallback",
                  "is true (SentencePiece-style BPE with <0xNN> byte tokens, as in Llama-2/Mistral)");
    }
    if (!missing(model, "dropout")) {
      const json& dropout = model.at("dropout");
      if (!dropout.is_number()) malformed("model.dropout", "expected a number or null");
      if (dropout.get<double>() != 0.0)
        unsupported("model.dropout", "is set (BPE dropout is for training; set it to null)");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (!missing(model, key) && !string(model.at(key), fmt::format("model.{}", key)).empty()) {
        unsupported(fmt::format("model.{}", key), "is set (not byte-level BPE)");
      }
    }
    impl_.ignore_merges = flag(model, "ignore_merges", false, "model");
    impl_.fuse_unk = flag(model, "fuse_unk", false, "model");
  }

  void load_vocab_and_merges(const json& model) {
    if (missing(model, "vocab") || !model.at("vocab").is_object())
      malformed("model.vocab", "missing (expected an object of token -> id)");
    const json& vocab = model.at("vocab");
    impl_.vocab.reserve(vocab.size());
    std::vector<std::pair<int32_t, std::string_view>> by_id;  // to find ids given twice
    by_id.reserve(vocab.size());
    for (const auto& [token, value] : vocab.items()) {
      const std::optional<int32_t> token_id = as_id(value);
      if (!token_id) bad_id(fmt::format("model.vocab[{:?}]", token), value);
      const auto it = impl_.vocab.emplace(token, *token_id).first;
      by_id.emplace_back(*token_id, it->first);
    }
    std::sort(by_id.begin(), by_id.end());
    for (size_t i = 1; i < by_id.size(); ++i) {
      if (by_id[i].first == by_id[i - 1].first) {
        malformed("model.vocab", fmt::format("id {} is given to both {:?} and {:?}", by_id[i].first,
                                             by_id[i - 1].second, by_id[i].second));
      }
    }

    if (!missing(model, "unk_token")) {
      const std::string unk = string(model.at("unk_token"), "model.unk_token");
      auto it = impl_.vocab.find(unk);
      if (it == impl_.vocab.end()) malformed("model.unk_token", fmt::format("{:?} is not in model.vocab", unk));
      impl_.unk_id = it->second;
    }

    const json& merges = array(model, "merges", "model.merges");
    impl_.merges.reserve(merges.size());
    int32_t rank = 0;
    std::string joined;
    for (size_t i = 0; i < merges.size(); ++i) {
      auto field = [i] { return fmt::format("model.merges[{}]", i); };  // built only for errors
      std::string_view left, right;
      const json& m = merges[i];
      // Both spellings occur in the wild: "a b" (older files) and ["a", "b"] (tokenizers >= 0.20).
      if (m.is_string()) {
        const std::string_view line = m.get_ref<const std::string&>();
        if (line.starts_with("#version")) continue;  // merges.txt header, skipped by HF too
        const size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
          malformed(field(), fmt::format("{:?} is not two tokens separated by one space", line));
        }
        left = line.substr(0, space);
        right = line.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get_ref<const std::string&>();
        right = m[1].get_ref<const std::string&>();
      } else {
        malformed(field(), fmt::format("expected \"a b\" or [\"a\", \"b\"], found {}", describe_json(m)));
      }
      auto lookup = [&](std::string_view token) {
        auto it = impl_.vocab.find(token);
        if (it == impl_.vocab.end()) malformed(field(), fmt::format("token {:?} is not in model.vocab", token));
        return it->second;
      };
      joined.assign(left).append(right);
      const int32_t a = lookup(left), b = lookup(right), merged = lookup(joined);
      // A repeated pair takes its later rank, as HF's HashMap collect does.
      impl_.merges.insert_or_assign((uint64_t(uint32_t(a)) << 32) | uint32_t(b),
                                    Tokenizer::Impl::Merge{rank++, merged});
    }
  }

  void load_normalizer(const json& j, const std::string& field, int depth = 0) {
    check_depth(field, depth);
    const std::string type = type_of(j, field);
    if (type == "Sequence") {
      const json& list = array(j, "normalizers", field + ".normalizers");
      for (size_t i = 0; i < list.size(); ++i)
        load_normalizer(list[i], fmt::format("{}.normalizers[{}]", field, i), depth + 1);
    } else if (type == "NFC") {
      impl_.normalizers.push_back(utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    } else if (type == "NFD") {
      impl_.normalizers.push_back(utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
    } else if (type == "NFKC") {
      impl_.normalizers.push_back(utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
    } else if (type == "NFKD") {
      impl_.normalizers.push_back(utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
    } else if (type == "Replace" || type == "Prepend" || type == "Precompiled") {
      unsupported(field, fmt::format("is {:?} (a SentencePiece-style normalizer)", type));
    } else {
      unsupported(field, fmt::format("is {:?}; supported normalizers: NFC, NFD, NFKC, NFKD, Sequence", type));
    }
  }

  void load_pre_tokenizer(const json& j, const std::string& field, int depth = 0) {
    check_depth(field, depth);
    const std::string type = type_of(j, field);
    if (type == "Sequence") {
      const json& list = array(j, "pretokenizers", field + ".pretokenizers");
      for (size_t i = 0; i < list.size(); ++i)
        load_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", field, i), depth + 1);
    } else if (type == "Split") {
      if (!j.contains("pattern") || !j.at("pattern").is_object())
        malformed(field + ".pattern", "missing (expected {\"Regex\": ...} or {\"String\": ...})");
      const json& pattern = j.at("pattern");
      std::string regex;
      if (pattern.contains("Regex")) {
        regex = string(pattern.at("Regex"), field + ".pattern.Regex");
      } else if (pattern.contains("String")) {
        regex = escape_literal(string(pattern.at("String"), field + ".pattern.String"));
      } else {
        malformed(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
      }
      const std::string behavior = missing(j, "behavior") ? "" : string(j.at("behavior"), field + ".behavior");
      static const std::pair<std::string_view, SplitBehavior> kBehaviors[] = {
          {"Removed", SplitBehavior::Removed},
          {"Isolated", SplitBehavior::Isolated},
          {"MergedWithPrevious", SplitBehavior::MergedWithPrevious},
          {"MergedWithNext", SplitBehavior::MergedWithNext},
          {"Contiguous", SplitBehavior::Contiguous}};
      auto it = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                             [&](const auto& b) { return b.first == behavior; });
      if (it == std::end(kBehaviors)) {
        malformed(field + ".behavior",
                  fmt::format("{:?} is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous",
                              behavior));
      }
      impl_.pre_tokenizer.emplace_back(SplitStep{Regex(regex, fmt::format("{}: {}.pattern", origin_, field)),
                                                 it->second, flag(j, "invert", false, field)});
    } else if (type == "ByteLevel") {
      impl_.pre_tokenizer.emplace_back(
          ByteLevelStep{flag(j, "add_prefix_space", true, field), flag(j, "use_regex", true, field)});
    } else if (type == "Digits") {
      // HF: split on char::is_numeric, each digit alone or runs of digits together.
      const bool individual = flag(j, "individual_digits", false, field);
      impl_.pre_tokenizer.emplace_back(SplitStep{Regex(R"(\p{N})", fmt::format("{}: {}", origin_, field)),
                                                 individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous,
                                                 false});
    } else if (type == "Metaspace") {
      unsupported(field, "is Metaspace (SentencePiece-style \"▁\" word boundaries)");
    } else {
      unsupported(field, fmt::format("is {:?}; supported pre-tokenizers: Split, ByteLevel, Digits, Sequence", type));
    }
  }

  // Decoding is always byte-level; other decoders would need their own implementation.
  void check_decoder(const json& j, const std::string& field, int depth = 0) {
    check_depth(field, depth);
    const std::string type = type_of(j, field);
    if (type == "ByteLevel") return;
    if (type == "Sequence") {
      const json& list = array(j, "decoders", field + ".decoders");
      for (size_t i = 0; i < list.size(); ++i)
        check_decoder(list[i], fmt::format("{}.decoders[{}]", field, i), depth + 1);
    } else if (type == "Metaspace" || type == "ByteFallback" || type == "Fuse" || type == "Strip" ||
               type == "Replace") {
      unsupported(field, fmt::format("is {:?} (a SentencePiece-style decoder)", type));
    } else {
      unsupported(field, fmt::format("is {:?}; only the ByteLevel decoder is supported", type));
    }
  }

  void load_added_tokens(const json& list) {
    if (!list.is_array()) malformed("added_tokens", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string field = fmt::format("added_tokens[{}]", i);
      const json& t = object(list[i], field);
      if (!t.contains("content")) malformed(field, "missing \"content\"");
      if (!t.contains("id")) malformed(field, "missing \"id\"");
      AddedToken token;
      token.content = string(t.at("content"), field + ".content");
      token.id = id(t.at("id"), field + ".id");
      if (token.content.empty()) continue;  // HF ignores empty added tokens
      if (first_invalid_utf8(token.content) != std::string_view::npos) malformed(field + ".content", "not valid UTF-8");
      // HF gives a token that is also in the vocab the vocab's id, whatever the file says.
      if (auto it = impl_.vocab.find(token.content); it != impl_.vocab.end()) token.id = it->second;
      token.special = flag(t, "special", false, field);
      token.lstrip = flag(t, "lstrip", false, field);
      token.rstrip = flag(t, "rstrip", false, field);
      token.single_word = flag(t, "single_word", false, field);
      token.normalized = flag(t, "normalized", !token.special, field);
      impl_.added.push_back(std::move(token));
    }
    for (size_t i = 0; i < impl_.added.size(); ++i) {
      const AddedToken& token = impl_.added[i];
      impl_.added_ids.insert_or_assign(token.content, token.id);
      // Normalized tokens are looked for in normalized text, so they are normalized too.
      if (token.normalized) {
        impl_.normalized_added.add(impl_.normalize(token.content), i);
      } else {
        impl_.raw_added.add(token.content, i);
      }
    }
    impl_.raw_added.finish();
    impl_.normalized_added.finish();
  }

  void build_decode_tables() {
    int32_t size = 0;
    for (const auto& [token, id] : impl_.vocab) size = std::max(size, id + 1);
    for (const AddedToken& t : impl_.added) size = std::max(size, t.id + 1);
    impl_.id_bytes.assign(size_t(size), {});
    impl_.id_flags.assign(size_t(size), 0);
    for (const auto& [token, id] : impl_.vocab) {
      impl_.id_bytes[id] = from_byte_level(token);
      impl_.id_flags[id] = Tokenizer::Impl::kExists;
    }
    // An added token's id names it in decode even if the vocab has the same id (HF looks in
    // the added vocabulary first). Like HF 0.23, a normalized token decodes to its normalized
    // form (NFKC turns "\uFB01x" into "fix").
    for (const AddedToken& t : impl_.added) {
      impl_.id_bytes[t.id] = from_byte_level(t.normalized ? impl_.normalize(t.content) : t.content);
      impl_.id_flags[t.id] = Tokenizer::Impl::kExists | (t.special ? Tokenizer::Impl::kSpecial : 0);
    }
  }

  void load_post_processor(const json& j, const std::string& field, int depth = 0) {
    check_depth(field, depth);
    const std::string type = type_of(j, field);
    std::vector<int32_t> prefix, suffix;
    auto token_id = [&](const json& pair, const std::string& where) {
      // Bert/Roberta write ["[CLS]", 101].
      if (!pair.is_array() || pair.size() != 2) malformed(where, "expected [token, id]");
      return id(pair[1], where + "[1]");
    };
    if (type == "ByteLevel") {
      return;  // only trims offsets
    } else if (type == "Sequence") {
      const json& list = array(j, "processors", field + ".processors");
      for (size_t i = 0; i < list.size(); ++i)
        load_post_processor(list[i], fmt::format("{}.processors[{}]", field, i), depth + 1);
      return;
    } else if (type == "TemplateProcessing") {
      const json& single = array(j, "single", field + ".single");
      bool seen_sequence = false;
      for (size_t i = 0; i < single.size(); ++i) {
        const std::string where = fmt::format("{}.single[{}]", field, i);
        const json& piece = object(single[i], where);
        if (piece.contains("Sequence")) {
          seen_sequence = true;
        } else if (piece.contains("SpecialToken") && piece.at("SpecialToken").contains("id")) {
          const std::string name = string(piece.at("SpecialToken").at("id"), where + ".SpecialToken.id");
          if (!j.contains("special_tokens") || !j.at("special_tokens").contains(name)) {
            malformed(where, fmt::format("special token {:?} is not in {}.special_tokens", name, field));
          }
          const std::string ids_field = fmt::format("{}.special_tokens[{:?}].ids", field, name);
          const json& entry = j.at("special_tokens").at(name);
          if (!entry.is_object() || !entry.contains("ids") || !entry.at("ids").is_array())
            malformed(ids_field, "missing");
          for (const json& v : entry.at("ids")) (seen_sequence ? suffix : prefix).push_back(id(v, ids_field));
        } else {
          malformed(where, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
        }
      }
    } else if (type == "BertProcessing" || type == "RobertaProcessing") {
      if (!j.contains("cls") || !j.contains("sep")) malformed(field, "missing \"cls\" or \"sep\"");
      prefix.push_back(token_id(j.at("cls"), field + ".cls"));
      suffix.push_back(token_id(j.at("sep"), field + ".sep"));
    } else {
      impl_.post_processor_problem =
          fmt::format("{}: {} is {:?}, which spill cannot apply; encode without add_special", origin_, field, type);
      return;
    }
    // Later processors wrap the output of earlier ones.
    impl_.special_prefix.insert(impl_.special_prefix.begin(), prefix.begin(), prefix.end());
    impl_.special_suffix.insert(impl_.special_suffix.end(), suffix.begin(), suffix.end());
  }

  const std::string& origin_;
  Tokenizer::Impl& impl_;
};

}  // namespace

// ---- Public API ----------------------------------------------------------------------------------

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("{}: cannot open tokenizer file: {}", path, std::strerror(errno));
  std::string text;
  file.seekg(0, std::ios::end);
  text.resize(size_t(file.tellg()));
  file.seekg(0, std::ios::beg);
  file.read(text.data(), std::streamsize(text.size()));
  if (!file) fail("{}: cannot read tokenizer file", path);
  return from_json(text, path);
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& origin) {
  std::string why;
  std::optional<json> parsed = try_parse_json<json>(json_text, &why);
  if (!parsed) fail("{} {}; is the file complete?", origin, why);
  json root = std::move(*parsed);
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  Loader(origin, *impl).load(root);
  return Tokenizer(std::move(impl));
}

std::string byte_level_spelling(std::string_view bytes) { return to_byte_level(bytes); }

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  return encode(text, add_special, {});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       std::span<const TextSpan> untrusted) const {
  const Impl& m = *impl_;
  if (const size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    fail("cannot tokenize: text is not valid UTF-8 (byte 0x{:02X} at offset {})", uint8_t(text[bad]), bad);
  }
  if (add_special && !m.post_processor_problem.empty()) fail("{}", m.post_processor_problem);
  EncodeBudget::start(text.size());

  std::vector<int32_t> ids;
  if (add_special) ids = m.special_prefix;
  // HF AddedVocabulary::extract_and_normalize, then pre-tokenize and BPE the plain pieces.
  std::vector<Segment> raw, normalized;
  m.raw_added.split(text, m.added, raw, untrusted);
  for (const Segment& segment : raw) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    const std::string text_normalized = m.normalize(segment.text);
    normalized.clear();
    // Normalization moves bytes, so spans do not map into the normalized piece: a piece that
    // touches untrusted text gets no special tokens at all from the normalized pass (special
    // tokens are normalized=false in every real tokenizer, so this never changes real ids).
    const size_t piece_begin = size_t(segment.text.data() - text.data());
    bool touches_untrusted = false;
    for (const TextSpan& span : untrusted)
      touches_untrusted |= span.begin < piece_begin + segment.text.size() && span.end > piece_begin;
    m.normalized_added.split(text_normalized, m.added, normalized, {}, touches_untrusted);
    for (const Segment& piece : normalized) {
      if (piece.id >= 0) {
        ids.push_back(piece.id);
      } else {
        m.encode_plain(piece.text, ids);
      }
    }
  }
  if (add_special) ids.insert(ids.end(), m.special_suffix.begin(), m.special_suffix.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) impl_->append_bytes(id, skip_special, bytes);
  std::string text;
  text.reserve(bytes.size());
  append_utf8_lossy(bytes, text, /*final=*/true);
  return text;
}

std::string Tokenizer::token_text(int32_t id) const {
  std::string out;
  impl_->append_bytes(id, false, out);
  return out;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

int32_t Tokenizer::vocab_size() const {
  return int32_t(impl_->id_bytes.size());
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->id_flags.size() && (impl_->id_flags[id] & Impl::kSpecial);
}

StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool skip_special)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  tokenizer_.impl_->append_bytes(id, skip_special_, pending_);
  std::string out;
  pending_.erase(0, append_utf8_lossy(pending_, out, /*final=*/false));
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  append_utf8_lossy(pending_, out, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace spill
