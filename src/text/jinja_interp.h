// Internal to the Jinja interpreter: the evaluator (jinja_eval.cpp) and what the builtins
// (jinja_builtins.cpp, jinja_strings.cpp) need from it.
#pragma once
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_ast.h"

namespace spill::jinja::detail {

// Variables visible at one point of the template. jinja2 gives each for-loop iteration, macro
// call, with-block and set-block body a fresh scope whose lookups fall through to the enclosing
// one; if-blocks share their scope.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  explicit Scope(std::shared_ptr<Scope> p = nullptr) : parent(std::move(p)) {}
  ~Scope();  // releases its values iteratively (see ~Value)
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value value);
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  // Nested macro calls allowed; Python's recursion limit stops jinja2 at about 200 as well.
  static constexpr int kMaxMacroDepth = 200;

  Interpreter(const Program& program, const RenderOptions& options);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  RenderedText render(const nlohmann::ordered_json& variables, const InputMarking& marking);

  // Python/jinja2 operations the builtins share.
  Value call(const Value& callee, CallArgs& args);
  Value getattr(const Value& obj, std::string_view name);  // environment.getattr
  Value getitem(const Value& obj, const Value& key);       // environment.getitem
  Value call_filter(const std::string& name, const Value& value, CallArgs& args);
  bool call_test(const std::string& name, const Value& value, CallArgs& args);
  std::tm now() const;
  // Namespaces can hold themselves or macros whose scope holds them: they are emptied after the
  // render so that such cycles of shared pointers do not leak.
  void remember_namespace(const std::shared_ptr<const Namespace>& ns) { namespaces_.push_back(ns); }

 private:
  const Program& program_;
  const RenderOptions& options_;
  int macro_depth_ = 0;
  // A macro's scope holds the macro (that is how it calls itself): cut these cycles when done.
  std::vector<std::weak_ptr<Scope>> macro_scopes_;
  std::vector<std::weak_ptr<const Namespace>> namespaces_;

  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_inner(const Expr& e, const ScopePtr& scope);
  CallArgs eval_args(const Arguments& a, const ScopePtr& scope, int line);
  Value eval_filter(const FilterExpr& f, const ScopePtr& scope, const Value* block_text);
  Value eval_slice(const Value& obj, const SliceExpr& s, const ScopePtr& scope);

  Flow exec(const Body& body, const ScopePtr& scope, MarkedText& out);
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope, MarkedText& out);
  Flow exec_for(const ForStmt& s, const ScopePtr& scope, MarkedText& out);
  void assign(const Expr& target, const Value& value, const ScopePtr& scope);

  Value make_macro(std::shared_ptr<const MacroDef> macro, ScopePtr closure);
  Value invoke_macro(const MacroDef& macro, const ScopePtr& closure, CallArgs& args);
};

// `result` of a filter or str method applied to subject and args, marked as input if they hold any.
Value mark_derived(const Value& result, const Value& subject, const CallArgs& args);

// Python's a + b (sum filter).
Value python_add(Interpreter& interp, const Value& a, const Value& b);

// ---- builtins (jinja_builtins.cpp) -------------------------------------------------------------

// range, dict, namespace, raise_exception, strftime_now, ...
void add_globals(Scope& globals);
// A bound method of a str, dict, list or tuple (`s.strip`, `d.items`), an Undefined that raises
// SecurityError for methods that would mutate, or nullopt when the type has no such method.
std::optional<Value> builtin_method(const Value& self, std::string_view name);
// The attributes of a for loop's `loop` variable.
Value loop_attribute(const Value& loop, std::string_view name);
// Python's str % args (printf-style formatting).
std::string percent_format(Interpreter& interp, const std::string& format, const Value& args);
// Python's slicing of str, list and tuple; nullopt where Python raises TypeError.
std::optional<Value> slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step);

}  // namespace spill::jinja::detail
