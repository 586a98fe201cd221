#include "server/anthropic_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace spill::server {

namespace {

// The text of a system prompt or a tool_result: a string, or an array of text blocks. In tool
// results, images (a screenshot a tool returned) become a note instead of failing the agent's
// whole turn; in a system prompt they are refused.
std::string blocks_text(const Json& content, const std::string& param, bool images_as_notes = false) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) invalid_field(param, "must be a string or an array of content blocks");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& block = content[i];
    const std::string p = fmt::format("{}[{}]", param, i);
    if (!block.is_object()) invalid_field(p, "must be a content block object");
    const std::string type = read_string(block, "type", p + ".type").value_or("");
    if (type == "text") {
      if (!text.empty()) text += "\n";
      text += read_string(block, "text", p + ".text").value_or("");
    } else if ((type == "image" || type == "document") && images_as_notes) {
      if (!text.empty()) text += "\n";
      text += fmt::format("[{} omitted: the model reads text only]", type);
    } else if (type == "image" || type == "document") {
      invalid_field(p + ".type", fmt::format("\"{}\" blocks are not supported: the model reads text only", type));
    } else {
      invalid_field(p + ".type", fmt::format("expected a \"text\" block, got \"{}\"", type));
    }
  }
  return text;
}

// A document block with a plain-text source is text; every other source needs a vision model.
std::optional<std::string> document_text(const Json& block) {
  const Json* source = find_field(block, "source");
  if (!source || !source->is_object()) return std::nullopt;
  const Json* type = find_field(*source, "type");
  if (!type || *type != "text") return std::nullopt;
  const Json* data = find_field(*source, "data");
  if (!data || !data->is_string()) return std::nullopt;
  return data->get<std::string>();
}

void convert_user_message(const Json& content, const std::string& p, Json& out) {
  if (content.is_string()) {
    out.push_back(Json{{"role", "user"}, {"content", content.get<std::string>()}});
    return;
  }
  if (!content.is_array()) invalid_field(p, "must be a string or an array of content blocks");
  // Runs of text blocks become one user message; each tool_result becomes a tool message, in order.
  std::string text;
  bool have_text = false;
  auto flush_text = [&] {
    if (have_text) out.push_back(Json{{"role", "user"}, {"content", text}});
    text.clear();
    have_text = false;
  };
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& block = content[i];
    const std::string bp = fmt::format("{}[{}]", p, i);
    if (!block.is_object()) invalid_field(bp, "must be a content block object");
    const std::string type = read_string(block, "type", bp + ".type").value_or("");
    if (type == "text") {
      if (have_text) text += "\n";
      text += read_string(block, "text", bp + ".text").value_or("");
      have_text = true;
    } else if (type == "tool_result") {
      flush_text();
      const auto id = read_string(block, "tool_use_id", bp + ".tool_use_id");
      if (!id) invalid_field(bp + ".tool_use_id", "is required");
      const Json* c = find_field(block, "content");
      std::string result = c ? blocks_text(*c, bp + ".content", /*images_as_notes=*/true) : "";
      // The template has no field for failure; say it in the text the model reads.
      if (read_bool(block, "is_error", bp + ".is_error").value_or(false)) result = "Error: " + result;
      out.push_back(Json{{"role", "tool"}, {"tool_call_id", *id}, {"content", result}});
    } else if (type == "document") {
      auto doc = document_text(block);
      if (!doc) invalid_field(bp, "only documents with a plain-text source are supported: the model reads text only");
      if (have_text) text += "\n";
      text += *doc;
      have_text = true;
    } else if (type == "image") {
      invalid_field(bp + ".type", "\"image\" blocks are not supported: the model reads text only");
    } else if (type == "thinking" || type == "redacted_thinking") {
      // Not meaningful in a user turn; ignored.
    } else {
      invalid_field(bp + ".type", fmt::format("unknown content block type \"{}\" in a user message", type));
    }
  }
  flush_text();
}

Json convert_assistant_message(const Json& content, const std::string& p) {
  Json msg = Json::object();
  msg["role"] = "assistant";
  if (content.is_string()) {
    msg["content"] = content.get<std::string>();
    return msg;
  }
  if (!content.is_array()) invalid_field(p, "must be a string or an array of content blocks");
  std::string text, reasoning;
  Json calls = Json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& block = content[i];
    const std::string bp = fmt::format("{}[{}]", p, i);
    if (!block.is_object()) invalid_field(bp, "must be a content block object");
    const std::string type = read_string(block, "type", bp + ".type").value_or("");
    if (type == "text") {
      text += read_string(block, "text", bp + ".text").value_or("");
    } else if (type == "thinking") {
      reasoning += read_string(block, "thinking", bp + ".thinking").value_or("");
    } else if (type == "tool_use") {
      const auto id = read_string(block, "id", bp + ".id");
      const auto name = read_string(block, "name", bp + ".name");
      if (!name) invalid_field(bp + ".name", "is required");
      const Json* input = find_field(block, "input");
      if (input && !input->is_object()) invalid_field(bp + ".input", "must be an object");
      Json call = Json::object();
      call["id"] = id.value_or(random_id("toolu_"));
      call["type"] = "function";
      call["function"] = Json{{"name", *name}, {"arguments", input ? *input : Json::object()}};
      calls.push_back(std::move(call));
    } else if (type == "redacted_thinking" || type == "server_tool_use" || type == "web_search_tool_result") {
      // Produced by Anthropic's own servers; nothing a local model can use.
    } else {
      invalid_field(bp + ".type", fmt::format("unknown content block type \"{}\" in an assistant message", type));
    }
  }
  msg["content"] = text;
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  return msg;
}

Json convert_tools(const Json& body) {
  const Json* tools = find_field(body, "tools");
  if (!tools) return nullptr;
  if (!tools->is_array()) invalid_field("tools", "must be an array of {\"name\", \"description\", \"input_schema\"}");
  Json out = Json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string p = fmt::format("tools[{}]", i);
    if (!t.is_object()) invalid_field(p, "must be an object");
    const std::string type = read_string(t, "type", p + ".type").value_or("custom");
    // Server tools (web_search_..., code_execution_...) run on Anthropic's side; a local model
    // cannot use them, so they are left out rather than failing the whole request.
    if (type != "custom") continue;
    const auto name = read_string(t, "name", p + ".name");
    if (!name || name->empty()) invalid_field(p + ".name", "is required");
    Json fn = Json::object();
    fn["name"] = *name;
    if (auto d = read_string(t, "description", p + ".description")) fn["description"] = *d;
    const Json* schema = find_field(t, "input_schema");
    if (schema && !schema->is_object()) invalid_field(p + ".input_schema", "must be a JSON Schema object");
    fn["parameters"] = schema ? *schema : Json{{"type", "object"}, {"properties", Json::object()}};
    out.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  return out.empty() ? Json(nullptr) : out;
}

MessagesRequest parse_common(const Json& body, bool need_max_tokens) {
  MessagesRequest r;
  r.model = read_string(body, "model").value_or("");
  const auto max_tokens = read_integer(body, "max_tokens", 1, std::numeric_limits<int32_t>::max());
  if (need_max_tokens && !max_tokens) invalid_field("max_tokens", "is required");
  r.gen.max_tokens = max_tokens;

  ChatInput& chat = r.chat;
  if (const Json* system = find_field(body, "system")) {
    const std::string text = blocks_text(*system, "system");
    if (!text.empty()) chat.messages.push_back(Json{{"role", "system"}, {"content", text}});
  }
  const Json* messages = find_field(body, "messages");
  if (!messages) invalid_field("messages", "is required");
  if (!messages->is_array()) invalid_field("messages", "must be an array of {\"role\", \"content\"} objects");
  if (messages->empty()) invalid_field("messages", "must hold at least one message");
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) invalid_field(p, "must be an object with \"role\" and \"content\"");
    const auto role = read_string(m, "role", p + ".role");
    if (!role || (*role != "user" && *role != "assistant" && *role != "system"))
      invalid_field(p + ".role", "must be \"user\", \"assistant\" or \"system\"");
    const Json* content = find_field(m, "content");
    if (!content) invalid_field(p + ".content", "is required");
    const bool last = i + 1 == messages->size();
    if (*role == "system") {
      // Claude Code sends system messages inside `messages` (the API accepts them). Those before
      // the first turn join the system prompt (templates expect it first); later ones stay where
      // they are, as system turns.
      const std::string text = blocks_text(*content, p + ".content");
      if (text.empty()) continue;
      const bool leading = std::all_of(chat.messages.begin(), chat.messages.end(),
                                       [](const Json& msg) { return msg["role"] == "system"; });
      if (leading && !chat.messages.empty()) {
        Json& system_msg = chat.messages.front();
        system_msg["content"] = system_msg["content"].get<std::string>() + "\n\n" + text;
      } else {
        chat.messages.push_back(Json{{"role", "system"}, {"content", text}});
      }
    } else if (*role == "user") {
      convert_user_message(*content, p + ".content", chat.messages);
    } else {
      Json msg = convert_assistant_message(*content, p + ".content");
      if (last && !msg.contains("tool_calls") && !msg.contains("reasoning_content")) {
        // Anthropic's prefill: the reply continues this text.
        r.assistant_prefill = msg["content"].get<std::string>();
        continue;
      }
      chat.messages.push_back(std::move(msg));
    }
  }
  if (chat.messages.empty()) invalid_field("messages", "holds no usable message");

  chat.tools = convert_tools(body);
  if (const Json* tc = find_field(body, "tool_choice")) {
    if (!tc->is_object()) invalid_field("tool_choice", "must be an object such as {\"type\": \"auto\"}");
    const std::string type = read_string(*tc, "type", "tool_choice.type").value_or("auto");
    if (type == "auto") chat.tool_choice.mode = ToolChoiceMode::Auto;
    else if (type == "any") chat.tool_choice.mode = ToolChoiceMode::Required;
    else if (type == "none") chat.tool_choice.mode = ToolChoiceMode::None;
    else if (type == "tool") {
      const auto name = read_string(*tc, "name", "tool_choice.name");
      if (!name) invalid_field("tool_choice.name", "is required when type is \"tool\"");
      chat.tool_choice.mode = ToolChoiceMode::Named;
      chat.tool_choice.name = *name;
    } else {
      invalid_field("tool_choice.type", fmt::format("must be auto, any, tool or none; got \"{}\"", type));
    }
    r.single_tool_call = read_bool(*tc, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use").value_or(false);
    if (chat.tool_choice.mode == ToolChoiceMode::Required || chat.tool_choice.mode == ToolChoiceMode::Named) {
      if (chat.tools.is_null()) invalid_field("tool_choice", "asks for a tool call but the request has no tools");
    }
    if (chat.tool_choice.mode == ToolChoiceMode::Named) {
      bool found = false;
      for (const Json& t : chat.tools) found = found || t["function"]["name"] == chat.tool_choice.name;
      if (!found) invalid_field("tool_choice.name", fmt::format("\"{}\" is not one of the tools", chat.tool_choice.name));
    }
  }
  // Extended thinking on/off maps to the templates' enable_thinking switch (Qwen3 and others).
  if (const Json* thinking = find_field(body, "thinking")) {
    if (!thinking->is_object()) invalid_field("thinking", "must be an object such as {\"type\": \"enabled\", \"budget_tokens\": 1024}");
    const std::string type = read_string(*thinking, "type", "thinking.type").value_or("");
    if (type == "enabled" || type == "adaptive") chat.template_kwargs["enable_thinking"] = true;
    else if (type == "disabled") chat.template_kwargs["enable_thinking"] = false;
    else invalid_field("thinking.type", fmt::format("must be \"enabled\" or \"disabled\", got \"{}\"", type));
  }

  SamplingOverrides& s = r.gen.sampling;
  if (auto v = read_number(body, "temperature", 0, 1)) s.temperature = float(*v);
  if (auto v = read_number(body, "top_p", 0, 1)) s.top_p = *v > 0 ? float(*v) : std::numeric_limits<float>::min();
  if (auto v = read_integer(body, "top_k", 0, std::numeric_limits<int32_t>::max())) s.top_k = int32_t(*v);
  r.gen.stop = read_string_or_list(body, "stop_sequences", 64);
  if (const Json* ss = find_field(body, "stop_sequences"); ss && !ss->is_array())
    invalid_field("stop_sequences", "must be an array of strings");
  r.stream = read_bool(body, "stream").value_or(false);
  return r;
}

}  // namespace

MessagesRequest parse_messages_request(const Json& body) { return parse_common(body, /*need_max_tokens=*/true); }
MessagesRequest parse_count_tokens_request(const Json& body) { return parse_common(body, /*need_max_tokens=*/false); }

std::string anthropic_stop_reason(const std::string& engine_reason, bool stopped_by_string, int n_tool_calls) {
  // A complete tool_use block means the client has a call to run, whatever cut the text after it.
  if (n_tool_calls > 0) return "tool_use";
  if (engine_reason == "length") return "max_tokens";
  if (stopped_by_string) return "stop_sequence";
  return "end_turn";
}

Json anthropic_usage(const UsageCounts& u) {
  Json usage = Json::object();
  usage["input_tokens"] = u.prompt_tokens - u.cached_tokens;
  usage["cache_creation_input_tokens"] = 0;
  usage["cache_read_input_tokens"] = u.cached_tokens;
  usage["output_tokens"] = u.completion_tokens;
  return usage;
}

void MessageContentBuilder::add(const std::vector<OutputPiece>& pieces) {
  for (const OutputPiece& piece : pieces) {
    switch (piece.kind) {
      case OutputPiece::Kind::Reasoning:
        if (!content.empty() && content.back()["type"] == "thinking") {
          content.back()["thinking"] = content.back()["thinking"].get<std::string>() + piece.text;
        } else {
          content.push_back(Json{{"type", "thinking"}, {"thinking", piece.text}, {"signature", ""}});
        }
        break;
      case OutputPiece::Kind::Content:
        if (!content.empty() && content.back()["type"] == "text") {
          content.back()["text"] = content.back()["text"].get<std::string>() + piece.text;
        } else {
          content.push_back(Json{{"type", "text"}, {"text", piece.text}});
        }
        break;
      case OutputPiece::Kind::ToolCall: {
        if (single_tool_call && n_tool_calls_ > 0) break;
        std::optional<Json> parsed = try_parse_json<Json>(piece.call.arguments);
        Json input = parsed && parsed->is_object() ? std::move(*parsed) : Json::object();
        content.push_back(
            Json{{"type", "tool_use"}, {"id", random_id("toolu_")}, {"name", piece.call.name}, {"input", std::move(input)}});
        ++n_tool_calls_;
        break;
      }
    }
  }
}

Json messages_response(const std::string& id, const std::string& model, Json content, const std::string& stop_reason,
                       const std::optional<std::string>& stop_sequence, const UsageCounts& usage) {
  Json r = Json::object();
  r["id"] = id;
  r["type"] = "message";
  r["role"] = "assistant";
  r["model"] = model;
  r["content"] = std::move(content);
  r["stop_reason"] = stop_reason;
  r["stop_sequence"] = stop_sequence ? Json(*stop_sequence) : Json(nullptr);
  r["usage"] = anthropic_usage(usage);
  return r;
}

std::string MessagesStreamWriter::start(int64_t prompt_tokens) {
  Json message = Json::object();
  message["id"] = id_;
  message["type"] = "message";
  message["role"] = "assistant";
  message["model"] = model_;
  message["content"] = Json::array();
  message["stop_reason"] = nullptr;
  message["stop_sequence"] = nullptr;
  message["usage"] = anthropic_usage({.prompt_tokens = prompt_tokens, .completion_tokens = 0, .cached_tokens = 0});
  return sse_event("message_start", Json{{"type", "message_start"}, {"message", std::move(message)}}) + ping();
}

std::string MessagesStreamWriter::ping() { return sse_event("ping", Json{{"type", "ping"}}); }

std::string MessagesStreamWriter::error(const ApiError& error) { return sse_event("error", anthropic_error_body(error)); }

std::string MessagesStreamWriter::open(Block kind, const Json& content_block) {
  std::string out = close();
  open_ = kind;
  ++index_;
  out += sse_event("content_block_start",
                   Json{{"type", "content_block_start"}, {"index", index_}, {"content_block", content_block}});
  return out;
}

std::string MessagesStreamWriter::close() {
  if (open_ == Block::None) return "";
  open_ = Block::None;
  return sse_event("content_block_stop", Json{{"type", "content_block_stop"}, {"index", index_}});
}

std::string MessagesStreamWriter::add(const std::vector<OutputPiece>& pieces) {
  std::string out;
  auto delta = [&](Json d) {
    out += sse_event("content_block_delta", Json{{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}});
  };
  for (const OutputPiece& piece : pieces) {
    switch (piece.kind) {
      case OutputPiece::Kind::Reasoning:
        if (open_ != Block::Thinking) out += open(Block::Thinking, Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
        delta(Json{{"type", "thinking_delta"}, {"thinking", piece.text}});
        break;
      case OutputPiece::Kind::Content:
        if (open_ != Block::Text) out += open(Block::Text, Json{{"type", "text"}, {"text", ""}});
        delta(Json{{"type", "text_delta"}, {"text", piece.text}});
        break;
      case OutputPiece::Kind::ToolCall:
        if (single_tool_call && n_tool_calls_ > 0) break;
        out += open(Block::ToolUse, Json{{"type", "tool_use"},
                                         {"id", random_id("toolu_")},
                                         {"name", piece.call.name},
                                         {"input", Json::object()}});
        delta(Json{{"type", "input_json_delta"}, {"partial_json", piece.call.arguments}});
        out += close();
        ++n_tool_calls_;
        break;
    }
  }
  return out;
}

std::string MessagesStreamWriter::finish(const std::string& stop_reason, const std::optional<std::string>& stop_sequence,
                                         const UsageCounts& usage) {
  std::string out = close();
  Json delta = Json::object();
  delta["stop_reason"] = stop_reason;
  delta["stop_sequence"] = stop_sequence ? Json(*stop_sequence) : Json(nullptr);
  out += sse_event("message_delta", Json{{"type", "message_delta"}, {"delta", std::move(delta)}, {"usage", anthropic_usage(usage)}});
  out += sse_event("message_stop", Json{{"type", "message_stop"}});
  return out;
}

}  // namespace spill::server
