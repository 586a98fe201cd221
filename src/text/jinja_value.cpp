// Python semantics of template values: str(), repr(), ==, ordering, truthiness, json.dumps and
// the Unicode character classes str methods use.
#include "text/jinja_value.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <chrono>
#include <charconv>
#include <cmath>
#include <cstring>
#include <optional>

namespace spill::jinja::detail {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kSyntax:
      return "TemplateSyntaxError";
    case ErrorKind::kAssertion:
      return "TemplateAssertionError";
    case ErrorKind::kRaised:
      return "TemplateError";
    case ErrorKind::kUndefined:
      return "UndefinedError";
    case ErrorKind::kSecurity:
      return "SecurityError";
    case ErrorKind::kRuntime:
      return "TemplateRuntimeError";
    case ErrorKind::kType:
      return "TypeError";
    case ErrorKind::kValue:
      return "ValueError";
    case ErrorKind::kZeroDivision:
      return "ZeroDivisionError";
    case ErrorKind::kOverflow:
      return "OverflowError";
    case ErrorKind::kFilterArgument:
      return "FilterArgumentError";
    case ErrorKind::kRecursion:
      return "RecursionError";
    case ErrorKind::kUnsupported:
      return "unsupported";
  }
  return "error";
}

void raise(ErrorKind kind, std::string message) {
  throw TemplateError{kind, std::move(message), 0};
}

// ---- Value ---------------------------------------------------------------------------------------

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s) {
  // The backstop for every string a template builds (the operations that could build one far
  // larger than their operands check before they allocate).
  check_result_size(double(s.size()));
  Value v;
  v.kind_ = Kind::kString;
  v.ptr_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::string(std::string s, std::vector<TextSpan> input) {
  if (input.empty()) return string(std::move(s));
  check_result_size(double(s.size()));
  Value v;
  v.kind_ = Kind::kString;
  v.marked_ = true;
  v.ptr_ = std::shared_ptr<const std::string>(std::make_shared<const MarkedString>(std::move(s), std::move(input)));
  return v;
}
Value Value::list(Seq items) {
  Value v;
  v.kind_ = Kind::kList;
  v.ptr_ = std::make_shared<const Seq>(std::move(items));
  return v;
}
Value Value::tuple(Seq items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}
Value Value::iterator(Seq items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::kIterator;
  return v;
}
Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.ptr_ = std::make_shared<const Dict>(std::move(d));
  return v;
}
Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> call) {
  auto f = std::make_shared<Function>();
  f->name = std::move(name);
  f->call = std::move(call);
  return object(Kind::kFunction, std::move(f));
}
Value Value::object(Kind kind, std::shared_ptr<const Object> obj) {
  Value v;
  v.kind_ = kind;
  v.ptr_ = std::move(obj);
  return v;
}
Value Value::undefined(UndefinedInfo info) {
  Value v;
  v.ptr_ = std::shared_ptr<const Object>(std::make_shared<UndefinedInfo>(std::move(info)));
  return v;
}
Value Value::undefined_name(std::string_view name) {
  UndefinedInfo info;
  info.name = repr_string(name);
  return undefined(std::move(info));
}
Value Value::undefined_hint(std::string hint, ErrorKind error) {
  UndefinedInfo info;
  info.hint = std::move(hint);
  info.error = error;
  return undefined(std::move(info));
}

double Value::as_float() const {
  switch (kind_) {
    case Kind::kFloat:
      return f_;
    case Kind::kInt:
      return double(i_);
    case Kind::kBool:
      return b_ ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}

const Object* Value::object() const {
  if (auto p = std::get_if<std::shared_ptr<const Object>>(&ptr_)) return p->get();
  return nullptr;
}

const void* Value::identity() const {
  return std::visit(
      [](const auto& p) -> const void* {
        if constexpr (std::is_same_v<std::decay_t<decltype(p)>, std::monostate>) {
          return nullptr;
        } else {
          return p.get();
        }
      },
      ptr_);
}

// ---- iterative destruction ------------------------------------------------------------------------

namespace {

// Values whose containers are being released on this thread, and whether a destructor further up
// the stack is already draining them.
thread_local std::vector<Value> t_release_queue;
thread_local bool t_draining = false;

void drain_release_queue() noexcept {
  t_draining = true;
  while (!t_release_queue.empty()) {
    // Destroying `v` may push its own children onto the queue; it never recurses into them.
    Value v = std::move(t_release_queue.back());
    t_release_queue.pop_back();
  }
  t_draining = false;
}

}  // namespace

void Value::release_all(std::vector<Value>& values) noexcept {
  for (Value& v : values)
    if (v.ptr_.index() > 1) t_release_queue.push_back(std::move(v));
  values.clear();
  if (!t_draining) drain_release_queue();
}

void Value::release_nested() noexcept {
  // A moved-from Value (as vector reallocation leaves behind, the queue's own included) holds a
  // null pointer: nothing to release, and it must not start draining the queue being resized.
  if (!identity()) return;
  auto take = [](Value& child) {
    if (child.ptr_.index() > 1) t_release_queue.push_back(std::move(child));
  };
  // Only the last owner takes the children; the payloads were created non-const (list(), dict()),
  // so moving out of them through const_cast is well defined.
  if (auto* seq = std::get_if<std::shared_ptr<const Seq>>(&ptr_)) {
    if (seq->use_count() == 1)
      for (Value& child : const_cast<Seq&>(**seq)) take(child);
  } else if (auto* dict = std::get_if<std::shared_ptr<const Dict>>(&ptr_)) {
    if (dict->use_count() == 1)
      for (auto& [k, child] : const_cast<Dict&>(**dict).entries) {
        take(const_cast<Value&>(k));
        take(child);
      }
  }
  // Objects (namespaces, macros and their scopes) hand over what they hold in their destructors.
  const bool outer = !t_draining;
  t_draining = true;
  ptr_ = std::monostate{};
  if (outer) drain_release_queue();
}

Namespace::~Namespace() {
  std::vector<Value> held;
  held.reserve(attributes.entries.size() * 2);
  for (auto& [k, v] : attributes.entries) {
    held.push_back(std::move(k));
    held.push_back(std::move(v));
  }
  attributes.entries.clear();
  Value::release_all(held);
}

// ---- limits of the render on this thread -----------------------------------------------------------

namespace {

struct ThreadLimits {
  RenderLimits limits;
  int nesting = 0;
  unsigned ticks = 0;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};
thread_local ThreadLimits t_limits;

}  // namespace

struct RenderLimitsScope::Saved {
  ThreadLimits previous;
};

RenderLimitsScope::RenderLimitsScope(const RenderLimits& limits) : saved_(std::make_unique<Saved>()) {
  saved_->previous = t_limits;
  t_limits = ThreadLimits{};
  t_limits.limits = limits;
  if (limits.max_seconds > 0 && limits.max_seconds < 1e9)
    t_limits.deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(limits.max_seconds));
}

RenderLimitsScope::~RenderLimitsScope() { t_limits = saved_->previous; }

NestingGuard::NestingGuard() {
  if (++t_limits.nesting > t_limits.limits.max_nesting) {
    --t_limits.nesting;
    raise(ErrorKind::kRecursion,
          fmt::format("maximum recursion depth exceeded: the template nests expressions, statements, macro calls "
                      "or values deeper than {} levels",
                      t_limits.limits.max_nesting));
  }
}

NestingGuard::~NestingGuard() { --t_limits.nesting; }

void check_result_size(double bytes) {
  if (bytes > double(t_limits.limits.max_bytes))
    raise(ErrorKind::kOverflow, fmt::format("the result would be larger than the render's limit of {} bytes",
                                            t_limits.limits.max_bytes));
}

void check_deadline() {
  if ((++t_limits.ticks & 255) != 0) return;
  if (std::chrono::steady_clock::now() > t_limits.deadline)
    raise(ErrorKind::kRuntime,
          fmt::format("the template ran longer than the render's limit of {} seconds", t_limits.limits.max_seconds));
}

std::string UndefinedInfo::message() const {
  if (!hint.empty()) return hint;
  if (!has_object) return name + " is undefined";
  if (name_is_key) return object_type + " has no element " + name;
  return repr_string(object_type) + " has no attribute " + name;
}

// ---- Dict ------------------------------------------------------------------------------------------

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : entries) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : entries) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

// ---- Python semantics ---------------------------------------------------------------------------

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kIterator:
      return "generator";
    case Kind::kDict:
      return "dict";
    case Kind::kFunction:
      return "function";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kLoop:
      return "LoopContext";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone:
      return "None";
    case Kind::kNamespace:
      return "jinja2.utils.Namespace object";
    case Kind::kLoop:
      return "jinja2.runtime.LoopContext object";
    case Kind::kUndefined:
      return "jinja2.runtime.Undefined object";
    default:
      return type_name(v) + " object";
  }
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.as_bool();
    case Kind::kInt:
      return v.as_int() != 0;
    case Kind::kFloat:
      return v.as_float() != 0.0;
    case Kind::kString:
      return !v.as_string().empty();
    case Kind::kList:
    case Kind::kTuple:
      return !v.items().empty();
    case Kind::kDict:
      return !v.as_dict().entries.empty();
    default:
      return true;
  }
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, laid out like Python's repr(): fixed notation for decimal
  // exponents in (-4, 16], scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string_view sci(buf, size_t(res.ptr - buf));
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits += c;
  }
  int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  int decpt = exponent + 1;
  int n = int(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(size_t(-decpt), '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(size_t(decpt - n), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    int e = decpt - 1;
    out += fmt::format("e{}{:02d}", e < 0 ? '-' : '+', e < 0 ? -e : e);
  }
  return out;
}

std::string repr_string(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out;
  out += quote;
  for (char32_t c : decode_utf8(s)) {
    if (c == char32_t(quote) || c == U'\\') {
      out += '\\';
      out += char(c);
    } else if (c == U'\t') {
      out += "\\t";
    } else if (c == U'\n') {
      out += "\\n";
    } else if (c == U'\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", uint32_t(c));
    } else if (c < 0x7f || is_printable(c)) {
      append_utf8(out, c);
    } else if (c <= 0xff) {
      out += fmt::format("\\x{:02x}", uint32_t(c));
    } else if (c <= 0xffff) {
      out += fmt::format("\\u{:04x}", uint32_t(c));
    } else {
      out += fmt::format("\\U{:08x}", uint32_t(c));
    }
  }
  out += quote;
  return out;
}

static std::string join_repr(const Seq& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += repr(items[i]);
    check_result_size(double(out.size()));
  }
  return out;
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return v.as_string();
    default:
      return repr(v);
  }
}

std::string repr(const Value& v) {
  NestingGuard nest;
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.as_int());
    case Kind::kFloat:
      return float_repr(v.as_float());
    case Kind::kString:
      return repr_string(v.as_string());
    case Kind::kList:
      return "[" + join_repr(v.items()) + "]";
    case Kind::kTuple:
      return "(" + join_repr(v.items()) + (v.items().size() == 1 ? ",)" : ")");
    case Kind::kIterator:
      return "<generator object>";
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.as_dict().entries) {
        if (!first) out += ", ";
        first = false;
        out += repr(k) + ": " + repr(val);
        check_result_size(double(out.size()));
      }
      return out + "}";
    }
    case Kind::kFunction: {
      const auto& f = v.as<Function>();
      return f.is_macro ? "<Macro " + repr_string(f.name) + ">" : "<function " + f.name + ">";
    }
    case Kind::kNamespace: {
      Value attrs = Value::dict(v.as<Namespace>().attributes);
      return "<Namespace " + repr(attrs) + ">";
    }
    case Kind::kLoop: {
      const auto& loop = v.as<LoopState>();
      return fmt::format("<LoopContext {}/{}>", loop.index0 + 1, loop.length);
    }
  }
  return "";
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  NestingGuard nest;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.as_string() == b.as_string();
    case Kind::kList:
    case Kind::kTuple: {
      const Seq& x = a.items();
      const Seq& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

static std::optional<int> order(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if ((a.kind() == Kind::kList && b.kind() == Kind::kList) || (a.kind() == Kind::kTuple && b.kind() == Kind::kTuple)) {
    NestingGuard nest;
    const Seq& x = a.items();
    const Seq& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return order(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return std::nullopt;
}

int compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  std::optional<int> o = order(a, b);
  if (!o) {
    type_error(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
  }
  return *o;
}


void fail_undefined(const Value& v) {
  if (const Object* obj = v.object()) {
    const auto* info = dynamic_cast<const UndefinedInfo*>(obj);
    if (info) raise(info->error, info->message());
  }
  raise(ErrorKind::kUndefined, "None is undefined");
}

void require_hashable(const Value& v) {
  switch (v.kind()) {
    case Kind::kList:
    case Kind::kDict:
      type_error("unhashable type: '" + type_name(v) + "'");
    case Kind::kTuple: {
      NestingGuard nest;
      for (const Value& item : v.items()) require_hashable(item);
      return;
    }
    default:
      return;
  }
}

Seq iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kString: {
      Seq out;
      const std::string& s = v.as_string();
      size_t i = 0;
      while (i < s.size()) {
        size_t len = 1;
        auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0xf0) {
          len = 4;
        } else if (c >= 0xe0) {
          len = 3;
        } else if (c >= 0xc0) {
          len = 2;
        }
        // A character of a marked string is marked if any of its bytes is (conservatively).
        bool marked = false;
        for (const TextSpan& span : v.input_spans()) marked |= span.begin < i + len && span.end > i;
        std::string ch = s.substr(i, len);
        const size_t n = ch.size();
        out.push_back(marked ? Value::string(std::move(ch), {TextSpan{0, n}}) : Value::string(std::move(ch)));
        i += len;
      }
      return out;
    }
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kIterator:
      return v.items();
    case Kind::kDict: {
      Seq out;
      for (const auto& entry : v.as_dict().entries) out.push_back(entry.first);
      return out;
    }
    default:
      type_error("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return int64_t(utf8_length(v.as_string()));
    case Kind::kList:
    case Kind::kTuple:
      return int64_t(v.items().size());
    case Kind::kDict:
      return int64_t(v.as_dict().entries.size());
    default:
      type_error("object of type '" + type_name(v) + "' has no len()");
  }
}

// ---- untrusted input -------------------------------------------------------------------------------

bool contains_input(const Value& v) {
  switch (v.kind()) {
    case Kind::kString:
      return !v.input_spans().empty();
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kIterator: {
      NestingGuard nest;
      for (const Value& item : v.items())
        if (contains_input(item)) return true;
      return false;
    }
    case Kind::kDict: {
      NestingGuard nest;
      for (const auto& [k, item] : v.as_dict().entries)
        if (contains_input(k) || contains_input(item)) return true;
      return false;
    }
    case Kind::kNamespace: {
      NestingGuard nest;
      for (const auto& [k, item] : v.as<Namespace>().attributes.entries)
        if (contains_input(k) || contains_input(item)) return true;
      return false;
    }
    default:
      return false;
  }
}

Value mark_as_input(const Value& v) {
  switch (v.kind()) {
    case Kind::kString: {
      const std::string& s = v.as_string();
      if (s.empty()) return v;
      const auto spans = v.input_spans();
      if (spans.size() == 1 && spans[0] == TextSpan{0, s.size()}) return v;
      return Value::string(s, {TextSpan{0, s.size()}});
    }
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kIterator: {
      Seq items;
      items.reserve(v.items().size());
      for (const Value& item : v.items()) items.push_back(item.is_string() ? mark_as_input(item) : item);
      if (v.kind() == Kind::kList) return Value::list(std::move(items));
      return v.kind() == Kind::kTuple ? Value::tuple(std::move(items)) : Value::iterator(std::move(items));
    }
    default:
      return v;
  }
}

void MarkedText::append(const Value& v) {
  const size_t base = text.size();
  if (v.is_string()) {
    text += v.as_string();
    for (const TextSpan& span : v.input_spans()) add_span(input, base + span.begin, base + span.end);
  } else {
    text += to_str(v);
    if (contains_input(v)) add_span(input, base, text.size());
  }
  check_result_size(double(text.size()));
}

void MarkedText::append(const MarkedText& other) {
  const size_t base = text.size();
  text += other.text;
  for (const TextSpan& span : other.input) add_span(input, base + span.begin, base + span.end);
  check_result_size(double(text.size()));
}

Value MarkedText::take() {
  Value v = Value::string(std::move(text), std::move(input));
  text.clear();
  input.clear();
  return v;
}

namespace {

Value from_json_impl(const nlohmann::ordered_json& j, const std::vector<std::string>* trusted_keys) {
  if (j.is_string() && trusted_keys) {
    std::string s = j.get<std::string>();
    const size_t n = s.size();
    return n ? Value::string(std::move(s), {TextSpan{0, n}}) : Value::string(std::move(s));
  }
  if (!trusted_keys || (!j.is_array() && !j.is_object())) return from_json(j);
  NestingGuard nest;
  if (j.is_array()) {
    Seq items;
    items.reserve(j.size());
    for (const auto& item : j) items.push_back(from_json_impl(item, trusted_keys));
    return Value::list(std::move(items));
  }
  Dict d;
  d.entries.reserve(j.size());
  for (const auto& [key, item] : j.items()) {
    const bool trusted = std::find(trusted_keys->begin(), trusted_keys->end(), key) != trusted_keys->end();
    const size_t n = key.size();
    d.entries.emplace_back(n ? Value::string(key, {TextSpan{0, n}}) : Value::string(key),
                           from_json_impl(item, trusted ? nullptr : trusted_keys));
  }
  return Value::dict(std::move(d));
}

}  // namespace

Value from_json_marked(const nlohmann::ordered_json& j, const std::vector<std::string>& trusted_keys) {
  return from_json_impl(j, &trusted_keys);
}

Value from_json(const nlohmann::ordered_json& j) {
  using json = nlohmann::ordered_json;
  switch (j.type()) {
    case json::value_t::null:
      return Value::none();
    case json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case json::value_t::number_unsigned: {
      auto u = j.get<uint64_t>();
      return u <= uint64_t(INT64_MAX) ? Value::integer(int64_t(u)) : Value::number(double(u));
    }
    case json::value_t::number_float:
      return Value::number(j.get<double>());
    case json::value_t::string:
      return Value::string(j.get<std::string>());
    case json::value_t::array: {
      NestingGuard nest;
      Seq items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json(item));
      return Value::list(std::move(items));
    }
    case json::value_t::object: {
      NestingGuard nest;
      Dict d;
      d.entries.reserve(j.size());
      for (const auto& [key, item] : j.items()) d.entries.emplace_back(Value::string(key), from_json(item));
      return Value::dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

// ---- json.dumps --------------------------------------------------------------------------------------

static void json_quote(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : decode_utf8(s)) {
    switch (c) {
      case U'"':
        out += "\\\"";
        break;
      case U'\\':
        out += "\\\\";
        break;
      case U'\n':
        out += "\\n";
        break;
      case U'\r':
        out += "\\r";
        break;
      case U'\t':
        out += "\\t";
        break;
      case U'\b':
        out += "\\b";
        break;
      case U'\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c >= 0x10000) {
            char32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (uint32_t(v) >> 10), 0xdc00 + (uint32_t(v) & 0x3ff));
          } else {
            out += fmt::format("\\u{:04x}", uint32_t(c));
          }
        } else {
          append_utf8(out, c);
        }
    }
  }
  out += '"';
}

static std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return float_repr(f);
}

static void json_encode(std::string& out, const Value& v, const JsonOptions& o, int level) {
  NestingGuard nest;
  check_result_size(double(out.size()));
  const std::string item_sep = o.has_separators ? o.item_separator : (o.has_indent ? "," : ", ");
  const std::string key_sep = o.has_separators ? o.key_separator : ": ";
  auto newline_indent = [&](int lvl) {
    std::string s = "\n";
    for (int i = 0; i < lvl; ++i) s += o.indent;
    return s;
  };
  switch (v.kind()) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Kind::kFloat:
      out += json_float(v.as_float());
      return;
    case Kind::kString:
      json_quote(out, v.as_string(), o.ensure_ascii);
      return;
    case Kind::kList:
    case Kind::kTuple: {
      const Seq& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      std::string sep = item_sep;
      if (o.has_indent) {
        out += newline_indent(level + 1);
        sep += newline_indent(level + 1);
      }
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += sep;
        json_encode(out, items[i], o, level + 1);
      }
      if (o.has_indent) out += newline_indent(level);
      out += ']';
      return;
    }
    case Kind::kDict: {
      const Dict& d = v.as_dict();
      if (d.entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : d.entries) entries.push_back(&e);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return compare(a->first, b->first) < 0; });
      }
      out += '{';
      std::string sep = item_sep;
      if (o.has_indent) {
        out += newline_indent(level + 1);
        sep += newline_indent(level + 1);
      }
      bool first = true;
      for (const auto* e : entries) {
        const Value& key = e->first;
        std::string key_text;
        switch (key.kind()) {
          case Kind::kString:
            key_text = key.as_string();
            break;
          case Kind::kFloat:
            key_text = json_float(key.as_float());
            break;
          case Kind::kBool:
            key_text = key.as_bool() ? "true" : "false";
            break;
          case Kind::kNone:
            key_text = "null";
            break;
          case Kind::kInt:
            key_text = std::to_string(key.as_int());
            break;
          default:
            type_error("keys must be str, int, float, bool or None, not " + type_name(key));
        }
        if (!first) out += sep;
        first = false;
        json_quote(out, key_text, o.ensure_ascii);
        out += key_sep;
        json_encode(out, e->second, o, level + 1);
      }
      if (o.has_indent) out += newline_indent(level);
      out += '}';
      return;
    }
    default:
      type_error("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_encode(out, v, options, 0);
  return out;
}

// ---- Unicode ------------------------------------------------------------------------------------------

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    size_t len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if (c >= 0xf0) {
      cp = c & 0x07;
      len = 4;
    } else if (c >= 0xe0) {
      cp = c & 0x0f;
      len = 3;
    } else if (c >= 0xc0) {
      cp = c & 0x1f;
      len = 2;
    } else {
      cp = 0xfffd;  // stray continuation byte: cannot come from valid JSON input
      len = 1;
    }
    if (i + len > s.size()) {
      out.push_back(0xfffd);
      break;
    }
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xc0 | (c >> 6));
    out += char(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += char(0xe0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  } else {
    out += char(0xf0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3f));
    out += char(0x80 | ((c >> 6) & 0x3f));
    out += char(0x80 | (c & 0x3f));
  }
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  // The number of code points decode_utf8 makes of s, stepping over bytes exactly as it does
  // (invalid UTF-8 included: a template from a GGUF file is raw bytes), so that an index or a
  // length taken from one is valid in the other.
  size_t n = 0, i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    ++n;
    if (i + len > s.size()) break;
    i += len;
  }
  return n;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

bool is_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20);
  return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

bool is_linebreak(char32_t c) {
  return c == U'\n' || c == U'\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

static utf8proc_category_t category(char32_t c) {
  return utf8proc_category(utf8proc_int32_t(c));
}

char32_t to_upper(char32_t c) {
  return char32_t(utf8proc_toupper(utf8proc_int32_t(c)));
}
char32_t to_lower(char32_t c) {
  return char32_t(utf8proc_tolower(utf8proc_int32_t(c)));
}
char32_t to_title(char32_t c) {
  return char32_t(utf8proc_totitle(utf8proc_int32_t(c)));
}

namespace {

// Characters whose full uppercase or titlecase is several characters (Python's str.upper() and
// str.title() follow Unicode's SpecialCasing.txt; utf8proc only has one-to-one mappings).
// Generated from Python 3.11: {c, c.upper(), c.title()} for every c where one of them is longer.
struct SpecialCase {
  char32_t c;
  const char32_t* upper;
  const char32_t* title;
};
constexpr SpecialCase kSpecialCases[] = {
    {0x00DF, U"\U00000053\U00000053", U"\U00000053\U00000073"},
    {0x0149, U"\U000002BC\U0000004E", U"\U000002BC\U0000004E"},
    {0x01F0, U"\U0000004A\U0000030C", U"\U0000004A\U0000030C"},
    {0x0390, U"\U00000399\U00000308\U00000301", U"\U00000399\U00000308\U00000301"},
    {0x03B0, U"\U000003A5\U00000308\U00000301", U"\U000003A5\U00000308\U00000301"},
    {0x0587, U"\U00000535\U00000552", U"\U00000535\U00000582"},
    {0x1E96, U"\U00000048\U00000331", U"\U00000048\U00000331"},
    {0x1E97, U"\U00000054\U00000308", U"\U00000054\U00000308"},
    {0x1E98, U"\U00000057\U0000030A", U"\U00000057\U0000030A"},
    {0x1E99, U"\U00000059\U0000030A", U"\U00000059\U0000030A"},
    {0x1E9A, U"\U00000041\U000002BE", U"\U00000041\U000002BE"},
    {0x1F50, U"\U000003A5\U00000313", U"\U000003A5\U00000313"},
    {0x1F52, U"\U000003A5\U00000313\U00000300", U"\U000003A5\U00000313\U00000300"},
    {0x1F54, U"\U000003A5\U00000313\U00000301", U"\U000003A5\U00000313\U00000301"},
    {0x1F56, U"\U000003A5\U00000313\U00000342", U"\U000003A5\U00000313\U00000342"},
    {0x1F80, U"\U00001F08\U00000399", U"\U00001F88"},
    {0x1F81, U"\U00001F09\U00000399", U"\U00001F89"},
    {0x1F82, U"\U00001F0A\U00000399", U"\U00001F8A"},
    {0x1F83, U"\U00001F0B\U00000399", U"\U00001F8B"},
    {0x1F84, U"\U00001F0C\U00000399", U"\U00001F8C"},
    {0x1F85, U"\U00001F0D\U00000399", U"\U00001F8D"},
    {0x1F86, U"\U00001F0E\U00000399", U"\U00001F8E"},
    {0x1F87, U"\U00001F0F\U00000399", U"\U00001F8F"},
    {0x1F88, U"\U00001F08\U00000399", U"\U00001F88"},
    {0x1F89, U"\U00001F09\U00000399", U"\U00001F89"},
    {0x1F8A, U"\U00001F0A\U00000399", U"\U00001F8A"},
    {0x1F8B, U"\U00001F0B\U00000399", U"\U00001F8B"},
    {0x1F8C, U"\U00001F0C\U00000399", U"\U00001F8C"},
    {0x1F8D, U"\U00001F0D\U00000399", U"\U00001F8D"},
    {0x1F8E, U"\U00001F0E\U00000399", U"\U00001F8E"},
    {0x1F8F, U"\U00001F0F\U00000399", U"\U00001F8F"},
    {0x1F90, U"\U00001F28\U00000399", U"\U00001F98"},
    {0x1F91, U"\U00001F29\U00000399", U"\U00001F99"},
    {0x1F92, U"\U00001F2A\U00000399", U"\U00001F9A"},
    {0x1F93, U"\U00001F2B\U00000399", U"\U00001F9B"},
    {0x1F94, U"\U00001F2C\U00000399", U"\U00001F9C"},
    {0x1F95, U"\U00001F2D\U00000399", U"\U00001F9D"},
    {0x1F96, U"\U00001F2E\U00000399", U"\U00001F9E"},
    {0x1F97, U"\U00001F2F\U00000399", U"\U00001F9F"},
    {0x1F98, U"\U00001F28\U00000399", U"\U00001F98"},
    {0x1F99, U"\U00001F29\U00000399", U"\U00001F99"},
    {0x1F9A, U"\U00001F2A\U00000399", U"\U00001F9A"},
    {0x1F9B, U"\U00001F2B\U00000399", U"\U00001F9B"},
    {0x1F9C, U"\U00001F2C\U00000399", U"\U00001F9C"},
    {0x1F9D, U"\U00001F2D\U00000399", U"\U00001F9D"},
    {0x1F9E, U"\U00001F2E\U00000399", U"\U00001F9E"},
    {0x1F9F, U"\U00001F2F\U00000399", U"\U00001F9F"},
    {0x1FA0, U"\U00001F68\U00000399", U"\U00001FA8"},
    {0x1FA1, U"\U00001F69\U00000399", U"\U00001FA9"},
    {0x1FA2, U"\U00001F6A\U00000399", U"\U00001FAA"},
    {0x1FA3, U"\U00001F6B\U00000399", U"\U00001FAB"},
    {0x1FA4, U"\U00001F6C\U00000399", U"\U00001FAC"},
    {0x1FA5, U"\U00001F6D\U00000399", U"\U00001FAD"},
    {0x1FA6, U"\U00001F6E\U00000399", U"\U00001FAE"},
    {0x1FA7, U"\U00001F6F\U00000399", U"\U00001FAF"},
    {0x1FA8, U"\U00001F68\U00000399", U"\U00001FA8"},
    {0x1FA9, U"\U00001F69\U00000399", U"\U00001FA9"},
    {0x1FAA, U"\U00001F6A\U00000399", U"\U00001FAA"},
    {0x1FAB, U"\U00001F6B\U00000399", U"\U00001FAB"},
    {0x1FAC, U"\U00001F6C\U00000399", U"\U00001FAC"},
    {0x1FAD, U"\U00001F6D\U00000399", U"\U00001FAD"},
    {0x1FAE, U"\U00001F6E\U00000399", U"\U00001FAE"},
    {0x1FAF, U"\U00001F6F\U00000399", U"\U00001FAF"},
    {0x1FB2, U"\U00001FBA\U00000399", U"\U00001FBA\U00000345"},
    {0x1FB3, U"\U00000391\U00000399", U"\U00001FBC"},
    {0x1FB4, U"\U00000386\U00000399", U"\U00000386\U00000345"},
    {0x1FB6, U"\U00000391\U00000342", U"\U00000391\U00000342"},
    {0x1FB7, U"\U00000391\U00000342\U00000399", U"\U00000391\U00000342\U00000345"},
    {0x1FBC, U"\U00000391\U00000399", U"\U00001FBC"},
    {0x1FC2, U"\U00001FCA\U00000399", U"\U00001FCA\U00000345"},
    {0x1FC3, U"\U00000397\U00000399", U"\U00001FCC"},
    {0x1FC4, U"\U00000389\U00000399", U"\U00000389\U00000345"},
    {0x1FC6, U"\U00000397\U00000342", U"\U00000397\U00000342"},
    {0x1FC7, U"\U00000397\U00000342\U00000399", U"\U00000397\U00000342\U00000345"},
    {0x1FCC, U"\U00000397\U00000399", U"\U00001FCC"},
    {0x1FD2, U"\U00000399\U00000308\U00000300", U"\U00000399\U00000308\U00000300"},
    {0x1FD3, U"\U00000399\U00000308\U00000301", U"\U00000399\U00000308\U00000301"},
    {0x1FD6, U"\U00000399\U00000342", U"\U00000399\U00000342"},
    {0x1FD7, U"\U00000399\U00000308\U00000342", U"\U00000399\U00000308\U00000342"},
    {0x1FE2, U"\U000003A5\U00000308\U00000300", U"\U000003A5\U00000308\U00000300"},
    {0x1FE3, U"\U000003A5\U00000308\U00000301", U"\U000003A5\U00000308\U00000301"},
    {0x1FE4, U"\U000003A1\U00000313", U"\U000003A1\U00000313"},
    {0x1FE6, U"\U000003A5\U00000342", U"\U000003A5\U00000342"},
    {0x1FE7, U"\U000003A5\U00000308\U00000342", U"\U000003A5\U00000308\U00000342"},
    {0x1FF2, U"\U00001FFA\U00000399", U"\U00001FFA\U00000345"},
    {0x1FF3, U"\U000003A9\U00000399", U"\U00001FFC"},
    {0x1FF4, U"\U0000038F\U00000399", U"\U0000038F\U00000345"},
    {0x1FF6, U"\U000003A9\U00000342", U"\U000003A9\U00000342"},
    {0x1FF7, U"\U000003A9\U00000342\U00000399", U"\U000003A9\U00000342\U00000345"},
    {0x1FFC, U"\U000003A9\U00000399", U"\U00001FFC"},
    {0xFB00, U"\U00000046\U00000046", U"\U00000046\U00000066"},
    {0xFB01, U"\U00000046\U00000049", U"\U00000046\U00000069"},
    {0xFB02, U"\U00000046\U0000004C", U"\U00000046\U0000006C"},
    {0xFB03, U"\U00000046\U00000046\U00000049", U"\U00000046\U00000066\U00000069"},
    {0xFB04, U"\U00000046\U00000046\U0000004C", U"\U00000046\U00000066\U0000006C"},
    {0xFB05, U"\U00000053\U00000054", U"\U00000053\U00000074"},
    {0xFB06, U"\U00000053\U00000054", U"\U00000053\U00000074"},
    {0xFB13, U"\U00000544\U00000546", U"\U00000544\U00000576"},
    {0xFB14, U"\U00000544\U00000535", U"\U00000544\U00000565"},
    {0xFB15, U"\U00000544\U0000053B", U"\U00000544\U0000056B"},
    {0xFB16, U"\U0000054E\U00000546", U"\U0000054E\U00000576"},
    {0xFB17, U"\U00000544\U0000053D", U"\U00000544\U0000056D"},
};

const SpecialCase* special_case(char32_t c) {
  if (c < 0xdf) return nullptr;
  for (const auto& sc : kSpecialCases) {
    if (sc.c == c) return &sc;
  }
  return nullptr;
}

}  // namespace

std::string upper_string(std::string_view s) {
  std::string out;
  for (char32_t c : decode_utf8(s)) {
    if (const SpecialCase* sc = special_case(c)) {
      for (const char32_t* p = sc->upper; *p; ++p) append_utf8(out, *p);
    } else {
      append_utf8(out, to_upper(c));
    }
  }
  return out;
}

std::string lower_string(std::string_view s) {
  std::u32string u = decode_utf8(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) {
    char32_t c = u[i];
    if (c == 0x130) {  // İ -> i + combining dot above
      append_utf8(out, U'i');
      append_utf8(out, 0x307);
    } else if (c == 0x3a3 && i > 0 && is_cased(u[i - 1]) && (i + 1 == u.size() || !is_cased(u[i + 1]))) {
      append_utf8(out, 0x3c2);  // final sigma
    } else {
      append_utf8(out, to_lower(c));
    }
  }
  return out;
}

void append_title(std::u32string& out, char32_t c) {
  if (const SpecialCase* sc = special_case(c)) {
    out += sc->title;
  } else {
    out += to_title(c);
  }
}

bool is_alpha(char32_t c) {
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}
bool is_decimal(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_ND;
}
bool is_digit(char32_t c) {
  // Python's isdigit() also accepts superscripts and circled digits (Numeric_Type=Digit).
  return is_decimal(c) || c == 0xb2 || c == 0xb3 || c == 0xb9 || (c >= 0x2070 && c <= 0x2079) ||
         (c >= 0x2080 && c <= 0x2089) || (c >= 0x2460 && c <= 0x2468) || (c >= 0x2474 && c <= 0x247c) ||
         (c >= 0x2488 && c <= 0x2490) || (c >= 0x24f5 && c <= 0x24fd) || c == 0x24ea || c == 0x24ff ||
         (c >= 0x2776 && c <= 0x277e) || (c >= 0x2780 && c <= 0x2788) || (c >= 0x278a && c <= 0x2792);
}
bool is_numeric(char32_t c) {
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
bool is_alnum(char32_t c) {
  return is_alpha(c) || is_numeric(c);
}
bool is_lower(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_LL;
}
bool is_upper(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_LU;
}
bool is_cased(char32_t c) {
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}
bool is_printable(char32_t c) {
  if (c == U' ') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}
bool is_word_char(char32_t c) {
  return c == U'_' || is_alnum(c);
}

bool is_identifier_char(char32_t c, bool start) {
  if (c < 0x80)
    return c == U'_' || (c >= U'a' && c <= U'z') || (c >= U'A' && c <= U'Z') || (!start && c >= U'0' && c <= U'9');
  switch (category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
      return true;
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return !start;
    default:
      return false;
  }
}

std::string strip(std::string_view s, bool left, bool right, const Value& chars) {
  std::u32string set;
  bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) {
    if (!chars.is_string()) type_error("strip arg must be None or str");
    set = decode_utf8(chars.as_string());
  }
  auto strip_it = [&](char32_t c) { return whitespace ? is_space(c) : set.find(c) != std::u32string::npos; };
  if (is_ascii(s)) {
    size_t b = 0, e = s.size();
    if (left) {
      while (b < e && strip_it(char32_t(s[b]))) ++b;
    }
    if (right) {
      while (e > b && strip_it(char32_t(s[e - 1]))) --e;
    }
    return std::string(s.substr(b, e - b));
  }
  std::u32string u = decode_utf8(s);
  size_t b = 0, e = u.size();
  if (left) {
    while (b < e && strip_it(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(u[e - 1])) --e;
  }
  return encode_utf8(std::u32string_view(u).substr(b, e - b));
}

}  // namespace spill::jinja::detail
