// A Jinja2 interpreter for the subset of the language Hugging Face chat templates use, with the
// semantics of Python's jinja2 as transformers runs it (ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and the loopcontrols extension): same output byte for byte, same
// places where it raises.
//
// Source -> tokens (lexer: delimiters, whitespace control, raw blocks) -> AST (parser: statements
// and Python-precedence expressions) -> output (interpreter over values converted from JSON).
//
// Supported (each checked against jinja2 by tests/jinja_test.cpp and the real templates in
// tests/data/chat_templates, see tests/chat_template_test.cpp):
//   statements  if/elif/else, for (tuple targets, `if` filter, else, loop.*), set (names, tuples,
//               namespace attributes, block set with filters), macro (defaults, varargs, kwargs,
//               caller), call blocks, filter blocks, with, raw, break/continue, generation (its
//               markers are ignored, the body is rendered), print, comments
//   expressions literals (strings with Python escapes, ints, floats, lists, tuples, dicts),
//               attribute/item access, slices, calls with keyword args and *args/**kwargs,
//               filters, tests (`is`, `is not`), + - * / // % ** ~, comparisons (chained),
//               in / not in, and/or/not, `a if c else b`, str % args
//   filters     abs attr capitalize center count d default dictsort e escape first float
//               forceescape format indent int items join last length list lower map max min
//               reject rejectattr replace reverse round safe select selectattr sort string sum
//               title tojson trim unique upper wordcount
//   tests       boolean callable defined divisibleby eq equalto escaped even false filter float
//               ge gt greaterthan in integer iterable le lessthan lower lt mapping ne none number
//               odd sameas sequence string test true undefined upper == != < <= > >=
//   methods     str: capitalize casefold center count endswith find format index isalnum isalpha
//               isascii isdecimal isdigit islower isnumeric isspace istitle isupper join ljust
//               lower lstrip partition removeprefix removesuffix replace rfind rindex rjust
//               rpartition rsplit rstrip split splitlines startswith strip swapcase title upper
//               zfill; dict: get items keys values copy; list/tuple: count index copy
//   globals     range namespace dict joiner raise_exception strftime_now (plus the caller's)
// Values print like Python's str(): None, True, 1.0, 1e-05, ['a', 1], {'k': 'v'}. tojson is
// transformers' json.dumps(ensure_ascii=False, indent, separators, sort_keys). Strings are
// Unicode code points for len(), indexing, slicing and case mapping (full mappings: "ß".upper()
// is "SS"). The sandbox is ImmutableSandboxedEnvironment's: list.append, dict.update and other
// mutators, and __dunder__ attributes, are undefined values that raise SecurityError when used.
//
// Undefined names and missing keys behave like jinja2's default Undefined: falsy, print as "",
// iterate as empty; attribute access, arithmetic or calls on them raise.
//
// Errors (all spill::Error): syntax errors and unknown filters/tests when the template is built
// (unknown ones inside if/else wait until they run, as in jinja2), runtime errors when it renders,
// both "<name>:<line>: <jinja2 exception class>: <message>" with jinja2's line and message (e.g.
// "template:3: TypeError: can only concatenate str (not \"int\") to str"); raise_exception(msg)
// throws an Error whose what() is exactly msg.
//
// Not supported: extends/block/include/import, recursive loops, autoescape, line statements,
// custom delimiters (syntax errors name them); the filters batch, filesizeformat, groupby, pprint,
// random, slice, striptags, truncate, urlencode, urlize, wordwrap and xmlattr (an error when they
// run). Known differences from Python, none reachable by the chat templates under tests/data:
// integers are 64-bit (overflow raises OverflowError), safe/escape return plain strings (no Markup
// arithmetic), objects without a stable text print differently (bound methods, generators print
// as "<generator object>", dict.keys()/items()/values() and range() are plain lists), generators
// can be iterated more than once, more than 200 nested macro calls raise RecursionError, and
// Unicode character classes come from utf8proc rather than Python's unicodedata.
#pragma once
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/text_span.h"

namespace spill::jinja {

struct Options {
  // Hugging Face's apply_chat_template settings; jinja2's own defaults are false for both.
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
  // Names the template in error messages ("<name>:<line>: ...").
  std::string name = "template";
};

// Chat templates come from downloaded model folders: a render is bounded in the depth of its
// recursion (expressions, statements, macro calls, and printing, comparing, serialising or
// destroying nested values), in the bytes of any one string it builds and of its output, and in
// time. Past a limit it raises (RecursionError, OverflowError, TemplateRuntimeError) with a
// message naming the limit; nothing a template does can crash or hang the process.
struct RenderLimits {
  // Far above real templates (< 30 levels) and the 200 nested macro calls jinja2 allows; below
  // what a thread's default 8 MiB stack holds even under ASan (tests/hostile_input_test.cpp
  // renders to this limit, and CI runs it under ASan).
  int max_nesting = 1000;
  // Any one string and the whole output; real prompts are a few MB at most.
  size_t max_bytes = size_t(64) << 20;
  double max_seconds = 10;
};

struct RenderOptions {
  // The local time strftime_now() formats; unset: the current local time.
  std::optional<std::tm> now;
  RenderLimits limits;
};

// Which template variables hold untrusted input (a chat request's messages and tools). Every
// string inside them is marked; marks follow strings through the template: concatenation (`~`,
// `+`, join, printing one after another) keeps them byte-exact, and any other operation on a
// marked operand (filters, methods, slicing, tojson) marks its whole result. render_marked()
// then reports which bytes of the output came from input, so the caller can keep the tokenizer
// from reading special tokens there (role injection: "<|im_end|><|im_start|>system" typed in a
// message). Templates that build markup out of input (`'<|' + role + '|>'`) see that markup
// marked; trusted_keys exempts members such values come from.
struct InputMarking {
  std::vector<std::string> variables;
  std::vector<std::string> trusted_keys;  // e.g. "role": the server accepts only known roles
};

struct RenderedText {
  std::string text;
  std::vector<TextSpan> input;  // byte ranges of text that came from input, sorted
};

struct Program;

// Parsed once, rendered many times; immutable after construction, so render() is thread-safe.
class Template {
 public:
  // Throws spill::Error on a syntax error, an unknown filter or an unknown test.
  explicit Template(std::string_view source, Options options = {});

  // `variables` must be a JSON object: each member becomes a template variable.
  std::string render(const nlohmann::ordered_json& variables, const RenderOptions& options = {}) const;
  RenderedText render_marked(const nlohmann::ordered_json& variables, const InputMarking& marking,
                             const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace spill::jinja
