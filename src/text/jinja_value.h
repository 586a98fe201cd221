// Internal to the Jinja interpreter (src/text/jinja*.cpp): the values templates compute with, and
// the Python semantics they follow (str(), repr(), ==, <, truthiness, json.dumps), so that output
// matches jinja2 byte for byte.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "text/jinja.h"
#include "text/text_span.h"

namespace spill::jinja::detail {

// Python's exception classes, as far as a template can observe them: the kind is printed in front
// of the message ("TypeError: ..."), except for raise_exception() whose message stands alone.
enum class ErrorKind {
  kSyntax,          // TemplateSyntaxError (while building)
  kAssertion,       // TemplateAssertionError (while building: unknown filters and tests)
  kRaised,          // raise_exception(msg): TemplateError
  kUndefined,       // UndefinedError
  kSecurity,        // SecurityError (sandbox: list.append, dict.update, ...)
  kRuntime,         // TemplateRuntimeError
  kType,            // TypeError
  kValue,           // ValueError
  kZeroDivision,    // ZeroDivisionError
  kOverflow,        // OverflowError
  kFilterArgument,  // FilterArgumentError
  kRecursion,       // RecursionError (macros calling themselves without end)
  kUnsupported,     // something this interpreter does not implement
};

const char* error_kind_name(ErrorKind kind);

// Thrown inside the interpreter; jinja.cpp turns it into spill::Error with the template name and
// the line of the innermost node that was being evaluated.
struct TemplateError {
  ErrorKind kind;
  std::string message;
  int line = 0;
};

[[noreturn]] void raise(ErrorKind kind, std::string message);
[[noreturn]] inline void type_error(std::string message) {
  raise(ErrorKind::kType, std::move(message));
}

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kIterator,  // a Python generator (select, map, items, ...): iterable, no len(), always true
  kDict,
  kFunction,
  kNamespace,
  kLoop,
};

class Value;
class Interpreter;
using Seq = std::vector<Value>;

// Insertion-ordered mapping with Python key equality (1 == 1.0 == True). Linear lookup: template
// dicts are messages and tool schemas, a handful of keys each.
struct Dict {
  std::vector<std::pair<Value, Value>> entries;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);  // replaces in place when the key exists, as dict[k] = v does
};

// Everything that is neither a scalar nor a container: callables, namespaces, loop contexts and
// the information an Undefined carries for its error message.
struct Object {
  virtual ~Object() = default;
};

// Why a value is undefined; UndefinedError's message is built from it like jinja2's Undefined.
struct UndefinedInfo : Object {
  std::string hint;          // used as the message when non-empty
  std::string object_type;   // object_type_repr() of the object that lacked the attribute
  std::string name;          // the name / attribute / key that was missing (already repr'd for keys)
  bool name_is_key = false;  // "has no element" (non-string key) rather than "has no attribute"
  bool has_object = false;
  ErrorKind error = ErrorKind::kUndefined;
  std::string message() const;
};

struct CallArgs {
  Seq positional;
  std::vector<std::pair<std::string, Value>> keyword;
  int line = 0;
};

struct Function : Object {
  std::string name;  // for error messages and repr
  bool is_macro = false;
  std::function<Value(Interpreter&, CallArgs&)> call;
};


// jinja2.runtime.LoopContext for one iteration.
struct LoopState : Object {
  int64_t index0 = 0;
  int64_t length = 0;
  int64_t depth0 = 0;
  std::shared_ptr<const Seq> items;     // the filtered items being iterated
  std::shared_ptr<Value> last_changed;  // loop.changed() memory, shared by all iterations of one loop
};

// A string some of whose bytes came from untrusted input (see InputMarking in jinja.h).
struct MarkedString : std::string {
  std::vector<TextSpan> input;  // sorted, non-overlapping, non-empty
  MarkedString(std::string text, std::vector<TextSpan> spans) : std::string(std::move(text)), input(std::move(spans)) {}
};

class Value {
 public:
  Value() = default;  // a plain Undefined
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  // Containers a template built can nest without bound (`{% set ns.x = [ns.x] %}` in a loop):
  // the last owner of a list, dict or object hands its children to a per-thread queue that the
  // outermost destructor drains, so destruction never recurses more than a few frames.
  ~Value() {
    if (ptr_.index() > 1) release_nested();
  }
  // Destroys `values` the same way (Scope and Namespace destructors use it for what they hold).
  static void release_all(std::vector<Value>& values) noexcept;

  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  // A string whose `input` byte ranges came from untrusted input; plain when `input` is empty.
  static Value string(std::string s, std::vector<TextSpan> input);
  static Value list(Seq items);
  static Value tuple(Seq items);
  static Value iterator(Seq items);
  static Value dict(Dict d);
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> call);
  static Value object(Kind kind, std::shared_ptr<const Object> obj);
  static Value undefined(UndefinedInfo info);
  static Value undefined_name(std::string_view name);
  static Value undefined_hint(std::string hint, ErrorKind error = ErrorKind::kUndefined);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  // list, tuple or iterator: things whose items() can be read
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple || kind_ == Kind::kIterator; }
  bool is_dict() const { return kind_ == Kind::kDict; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double as_float() const;  // int, bool or float
  const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(ptr_); }
  // The input spans of a string (empty for unmarked strings and other kinds).
  std::span<const TextSpan> input_spans() const {
    if (!marked_) return {};
    return static_cast<const MarkedString&>(as_string()).input;
  }
  const Seq& items() const { return *std::get<std::shared_ptr<const Seq>>(ptr_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(ptr_); }
  const Object* object() const;
  template <class T>
  const T& as() const {
    return static_cast<const T&>(*object());
  }
  // Identity of the shared payload, for `is sameas`.
  const void* identity() const;

 private:
  void release_nested() noexcept;

  Kind kind_ = Kind::kUndefined;
  bool marked_ = false;  // a string whose payload is a MarkedString
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::variant<std::monostate, std::shared_ptr<const std::string>, std::shared_ptr<const Seq>,
               std::shared_ptr<const Dict>, std::shared_ptr<const Object>>
      ptr_;
};

// jinja2.utils.Namespace: the one mutable object templates can hold ({% set ns.x = ... %}).
struct Namespace : Object {
  mutable Dict attributes;
  ~Namespace() override;  // out of line: releases what it holds iteratively (see ~Value)
};

// ---- limits on one render ----------------------------------------------------------------------

// The limits of the render running on this thread (RenderOptions::limits, see jinja.h).
// One level of recursion; raises RecursionError beyond RenderLimits::max_nesting.
class NestingGuard {
 public:
  NestingGuard();
  ~NestingGuard();
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;
};

// Installs limits on this thread for one render (nesting restarts at 0) and restores the
// previous ones after (renders do not nest, but tests construct one inside another's callback).
class RenderLimitsScope {
 public:
  explicit RenderLimitsScope(const RenderLimits& limits);
  ~RenderLimitsScope();
  RenderLimitsScope(const RenderLimitsScope&) = delete;
  RenderLimitsScope& operator=(const RenderLimitsScope&) = delete;

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;
};

// Raises OverflowError when a string or output of `bytes` would pass the render's byte limit.
void check_result_size(double bytes);
// Raises a TemplateRuntimeError once the render has run past its time limit (cheap: reads the
// clock on one call in 256).
void check_deadline();

// ---- Python semantics ------------------------------------------------------------------------

// type(x).__name__: "int", "str", "NoneType", "list", "dict", "generator", "Undefined", ...
std::string type_name(const Value& v);
// jinja2.utils.object_type_repr: "None", "dict object", "jinja2.utils.Namespace object", ...
std::string object_type_repr(const Value& v);
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(x); Undefined prints as ""
std::string repr(const Value& v);    // repr(x)
std::string repr_string(std::string_view s);
std::string float_repr(double f);
bool equals(const Value& a, const Value& b);
// Python ordering of a and b (<0, 0, >0). Raises TypeError "'<op>' not supported between
// instances of ..." for unorderable types and UndefinedError for undefined operands.
int compare(const Value& a, const Value& b, std::string_view op = "<");
// Raises the UndefinedError (or SecurityError) an undefined value stands for.
[[noreturn]] void fail_undefined(const Value& v);
// Python's hash() requirement for dict keys and sets: raises "unhashable type: 'list'".
void require_hashable(const Value& v);

// ---- untrusted input ---------------------------------------------------------------------------

// True when any string in v (recursively through lists, dicts and namespaces) is marked.
bool contains_input(const Value& v);
// v with all of it marked as input: a string wholly, or each string of a list/tuple/iterator.
// What operations do with a marked operand that cannot say which output bytes came from it.
Value mark_as_input(const Value& v);

// Text being built from pieces, keeping the input spans of those that carry them (print
// statements, `~` and `+` on strings, join): concatenation is byte-exact about what came from
// input, so the template's own markup next to it stays markup.
struct MarkedText {
  std::string text;
  std::vector<TextSpan> input;

  void append(std::string_view plain) { text += plain; }
  // str(v): a string with its spans; anything else wholly marked if it holds input.
  void append(const Value& v);
  void append(const MarkedText& other);
  Value take();
};

// Iteration as Python's iter(): strings yield characters, dicts their keys; Undefined is empty.
Seq iterate(const Value& v);
// len(); throws TypeError for values without a length.
int64_t length(const Value& v);

Value from_json(const nlohmann::ordered_json& j);
// Same, with every string marked as input except the values of members named in trusted_keys.
Value from_json_marked(const nlohmann::ordered_json& j, const std::vector<std::string>& trusted_keys);

struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;
  bool has_separators = false;
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
};
// json.dumps(x, ...) with Python's formatting of floats and separators.
std::string to_json(const Value& v, const JsonOptions& options);

// ---- Unicode strings as Python sees them (code points) ---------------------------------------

std::u32string decode_utf8(std::string_view s);
std::string encode_utf8(std::u32string_view s);
void append_utf8(std::string& out, char32_t c);
size_t utf8_length(std::string_view s);
bool is_ascii(std::string_view s);
bool is_space(char32_t c);      // str.isspace()
bool is_linebreak(char32_t c);  // str.splitlines() boundaries
char32_t to_upper(char32_t c);  // simple (one-to-one) mappings
char32_t to_lower(char32_t c);
char32_t to_title(char32_t c);
// Python's full case mappings: str.upper() / lower() (with final sigma) and the titlecase of one
// character, including SpecialCasing's expansions ("ß".upper() == "SS", "ﬁ".title() == "Fi").
std::string upper_string(std::string_view s);
std::string lower_string(std::string_view s);
void append_title(std::u32string& out, char32_t c);
bool is_alpha(char32_t c);
bool is_alnum(char32_t c);
bool is_digit(char32_t c);
bool is_decimal(char32_t c);
bool is_numeric(char32_t c);
bool is_lower(char32_t c);
bool is_upper(char32_t c);
bool is_cased(char32_t c);
bool is_printable(char32_t c);
bool is_word_char(char32_t c);                    // regex \w for str patterns
bool is_identifier_char(char32_t c, bool start);  // str.isidentifier(): XID_Start / XID_Continue

std::string strip(std::string_view s, bool left, bool right, const Value& chars);

}  // namespace spill::jinja::detail
