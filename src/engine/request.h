// A generation request as a client thread submits it, and what comes back on its stream.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace spill {

struct GenerationRequest {
  // Token ids of the prompt. Tokenize (and apply the chat template) on the submitting thread:
  // the engine thread does no work proportional to prompt length beyond hashing it once.
  std::vector<int32_t> prompt{};
  SamplingParams sampling{};
  std::optional<int64_t> max_tokens{};    // none: until a stop condition or the context limit
  std::vector<std::string> stop{};        // stop strings, matched on the detokenized text
  std::vector<int32_t> stop_token_ids{};  // end the request like EOS does (even with ignore_eos)
  bool ignore_eos = false;                // keep going past the model's EOS ids
  bool skip_special_tokens = true;        // leave special tokens out of the text (ids still reported)
  // Requests share cached KV blocks only when their salts are equal; give tenants who must not
  // learn about each other's prompts (through timing) different salts.
  uint64_t cache_salt = 0;
};

enum class FinishReason : uint8_t {
  Stop,       // EOS, a stop token or a stop string
  Length,     // max_tokens, or the context limit
  Cancelled,  // the client cancelled, or the engine shut down
  Error,      // the request failed; RequestFinish::error says why
};
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "cancelled", "error"

struct RequestTimings {
  double queue_ms = 0;  // submit -> first scheduled in a step
  double ttft_ms = -1;  // submit -> first token sampled; -1 when none was
  double total_ms = 0;  // submit -> finished
};

struct RequestFinish {
  FinishReason reason = FinishReason::Stop;
  std::string error;                       // reason == Error (or a Cancelled shutdown): what happened
  std::optional<std::string> stop_string;  // the stop string that ended it (not in the text)
  std::optional<int32_t> stop_token;       // the EOS / stop token that ended it (in token_ids)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // tokens sampled, including a final stop token
  int64_t cached_tokens = 0;      // prompt tokens found in the prefix cache at first admission
  int32_t preemptions = 0;        // times the request was preempted and recomputed
  RequestTimings timings;
};

// Output since the previous read, merged; the last read carries finish.
struct RequestOutput {
  std::string text;                    // newly released text
  std::vector<int32_t> token_ids;      // newly sampled tokens
  std::vector<SampledToken> logprobs;  // one per token in token_ids, when sampling.logprobs
  std::optional<RequestFinish> finish;

  bool empty() const { return text.empty() && token_ids.empty() && !finish; }
  void append(RequestOutput&& more);
};

namespace detail {
// Shared by the engine (writer) and one RequestStream (reader).
struct RequestChannel {
  uint64_t id = 0;
  std::mutex mutex;
  std::condition_variable changed;
  RequestOutput pending;      // written by the engine, taken by the reader
  bool finish_taken = false;  // the reader has received the finish
  // Tells the engine (if it still runs) to cancel this request. Set once, before the channel is
  // shared; holds the engine's inbox weakly, so a stream may outlive its engine.
  std::function<void()> request_cancel;
};
}  // namespace detail

// The client's end of one request. Copies share the request; all methods are thread-safe.
// A default-constructed stream is empty (false): assign one from Engine::submit before use.
class RequestStream {
 public:
  RequestStream() = default;
  explicit RequestStream(std::shared_ptr<detail::RequestChannel> channel) : channel_(std::move(channel)) {}
  explicit operator bool() const { return channel_ != nullptr; }

  uint64_t id() const { return channel_->id; }

  // Blocks until there is new output, and returns all of it merged. The read that returns the
  // finish is the last: after it, finished() is true and next() throws spill::Error.
  RequestOutput next();
  // As next(), but returns std::nullopt when nothing arrives within timeout, so a server thread
  // can check on its client (and cancel) while it waits.
  std::optional<RequestOutput> next_for(std::chrono::milliseconds timeout);
  // Reads to the end and returns everything merged (finish set).
  RequestOutput collect();
  bool finished() const;

  // Asks the engine to stop the request. Idempotent; a no-op once it has finished. The stream
  // still ends with a finish (reason Cancelled, unless it had already ended otherwise); its
  // KV blocks are released before the engine plans its next step.
  void cancel();

 private:
  std::shared_ptr<detail::RequestChannel> channel_;
};

}  // namespace spill
