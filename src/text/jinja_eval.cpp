// The tree-walking interpreter: statements write to an output string, expressions evaluate to
// Values with the semantics of jinja2's generated Python code under ImmutableSandboxedEnvironment.
#include <fmt/format.h>

#include <cmath>

#include "text/jinja_interp.h"

namespace spill::jinja::detail {

// ---- scopes ------------------------------------------------------------------------------------------

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

Scope::~Scope() {
  std::vector<Value> held;
  held.reserve(vars.size());
  for (auto& [name, v] : vars) held.push_back(std::move(v));
  vars.clear();
  Value::release_all(held);
}

void Scope::set(std::string_view name, Value value) {
  for (auto& [k, v] : vars) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(std::string(name), std::move(value));
}

// ---- arithmetic -------------------------------------------------------------------------------------

namespace {

const char* op_symbol(ExprKind k) {
  switch (k) {
    case ExprKind::kAdd:
      return "+";
    case ExprKind::kSub:
      return "-";
    case ExprKind::kMul:
      return "*";
    case ExprKind::kDiv:
      return "/";
    case ExprKind::kFloorDiv:
      return "//";
    case ExprKind::kMod:
      return "%";
    case ExprKind::kPow:
      return "** or pow()";
    default:
      return "?";
  }
}

[[noreturn]] void unsupported_operands(ExprKind k, const Value& a, const Value& b) {
  type_error(
      fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op_symbol(k), type_name(a), type_name(b)));
}

[[noreturn]] void integer_overflow() {
  raise(ErrorKind::kOverflow, "integer result does not fit in 64 bits (spill's templates use 64-bit integers)");
}

Value repeat(const Value& seq, int64_t times) {
  double unit = seq.is_string() ? double(seq.as_string().size()) : double(seq.items().size()) * sizeof(Value);
  check_result_size(unit * double(times));
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    Value result = Value::string(std::move(out));
    return contains_input(seq) ? mark_as_input(result) : result;
  }
  Seq out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.kind() == Kind::kTuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  if (m == 0) m = std::copysign(0.0, b);
  return m;
}

}  // namespace

static Value binary_op(ExprKind k, const Value& a, const Value& b, Interpreter& interp) {
  // str % x formats whatever x is (an Undefined only fails if a %(key)s looks into it).
  if (k == ExprKind::kMod && a.is_string()) {
    Value formatted = Value::string(percent_format(interp, a.as_string(), b));
    return contains_input(a) || contains_input(b) ? mark_as_input(formatted) : formatted;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool ints = numbers && !a.is_float() && !b.is_float();
  switch (k) {
    case ExprKind::kAdd:
      if (ints) {
        int64_t r;
        if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) integer_overflow();
        return Value::integer(r);
      }
      if (numbers) return Value::number(a.as_float() + b.as_float());
      if (a.is_string() && b.is_string()) {
        MarkedText sum;
        sum.append(a);
        sum.append(b);
        return sum.take();
      }
      if ((a.kind() == Kind::kList && b.kind() == Kind::kList) ||
          (a.kind() == Kind::kTuple && b.kind() == Kind::kTuple)) {
        Seq out = a.items();
        out.insert(out.end(), b.items().begin(), b.items().end());
        return a.kind() == Kind::kList ? Value::list(std::move(out)) : Value::tuple(std::move(out));
      }
      if (a.is_string() || a.kind() == Kind::kList || a.kind() == Kind::kTuple) {
        type_error(fmt::format("can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b), type_name(a)));
      }
      unsupported_operands(k, a, b);
    case ExprKind::kSub:
      if (ints) {
        int64_t r;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) integer_overflow();
        return Value::integer(r);
      }
      if (numbers) return Value::number(a.as_float() - b.as_float());
      unsupported_operands(k, a, b);
    case ExprKind::kMul: {
      if (ints) {
        int64_t r;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) integer_overflow();
        return Value::integer(r);
      }
      if (numbers) return Value::number(a.as_float() * b.as_float());
      auto is_seq = [](const Value& v) { return v.is_string() || v.kind() == Kind::kList || v.kind() == Kind::kTuple; };
      if (is_seq(a) || is_seq(b)) {
        const Value& seq = is_seq(a) ? a : b;
        const Value& n = is_seq(a) ? b : a;
        if (n.is_int() || n.is_bool()) return repeat(seq, n.as_int());
        if (!is_seq(n)) type_error(fmt::format("can't multiply sequence by non-int of type '{}'", type_name(n)));
      }
      unsupported_operands(k, a, b);
    }
    case ExprKind::kDiv:
      if (numbers) {
        if (b.as_float() == 0) raise(ErrorKind::kZeroDivision, ints ? "division by zero" : "float division by zero");
        return Value::number(a.as_float() / b.as_float());
      }
      unsupported_operands(k, a, b);
    case ExprKind::kFloorDiv:
      if (ints) {
        int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) raise(ErrorKind::kZeroDivision, "integer division or modulo by zero");
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value::integer(q);
      }
      if (numbers) {
        if (b.as_float() == 0) raise(ErrorKind::kZeroDivision, "float floor division by zero");
        double x = a.as_float(), y = b.as_float();
        return Value::number((x - py_fmod(x, y)) / y);
      }
      unsupported_operands(k, a, b);
    case ExprKind::kMod:
      if (ints) {
        int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) raise(ErrorKind::kZeroDivision, "integer modulo by zero");
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value::integer(m);
      }
      if (numbers) {
        if (b.as_float() == 0) raise(ErrorKind::kZeroDivision, "float modulo");
        return Value::number(py_fmod(a.as_float(), b.as_float()));
      }
      unsupported_operands(k, a, b);
    case ExprKind::kPow:
      if (ints && b.as_int() >= 0) {
        int64_t base = a.as_int(), e = b.as_int(), r = 1;
        while (e > 0) {
          if ((e & 1) && __builtin_mul_overflow(r, base, &r)) integer_overflow();
          e >>= 1;
          if (e > 0 && __builtin_mul_overflow(base, base, &base)) integer_overflow();
        }
        return Value::integer(r);
      }
      if (numbers) {
        double x = a.as_float(), y = b.as_float();
        if (x == 0 && y < 0) raise(ErrorKind::kZeroDivision, "0.0 cannot be raised to a negative power");
        if (x < 0 && y != std::floor(y)) {
          raise(ErrorKind::kUnsupported, "a negative number raised to a fractional power is complex");
        }
        return Value::number(std::pow(x, y));
      }
      unsupported_operands(k, a, b);
    default:
      break;
  }
  raise(ErrorKind::kRuntime, "unknown operator");
}

Value python_add(Interpreter& interp, const Value& a, const Value& b) {
  return binary_op(ExprKind::kAdd, a, b, interp);
}

static bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (item.is_undefined()) fail_undefined(item);
      if (!item.is_string()) {
        type_error(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kIterator:
      for (const Value& v : container.items()) {
        if (equals(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      require_hashable(item);
      return container.as_dict().find(item) != nullptr;
    default:
      type_error(fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

static bool compare_op(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::kEq:
      return equals(a, b);
    case CompareOp::kNe:
      return !equals(a, b);
    case CompareOp::kLt:
      return compare(a, b, "<") < 0;
    case CompareOp::kLe:
      return compare(a, b, "<=") <= 0;
    case CompareOp::kGt:
      return compare(a, b, ">") > 0;
    case CompareOp::kGe:
      return compare(a, b, ">=") >= 0;
    case CompareOp::kIn:
      return contains(b, a);
    case CompareOp::kNotIn:
      return !contains(b, a);
  }
  return false;
}

// ---- the interpreter -----------------------------------------------------------------------------

Interpreter::Interpreter(const Program& program, const RenderOptions& options) : program_(program), options_(options) {}

Interpreter::~Interpreter() {
  for (const auto& weak : macro_scopes_) {
    if (auto scope = weak.lock()) scope->vars.clear();
  }
  for (const auto& weak : namespaces_) {
    if (auto ns = weak.lock()) ns->attributes.entries.clear();
  }
}

std::tm Interpreter::now() const {
  if (options_.now) return *options_.now;
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

RenderedText Interpreter::render(const nlohmann::ordered_json& variables, const InputMarking& marking) {
  RenderLimitsScope limits(options_.limits);
  auto globals = std::make_shared<Scope>();
  add_globals(*globals);
  auto context = std::make_shared<Scope>(globals);
  for (const auto& [key, value] : variables.items()) {
    const bool input =
        std::find(marking.variables.begin(), marking.variables.end(), key) != marking.variables.end();
    context->set(key, input ? from_json_marked(value, marking.trusted_keys) : from_json(value));
  }
  auto top = std::make_shared<Scope>(context);
  MarkedText out;
  exec(program_.body, top, out);
  return RenderedText{std::move(out.text), std::move(out.input)};
}

Flow Interpreter::exec(const Body& body, const ScopePtr& scope, MarkedText& out) {
  for (const auto& s : body) {
    Flow flow;
    try {
      NestingGuard nest;
      check_deadline();
      flow = exec_stmt(*s, scope, out);
      check_result_size(double(out.text.size()));
    } catch (TemplateError& e) {
      if (e.line == 0) e.line = s->line;
      throw;
    }
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Flow Interpreter::exec_stmt(const Stmt& s, const ScopePtr& scope, MarkedText& out) {
  switch (s.kind) {
    case StmtKind::kText:
      out.append(std::string_view(static_cast<const TextStmt&>(s).text));
      return Flow::kNormal;
    case StmtKind::kPrint:
      out.append(eval(*static_cast<const PrintStmt&>(s).expr, scope));
      return Flow::kNormal;
    case StmtKind::kIf: {
      const auto& n = static_cast<const IfStmt&>(s);
      for (const auto& [test, body] : n.branches) {
        if (truthy(eval(*test, scope))) return exec(body, scope, out);
      }
      return exec(n.else_body, scope, out);
    }
    case StmtKind::kFor:
      return exec_for(static_cast<const ForStmt&>(s), scope, out);
    case StmtKind::kSet: {
      const auto& n = static_cast<const SetStmt&>(s);
      assign(*n.target, eval(*n.value, scope), scope);
      return Flow::kNormal;
    }
    case StmtKind::kSetBlock: {
      const auto& n = static_cast<const SetBlockStmt&>(s);
      MarkedText text;
      // jinja2 inlines block bodies in the loop around them: a break leaves before the assignment.
      if (Flow flow = exec(n.body, std::make_shared<Scope>(scope), text); flow != Flow::kNormal) return flow;
      Value value = text.take();
      if (n.filter) value = eval_filter(static_cast<const FilterExpr&>(*n.filter), scope, &value);
      assign(*n.target, value, scope);
      return Flow::kNormal;
    }
    case StmtKind::kMacro: {
      const auto& macro = static_cast<const MacroStmt&>(s).macro;
      scope->set(macro->name, make_macro(macro, scope));
      return Flow::kNormal;
    }
    case StmtKind::kCallBlock: {
      const auto& n = static_cast<const CallBlockStmt&>(s);
      const auto& call = static_cast<const CallExpr&>(*n.call);
      Value callee = eval(*call.callee, scope);
      CallArgs args = eval_args(call.args, scope, call.line);
      args.keyword.emplace_back("caller", make_macro(n.caller, scope));
      out.append(this->call(callee, args));
      return Flow::kNormal;
    }
    case StmtKind::kFilterBlock: {
      const auto& n = static_cast<const FilterBlockStmt&>(s);
      MarkedText text;
      if (Flow flow = exec(n.body, std::make_shared<Scope>(scope), text); flow != Flow::kNormal) return flow;
      Value value = text.take();
      out.append(eval_filter(static_cast<const FilterExpr&>(*n.filter), scope, &value));
      return Flow::kNormal;
    }
    case StmtKind::kWith: {
      const auto& n = static_cast<const WithStmt&>(s);
      auto inner = std::make_shared<Scope>(scope);
      for (size_t i = 0; i < n.targets.size(); ++i) assign(*n.targets[i], eval(*n.values[i], scope), inner);
      return exec(n.body, inner, out);
    }
    case StmtKind::kScope:
      return exec(static_cast<const ScopeStmt&>(s).body, std::make_shared<Scope>(scope), out);
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

Flow Interpreter::exec_for(const ForStmt& s, const ScopePtr& scope, MarkedText& out) {
  Value iterable = eval(*s.iter, scope);
  Seq all = iterate(iterable);
  auto items = std::make_shared<Seq>();
  if (s.filter) {
    for (Value& item : all) {
      auto probe = std::make_shared<Scope>(scope);
      assign(*s.target, item, probe);
      if (truthy(eval(*s.filter, probe))) items->push_back(std::move(item));
    }
  } else {
    *items = std::move(all);
  }
  auto last_changed = std::make_shared<Value>();
  auto loop_items = std::shared_ptr<const Seq>(items);
  for (size_t i = 0; i < items->size(); ++i) {
    check_deadline();  // an empty body runs no statement that would
    auto iteration = std::make_shared<Scope>(scope);
    assign(*s.target, (*items)[i], iteration);
    auto state = std::make_shared<LoopState>();
    state->index0 = int64_t(i);
    state->length = int64_t(items->size());
    state->items = loop_items;
    state->last_changed = last_changed;
    iteration->set("loop", Value::object(Kind::kLoop, std::move(state)));
    if (exec(s.body, iteration, out) == Flow::kBreak) break;
  }
  if (items->empty()) exec(s.else_body, std::make_shared<Scope>(scope), out);
  return Flow::kNormal;
}

void Interpreter::assign(const Expr& target, const Value& value, const ScopePtr& scope) {
  switch (target.kind) {
    case ExprKind::kName:
      scope->set(static_cast<const NameExpr&>(target).name, value);
      return;
    case ExprKind::kNSRef: {
      const auto& ref = static_cast<const NSRefExpr&>(target);
      const Value* ns = scope->find(ref.name);
      if (!ns || ns->kind() != Kind::kNamespace) {
        throw TemplateError{ErrorKind::kRuntime, "cannot assign attribute on non-namespace object", target.line};
      }
      ns->as<Namespace>().attributes.set(Value::string(ref.attr), value);
      return;
    }
    case ExprKind::kTuple: {
      const auto& targets = static_cast<const SeqExpr&>(target).items;
      Seq values = iterate(value);
      if (values.size() < targets.size()) {
        raise(ErrorKind::kValue,
              fmt::format("not enough values to unpack (expected {}, got {})", targets.size(), values.size()));
      }
      if (values.size() > targets.size()) {
        raise(ErrorKind::kValue, fmt::format("too many values to unpack (expected {})", targets.size()));
      }
      for (size_t i = 0; i < targets.size(); ++i) assign(*targets[i], values[i], scope);
      return;
    }
    default:
      throw TemplateError{ErrorKind::kSyntax, "cannot assign to this expression", target.line};
  }
}

// ---- macros -------------------------------------------------------------------------------------------

Value Interpreter::make_macro(std::shared_ptr<const MacroDef> macro, ScopePtr closure) {
  macro_scopes_.push_back(closure);
  auto f = std::make_shared<Function>();
  f->name = macro->name;
  f->is_macro = true;
  f->call = [macro = std::move(macro), closure = std::move(closure)](Interpreter& interp, CallArgs& args) {
    return interp.invoke_macro(*macro, closure, args);
  };
  return Value::object(Kind::kFunction, std::move(f));
}

// jinja2.runtime.Macro.__call__: positional arguments first, then keywords for the remaining
// parameters, `caller`, and the catch-alls `varargs` / `kwargs` when the body reads them.
Value Interpreter::invoke_macro(const MacroDef& m, const ScopePtr& closure, CallArgs& args) {
  if (macro_depth_ >= kMaxMacroDepth) raise(ErrorKind::kRecursion, "maximum recursion depth exceeded");
  struct DepthGuard {
    int& depth;
    explicit DepthGuard(int& d) : depth(d) { ++depth; }
    ~DepthGuard() { --depth; }
  } guard(macro_depth_);
  const size_t count = m.params.size();
  auto scope = std::make_shared<Scope>(closure);
  std::vector<std::optional<Value>> bound(count);
  auto& keyword = args.keyword;
  auto pop_keyword = [&](const std::string& key) -> std::optional<Value> {
    for (auto it = keyword.begin(); it != keyword.end(); ++it) {
      if (it->first == key) {
        Value v = std::move(it->second);
        keyword.erase(it);
        return v;
      }
    }
    return std::nullopt;
  };
  bool found_caller = false;
  for (size_t i = 0; i < count && i < args.positional.size(); ++i) bound[i] = args.positional[i];
  if (args.positional.size() < count) {
    for (size_t i = args.positional.size(); i < count; ++i) {
      bound[i] = pop_keyword(m.params[i]);
      if (m.params[i] == "caller") found_caller = true;
    }
  } else {
    found_caller = std::find(m.params.begin(), m.params.end(), "caller") != m.params.end();
  }
  std::optional<Value> caller;
  if (m.uses_caller && !found_caller) {
    caller = pop_keyword("caller");
    if (!caller || caller->is_none()) caller = Value::undefined_hint("No caller defined");
  }
  if (!m.catch_kwargs && !keyword.empty()) {
    for (const auto& [k, v] : keyword) {
      if (k == "caller") {
        type_error(
            fmt::format("macro {} was invoked with two values for the special caller argument. This is most "
                        "likely a bug.",
                        repr_string(m.name)));
      }
    }
    type_error(
        fmt::format("macro {} takes no keyword argument {}", repr_string(m.name), repr_string(keyword[0].first)));
  }
  if (!m.catch_varargs && args.positional.size() > count) {
    type_error(fmt::format("macro {} takes not more than {} argument(s)", repr_string(m.name), count));
  }
  // Defaults are evaluated at call time, in the macro's scope, after the parameters before them.
  const size_t first_default = count - m.defaults.size();
  for (size_t i = 0; i < count; ++i) {
    Value v;
    if (bound[i]) {
      v = std::move(*bound[i]);
    } else if (i >= first_default) {
      v = eval(*m.defaults[i - first_default], scope);
    } else {
      v = Value::undefined_hint(fmt::format("parameter {} was not provided", repr_string(m.params[i])));
    }
    scope->set(m.params[i], std::move(v));
  }
  if (caller) scope->set("caller", *caller);
  if (m.catch_kwargs) {
    Dict d;
    for (auto& [k, v] : keyword) d.set(Value::string(k), std::move(v));
    scope->set("kwargs", Value::dict(std::move(d)));
  }
  if (m.catch_varargs) {
    Seq rest;
    if (args.positional.size() > count) rest.assign(args.positional.begin() + long(count), args.positional.end());
    scope->set("varargs", Value::tuple(std::move(rest)));
  }
  MarkedText out;
  exec(m.body, scope, out);
  return out.take();
}

// ---- expressions ----------------------------------------------------------------------------------

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  try {
    NestingGuard nest;
    check_deadline();
    return eval_inner(e, scope);
  } catch (TemplateError& err) {
    if (err.line == 0) err.line = e.line;
    throw;
  }
}

CallArgs Interpreter::eval_args(const Arguments& a, const ScopePtr& scope, int line) {
  CallArgs args;
  args.line = line;
  for (const auto& p : a.positional) args.positional.push_back(eval(*p, scope));
  for (const auto& [k, v] : a.keyword) args.keyword.emplace_back(k, eval(*v, scope));
  if (a.dyn_args) {
    for (Value& v : iterate(eval(*a.dyn_args, scope))) args.positional.push_back(std::move(v));
  }
  if (a.dyn_kwargs) {
    Value kw = eval(*a.dyn_kwargs, scope);
    if (!kw.is_dict()) type_error(fmt::format("argument after ** must be a mapping, not {}", type_name(kw)));
    for (const auto& [k, v] : kw.as_dict().entries) {
      if (!k.is_string()) type_error("keywords must be strings");
      args.keyword.emplace_back(k.as_string(), v);
    }
  }
  return args;
}

Value Interpreter::eval_filter(const FilterExpr& f, const ScopePtr& scope, const Value* block_text) {
  Value subject = f.subject ? (f.subject->kind == ExprKind::kFilter
                                   ? eval_filter(static_cast<const FilterExpr&>(*f.subject), scope, block_text)
                                   : eval(*f.subject, scope))
                            : *block_text;
  CallArgs args = eval_args(f.args, scope, f.line);
  if (!f.filter) raise(ErrorKind::kRuntime, fmt::format("No filter named {} found.", repr_string(f.name)));
  try {
    return mark_derived(f.filter(*this, subject, args), subject, args);
  } catch (TemplateError& err) {
    if (err.line == 0) err.line = f.line;
    throw;
  }
}

Value Interpreter::call_filter(const std::string& name, const Value& value, CallArgs& args) {
  FilterFn fn = find_filter(name);
  if (!fn) raise(ErrorKind::kFilterArgument, fmt::format("No filter named {}.", repr_string(name)));
  return mark_derived(fn(*this, value, args), value, args);
}

// A string a filter or method computed from marked operands is marked whole: which of its bytes
// came from input is not known (trim, replace, tojson, format, ...), and marking too much only
// keeps special tokens out of it. Lists of strings (split, list) are marked item by item.
// Results that are existing values (first, default, select, get) already carry their marks.
Value mark_derived(const Value& result, const Value& subject, const CallArgs& args) {
  const bool text = result.is_string() || (result.is_sequence() && subject.is_string());
  if (!text) return result;
  bool input = contains_input(subject);
  for (const Value& a : args.positional) input = input || contains_input(a);
  for (const auto& [k, a] : args.keyword) input = input || contains_input(a);
  return input ? mark_as_input(result) : result;
}

bool Interpreter::call_test(const std::string& name, const Value& value, CallArgs& args) {
  TestFn fn = find_test(name);
  if (!fn) raise(ErrorKind::kRuntime, fmt::format("No test named {}.", repr_string(name)));
  return fn(*this, value, args);
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.kind() == Kind::kFunction) return callee.as<Function>().call(*this, args);
  if (callee.is_undefined()) fail_undefined(callee);
  type_error(fmt::format("'{}' object is not callable", type_name(callee)));
}

static Value undefined_attribute(const Value& obj, std::string_view name) {
  UndefinedInfo info;
  info.has_object = true;
  info.object_type = object_type_repr(obj);
  info.name = repr_string(name);
  return Value::undefined(std::move(info));
}

Value Interpreter::getattr(const Value& obj, std::string_view name) {
  // Python's own attributes (__class__, __len__, ...) exist on every object and the sandbox
  // refuses them all.
  if (name.size() > 4 && name.substr(0, 2) == "__" && name.substr(name.size() - 2) == "__") {
    return Value::undefined_hint(
        fmt::format("access to attribute {} of {} object is unsafe.", repr_string(name), repr_string(type_name(obj))),
        ErrorKind::kSecurity);
  }
  switch (obj.kind()) {
    case Kind::kUndefined:
      fail_undefined(obj);
    case Kind::kDict:
    case Kind::kString:
    case Kind::kList:
    case Kind::kTuple:
      if (auto method = builtin_method(obj, name)) {
        // str methods compute new strings: mark their results like filters' (mark_derived).
        if (!obj.is_string() || method->kind() != Kind::kFunction) return *method;
        return Value::function(method->as<Function>().name, [method = *method, self = obj](Interpreter& interp,
                                                                                         CallArgs& args) {
          Value result = interp.call(method, args);
          return mark_derived(result, self, args);
        });
      }
      if (obj.is_dict()) {
        if (const Value* v = obj.as_dict().find(name)) return *v;
      }
      break;
    case Kind::kNamespace:
      if (const Value* v = obj.as<Namespace>().attributes.find(name)) return *v;
      break;
    case Kind::kLoop:
      return loop_attribute(obj, name);
    default:
      break;
  }
  return undefined_attribute(obj, name);
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::kUndefined:
      fail_undefined(obj);
    case Kind::kDict:
      if (const Value* v = obj.as_dict().find(key)) return *v;
      break;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kString:
      if (key.is_int() || key.is_bool()) {
        int64_t n = obj.is_string() ? int64_t(utf8_length(obj.as_string())) : int64_t(obj.items().size());
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          if (!obj.is_string()) return obj.items()[size_t(i)];
          std::u32string u = decode_utf8(obj.as_string());
          Value ch = Value::string(encode_utf8(std::u32string_view(u).substr(size_t(i), 1)));
          return contains_input(obj) ? mark_as_input(ch) : ch;
        }
        UndefinedInfo info;
        info.has_object = true;
        info.name_is_key = true;
        info.object_type = object_type_repr(obj);
        info.name = repr(key);
        return Value::undefined(std::move(info));
      }
      break;
    default:
      break;
  }
  // obj[key] failed with a LookupError or TypeError: jinja2 then tries the attribute of that name.
  if (key.is_string()) {
    std::string_view name = key.as_string();
    if (obj.kind() != Kind::kDict) {
      Value attr = getattr(obj, name);
      if (!attr.is_undefined()) return attr;
    } else if (auto method = builtin_method(obj, name)) {
      return *method;
    }
    return undefined_attribute(obj, name);
  }
  UndefinedInfo info;
  info.has_object = true;
  info.name_is_key = true;
  info.object_type = object_type_repr(obj);
  info.name = repr(key);
  return Value::undefined(std::move(info));
}

Value Interpreter::eval_slice(const Value& obj, const SliceExpr& s, const ScopePtr& scope) {
  // jinja2 compiles obj[a:b:c] to a plain Python subscript, not environment.getitem: failures raise.
  Value start = s.start ? eval(*s.start, scope) : Value::none();
  Value stop = s.stop ? eval(*s.stop, scope) : Value::none();
  Value step = s.step ? eval(*s.step, scope) : Value::none();
  if (obj.is_undefined()) fail_undefined(obj);
  if (auto v = slice_value(obj, start, stop, step)) return obj.is_string() && contains_input(obj) ? mark_as_input(*v) : *v;
  if (obj.is_string() || obj.kind() == Kind::kList || obj.kind() == Kind::kTuple) {
    type_error("slice indices must be integers or None or have an __index__ method");
  }
  if (obj.is_dict()) type_error("unhashable type: 'slice'");
  type_error(fmt::format("'{}' object is not subscriptable", type_name(obj)));
}

Value Interpreter::eval_inner(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case ExprKind::kConst:
      return static_cast<const ConstExpr&>(e).value;
    case ExprKind::kName: {
      const auto& name = static_cast<const NameExpr&>(e).name;
      if (const Value* v = scope->find(name)) return *v;
      return Value::undefined_name(name);
    }
    case ExprKind::kNSRef: {
      const auto& ref = static_cast<const NSRefExpr&>(e);
      const Value* v = scope->find(ref.name);
      return getattr(v ? *v : Value::undefined_name(ref.name), ref.attr);
    }
    case ExprKind::kGetattr: {
      const auto& n = static_cast<const GetattrExpr&>(e);
      return getattr(eval(*n.object, scope), n.attr);
    }
    case ExprKind::kGetitem: {
      const auto& n = static_cast<const GetitemExpr&>(e);
      Value obj = eval(*n.object, scope);
      if (n.index->kind == ExprKind::kSlice) return eval_slice(obj, static_cast<const SliceExpr&>(*n.index), scope);
      Value key = eval(*n.index, scope);
      return getitem(obj, key);
    }
    case ExprKind::kSlice:
      raise(ErrorKind::kRuntime, "slice outside of a subscript");
    case ExprKind::kCall: {
      const auto& n = static_cast<const CallExpr&>(e);
      Value callee = eval(*n.callee, scope);
      CallArgs args = eval_args(n.args, scope, n.line);
      return call(callee, args);
    }
    case ExprKind::kFilter:
      return eval_filter(static_cast<const FilterExpr&>(e), scope, nullptr);
    case ExprKind::kTest: {
      const auto& n = static_cast<const FilterExpr&>(e);
      Value subject = eval(*n.subject, scope);
      CallArgs args = eval_args(n.args, scope, n.line);
      if (!n.test) raise(ErrorKind::kRuntime, fmt::format("No test named {} found.", repr_string(n.name)));
      return Value::boolean(n.test(*this, subject, args));
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = eval(*static_cast<const UnaryExpr&>(e).operand, scope);
      if (v.is_undefined()) fail_undefined(v);
      bool neg = e.kind == ExprKind::kNeg;
      if (v.is_float()) return Value::number(neg ? -v.as_float() : v.as_float());
      if (v.is_int() || v.is_bool()) {
        if (neg && v.as_int() == INT64_MIN) integer_overflow();
        return Value::integer(neg ? -v.as_int() : v.as_int());
      }
      type_error(fmt::format("bad operand type for unary {}: '{}'", neg ? '-' : '+', type_name(v)));
    }
    case ExprKind::kNot:
      return Value::boolean(!truthy(eval(*static_cast<const UnaryExpr&>(e).operand, scope)));
    case ExprKind::kAnd: {
      const auto& n = static_cast<const BinaryExpr&>(e);
      Value left = eval(*n.left, scope);
      return truthy(left) ? eval(*n.right, scope) : left;
    }
    case ExprKind::kOr: {
      const auto& n = static_cast<const BinaryExpr&>(e);
      Value left = eval(*n.left, scope);
      return truthy(left) ? left : eval(*n.right, scope);
    }
    case ExprKind::kCompare: {
      const auto& n = static_cast<const CompareExpr&>(e);
      Value left = eval(*n.first, scope);
      for (const auto& [op, expr] : n.rest) {
        Value right = eval(*expr, scope);
        if (!compare_op(op, left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::kConcat: {
      MarkedText out;
      for (const auto& p : static_cast<const ConcatExpr&>(e).parts) out.append(eval(*p, scope));
      return out.take();
    }
    case ExprKind::kCondExpr: {
      const auto& n = static_cast<const CondExpr&>(e);
      if (truthy(eval(*n.test, scope))) return eval(*n.then_expr, scope);
      if (n.else_expr) return eval(*n.else_expr, scope);
      return Value::undefined_hint(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.", e.line));
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      Seq items;
      for (const auto& p : static_cast<const SeqExpr&>(e).items) items.push_back(eval(*p, scope));
      return e.kind == ExprKind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ExprKind::kDict: {
      Dict d;
      for (const auto& [k, v] : static_cast<const DictExpr&>(e).pairs) {
        Value key = eval(*k, scope);
        require_hashable(key);
        d.set(std::move(key), eval(*v, scope));
      }
      return Value::dict(std::move(d));
    }
    default: {
      const auto& n = static_cast<const BinaryExpr&>(e);
      Value left = eval(*n.left, scope);
      Value right = eval(*n.right, scope);
      return binary_op(e.kind, left, right, *this);
    }
  }
}

}  // namespace spill::jinja::detail
