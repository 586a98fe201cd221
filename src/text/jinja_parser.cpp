// Tokens -> syntax tree, a port of jinja2's recursive-descent parser (same precedence, same tuple
// rules, same places where it reports errors), followed by a validation pass that resolves filters
// and tests and works out what each macro's body reads.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>

#include "text/jinja_ast.h"

namespace spill::jinja::detail {
namespace {

std::string describe_type(TokenType type) {
  switch (type) {
    case TokenType::kData:
      return "template data / text";
    case TokenType::kVariableBegin:
      return "begin of print statement";
    case TokenType::kVariableEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "begin of statement block";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kName:
      return "name";
    case TokenType::kString:
      return "string";
    case TokenType::kInteger:
      return "integer";
    case TokenType::kFloat:
      return "float";
    case TokenType::kOperator:
      return "operator";
    case TokenType::kEof:
      return "end of template";
  }
  return "token";
}

std::string describe(const Token& t) {
  if (t.type == TokenType::kName || t.type == TokenType::kOperator) return t.value;
  return describe_type(t.type);
}

// An expected token: a type, optionally with a value ("name:endfor", "operator:(").
struct Want {
  TokenType type;
  std::string_view value;

  bool matches(const Token& t) const { return t.type == type && (value.empty() || t.value == value); }
  std::string describe() const {
    if (!value.empty()) return std::string(value);
    return describe_type(type);
  }
};

Want name(std::string_view n) {
  return {TokenType::kName, n};
}
Want op(std::string_view o) {
  return {TokenType::kOperator, o};
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_template() { return subparse(nullptr); }

 private:
  std::vector<Token> tokens_;
  size_t index_ = 0;
  int depth_ = 0;  // nesting of blocks and parenthesized expressions

  // Bounds the height of the syntax tree, and so the recursion of the parser, the validation
  // pass, the interpreter and the tree's destructor, on adversarial templates. Recursive descent
  // counts one level per call (Nest); operator, filter, test, attribute and call chains such as
  // `a.b.c...` or `x|f|f|f...` are loops that deepen the tree without recursing, so each link
  // counts one level for as long as the chain is being parsed (Chain).
  static constexpr int kMaxDepth = 200;
  void deepen(int line) {
    if (++depth_ > kMaxDepth)
      syntax_error(fmt::format("template nesting is too deep (more than {} levels of blocks, brackets or "
                               "operator/filter/attribute chains)",
                               kMaxDepth),
                   line);
  }
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) { p.deepen(p.current().line); }
    ~Nest() { --p.depth_; }
  };
  struct Chain {
    Parser& p;
    int links = 0;
    explicit Chain(Parser& parser) : p(parser) {}
    void link() {
      ++links;
      p.deepen(p.current().line);
    }
    ~Chain() { p.depth_ -= links; }
  };
  std::vector<std::string> tag_stack_;
  std::vector<std::vector<Want>> end_token_stack_;

  const Token& current() const { return tokens_[index_]; }
  const Token& look() const { return tokens_[std::min(index_ + 1, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& t = tokens_[index_];
    if (index_ + 1 < tokens_.size()) ++index_;
    return t;
  }
  bool skip_if(const Want& w) {
    if (!w.matches(current())) return false;
    next();
    return true;
  }
  const Token& expect(const Want& w) {
    if (!w.matches(current())) {
      if (current().type == TokenType::kEof) {
        syntax_error(fmt::format("unexpected end of template, expected {}.", repr_string(w.describe())),
                     current().line);
      }
      syntax_error(
          fmt::format("expected token {}, got {}", repr_string(w.describe()), repr_string(describe(current()))),
          current().line);
    }
    return next();
  }
  bool current_is(TokenType type) const { return current().type == type; }
  bool current_op(std::string_view o) const { return current().is_op(o); }

  [[noreturn]] void fail_unknown_tag(const std::string* tag, int line) {
    std::set<std::string> expected;
    for (const auto& wants : end_token_stack_) {
      for (const auto& w : wants) expected.insert(w.describe());
    }
    std::string currently;
    if (!end_token_stack_.empty()) {
      for (const auto& w : end_token_stack_.back()) {
        if (!currently.empty()) currently += " or ";
        currently += repr_string(w.describe());
      }
    }
    std::string message =
        tag ? fmt::format("Encountered unknown tag {}.", repr_string(*tag)) : "Unexpected end of template.";
    if (!currently.empty()) {
      if (tag && expected.count(*tag)) {
        message += " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for " +
                   currently + ".";
      } else {
        message += " Jinja was looking for the following tags: " + currently + ".";
      }
    }
    if (!tag_stack_.empty()) {
      message += " The innermost block that needs to be closed is " + repr_string(tag_stack_.back()) + ".";
    }
    syntax_error(message, line);
  }

  // ---- statements ----

  Body subparse(const std::vector<Want>* end_tokens) {
    Nest nest(*this);
    Body body;
    if (end_tokens) end_token_stack_.push_back(*end_tokens);
    while (!current_is(TokenType::kEof)) {
      const Token& token = current();
      if (token.type == TokenType::kData) {
        body.push_back(std::make_unique<TextStmt>(token.value, token.line));
        next();
      } else if (token.type == TokenType::kVariableBegin) {
        next();
        int line = current().line;
        body.push_back(std::make_unique<PrintStmt>(parse_tuple(false, true, {}, false), line));
        expect({TokenType::kVariableEnd, {}});
      } else if (token.type == TokenType::kBlockBegin) {
        next();
        if (end_tokens) {
          for (const Want& w : *end_tokens) {
            if (w.matches(current())) {
              end_token_stack_.pop_back();
              return body;
            }
          }
        }
        parse_statement(body);
        expect({TokenType::kBlockEnd, {}});
      } else {
        syntax_error("internal parsing error", token.line);
      }
    }
    if (end_tokens) end_token_stack_.pop_back();
    return body;
  }

  Body parse_statements(const std::vector<Want>& end_tokens, bool drop_needle) {
    skip_if(op(":"));
    expect({TokenType::kBlockEnd, {}});
    Body body = subparse(&end_tokens);
    if (current_is(TokenType::kEof)) {
      end_token_stack_.push_back(end_tokens);
      fail_unknown_tag(nullptr, current().line);
    }
    if (drop_needle) next();
    return body;
  }

  void parse_statement(Body& out) {
    const Token& token = current();
    if (token.type != TokenType::kName) syntax_error("tag name expected", token.line);
    const std::string tag = token.value;
    static const std::set<std::string> kUnsupported = {"block", "extends", "include", "from", "import", "autoescape"};
    if (kUnsupported.count(tag)) {
      syntax_error(fmt::format("the '{}' tag is not supported (spill renders self-contained chat templates)", tag),
                   token.line);
    }
    tag_stack_.push_back(tag);
    if (tag == "for") {
      out.push_back(parse_for());
    } else if (tag == "if") {
      out.push_back(parse_if());
    } else if (tag == "set") {
      out.push_back(parse_set());
    } else if (tag == "with") {
      out.push_back(parse_with());
    } else if (tag == "macro") {
      out.push_back(parse_macro());
    } else if (tag == "call") {
      out.push_back(parse_call_block());
    } else if (tag == "filter") {
      out.push_back(parse_filter_block());
    } else if (tag == "print") {
      int line = next().line;
      bool first = true;
      while (!current_is(TokenType::kBlockEnd)) {
        if (!first) expect(op(","));
        first = false;
        out.push_back(std::make_unique<PrintStmt>(parse_expression(true), line));
      }
    } else if (tag == "break" || tag == "continue") {
      int line = next().line;
      out.push_back(std::make_unique<Stmt>(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, line));
    } else if (tag == "generation") {
      // transformers' AssistantTracker extension: marks assistant text; rendering is unchanged.
      auto scope = std::make_unique<ScopeStmt>(next().line);
      scope->body = parse_statements({name("endgeneration")}, true);
      out.push_back(std::move(scope));
    } else {
      tag_stack_.pop_back();
      fail_unknown_tag(&tag, token.line);
    }
    tag_stack_.pop_back();
  }

  StmtPtr parse_for() {
    auto node = std::make_unique<ForStmt>(expect(name("for")).line);
    node->target = parse_assign_target(true, false, {name("in")}, false);
    expect(name("in"));
    node->iter = parse_tuple(false, false, {name("recursive")}, false);
    if (skip_if(name("if"))) node->filter = parse_expression(true);
    if (current().is_name("recursive")) syntax_error("recursive for loops are not supported", current().line);
    node->body = parse_statements({name("endfor"), name("else")}, false);
    if (next().value != "endfor") node->else_body = parse_statements({name("endfor")}, true);
    return node;
  }

  StmtPtr parse_if() {
    auto node = std::make_unique<IfStmt>(expect(name("if")).line);
    while (true) {
      ExprPtr test = parse_tuple(false, false, {}, false);
      Body body = parse_statements({name("elif"), name("else"), name("endif")}, false);
      node->branches.emplace_back(std::move(test), std::move(body));
      const Token& token = next();
      if (token.is_name("elif")) continue;
      if (token.is_name("else")) node->else_body = parse_statements({name("endif")}, true);
      break;
    }
    return node;
  }

  StmtPtr parse_set() {
    int line = next().line;
    ExprPtr target = parse_assign_target(true, false, {}, true);
    if (skip_if(op("=")))
      return std::make_unique<SetStmt>(std::move(target), parse_tuple(false, true, {}, false), line);
    auto node = std::make_unique<SetBlockStmt>(line);
    node->target = std::move(target);
    node->filter = parse_filter(nullptr, false);
    node->body = parse_statements({name("endset")}, true);
    return node;
  }

  StmtPtr parse_with() {
    auto node = std::make_unique<WithStmt>(next().line);
    while (!current_is(TokenType::kBlockEnd)) {
      if (!node->targets.empty()) expect(op(","));
      node->targets.push_back(parse_assign_target(true, false, {}, false));
      expect(op("="));
      node->values.push_back(parse_expression(true));
    }
    node->body = parse_statements({name("endwith")}, true);
    return node;
  }

  void parse_signature(MacroDef& macro) {
    expect(op("("));
    while (!current_op(")")) {
      if (!macro.params.empty()) expect(op(","));
      const Token& arg = expect({TokenType::kName, {}});
      if (skip_if(op("="))) {
        macro.defaults.push_back(parse_expression(true));
      } else if (!macro.defaults.empty()) {
        syntax_error("non-default argument follows default argument", arg.line);
      }
      macro.params.push_back(arg.value);
    }
    expect(op(")"));
  }

  StmtPtr parse_macro() {
    auto node = std::make_unique<MacroStmt>(next().line);
    node->macro->name = expect({TokenType::kName, {}}).value;
    parse_signature(*node->macro);
    node->macro->body = parse_statements({name("endmacro")}, true);
    return node;
  }

  StmtPtr parse_call_block() {
    auto node = std::make_unique<CallBlockStmt>(next().line);
    node->caller->name = "caller";
    if (current_op("(")) parse_signature(*node->caller);
    node->call = parse_expression(true);
    if (node->call->kind != ExprKind::kCall) syntax_error("expected call", node->line);
    node->caller->body = parse_statements({name("endcall")}, true);
    return node;
  }

  StmtPtr parse_filter_block() {
    auto node = std::make_unique<FilterBlockStmt>(next().line);
    node->filter = parse_filter(nullptr, true);
    node->body = parse_statements({name("endfilter")}, true);
    return node;
  }

  ExprPtr parse_assign_target(bool with_tuple, bool name_only, const std::vector<Want>& extra_end,
                              bool with_namespace) {
    ExprPtr target;
    if (name_only) {
      const Token& t = expect({TokenType::kName, {}});
      return std::make_unique<NameExpr>(t.value, t.line);
    }
    if (with_tuple) {
      target = parse_tuple(true, true, extra_end, false, with_namespace);
    } else {
      target = parse_primary(with_namespace);
    }
    check_assignable(*target);
    return target;
  }

  void check_assignable(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kName:
      case ExprKind::kNSRef:
        return;
      case ExprKind::kTuple:
        for (const auto& item : static_cast<const SeqExpr&>(e).items) check_assignable(*item);
        return;
      default: {
        std::string what = e.kind == ExprKind::kConst ? "const" : e.kind == ExprKind::kList ? "list" : "expression";
        syntax_error(fmt::format("can't assign to {}", repr_string(what)), e.line);
      }
    }
  }

  // ---- expressions ----

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    Nest nest(*this);
    int line = current().line;
    ExprPtr expr1 = parse_or();
    Chain chain(*this);
    while (skip_if(name("if"))) {
      chain.link();
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (skip_if(name("else"))) expr3 = parse_condexpr();
      expr1 = std::make_unique<CondExpr>(std::move(expr2), std::move(expr1), std::move(expr3), line);
      line = current().line;
    }
    return expr1;
  }

  ExprPtr parse_or() {
    int line = current().line;
    ExprPtr left = parse_and();
    Chain chain(*this);
    while (skip_if(name("or"))) {
      chain.link();
      left = std::make_unique<BinaryExpr>(ExprKind::kOr, std::move(left), parse_and(), line);
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_and() {
    int line = current().line;
    ExprPtr left = parse_not();
    Chain chain(*this);
    while (skip_if(name("and"))) {
      chain.link();
      left = std::make_unique<BinaryExpr>(ExprKind::kAnd, std::move(left), parse_not(), line);
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_not() {
    Nest nest(*this);
    if (current().is_name("not")) {
      int line = next().line;
      return std::make_unique<UnaryExpr>(ExprKind::kNot, parse_not(), line);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = current().line;
    ExprPtr expr = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    Chain chain(*this);  // a flat list of operands, but evaluated in one frame per link
    auto add = [&](CompareOp o) {
      chain.link();
      if (!cmp) cmp = std::make_unique<CompareExpr>(std::move(expr), line);
      cmp->rest.emplace_back(o, parse_math1());
    };
    while (true) {
      const Token& t = current();
      if (t.type == TokenType::kOperator && (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" ||
                                             t.value == ">" || t.value == ">=")) {
        std::string o = next().value;
        add(o == "=="   ? CompareOp::kEq
            : o == "!=" ? CompareOp::kNe
            : o == "<"  ? CompareOp::kLt
            : o == "<=" ? CompareOp::kLe
            : o == ">"  ? CompareOp::kGt
                        : CompareOp::kGe);
      } else if (skip_if(name("in"))) {
        add(CompareOp::kIn);
      } else if (t.is_name("not") && look().is_name("in")) {
        next();
        next();
        add(CompareOp::kNotIn);
      } else {
        break;
      }
      line = current().line;
    }
    if (!cmp) return expr;
    cmp->line = line;
    return cmp;
  }

  ExprPtr parse_math1() {
    int line = current().line;
    ExprPtr left = parse_concat();
    Chain chain(*this);
    while (current_op("+") || current_op("-")) {
      chain.link();
      ExprKind k = next().value == "+" ? ExprKind::kAdd : ExprKind::kSub;
      left = std::make_unique<BinaryExpr>(k, std::move(left), parse_concat(), line);
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = current().line;
    ExprPtr first = parse_math2();
    if (!current_op("~")) return first;
    auto node = std::make_unique<ConcatExpr>(line);
    node->parts.push_back(std::move(first));
    while (skip_if(op("~"))) node->parts.push_back(parse_math2());
    return node;
  }

  ExprPtr parse_math2() {
    int line = current().line;
    ExprPtr left = parse_pow();
    Chain chain(*this);
    while (current_op("*") || current_op("/") || current_op("//") || current_op("%")) {
      chain.link();
      std::string o = next().value;
      ExprKind k = o == "*"    ? ExprKind::kMul
                   : o == "/"  ? ExprKind::kDiv
                   : o == "//" ? ExprKind::kFloorDiv
                               : ExprKind::kMod;
      left = std::make_unique<BinaryExpr>(k, std::move(left), parse_pow(), line);
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_pow() {
    int line = current().line;
    ExprPtr left = parse_unary(true);
    Chain chain(*this);
    while (skip_if(op("**"))) {
      chain.link();
      left = std::make_unique<BinaryExpr>(ExprKind::kPow, std::move(left), parse_unary(true), line);
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this);
    int line = current().line;
    ExprPtr node;
    if (skip_if(op("-"))) {
      node = std::make_unique<UnaryExpr>(ExprKind::kNeg, parse_unary(false), line);
    } else if (skip_if(op("+"))) {
      node = std::make_unique<UnaryExpr>(ExprKind::kPos, parse_unary(false), line);
    } else {
      node = parse_primary(false);
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary(bool with_namespace) {
    const Token& token = current();
    if (token.type == TokenType::kName) {
      next();
      const std::string& v = token.value;
      if (v == "true" || v == "false" || v == "True" || v == "False") {
        return std::make_unique<ConstExpr>(Value::boolean(v == "true" || v == "True"), token.line);
      }
      if (v == "none" || v == "None") return std::make_unique<ConstExpr>(Value::none(), token.line);
      if (with_namespace && current_op(".")) {
        next();
        const Token& attr = expect({TokenType::kName, {}});
        return std::make_unique<NSRefExpr>(v, attr.value, token.line);
      }
      return std::make_unique<NameExpr>(v, token.line);
    }
    if (token.type == TokenType::kString) {
      int line = token.line;
      std::string s;
      while (current_is(TokenType::kString)) s += next().value;  // adjacent literals concatenate
      return std::make_unique<ConstExpr>(Value::string(std::move(s)), line);
    }
    if (token.type == TokenType::kInteger) {
      next();
      return std::make_unique<ConstExpr>(Value::integer(token.int_value), token.line);
    }
    if (token.type == TokenType::kFloat) {
      next();
      return std::make_unique<ConstExpr>(Value::number(token.float_value), token.line);
    }
    if (token.is_op("(")) {
      next();
      ExprPtr node = parse_tuple(false, true, {}, true);
      expect(op(")"));
      return node;
    }
    if (token.is_op("[")) return parse_list();
    if (token.is_op("{")) return parse_dict();
    syntax_error(fmt::format("unexpected {}", repr_string(describe(token))), token.line);
  }

  bool is_tuple_end(const std::vector<Want>& extra_end) const {
    const Token& t = current();
    if (t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd || t.is_op(")")) return true;
    return std::any_of(extra_end.begin(), extra_end.end(), [&](const Want& w) { return w.matches(t); });
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<Want>& extra_end, bool explicit_parens,
                      bool with_namespace = false) {
    int line = current().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect(op(","));
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
      if (current_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
      line = current().line;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) {
        syntax_error(fmt::format("Expected an expression, got {}", repr_string(describe(current()))), current().line);
      }
    }
    auto node = std::make_unique<SeqExpr>(ExprKind::kTuple, line);
    node->items = std::move(args);
    return node;
  }

  ExprPtr parse_list() {
    auto node = std::make_unique<SeqExpr>(ExprKind::kList, expect(op("[")).line);
    while (!current_op("]")) {
      if (!node->items.empty()) expect(op(","));
      if (current_op("]")) break;
      node->items.push_back(parse_expression(true));
    }
    expect(op("]"));
    return node;
  }

  ExprPtr parse_dict() {
    auto node = std::make_unique<DictExpr>(expect(op("{")).line);
    while (!current_op("}")) {
      if (!node->pairs.empty()) expect(op(","));
      if (current_op("}")) break;
      ExprPtr key = parse_expression(true);
      expect(op(":"));
      node->pairs.emplace_back(std::move(key), parse_expression(true));
    }
    expect(op("}"));
    return node;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    Chain chain(*this);
    while (true) {
      if (current_op(".") || current_op("[") || current_op("(")) chain.link();
      if (current_op(".") || current_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (current_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    Chain chain(*this);
    while (true) {
      if (current_op("|") || current().is_name("is") || current_op("(")) chain.link();
      if (current_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (current().is_name("is")) {
        node = parse_test(std::move(node));
      } else if (current_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& token = next();
    if (token.is_op(".")) {
      const Token& attr = next();
      if (attr.type == TokenType::kName) return std::make_unique<GetattrExpr>(std::move(node), attr.value, token.line);
      if (attr.type != TokenType::kInteger) syntax_error("expected name or number", attr.line);
      return std::make_unique<GetitemExpr>(
          std::move(node), std::make_unique<ConstExpr>(Value::integer(attr.int_value), attr.line), token.line);
    }
    std::vector<ExprPtr> args;
    while (!current_op("]")) {
      if (!args.empty()) expect(op(","));
      args.push_back(parse_subscribed());
    }
    expect(op("]"));
    ExprPtr arg;
    if (args.size() == 1) {
      arg = std::move(args[0]);
    } else {
      auto tuple = std::make_unique<SeqExpr>(ExprKind::kTuple, token.line);
      tuple->items = std::move(args);
      arg = std::move(tuple);
    }
    return std::make_unique<GetitemExpr>(std::move(node), std::move(arg), token.line);
  }

  ExprPtr parse_subscribed() {
    int line = current().line;
    auto slice = std::make_unique<SliceExpr>(line);
    if (current_op(":")) {
      next();
    } else {
      ExprPtr node = parse_expression(true);
      if (!current_op(":")) return node;
      next();
      slice->start = std::move(node);
    }
    if (!current_op(":") && !current_op("]") && !current_op(",")) slice->stop = parse_expression(true);
    if (current_op(":")) {
      next();
      if (!current_op("]") && !current_op(",")) slice->step = parse_expression(true);
    }
    return slice;
  }

  Arguments parse_call_args() {
    const Token& token = expect(op("("));
    Arguments args;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) syntax_error("invalid syntax for function call expression", token.line);
    };
    while (!current_op(")")) {
      if (require_comma) {
        expect(op(","));
        if (current_op(")")) break;
      }
      if (current_op("*")) {
        ensure(!args.dyn_args && !args.dyn_kwargs);
        next();
        args.dyn_args = parse_expression(true);
      } else if (current_op("**")) {
        ensure(!args.dyn_kwargs);
        next();
        args.dyn_kwargs = parse_expression(true);
      } else if (current_is(TokenType::kName) && look().is_op("=")) {
        ensure(!args.dyn_kwargs);
        std::string key = next().value;
        next();
        args.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!args.dyn_args && !args.dyn_kwargs && args.keyword.empty());
        args.positional.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect(op(")"));
    return args;
  }

  ExprPtr parse_call(ExprPtr node) {
    int line = current().line;
    Arguments args = parse_call_args();
    return std::make_unique<CallExpr>(std::move(node), std::move(args), line);
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    Chain chain(*this);
    while (current_op("|") || start_inline) {
      chain.link();
      if (!start_inline) next();
      const Token& token = expect({TokenType::kName, {}});
      std::string filter_name = token.value;
      while (current_op(".")) {
        next();
        filter_name += "." + expect({TokenType::kName, {}}).value;
      }
      Arguments args;
      if (current_op("(")) args = parse_call_args();
      node = std::make_unique<FilterExpr>(ExprKind::kFilter, std::move(node), filter_name, std::move(args), token.line);
      start_inline = false;
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const Token& token = next();  // "is"
    bool negated = skip_if(name("not"));
    std::string test_name = expect({TokenType::kName, {}}).value;
    while (current_op(".")) {
      next();
      test_name += "." + expect({TokenType::kName, {}}).value;
    }
    Arguments args;
    const Token& t = current();
    if (t.is_op("(")) {
      args = parse_call_args();
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString || t.type == TokenType::kInteger ||
                t.type == TokenType::kFloat || t.is_op("(") || t.is_op("[") || t.is_op("{")) &&
               !t.is_name("else") && !t.is_name("or") && !t.is_name("and")) {
      if (t.is_name("is")) syntax_error("You cannot chain multiple tests with is", t.line);
      ExprPtr arg = parse_postfix(parse_primary(false));
      args.positional.push_back(std::move(arg));
    }
    ExprPtr result =
        std::make_unique<FilterExpr>(ExprKind::kTest, std::move(node), test_name, std::move(args), token.line);
    if (negated) result = std::make_unique<UnaryExpr>(ExprKind::kNot, std::move(result), token.line);
    return result;
  }
};

// ---- validation ----------------------------------------------------------------------------------

// Resolves filters and tests (jinja2 rejects unknown ones while compiling, except inside if/elif/
// else and conditional expressions, where the error waits until the filter runs), checks that
// break/continue sit in a loop, and records which special names each macro body reads.
class Validator {
 public:
  void body(Body& stmts, bool soft, bool in_loop) {
    for (auto& s : stmts) stmt(*s, soft, in_loop);
  }

 private:
  std::vector<std::set<std::string>*> name_sinks_;

  void macro(MacroDef& m) {
    std::set<std::string> names;
    name_sinks_.push_back(&names);
    for (auto& d : m.defaults) expr(*d, false);
    body(m.body, false, false);
    name_sinks_.pop_back();
    m.catch_varargs = names.count("varargs") > 0;
    m.catch_kwargs = names.count("kwargs") > 0;
    m.uses_caller = names.count("caller") > 0;
    // Names read inside a nested macro are read by the enclosing one too.
    for (auto* sink : name_sinks_) sink->insert(names.begin(), names.end());
  }

  void stmt(Stmt& s, bool soft, bool in_loop) {
    switch (s.kind) {
      case StmtKind::kText:
        return;
      case StmtKind::kPrint:
        expr(*static_cast<PrintStmt&>(s).expr, soft);
        return;
      case StmtKind::kIf: {
        auto& n = static_cast<IfStmt&>(s);
        for (auto& [test, b] : n.branches) {
          expr(*test, true);
          body(b, true, in_loop);
        }
        body(n.else_body, true, in_loop);
        return;
      }
      case StmtKind::kFor: {
        auto& n = static_cast<ForStmt&>(s);
        expr(*n.iter, soft);
        if (n.filter) expr(*n.filter, false);
        body(n.body, false, true);
        body(n.else_body, false, in_loop);
        return;
      }
      case StmtKind::kSet: {
        auto& n = static_cast<SetStmt&>(s);
        expr(*n.value, soft);
        return;
      }
      case StmtKind::kSetBlock: {
        auto& n = static_cast<SetBlockStmt&>(s);
        if (n.filter) expr(*n.filter, soft);
        body(n.body, false, in_loop);
        return;
      }
      case StmtKind::kMacro:
        macro(*static_cast<MacroStmt&>(s).macro);
        return;
      case StmtKind::kCallBlock: {
        auto& n = static_cast<CallBlockStmt&>(s);
        expr(*n.call, soft);
        macro(*n.caller);
        return;
      }
      case StmtKind::kFilterBlock: {
        auto& n = static_cast<FilterBlockStmt&>(s);
        expr(*n.filter, soft);
        body(n.body, false, in_loop);
        return;
      }
      case StmtKind::kWith: {
        auto& n = static_cast<WithStmt&>(s);
        for (auto& v : n.values) expr(*v, soft);
        body(n.body, false, in_loop);
        return;
      }
      case StmtKind::kScope:
        body(static_cast<ScopeStmt&>(s).body, false, false);
        return;
      case StmtKind::kBreak:
      case StmtKind::kContinue:
        if (!in_loop) {
          throw TemplateError{ErrorKind::kSyntax,
                              fmt::format("'{}' outside loop", s.kind == StmtKind::kBreak ? "break" : "continue"),
                              s.line};
        }
        return;
    }
  }

  void args(Arguments& a, bool soft) {
    for (auto& p : a.positional) expr(*p, soft);
    for (auto& [k, v] : a.keyword) expr(*v, soft);
    if (a.dyn_args) expr(*a.dyn_args, soft);
    if (a.dyn_kwargs) expr(*a.dyn_kwargs, soft);
  }

  void expr(Expr& e, bool soft) {
    switch (e.kind) {
      case ExprKind::kConst:
        return;
      case ExprKind::kName:
        for (auto* sink : name_sinks_) sink->insert(static_cast<NameExpr&>(e).name);
        return;
      case ExprKind::kNSRef:
        return;
      case ExprKind::kGetattr:
        expr(*static_cast<GetattrExpr&>(e).object, soft);
        return;
      case ExprKind::kGetitem: {
        auto& n = static_cast<GetitemExpr&>(e);
        expr(*n.object, soft);
        expr(*n.index, soft);
        return;
      }
      case ExprKind::kSlice: {
        auto& n = static_cast<SliceExpr&>(e);
        for (auto* p : {&n.start, &n.stop, &n.step}) {
          if (*p) expr(**p, soft);
        }
        return;
      }
      case ExprKind::kCall: {
        auto& n = static_cast<CallExpr&>(e);
        expr(*n.callee, soft);
        args(n.args, soft);
        return;
      }
      case ExprKind::kFilter:
      case ExprKind::kTest: {
        auto& n = static_cast<FilterExpr&>(e);
        bool is_filter = e.kind == ExprKind::kFilter;
        if (is_filter) {
          n.filter = find_filter(n.name);
        } else {
          n.test = find_test(n.name);
        }
        if (!soft && !n.filter && !n.test) {
          throw TemplateError{ErrorKind::kAssertion,
                              fmt::format("No {} named {}.", is_filter ? "filter" : "test", repr_string(n.name)),
                              e.line};
        }
        if (n.subject) expr(*n.subject, soft);
        args(n.args, soft);
        return;
      }
      case ExprKind::kNeg:
      case ExprKind::kPos:
      case ExprKind::kNot:
        expr(*static_cast<UnaryExpr&>(e).operand, soft);
        return;
      case ExprKind::kCompare: {
        auto& n = static_cast<CompareExpr&>(e);
        expr(*n.first, soft);
        for (auto& [o, x] : n.rest) expr(*x, soft);
        return;
      }
      case ExprKind::kConcat:
        for (auto& p : static_cast<ConcatExpr&>(e).parts) expr(*p, soft);
        return;
      case ExprKind::kCondExpr: {
        auto& n = static_cast<CondExpr&>(e);
        expr(*n.test, true);
        expr(*n.then_expr, true);
        if (n.else_expr) expr(*n.else_expr, true);
        return;
      }
      case ExprKind::kList:
      case ExprKind::kTuple:
        for (auto& p : static_cast<SeqExpr&>(e).items) expr(*p, soft);
        return;
      case ExprKind::kDict:
        for (auto& [k, v] : static_cast<DictExpr&>(e).pairs) {
          expr(*k, soft);
          expr(*v, soft);
        }
        return;
      default: {
        auto& n = static_cast<BinaryExpr&>(e);
        expr(*n.left, soft);
        expr(*n.right, soft);
      }
    }
  }
};

}  // namespace

std::shared_ptr<Program> parse(std::string_view source, const Options& options) {
  auto program = std::make_shared<Program>();
  program->options = options;
  Parser parser(tokenize(source, options));
  program->body = parser.parse_template();
  Validator().body(program->body, false, false);
  return program;
}

}  // namespace spill::jinja::detail
