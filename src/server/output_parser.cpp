#include "server/output_parser.h"

#include <algorithm>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/json_limits.h"
#include "core/strings.h"

namespace spill::server {

namespace {

using OrderedJson = nlohmann::ordered_json;

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_json_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_json_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view ltrim(std::string_view s) {
  while (!s.empty() && is_json_space(s.front())) s.remove_prefix(1);
  return s;
}

bool has_space(std::string_view s) { return std::any_of(s.begin(), s.end(), is_json_space); }

// Length of the longest suffix of text that is a proper prefix of tag: those bytes may be the
// start of the tag and must wait for the next push.
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  if (tag.empty()) return 0;
  const size_t max = std::min(text.size(), tag.size() - 1);
  for (size_t n = max; n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

// The model's arguments text: a JSON object, or (some models) a JSON string holding one. Written
// back compact, in the model's key order. Depth-limited: model output is untrusted.
bool read_arguments_object(std::string_view text, std::string& out) {
  std::optional<OrderedJson> parsed = try_parse_json<OrderedJson>(trim(text));
  if (parsed && parsed->is_string()) parsed = try_parse_json<OrderedJson>(parsed->get_ref<const std::string&>());
  if (!parsed || !parsed->is_object()) return false;
  out = parsed->dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  return true;
}

// Strips a Markdown code fence (```json ... ```) around a DeepSeek-V3 call's arguments.
std::string_view strip_code_fence(std::string_view text) {
  text = trim(text);
  if (text.substr(0, 3) != "```") return text;
  const size_t line_end = text.find('\n');
  if (line_end == std::string_view::npos) return text;
  text.remove_prefix(line_end + 1);
  text = trim(text);
  if (text.size() >= 3 && text.substr(text.size() - 3) == "```") text.remove_suffix(3);
  return text;
}

constexpr std::string_view kDeepSeekSep = "<｜tool▁sep｜>";
constexpr std::string_view kKimiArgBegin = "<|tool_call_argument_begin|>";
constexpr std::string_view kHarmonyMessage = "<|message|>";

bool parse_deepseek_v3(std::string_view body, ParsedToolCall& out) {
  // function<｜tool▁sep｜>NAME\n```json\nARGS\n```
  const size_t sep = body.find(kDeepSeekSep);
  if (sep == std::string_view::npos || trim(body.substr(0, sep)).empty()) return false;
  std::string_view rest = ltrim(body.substr(sep + kDeepSeekSep.size()));
  const size_t line_end = rest.find('\n');
  if (line_end == std::string_view::npos) return false;
  const std::string_view name = trim(rest.substr(0, line_end));
  if (name.empty() || has_space(name)) return false;
  if (!read_arguments_object(strip_code_fence(rest.substr(line_end + 1)), out.arguments)) return false;
  out.name = std::string(name);
  return true;
}

bool parse_deepseek_v31(std::string_view body, ParsedToolCall& out) {
  // NAME<｜tool▁sep｜>ARGS
  const size_t sep = body.find(kDeepSeekSep);
  if (sep == std::string_view::npos) return false;
  const std::string_view name = trim(body.substr(0, sep));
  if (name.empty() || has_space(name)) return false;
  if (!read_arguments_object(strip_code_fence(body.substr(sep + kDeepSeekSep.size())), out.arguments)) return false;
  out.name = std::string(name);
  return true;
}

bool parse_kimi_k2(std::string_view body, ParsedToolCall& out) {
  // functions.NAME:IDX<|tool_call_argument_begin|>ARGS (the "functions." prefix and ":IDX" are
  // the call id the template writes; some outputs leave the prefix out)
  const size_t arg = body.find(kKimiArgBegin);
  if (arg == std::string_view::npos) return false;
  std::string_view id = trim(body.substr(0, arg));
  if (id.substr(0, 10) == "functions.") id.remove_prefix(10);
  if (const size_t colon = id.rfind(':'); colon != std::string_view::npos) {
    const std::string_view index = id.substr(colon + 1);
    if (!index.empty() && std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; }))
      id = id.substr(0, colon);
  }
  if (id.empty() || has_space(id)) return false;
  if (!read_arguments_object(body.substr(arg + kKimiArgBegin.size()), out.arguments)) return false;
  out.name = std::string(id);
  return true;
}

bool parse_glm45(const OutputParserOptions& options, std::string_view body, ParsedToolCall& out) {
  // NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n... ; V as the template wrote it: a
  // string as is, anything else as JSON.
  static constexpr std::string_view kKey = "<arg_key>", kKeyEnd = "</arg_key>";
  static constexpr std::string_view kValue = "<arg_value>", kValueEnd = "</arg_value>";
  const size_t first = body.find(kKey);
  const std::string_view name = trim(body.substr(0, first));
  if (name.empty() || has_space(name) || name.find('<') != std::string_view::npos) return false;
  const auto declared = options.string_parameters.find(name);
  OrderedJson args = OrderedJson::object();
  std::string_view rest = first == std::string_view::npos ? std::string_view() : body.substr(first);
  while (!(rest = ltrim(rest)).empty()) {
    if (rest.substr(0, kKey.size()) != kKey) return false;
    rest.remove_prefix(kKey.size());
    const size_t key_end = rest.find(kKeyEnd);
    if (key_end == std::string_view::npos) return false;
    const std::string key(trim(rest.substr(0, key_end)));
    if (key.empty()) return false;
    rest = ltrim(rest.substr(key_end + kKeyEnd.size()));
    if (rest.substr(0, kValue.size()) != kValue) return false;
    rest.remove_prefix(kValue.size());
    const size_t value_end = rest.find(kValueEnd);
    if (value_end == std::string_view::npos) return false;
    const std::string_view value = rest.substr(0, value_end);
    rest.remove_prefix(value_end + kValueEnd.size());
    const bool is_string = declared != options.string_parameters.end() && declared->second.count(key) > 0;
    std::optional<OrderedJson> decoded;
    if (!is_string) decoded = try_parse_json<OrderedJson>(trim(value));
    args[key] = decoded ? std::move(*decoded) : OrderedJson(std::string(value));
  }
  out.name = std::string(name);
  out.arguments = args.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  return true;
}

bool parse_harmony(std::string_view body, ParsedToolCall& out) {
  // RECIPIENT<|message|>ARGS, RECIPIENT = functions.NAME (the client's functions; built-in
  // recipients such as browser.search or python are not spill's to run)
  const size_t message = body.find(kHarmonyMessage);
  if (message == std::string_view::npos) return false;
  std::string_view recipient = trim(body.substr(0, message));
  if (recipient.substr(0, 10) != "functions.") return false;
  recipient.remove_prefix(10);
  if (recipient.empty() || has_space(recipient)) return false;
  if (!read_arguments_object(body.substr(message + kHarmonyMessage.size()), out.arguments)) return false;
  out.name = std::string(recipient);
  return true;
}

// Harmony's markers (all single special tokens in o200k_harmony).
constexpr std::string_view kHarmonyStart = "<|start|>";
constexpr std::string_view kHarmonyChannel = "<|channel|>";
constexpr std::string_view kHarmonyEnd = "<|end|>";
constexpr std::string_view kHarmonyCall = "<|call|>";
constexpr std::string_view kHarmonyReturn = "<|return|>";
// A header longer than this is not a header (the model is writing text without framing).
constexpr size_t kMaxHarmonyHeaderBytes = 512;

// The word after `key` in a Harmony header, up to whitespace or the next marker.
std::string_view header_word(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  std::string_view rest = ltrim(header.substr(at + key.size()));
  size_t end = 0;
  while (end < rest.size() && !is_json_space(rest[end]) && rest[end] != '<') ++end;
  return rest.substr(0, end);
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::Hermes: return "hermes";
    case ToolCallFormat::DeepSeekV3: return "deepseek_v3";
    case ToolCallFormat::DeepSeekV31: return "deepseek_v31";
    case ToolCallFormat::KimiK2: return "kimi_k2";
    case ToolCallFormat::Glm45: return "glm45";
    case ToolCallFormat::Harmony: return "harmony";
  }
  return "unknown";
}

OutputParser::Markers OutputParser::markers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::Hermes:
    case ToolCallFormat::Glm45: return {.section_begin = {}, .section_end = {}, .call_begin = "<tool_call>", .call_end = "</tool_call>"};
    case ToolCallFormat::DeepSeekV3:
    case ToolCallFormat::DeepSeekV31:
      return {.section_begin = "<｜tool▁calls▁begin｜>",
              .section_end = "<｜tool▁calls▁end｜>",
              .call_begin = "<｜tool▁call▁begin｜>",
              .call_end = "<｜tool▁call▁end｜>"};
    case ToolCallFormat::KimiK2:
      return {.section_begin = "<|tool_calls_section_begin|>",
              .section_end = "<|tool_calls_section_end|>",
              .call_begin = "<|tool_call_begin|>",
              .call_end = "<|tool_call_end|>"};
    case ToolCallFormat::Harmony: return {};
  }
  return {};
}

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

bool parse_tool_call(const OutputParserOptions& options, std::string_view body, ParsedToolCall& out) {
  switch (options.format) {
    case ToolCallFormat::Hermes: return parse_tool_call_body(body, out);
    case ToolCallFormat::DeepSeekV3: return parse_deepseek_v3(body, out);
    case ToolCallFormat::DeepSeekV31: return parse_deepseek_v31(body, out);
    case ToolCallFormat::KimiK2: return parse_kimi_k2(body, out);
    case ToolCallFormat::Glm45: return parse_glm45(options, body, out);
    case ToolCallFormat::Harmony: return parse_harmony(body, out);
  }
  return false;
}

OutputParser::OutputParser(const OutputParserOptions& options) : options_(options), markers_(markers(options.format)) {
  if (options_.format == ToolCallFormat::Harmony) {
    // The reply continues the prompt's unfinished message header (or starts a new message).
    if (!options_.harmony_prompt_tail.empty()) {
      harmony_mode_ = HarmonyMode::Header;
      harmony_header_opened_by_start_ = true;
      pending_ = options_.harmony_prompt_tail;
    }
    return;
  }
  if (options_.parse_reasoning && options_.starts_in_reasoning) {
    mode_ = Mode::Reasoning;
    skip_leading_ws_ = true;
  }
  may_start_reasoning_ = options_.parse_reasoning && !options_.starts_in_reasoning;
}

std::vector<OutputPiece> OutputParser::push(std::string_view text) {
  std::vector<OutputPiece> out;
  pending_.append(text);
  if (options_.format == ToolCallFormat::Harmony) {
    scan_harmony(out, /*at_end=*/false);
  } else {
    scan(out, /*at_end=*/false);
  }
  return out;
}

std::vector<OutputPiece> OutputParser::finish() {
  std::vector<OutputPiece> out;
  if (options_.format == ToolCallFormat::Harmony) {
    scan_harmony(out, /*at_end=*/true);
  } else {
    scan(out, /*at_end=*/true);
  }
  // Trailing whitespace of a plain answer is the model's text; next to tool calls it is layout.
  if ((mode_ == Mode::Content || mode_ == Mode::Section) && n_tool_calls_ == 0 && !held_ws_.empty())
    append(out, OutputPiece::Kind::Content, held_ws_);
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
    while (!text.empty() && is_json_space(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    skip_leading_ws_ = false;
  }
  size_t end = text.size();
  while (end > 0 && is_json_space(text[end - 1])) --end;
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

void OutputParser::record_unparsed(std::string_view body) {
  unparsed_tool_calls_.emplace_back(body.substr(0, std::min<size_t>(body.size(), kUnparsedExcerptBytes)));
}

void OutputParser::end_tool_call(std::vector<OutputPiece>& out, std::string_view body, std::string_view closed_by) {
  ParsedToolCall call;
  std::string_view call_part = body;
  if (closed_by.empty()) {
    // The output ended inside the call: bytes that may be the start of its closing marker are not arguments.
    call_part.remove_suffix(std::max(partial_tag_suffix(body, markers_.call_end), partial_tag_suffix(body, markers_.section_end)));
  }
  if (parse_tool_call(options_, call_part, call)) {
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
  record_unparsed(body);
  std::string raw(markers_.call_begin);
  raw.append(body);
  raw.append(closed_by);
  held_ws_ = std::move(ws_before_tool_call_);
  skip_leading_ws_ = false;
  emit_text(out, OutputPiece::Kind::Content, raw);
}

void OutputParser::scan(std::vector<OutputPiece>& out, bool at_end) {
  using Kind = OutputPiece::Kind;
  while (true) {
    if (mode_ == Mode::ToolCall) {
      // A call ends at its own marker; inside a section, the section's end also ends it.
      size_t end = pending_.find(markers_.call_end);
      std::string_view closed_by = markers_.call_end;
      if (in_section_ && !markers_.section_end.empty()) {
        const size_t section_end = pending_.find(markers_.section_end);
        if (section_end < end) {
          end = section_end;
          closed_by = markers_.section_end;
        }
      }
      if (end != std::string::npos) {
        const std::string body = pending_.substr(0, end);
        pending_.erase(0, end + closed_by.size());
        mode_ = in_section_ && closed_by == markers_.call_end ? Mode::Section : Mode::Content;
        end_tool_call(out, body, closed_by);
        continue;
      }
      if (at_end) {
        const std::string body = std::move(pending_);
        pending_.clear();
        mode_ = Mode::Content;
        end_tool_call(out, body, {});
      }
      return;
    }

    // Content, Section or Reasoning: look for the earliest marker that can change the mode here.
    struct Candidate {
      std::string_view tag;
      Mode next;
    };
    static constexpr std::string_view kThink = "<think>", kThinkEnd = "</think>";
    Candidate candidates[3];
    int n_candidates = 0;
    if (mode_ == Mode::Reasoning) {
      candidates[n_candidates++] = {kThinkEnd, Mode::Content};
    } else if (mode_ == Mode::Section) {
      candidates[n_candidates++] = {markers_.call_begin, Mode::ToolCall};
      candidates[n_candidates++] = {markers_.section_end, Mode::Content};
    } else {
      if (options_.parse_tool_calls) {
        if (!markers_.section_begin.empty()) candidates[n_candidates++] = {markers_.section_begin, Mode::Section};
        candidates[n_candidates++] = {markers_.call_begin, Mode::ToolCall};
      }
      if (may_start_reasoning_) candidates[n_candidates++] = {kThink, Mode::Reasoning};
    }
    const Kind kind = mode_ == Mode::Reasoning ? Kind::Reasoning : Kind::Content;

    size_t best = std::string::npos;
    const Candidate* found = nullptr;
    for (int i = 0; i < n_candidates; ++i) {
      const size_t pos = pending_.find(candidates[i].tag);
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
      pending_.erase(0, best + found->tag.size());
      if (found->next == Mode::ToolCall) {
        in_section_ = mode_ == Mode::Section;
        ws_before_tool_call_ = std::move(held_ws_);
      }
      held_ws_.clear();
      if (mode_ == Mode::Reasoning || found->next == Mode::Reasoning) may_start_reasoning_ = false;
      if (found->next == Mode::Section || found->next == Mode::ToolCall) may_start_reasoning_ = false;
      mode_ = found->next;
      skip_leading_ws_ = true;
      continue;
    }

    size_t hold = 0;
    if (!at_end)
      for (int i = 0; i < n_candidates; ++i) hold = std::max(hold, partial_tag_suffix(pending_, candidates[i].tag));
    emit_text(out, kind, std::string_view(pending_).substr(0, pending_.size() - hold));
    pending_.erase(0, pending_.size() - hold);
    return;
  }
}

// ---- Harmony (gpt-oss) ----------------------------------------------------------------------

std::string OutputParser::harmony_raw_header() const {
  return (harmony_header_opened_by_start_ ? std::string(kHarmonyStart) : std::string()) + harmony_header_;
}

void OutputParser::start_harmony_body() {
  const std::string_view channel = header_word(harmony_header_, kHarmonyChannel);
  harmony_recipient_ = std::string(header_word(harmony_header_, "to="));
  harmony_call_ = !harmony_recipient_.empty();
  harmony_kind_ = channel == "analysis" && options_.parse_reasoning ? OutputPiece::Kind::Reasoning : OutputPiece::Kind::Content;
  harmony_mode_ = HarmonyMode::Body;
  mode_ = harmony_kind_ == OutputPiece::Kind::Reasoning && !harmony_call_ ? Mode::Reasoning : Mode::Content;
}

void OutputParser::end_harmony_body(std::vector<OutputPiece>& out, std::string_view body, std::string_view terminator) {
  if (harmony_call_) {
    ParsedToolCall call;
    const std::string call_text = harmony_recipient_ + std::string(kHarmonyMessage) + std::string(body);
    if (options_.parse_tool_calls && parse_harmony(call_text, call)) {
      OutputPiece piece;
      piece.kind = OutputPiece::Kind::ToolCall;
      piece.call = std::move(call);
      out.push_back(std::move(piece));
      ++n_tool_calls_;
    } else {
      // Not a call spill can return (no tools offered, a built-in recipient, arguments that are
      // not a JSON object): the message as the model wrote it.
      record_unparsed(call_text);
      append(out, OutputPiece::Kind::Content,
             harmony_raw_header() + std::string(kHarmonyMessage) + std::string(body) + std::string(terminator));
    }
  } else {
    append(out, harmony_kind_, body);
  }
  harmony_call_ = false;
  harmony_header_.clear();
  harmony_recipient_.clear();
  mode_ = Mode::Content;
}

void OutputParser::scan_harmony(std::vector<OutputPiece>& out, bool at_end) {
  using Kind = OutputPiece::Kind;
  while (true) {
    if (harmony_mode_ == HarmonyMode::Between) {
      // Between messages: the next one starts with <|start|> (or, when the model skips the role,
      // with its <|channel|>). Text outside any message is the answer.
      const size_t start = pending_.find(kHarmonyStart);
      const size_t channel = pending_.find(kHarmonyChannel);
      const size_t at = std::min(start, channel);
      if (at != std::string::npos) {
        emit_text(out, Kind::Content, std::string_view(pending_).substr(0, at));
        held_ws_.clear();
        skip_leading_ws_ = false;
        harmony_header_opened_by_start_ = at == start;
        pending_.erase(0, at + (harmony_header_opened_by_start_ ? kHarmonyStart.size() : 0));
        harmony_header_.clear();
        harmony_mode_ = HarmonyMode::Header;
        continue;
      }
      const size_t hold =
          at_end ? 0 : std::max(partial_tag_suffix(pending_, kHarmonyStart), partial_tag_suffix(pending_, kHarmonyChannel));
      emit_text(out, Kind::Content, std::string_view(pending_).substr(0, pending_.size() - hold));
      pending_.erase(0, pending_.size() - hold);
      return;
    }

    if (harmony_mode_ == HarmonyMode::Header) {
      const size_t message = pending_.find(kHarmonyMessage);
      // Bytes of pending_ certain to be header: up to <|message|>, or all but a possible start of it.
      const size_t header_bytes = message != std::string::npos
                                      ? message
                                      : (at_end ? pending_.size() : pending_.size() - partial_tag_suffix(pending_, kHarmonyMessage));
      if (harmony_header_.size() + header_bytes > kMaxHarmonyHeaderBytes) {
        // Too long to be a header: the model is writing text without framing. The first bytes
        // (a fixed count, so any chunking cuts at the same place) are the answer; the rest is
        // read again from between messages.
        const size_t cut = kMaxHarmonyHeaderBytes + 1 - harmony_header_.size();
        append(out, Kind::Content, harmony_raw_header() + pending_.substr(0, cut));
        pending_.erase(0, cut);
        harmony_header_.clear();
        harmony_mode_ = HarmonyMode::Between;
        continue;
      }
      harmony_header_.append(pending_, 0, header_bytes);
      pending_.erase(0, header_bytes);
      if (message != std::string::npos) {
        pending_.erase(0, kHarmonyMessage.size());
        start_harmony_body();
        continue;
      }
      if (at_end) {
        // The output ended inside a header: it holds no text for the client.
        harmony_header_.clear();
        harmony_mode_ = HarmonyMode::Between;
      }
      return;
    }

    // A message body ends at <|end|>, <|call|> or <|return|> (the last two are end-of-generation
    // tokens, usually not in the text), or where a new message starts without one.
    static constexpr std::string_view kEnds[] = {kHarmonyEnd, kHarmonyCall, kHarmonyReturn, kHarmonyStart};
    size_t best = std::string::npos;
    std::string_view terminator;
    for (std::string_view end : kEnds) {
      const size_t pos = pending_.find(end);
      if (pos < best) {
        best = pos;
        terminator = end;
      }
    }
    if (best != std::string::npos) {
      const std::string body = pending_.substr(0, best);
      pending_.erase(0, best + terminator.size());
      end_harmony_body(out, body, terminator);
      harmony_mode_ = terminator == kHarmonyStart ? HarmonyMode::Header : HarmonyMode::Between;
      harmony_header_opened_by_start_ = terminator == kHarmonyStart;
      continue;
    }
    if (at_end) {
      const std::string body = std::move(pending_);
      pending_.clear();
      end_harmony_body(out, body, {});
      harmony_mode_ = HarmonyMode::Between;
      return;
    }
    if (harmony_call_) return;  // arguments are read whole
    size_t hold = 0;
    for (std::string_view end : kEnds) hold = std::max(hold, partial_tag_suffix(pending_, end));
    append(out, harmony_kind_, std::string_view(pending_).substr(0, pending_.size() - hold));
    pending_.erase(0, pending_.size() - hold);
    return;
  }
}

}  // namespace spill::server
