// Turns a conversation into the prompt text the model was trained on (its own chat template,
// rendered by spill's Jinja interpreter) and decides how its output is to be read: whether the
// model thinks in <think>...</think>, which tool-call format it writes (ToolCallFormat: read
// once from the template when the model is loaded), and, for tool_choice "required" or a named
// function, the start of the call the reply is forced to continue.
//
// The history goes into the template in the fields that template reads (as vLLM passes them):
// tool-call arguments as an object, or as JSON text for DeepSeek's templates (which concatenate
// them); reasoning as reasoning_content, or as `thinking` for gpt-oss; one tool call per
// assistant message for gpt-oss (its template renders only the first), each followed by its result.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "server/openai_api.h"
#include "text/text_span.h"
#include "server/output_parser.h"

namespace spill {
class ChatTemplate;
class Tokenizer;
}  // namespace spill

namespace spill::server {

struct RenderedPrompt {
  std::string text;             // the prompt, including any forced start of the reply
  // Byte ranges of text the client wrote (message content, tools, the assistant prefill): the
  // tokenizer reads no special tokens there (Tokenizer::encode's `untrusted`).
  std::vector<TextSpan> input_spans;
  OutputParserOptions parser;   // how to split the reply
  std::string forced_reply;     // text appended to the prompt that the parser must see as reply
  // End-of-turn markers the reply must stop at besides the model's EOS ids (the fallback
  // template's <|im_end|>, which a model without a chat template does not know as EOS).
  std::vector<std::string> stop_strings;
  // The format's markers are special tokens of the vocabulary (gpt-oss's <|channel|>, Kimi's
  // <|tool_call_begin|>, ...): the reply must be detokenized with them, or the parser cannot see them.
  bool keep_special_tokens = false;
};

class ChatPrompt {
 public:
  // Reads the model's template (see text/chat_template.h for where it is looked for). A model
  // without one gets ChatML with Hermes-style tools (what Qwen models use). `tokenizer` (may be
  // null) tells whether the vocabulary has a <think> token. Throws spill::Error naming the file
  // when the template does not parse.
  static ChatPrompt load(const std::string& model_dir, const Tokenizer* tokenizer);
  // From template source, for tests. An empty source means "no template" (the fallback).
  static ChatPrompt from_source(const std::string& source, const nlohmann::ordered_json& special_tokens = {});

  // Throws ApiError (400) when the template refuses the conversation (raise_exception, e.g.
  // "roles must alternate"), with the template's own message.
  RenderedPrompt render(const ChatInput& chat, const std::string& assistant_prefill = "") const;

  bool thinks() const { return thinks_; }            // the template knows <think>
  bool hermes_tools() const { return hermes_tools_; }  // the template asks for <tool_call> JSON blocks
  ToolCallFormat tool_call_format() const { return format_; }
  bool is_fallback() const { return fallback_; }

 private:
  void detect(const std::string& sources);

  std::shared_ptr<const ChatTemplate> template_;
  bool thinks_ = false;
  bool hermes_tools_ = false;
  bool fallback_ = false;
  bool keep_special_tokens_ = false;
  ToolCallFormat format_ = ToolCallFormat::Hermes;
};

// The tool-call format a chat template's source teaches (Hermes when it names none spill knows).
ToolCallFormat detect_tool_call_format(std::string_view template_source);

// ChatML with a Hermes/Qwen tools section: the template used when a model brings none.
extern const char* const kFallbackChatTemplate;

}  // namespace spill::server
