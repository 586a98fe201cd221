// `spill serve`: the HTTP server. Routing, API keys, the body-size limit, health, models, metrics
// and tokenize live here; request parsing and response shapes live in openai_api / anthropic_api.
//
// Threads: cpp-httplib's pool runs one request per worker thread from the body to the last byte
// of the response (a stream holds its worker while it streams). Each worker submits to the
// engine and reads its own RequestStreams; the engine thread is never blocked by a slow client.
// The model loads on a background thread while the server already answers (/health is 503
// until the engine is ready; generation endpoints answer 503 too).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "offload/model_experts.h"

namespace spill::server {

struct ServerOptions {
  std::string model_dir;            // Hugging Face model folder
  std::string quant;                // --quant mix applied at load; "": weights as stored
  std::string imatrix;              // importance matrix for --quant; "": none
  std::string served_model_name;    // "" -> the folder's basename
  std::string host = "127.0.0.1";   // loopback unless asked otherwise
  int port = 8080;                  // 0: any free port (printed on the listening line)
  std::string api_key;              // "": no authentication
  int32_t max_seqs = 0;             // sequences running at once; 0: engine default
  int64_t max_waiting = 0;          // queued requests before 503; 0: engine default
  int64_t max_model_len = 0;        // 0: the model's context, capped by the KV pool
  int64_t kv_mem_bytes = 0;         // KV pool size; 0: engine default
  int threads = 0;                  // CPU backend threads; 0: all
  std::string device = "auto";      // --device: cpu, cuda, cuda:N or auto (engine/open_engine.h)
  std::optional<KvFormat> kv_format;  // --kv-format; unset: the backend's own (RunnerOptions::kv_format)
  std::string expert_plan;          // --plan: which routed experts live in host RAM (spill plan --out); "": none
  offload::StartupPlacement placement;  // --gpu-mem, --host-experts, --host-mem: plan at start-up instead
  size_t max_body_bytes = size_t(32) << 20;
  int http_threads = 0;             // 0: enough for max_seqs streams plus slack
  double ping_interval_s = 2.0;     // keep-alive events while nothing else is sent
  // max_tokens beyond the room the prompt leaves: false clamps it to that room (the reply ends
  // with finish_reason "length"), true refuses the request with 400 as vLLM does.
  bool strict_max_tokens = false;
  // Most tokens one reply may generate, whatever the request asks (or when it asks nothing,
  // as Codex does); 0: no cap beyond the context. A reply cut by it ends with "length".
  int64_t max_tokens_cap = 0;
  size_t responses_store = 256;     // /v1/responses kept for previous_response_id; 0: none
  std::string record_profile;       // "": off; else the routing profile file, rewritten periodically
  double record_profile_interval_s = 60.0;
};

// Binds, prints "spill: listening on http://HOST:PORT" on stdout, loads the model in the
// background and serves until SIGINT or SIGTERM. Returns the process exit code (1 when the
// address cannot be bound or the model fails to load). Throws spill::Error for bad options.
int serve(const ServerOptions& options);

// Blocks SIGINT and SIGTERM in the calling thread, so that every thread started after it inherits
// the mask and leaves them to serve()'s signal thread. serve() calls it; a caller that may start
// threads first (a CUDA device query starts the driver's) must call it before, or a signal can
// land on one of those threads and kill the process the default way.
void block_shutdown_signals();

}  // namespace spill::server
