#include "server/chat_prompt.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
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
    const nlohmann::json config = nlohmann::json::parse(read_file(root / name), nullptr, false);
    if (!config.is_object() || !config.contains("chat_template")) continue;
    const nlohmann::json& t = config["chat_template"];
    if (t.is_string()) all += t.get<std::string>();
    if (t.is_array())
      for (const nlohmann::json& named : t)
        if (named.is_object() && named.contains("template") && named["template"].is_string())
          all += named["template"].get<std::string>();
  }
  return all;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

bool ends_with_open_think(const std::string& prompt) {
  size_t end = prompt.size();
  while (end > 0 && is_space(prompt[end - 1])) --end;
  static constexpr std::string_view kThink = "<think>";
  return end >= kThink.size() && std::string_view(prompt).substr(end - kThink.size(), kThink.size()) == kThink;
}

}  // namespace

void ChatPrompt::detect(const std::string& sources) {
  thinks_ = sources.find("<think>") != std::string::npos || sources.find("</think>") != std::string::npos;
  hermes_tools_ = sources.find("<tool_call>") != std::string::npos;
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
    out.text = template_->render(chat.messages, offer_tools ? chat.tools : no_tools, chat.add_generation_prompt,
                                 chat.template_kwargs);
  } catch (const spill::Error& e) {
    // raise_exception() in a template is how models refuse conversations they cannot render
    // ("Conversation roles must alternate user/assistant/..."): the client's request is at fault.
    throw ApiError{.status = 400, .message = fmt::format("the model's chat template refused the messages: {}", e.what()),
                   .param = "messages", .code = ""};
  }
  const bool has_tools = chat.tools.is_array() && !chat.tools.empty();
  out.parser.parse_reasoning = thinks_;
  out.parser.starts_in_reasoning = thinks_ && assistant_prefill.empty() && ends_with_open_think(out.text);
  out.parser.parse_tool_calls = has_tools && offer_tools;

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
  out.text += out.forced_reply;
  out.text += assistant_prefill;
  if (fallback_) out.stop_strings = {"<|im_end|>", "<|im_start|>"};
  return out;
}

}  // namespace spill::server
