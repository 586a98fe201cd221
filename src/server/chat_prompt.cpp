#include "server/chat_prompt.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json_limits.h"
#include "core/strings.h"
#include "engine/model_bundle.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace spill::server {

// Qwen2.5's layout: ChatML turns, tools listed in the system turn, calls as <tool_call> JSON,
// tool results as <tool_response> inside a user turn.
const char* const kFallbackChatTemplate = R"TEMPLATE({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)TEMPLATE";

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// All template text a model directory holds, only to see which conventions the templates use.
std::string template_sources(const std::string& dir) {
  std::string all;
  const fs::path root(dir);
  std::error_code ec;
  if (fs::exists(root / "chat_template.jinja", ec)) all += read_file(root / "chat_template.jinja");
  if (fs::is_directory(root / "additional_chat_templates", ec))
    for (const auto& entry : fs::directory_iterator(root / "additional_chat_templates", ec))
      if (entry.path().extension() == ".jinja") all += read_file(entry.path());
  for (const char* name : {"tokenizer_config.json", "chat_template.json"}) {
    if (!fs::exists(root / name, ec)) continue;
    const std::optional<nlohmann::json> parsed = try_parse_json<nlohmann::json>(read_file(root / name));
    if (!parsed || !parsed->is_object() || !parsed->contains("chat_template")) continue;
    const nlohmann::json& config = *parsed;
    const nlohmann::json& t = config["chat_template"];
    if (t.is_string()) all += t.get<std::string>();
    if (t.is_array())
      for (const nlohmann::json& named : t)
        if (named.is_object() && named.contains("template") && named["template"].is_string())
          all += named["template"].get<std::string>();
  }
  return all;
}

bool ends_with_open_think(const std::string& prompt) {
  size_t end = prompt.size();
  while (end > 0 && is_json_space(prompt[end - 1])) --end;
  static constexpr std::string_view kThink = "<think>";
  return end >= kThink.size() && std::string_view(prompt).substr(end - kThink.size(), kThink.size()) == kThink;
}

// Harmony: what follows the prompt's last <|start|> when that message is unfinished (the
// generation prompt "<|start|>assistant", or one that also opens a channel); "" when the prompt
// ended between messages.
std::string harmony_prompt_tail(std::string_view prompt) {
  static constexpr std::string_view kStart = "<|start|>";
  const size_t start = prompt.rfind(kStart);
  if (start == std::string_view::npos) return {};
  const std::string_view tail = prompt.substr(start + kStart.size());
  for (std::string_view end : {"<|end|>", "<|call|>", "<|return|>"})
    if (tail.find(end) != std::string_view::npos) return {};
  return std::string(tail);
}

// GLM: the parameters each tool declares as strings (their values are written unquoted, so only
// the schema tells "42" the string from 42 the number).
std::map<std::string, std::set<std::string>, std::less<>> string_parameters(const Json& tools) {
  std::map<std::string, std::set<std::string>, std::less<>> out;
  if (!tools.is_array()) return out;
  for (const Json& tool : tools) {
    const Json* fn = tool.is_object() && tool.contains("function") ? &tool["function"] : nullptr;
    if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) continue;
    const Json* params = fn->contains("parameters") ? &(*fn)["parameters"] : nullptr;
    if (!params || !params->is_object() || !params->contains("properties") || !(*params)["properties"].is_object()) continue;
    std::set<std::string>& names = out[(*fn)["name"].get<std::string>()];
    for (const auto& [key, schema] : (*params)["properties"].items()) {
      if (!schema.is_object() || !schema.contains("type")) continue;
      const Json& type = schema["type"];
      bool is_string = type == "string";
      if (type.is_array()) {  // ["string", "null"]: a string when present
        is_string = std::find(type.begin(), type.end(), Json("string")) != type.end();
        for (const Json& t : type) is_string = is_string && (t == "string" || t == "null");
      }
      if (is_string) names.insert(key);
    }
  }
  return out;
}

bool has_tool_calls(const Json& m) {
  return m.value("role", "") == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array() &&
         !m["tool_calls"].empty();
}

// The request's history in the fields the format's templates read (see chat_prompt.h).
Json adapt_history(const Json& messages, ToolCallFormat format) {
  const bool deepseek = format == ToolCallFormat::DeepSeekV3 || format == ToolCallFormat::DeepSeekV31;
  if (!deepseek && format != ToolCallFormat::Harmony) return messages;
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    Json m = messages[i];
    const bool calls = has_tool_calls(m);
    if (deepseek) {
      if (calls) {
        // DeepSeek's templates write `'...' + arguments`: they need the JSON text. And R1's renders
        // the calls only when content is none.
        for (Json& call : m["tool_calls"]) {
          Json& args = call["function"]["arguments"];
          if (!args.is_string()) args = args.dump();
        }
        if (m.contains("content") && m["content"].is_string() && m["content"].get_ref<const std::string&>().empty())
          m["content"] = nullptr;
      }
      out.push_back(std::move(m));
      continue;
    }
    // gpt-oss reads the analysis channel from `thinking`; with a tool call it refuses both
    // content and thinking (it renders the content as the analysis then).
    if (m.value("role", "") == "assistant" && m.contains("reasoning_content")) {
      Json reasoning = m["reasoning_content"];
      m.erase("reasoning_content");
      const bool has_content = m.contains("content") && m["content"].is_string() && !m["content"].get_ref<const std::string&>().empty();
      if (!(calls && has_content) && reasoning.is_string()) m["thinking"] = std::move(reasoning);
    }
    if (!calls || m["tool_calls"].size() == 1) {
      out.push_back(std::move(m));
      continue;
    }
    // Several calls: one assistant message each, followed by its result (the template renders a
    // message's first call only, and names a result after the call before it).
    size_t end = i + 1;
    while (end < messages.size() && messages[end].value("role", "") == "tool") ++end;
    std::vector<bool> used(end - i - 1, false);
    const Json all_calls = m["tool_calls"];
    for (size_t k = 0; k < all_calls.size(); ++k) {
      Json one = m;
      one["tool_calls"] = Json::array({all_calls[k]});
      if (k > 0) {
        one["content"] = "";
        one.erase("thinking");
      }
      out.push_back(std::move(one));
      const Json id = all_calls[k].contains("id") ? all_calls[k]["id"] : Json();
      for (size_t j = i + 1; j < end; ++j) {
        if (used[j - i - 1] || id.is_null() || !messages[j].contains("tool_call_id") || messages[j]["tool_call_id"] != id) continue;
        out.push_back(messages[j]);
        used[j - i - 1] = true;
      }
    }
    for (size_t j = i + 1; j < end; ++j)
      if (!used[j - i - 1]) out.push_back(messages[j]);
    i = end - 1;
  }
  return out;
}

}  // namespace

ToolCallFormat detect_tool_call_format(std::string_view src) {
  auto has = [src](std::string_view s) { return src.find(s) != std::string_view::npos; };
  if (has("<|channel|>") && has("<|message|>")) return ToolCallFormat::Harmony;
  if (has("<|tool_calls_section_begin|>")) return ToolCallFormat::KimiK2;
  // V3 and R1 write "function<｜tool▁sep｜>NAME" and the arguments in a ```json fence; V3.1 "NAME<｜tool▁sep｜>ARGS".
  if (has("<｜tool▁call▁begin｜>")) return has("```json") ? ToolCallFormat::DeepSeekV3 : ToolCallFormat::DeepSeekV31;
  if (has("<arg_key>")) return ToolCallFormat::Glm45;
  return ToolCallFormat::Hermes;
}

void ChatPrompt::detect(const std::string& sources) {
  format_ = detect_tool_call_format(sources);
  thinks_ = sources.find("<think>") != std::string::npos || sources.find("</think>") != std::string::npos ||
            format_ == ToolCallFormat::Harmony;
  hermes_tools_ = format_ == ToolCallFormat::Hermes && sources.find("<tool_call>") != std::string::npos;
}

ChatPrompt ChatPrompt::load(const std::string& model_dir, const Tokenizer* tokenizer) {
  ChatPrompt p;
  ChatTemplate t = open_chat_template(model_dir);
  if (t.has_template()) {
    p.template_ = std::make_shared<const ChatTemplate>(std::move(t));
    p.detect(is_gguf_model_path(model_dir) ? chat_template_sources(model_dir) : template_sources(model_dir));
  } else {
    p.template_ = std::make_shared<const ChatTemplate>(ChatTemplate::from_templates(
        {{"default", kFallbackChatTemplate}}, t.special_tokens(), "spill's ChatML fallback template"));
    p.fallback_ = true;
    p.detect(kFallbackChatTemplate);
  }
  // A vocabulary with a </think> token is a thinking model even if its template never says so.
  if (tokenizer && tokenizer->token_id("</think>")) p.thinks_ = true;
  if (tokenizer) {
    // Markers that are special tokens vanish from the reply unless it is decoded with them.
    const OutputParser::Markers m = OutputParser::markers(p.format_);
    std::vector<std::string_view> names = {m.section_begin, m.section_end, m.call_begin, m.call_end};
    if (p.format_ == ToolCallFormat::Harmony) names = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>"};
    else if (p.thinks_) names.insert(names.end(), {"<think>", "</think>"});
    for (std::string_view name : names) {
      if (name.empty()) continue;
      const std::optional<int32_t> id = tokenizer->token_id(std::string(name));
      if (id && tokenizer->is_special(*id)) p.keep_special_tokens_ = true;
    }
  }
  return p;
}

ChatPrompt ChatPrompt::from_source(const std::string& source, const nlohmann::ordered_json& special_tokens) {
  ChatPrompt p;
  const nlohmann::ordered_json tokens = special_tokens.is_object() ? special_tokens : nlohmann::ordered_json::object();
  p.fallback_ = source.empty();
  const std::string& text = p.fallback_ ? std::string(kFallbackChatTemplate) : source;
  p.template_ = std::make_shared<const ChatTemplate>(ChatTemplate::from_templates({{"default", text}}, tokens, "template"));
  p.detect(text);
  return p;
}

RenderedPrompt ChatPrompt::render(const ChatInput& chat, const std::string& assistant_prefill) const {
  RenderedPrompt out;
  // tool_choice "none": the model is not shown the tools, so it does not call them (a model
  // that sees tool definitions may write calls whatever the request says).
  const bool offer_tools = chat.tool_choice.mode != ToolChoiceMode::None;
  const Json no_tools = nullptr;
  try {
    const Json messages = adapt_history(chat.messages, format_);
    jinja::RenderedText rendered = template_->render_marked(messages, offer_tools ? chat.tools : no_tools,
                                                            chat.add_generation_prompt, chat.template_kwargs);
    out.text = std::move(rendered.text);
    out.input_spans = std::move(rendered.input);
  } catch (const spill::Error& e) {
    // raise_exception() in a template is how models refuse conversations they cannot render
    // ("Conversation roles must alternate user/assistant/..."): the client's request is at fault.
    throw ApiError{.status = 400, .message = fmt::format("the model's chat template refused the messages: {}", e.what()),
                   .param = "messages", .code = ""};
  }
  const bool has_tools = chat.tools.is_array() && !chat.tools.empty();
  out.parser.format = format_;
  out.parser.parse_reasoning = thinks_;
  out.parser.parse_tool_calls = has_tools && offer_tools;
  out.keep_special_tokens = keep_special_tokens_;
  if (format_ == ToolCallFormat::Harmony) {
    if (assistant_prefill.empty()) out.parser.harmony_prompt_tail = harmony_prompt_tail(out.text);
  } else {
    out.parser.starts_in_reasoning = thinks_ && assistant_prefill.empty() && ends_with_open_think(out.text);
  }
  if (format_ == ToolCallFormat::Glm45 && out.parser.parse_tool_calls) out.parser.string_parameters = string_parameters(chat.tools);

  // tool_choice "required" / a named function: start the reply inside a call, so the model can
  // only complete it. Only where the template teaches this format, and not inside reasoning.
  if (out.parser.parse_tool_calls && hermes_tools_ && !out.parser.starts_in_reasoning && assistant_prefill.empty() &&
      chat.add_generation_prompt) {
    if (chat.tool_choice.mode == ToolChoiceMode::Required) {
      out.forced_reply = "<tool_call>\n";
    } else if (chat.tool_choice.mode == ToolChoiceMode::Named) {
      out.forced_reply = "<tool_call>\n{\"name\": " + Json(chat.tool_choice.name).dump() + ", \"arguments\": ";
    }
  }
  // The forced start may quote the client's function name; <tool_call> is not a special token
  // (only special tokens are kept out of input), so marking it all is harmless.
  add_span(out.input_spans, out.text.size(), out.text.size() + out.forced_reply.size() + assistant_prefill.size());
  out.text += out.forced_reply;
  out.text += assistant_prefill;
  if (fallback_) out.stop_strings = {"<|im_end|>", "<|im_start|>"};
  return out;
}

}  // namespace spill::server
