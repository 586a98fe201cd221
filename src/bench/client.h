// A client for any OpenAI-compatible server (spill, vLLM, SGLang, llama-server): streaming chat
// completions timed chunk by chunk, /v1/models, /tokenize and /metrics. One ApiClient per thread
// (it holds one keep-alive connection); nothing is shared between them.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/stats.h"

namespace httplib {
class Client;
}

namespace spill::bench {

using Clock = std::chrono::steady_clock;

struct Endpoint {
  std::string url;      // http(s)://host:port, optionally ending in /v1
  std::string api_key;  // sent as Authorization: Bearer
  std::string model;    // the "model" field; empty: the first id of /v1/models
  double timeout_s = 3600;  // per request: a 256K prefill on a slow machine takes minutes
};

struct ServerInfo {
  std::string model_id;
  int64_t max_model_len = 0;  // 0 when the server does not say
  std::string kind;           // "spill", "vllm", "llama.cpp" or "unknown", from /metrics and /v1/models
};

struct ChatMessage {
  std::string role, content;
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  int64_t max_tokens = 128;
  bool ignore_eos = true;  // fixed output length (vLLM / spill / llama-server extension)
  double temperature = 0;
  std::optional<uint64_t> seed;
};

class ApiClient {
 public:
  explicit ApiClient(const Endpoint& endpoint);
  ~ApiClient();
  ApiClient(const ApiClient&) = delete;
  ApiClient& operator=(const ApiClient&) = delete;

  // GET /v1/models (required: a server that does not answer it is not OpenAI-compatible) and
  // GET /metrics (optional). Throws spill::Error naming the URL when the server cannot be reached.
  ServerInfo server_info();
  // GET /metrics text; nullopt when the server has none (non-200 or unreachable).
  std::optional<std::string> metrics_text();
  // POST /tokenize {"prompt": text} (spill, vLLM) or {"content": text} (llama-server), without
  // special tokens; the number of tokens. Throws spill::Error when the server has no /tokenize.
  int64_t tokenize_count(const std::string& text);

  // Streams one chat completion, filling rec's times (seconds since run_start), usage and status;
  // the reply's content goes to *reply. Never throws for a failed request: rec.error says why.
  void chat_stream(const ChatRequest& request, Clock::time_point run_start, RequestRecord& rec, std::string* reply);

  const std::string& model() const { return model_; }
  void set_model(std::string model) { model_ = std::move(model); }

 private:
  Endpoint endpoint_;
  std::string prefix_;  // path prefix before /v1 (e.g. "/proxy"), usually empty
  std::string model_;
  std::unique_ptr<httplib::Client> http_;
};

// What a streamed reply said, folded from its server-sent events. Exposed for tests.
struct StreamState {
  std::string pending;  // bytes not yet forming a complete event
  bool done = false;    // [DONE] seen
  int64_t token_chunks = 0;
  std::string content;
  std::string finish_reason;
  std::string error;
  std::optional<int64_t> prompt_tokens, completion_tokens, cached_tokens;
};
// Feeds bytes of an SSE body; returns the number of token-bearing chunks completed by them
// (content, reasoning or tool-call deltas), so the caller can time each.
int64_t feed_sse(StreamState& state, std::string_view bytes);

}  // namespace spill::bench
