// A model's chat template: messages (+ tools) -> the prompt text, byte for byte what transformers'
// tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False,
// **extra_kwargs) returns for the same model directory.
//
// Where the template comes from (transformers v5's loading order):
//   1. <dir>/chat_template.jinja (the "default" template) and <dir>/additional_chat_templates/
//      <name>.jinja, which transformers v5 writes; when any exists they replace 2.;
//   2. "chat_template" in <dir>/tokenizer_config.json: a string, or a list of {name, template};
//   3. "chat_template" in <dir>/chat_template.json (older processor checkpoints).
// With several named templates, "tool_use" renders requests that carry tools (when the model has
// one) and "default" everything else, as get_chat_template() picks them.
//
// What the template sees (render_jinja_template): messages, tools (None without tools),
// documents (None), add_generation_prompt, the model's named special tokens (bos_token,
// eos_token, unk_token, sep_token, pad_token, cls_token, mask_token: those that are set, from
// tokenizer_config.json or special_tokens_map.json, strings or {"content": ...}), then the
// request's extra kwargs (e.g. enable_thinking), which override special tokens. Messages are passed
// as given: no OpenAI-to-HF conversion happens here.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "text/jinja.h"

namespace spill {

class ChatTemplate {
 public:
  // Reads the template(s) and special tokens of a Hugging Face model directory. A directory
  // without any template loads fine (has_template() is false; render() then throws); a template
  // that does not parse throws spill::Error naming the file and line.
  static ChatTemplate from_model_dir(const std::string& dir);

  // Templates by name ("default", "tool_use", ...) and the special tokens passed to them
  // ({"bos_token": "<s>", ...}). `origin` names the source in error messages.
  static ChatTemplate from_templates(const std::map<std::string, std::string>& templates,
                                     const nlohmann::ordered_json& special_tokens, const std::string& origin);

  bool has_template() const { return !templates_.empty(); }

  // messages: array of message objects; tools: null or an array of
  // {"type": "function", "function": {name, description, parameters}}; extra_kwargs: null or an
  // object of further template variables. Throws spill::Error when the model has no template,
  // when the template raises (raise_exception's message verbatim) or fails
  // ("<template>:<line>: TypeError: ...").
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs,
                     const jinja::RenderOptions& options = {}) const;

  // Same, and which bytes of the prompt came from the client (message content, tools, extra
  // kwargs): the spans the tokenizer must not read special tokens in (see jinja::InputMarking).
  jinja::RenderedText render_marked(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                    bool add_generation_prompt, const nlohmann::ordered_json& extra_kwargs,
                                    const jinja::RenderOptions& options = {}) const;

  // The special tokens the template sees, e.g. {"bos_token": "<s>", "eos_token": "</s>"}.
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  std::string origin_;
  std::map<std::string, jinja::Template> templates_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace spill
