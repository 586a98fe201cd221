#include "server/http_server.h"

// Debian's libcpp-httplib is compiled with these; the header must see the same switches, since
// they change the layout of the classes the library and this file share.
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/open_engine.h"
#include "placement/profile.h"
#include "server/anthropic_api.h"
#include "server/api_common.h"
#include "server/chat_prompt.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/output_parser.h"
#include "server/responses_api.h"
#include "text/tokenizer.h"

namespace spill::server {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Non-streaming JSON bodies sent through a content provider. httplib compresses exactly
// "application/json" when the client accepts gzip, and a compressor holds back the whitespace
// keep-alives that detect a vanished client; the charset parameter keeps the body uncompressed.
constexpr const char* kJsonType = "application/json; charset=utf-8";

// One line per request on stderr: what the handler learned about tokens, kept per worker thread
// (httplib runs a request's handler, its content provider and the logger on one thread).
struct AccessLog {
  Clock::time_point start = Clock::now();
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  int64_t cached_tokens = -1;  // prompt tokens the prefix cache held (the first choice's), once known
  double ttft_ms = -1;         // the first choice's time to first token: mostly prefill
};
thread_local AccessLog t_access_log;

enum class Flavor { OpenAI, Anthropic };

Flavor flavor_of(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? Flavor::Anthropic : Flavor::OpenAI;
}

void send_json(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e, Flavor flavor) {
  if (e.status == 503 || e.status == 429) res.set_header("Retry-After", "1");
  send_json(res, e.status, flavor == Flavor::Anthropic ? anthropic_error_body(e) : openai_error_body(e));
}

ApiError internal_error(const std::string& what) {
  return ApiError{.status = 500, .message = "internal error: " + what, .param = "", .code = ""};
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= (unsigned char)(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

std::string served_name(const ServerOptions& o) {
  if (!o.served_model_name.empty()) return o.served_model_name;
  std::filesystem::path p = std::filesystem::path(o.model_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::string name = p.filename().string();
  return name.empty() ? "spill" : name;
}

std::string url_host(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

// ---- reading several request streams at once ----

// Per choice: arrival times, for the latency histograms.
struct ChoiceTiming {
  int64_t prompt_tokens = 0;
  Clock::time_point submitted = Clock::now();
  Clock::time_point last_arrival{};
  bool saw_token = false;
  int64_t n_tokens = 0;
  std::vector<double> inter_token_seconds;

  void on_output(const RequestOutput& out) {
    const auto now = Clock::now();
    const size_t n = out.token_ids.size();
    if (n == 0) return;
    n_tokens += int64_t(n);
    if (saw_token) {
      // Tokens that arrive together shared the wait since the previous arrival.
      const double gap = std::chrono::duration<double>(now - last_arrival).count() / double(n);
      for (size_t i = 0; i < n; ++i) inter_token_seconds.push_back(gap);
    } else {
      for (size_t i = 1; i < n; ++i) inter_token_seconds.push_back(0.0);
    }
    saw_token = true;
    last_arrival = now;
  }
};

std::vector<ChoiceTiming> make_timings(const std::vector<int64_t>& prompt_tokens) {
  std::vector<ChoiceTiming> timings(prompt_tokens.size());
  for (size_t i = 0; i < timings.size(); ++i) timings[i].prompt_tokens = prompt_tokens[i];
  return timings;
}

}  // namespace

class HttpServer {
 public:
  explicit HttpServer(const ServerOptions& options)
      : options_(options),
        model_name_(served_name(options)),
        responses_(options.responses_store, kResponsesStoreBytes) {}

  int run();
  // From any thread, before, during or after listen(): listen() then returns promptly.
  void request_stop() {
    stopping_ = true;
    while (!http_.is_running() && !listen_returned_) std::this_thread::sleep_for(milliseconds(5));
    http_.stop();
  }

 private:
  enum class State { Loading, Ready, Failed };

  void load_model();
  void install_routes();
  bool authorized(const httplib::Request& req) const;
  // Wraps a handler: API key, readiness, JSON errors, never an escaping exception.
  struct Access {
    bool needs_key = true;    // with --api-key: refuse requests without it
    bool needs_model = true;  // 503 until the model has loaded
  };
  httplib::Server::Handler guarded(Access access, std::function<void(const httplib::Request&, httplib::Response&)> fn);

  void handle_health(httplib::Response& res);
  void handle_models(httplib::Response& res);
  // The /v1/models entry of the loaded model.
  Json model_card(const std::string& id) const;
  void handle_metrics(httplib::Response& res);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
  void handle_chat(const httplib::Request& req, httplib::Response& res);
  void handle_completions(const httplib::Request& req, httplib::Response& res);
  void handle_messages(const httplib::Request& req, httplib::Response& res);
  void handle_count_tokens(const httplib::Request& req, httplib::Response& res);
  void handle_responses(const httplib::Request& req, httplib::Response& res);

  // Prompt helpers.
  RenderedPrompt render_chat(const ChatInput& chat, const std::string& prefill = "") const;
  // `untrusted`: byte ranges the client wrote inside a rendered chat prompt (no special tokens there).
  std::vector<int32_t> tokenize_prompt(const std::string& text, bool add_special,
                                       std::span<const TextSpan> untrusted = {}) const;
  // Checks that the prompt fits the context (400 naming both numbers when it does not) and
  // returns the max_tokens to generate with: the client's, clamped to the room the prompt
  // leaves (or refused with 400 under --strict-max-tokens).
  std::optional<int64_t> fit_context(int64_t prompt_tokens, std::optional<int64_t> max_tokens, const char* param) const;
  GenerationRequest make_request(std::vector<int32_t> prompt, const GenerationOptions& gen, int32_t choice_index,
                                 std::optional<int64_t> max_tokens) const;
  // The template's own end-of-turn markers, as stop strings and (when they are tokens) stop ids.
  void add_template_stops(GenerationRequest& request, const RenderedPrompt& prompt) const;
  std::vector<RequestStream> submit_all(std::vector<GenerationRequest> requests);
  void record_finish(const RequestFinish& finish, const std::string& reason, const ChoiceTiming& timing);

  // Reads the streams until each has finished (streams already finished are skipped, so a pump
  // can resume where an earlier one stopped). on_output(i, out) consumes new output of stream i
  // and may throw ApiError (a failed request); on_idle() runs when nothing was sent to the
  // client for the ping interval (*last_sent, updated by the caller's writes, or since the last
  // on_idle). Either returns false when the client is gone. On ClientGone or an exception every
  // unfinished stream is cancelled.
  enum class PumpResult { Finished, ClientGone, Deadline };
  PumpResult pump(std::vector<RequestStream>& streams, std::vector<ChoiceTiming>& timings,
                  const std::function<bool(size_t, RequestOutput&)>& on_output, const std::function<bool()>& on_idle,
                  const Clock::time_point* last_sent, std::optional<Clock::time_point> deadline = std::nullopt);
  void record_aborted(const std::vector<RequestStream>& streams, const std::vector<ChoiceTiming>& timings);
  // A streamed (SSE) reply, whichever API: the headers, a chunked content provider that cancels
  // the streams when the connection closes, the pump with a keep-alive event after each ping
  // interval of silence (a long prefill), what a failure after the 200 becomes, and the ending.
  // Each callback returns the SSE text to send ("" for nothing); on_output may throw ApiError.
  struct SseReply {
    std::vector<int64_t> prompt_sizes;                                              // per stream
    std::function<std::string()> start;                                             // first events
    std::function<std::string(size_t, RequestOutput&, const ChoiceTiming&)> on_output;
    std::function<std::string()> keepalive;                                         // events clients count as activity
    std::function<std::string(const ApiError&)> failure;                            // a late error, in the API's shape
    std::function<std::string()> end;                                               // once every stream finished
  };
  void respond_sse(httplib::Response& res, std::vector<RequestStream> streams, SseReply reply);
  // Logs tool-call blocks the parser could not read (returned to the client as text).
  void log_unparsed_tool_calls(const OutputParser& parser) const;

  // A non-streaming reply. The generation is pumped in the handler for one ping interval: most
  // requests end by then and get a plain response with the right status. Longer ones continue
  // in a chunked content provider that writes JSON whitespace while it waits, which notices a
  // client that left (and cancels its requests); the JSON body follows at the end.
  struct Collector {
    std::vector<RequestStream> streams;
    std::vector<ChoiceTiming> timings;
    std::function<void(size_t, RequestOutput&)> on_output;  // may throw ApiError
    std::function<Json()> body;                              // once every stream has finished
  };
  void respond_when_done(httplib::Response& res, std::shared_ptr<Collector> collector, Flavor flavor);

  ServerOptions options_;
  std::string model_name_;
  std::atomic<State> state_{State::Loading};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> listen_returned_{false};
  std::string load_error_;
  // Declared before engine_ so that they outlive it: the engine thread calls the recorder.
  std::unique_ptr<placement::RoutingRecorder> recorder_;
  std::unique_ptr<placement::ProfileFileWriter> profile_writer_;
  std::unique_ptr<Engine> engine_;
  std::optional<ChatPrompt> chat_prompt_;
  GenerationDefaults defaults_;
  ServerMetrics metrics_;
  static constexpr size_t kResponsesStoreBytes = size_t(256) << 20;
  ResponseStore responses_;
  httplib::Server http_;
  std::thread loader_;
};

// ---------------------------------------------------------------------------------------------
// Start-up

void HttpServer::load_model() {
  const auto t0 = Clock::now();
  try {
    fmt::print(stderr, "spill: loading {}\n", options_.model_dir);
    EngineConfig config;
    if (options_.max_seqs > 0) config.scheduler.max_running = options_.max_seqs;
    if (options_.max_waiting > 0) config.max_waiting = options_.max_waiting;
    config.max_model_len = options_.max_model_len;
    if (!options_.record_profile.empty()) {  // routing profile of live traffic, for spill plan --profile
      recorder_ = std::make_unique<placement::RoutingRecorder>(load_model_spec(options_.model_dir), options_.model_dir,
                                                               "live traffic (spill serve --record-profile)");
      config.observer = recorder_.get();
      config.on_step = [rec = recorder_.get(), kinds = std::vector<placement::StepChunkKind>()](const StepTrace& t) mutable {
        kinds.clear();
        for (const StepTraceChunk& c : t.chunks) kinds.push_back({c.n_tokens, c.decode});
        rec->end_step(kinds);
      };
      profile_writer_ = std::make_unique<placement::ProfileFileWriter>(*recorder_, options_.record_profile,
                                                                       options_.record_profile_interval_s);
    }
    EngineOptions engine_options;
    engine_options.runner.device = parse_device(options_.device);
    engine_options.runner.threads = options_.threads;
    engine_options.runner.kv = KvCapacity{.block_size = 16, .blocks = 0, .bytes = options_.kv_mem_bytes};
    engine_options.runner.kv_format = options_.kv_format;
    engine_options.runner.expert_plan = options_.expert_plan;
    engine_options.runner.placement = options_.placement;
    engine_options.quant = options_.quant;
    engine_options.imatrix = options_.imatrix;
    engine_options.require_tokenizer = true;
    auto engine = open_engine(options_.model_dir, engine_options, config);
    chat_prompt_ = ChatPrompt::load(options_.model_dir, engine->tokenizer());
    defaults_ = GenerationDefaults::load(options_.model_dir);
    engine_ = std::move(engine);
    state_ = State::Ready;
    fmt::print(stderr, "spill: model {} ready in {:.1f} s on {} (context {} tokens{})\n", model_name_,
               seconds_since(t0), engine_->runner_description(), engine_->max_model_len(),
               chat_prompt_->is_fallback() ? "; no chat template in the model, using ChatML" : "");
  } catch (const std::exception& e) {
    load_error_ = e.what();
    state_ = State::Failed;
    fmt::print(stderr, "spill: error: loading {} failed: {}\n", options_.model_dir, e.what());
    request_stop();
  }
}

bool HttpServer::authorized(const httplib::Request& req) const {
  if (options_.api_key.empty()) return true;
  const std::string auth = req.get_header_value("Authorization");
  if (auth.size() > 7 && (auth.rfind("Bearer ", 0) == 0 || auth.rfind("bearer ", 0) == 0) &&
      constant_time_equal(auth.substr(7), options_.api_key))
    return true;
  const std::string x_key = req.get_header_value("x-api-key");
  return !x_key.empty() && constant_time_equal(x_key, options_.api_key);
}

httplib::Server::Handler HttpServer::guarded(Access access,
                                             std::function<void(const httplib::Request&, httplib::Response&)> fn) {
  return [this, access, fn = std::move(fn)](const httplib::Request& req, httplib::Response& res) {
    const Flavor flavor = flavor_of(req.path);
    try {
      if (access.needs_key && !authorized(req)) {
        const bool sent = req.has_header("Authorization") || req.has_header("x-api-key");
        throw ApiError{.status = 401,
                       .message = sent ? "invalid API key"
                                       : "missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                       .param = "",
                       .code = "invalid_api_key"};
      }
      if (access.needs_model && state_ != State::Ready)
        throw ApiError{.status = 503,
                       .message = state_ == State::Loading ? "the model is still loading; retry shortly"
                                                           : "the model failed to load: " + load_error_,
                       .param = "",
                       .code = ""};
      fn(req, res);
    } catch (const ApiError& e) {
      send_error(res, e, flavor);
    } catch (const QueueFullError& e) {
      send_error(res, ApiError{.status = 503, .message = e.what(), .param = "", .code = "queue_full"}, flavor);
    } catch (const EngineStoppedError& e) {
      send_error(res, ApiError{.status = 503, .message = e.what(), .param = "", .code = "engine_stopped"}, flavor);
    } catch (const spill::Error& e) {
      send_error(res, ApiError{.status = 400, .message = e.what(), .param = "", .code = ""}, flavor);
    } catch (const std::exception& e) {
      send_error(res, internal_error(e.what()), flavor);
    } catch (...) {
      send_error(res, internal_error("unknown exception"), flavor);
    }
  };
}

void HttpServer::install_routes() {
  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) { handle_health(res); });
  // Probes and scrapers need no key: /health and /metrics say nothing about prompts.
  http_.Get("/metrics", guarded({.needs_key = false, .needs_model = false}, [this](const httplib::Request&, httplib::Response& res) { handle_metrics(res); }));
  http_.Get("/v1/models", guarded({}, [this](const httplib::Request&, httplib::Response& res) { handle_models(res); }));
  // Ids may contain '/' (Hugging Face names), so the rest of the path is the id. Generation
  // accepts any model name, but retrieving one that is not served is OpenAI's 404.
  http_.Get(R"(/v1/models/(.+))", guarded({}, [this](const httplib::Request& req, httplib::Response& res) {
              const std::string id = req.matches[1].str();
              if (id != model_name_)
                throw ApiError{.status = 404,
                               .message = fmt::format("The model '{}' does not exist; this server serves '{}'", id, model_name_),
                               .param = "model",
                               .code = "model_not_found"};
              send_json(res, 200, model_card(id));
            }));
  http_.Post("/tokenize", guarded({}, [this](const httplib::Request& q, httplib::Response& r) { handle_tokenize(q, r); }));
  http_.Post("/detokenize",
             guarded({}, [this](const httplib::Request& q, httplib::Response& r) { handle_detokenize(q, r); }));
  http_.Post("/v1/chat/completions",
             guarded({}, [this](const httplib::Request& q, httplib::Response& r) { handle_chat(q, r); }));
  http_.Post("/v1/completions",
             guarded({}, [this](const httplib::Request& q, httplib::Response& r) { handle_completions(q, r); }));
  http_.Post("/v1/messages", guarded({}, [this](const httplib::Request& q, httplib::Response& r) { handle_messages(q, r); }));
  http_.Post("/v1/messages/count_tokens",
             guarded({}, [this](const httplib::Request& q, httplib::Response& r) { handle_count_tokens(q, r); }));
  http_.Post("/v1/responses", guarded({}, [this](const httplib::Request& q, httplib::Response& r) { handle_responses(q, r); }));
  // Stored responses (those created with store not false), retrieved or deleted by id.
  auto stored_response_not_found = [](const std::string& id) {
    return ApiError{.status = 404,
                    .message = fmt::format("Response with id '{}' not found (never stored, or evicted from the store "
                                           "of the newest --responses-store responses)",
                                           id),
                    .param = "response_id",
                    .code = ""};
  };
  http_.Get(R"(/v1/responses/([^/]+))",
            guarded({}, [this, stored_response_not_found](const httplib::Request& req, httplib::Response& res) {
              const std::string id = req.matches[1].str();
              const auto entry = responses_.get(id);
              if (!entry) throw stored_response_not_found(id);
              send_json(res, 200, entry->response);
            }));
  http_.Delete(R"(/v1/responses/([^/]+))",
               guarded({}, [this, stored_response_not_found](const httplib::Request& req, httplib::Response& res) {
                 const std::string id = req.matches[1].str();
                 if (!responses_.erase(id)) throw stored_response_not_found(id);
                 send_json(res, 200, Json{{"id", id}, {"object", "response"}, {"deleted", true}});
               }));

  // Whatever httplib answers itself (404, 413, malformed requests) gets a JSON body too.
  http_.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_length_ > 0) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    switch (res.status) {
      case 404: message = fmt::format("no endpoint {} {}; see docs/API.md", req.method, req.path); break;
      case 405: message = fmt::format("{} is not allowed on {}", req.method, req.path); break;
      case 413:
        message = fmt::format("request body is larger than the limit of {} bytes (spill serve --max-body-bytes)",
                              options_.max_body_bytes);
        break;
      default: message = fmt::format("HTTP {} for {} {}", res.status, req.method, req.path); break;
    }
    const ApiError e{.status = res.status, .message = message, .param = "", .code = ""};
    const Flavor flavor = flavor_of(req.path);
    res.set_content(dump_json(flavor == Flavor::Anthropic ? anthropic_error_body(e) : openai_error_body(e)),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, internal_error(what), flavor_of(req.path));
  });
  http_.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    t_access_log = AccessLog{};
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    const AccessLog& log = t_access_log;
    std::string tokens;
    if (log.prompt_tokens >= 0) tokens = fmt::format(" prompt={} completion={}", log.prompt_tokens, std::max<int64_t>(0, log.completion_tokens));
    if (log.cached_tokens >= 0) tokens += fmt::format(" cached={}", log.cached_tokens);
    if (log.ttft_ms >= 0) tokens += fmt::format(" ttft={:.0f}ms", log.ttft_ms);
    const bool generation = req.path == "/v1/chat/completions" || req.path == "/v1/completions" ||
                            req.path == "/v1/messages" || req.path == "/v1/responses";
    // Where a generation's routed experts were read from, engine-wide (with host experts only).
    const std::string experts =
        generation && state_ == State::Ready ? expert_log_summary(engine_->metrics().experts) : "";
    fmt::print(stderr, "spill: {} {} {}{} {:.0f}ms{}\n", req.method, req.path, res.status, tokens,
               seconds_since(log.start) * 1e3, experts);
    if (generation && res.status >= 400) metrics_.record_rejected(res.status);
    t_access_log = AccessLog{};
  });
}

int HttpServer::run() {
  install_routes();
  http_.set_payload_max_length(options_.max_body_bytes);
  http_.set_keep_alive_max_count(1000);
  http_.set_keep_alive_timeout(5);  // an idle keep-alive connection delays shutdown by this much
  http_.set_read_timeout(60);
  http_.set_write_timeout(60);
  const int max_seqs = options_.max_seqs > 0 ? options_.max_seqs : 64;
  const size_t workers = options_.http_threads > 0 ? size_t(options_.http_threads) : size_t(std::max(64, 2 * max_seqs + 16));
  http_.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };

  int port = options_.port;
  if (port == 0) {
    port = http_.bind_to_any_port(options_.host);
    if (port <= 0) {
      fmt::print(stderr, "spill: error: cannot bind to {} (any port); check --host\n", options_.host);
      return 1;
    }
  } else if (!http_.bind_to_port(options_.host, port)) {
    fmt::print(stderr, "spill: error: cannot bind to {}:{}; is another server on that port? Try --port 0 for any free port\n",
               options_.host, port);
    return 1;
  }
  fmt::print(stdout, "spill: listening on http://{}:{}\n", url_host(options_.host), port);
  std::fflush(stdout);

  loader_ = std::thread([this] { load_model(); });
  if (!stopping_) http_.listen_after_bind();
  listen_returned_ = true;
  stopping_ = true;
  loader_.join();
  engine_.reset();  // open requests end as cancelled; the engine thread stops
  return state_ == State::Failed ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// Small endpoints

void HttpServer::handle_health(httplib::Response& res) {
  switch (state_.load()) {
    case State::Ready: send_json(res, 200, Json{{"status", "ok"}}); break;
    case State::Loading: send_json(res, 503, Json{{"status", "loading"}}); break;
    case State::Failed: send_json(res, 503, Json{{"status", "error"}, {"error", load_error_}}); break;
  }
}

Json HttpServer::model_card(const std::string& id) const {
  Json model = Json::object();
  model["id"] = id;
  model["object"] = "model";
  model["created"] = unix_now();
  model["owned_by"] = "spill";
  model["root"] = model_name_;
  model["parent"] = nullptr;
  model["max_model_len"] = engine_->max_model_len();
  model["context_length"] = engine_->max_model_len();
  // Anthropic's /v1/models shape, so both SDKs can list it.
  model["type"] = "model";
  model["display_name"] = model_name_;
  return model;
}

void HttpServer::handle_models(httplib::Response& res) {
  Json body = Json::object();
  body["object"] = "list";
  body["data"] = Json::array({model_card(model_name_)});
  send_json(res, 200, body);
}

void HttpServer::handle_metrics(httplib::Response& res) {
  EngineGauges g;
  if (state_ == State::Ready) {
    const EngineMetrics m = engine_->metrics();
    g.requests_running = m.running;
    g.requests_waiting = m.waiting;
    g.kv_blocks_total = m.kv_blocks_total;
    g.kv_cache_usage = m.kv_blocks_total > 0 ? double(m.kv_blocks_in_use) / double(m.kv_blocks_total) : 0.0;
    g.prefix_cache_queries = m.prefix_query_tokens;
    g.prefix_cache_hits = m.prefix_hit_tokens;
    g.preemptions = m.preemptions;
    if (engine_->spec().n_moe_layers() > 0) g.experts = m.experts;
  }
  res.status = 200;
  res.set_content(metrics_.render(g, model_name_), "text/plain; version=0.0.4; charset=utf-8");
}

void HttpServer::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_json_body(req.body);
  std::vector<int32_t> ids;
  if (find_field(body, "messages")) {
    const ChatInput chat = parse_chat_input(body);
    const bool add_special = read_bool(body, "add_special_tokens").value_or(false);
    const RenderedPrompt rendered = render_chat(chat);
    ids = tokenize_prompt(rendered.text, add_special, rendered.input_spans);
  } else {
    const auto prompt = read_string(body, "prompt");
    if (!prompt) invalid_field("prompt", "is required (or give \"messages\")");
    ids = tokenize_prompt(*prompt, read_bool(body, "add_special_tokens").value_or(true));
  }
  Json out = Json::object();
  out["count"] = ids.size();
  out["max_model_len"] = engine_->max_model_len();
  out["tokens"] = ids;
  if (read_bool(body, "return_token_strs").value_or(false)) {
    Json strs = Json::array();
    for (int32_t id : ids) strs.push_back(engine_->tokenizer()->token_text(id));
    out["token_strs"] = std::move(strs);
  }
  send_json(res, 200, out);
}

void HttpServer::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_json_body(req.body);
  const Json* tokens = find_field(body, "tokens");
  if (!tokens || !tokens->is_array()) invalid_field("tokens", "is required: an array of token ids");
  const Tokenizer& tok = *engine_->tokenizer();
  std::vector<int32_t> ids;
  for (const Json& t : *tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size())
      invalid_field("tokens", fmt::format("must hold token ids in [0, {})", tok.vocab_size()));
    ids.push_back(t.get<int32_t>());
  }
  send_json(res, 200, Json{{"prompt", tok.decode(ids)}});
}

// ---------------------------------------------------------------------------------------------
// Generation helpers

RenderedPrompt HttpServer::render_chat(const ChatInput& chat, const std::string& prefill) const {
  return chat_prompt_->render(chat, prefill);
}

std::vector<int32_t> HttpServer::tokenize_prompt(const std::string& text, bool add_special,
                                                 std::span<const TextSpan> untrusted) const {
  try {
    return engine_->tokenizer()->encode(text, add_special, untrusted);
  } catch (const spill::Error& e) {
    throw ApiError{.status = 400, .message = fmt::format("cannot tokenize the prompt: {}", e.what()), .param = "", .code = ""};
  }
}

std::optional<int64_t> HttpServer::fit_context(int64_t prompt_tokens, std::optional<int64_t> max_tokens,
                                               const char* param) const {
  const int64_t limit = engine_->max_model_len();
  if (prompt_tokens == 0)
    throw ApiError{.status = 400, .message = "the prompt is empty (0 tokens)", .param = param, .code = ""};
  if (prompt_tokens >= limit)
    throw ApiError{.status = 400,
                   .message = fmt::format("This model's maximum context length is {} tokens and the prompt alone is {} "
                                          "tokens, which leaves no room for a completion. Please shorten the prompt "
                                          "(or start the server with a larger --max-model-len).",
                                          limit, prompt_tokens),
                   .param = param,
                   .code = "context_length_exceeded"};
  const int64_t room = limit - prompt_tokens;
  if (options_.max_tokens_cap > 0) max_tokens = std::min(max_tokens.value_or(options_.max_tokens_cap), options_.max_tokens_cap);
  if (!max_tokens || *max_tokens <= room) return max_tokens;
  if (options_.strict_max_tokens)
    throw ApiError{.status = 400,
                   .message = fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                                          "tokens ({} in the prompt, {} in the completion). Please reduce the length "
                                          "of the prompt or of max_tokens.",
                                          limit, prompt_tokens + *max_tokens, prompt_tokens, *max_tokens),
                   .param = param,
                   .code = "context_length_exceeded"};
  // Agents send max_tokens as a ceiling (Claude Code 32000, Qwen Code 32000): generate up to the
  // end of the context, and say "length" / "max_tokens" if it is reached.
  return room;
}

GenerationRequest HttpServer::make_request(std::vector<int32_t> prompt, const GenerationOptions& gen,
                                           int32_t choice_index, std::optional<int64_t> max_tokens) const {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling = resolve_sampling(gen, defaults_);
  // n > 1 with a seed: each choice its own (reproducible) stream, or all choices would be equal.
  if (r.sampling.seed && choice_index > 0) r.sampling.seed = *r.sampling.seed + uint64_t(choice_index);
  try {
    r.sampling.validate();
  } catch (const spill::Error& e) {
    throw ApiError{.status = 400, .message = e.what(), .param = "", .code = ""};
  }
  r.max_tokens = max_tokens;
  r.stop = gen.stop;
  r.stop_token_ids = gen.stop_token_ids;
  r.ignore_eos = gen.ignore_eos;
  r.skip_special_tokens = gen.skip_special_tokens;
  return r;
}

void HttpServer::add_template_stops(GenerationRequest& request, const RenderedPrompt& prompt) const {
  // The reply format's markers are special tokens (gpt-oss, Kimi-K2): the parser must see them.
  if (prompt.keep_special_tokens) request.skip_special_tokens = false;
  for (const std::string& s : prompt.stop_strings) {
    request.stop.push_back(s);
    if (auto id = engine_->tokenizer()->token_id(s)) request.stop_token_ids.push_back(*id);
  }
}

std::vector<RequestStream> HttpServer::submit_all(std::vector<GenerationRequest> requests) {
  std::vector<RequestStream> streams;
  try {
    for (GenerationRequest& r : requests) streams.push_back(engine_->submit(std::move(r)));
  } catch (...) {
    for (RequestStream& s : streams) s.cancel();
    throw;
  }
  return streams;
}

void HttpServer::record_finish(const RequestFinish& finish, const std::string& reason, const ChoiceTiming& timing) {
  if (t_access_log.cached_tokens < 0) {
    t_access_log.cached_tokens = finish.cached_tokens;
    t_access_log.ttft_ms = finish.timings.ttft_ms;
  }
  metrics_.record_finished(FinishedRequestStats{
      .finish_reason = reason,
      .prompt_tokens = finish.prompt_tokens,
      .generation_tokens = finish.completion_tokens,
      .cached_tokens = finish.cached_tokens,
      .e2e_seconds = finish.timings.total_ms / 1e3,
      .ttft_seconds = finish.timings.ttft_ms >= 0 ? finish.timings.ttft_ms / 1e3 : -1.0,
      .inter_token_seconds = timing.inter_token_seconds,
  });
}


HttpServer::PumpResult HttpServer::pump(std::vector<RequestStream>& streams, std::vector<ChoiceTiming>& timings,
                                        const std::function<bool(size_t, RequestOutput&)>& on_output,
                                        const std::function<bool()>& on_idle, const Clock::time_point* last_sent,
                                        std::optional<Clock::time_point> deadline) {
  const auto idle_interval = std::chrono::duration<double>(options_.ping_interval_s);
  std::vector<bool> done(streams.size());
  size_t remaining = 0;
  for (size_t i = 0; i < streams.size(); ++i) {
    done[i] = streams[i].finished();
    remaining += !done[i];
  }
  auto cancel_unfinished = [&] {
    for (size_t i = 0; i < streams.size(); ++i)
      if (!done[i]) streams[i].cancel();
  };
  auto last_idle = Clock::now();
  try {
    while (remaining > 0) {
      if (stopping_) {
        cancel_unfinished();
        return PumpResult::ClientGone;
      }
      if (deadline && Clock::now() >= *deadline) return PumpResult::Deadline;
      bool got = false;
      for (size_t i = 0; i < streams.size(); ++i) {
        if (done[i]) continue;
        // One stream: sleep on it. Several: a short wait on each in turn.
        const milliseconds wait = remaining == 1 ? milliseconds(100) : milliseconds(got ? 0 : 2);
        std::optional<RequestOutput> out = streams[i].next_for(wait);
        if (!out) continue;
        got = true;
        timings[i].on_output(*out);
        if (out->finish) {
          done[i] = true;
          --remaining;
        }
        if (!on_output(i, *out)) {
          cancel_unfinished();
          return PumpResult::ClientGone;
        }
      }
      const auto now = Clock::now();
      const auto quiet_since = last_sent ? std::max(*last_sent, last_idle) : last_idle;
      if (now - quiet_since >= idle_interval) {
        last_idle = now;
        if (!on_idle()) {
          cancel_unfinished();
          return PumpResult::ClientGone;
        }
      }
    }
  } catch (...) {
    cancel_unfinished();
    throw;
  }
  return PumpResult::Finished;
}

void HttpServer::record_aborted(const std::vector<RequestStream>& streams, const std::vector<ChoiceTiming>& timings) {
  t_access_log.completion_tokens = 0;
  for (const ChoiceTiming& t : timings) t_access_log.completion_tokens += t.n_tokens;
  for (size_t i = 0; i < streams.size(); ++i) {
    if (streams[i].finished()) continue;
    metrics_.record_finished(FinishedRequestStats{.finish_reason = "abort",
                                                  .prompt_tokens = timings[i].prompt_tokens,
                                                  .generation_tokens = timings[i].n_tokens,
                                                  .cached_tokens = 0,
                                                  .e2e_seconds = seconds_since(timings[i].submitted),
                                                  .ttft_seconds = -1,
                                                  .inter_token_seconds = timings[i].inter_token_seconds});
  }
}

void HttpServer::respond_when_done(httplib::Response& res, std::shared_ptr<Collector> c, Flavor flavor) {
  auto on_output = [c](size_t i, RequestOutput& out) {
    c->on_output(i, out);
    return true;
  };
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.ping_interval_s));
  const PumpResult first = pump(c->streams, c->timings, on_output, [] { return true; }, nullptr, deadline);
  if (first == PumpResult::Finished) {
    send_json(res, 200, c->body());
    return;
  }
  if (first == PumpResult::ClientGone) {  // the server is shutting down
    throw ApiError{.status = 503, .message = "the server is shutting down", .param = "", .code = ""};
  }
  res.status = 200;
  res.set_chunked_content_provider(
      kJsonType,
      [this, c, on_output, flavor](size_t, httplib::DataSink& sink) {
        std::string body;
        try {
          const PumpResult r = pump(c->streams, c->timings, on_output, [&sink] { return sink.write(" ", 1); }, nullptr);
          if (r != PumpResult::Finished) {
            record_aborted(c->streams, c->timings);
            return false;
          }
          body = dump_json(c->body());
        } catch (const ApiError& e) {
          // Too late for a status code: the error goes in the body, in the API's shape.
          body = dump_json(flavor == Flavor::Anthropic ? anthropic_error_body(e) : openai_error_body(e));
        } catch (const std::exception& e) {
          const ApiError err = internal_error(e.what());
          body = dump_json(flavor == Flavor::Anthropic ? anthropic_error_body(err) : openai_error_body(err));
        }
        if (!sink.write(body.data(), body.size())) return false;
        sink.done();
        return true;
      },
      [c](bool) {
        for (RequestStream& s : c->streams) s.cancel();
      });
}

namespace {

// A failed or cancelled request, as an error for the client.
ApiError finish_error(const RequestFinish& f) {
  if (f.reason == FinishReason::Cancelled)
    return ApiError{.status = 503,
                    .message = f.error.empty() ? "the request was cancelled (the server is shutting down)" : f.error,
                    .param = "",
                    .code = ""};
  return internal_error(f.error.empty() ? "generation failed" : f.error);
}

bool failed(const RequestFinish& f) { return f.reason == FinishReason::Error || f.reason == FinishReason::Cancelled; }

void append_all(std::vector<OutputPiece>& to, std::vector<OutputPiece> more) {
  for (OutputPiece& p : more) to.push_back(std::move(p));
}

OutputParser make_parser(const RenderedPrompt& prompt) {
  OutputParser parser(prompt.parser);
  // The forced start of a tool call is part of the reply as the parser must read it.
  if (!prompt.forced_reply.empty()) (void)parser.push(prompt.forced_reply);
  return parser;
}

const char* const kSseDone = "data: [DONE]\n\n";

// A late failure on an OpenAI stream: the error as a data line, then the end.
std::string openai_stream_failure(const ApiError& e) { return sse_data(openai_error_body(e)) + kSseDone; }

}  // namespace

void HttpServer::respond_sse(httplib::Response& res, std::vector<RequestStream> streams, SseReply reply) {
  auto shared_streams = std::make_shared<std::vector<RequestStream>>(std::move(streams));
  auto r = std::make_shared<SseReply>(std::move(reply));
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, shared_streams, r](size_t, httplib::DataSink& sink) {
        std::vector<RequestStream>& streams = *shared_streams;
        std::vector<ChoiceTiming> timings = make_timings(r->prompt_sizes);
        Clock::time_point last_sent = Clock::now();
        auto write = [&sink, &last_sent](const std::string& text) {
          if (text.empty()) return true;
          last_sent = Clock::now();
          return sink.write(text.data(), text.size());
        };
        try {
          if (r->start && !write(r->start())) {
            record_aborted(streams, timings);
            return false;
          }
          const PumpResult result = pump(
              streams, timings, [&](size_t i, RequestOutput& out) { return write(r->on_output(i, out, timings[i])); },
              [&] { return write(r->keepalive()); }, &last_sent);
          if (result != PumpResult::Finished) {
            record_aborted(streams, timings);
            return false;
          }
          if (!write(r->end())) return false;
        } catch (const ApiError& e) {
          write(r->failure(e));
        } catch (const std::exception& e) {
          write(r->failure(internal_error(e.what())));
        }
        sink.done();
        return true;
      },
      [shared_streams](bool) {
        for (RequestStream& s : *shared_streams) s.cancel();
      });
}

void HttpServer::log_unparsed_tool_calls(const OutputParser& parser) const {
  for (const std::string& body : parser.unparsed_tool_calls())
    fmt::print(stderr,
               "spill: warning: the model wrote a tool call that does not read as a {} call (a name and a JSON object "
               "of arguments); returned it as text: {}{}\n",
               tool_call_format_name(parser.format()), dump_json(Json(body)),
               body.size() >= OutputParser::kUnparsedExcerptBytes ? " (cut)" : "");
}

// ---------------------------------------------------------------------------------------------
// POST /v1/chat/completions

void HttpServer::handle_chat(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_json_body(req.body);
  const ChatCompletionRequest r = parse_chat_completion_request(body);
  const RenderedPrompt prompt = render_chat(r.chat);
  std::vector<int32_t> ids = tokenize_prompt(prompt.text, /*add_special=*/false, prompt.input_spans);
  const std::optional<int64_t> max_tokens = fit_context(int64_t(ids.size()), r.gen.max_tokens, "messages");
  t_access_log.prompt_tokens = int64_t(ids.size());

  std::vector<GenerationRequest> requests;
  for (int32_t i = 0; i < r.gen.n; ++i) {
    requests.push_back(make_request(ids, r.gen, i, max_tokens));
    add_template_stops(requests.back(), prompt);
  }
  const std::vector<int64_t> prompt_sizes(size_t(r.gen.n), int64_t(ids.size()));

  struct Choice {
    OutputParser parser;
    ChatDeltaBuilder builder;
    ChatChoiceResult result;
    Json pending_logprobs = Json::array();
    std::optional<RequestFinish> finish;
  };
  struct State {
    ResponseMeta meta;
    std::vector<Choice> choices;
    bool logprobs = false;
    bool include_usage = false;
    bool parallel_tool_calls = true;
    UsageCounts usage() const {
      UsageCounts u;
      for (const Choice& c : choices) {
        if (!c.finish) continue;
        u.prompt_tokens = c.finish->prompt_tokens;
        u.completion_tokens += c.finish->completion_tokens;
        if (&c == &choices.front()) u.cached_tokens = c.finish->cached_tokens;
      }
      return u;
    }
  };
  auto st = std::make_shared<State>();
  st->meta = ResponseMeta{.id = random_id("chatcmpl-"), .created = unix_now(), .model = model_name_};
  st->logprobs = r.gen.logprobs;
  st->include_usage = r.include_usage;
  st->parallel_tool_calls = r.parallel_tool_calls;
  for (int32_t i = 0; i < r.gen.n; ++i) {
    Choice c{.parser = make_parser(prompt), .builder = {}, .result = {}, .pending_logprobs = Json::array(), .finish = {}};
    c.builder.parallel_tool_calls = r.parallel_tool_calls;
    c.result.index = i;
    st->choices.push_back(std::move(c));
  }
  const Tokenizer* tok = engine_->tokenizer();

  // Parses one output of choice i; returns its pieces. On the finish, records it.
  auto take = [this, st, tok](size_t i, RequestOutput& out, const ChoiceTiming& timing) {
    Choice& c = st->choices[i];
    if (st->logprobs)
      for (const SampledToken& t : out.logprobs) c.pending_logprobs.push_back(chat_logprob_entry(*tok, t));
    std::vector<OutputPiece> pieces = c.parser.push(out.text);
    if (out.finish) {
      append_all(pieces, c.parser.finish());
      log_unparsed_tool_calls(c.parser);
      c.finish = *out.finish;
      if (failed(*out.finish)) {
        record_finish(*out.finish, out.finish->reason == FinishReason::Cancelled ? "abort" : "error", timing);
        throw finish_error(*out.finish);
      }
    }
    return pieces;
  };

  std::vector<RequestStream> streams = submit_all(std::move(requests));
  if (!r.stream) {
    auto c = std::make_shared<Collector>();
    c->streams = std::move(streams);
    c->timings = make_timings(prompt_sizes);
    Collector* cp = c.get();
    c->on_output = [this, st, take, cp](size_t i, RequestOutput& out) {
      Choice& ch = st->choices[i];
      append_pieces(ch.result, take(i, out, cp->timings[i]), st->parallel_tool_calls);
      if (out.finish) {
        ch.result.finish_reason = chat_finish_reason(finish_reason_name(out.finish->reason), int(ch.result.tool_calls.size()));
        record_finish(*out.finish, ch.result.finish_reason, cp->timings[i]);
      }
    };
    c->body = [st] {
      std::vector<ChatChoiceResult> results;
      for (Choice& ch : st->choices) {
        if (st->logprobs) ch.result.logprobs = Json{{"content", ch.pending_logprobs}};
        results.push_back(ch.result);
      }
      const UsageCounts usage = st->usage();
      t_access_log.completion_tokens = usage.completion_tokens;
      return chat_completion_response(st->meta, results, usage);
    };
    respond_when_done(res, std::move(c), Flavor::OpenAI);
    return;
  }

  auto chunk = [st](size_t i, Json delta, const std::optional<std::string>& finish) {
    Choice& c = st->choices[i];
    Json lp = nullptr;
    if (st->logprobs && !c.pending_logprobs.empty()) {
      lp = Json{{"content", std::move(c.pending_logprobs)}};
      c.pending_logprobs = Json::array();
    }
    return sse_data(chat_chunk(st->meta, int32_t(i), std::move(delta), finish, std::move(lp), st->include_usage));
  };
  SseReply sse;
  sse.prompt_sizes = prompt_sizes;
  sse.on_output = [this, st, take, chunk](size_t i, RequestOutput& out, const ChoiceTiming& timing) {
    Choice& c = st->choices[i];
    std::string events;
    for (Json& d : c.builder.deltas(take(i, out, timing))) events += chunk(i, std::move(d), std::nullopt);
    if (out.finish) {
      const std::string reason = chat_finish_reason(finish_reason_name(out.finish->reason), c.builder.n_tool_calls());
      record_finish(*out.finish, reason, timing);
      if (auto role = c.builder.role_delta_if_unsent()) events += chunk(i, std::move(*role), std::nullopt);
      events += chunk(i, Json::object(), reason);
    }
    return events;
  };
  // SSE comments are invisible to clients' idle timers; an empty delta is a real chunk (the role
  // delta first, as OpenAI opens every stream with it).
  sse.keepalive = [st, chunk] {
    std::string events;
    for (size_t i = 0; i < st->choices.size(); ++i) {
      Choice& c = st->choices[i];
      if (c.finish) continue;
      std::optional<Json> role = c.builder.role_delta_if_unsent();
      events += chunk(i, role ? std::move(*role) : Json::object(), std::nullopt);
    }
    return events;
  };
  sse.failure = openai_stream_failure;
  sse.end = [st] {
    const UsageCounts usage = st->usage();
    t_access_log.completion_tokens = usage.completion_tokens;
    return (st->include_usage ? sse_data(usage_chunk(st->meta, "chat.completion.chunk", usage)) : "") + kSseDone;
  };
  respond_sse(res, std::move(streams), std::move(sse));
}

// ---------------------------------------------------------------------------------------------
// POST /v1/completions

void HttpServer::handle_completions(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_json_body(req.body);
  const CompletionRequest r = parse_completion_request(body);
  const Tokenizer* tok = engine_->tokenizer();

  std::vector<GenerationRequest> requests;
  std::vector<std::string> echo_text;  // per choice
  std::vector<int64_t> prompt_sizes;   // per choice
  int64_t prompt_tokens = 0;
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    const CompletionPrompt& cp = r.prompts[p];
    std::vector<int32_t> ids = cp.is_tokens ? cp.tokens : tokenize_prompt(cp.text, /*add_special=*/true);
    const std::optional<int64_t> max_tokens = fit_context(int64_t(ids.size()), r.gen.max_tokens, "prompt");
    prompt_tokens += int64_t(ids.size());
    const std::string text = cp.is_tokens ? tok->decode(ids) : cp.text;
    for (int32_t j = 0; j < r.gen.n; ++j) {
      requests.push_back(make_request(ids, r.gen, j, max_tokens));
      echo_text.push_back(r.echo ? text : "");
      prompt_sizes.push_back(int64_t(ids.size()));
    }
  }
  t_access_log.prompt_tokens = prompt_tokens;

  struct Choice {
    CompletionChoiceResult result;
    int64_t echo_bytes = 0;  // logprobs' text_offset counts from the start of the echoed prompt
    int64_t text_bytes = 0;  // for logprobs' text_offset
    std::vector<SampledToken> logprobs;
    std::optional<RequestFinish> finish;
  };
  struct State {
    ResponseMeta meta;
    std::vector<Choice> choices;
    int32_t n = 1;
    bool logprobs = false;
    bool include_usage = false;
    UsageCounts usage() const {
      UsageCounts u;
      for (size_t i = 0; i < choices.size(); ++i) {
        const Choice& c = choices[i];
        if (!c.finish) continue;
        u.completion_tokens += c.finish->completion_tokens;
        if (i % size_t(n) == 0) {  // each prompt counts once
          u.prompt_tokens += c.finish->prompt_tokens;
          u.cached_tokens += c.finish->cached_tokens;
        }
      }
      return u;
    }
  };
  auto st = std::make_shared<State>();
  st->meta = ResponseMeta{.id = random_id("cmpl-"), .created = unix_now(), .model = model_name_};
  st->n = r.gen.n;
  st->logprobs = r.gen.logprobs;
  st->include_usage = r.include_usage;
  for (size_t i = 0; i < requests.size(); ++i) {
    Choice c;
    c.result.index = int32_t(i);
    c.result.text = echo_text[i];
    c.echo_bytes = c.text_bytes = int64_t(echo_text[i].size());
    st->choices.push_back(std::move(c));
  }

  // Returns the logprobs object for this output's tokens (null unless asked) and records them.
  auto take_logprobs = [st, tok](Choice& c, const RequestOutput& out) -> Json {
    if (!st->logprobs) return nullptr;
    Json lp = completion_logprobs(*tok, out.logprobs, c.text_bytes);
    for (const SampledToken& t : out.logprobs) c.logprobs.push_back(t);
    return lp;
  };

  std::vector<RequestStream> streams = submit_all(std::move(requests));
  if (!r.stream) {
    auto c = std::make_shared<Collector>();
    c->streams = std::move(streams);
    c->timings = make_timings(prompt_sizes);
    Collector* cp = c.get();
    c->on_output = [this, st, cp, take_logprobs](size_t i, RequestOutput& out) {
      Choice& ch = st->choices[i];
      (void)take_logprobs(ch, out);
      ch.result.text += out.text;
      ch.text_bytes += int64_t(out.text.size());
      if (out.finish) {
        ch.finish = *out.finish;
        if (failed(*out.finish)) {
          record_finish(*out.finish, out.finish->reason == FinishReason::Cancelled ? "abort" : "error", cp->timings[i]);
          throw finish_error(*out.finish);
        }
        ch.result.finish_reason = finish_reason_name(out.finish->reason);
        record_finish(*out.finish, ch.result.finish_reason, cp->timings[i]);
      }
    };
    c->body = [st, tok] {
      std::vector<CompletionChoiceResult> results;
      for (Choice& ch : st->choices) {
        if (st->logprobs) ch.result.logprobs = completion_logprobs(*tok, ch.logprobs, ch.echo_bytes);
        results.push_back(ch.result);
      }
      const UsageCounts usage = st->usage();
      t_access_log.completion_tokens = usage.completion_tokens;
      return completion_response(st->meta, results, usage);
    };
    respond_when_done(res, std::move(c), Flavor::OpenAI);
    return;
  }

  auto chunk = [st](size_t i, const std::string& text, const std::optional<std::string>& finish, Json lp) {
    return sse_data(completion_chunk(st->meta, int32_t(i), text, finish, std::move(lp), st->include_usage));
  };
  SseReply sse;
  sse.prompt_sizes = prompt_sizes;
  sse.start = [st, chunk] {  // the echoed prompts
    std::string events;
    for (size_t i = 0; i < st->choices.size(); ++i)
      if (!st->choices[i].result.text.empty()) events += chunk(i, st->choices[i].result.text, std::nullopt, nullptr);
    return events;
  };
  sse.on_output = [this, st, take_logprobs, chunk](size_t i, RequestOutput& out, const ChoiceTiming& timing) {
    Choice& c = st->choices[i];
    Json lp = take_logprobs(c, out);
    c.text_bytes += int64_t(out.text.size());
    std::string events;
    if (!out.text.empty() || !lp.is_null()) events += chunk(i, out.text, std::nullopt, std::move(lp));
    if (out.finish) {
      c.finish = *out.finish;
      if (failed(*out.finish)) {
        record_finish(*out.finish, out.finish->reason == FinishReason::Cancelled ? "abort" : "error", timing);
        throw finish_error(*out.finish);
      }
      const std::string reason = finish_reason_name(out.finish->reason);
      record_finish(*out.finish, reason, timing);
      events += chunk(i, "", reason, nullptr);
    }
    return events;
  };
  sse.keepalive = [st, chunk] {  // an empty text chunk per unfinished choice
    std::string events;
    for (size_t i = 0; i < st->choices.size(); ++i)
      if (!st->choices[i].finish) events += chunk(i, "", std::nullopt, nullptr);
    return events;
  };
  sse.failure = openai_stream_failure;
  sse.end = [st] {
    const UsageCounts usage = st->usage();
    t_access_log.completion_tokens = usage.completion_tokens;
    return (st->include_usage ? sse_data(usage_chunk(st->meta, "text_completion", usage)) : "") + kSseDone;
  };
  respond_sse(res, std::move(streams), std::move(sse));
}

// ---------------------------------------------------------------------------------------------
// POST /v1/messages (Anthropic)

void HttpServer::handle_messages(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_json_body(req.body);
  const MessagesRequest r = parse_messages_request(body);
  const RenderedPrompt prompt = render_chat(r.chat, r.assistant_prefill);
  std::vector<int32_t> ids = tokenize_prompt(prompt.text, /*add_special=*/false, prompt.input_spans);
  const std::optional<int64_t> max_tokens = fit_context(int64_t(ids.size()), r.gen.max_tokens, "messages");
  t_access_log.prompt_tokens = int64_t(ids.size());
  const int64_t n_prompt = int64_t(ids.size());

  struct State {
    std::string id;
    std::string model;
    OutputParser parser;
    std::optional<RequestFinish> finish;
  };
  auto st = std::make_shared<State>(State{.id = random_id("msg_"),
                                          .model = r.model.empty() ? model_name_ : r.model,
                                          .parser = make_parser(prompt),
                                          .finish = {}});
  const bool single_tool_call = r.single_tool_call;
  auto take = [this, st](RequestOutput& out, const ChoiceTiming& timing) {
    std::vector<OutputPiece> pieces = st->parser.push(out.text);
    if (out.finish) {
      append_all(pieces, st->parser.finish());
      log_unparsed_tool_calls(st->parser);
      st->finish = *out.finish;
      if (failed(*out.finish)) {
        record_finish(*out.finish, out.finish->reason == FinishReason::Cancelled ? "abort" : "error", timing);
        throw finish_error(*out.finish);
      }
    }
    return pieces;
  };
  // stop_sequence names the client's stop strings only; the template's end-of-turn is end_turn.
  auto client_stop = [stops = r.gen.stop](const RequestFinish& f) -> std::optional<std::string> {
    if (f.stop_string && std::find(stops.begin(), stops.end(), *f.stop_string) != stops.end()) return f.stop_string;
    return std::nullopt;
  };
  auto usage_of = [](const RequestFinish& f) {
    return UsageCounts{.prompt_tokens = f.prompt_tokens, .completion_tokens = f.completion_tokens, .cached_tokens = f.cached_tokens};
  };

  std::vector<GenerationRequest> requests;
  requests.push_back(make_request(std::move(ids), r.gen, 0, max_tokens));
  add_template_stops(requests.back(), prompt);
  std::vector<RequestStream> streams = submit_all(std::move(requests));

  if (!r.stream) {
    auto c = std::make_shared<Collector>();
    c->streams = std::move(streams);
    c->timings = make_timings({n_prompt});
    auto content = std::make_shared<MessageContentBuilder>();
    content->single_tool_call = single_tool_call;
    Collector* cp = c.get();
    c->on_output = [this, take, content, cp, st](size_t, RequestOutput& out) {
      content->add(take(out, cp->timings[0]));
      if (out.finish) {
        const std::string reason = chat_finish_reason(finish_reason_name(out.finish->reason), content->n_tool_calls());
        record_finish(*out.finish, reason, cp->timings[0]);
      }
    };
    c->body = [st, content, usage_of, client_stop] {
      const RequestFinish& f = *st->finish;
      t_access_log.completion_tokens = f.completion_tokens;
      const std::optional<std::string> stop_sequence = client_stop(f);
      const std::string stop_reason =
          anthropic_stop_reason(finish_reason_name(f.reason), stop_sequence.has_value(), content->n_tool_calls());
      return messages_response(st->id, st->model, content->content, stop_reason, stop_sequence, usage_of(f));
    };
    respond_when_done(res, std::move(c), Flavor::Anthropic);
    return;
  }

  auto writer = std::make_shared<MessagesStreamWriter>(st->id, st->model);
  writer->single_tool_call = single_tool_call;
  SseReply sse;
  sse.prompt_sizes = {n_prompt};
  sse.start = [writer, n_prompt] { return writer->start(n_prompt); };
  sse.on_output = [this, writer, take, usage_of, client_stop](size_t, RequestOutput& out, const ChoiceTiming& timing) {
    std::string events = writer->add(take(out, timing));
    if (out.finish) {
      const RequestFinish& f = *out.finish;
      const std::string reason = chat_finish_reason(finish_reason_name(f.reason), writer->n_tool_calls());
      record_finish(f, reason, timing);
      t_access_log.completion_tokens = f.completion_tokens;
      const std::optional<std::string> stop_sequence = client_stop(f);
      const std::string stop_reason =
          anthropic_stop_reason(finish_reason_name(f.reason), stop_sequence.has_value(), writer->n_tool_calls());
      events += writer->finish(stop_reason, stop_sequence, usage_of(f));
    }
    return events;
  };
  sse.keepalive = [] { return MessagesStreamWriter::ping(); };  // Anthropic's own keep-alive event
  sse.failure = [](const ApiError& e) { return MessagesStreamWriter::error(e); };
  sse.end = [] { return std::string(); };  // message_stop went out with the finish
  respond_sse(res, std::move(streams), std::move(sse));
}

void HttpServer::handle_count_tokens(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_json_body(req.body);
  const MessagesRequest r = parse_count_tokens_request(body);
  const RenderedPrompt prompt = render_chat(r.chat, r.assistant_prefill);
  const std::vector<int32_t> ids = tokenize_prompt(prompt.text, /*add_special=*/false, prompt.input_spans);
  send_json(res, 200, Json{{"input_tokens", ids.size()}});
}

// ---------------------------------------------------------------------------------------------
// POST /v1/responses (OpenAI Responses API)

void HttpServer::handle_responses(const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_json_body(req.body);
  ResponsesRequest r = parse_responses_request(body);
  Json history = Json::array();  // the conversation before this input, as chat messages
  if (r.previous_response_id) {
    const auto previous = responses_.get(*r.previous_response_id);
    if (!previous)
      throw ApiError{.status = 404,
                     .message = fmt::format("Previous response with id '{}' not found (spill keeps the newest {} stored "
                                            "responses; --responses-store)",
                                            *r.previous_response_id, options_.responses_store),
                     .param = "previous_response_id",
                     .code = "previous_response_not_found"};
    history = previous->conversation;
    prepend_conversation(r, history);
  }
  for (const Json& m : r.input_messages) history.push_back(m);
  if (r.chat.messages.empty()) invalid_field("input", "holds no item");
  const RenderedPrompt prompt = render_chat(r.chat);
  std::vector<int32_t> ids = tokenize_prompt(prompt.text, /*add_special=*/false, prompt.input_spans);
  const int64_t n_prompt = int64_t(ids.size());
  const std::optional<int64_t> max_tokens = fit_context(n_prompt, r.gen.max_tokens, "input");
  t_access_log.prompt_tokens = n_prompt;

  struct State {
    std::string id;
    int64_t created_at = 0;
    std::string model;
    ResponsesRequest request;
    Json history;
    OutputParser parser;
    ResponseOutputBuilder builder;
    std::optional<RequestFinish> finish;
  };
  const std::string id = random_id("resp_");
  auto st = std::make_shared<State>(State{.id = id,
                                          .created_at = unix_now(),
                                          .model = r.model.empty() ? model_name_ : r.model,
                                          .request = r,
                                          .history = std::move(history),
                                          .parser = make_parser(prompt),
                                          .builder = ResponseOutputBuilder(id),
                                          .finish = {}});
  st->builder.parallel_tool_calls = r.parallel_tool_calls;

  // New output of the one stream: its events; on the finish, closes the last item and records it.
  auto take = [this, st](RequestOutput& out, const ChoiceTiming& timing) {
    std::vector<OutputPiece> pieces = st->parser.push(out.text);
    if (out.finish) append_all(pieces, st->parser.finish());
    std::string events = st->builder.add(pieces);
    if (out.finish) {
      log_unparsed_tool_calls(st->parser);
      st->finish = *out.finish;
      if (failed(*out.finish)) {
        record_finish(*out.finish, out.finish->reason == FinishReason::Cancelled ? "abort" : "error", timing);
        throw finish_error(*out.finish);
      }
      events += st->builder.close();
      record_finish(*out.finish, chat_finish_reason(finish_reason_name(out.finish->reason), st->builder.n_tool_calls()),
                    timing);
    }
    return events;
  };
  // The final response object; stored for previous_response_id unless the client said store: false.
  auto final_response = [this, st]() {
    const RequestFinish& f = *st->finish;
    ResponseStatus status;
    if (f.reason == FinishReason::Length && st->builder.n_tool_calls() == 0) {
      status.status = "incomplete";
      status.incomplete_reason = "max_output_tokens";
    }
    const UsageCounts usage{.prompt_tokens = f.prompt_tokens, .completion_tokens = f.completion_tokens, .cached_tokens = f.cached_tokens};
    t_access_log.completion_tokens = f.completion_tokens;
    const int64_t reasoning_tokens =
        st->builder.reasoning_text().empty() ? 0 : int64_t(tokenize_prompt(st->builder.reasoning_text(), false).size());
    Json response = response_object(st->id, st->created_at, st->model, st->request, st->builder.output(), status, usage,
                                    std::min(reasoning_tokens, f.completion_tokens));
    if (st->request.store) {
      Json conversation = st->history;
      for (const Json& m : st->builder.as_chat_messages()) conversation.push_back(m);
      responses_.put(st->id, ResponseStore::Entry{.response = response, .conversation = std::move(conversation), .bytes = 0});
    }
    return response;
  };
  auto in_progress = [st] {
    return response_object(st->id, st->created_at, st->model, st->request, st->builder.output(),
                           ResponseStatus{.status = "in_progress", .incomplete_reason = {}}, std::nullopt, 0);
  };

  std::vector<GenerationRequest> requests;
  requests.push_back(make_request(std::move(ids), r.gen, 0, max_tokens));
  add_template_stops(requests.back(), prompt);
  std::vector<RequestStream> streams = submit_all(std::move(requests));

  if (!r.stream) {
    auto c = std::make_shared<Collector>();
    c->streams = std::move(streams);
    c->timings = make_timings({n_prompt});
    Collector* cp = c.get();
    c->on_output = [take, cp](size_t, RequestOutput& out) { (void)take(out, cp->timings[0]); };
    c->body = final_response;
    respond_when_done(res, std::move(c), Flavor::OpenAI);
    return;
  }

  SseReply sse;
  sse.prompt_sizes = {n_prompt};
  sse.start = [st, in_progress] {
    std::string events = st->builder.event("response.created", Json{{"response", in_progress()}});
    events += st->builder.event("response.in_progress", Json{{"response", in_progress()}});
    return events;
  };
  sse.on_output = [take](size_t, RequestOutput& out, const ChoiceTiming& timing) { return take(out, timing); };
  // A typed event, which clients' idle timers see (Codex resets its stream timeout on each).
  sse.keepalive = [st, in_progress] { return st->builder.event("response.in_progress", Json{{"response", in_progress()}}); };
  sse.failure = [st, in_progress](const ApiError& e) {
    Json failed_response = in_progress();
    failed_response["status"] = "failed";
    failed_response["error"] = Json{{"code", e.status >= 500 ? "server_error" : "invalid_request"}, {"message", e.message}};
    std::string events = st->builder.event("error", Json{{"code", e.code.empty() ? Json(nullptr) : Json(e.code)},
                                                         {"message", e.message},
                                                         {"param", e.param.empty() ? Json(nullptr) : Json(e.param)}});
    events += st->builder.event("response.failed", Json{{"response", std::move(failed_response)}});
    return events;
  };
  sse.end = [st, final_response] {
    Json response = final_response();
    const std::string type = response["status"] == "incomplete" ? "response.incomplete" : "response.completed";
    return st->builder.event(type, Json{{"response", std::move(response)}});
  };
  respond_sse(res, std::move(streams), std::move(sse));
}

// ---------------------------------------------------------------------------------------------

namespace {
sigset_t shutdown_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}
}  // namespace

void block_shutdown_signals() {
  const sigset_t signals = shutdown_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int serve(const ServerOptions& options) {
  if (options.port < 0 || options.port > 65535) fail("--port must be in [0, 65535], got {}", options.port);
  if (options.max_body_bytes < 1024) fail("--max-body-bytes must be at least 1024, got {}", options.max_body_bytes);
  if (!(options.ping_interval_s >= 0.01 && options.ping_interval_s <= 3600))
    fail("--ping-interval must be between 0.01 and 3600 seconds, got {}", options.ping_interval_s);

  // Signals go to one thread that stops the server cleanly; every other thread (httplib's
  // workers, the loader, the engine) inherits the blocked mask.
  sigset_t signals = shutdown_signals();
  block_shutdown_signals();
  ::signal(SIGPIPE, SIG_IGN);  // a client that vanished mid-write is an error return, not a signal

  auto server = std::make_unique<HttpServer>(options);
  std::atomic<bool> finished{false};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (!finished) {
      fmt::print(stderr, "spill: {} received, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      server->request_stop();
    }
  });
  const int code = server->run();
  finished = true;
  pthread_kill(signal_thread.native_handle(), SIGTERM);  // wake sigwait if no signal came
  signal_thread.join();
  server.reset();
  pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
  return code;
}

}  // namespace spill::server
