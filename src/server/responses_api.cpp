#include "server/responses_api.h"

#include <fmt/format.h>

#include <limits>

namespace spill::server {

namespace {

constexpr int64_t kMaxOutputTokensLimit = std::numeric_limits<int32_t>::max();

// The text of an input message's content: a string, or input_text / output_text / refusal parts.
std::string item_content_text(const Json& content, const std::string& param) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) invalid_field(param, "must be a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string p = fmt::format("{}[{}]", param, i);
    if (!part.is_object()) invalid_field(p, "must be a content part such as {\"type\": \"input_text\", \"text\": ...}");
    const std::string type = read_string(part, "type", p + ".type").value_or("");
    std::optional<std::string> piece;
    if (type == "input_text" || type == "output_text" || type == "text" || type == "summary_text" ||
        type == "reasoning_text")
      piece = read_string(part, "text", p + ".text");
    else if (type == "refusal")
      piece = read_string(part, "refusal", p + ".refusal");
    else if (type == "input_image" || type == "input_file" || type == "input_audio")
      invalid_field(p + ".type", fmt::format("\"{}\" is not supported: the model reads text only", type));
    else
      invalid_field(p + ".type", fmt::format("unknown content part type \"{}\"; use \"input_text\"", type));
    if (!text.empty() && piece && !piece->empty()) text += "\n";
    text += piece.value_or("");
  }
  return text;
}

// A reasoning item's text: its reasoning_text content, else its summary.
std::string reasoning_item_text(const Json& item, const std::string& p) {
  if (const Json* content = find_field(item, "content"); content && content->is_array() && !content->empty())
    return item_content_text(*content, p + ".content");
  if (const Json* summary = find_field(item, "summary")) return item_content_text(*summary, p + ".summary");
  return "";
}

// The Responses API's flat function tools ({"type": "function", "name", "parameters"}) in the Chat
// Completions shape the chat path takes; openai_api.cpp's parse_tools reads that shape directly.
Json parse_responses_tools(const Json& body) {
  const Json* tools = find_field(body, "tools");
  if (!tools) return nullptr;
  if (!tools->is_array()) invalid_field("tools", "must be an array of {\"type\": \"function\", \"name\", \"parameters\"}");
  Json out = Json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string p = fmt::format("tools[{}]", i);
    if (!t.is_object()) invalid_field(p, "must be an object");
    const std::string type = read_string(t, "type", p + ".type").value_or("function");
    // Hosted tools (web_search, file_search, code_interpreter, ...) and custom grammar tools run
    // or parse on OpenAI's side; a local model gets the function tools only.
    if (type != "function") continue;
    const auto name = read_string(t, "name", p + ".name");
    if (!name || name->empty()) invalid_field(p + ".name", "is required");
    Json fn = Json::object();
    fn["name"] = *name;
    if (auto d = read_string(t, "description", p + ".description")) fn["description"] = *d;
    const Json* params = find_field(t, "parameters");
    if (params && !params->is_object()) invalid_field(p + ".parameters", "must be a JSON Schema object");
    fn["parameters"] = params ? *params : Json{{"type", "object"}, {"properties", Json::object()}};
    out.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  return out.empty() ? Json(nullptr) : out;
}

// tool_choice as the Responses API names a function: {"type": "function", "name": ...}.
ToolChoice parse_responses_tool_choice(const Json& body, const Json& tools) {
  ToolChoice choice;
  const Json* tc = find_field(body, "tool_choice");
  if (!tc) return choice;
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "auto") choice.mode = ToolChoiceMode::Auto;
    else if (s == "none") choice.mode = ToolChoiceMode::None;
    else if (s == "required") choice.mode = ToolChoiceMode::Required;
    else invalid_field("tool_choice", fmt::format("must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"name\"}}, got \"{}\"", s));
  } else if (tc->is_object()) {
    const std::string type = read_string(*tc, "type", "tool_choice.type").value_or("");
    if (type != "function") invalid_field("tool_choice.type", fmt::format("only \"function\" tools can be named, got \"{}\"", type));
    const auto name = read_string(*tc, "name", "tool_choice.name");
    if (!name) invalid_field("tool_choice.name", "is required");
    choice.mode = ToolChoiceMode::Named;
    choice.name = *name;
  } else {
    invalid_field("tool_choice", "must be a string or an object");
  }
  if ((choice.mode == ToolChoiceMode::Required || choice.mode == ToolChoiceMode::Named) && tools.is_null())
    invalid_field("tool_choice", "asks for a tool call but the request has no function tools");
  if (choice.mode == ToolChoiceMode::Named) {
    bool found = false;
    for (const Json& t : tools) found = found || t["function"]["name"] == choice.name;
    if (!found) invalid_field("tool_choice.name", fmt::format("\"{}\" is not one of the function tools", choice.name));
  }
  return choice;
}

// Input items -> chat messages.
Json convert_input(const Json& input) {
  Json messages = Json::array();
  if (input.is_string()) {
    messages.push_back(Json{{"role", "user"}, {"content", input.get<std::string>()}});
    return messages;
  }
  if (!input.is_array()) invalid_field("input", "must be a string or an array of input items");
  std::string pending_reasoning;  // a reasoning item waits for the assistant turn it belongs to
  // The assistant message that function calls join (the one just before, or a new one).
  auto assistant_for_calls = [&]() -> Json& {
    if (messages.empty() || messages.back()["role"] != "assistant") {
      messages.push_back(Json{{"role", "assistant"}, {"content", ""}});
    }
    return messages.back();
  };
  auto take_reasoning = [&](Json& msg) {
    if (pending_reasoning.empty()) return;
    msg["reasoning_content"] = msg.contains("reasoning_content")
                                   ? msg["reasoning_content"].get<std::string>() + "\n" + pending_reasoning
                                   : pending_reasoning;
    pending_reasoning.clear();
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& item = input[i];
    const std::string p = fmt::format("input[{}]", i);
    if (!item.is_object()) invalid_field(p, "must be an input item object");
    // A message may leave out "type" (the EasyInputMessage shape).
    const std::string type = read_string(item, "type", p + ".type").value_or("message");
    if (type == "message") {
      auto role = read_string(item, "role", p + ".role");
      if (!role) invalid_field(p + ".role", "is required");
      if (*role == "developer") role = "system";
      if (*role != "user" && *role != "assistant" && *role != "system")
        invalid_field(p + ".role", fmt::format("must be user, assistant, system or developer; got \"{}\"", *role));
      const Json* content = find_field(item, "content");
      if (!content) invalid_field(p + ".content", "is required");
      Json msg = Json{{"role", *role}, {"content", item_content_text(*content, p + ".content")}};
      if (*role == "assistant") {
        // Consecutive assistant text (several output messages) is one turn.
        if (!messages.empty() && messages.back()["role"] == "assistant" && !messages.back().contains("tool_calls")) {
          Json& prev = messages.back();
          const std::string before = prev["content"].get<std::string>();
          prev["content"] = before.empty() ? msg["content"].get<std::string>() : before + "\n" + msg["content"].get<std::string>();
          take_reasoning(prev);
          continue;
        }
        take_reasoning(msg);
      }
      messages.push_back(std::move(msg));
    } else if (type == "function_call") {
      const auto call_id = read_string(item, "call_id", p + ".call_id");
      if (!call_id) invalid_field(p + ".call_id", "is required");
      const auto name = read_string(item, "name", p + ".name");
      if (!name) invalid_field(p + ".name", "is required");
      const std::string arguments = read_string(item, "arguments", p + ".arguments").value_or("{}");
      // Templates take arguments as an object (transformers' shape); text that is not a JSON
      // object is passed as it came.
      Json parsed = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
      Json& msg = assistant_for_calls();
      take_reasoning(msg);
      if (!msg.contains("tool_calls")) msg["tool_calls"] = Json::array();
      msg["tool_calls"].push_back(Json{{"id", *call_id},
                                       {"type", "function"},
                                       {"function", Json{{"name", *name}, {"arguments", parsed.is_object() ? parsed : Json(arguments)}}}});
    } else if (type == "function_call_output") {
      const auto call_id = read_string(item, "call_id", p + ".call_id");
      if (!call_id) invalid_field(p + ".call_id", "is required");
      const Json* output = find_field(item, "output");
      if (!output) invalid_field(p + ".output", "is required");
      messages.push_back(Json{{"role", "tool"}, {"tool_call_id", *call_id}, {"content", item_content_text(*output, p + ".output")}});
    } else if (type == "reasoning") {
      const std::string text = reasoning_item_text(item, p);
      if (!text.empty()) pending_reasoning += (pending_reasoning.empty() ? "" : "\n") + text;
    } else if (type == "item_reference") {
      invalid_field(p + ".type", "item_reference is not supported; send the item itself, or use previous_response_id");
    } else {
      invalid_field(p + ".type",
                    fmt::format("unsupported input item type \"{}\" (spill takes message, function_call, "
                                "function_call_output and reasoning items)",
                                type));
    }
  }
  return messages;
}

}  // namespace

ResponsesRequest parse_responses_request(const Json& body) {
  ResponsesRequest r;
  r.model = read_string(body, "model").value_or("");
  r.instructions = read_string(body, "instructions").value_or("");
  const Json* input = find_field(body, "input");
  if (!input) invalid_field("input", "is required: a string or an array of input items");
  r.input_messages = convert_input(*input);
  if (r.input_messages.empty() && !find_field(body, "previous_response_id")) invalid_field("input", "holds no item");

  if (!r.instructions.empty()) r.chat.messages.push_back(Json{{"role", "system"}, {"content", r.instructions}});
  for (const Json& m : r.input_messages) r.chat.messages.push_back(m);
  r.chat.tools = parse_responses_tools(body);
  r.chat.tool_choice = parse_responses_tool_choice(body, r.chat.tools);
  r.parallel_tool_calls = read_bool(body, "parallel_tool_calls").value_or(true);
  r.previous_response_id = read_string(body, "previous_response_id");
  r.store = read_bool(body, "store").value_or(true);
  r.stream = read_bool(body, "stream").value_or(false);

  // Reasoning effort: "none"/"minimal" switch the templates' thinking off where they can.
  if (const Json* reasoning = find_field(body, "reasoning")) {
    if (!reasoning->is_object()) invalid_field("reasoning", "must be an object such as {\"effort\": \"medium\"}");
    const std::string effort = read_string(*reasoning, "effort", "reasoning.effort").value_or("");
    if (effort == "none" || effort == "minimal") r.chat.template_kwargs["enable_thinking"] = false;
    else if (!effort.empty()) r.chat.template_kwargs["enable_thinking"] = true;
  }
  if (const Json* text = find_field(body, "text")) {
    if (!text->is_object()) invalid_field("text", "must be an object such as {\"format\": {\"type\": \"text\"}}");
    if (const Json* format = find_field(*text, "format")) {
      const std::string type = read_string(*format, "type", "text.format.type").value_or("text");
      if (type != "text")
        invalid_field("text.format.type", fmt::format("\"{}\" is not supported by spill; use \"text\"", type));
    }
  }

  GenerationOptions& g = r.gen;
  g.max_tokens = read_integer(body, "max_output_tokens", 1, kMaxOutputTokensLimit);
  SamplingOverrides& s = g.sampling;
  if (auto v = read_number(body, "temperature", 0, 2)) s.temperature = float(*v);
  if (auto v = read_number(body, "top_p", 0, 1)) s.top_p = *v > 0 ? float(*v) : std::numeric_limits<float>::min();
  if (auto v = read_integer(body, "top_logprobs", 0, 20); v && *v > 0) {
    g.logprobs = true;
    g.top_logprobs = int32_t(*v);
  }

  // What the response object repeats back.
  Json& e = r.echo;
  e["instructions"] = r.instructions.empty() ? Json(nullptr) : Json(r.instructions);
  e["max_output_tokens"] = g.max_tokens ? Json(*g.max_tokens) : Json(nullptr);
  e["parallel_tool_calls"] = r.parallel_tool_calls;
  e["previous_response_id"] = r.previous_response_id ? Json(*r.previous_response_id) : Json(nullptr);
  const Json* reasoning = find_field(body, "reasoning");
  e["reasoning"] = Json{{"effort", reasoning && reasoning->contains("effort") ? (*reasoning)["effort"] : Json(nullptr)},
                        {"summary", nullptr}};
  e["store"] = r.store;
  e["temperature"] = s.temperature ? Json(*s.temperature) : Json(nullptr);
  e["text"] = Json{{"format", Json{{"type", "text"}}}};
  const Json* tc = find_field(body, "tool_choice");
  e["tool_choice"] = tc ? *tc : Json("auto");
  const Json* tools = find_field(body, "tools");
  e["tools"] = tools ? *tools : Json::array();
  e["top_p"] = s.top_p ? Json(*s.top_p) : Json(nullptr);
  e["truncation"] = "disabled";
  const Json* metadata = find_field(body, "metadata");
  e["metadata"] = metadata && metadata->is_object() ? *metadata : Json::object();
  e["user"] = read_string(body, "user") ? (*find_field(body, "user")) : Json(nullptr);
  return r;
}

void prepend_conversation(ResponsesRequest& r, const Json& previous) {
  Json messages = Json::array();
  if (!r.instructions.empty()) messages.push_back(Json{{"role", "system"}, {"content", r.instructions}});
  for (const Json& m : previous) messages.push_back(m);
  for (const Json& m : r.input_messages) messages.push_back(m);
  r.chat.messages = std::move(messages);
}

// ---- output ----

std::string ResponseOutputBuilder::event(const std::string& type, Json fields) {
  Json e = Json::object();
  e["type"] = type;
  e["sequence_number"] = sequence_++;
  for (auto& [k, v] : fields.items()) e[k] = std::move(v);
  return sse_event(type, e);
}

std::string ResponseOutputBuilder::open_item(Open kind) {
  std::string out = close();
  open_ = kind;
  open_text_.clear();
  const int64_t index = int64_t(output_.size());
  Json item = Json::object();
  if (kind == Open::Reasoning) {
    item["id"] = random_id("rs_");
    item["type"] = "reasoning";
    item["summary"] = Json::array();
    item["content"] = Json::array();
    item["status"] = "in_progress";
    out += event("response.output_item.added", Json{{"output_index", index}, {"item", item}});
    output_.push_back(item);
    out += event("response.content_part.added", Json{{"item_id", item["id"]},
                                                     {"output_index", index},
                                                     {"content_index", 0},
                                                     {"part", Json{{"type", "reasoning_text"}, {"text", ""}}}});
  } else {
    item["id"] = random_id("msg_");
    item["type"] = "message";
    item["status"] = "in_progress";
    item["role"] = "assistant";
    item["content"] = Json::array();
    out += event("response.output_item.added", Json{{"output_index", index}, {"item", item}});
    output_.push_back(item);
    out += event("response.content_part.added",
                 Json{{"item_id", item["id"]},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part", Json{{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}, {"logprobs", Json::array()}}}});
  }
  return out;
}

std::string ResponseOutputBuilder::close() {
  if (open_ == Open::None) return "";
  const int64_t index = int64_t(output_.size()) - 1;
  Json& item = output_.back();
  const Json id = item["id"];
  std::string out;
  if (open_ == Open::Reasoning) {
    const Json part = Json{{"type", "reasoning_text"}, {"text", open_text_}};
    out += event("response.reasoning_text.done",
                 Json{{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", open_text_}});
    out += event("response.content_part.done", Json{{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    item["content"] = Json::array({part});
  } else {
    const Json part = Json{{"type", "output_text"}, {"text", open_text_}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
    out += event("response.output_text.done", Json{{"item_id", id},
                                                   {"output_index", index},
                                                   {"content_index", 0},
                                                   {"text", open_text_},
                                                   {"logprobs", Json::array()}});
    out += event("response.content_part.done", Json{{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    item["content"] = Json::array({part});
  }
  item["status"] = "completed";
  out += event("response.output_item.done", Json{{"output_index", index}, {"item", item}});
  open_ = Open::None;
  open_text_.clear();
  return out;
}

std::string ResponseOutputBuilder::add(const std::vector<OutputPiece>& pieces) {
  std::string out;
  for (const OutputPiece& piece : pieces) {
    switch (piece.kind) {
      case OutputPiece::Kind::Reasoning: {
        if (open_ != Open::Reasoning) out += open_item(Open::Reasoning);
        open_text_ += piece.text;
        reasoning_ += piece.text;
        const int64_t index = int64_t(output_.size()) - 1;
        out += event("response.reasoning_text.delta",
                     Json{{"item_id", output_.back()["id"]}, {"output_index", index}, {"content_index", 0}, {"delta", piece.text}});
        break;
      }
      case OutputPiece::Kind::Content: {
        if (open_ != Open::Message) out += open_item(Open::Message);
        open_text_ += piece.text;
        const int64_t index = int64_t(output_.size()) - 1;
        out += event("response.output_text.delta", Json{{"item_id", output_.back()["id"]},
                                                        {"output_index", index},
                                                        {"content_index", 0},
                                                        {"delta", piece.text},
                                                        {"logprobs", Json::array()}});
        break;
      }
      case OutputPiece::Kind::ToolCall: {
        if (!parallel_tool_calls && n_tool_calls_ > 0) break;
        out += close();
        const int64_t index = int64_t(output_.size());
        Json item = Json::object();
        item["id"] = random_id("fc_");
        item["type"] = "function_call";
        item["status"] = "in_progress";
        item["arguments"] = "";
        item["call_id"] = random_id("call_");
        item["name"] = piece.call.name;
        out += event("response.output_item.added", Json{{"output_index", index}, {"item", item}});
        out += event("response.function_call_arguments.delta",
                     Json{{"item_id", item["id"]}, {"output_index", index}, {"delta", piece.call.arguments}});
        out += event("response.function_call_arguments.done", Json{{"item_id", item["id"]},
                                                                   {"output_index", index},
                                                                   {"name", piece.call.name},
                                                                   {"arguments", piece.call.arguments}});
        item["arguments"] = piece.call.arguments;
        item["status"] = "completed";
        out += event("response.output_item.done", Json{{"output_index", index}, {"item", item}});
        output_.push_back(std::move(item));
        ++n_tool_calls_;
        break;
      }
    }
  }
  return out;
}

Json ResponseOutputBuilder::as_chat_messages() const {
  Json msg = Json{{"role", "assistant"}, {"content", ""}};
  std::string text, reasoning;
  Json calls = Json::array();
  for (const Json& item : output_) {
    const std::string type = item["type"];
    if (type == "reasoning") {
      for (const Json& part : item["content"]) reasoning += part.value("text", "");
    } else if (type == "message") {
      for (const Json& part : item["content"]) text += part.value("text", "");
    } else if (type == "function_call") {
      Json args = Json::parse(item["arguments"].get<std::string>(), nullptr, false);
      calls.push_back(Json{{"id", item["call_id"]},
                           {"type", "function"},
                           {"function", Json{{"name", item["name"]}, {"arguments", args.is_object() ? args : item["arguments"]}}}});
    }
  }
  msg["content"] = text;
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  return Json::array({std::move(msg)});
}

Json response_object(const std::string& id, int64_t created_at, const std::string& model, const ResponsesRequest& r,
                     const Json& output, const ResponseStatus& status, const std::optional<UsageCounts>& usage,
                     int64_t reasoning_tokens) {
  Json o = Json::object();
  o["id"] = id;
  o["object"] = "response";
  o["created_at"] = created_at;
  o["status"] = status.status;
  o["background"] = false;
  o["error"] = nullptr;
  o["incomplete_details"] =
      status.incomplete_reason ? Json{{"reason", *status.incomplete_reason}} : Json(nullptr);
  o["model"] = model;
  o["output"] = output;
  for (const auto& [k, v] : r.echo.items()) o[k] = v;
  if (usage) {
    Json u = Json::object();
    u["input_tokens"] = usage->prompt_tokens;
    u["input_tokens_details"] = Json{{"cached_tokens", usage->cached_tokens}};
    u["output_tokens"] = usage->completion_tokens;
    u["output_tokens_details"] = Json{{"reasoning_tokens", reasoning_tokens}};
    u["total_tokens"] = usage->prompt_tokens + usage->completion_tokens;
    o["usage"] = std::move(u);
  } else {
    o["usage"] = nullptr;
  }
  return o;
}

// ---- store ----

void ResponseStore::put(const std::string& id, Entry entry) {
  if (capacity_ == 0) return;
  entry.bytes = entry.conversation.dump().size() + entry.response.dump().size();
  if (entry.bytes > max_bytes_) return;  // larger than the whole store: not kept
  std::lock_guard lock(mutex_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    bytes_ -= it->second.first.bytes;
    order_.erase(it->second.second);
    entries_.erase(it);
  }
  order_.push_back(id);
  bytes_ += entry.bytes;
  entries_.emplace(id, std::make_pair(std::move(entry), std::prev(order_.end())));
  evict_locked();
}

void ResponseStore::evict_locked() {
  while (!order_.empty() && (entries_.size() > capacity_ || bytes_ > max_bytes_)) {
    auto it = entries_.find(order_.front());
    bytes_ -= it->second.first.bytes;
    entries_.erase(it);
    order_.pop_front();
  }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.first;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  bytes_ -= it->second.first.bytes;
  order_.erase(it->second.second);
  entries_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace spill::server
