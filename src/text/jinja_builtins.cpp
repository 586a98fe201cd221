// jinja2's filters, tests and globals (and the `loop` variable's attributes), as jinja2 3.1
// defines them in filters.py, tests.py and defaults.py.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "text/jinja_interp.h"
#include "text/jinja_strings.h"

namespace spill::jinja::detail {
namespace {

// sorted(reverse=x) takes an integer.
bool reverse_flag(const std::optional<Value>& v) {
  if (!v) return false;
  return to_index(*v, "") != 0;
}

// ---- attribute getters of filters (make_attrgetter) ---------------------------------------------------------

std::vector<Value> attribute_parts(const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_none() || attribute.is_undefined()) return parts;
  if (!attribute.is_string()) return {attribute};
  for (const Value& p : split_sep(attribute.as_string(), ".", -1, false)) {
    const std::string& s = p.as_string();
    bool digits = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    parts.push_back(digits ? Value::integer(parse_index(s)) : p);
  }
  return parts;
}

Value lookup_attribute(Interpreter& interp, Value item, const std::vector<Value>& parts, const Value* dflt = nullptr) {
  for (const Value& part : parts) {
    item = interp.getitem(item, part);
    if (dflt && item.is_undefined()) item = *dflt;
  }
  return item;
}

Value ignore_case(const Value& v) {
  return v.is_string() ? Value::string(lower_string(v.as_string())) : v;
}

// Python's sorted(items, key=key, reverse=reverse): stable in both directions.
void sort_by_key(std::vector<std::pair<Value, Value>>& keyed, bool reverse) {
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? compare(b.first, a.first) < 0 : compare(a.first, b.first) < 0;
  });
}

// ---- filters -----------------------------------------------------------------------------------------------

Value f_abs(Interpreter&, const Value& v, CallArgs& args) {
  bind("abs", args, {});
  if (v.is_float()) return Value::number(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) raise(ErrorKind::kOverflow, "integer result does not fit in 64 bits");
    return Value::integer(std::llabs(v.as_int()));
  }
  if (v.is_undefined()) fail_undefined(v);
  type_error(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
}

Value f_attr(Interpreter& interp, const Value& v, CallArgs& args) {
  auto a = bind("do_attr", args, {"name"}, 1);
  std::string name = to_str(*a[0]);
  if (v.is_dict()) {
    // The attribute, not the key: dict keys are not attributes.
    if (auto method = builtin_method(v, name)) return *method;
    UndefinedInfo info;
    info.has_object = true;
    info.object_type = object_type_repr(v);
    info.name = repr_string(name);
    return Value::undefined(std::move(info));
  }
  return interp.getattr(v, name);
}

Value f_capitalize(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_capitalize", args, {});
  return Value::string(capitalize(to_str(v)));
}

Value f_center(Interpreter&, const Value& v, CallArgs& args) {
  auto a = bind("do_center", args, {"width"});
  return Value::string(center(to_str(v), a[0] ? to_index(*a[0], "") : 80, U' '));
}

Value f_length(Interpreter&, const Value& v, CallArgs& args) {
  bind("len", args, {});
  return Value::integer(length(v));
}

Value f_default(Interpreter&, const Value& v, CallArgs& args) {
  auto a = bind("do_default", args, {"default_value", "boolean"});
  bool boolean = a[1] && truthy(*a[1]);
  if (v.is_undefined() || (boolean && !truthy(v))) return arg_or(a[0], Value::string(""));
  return v;
}

Value f_dictsort(Interpreter&, const Value& v, CallArgs& args) {
  auto a = bind("do_dictsort", args, {"case_sensitive", "by", "reverse"});
  bool case_sensitive = a[0] && truthy(*a[0]);
  std::string by = a[1] ? to_str(*a[1]) : "key";
  bool reverse = reverse_flag(a[2]);
  if (by != "key" && by != "value")
    raise(ErrorKind::kFilterArgument, "You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) type_error(fmt::format("'{}' object has no attribute 'items'", type_name(v)));
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [k, val] : v.as_dict().entries) {
    Value key = by == "key" ? k : val;
    keyed.emplace_back(case_sensitive ? key : ignore_case(key), Value::tuple({k, val}));
  }
  sort_by_key(keyed, reverse);
  Seq out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::list(std::move(out));
}

Value f_escape(Interpreter&, const Value& v, CallArgs& args) {
  bind("escape", args, {});
  return Value::string(html_escape(to_str(v)));
}

Value f_first(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_first", args, {});
  Seq items = iterate(v);
  if (items.empty()) return Value::undefined_hint("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_last", args, {});
  if (v.kind() == Kind::kIterator) type_error("'generator' object is not reversible");
  if (!v.is_undefined() && !v.is_string() && !v.is_sequence() && !v.is_dict()) {
    type_error(fmt::format("'{}' object is not reversible", type_name(v)));
  }
  Seq items = iterate(v);
  if (items.empty()) return Value::undefined_hint("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Interpreter&, const Value& v, CallArgs& args) {
  auto a = bind("do_float", args, {"default"});
  Value dflt = arg_or(a[0], Value::number(0.0));
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value::number(v.as_float());
  if (v.is_string()) {
    if (auto f = parse_float(v.as_string())) return Value::number(*f);
  }
  return dflt;
}

Value f_int(Interpreter&, const Value& v, CallArgs& args) {
  auto a = bind("do_int", args, {"default", "base"});
  Value dflt = arg_or(a[0], Value::integer(0));
  int base = a[1] ? int(to_index(*a[1], "")) : 10;
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) {
    double f = v.as_float();
    if (std::isnan(f)) return dflt;
    if (std::isinf(f)) raise(ErrorKind::kOverflow, "cannot convert float infinity to integer");
    return Value::integer(int64_t(f));
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.as_string(), base)) return Value::integer(*i);
    // "this quirk is necessary so that "42.23"|int gives 42"
    if (auto f = parse_float(v.as_string())) {
      if (std::isfinite(*f)) return Value::integer(int64_t(*f));
    }
  }
  return dflt;
}

Value f_format(Interpreter& interp, const Value& v, CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    raise(ErrorKind::kFilterArgument, "can't handle positional and keyword arguments at the same time");
  }
  Value values;
  if (!args.keyword.empty()) {
    Dict d;
    for (auto& [k, x] : args.keyword) d.set(Value::string(k), x);
    values = Value::dict(std::move(d));
  } else {
    values = Value::tuple(args.positional);
  }
  return Value::string(percent_format(interp, to_str(v), values));
}

Value f_indent(Interpreter&, const Value& v, CallArgs& args) {
  auto a = bind("do_indent", args, {"width", "first", "blank"});
  std::string indention;
  if (a[0] && a[0]->is_string()) {
    indention = a[0]->as_string();
  } else {
    int64_t width = a[0] ? to_index(*a[0], "") : 4;
    check_result_size(double(width));
    indention = std::string(size_t(std::max<int64_t>(0, width)), ' ');
  }
  bool first = a[1] && truthy(*a[1]);
  bool blank = a[2] && truthy(*a[2]);
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_string()) type_error(fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v)));
  std::vector<std::u32string> lines = splitlines(decode_utf8(v.as_string() + "\n"), false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += encode_utf8(lines[i]);
      check_result_size(double(rv.size()));
    }
  } else {
    rv = lines.empty() ? "" : encode_utf8(lines[0]);
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += encode_utf8(lines[i]);
      check_result_size(double(rv.size()));
    }
  }
  if (first) rv = indention + rv;
  return Value::string(std::move(rv));
}

Value f_items(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_items", args, {});
  if (v.is_undefined()) return Value::iterator({});
  if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
  Seq out;
  for (const auto& [k, val] : v.as_dict().entries) out.push_back(Value::tuple({k, val}));
  return Value::iterator(std::move(out));
}

Value f_join(Interpreter& interp, const Value& v, CallArgs& args) {
  auto a = bind("do_join", args, {"d", "attribute"});
  std::string sep = a[0] ? to_str(*a[0]) : "";
  std::vector<Value> parts = a[1] ? attribute_parts(*a[1]) : std::vector<Value>{};
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(a[1] ? lookup_attribute(interp, item, parts) : item);
    check_result_size(double(out.size()));
  }
  return Value::string(std::move(out));
}

Value f_list(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_list", args, {});
  return Value::list(iterate(v));
}

Value f_lower(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_lower", args, {});
  return Value::string(lower_string(to_str(v)));
}

Value f_upper(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_upper", args, {});
  return Value::string(upper_string(to_str(v)));
}

Value f_map(Interpreter& interp, const Value& v, CallArgs& args) {
  Seq out;
  if (!truthy(v)) return Value::iterator({});
  auto pop = [&](std::string_view key) -> std::optional<Value> {
    for (auto it = args.keyword.begin(); it != args.keyword.end(); ++it) {
      if (it->first == key) {
        Value x = it->second;
        args.keyword.erase(it);
        return x;
      }
    }
    return std::nullopt;
  };
  bool by_attribute = args.positional.empty() && std::any_of(args.keyword.begin(), args.keyword.end(),
                                                             [](auto& kv) { return kv.first == "attribute"; });
  if (by_attribute) {
    Value attribute = *pop("attribute");
    std::optional<Value> dflt = pop("default");
    if (!args.keyword.empty()) {
      raise(ErrorKind::kFilterArgument,
            fmt::format("Unexpected keyword argument {}", repr_string(args.keyword[0].first)));
    }
    bool use_default = dflt && !dflt->is_none();
    std::vector<Value> parts = attribute_parts(attribute);
    for (const Value& item : iterate(v)) {
      out.push_back(lookup_attribute(interp, item, parts, use_default ? &*dflt : nullptr));
    }
    return Value::iterator(std::move(out));
  }
  if (args.positional.empty()) raise(ErrorKind::kFilterArgument, "map requires a filter argument");
  std::string name = to_str(args.positional[0]);
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : iterate(v)) {
    CallArgs call = rest;
    out.push_back(interp.call_filter(name, item, call));
  }
  return Value::iterator(std::move(out));
}

Value min_or_max(Interpreter& interp, const Value& v, CallArgs& args, bool want_max) {
  auto a = bind(want_max ? "do_max" : "do_min", args, {"case_sensitive", "attribute"});
  bool case_sensitive = a[0] && truthy(*a[0]);
  std::vector<Value> parts = a[1] ? attribute_parts(*a[1]) : std::vector<Value>{};
  Seq items = iterate(v);
  if (items.empty()) return Value::undefined_hint("No aggregated item, sequence was empty.");
  auto key = [&](const Value& item) {
    Value k = lookup_attribute(interp, item, parts);
    return case_sensitive ? k : ignore_case(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    bool better = want_max ? compare(best_key, k, "<") < 0 : compare(k, best_key, "<") < 0;
    if (better) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

Value f_max(Interpreter& interp, const Value& v, CallArgs& args) {
  return min_or_max(interp, v, args, true);
}
Value f_min(Interpreter& interp, const Value& v, CallArgs& args) {
  return min_or_max(interp, v, args, false);
}

Value select_or_reject(Interpreter& interp, const Value& v, CallArgs& args, bool select, bool lookup_attr) {
  if (!truthy(v)) return Value::iterator({});
  std::vector<Value> parts;
  size_t off = 0;
  if (lookup_attr) {
    if (args.positional.empty()) raise(ErrorKind::kFilterArgument, "Missing parameter for attribute name");
    parts = attribute_parts(args.positional[0]);
    off = 1;
  }
  std::optional<std::string> test;
  CallArgs test_args;
  if (args.positional.size() > off) {
    test = to_str(args.positional[off]);
    test_args.positional.assign(args.positional.begin() + long(off) + 1, args.positional.end());
    test_args.keyword = args.keyword;
  }
  Seq out;
  for (const Value& item : iterate(v)) {
    Value subject = lookup_attr ? lookup_attribute(interp, item, parts) : item;
    bool ok;
    if (test) {
      CallArgs call = test_args;
      ok = interp.call_test(*test, subject, call);
    } else {
      ok = truthy(subject);
    }
    if (ok == select) out.push_back(item);
  }
  return Value::iterator(std::move(out));
}

Value f_select(Interpreter& i, const Value& v, CallArgs& a) {
  return select_or_reject(i, v, a, true, false);
}
Value f_reject(Interpreter& i, const Value& v, CallArgs& a) {
  return select_or_reject(i, v, a, false, false);
}
Value f_selectattr(Interpreter& i, const Value& v, CallArgs& a) {
  return select_or_reject(i, v, a, true, true);
}
Value f_rejectattr(Interpreter& i, const Value& v, CallArgs& a) {
  return select_or_reject(i, v, a, false, true);
}

Value f_replace(Interpreter&, const Value& v, CallArgs& args) {
  auto a = bind("do_replace", args, {"old", "new", "count"}, 2);
  int64_t count = a[2] && !a[2]->is_none() ? to_index(*a[2], "") : -1;
  return Value::string(replace_all(to_str(v), to_str(*a[0]), to_str(*a[1]), count));
}

Value f_reverse(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_reverse", args, {});
  if (v.is_string()) {
    std::u32string u = decode_utf8(v.as_string());
    std::reverse(u.begin(), u.end());
    return Value::string(encode_utf8(u));
  }
  if (!v.is_undefined() && !v.is_sequence() && !v.is_dict()) {
    raise(ErrorKind::kFilterArgument, "argument must be iterable");
  }
  Seq items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::iterator(std::move(items));
}

double round_half_even(double x, int64_t digits) {
  // Python rounds the exact binary value to `digits` decimals, ties to even: so does printf.
  if (!std::isfinite(x)) return x;
  if (digits >= 0) {
    std::string s = fmt::format("{:.{}f}", x, std::min<int64_t>(digits, 340));
    return std::strtod(s.c_str(), nullptr);
  }
  double scale = std::pow(10.0, double(-digits));
  double y = x / scale;
  double r = std::nearbyint(y);  // default rounding mode: ties to even
  return r * scale;
}

Value f_round(Interpreter&, const Value& v, CallArgs& args) {
  auto a = bind("do_round", args, {"precision", "method"});
  int64_t precision = a[0] ? to_index(*a[0], "") : 0;
  std::string method = a[1] ? to_str(*a[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    raise(ErrorKind::kFilterArgument, "method must be common, ceil or floor");
  }
  if (!v.is_number()) {
    if (method == "common") type_error(fmt::format("type {} doesn't define __round__ method", type_name(v)));
    if (v.is_undefined()) fail_undefined(v);
    type_error(fmt::format("unsupported operand type(s) for *: '{}' and 'int'", type_name(v)));
  }
  if (method == "common") {
    if (!v.is_float()) {
      if (precision >= 0) return Value::integer(v.as_int());
      return Value::integer(int64_t(round_half_even(double(v.as_int()), precision)));
    }
    return Value::number(round_half_even(v.as_float(), precision));
  }
  double scale = std::pow(10.0, double(precision));
  double x = v.as_float() * scale;
  x = method == "ceil" ? std::ceil(x) : std::floor(x);
  return Value::number(x / scale);
}

Value f_safe(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_mark_safe", args, {});
  return Value::string(to_str(v));
}

Value f_sort(Interpreter& interp, const Value& v, CallArgs& args) {
  auto a = bind("do_sort", args, {"reverse", "case_sensitive", "attribute"});
  bool reverse = reverse_flag(a[0]);
  bool case_sensitive = a[1] && truthy(*a[1]);
  std::vector<std::vector<Value>> attributes;
  if (a[2] && a[2]->is_string()) {
    for (const Value& one : split_sep(a[2]->as_string(), ",", -1, false)) attributes.push_back(attribute_parts(one));
  } else {
    attributes.push_back(a[2] ? attribute_parts(*a[2]) : std::vector<Value>{});
  }
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : iterate(v)) {
    Seq key;
    for (const auto& parts : attributes) {
      Value k = lookup_attribute(interp, item, parts);
      key.push_back(case_sensitive ? k : ignore_case(k));
    }
    keyed.emplace_back(Value::list(std::move(key)), item);
  }
  sort_by_key(keyed, reverse);
  Seq out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::list(std::move(out));
}

Value f_string(Interpreter&, const Value& v, CallArgs& args) {
  bind("soft_str", args, {});
  return Value::string(to_str(v));
}

Value f_sum(Interpreter& interp, const Value& v, CallArgs& args) {
  auto a = bind("do_sum", args, {"attribute", "start"});
  Value total = arg_or(a[1], Value::integer(0));
  if (total.is_string()) type_error("sum() can't sum strings [use ''.join(seq) instead]");
  std::vector<Value> parts = a[0] && !a[0]->is_none() ? attribute_parts(*a[0]) : std::vector<Value>{};
  for (const Value& item : iterate(v)) total = python_add(interp, total, lookup_attribute(interp, item, parts));
  return total;
}

Value f_title(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_title", args, {});
  // jinja2 splits on runs of [-\s({\[<] and capitalizes each piece.
  std::u32string u = decode_utf8(to_str(v));
  auto separator = [](char32_t c) {
    return c == U'-' || c == U'(' || c == U'{' || c == U'[' || c == U'<' || is_space(c);
  };
  // Each piece: its first character upper-cased, the rest lower-cased (item[0].upper() + item[1:].lower()).
  std::string out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i + 1;
    while (j < u.size() && separator(u[j]) == separator(u[i])) ++j;
    out += upper_string(encode_utf8(std::u32string_view(u).substr(i, 1)));
    out += lower_string(encode_utf8(std::u32string_view(u).substr(i + 1, j - i - 1)));
    i = j;
  }
  return Value::string(std::move(out));
}

Value f_tojson(Interpreter&, const Value& v, CallArgs& args) {
  auto a = bind("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = a[0] && truthy(*a[0]);
  if (a[1] && !a[1]->is_none()) {
    o.has_indent = true;
    if (a[1]->is_string()) {
      o.indent = a[1]->as_string();
    } else {
      int64_t width = to_index(*a[1], "");
      check_result_size(double(width));
      o.indent = std::string(size_t(std::max<int64_t>(0, width)), ' ');
    }
  }
  if (a[2] && !a[2]->is_none()) {
    Seq seps = iterate(*a[2]);
    if (seps.size() != 2) raise(ErrorKind::kValue, fmt::format("too many values to unpack (expected 2)"));
    o.has_separators = true;
    o.item_separator = as_text(seps[0], "separator");
    o.key_separator = as_text(seps[1], "separator");
  }
  o.sort_keys = a[3] && truthy(*a[3]);
  return Value::string(to_json(v, o));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& args) {
  auto a = bind("do_trim", args, {"chars"});
  return Value::string(strip(to_str(v), true, true, arg_or(a[0], Value::none())));
}

Value f_unique(Interpreter& interp, const Value& v, CallArgs& args) {
  auto a = bind("do_unique", args, {"case_sensitive", "attribute"});
  bool case_sensitive = a[0] && truthy(*a[0]);
  std::vector<Value> parts = a[1] ? attribute_parts(*a[1]) : std::vector<Value>{};
  Seq seen, out;
  for (const Value& item : iterate(v)) {
    Value key = lookup_attribute(interp, item, parts);
    if (!case_sensitive) key = ignore_case(key);
    require_hashable(key);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::iterator(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& args) {
  bind("do_wordcount", args, {});
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : decode_utf8(to_str(v))) {
    bool w = is_word_char(c);
    if (w && !in_word) ++words;
    in_word = w;
  }
  return Value::integer(words);
}

Value f_unsupported(Interpreter&, const Value&, CallArgs&) {
  raise(ErrorKind::kUnsupported, "this jinja2 filter is not supported by spill's template engine");
}

// ---- tests -----------------------------------------------------------------------------------------------

Value modulo(const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (!a.is_number() || !b.is_number()) {
    type_error(fmt::format("unsupported operand type(s) for %: '{}' and '{}'", type_name(a), type_name(b)));
  }
  if (!a.is_float() && !b.is_float()) {
    if (b.as_int() == 0) raise(ErrorKind::kZeroDivision, "integer modulo by zero");
    int64_t m = a.as_int() % b.as_int();
    if (m != 0 && ((m < 0) != (b.as_int() < 0))) m += b.as_int();
    return Value::integer(m);
  }
  if (b.as_float() == 0) raise(ErrorKind::kZeroDivision, "float modulo");
  double m = std::fmod(a.as_float(), b.as_float());
  if (m != 0 && ((b.as_float() < 0) != (m < 0))) m += b.as_float();
  return Value::number(m);
}

Value one_arg(std::string_view test, CallArgs& args) {
  auto a = bind(test, args, {"other"});
  if (!a[0]) type_error(fmt::format("{}() missing 1 required positional argument", test));
  return *a[0];
}

bool t_odd(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_odd", a, {});
  return equals(modulo(v, Value::integer(2)), Value::integer(1));
}
bool t_even(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_even", a, {});
  return equals(modulo(v, Value::integer(2)), Value::integer(0));
}
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  return equals(modulo(v, one_arg("test_divisibleby", a)), Value::integer(0));
}
bool t_defined(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_defined", a, {});
  return !v.is_undefined();
}
bool t_undefined(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_undefined", a, {});
  return v.is_undefined();
}
bool t_none(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_none", a, {});
  return v.is_none();
}
bool t_boolean(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_boolean", a, {});
  return v.is_bool();
}
bool t_false(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_false", a, {});
  return v.is_bool() && !v.as_bool();
}
bool t_true(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_true", a, {});
  return v.is_bool() && v.as_bool();
}
bool t_integer(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_integer", a, {});
  return v.is_int();
}
bool t_float(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_float", a, {});
  return v.is_float();
}
bool t_lower(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_lower", a, {});
  return cased_test(v, true);
}
bool t_upper(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_upper", a, {});
  return cased_test(v, false);
}
bool t_string(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_string", a, {});
  return v.is_string();
}
bool t_mapping(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_mapping", a, {});
  return v.is_dict();
}
bool t_number(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_number", a, {});
  return v.is_number();
}
bool t_sequence(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_sequence", a, {});
  Kind k = v.kind();
  return k == Kind::kString || k == Kind::kList || k == Kind::kTuple || k == Kind::kDict || k == Kind::kUndefined;
}
bool t_iterable(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_iterable", a, {});
  Kind k = v.kind();
  return k == Kind::kString || v.is_sequence() || k == Kind::kDict || k == Kind::kUndefined;
}
bool t_callable(Interpreter&, const Value& v, CallArgs& a) {
  bind("callable", a, {});
  return v.kind() == Kind::kFunction || v.kind() == Kind::kUndefined || v.kind() == Kind::kLoop;
}
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  Value other = one_arg("test_sameas", a);
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Kind::kNone:
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kString:
      return equals(v, other);
    default:
      return v.identity() == other.identity();
  }
}
bool t_escaped(Interpreter&, const Value&, CallArgs& a) {
  bind("test_escaped", a, {});
  return false;
}
bool t_in(Interpreter&, const Value& v, CallArgs& a) {
  Value seq = one_arg("test_in", a);
  switch (seq.kind()) {
    case Kind::kString:
      if (!v.is_string())
        type_error(fmt::format("'in <string>' requires string as left operand, not {}", type_name(v)));
      return seq.as_string().find(v.as_string()) != std::string::npos;
    case Kind::kDict:
      return seq.as_dict().find(v) != nullptr;
    case Kind::kUndefined:
      return false;
    default:
      if (!seq.is_sequence()) type_error(fmt::format("argument of type '{}' is not iterable", type_name(seq)));
      for (const Value& x : seq.items()) {
        if (equals(x, v)) return true;
      }
      return false;
  }
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) {
  return equals(v, one_arg("eq", a));
}
bool t_ne(Interpreter&, const Value& v, CallArgs& a) {
  return !equals(v, one_arg("ne", a));
}
bool t_gt(Interpreter&, const Value& v, CallArgs& a) {
  return compare(v, one_arg("gt", a), ">") > 0;
}
bool t_ge(Interpreter&, const Value& v, CallArgs& a) {
  return compare(v, one_arg("ge", a), ">=") >= 0;
}
bool t_lt(Interpreter&, const Value& v, CallArgs& a) {
  return compare(v, one_arg("lt", a), "<") < 0;
}
bool t_le(Interpreter&, const Value& v, CallArgs& a) {
  return compare(v, one_arg("le", a), "<=") <= 0;
}
bool t_filter(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_filter", a, {});
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool t_test(Interpreter&, const Value& v, CallArgs& a) {
  bind("test_test", a, {});
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

}  // namespace

Value loop_attribute(const Value& loop_value, std::string_view name) {
  const auto& loop = loop_value.as<LoopState>();
  int64_t i = loop.index0, n = loop.length;
  if (name == "index") return Value::integer(i + 1);
  if (name == "index0") return Value::integer(i);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(loop.depth0 + 1);
  if (name == "depth0") return Value::integer(loop.depth0);
  if (name == "previtem") {
    if (i == 0) return Value::undefined_hint("there is no previous item");
    return (*loop.items)[size_t(i - 1)];
  }
  if (name == "nextitem") {
    if (i + 1 >= n) return Value::undefined_hint("there is no next item");
    return (*loop.items)[size_t(i + 1)];
  }
  if (name == "cycle") {
    return Value::function("cycle", [i](Interpreter&, CallArgs& args) {
      if (!args.keyword.empty()) type_error("cycle() got an unexpected keyword argument");
      if (args.positional.empty()) type_error("no items for cycling given");
      return args.positional[size_t(i) % args.positional.size()];
    });
  }
  if (name == "changed") {
    auto memory = loop.last_changed;
    return Value::function("changed", [memory](Interpreter&, CallArgs& args) {
      Value now = Value::tuple(args.positional);
      if (memory->is_undefined() || !equals(*memory, now)) {
        *memory = now;
        return Value::boolean(true);
      }
      return Value::boolean(false);
    });
  }
  UndefinedInfo info;
  info.has_object = true;
  info.object_type = object_type_repr(loop_value);
  info.name = repr_string(name);
  return Value::undefined(std::move(info));
}
// ---- globals ----------------------------------------------------------------------------------------------------

void add_globals(Scope& globals) {
  globals.set("range", Value::function("range", [](Interpreter&, CallArgs& args) {
                if (!args.keyword.empty()) type_error("range() takes no keyword arguments");
                const Seq& p = args.positional;
                if (p.empty() || p.size() > 3)
                  type_error(fmt::format("range expected at most 3 arguments, got {}", p.size()));
                int64_t start = 0, stop, step = 1;
                if (p.size() == 1) {
                  stop = to_index(p[0], "");
                } else {
                  start = to_index(p[0], "");
                  stop = to_index(p[1], "");
                  if (p.size() == 3) step = to_index(p[2], "");
                }
                if (step == 0) raise(ErrorKind::kValue, "range() arg 3 must not be zero");
                int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                                         : (start > stop ? (start - stop - step - 1) / -step : 0);
                if (count > 100000) {
                  raise(ErrorKind::kOverflow,
                        "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
                }
                Seq out;
                for (int64_t k = 0; k < count; ++k) out.push_back(Value::integer(start + k * step));
                return Value::list(std::move(out));
              }));
  auto mapping_from_args = [](CallArgs& args, std::string_view func) {
    Dict d;
    if (args.positional.size() > 1)
      type_error(fmt::format("{} expected at most 1 argument, got {}", func, args.positional.size()));
    if (args.positional.size() == 1) {
      const Value& src = args.positional[0];
      if (src.is_dict()) {
        d = src.as_dict();
      } else {
        for (const Value& pair : iterate(src)) {
          Seq kv = iterate(pair);
          if (kv.size() != 2)
            raise(ErrorKind::kValue, "dictionary update sequence element has wrong length; 2 is required");
          require_hashable(kv[0]);
          d.set(kv[0], kv[1]);
        }
      }
    }
    for (auto& [k, v] : args.keyword) d.set(Value::string(k), v);
    return d;
  };
  globals.set("dict", Value::function("dict", [mapping_from_args](Interpreter&, CallArgs& args) {
                return Value::dict(mapping_from_args(args, "dict"));
              }));
  globals.set("namespace", Value::function("namespace", [mapping_from_args](Interpreter& interp, CallArgs& args) {
                auto ns = std::make_shared<Namespace>();
                ns->attributes = mapping_from_args(args, "namespace");
                interp.remember_namespace(ns);
                return Value::object(Kind::kNamespace, std::move(ns));
              }));
  globals.set("joiner", Value::function("joiner", [](Interpreter&, CallArgs& args) {
                auto a = bind("joiner", args, {"sep"});
                std::string sep = a[0] ? to_str(*a[0]) : ", ";
                auto used = std::make_shared<bool>(false);
                return Value::function("joiner", [sep, used](Interpreter&, CallArgs&) {
                  if (!*used) {
                    *used = true;
                    return Value::string("");
                  }
                  return Value::string(sep);
                });
              }));
  globals.set("raise_exception", Value::function("raise_exception", [](Interpreter&, CallArgs& args) -> Value {
                auto a = bind("raise_exception", args, {"message"});
                if (!a[0]) type_error("raise_exception() missing 1 required positional argument: 'message'");
                throw TemplateError{ErrorKind::kRaised, to_str(*a[0]), args.line};
              }));
  globals.set("strftime_now", Value::function("strftime_now", [](Interpreter& interp, CallArgs& args) {
                auto a = bind("strftime_now", args, {"format"});
                if (!a[0]) type_error("strftime_now() missing 1 required positional argument: 'format'");
                std::string format = as_text(*a[0], "strftime() argument 1");
                // datetime.strftime handles %f, %z and %Z itself: a naive datetime has no offset or zone name.
                std::string c_format;
                for (size_t i = 0; i < format.size(); ++i) {
                  if (format[i] == '%' && i + 1 < format.size()) {
                    char d = format[i + 1];
                    if (d == 'f') {
                      c_format += "000000";
                      ++i;
                      continue;
                    }
                    if (d == 'z' || d == 'Z') {
                      ++i;
                      continue;
                    }
                    c_format += format[i];
                    c_format += format[++i];
                    continue;
                  }
                  c_format += format[i];
                }
                std::tm tm = interp.now();
                std::string out(256 + c_format.size() * 8, '\0');
                size_t n = c_format.empty() ? 0 : std::strftime(out.data(), out.size(), c_format.c_str(), &tm);
                out.resize(n);
                return Value::string(std::move(out));
              }));
}

FilterFn find_filter(std::string_view name) {
  static const std::unordered_map<std::string_view, FilterFn> kFilters = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_unsupported},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"filesizeformat", f_unsupported},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_escape},
      {"format", f_format},
      {"groupby", f_unsupported},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"pprint", f_unsupported},
      {"random", f_unsupported},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"slice", f_unsupported},
      {"sort", f_sort},
      {"string", f_string},
      {"striptags", f_unsupported},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_unsupported},
      {"unique", f_unique},
      {"upper", f_upper},
      {"urlencode", f_unsupported},
      {"urlize", f_unsupported},
      {"wordcount", f_wordcount},
      {"wordwrap", f_unsupported},
      {"xmlattr", f_unsupported},
  };
  auto it = kFilters.find(name);
  return it == kFilters.end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  static const std::unordered_map<std::string_view, TestFn> kTests = {
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"filter", t_filter},
      {"test", t_test},
      {"none", t_none},
      {"boolean", t_boolean},
      {"false", t_false},
      {"true", t_true},
      {"integer", t_integer},
      {"float", t_float},
      {"lower", t_lower},
      {"upper", t_upper},
      {"string", t_string},
      {"mapping", t_mapping},
      {"number", t_number},
      {"sequence", t_sequence},
      {"iterable", t_iterable},
      {"callable", t_callable},
      {"sameas", t_sameas},
      {"escaped", t_escaped},
      {"in", t_in},
      {"==", t_eq},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"!=", t_ne},
      {"ne", t_ne},
      {">", t_gt},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">=", t_ge},
      {"ge", t_ge},
      {"<", t_lt},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<=", t_le},
      {"le", t_le},
  };
  auto it = kTests.find(name);
  return it == kTests.end() ? nullptr : it->second;
}

}  // namespace spill::jinja::detail
