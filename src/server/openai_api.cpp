#include "server/openai_api.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "sampling/sampler.h"
#include "text/tokenizer.h"

namespace spill::server {

namespace {

constexpr int64_t kMaxTokensLimit = std::numeric_limits<int32_t>::max();
// Choices one request may ask for (prompts x n): each is a sequence in the engine.
constexpr int64_t kMaxChoices = 128;

bool is_one_of(const std::string& s, std::initializer_list<const char*> options) {
  for (const char* o : options)
    if (s == o) return true;
  return false;
}

// Assistant tool calls as templates expect them: arguments as an object when the client sent
// JSON text (transformers' documented shape), left as text when it is not JSON.
Json normalize_tool_calls(const Json& calls, const std::string& param) {
  if (!calls.is_array()) invalid_field(param, "must be an array of tool calls");
  Json out = Json::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    const Json& call = calls[j];
    const std::string p = fmt::format("{}[{}]", param, j);
    if (!call.is_object()) invalid_field(p, "must be an object with a \"function\" member");
    const Json* fn = find_field(call, "function");
    if (!fn || !fn->is_object()) invalid_field(p + ".function", "must be an object with \"name\" and \"arguments\"");
    const auto name = read_string(*fn, "name", p + ".function.name");
    if (!name) invalid_field(p + ".function.name", "is required");
    Json arguments = Json::object();
    if (const Json* a = find_field(*fn, "arguments")) {
      if (a->is_string()) {
        // A string that is not JSON stays text; one that is JSON but nests too deep is refused.
        const std::string& text = a->get_ref<const std::string&>();
        std::string why;
        std::optional<Json> parsed = try_parse_json<Json>(text, &why);
        if (!parsed && json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth)
          invalid_field(p + ".function.arguments", why);
        arguments = parsed && parsed->is_object() ? std::move(*parsed) : *a;
      } else if (a->is_object()) {
        arguments = *a;
      } else {
        invalid_field(p + ".function.arguments", "must be a string holding a JSON object");
      }
    }
    Json o = Json::object();
    o["id"] = read_string(call, "id", p + ".id").value_or(random_id("call_"));
    o["type"] = "function";
    o["function"] = Json{{"name", *name}, {"arguments", std::move(arguments)}};
    out.push_back(std::move(o));
  }
  return out;
}

Json parse_tools(const Json& body) {
  const Json* tools = find_field(body, "tools");
  if (!tools) return nullptr;
  if (!tools->is_array()) invalid_field("tools", "must be an array of {\"type\": \"function\", \"function\": {...}}");
  if (tools->empty()) return nullptr;
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string p = fmt::format("tools[{}]", i);
    if (!t.is_object()) invalid_field(p, "must be an object");
    const auto type = read_string(t, "type", p + ".type").value_or("function");
    if (type != "function") invalid_field(p + ".type", fmt::format("must be \"function\", got \"{}\"", type));
    const Json* fn = find_field(t, "function");
    if (!fn || !fn->is_object()) invalid_field(p + ".function", "must be an object with at least a \"name\"");
    const auto name = read_string(*fn, "name", p + ".function.name");
    if (!name || name->empty()) invalid_field(p + ".function.name", "is required");
    if (const Json* params = find_field(*fn, "parameters"); params && !params->is_object())
      invalid_field(p + ".function.parameters", "must be a JSON Schema object");
  }
  return *tools;
}

ToolChoice parse_tool_choice(const Json& body, const Json& tools) {
  ToolChoice choice;
  const Json* tc = find_field(body, "tool_choice");
  if (!tc) return choice;
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "auto") choice.mode = ToolChoiceMode::Auto;
    else if (s == "none") choice.mode = ToolChoiceMode::None;
    else if (s == "required") choice.mode = ToolChoiceMode::Required;
    else invalid_field("tool_choice", fmt::format("must be \"none\", \"auto\", \"required\" or a named function, got \"{}\"", s));
  } else if (tc->is_object()) {
    const Json* fn = find_field(*tc, "function");
    const auto name = fn ? read_string(*fn, "name", "tool_choice.function.name") : std::nullopt;
    if (!name) invalid_field("tool_choice", "must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}");
    choice.mode = ToolChoiceMode::Named;
    choice.name = *name;
  } else {
    invalid_field("tool_choice", "must be a string or an object");
  }
  if (choice.mode == ToolChoiceMode::Required || choice.mode == ToolChoiceMode::Named) {
    if (tools.is_null()) invalid_field("tool_choice", "asks for a tool call but the request has no tools");
  }
  if (choice.mode == ToolChoiceMode::Named) {
    bool found = false;
    for (const Json& t : tools) found = found || t["function"]["name"] == choice.name;
    if (!found) invalid_field("tool_choice", fmt::format("names the function \"{}\", which is not in tools", choice.name));
  }
  return choice;
}

void read_stream_fields(const Json& body, bool& stream, bool& include_usage) {
  stream = read_bool(body, "stream").value_or(false);
  if (const Json* so = find_field(body, "stream_options")) {
    if (!so->is_object()) invalid_field("stream_options", "must be an object");
    include_usage = read_bool(*so, "include_usage", "stream_options.include_usage").value_or(false);
  }
}

float finite_logprob(float lp) { return std::isfinite(lp) ? lp : -9999.0f; }

Json token_bytes(const std::string& text) {
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(int(c));
  return bytes;
}

}  // namespace

std::string message_content_text(const Json& content, const std::string& param) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) invalid_field(param, "must be a string or an array of content parts");
  std::string text;
  bool first = true;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string p = fmt::format("{}[{}]", param, i);
    if (part.is_string()) {  // lenient: a bare string part
      text += (first ? "" : "\n") + part.get<std::string>();
      first = false;
      continue;
    }
    if (!part.is_object()) invalid_field(p, "must be a content part object such as {\"type\": \"text\", \"text\": ...}");
    const auto type = read_string(part, "type", p + ".type");
    if (!type) invalid_field(p + ".type", "is required");
    std::optional<std::string> piece;
    if (*type == "text" || *type == "input_text") piece = read_string(part, "text", p + ".text");
    else if (*type == "refusal") piece = read_string(part, "refusal", p + ".refusal");
    else if (is_one_of(*type, {"image_url", "input_image", "image", "input_audio", "audio_url", "file", "video_url"}))
      invalid_field(p + ".type", fmt::format("\"{}\" is not supported: the model reads text only", *type));
    else
      invalid_field(p + ".type", fmt::format("unknown content part type \"{}\"; use \"text\"", *type));
    if (!piece) invalid_field(p, "has no text");
    text += (first ? "" : "\n") + *piece;
    first = false;
  }
  return text;
}

ChatInput parse_chat_input(const Json& body) {
  ChatInput in;
  const Json* messages = find_field(body, "messages");
  if (!messages) invalid_field("messages", "is required: an array of {\"role\", \"content\"} objects");
  if (!messages->is_array()) invalid_field("messages", "must be an array of {\"role\", \"content\"} objects");
  if (messages->empty()) invalid_field("messages", "must hold at least one message");
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) invalid_field(p, "must be an object with \"role\" and \"content\"");
    auto role = read_string(m, "role", p + ".role");
    if (!role) invalid_field(p + ".role", "is required");
    if (!is_one_of(*role, {"system", "developer", "user", "assistant", "tool"}))
      invalid_field(p + ".role",
                    fmt::format("must be one of system, developer, user, assistant, tool; got \"{}\"", *role));
    if (*role == "developer") role = "system";  // OpenAI's newer name; chat templates know "system"

    Json out = Json::object();
    out["role"] = *role;
    const Json* content = find_field(m, "content");
    if (!content && *role != "assistant") invalid_field(p + ".content", "is required");
    out["content"] = message_content_text(content ? *content : Json(nullptr), p + ".content");
    if (auto name = read_string(m, "name", p + ".name")) out["name"] = *name;
    if (*role == "assistant") {
      if (const Json* calls = find_field(m, "tool_calls"); calls && !calls->empty())
        out["tool_calls"] = normalize_tool_calls(*calls, p + ".tool_calls");
      auto reasoning = read_string(m, "reasoning_content", p + ".reasoning_content");
      if (!reasoning) reasoning = read_string(m, "reasoning", p + ".reasoning");
      if (reasoning) out["reasoning_content"] = *reasoning;
    }
    if (*role == "tool") {
      if (auto id = read_string(m, "tool_call_id", p + ".tool_call_id")) out["tool_call_id"] = *id;
    }
    in.messages.push_back(std::move(out));
  }
  in.tools = parse_tools(body);
  in.tool_choice = parse_tool_choice(body, in.tools);
  if (const Json* kw = find_field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) invalid_field("chat_template_kwargs", "must be an object of template variables");
    in.template_kwargs = *kw;
  }
  in.add_generation_prompt = read_bool(body, "add_generation_prompt").value_or(true);
  return in;
}

ChatCompletionRequest parse_chat_completion_request(const Json& body) {
  ChatCompletionRequest r;
  r.model = read_string(body, "model").value_or("");
  if (find_field(body, "functions") || find_field(body, "function_call"))
    invalid_field(find_field(body, "functions") ? "functions" : "function_call",
                  "is the deprecated form of tools; send \"tools\" and \"tool_choice\" instead");
  r.chat = parse_chat_input(body);
  read_common_sampling_fields(body, r.gen);
  if (auto v = read_integer(body, "max_tokens", 1, kMaxTokensLimit)) r.gen.max_tokens = *v;
  if (auto v = read_integer(body, "max_completion_tokens", 1, kMaxTokensLimit)) r.gen.max_tokens = *v;
  r.gen.logprobs = read_bool(body, "logprobs").value_or(false);
  if (auto v = read_integer(body, "top_logprobs", 0, kMaxTopLogprobs)) {
    if (*v > 0 && !r.gen.logprobs) invalid_field("top_logprobs", "needs \"logprobs\": true");
    r.gen.top_logprobs = int32_t(*v);
  }
  read_stream_fields(body, r.stream, r.include_usage);
  r.parallel_tool_calls = read_bool(body, "parallel_tool_calls").value_or(true);
  if (const Json* rf = find_field(body, "response_format")) {
    const auto type = rf->is_object() ? read_string(*rf, "type", "response_format.type") : std::nullopt;
    if (!type) invalid_field("response_format", "must be an object with a \"type\"");
    if (*type != "text")
      invalid_field("response_format",
                    fmt::format("type \"{}\" is not supported (spill has no constrained decoding); omit it or use \"text\"", *type));
  }
  if (r.gen.n > kMaxChoices) invalid_field("n", fmt::format("must be at most {}", kMaxChoices));
  return r;
}

CompletionRequest parse_completion_request(const Json& body) {
  CompletionRequest r;
  r.model = read_string(body, "model").value_or("");
  const Json* prompt = find_field(body, "prompt");
  if (!prompt) invalid_field("prompt", "is required: a string, an array of strings, or token ids");
  auto token_list = [](const Json& arr, const std::string& p) {
    CompletionPrompt cp;
    cp.is_tokens = true;
    for (const Json& id : arr) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max())
        invalid_field(p, "token ids must be non-negative integers");
      cp.tokens.push_back(id.get<int32_t>());
    }
    return cp;
  };
  if (prompt->is_string()) {
    r.prompts.push_back({.text = prompt->get<std::string>(), .tokens = {}, .is_tokens = false});
  } else if (prompt->is_array()) {
    if (prompt->empty()) invalid_field("prompt", "must not be an empty array");
    const Json& first = (*prompt)[0];
    if (first.is_number()) {
      r.prompts.push_back(token_list(*prompt, "prompt"));
    } else {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const Json& item = (*prompt)[i];
        const std::string p = fmt::format("prompt[{}]", i);
        if (item.is_string()) r.prompts.push_back({.text = item.get<std::string>(), .tokens = {}, .is_tokens = false});
        else if (item.is_array()) r.prompts.push_back(token_list(item, p));
        else invalid_field(p, "must be a string or an array of token ids");
      }
    }
  } else {
    invalid_field("prompt", "must be a string, an array of strings, or token ids");
  }
  read_common_sampling_fields(body, r.gen);
  if (auto v = read_integer(body, "max_tokens", 1, kMaxTokensLimit)) r.gen.max_tokens = *v;
  if (auto v = read_integer(body, "logprobs", 0, kMaxTopLogprobs)) {
    r.gen.logprobs = true;
    r.gen.top_logprobs = int32_t(*v);
  }
  r.echo = read_bool(body, "echo").value_or(false);
  if (auto suffix = read_string(body, "suffix"); suffix && !suffix->empty())
    invalid_field("suffix", "is not supported (no fill-in-the-middle); omit it");
  if (auto best_of = read_integer(body, "best_of", 1, kMaxChoices); best_of && *best_of != r.gen.n)
    invalid_field("best_of", "is not supported; omit it or set it equal to n");
  read_stream_fields(body, r.stream, r.include_usage);
  if (int64_t(r.prompts.size()) * r.gen.n > kMaxChoices)
    invalid_field("n", fmt::format("prompts x n must be at most {}, got {} x {}", kMaxChoices, r.prompts.size(), r.gen.n));
  return r;
}

// ---- responses ----

Json openai_usage(const UsageCounts& u) {
  Json usage = Json::object();
  usage["prompt_tokens"] = u.prompt_tokens;
  usage["completion_tokens"] = u.completion_tokens;
  usage["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  usage["prompt_tokens_details"] = Json{{"cached_tokens", u.cached_tokens}};
  return usage;
}

Json chat_logprob_entry(const Tokenizer& tokenizer, const SampledToken& token) {
  auto entry = [&](int32_t id, float lp) {
    const std::string text = tokenizer.token_text(id);
    Json e = Json::object();
    e["token"] = text;
    e["logprob"] = finite_logprob(lp);
    e["bytes"] = token_bytes(text);
    return e;
  };
  Json e = entry(token.token, token.logprob);
  Json top = Json::array();
  for (const TokenLogprob& t : token.top) top.push_back(entry(t.token, t.logprob));
  e["top_logprobs"] = std::move(top);
  return e;
}

Json completion_logprobs(const Tokenizer& tokenizer, const std::vector<SampledToken>& tokens, int64_t first_offset) {
  Json out = Json::object();
  Json texts = Json::array(), lps = Json::array(), tops = Json::array(), offsets = Json::array();
  int64_t offset = first_offset;
  for (const SampledToken& t : tokens) {
    const std::string text = tokenizer.token_text(t.token);
    texts.push_back(text);
    lps.push_back(finite_logprob(t.logprob));
    Json top = Json::object();
    for (const TokenLogprob& alt : t.top) top[tokenizer.token_text(alt.token)] = finite_logprob(alt.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += int64_t(text.size());
  }
  out["tokens"] = std::move(texts);
  out["token_logprobs"] = std::move(lps);
  out["top_logprobs"] = std::move(tops);
  out["text_offset"] = std::move(offsets);
  return out;
}

namespace {

Json tool_call_json(const ToolCallResult& call) {
  Json c = Json::object();
  c["id"] = call.id;
  c["type"] = "function";
  c["function"] = Json{{"name", call.name}, {"arguments", call.arguments}};
  return c;
}

Json header(const ResponseMeta& meta, const char* object) {
  Json r = Json::object();
  r["id"] = meta.id;
  r["object"] = object;
  r["created"] = meta.created;
  r["model"] = meta.model;
  return r;
}

}  // namespace

Json chat_completion_response(const ResponseMeta& meta, const std::vector<ChatChoiceResult>& choices,
                              const UsageCounts& usage) {
  Json r = header(meta, "chat.completion");
  Json cs = Json::array();
  for (const ChatChoiceResult& c : choices) {
    Json message = Json::object();
    message["role"] = "assistant";
    message["content"] = c.content.empty() && !c.tool_calls.empty() ? Json(nullptr) : Json(c.content);
    if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      Json calls = Json::array();
      for (const ToolCallResult& call : c.tool_calls) calls.push_back(tool_call_json(call));
      message["tool_calls"] = std::move(calls);
    }
    Json choice = Json::object();
    choice["index"] = c.index;
    choice["message"] = std::move(message);
    choice["logprobs"] = c.logprobs;
    choice["finish_reason"] = c.finish_reason;
    cs.push_back(std::move(choice));
  }
  r["choices"] = std::move(cs);
  r["usage"] = openai_usage(usage);
  return r;
}

Json completion_response(const ResponseMeta& meta, const std::vector<CompletionChoiceResult>& choices,
                         const UsageCounts& usage) {
  Json r = header(meta, "text_completion");
  Json cs = Json::array();
  for (const CompletionChoiceResult& c : choices) {
    Json choice = Json::object();
    choice["index"] = c.index;
    choice["text"] = c.text;
    choice["logprobs"] = c.logprobs;
    choice["finish_reason"] = c.finish_reason;
    cs.push_back(std::move(choice));
  }
  r["choices"] = std::move(cs);
  r["usage"] = openai_usage(usage);
  return r;
}

Json chat_chunk(const ResponseMeta& meta, int32_t index, Json delta, const std::optional<std::string>& finish_reason,
                Json logprobs, bool usage_field) {
  Json r = header(meta, "chat.completion.chunk");
  Json choice = Json::object();
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason ? Json(*finish_reason) : Json(nullptr);
  r["choices"] = Json::array({std::move(choice)});
  if (usage_field) r["usage"] = nullptr;
  return r;
}

Json completion_chunk(const ResponseMeta& meta, int32_t index, const std::string& text,
                      const std::optional<std::string>& finish_reason, Json logprobs, bool usage_field) {
  Json r = header(meta, "text_completion");
  Json choice = Json::object();
  choice["index"] = index;
  choice["text"] = text;
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason ? Json(*finish_reason) : Json(nullptr);
  r["choices"] = Json::array({std::move(choice)});
  if (usage_field) r["usage"] = nullptr;
  return r;
}

Json usage_chunk(const ResponseMeta& meta, const char* object, const UsageCounts& usage) {
  Json r = header(meta, object);
  r["choices"] = Json::array();
  r["usage"] = openai_usage(usage);
  return r;
}

std::vector<Json> ChatDeltaBuilder::deltas(const std::vector<OutputPiece>& pieces) {
  std::vector<Json> out;
  for (const OutputPiece& piece : pieces) {
    Json delta = Json::object();
    if (!role_sent_) {
      delta["role"] = "assistant";
      role_sent_ = true;
    }
    switch (piece.kind) {
      case OutputPiece::Kind::Reasoning:
        delta["reasoning_content"] = piece.text;
        out.push_back(std::move(delta));
        break;
      case OutputPiece::Kind::Content:
        delta["content"] = piece.text;
        out.push_back(std::move(delta));
        break;
      case OutputPiece::Kind::ToolCall: {
        if (!parallel_tool_calls && n_tool_calls_ >= 1) {
          if (delta.contains("role")) out.push_back(std::move(delta));
          break;
        }
        // As OpenAI streams them: the call's id and name first, then its arguments.
        Json head = Json::object();
        head["index"] = n_tool_calls_;
        head["id"] = random_id("call_");
        head["type"] = "function";
        head["function"] = Json{{"name", piece.call.name}, {"arguments", ""}};
        delta["tool_calls"] = Json::array({std::move(head)});
        out.push_back(std::move(delta));
        Json args = Json::object();
        args["index"] = n_tool_calls_;
        args["function"] = Json{{"arguments", piece.call.arguments}};
        out.push_back(Json{{"tool_calls", Json::array({std::move(args)})}});
        ++n_tool_calls_;
        break;
      }
    }
  }
  return out;
}

std::optional<Json> ChatDeltaBuilder::role_delta_if_unsent() {
  if (role_sent_) return std::nullopt;
  role_sent_ = true;
  return Json{{"role", "assistant"}, {"content", ""}};
}

void append_pieces(ChatChoiceResult& choice, const std::vector<OutputPiece>& pieces, bool parallel_tool_calls) {
  for (const OutputPiece& piece : pieces) {
    switch (piece.kind) {
      case OutputPiece::Kind::Reasoning: choice.reasoning += piece.text; break;
      case OutputPiece::Kind::Content: choice.content += piece.text; break;
      case OutputPiece::Kind::ToolCall:
        if (parallel_tool_calls || choice.tool_calls.empty())
          choice.tool_calls.push_back({.id = random_id("call_"), .name = piece.call.name, .arguments = piece.call.arguments});
        break;
    }
  }
}

std::string chat_finish_reason(const std::string& engine_reason, int n_tool_calls) {
  // A reply that holds a complete call is a tool call even if max_tokens cut what followed it
  // (vLLM does the same): clients run the calls when finish_reason says so.
  if ((engine_reason == "stop" || engine_reason == "length") && n_tool_calls > 0) return "tool_calls";
  return engine_reason;
}

std::string sse_data(const Json& value) { return "data: " + dump_json(value) + "\n\n"; }

std::string sse_event(const std::string& name, const Json& value) {
  return "event: " + name + "\ndata: " + dump_json(value) + "\n\n";
}

}  // namespace spill::server
