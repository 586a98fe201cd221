#include "server/output_parser.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/json_limits.h"

namespace spill::server {

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest suffix of text that is a proper prefix of tag: those bytes may be the
// start of the tag and must wait for the next push.
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  const size_t max = std::min(text.size(), tag.size() - 1);
  for (size_t n = max; n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

bool parse_tool_call_body(std::string_view body, ParsedToolCall& out) {
  using nlohmann::json;
  // Model output is untrusted text: a body nested too deep is not a tool call (it stays text).
  const std::optional<json> parsed = try_parse_json<json>(trim(body));
  if (!parsed || !parsed->is_object()) return false;
  const json& call = *parsed;
  const auto name = call.find("name");
  if (name == call.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
  auto args = call.find("arguments");
  if (args == call.end()) args = call.find("parameters");
  json arguments = json::object();
  if (args != call.end()) {
    if (args->is_object()) {
      arguments = *args;
    } else if (args->is_string()) {
      // Some models write the arguments as a JSON string; clients want the object's text.
      std::optional<json> inner = try_parse_json<json>(args->get_ref<const std::string&>());
      if (!inner || !inner->is_object()) return false;
      arguments = std::move(*inner);
    } else if (!args->is_null()) {
      return false;
    }
  }
  out.name = name->get<std::string>();
  out.arguments = arguments.dump(-1, ' ', false, json::error_handler_t::replace);
  return true;
}

OutputParser::OutputParser(const OutputParserOptions& options) : options_(options) {
  if (options_.parse_reasoning && options_.starts_in_reasoning) {
    mode_ = Mode::Reasoning;
    skip_leading_ws_ = true;
  }
  may_start_reasoning_ = options_.parse_reasoning && !options_.starts_in_reasoning;
}

std::vector<OutputPiece> OutputParser::push(std::string_view text) {
  std::vector<OutputPiece> out;
  pending_.append(text);
  scan(out, /*at_end=*/false);
  return out;
}

std::vector<OutputPiece> OutputParser::finish() {
  std::vector<OutputPiece> out;
  scan(out, /*at_end=*/true);
  // Trailing whitespace of a plain answer is the model's text; next to tool calls it is layout.
  if (mode_ == Mode::Content && n_tool_calls_ == 0 && !held_ws_.empty()) append(out, OutputPiece::Kind::Content, held_ws_);
  held_ws_.clear();
  return out;
}

void OutputParser::append(std::vector<OutputPiece>& out, OutputPiece::Kind kind, std::string_view text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind && kind != OutputPiece::Kind::ToolCall) {
    out.back().text.append(text);
    return;
  }
  OutputPiece piece;
  piece.kind = kind;
  piece.text = std::string(text);
  out.push_back(std::move(piece));
}

void OutputParser::emit_text(std::vector<OutputPiece>& out, OutputPiece::Kind kind, std::string_view text) {
  if (skip_leading_ws_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    skip_leading_ws_ = false;
  }
  size_t end = text.size();
  while (end > 0 && is_space(text[end - 1])) --end;
  if (end == 0) {
    held_ws_.append(text);
    return;
  }
  if (!held_ws_.empty()) {
    append(out, kind, held_ws_);
    held_ws_.clear();
  }
  append(out, kind, text.substr(0, end));
  held_ws_.assign(text.substr(end));
  if (kind == OutputPiece::Kind::Content) may_start_reasoning_ = false;
}

void OutputParser::end_tool_call(std::vector<OutputPiece>& out, std::string_view body, bool closed) {
  ParsedToolCall call;
  std::string_view json_part = body;
  if (!closed) json_part.remove_suffix(partial_tag_suffix(body, options_.tool_call_end));
  if (parse_tool_call_body(json_part, call)) {
    OutputPiece piece;
    piece.kind = OutputPiece::Kind::ToolCall;
    piece.call = std::move(call);
    out.push_back(std::move(piece));
    ++n_tool_calls_;
    held_ws_.clear();
    skip_leading_ws_ = true;
    return;
  }
  // Not a call: give the model's text back exactly as written, with the whitespace before it.
  unparsed_tool_calls_.emplace_back(body.substr(0, std::min<size_t>(body.size(), kUnparsedExcerptBytes)));
  std::string raw = options_.tool_call_start;
  raw.append(body);
  if (closed) raw.append(options_.tool_call_end);
  held_ws_ = std::move(ws_before_tool_call_);
  skip_leading_ws_ = false;
  emit_text(out, OutputPiece::Kind::Content, raw);
}

void OutputParser::scan(std::vector<OutputPiece>& out, bool at_end) {
  using Kind = OutputPiece::Kind;
  while (true) {
    if (mode_ == Mode::ToolCall) {
      const size_t end = pending_.find(options_.tool_call_end);
      if (end != std::string::npos) {
        const std::string body = pending_.substr(0, end);
        pending_.erase(0, end + options_.tool_call_end.size());
        mode_ = Mode::Content;
        end_tool_call(out, body, /*closed=*/true);
        continue;
      }
      if (at_end) {
        const std::string body = std::move(pending_);
        pending_.clear();
        mode_ = Mode::Content;
        end_tool_call(out, body, /*closed=*/false);
      }
      return;
    }

    // Content or Reasoning: look for the earliest tag that can change the mode here.
    struct Candidate {
      const std::string* tag;
      Mode next;
    };
    Candidate candidates[2];
    int n_candidates = 0;
    if (mode_ == Mode::Reasoning) {
      candidates[n_candidates++] = {&options_.reasoning_end, Mode::Content};
    } else {
      if (options_.parse_tool_calls) candidates[n_candidates++] = {&options_.tool_call_start, Mode::ToolCall};
      if (may_start_reasoning_) candidates[n_candidates++] = {&options_.reasoning_start, Mode::Reasoning};
    }
    const Kind kind = mode_ == Mode::Reasoning ? Kind::Reasoning : Kind::Content;

    size_t best = std::string::npos;
    const Candidate* found = nullptr;
    for (int i = 0; i < n_candidates; ++i) {
      const size_t pos = pending_.find(*candidates[i].tag);
      if (pos < best) {
        best = pos;
        found = &candidates[i];
      }
    }
    // Reasoning may only open before any answer text: "<think>" after words is just text.
    if (found && found->next == Mode::Reasoning && !trim(std::string_view(pending_).substr(0, best)).empty()) {
      may_start_reasoning_ = false;
      continue;
    }
    if (found) {
      emit_text(out, kind, std::string_view(pending_).substr(0, best));
      pending_.erase(0, best + found->tag->size());
      if (found->next == Mode::ToolCall) {
        ws_before_tool_call_ = std::move(held_ws_);
      }
      held_ws_.clear();
      if (mode_ == Mode::Reasoning || found->next == Mode::Reasoning) may_start_reasoning_ = false;
      mode_ = found->next;
      skip_leading_ws_ = true;
      continue;
    }

    size_t hold = 0;
    if (!at_end)
      for (int i = 0; i < n_candidates; ++i) hold = std::max(hold, partial_tag_suffix(pending_, *candidates[i].tag));
    emit_text(out, kind, std::string_view(pending_).substr(0, pending_.size() - hold));
    pending_.erase(0, pending_.size() - hold);
    return;
  }
}

}  // namespace spill::server
