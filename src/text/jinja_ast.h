// Internal to the Jinja interpreter: tokens, the syntax tree, and the entry points of the lexer,
// parser and interpreter (src/text/jinja_lexer.cpp, jinja_parser.cpp, jinja_eval.cpp).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja.h"
#include "text/jinja_value.h"

namespace spill::jinja::detail {

// ---- tokens ------------------------------------------------------------------------------------

enum class TokenType {
  kData,  // template text between tags (already whitespace-controlled)
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,  // value holds the unescaped string
  kInteger,
  kFloat,
  kOperator,  // value holds the operator text: "+", "//", "==", "(", ...
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string value;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;

  bool is_op(std::string_view op) const { return type == TokenType::kOperator && value == op; }
  bool is_name(std::string_view name) const { return type == TokenType::kName && value == name; }
};

// A TemplateSyntaxError at `line`: what the lexer and the parser throw.
[[noreturn]] inline void syntax_error(std::string message, int line) {
  throw TemplateError{ErrorKind::kSyntax, std::move(message), line};
}

// Throws TemplateError(kSyntax) with the line set.
std::vector<Token> tokenize(std::string_view source, const Options& options);

// ---- expressions ----------------------------------------------------------------------------------

enum class ExprKind {
  kConst,
  kName,
  kNSRef,  // ns.attr as an assignment target
  kGetattr,
  kGetitem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNeg,
  kPos,
  kNot,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kAnd,
  kOr,
  kCompare,
  kConcat,
  kCondExpr,
  kList,
  kTuple,
  kDict,
};

struct Expr {
  ExprKind kind;
  int line;
  Expr(ExprKind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  ExprPtr dyn_args;    // *args
  ExprPtr dyn_kwargs;  // **kwargs
};

struct ConstExpr : Expr {
  Value value;
  ConstExpr(Value v, int l) : Expr(ExprKind::kConst, l), value(std::move(v)) {}
};

struct NameExpr : Expr {
  std::string name;
  NameExpr(std::string n, int l) : Expr(ExprKind::kName, l), name(std::move(n)) {}
};

struct NSRefExpr : Expr {
  std::string name, attr;
  NSRefExpr(std::string n, std::string a, int l) : Expr(ExprKind::kNSRef, l), name(std::move(n)), attr(std::move(a)) {}
};

struct GetattrExpr : Expr {
  ExprPtr object;
  std::string attr;
  GetattrExpr(ExprPtr o, std::string a, int l)
      : Expr(ExprKind::kGetattr, l), object(std::move(o)), attr(std::move(a)) {}
};

struct GetitemExpr : Expr {
  ExprPtr object;
  ExprPtr index;  // may be a SliceExpr
  GetitemExpr(ExprPtr o, ExprPtr i, int l) : Expr(ExprKind::kGetitem, l), object(std::move(o)), index(std::move(i)) {}
};

struct SliceExpr : Expr {
  ExprPtr start, stop, step;  // each may be null
  explicit SliceExpr(int l) : Expr(ExprKind::kSlice, l) {}
};

struct CallExpr : Expr {
  ExprPtr callee;
  Arguments args;
  CallExpr(ExprPtr c, Arguments a, int l) : Expr(ExprKind::kCall, l), callee(std::move(c)), args(std::move(a)) {}
};

class Interpreter;
using FilterFn = Value (*)(Interpreter&, const Value& subject, CallArgs& args);
using TestFn = bool (*)(Interpreter&, const Value& subject, CallArgs& args);

// Both filters and tests: `subject|name(args)` and `subject is name(args)`.
struct FilterExpr : Expr {
  ExprPtr subject;  // null for the innermost filter of a filter block or set block
  std::string name;
  Arguments args;
  FilterFn filter = nullptr;  // resolved after parsing; null (unknown) only inside if/else
  TestFn test = nullptr;
  FilterExpr(ExprKind k, ExprPtr s, std::string n, Arguments a, int l)
      : Expr(k, l), subject(std::move(s)), name(std::move(n)), args(std::move(a)) {}
};

struct UnaryExpr : Expr {
  ExprPtr operand;
  UnaryExpr(ExprKind k, ExprPtr o, int l) : Expr(k, l), operand(std::move(o)) {}
};

struct BinaryExpr : Expr {
  ExprPtr left, right;
  BinaryExpr(ExprKind k, ExprPtr a, ExprPtr b, int l) : Expr(k, l), left(std::move(a)), right(std::move(b)) {}
};

enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct CompareExpr : Expr {
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
  CompareExpr(ExprPtr f, int l) : Expr(ExprKind::kCompare, l), first(std::move(f)) {}
};

struct ConcatExpr : Expr {
  std::vector<ExprPtr> parts;
  explicit ConcatExpr(int l) : Expr(ExprKind::kConcat, l) {}
};

struct CondExpr : Expr {
  ExprPtr test, then_expr, else_expr;  // else_expr may be null
  CondExpr(ExprPtr t, ExprPtr a, ExprPtr b, int l)
      : Expr(ExprKind::kCondExpr, l), test(std::move(t)), then_expr(std::move(a)), else_expr(std::move(b)) {}
};

struct SeqExpr : Expr {  // list or tuple literal
  std::vector<ExprPtr> items;
  SeqExpr(ExprKind k, int l) : Expr(k, l) {}
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;
  explicit DictExpr(int l) : Expr(ExprKind::kDict, l) {}
};

// ---- statements ------------------------------------------------------------------------------------

enum class StmtKind {
  kText,
  kPrint,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,
  kScope,  // a body run in its own scope: transformers' {% generation %}
  kBreak,
  kContinue,
};

struct Stmt {
  StmtKind kind;
  int line;
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct TextStmt : Stmt {
  std::string text;
  TextStmt(std::string t, int l) : Stmt(StmtKind::kText, l), text(std::move(t)) {}
};

struct PrintStmt : Stmt {
  ExprPtr expr;
  PrintStmt(ExprPtr e, int l) : Stmt(StmtKind::kPrint, l), expr(std::move(e)) {}
};

struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body else_body;
  explicit IfStmt(int l) : Stmt(StmtKind::kIf, l) {}
};

struct ForStmt : Stmt {
  ExprPtr target;  // NameExpr or tuple of NameExpr
  ExprPtr iter;
  ExprPtr filter;  // `for x in y if cond`, may be null
  Body body, else_body;
  explicit ForStmt(int l) : Stmt(StmtKind::kFor, l) {}
};

struct SetStmt : Stmt {
  ExprPtr target;  // NameExpr, NSRefExpr or tuple of those
  ExprPtr value;
  SetStmt(ExprPtr t, ExprPtr v, int l) : Stmt(StmtKind::kSet, l), target(std::move(t)), value(std::move(v)) {}
};

struct SetBlockStmt : Stmt {
  ExprPtr target;
  ExprPtr filter;  // FilterExpr chain whose innermost subject is null, or null
  Body body;
  explicit SetBlockStmt(int l) : Stmt(StmtKind::kSetBlock, l) {}
};

// A macro definition, also the `caller` of a call block.
struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool catch_varargs = false;  // the body reads `varargs`
  bool catch_kwargs = false;   // the body reads `kwargs`
  bool uses_caller = false;    // the body reads `caller`
};

struct MacroStmt : Stmt {
  std::shared_ptr<MacroDef> macro;
  explicit MacroStmt(int l) : Stmt(StmtKind::kMacro, l), macro(std::make_shared<MacroDef>()) {}
};

struct CallBlockStmt : Stmt {
  ExprPtr call;  // a CallExpr
  std::shared_ptr<MacroDef> caller;
  explicit CallBlockStmt(int l) : Stmt(StmtKind::kCallBlock, l), caller(std::make_shared<MacroDef>()) {}
};

struct FilterBlockStmt : Stmt {
  ExprPtr filter;  // FilterExpr chain whose innermost subject is null
  Body body;
  explicit FilterBlockStmt(int l) : Stmt(StmtKind::kFilterBlock, l) {}
};

struct WithStmt : Stmt {
  std::vector<ExprPtr> targets;
  std::vector<ExprPtr> values;
  Body body;
  explicit WithStmt(int l) : Stmt(StmtKind::kWith, l) {}
};

struct ScopeStmt : Stmt {
  Body body;
  explicit ScopeStmt(int l) : Stmt(StmtKind::kScope, l) {}
};

struct Program {
  Body body;
  Options options;
};

// Parses and validates (unknown filters/tests outside if-blocks are errors here, as in jinja2).
// Throws TemplateError(kSyntax) with the line set.
std::shared_ptr<Program> parse(std::string_view source, const Options& options);

// Builtins (jinja_builtins.cpp).
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

}  // namespace spill::jinja::detail
