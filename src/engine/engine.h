// The engine: one thread that owns the model runner and all KV memory, and runs steps of
// continuously batched requests. Other threads submit requests and read their streams.
// The contract (threads, ownership, what a step guarantees) is written down in docs/ARCHITECTURE.md ("Engine contract").
//
//   Engine engine(EngineParts{...}, EngineConfig{...});
//   RequestStream s = engine.submit({.prompt = ids, .max_tokens = 64});
//   while (!s.finished()) { RequestOutput out = s.next(); ... }
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/error.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "formats/model_spec.h"
#include "model/runner.h"
#include "text/tokenizer.h"

namespace spill {

class Model;

// submit() refuses a request because the waiting queue is full: retry later (HTTP 503), as
// opposed to a plain spill::Error, which means the request itself is bad (HTTP 400).
class QueueFullError : public Error {
 public:
  using Error::Error;
};

// submit() refuses a request because the engine has stopped (its thread failed or it is shutting
// down): the server's fault, not the request's (HTTP 503).
class EngineStoppedError : public Error {
 public:
  using Error::Error;
};

struct EngineConfig {
  // Max running sequences and token budget per step; at most the runner's limits() (max_seqs,
  // max_batch_tokens), which open_engine builds the runner with.
  SchedulerParams scheduler{};
  int64_t max_waiting = 1024;   // requests queued but not running; submit() fails beyond
  // Longest sequence (prompt + output) a request may reach. 0: the runner's limit (by default the
  // model's max_position_embeddings, capped by what the KV pool holds). Larger than the pool or
  // than the runner's limit: refused.
  int64_t max_model_len = 0;
  bool prefix_caching = true;
  std::optional<uint64_t> seed{};  // seeds requests that bring none; none: random per engine
  // Called on the engine thread after every step (tests, debugging). Must be quick and must not
  // call back into the engine.
  std::function<void(const StepTrace&)> on_step{};
  // Passed to every forward (routing profiles, debugging); called on the engine thread. A step's
  // trace (on_step) says which of its tokens were decodes.
  ForwardObserver* observer = nullptr;
};

// What the engine runs on. It takes ownership; the runner decides the KV pool (block size and
// number of blocks, from its kv_config()) and the limits of a step (its limits()).
struct EngineParts {
  std::unique_ptr<const Model> model;  // the weights the runner reads (may be null if it owns them)
  std::unique_ptr<ModelRunner> runner;
  std::optional<Tokenizer> tokenizer{};  // none: token ids only (no text, no stop strings)
};

// A snapshot of engine-wide state, for /metrics and logs. Counters count since start.
struct EngineMetrics {
  int64_t running = 0;
  int64_t waiting = 0;  // queued, including submitted and not yet seen by the engine
  int32_t kv_block_size = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_in_use = 0;     // referenced by a running sequence
  int64_t kv_blocks_cached = 0;     // holding a cached prefix (in use or not)
  int64_t kv_blocks_free = 0;       // allocatable (includes cached blocks no one uses)
  int64_t prefix_query_tokens = 0;  // tokens looked up in the prefix cache at admission
  int64_t prefix_hit_tokens = 0;    // of which found
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t computed_tokens = 0;   // tokens run through the model
  int64_t generated_tokens = 0;  // tokens sampled
  int64_t requests_submitted = 0;
  int64_t requests_rejected = 0;  // refused by submit()
  int64_t requests_finished = 0;  // every reason
  int64_t requests_cancelled = 0;
  int64_t requests_failed = 0;
  // The runner's expert_traffic(), as of the last step (zeros for a model without routed experts).
  ExpertTraffic experts{};
};

class Engine {
 public:
  // Starts the engine thread. Throws spill::Error if the configuration cannot work with this
  // runner (e.g. max_model_len larger than the KV pool).
  Engine(EngineParts parts, const EngineConfig& config);
  // Stops the thread; requests still open finish with reason Cancelled.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe; never waits for a step. Checks the request (prompt not empty, ids in the
  // vocabulary, fits max_model_len, sampling parameters, stop strings need a tokenizer) and
  // queues it. Throws spill::Error saying what is wrong, QueueFullError when max_waiting
  // requests are already queued, EngineStoppedError when the engine has stopped.
  RequestStream submit(GenerationRequest request);

  EngineMetrics metrics() const;  // thread-safe
  const ModelSpec& spec() const { return spec_; }
  const Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }
  int64_t max_model_len() const { return max_model_len_; }
  // The runner's describe(): backend, device, KV pool (for start-up logs).
  const std::string& runner_description() const { return runner_description_; }

  struct Impl;

 private:
  void validate_request(const GenerationRequest& request) const;  // throws spill::Error

  ModelSpec spec_;
  std::optional<Tokenizer> tokenizer_;
  int64_t max_model_len_ = 0;
  std::string runner_description_;
  std::unique_ptr<Impl> impl_;
};

// Opening a model and building its runner and engine in one call: engine/open_engine.h.

}  // namespace spill
