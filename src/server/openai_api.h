// The OpenAI API: parse and validate /v1/chat/completions and /v1/completions bodies into
// API-independent requests, and format responses, stream chunks and errors exactly in OpenAI's
// shapes (the official SDKs parse them). No HTTP and no engine here, so all of it is unit-tested.
//
// Fields spill does not know are ignored; fields it knows but cannot honour (logit_bias,
// response_format json_schema, suffix, ...) are refused with a 400 that names them, so a client
// never silently gets something other than what it asked for.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/api_common.h"
#include "server/output_parser.h"

namespace spill {
class Tokenizer;
struct SampledToken;
}  // namespace spill

namespace spill::server {

enum class ToolChoiceMode { Auto, None, Required, Named };

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::Auto;
  std::string name;  // Named
};

// A conversation in the shape Hugging Face chat templates expect: OpenAI messages with string
// contents, tool-call arguments as objects (as transformers documents them), roles the
// templates know ("developer" becomes "system").
struct ChatInput {
  Json messages = Json::array();
  Json tools = nullptr;  // an array of {"type": "function", "function": {...}}, or null
  ToolChoice tool_choice;
  Json template_kwargs = Json::object();  // extra template variables (chat_template_kwargs)
  bool add_generation_prompt = true;
};

struct ChatCompletionRequest {
  std::string model;
  ChatInput chat;
  GenerationOptions gen;
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage
  bool parallel_tool_calls = true;  // false: only the first tool call is returned
};

// A prompt of the completions API: text to tokenize, or token ids as given.
struct CompletionPrompt {
  std::string text;
  std::vector<int32_t> tokens;
  bool is_tokens = false;
};

struct CompletionRequest {
  std::string model;
  std::vector<CompletionPrompt> prompts;  // one choice group per prompt (n choices each)
  GenerationOptions gen;
  bool echo = false;
  bool stream = false;
  bool include_usage = false;
};

// Throw ApiError (400) naming the field at fault.
ChatCompletionRequest parse_chat_completion_request(const Json& body);
CompletionRequest parse_completion_request(const Json& body);

// The chat fields shared with /tokenize and the Anthropic front end: messages, tools, tool_choice,
// chat_template_kwargs, add_generation_prompt.
ChatInput parse_chat_input(const Json& body);
// The text of an OpenAI message content: a string, or an array of text parts (joined by "\n").
// Non-text parts (images, audio, files) are refused: spill serves text-only models.
std::string message_content_text(const Json& content, const std::string& param);

// ---- responses ----
struct ResponseMeta {
  std::string id;       // chatcmpl-... / cmpl-...
  int64_t created = 0;  // unix seconds
  std::string model;
};

Json openai_usage(const UsageCounts& usage);

// Logprobs of generated tokens, in each endpoint's shape.
Json chat_logprob_entry(const Tokenizer& tokenizer, const SampledToken& token);  // {"token","logprob","bytes","top_logprobs"}
// Legacy completions logprobs: {"tokens","token_logprobs","top_logprobs","text_offset"};
// text_offset starts at first_offset.
Json completion_logprobs(const Tokenizer& tokenizer, const std::vector<SampledToken>& tokens, int64_t first_offset);

struct ChatChoiceResult {
  int32_t index = 0;
  std::string content;
  std::string reasoning;
  std::vector<ToolCallResult> tool_calls;
  std::string finish_reason = "stop";
  Json logprobs = nullptr;  // {"content": [...]} when asked
};

Json chat_completion_response(const ResponseMeta& meta, const std::vector<ChatChoiceResult>& choices,
                              const UsageCounts& usage);

struct CompletionChoiceResult {
  int32_t index = 0;
  std::string text;
  std::string finish_reason = "stop";
  Json logprobs = nullptr;
};

Json completion_response(const ResponseMeta& meta, const std::vector<CompletionChoiceResult>& choices,
                         const UsageCounts& usage);

// One chat.completion.chunk with one choice. finish_reason null unless given; "usage": null is
// included when the client asked for a usage chunk (OpenAI does the same).
Json chat_chunk(const ResponseMeta& meta, int32_t index, Json delta, const std::optional<std::string>& finish_reason,
                Json logprobs, bool usage_field);
Json completion_chunk(const ResponseMeta& meta, int32_t index, const std::string& text,
                      const std::optional<std::string>& finish_reason, Json logprobs, bool usage_field);
// The final usage chunk: empty choices. object is "chat.completion.chunk" or "text_completion".
Json usage_chunk(const ResponseMeta& meta, const char* object, const UsageCounts& usage);

// Turns parsed output into chat deltas, one choice's worth, keeping the tool-call numbering
// across calls. The first delta of a choice carries "role": "assistant".
class ChatDeltaBuilder {
 public:
  // tool_call_id() makes each call's id ("call_" + random).
  std::vector<Json> deltas(const std::vector<OutputPiece>& pieces);
  // The role delta, if nothing was sent yet (a stream that ends before any text).
  std::optional<Json> role_delta_if_unsent();
  int n_tool_calls() const { return n_tool_calls_; }
  bool parallel_tool_calls = true;

 private:
  bool role_sent_ = false;
  int n_tool_calls_ = 0;
};

// Collects parsed output of one choice for a non-streaming response.
void append_pieces(ChatChoiceResult& choice, const std::vector<OutputPiece>& pieces, bool parallel_tool_calls);

// finish_reason from the engine's reason ("stop", "length"): tool_calls whenever the reply holds
// a parsed call.
std::string chat_finish_reason(const std::string& engine_reason, int n_tool_calls);

// "data: <json>\n\n"
std::string sse_data(const Json& value);
// "event: <name>\ndata: <json>\n\n" (Anthropic)
std::string sse_event(const std::string& name, const Json& value);

}  // namespace spill::server
