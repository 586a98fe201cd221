// The OpenAI Responses API (POST /v1/responses, GET/DELETE /v1/responses/{id}), which Codex CLI
// speaks exclusively and other agents can use: parse a request's input items into the
// conversation the chat templates take, and format output items, the response object and the
// stream's typed events exactly in OpenAI's shapes. No HTTP and no engine here.
//
// Input items become chat messages: `instructions` a leading system message; messages (roles
// user, assistant, system, developer) with string or input_text/output_text parts; consecutive
// function_call items one assistant message with tool_calls; function_call_output items tool
// messages; a reasoning item the reasoning_content of the assistant turn that follows it.
// `previous_response_id` prepends the stored conversation of that response (its input and its
// output, without its instructions, as OpenAI documents).
#pragma once
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/api_common.h"
#include "server/openai_api.h"
#include "server/output_parser.h"

namespace spill::server {

struct ResponsesRequest {
  std::string model;
  std::string instructions;
  ChatInput chat;             // instructions + previous conversation + input, as chat messages
  Json input_messages = Json::array();  // this request's input alone, as chat messages (for the store)
  GenerationOptions gen;      // max_output_tokens -> max_tokens
  bool stream = false;
  bool store = true;
  bool parallel_tool_calls = true;
  std::optional<std::string> previous_response_id;
  Json echo = Json::object();  // request fields the response object repeats (tools, tool_choice, ...)
};

// Reads the request; `previous` is the stored conversation of previous_response_id (the caller
// looks it up, so parsing stays free of the store). Throws ApiError (400) naming the field.
ResponsesRequest parse_responses_request(const Json& body);
// Prepends a stored conversation (chat messages) after the instructions.
void prepend_conversation(ResponsesRequest& r, const Json& previous_messages);

// Builds the output items from parsed model output, and the stream events that announce them.
// The same builder serves streaming (events are written) and non-streaming responses (events are
// dropped; output() is the body's "output").
class ResponseOutputBuilder {
 public:
  explicit ResponseOutputBuilder(std::string response_id) : response_id_(std::move(response_id)) {}

  // Events for new pieces, opening and closing output items as the kind of output changes.
  std::string add(const std::vector<OutputPiece>& pieces);
  // Closes the open item; returns its events.
  std::string close();

  const Json& output() const { return output_; }
  int n_tool_calls() const { return n_tool_calls_; }
  const std::string& reasoning_text() const { return reasoning_; }
  bool parallel_tool_calls = true;

  // One event: {"type": type, "sequence_number": n, ...fields}, as SSE.
  std::string event(const std::string& type, Json fields);

  // The assistant turn as chat messages (for the store): reasoning, text and tool calls.
  Json as_chat_messages() const;

 private:
  enum class Open { None, Reasoning, Message };
  std::string open_item(Open kind);

  std::string response_id_;
  Json output_ = Json::array();
  Open open_ = Open::None;
  std::string open_text_;  // text of the open item so far
  std::string reasoning_;  // all reasoning, for the usage count
  int n_tool_calls_ = 0;
  int64_t sequence_ = 0;
};

struct ResponseStatus {
  std::string status = "completed";  // completed, incomplete, in_progress, failed
  std::optional<std::string> incomplete_reason;  // max_output_tokens
};

// The response object. usage null while in progress.
Json response_object(const std::string& id, int64_t created_at, const std::string& model, const ResponsesRequest& r,
                     const Json& output, const ResponseStatus& status, const std::optional<UsageCounts>& usage,
                     int64_t reasoning_tokens);

// Completed responses kept for previous_response_id and GET /v1/responses/{id}: the newest
// `capacity` responses, and at most `max_bytes` of conversation text; older ones are forgotten
// (a request naming one gets 404). Thread-safe.
class ResponseStore {
 public:
  ResponseStore(size_t capacity, size_t max_bytes) : capacity_(capacity), max_bytes_(max_bytes) {}

  struct Entry {
    Json response;       // the response object, as returned
    Json conversation;   // chat messages: previous conversation + input + output
    size_t bytes = 0;
  };
  void put(const std::string& id, Entry entry);
  std::optional<Entry> get(const std::string& id) const;
  bool erase(const std::string& id);
  size_t size() const;

 private:
  void evict_locked();

  size_t capacity_, max_bytes_;
  size_t bytes_ = 0;
  mutable std::mutex mutex_;
  std::list<std::string> order_;  // oldest first
  std::unordered_map<std::string, std::pair<Entry, std::list<std::string>::iterator>> entries_;
};

}  // namespace spill::server
