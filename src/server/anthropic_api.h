// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens), for Claude Code and
// other Anthropic-SDK clients pointed at spill with ANTHROPIC_BASE_URL.
//
// A Messages request is converted to the OpenAI-shaped conversation the chat templates take
// (ChatInput): the system prompt becomes a system message, tool_use blocks become assistant
// tool_calls, tool_result blocks become tool messages, thinking blocks become reasoning_content.
// Output goes through the same OutputParser as the OpenAI API and comes back as thinking, text and
// tool_use blocks. No HTTP and no engine here.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "server/api_common.h"
#include "server/openai_api.h"
#include "server/output_parser.h"

namespace spill::server {

struct MessagesRequest {
  std::string model;  // as the client named it; echoed back (any name maps to the loaded model)
  ChatInput chat;
  // A final assistant message is a prefill: the reply continues it (and does not repeat it).
  std::string assistant_prefill;
  GenerationOptions gen;
  bool stream = false;
  bool single_tool_call = false;  // tool_choice.disable_parallel_tool_use
};

// POST /v1/messages. Throws ApiError (400) naming the field at fault.
MessagesRequest parse_messages_request(const Json& body);
// POST /v1/messages/count_tokens: the same fields, max_tokens not needed.
MessagesRequest parse_count_tokens_request(const Json& body);

// Anthropic's stop_reason: end_turn, max_tokens, stop_sequence or tool_use.
std::string anthropic_stop_reason(const std::string& engine_reason, bool stopped_by_string, int n_tool_calls);

// {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"}:
// input_tokens counts only prompt tokens not read from the cache, as Anthropic's does.
Json anthropic_usage(const UsageCounts& usage);

// Builds the content blocks of a non-streaming reply.
class MessageContentBuilder {
 public:
  void add(const std::vector<OutputPiece>& pieces);
  int n_tool_calls() const { return n_tool_calls_; }
  bool single_tool_call = false;  // tool_choice.disable_parallel_tool_use
  Json content = Json::array();

 private:
  int n_tool_calls_ = 0;
};

Json messages_response(const std::string& id, const std::string& model, Json content, const std::string& stop_reason,
                       const std::optional<std::string>& stop_sequence, const UsageCounts& usage);

// Turns parsed output into the Messages stream's events (SSE text), opening and closing content
// blocks as the kind of output changes.
class MessagesStreamWriter {
 public:
  MessagesStreamWriter(std::string id, std::string model) : id_(std::move(id)), model_(std::move(model)) {}

  // message_start (usage so far: the prompt, nothing cached known yet), then a ping.
  std::string start(int64_t prompt_tokens);
  std::string add(const std::vector<OutputPiece>& pieces);
  // Closes the open block, then message_delta (stop reason, final usage) and message_stop.
  std::string finish(const std::string& stop_reason, const std::optional<std::string>& stop_sequence,
                     const UsageCounts& usage);
  static std::string ping();
  static std::string error(const ApiError& error);

  int n_tool_calls() const { return n_tool_calls_; }
  bool single_tool_call = false;

 private:
  enum class Block { None, Thinking, Text, ToolUse };
  std::string open(Block kind, const Json& content_block);
  std::string close();

  std::string id_, model_;
  Block open_ = Block::None;
  int index_ = -1;
  int n_tool_calls_ = 0;
};

}  // namespace spill::server
