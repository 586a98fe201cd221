// spill::jinja::Template: parse once, render many times; internal errors become spill::Error.
#include "text/jinja.h"

#include <fmt/format.h>

#include <new>
#include <stdexcept>

#include "core/error.h"
#include "text/jinja_interp.h"

namespace spill::jinja {

struct Program : detail::Program {};

namespace {

[[noreturn]] void rethrow(const detail::TemplateError& e, const std::string& name) {
  if (e.kind == detail::ErrorKind::kRaised) throw Error(e.message);
  if (e.kind == detail::ErrorKind::kUnsupported) fail("{}:{}: {}", name, e.line, e.message);
  fail("{}:{}: {}: {}", name, e.line, detail::error_kind_name(e.kind), e.message);
}

}  // namespace

Template::Template(std::string_view source, Options options) {
  try {
    auto parsed = detail::parse(source, options);
    auto program = std::make_shared<Program>();
    program->body = std::move(parsed->body);
    program->options = std::move(parsed->options);
    program_ = std::move(program);
  } catch (const detail::TemplateError& e) {
    rethrow(e, options.name);
  }
}

std::string Template::render(const nlohmann::ordered_json& variables, const RenderOptions& options) const {
  return render_marked(variables, InputMarking{}, options).text;
}

RenderedText Template::render_marked(const nlohmann::ordered_json& variables, const InputMarking& marking,
                                     const RenderOptions& options) const {
  if (!variables.is_object()) fail("{}: template variables must be a JSON object", program_->options.name);
  try {
    detail::Interpreter interpreter(*program_, options);
    return interpreter.render(variables, marking);
  } catch (const detail::TemplateError& e) {
    rethrow(e, program_->options.name);
  } catch (const std::bad_alloc&) {
    fail("{}: out of memory while rendering the template", program_->options.name);
  } catch (const std::length_error&) {
    fail("{}: a string or list grew too large while rendering the template", program_->options.name);
  }
}

}  // namespace spill::jinja
