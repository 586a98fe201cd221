#include "engine/engine.h"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "engine/block_manager.h"
#include "engine/stop_strings.h"
#include "model/model.h"
#include "model/runner.h"

namespace spill {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

uint64_t mix_seed(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

namespace detail {

// The engine thread's state of one request. The Sequence part is what the scheduler sees.
struct ActiveRequest : Sequence {
  ActiveRequest(const SamplingParams& sampling, std::span<const int32_t> prompt, uint64_t fallback_seed)
      : sampler(sampling, prompt, fallback_seed) {}

  std::shared_ptr<detail::RequestChannel> channel;
  SequenceSampler sampler;
  std::optional<StreamDecoder> decoder;  // when the engine has a tokenizer
  StopStringMatcher stops;
  std::vector<int32_t> stop_tokens;  // EOS ids (unless ignore_eos) and the request's stop ids
  std::optional<int64_t> max_tokens;
  bool want_logprobs = false;

  Clock::time_point submitted;
  std::optional<Clock::time_point> first_scheduled, first_token;
};

// Why a request ended.
struct FinishCause {
  FinishReason reason = FinishReason::Stop;
  std::string error{};
  std::optional<std::string> stop_string{};
  std::optional<int32_t> stop_token{};
};

// What client threads and the engine thread share. Everything here is guarded by mutex.
struct EngineInbox {
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<std::unique_ptr<ActiveRequest>> submitted;  // not yet taken by the engine thread
  std::vector<uint64_t> cancels;
  bool stopping = false;  // the destructor asked the thread to end
  bool stopped = false;   // the thread has ended (or is ending): submit() refuses
  std::string stopped_why;
  int64_t engine_waiting = 0;  // the scheduler's waiting queue, as of the last step
  uint64_t next_id = 1;
  int64_t submitted_count = 0, rejected_count = 0;
};

}  // namespace detail

using detail::ActiveRequest;
using detail::EngineInbox;
using detail::FinishCause;

struct Engine::Impl {
  Impl(EngineParts parts, const EngineConfig& config, int64_t max_model_len)
      : model(std::move(parts.model)),
        runner(std::move(parts.runner)),
        spec(runner->spec()),
        tokenizer(std::move(parts.tokenizer)),
        config(config),
        max_model_len(max_model_len),
        blocks({.n_blocks = runner->kv_config().n_blocks,
                .block_size = runner->kv_config().block_size,
                .prefix_caching = config.prefix_caching,
                .group_windows = runner->kv_config().group_windows}),
        scheduler(config.scheduler, blocks),
        inbox(std::make_shared<EngineInbox>()),
        engine_seed(config.seed ? *config.seed : (uint64_t(std::random_device{}()) << 32 | std::random_device{}())) {
    publish_metrics();
  }

  void run();
  bool drain_inbox();
  void step();
  void handle_token(ActiveRequest& req, SampledRow& row);
  void emit(ActiveRequest& req, RequestOutput&& out);
  void finish(ActiveRequest& req, RequestOutput&& out, FinishCause cause);
  void flush_text(ActiveRequest& req, RequestOutput& out);
  void finish_everything(FinishReason reason, const std::string& why);
  void publish_metrics();

  // Declared first so that it is destroyed last: the runner reads its weights.
  std::unique_ptr<const Model> model;
  std::unique_ptr<ModelRunner> runner;
  const ModelSpec& spec;
  std::optional<Tokenizer> tokenizer;
  EngineConfig config;
  int64_t max_model_len;

  // Engine-thread state.
  BlockManager blocks;
  Scheduler scheduler;
  std::unordered_map<uint64_t, std::unique_ptr<ActiveRequest>> live;
  StepPlan plan;
  std::vector<SequenceSampler*> samplers;  // logit row r's sampler, rebuilt every step
  StepResult sampled;
  int64_t generated_tokens = 0, finished_count = 0, cancelled_count = 0, failed_count = 0;
  ExpertTraffic experts;  // runner->expert_traffic(), read on this thread between steps

  std::shared_ptr<EngineInbox> inbox;
  const uint64_t engine_seed;

  mutable std::mutex metrics_mutex;
  EngineMetrics metrics;  // the last published snapshot

  std::thread thread;
};

// ---- construction and submission (client threads) -----------------------------------------

Engine::Engine(EngineParts parts, const EngineConfig& config) {
  if (!parts.runner) fail("engine: no model runner given");
  spec_ = parts.runner->spec();
  runner_description_ = parts.runner->describe();
  tokenizer_ = parts.tokenizer;
  config.scheduler.validate();
  if (config.max_waiting < 1)
    fail("engine: the waiting-queue limit (--max-waiting) must be at least 1, got {}", config.max_waiting);
  // The runner sized its buffers for its limits; the scheduler must never plan beyond them.
  const RunnerLimits& limits = parts.runner->limits();
  if (config.scheduler.max_running > limits.max_seqs)
    fail("engine: --max-seqs {} is more than the model runner was built for ({}); build it with the same --max-seqs",
         config.scheduler.max_running, limits.max_seqs);
  if (config.scheduler.max_batch_tokens > limits.max_batch_tokens)
    fail(
        "engine: --max-batch-tokens {} is more than the model runner was built for ({}); build it with the same "
        "--max-batch-tokens",
        config.scheduler.max_batch_tokens, limits.max_batch_tokens);
  const KvCacheConfig kv = parts.runner->kv_config();
  const int64_t capacity = kv.pool_tokens();  // the longest sequence the pool holds alone
  if (config.max_model_len < 0) fail("engine: --max-model-len must be positive, got {}", config.max_model_len);
  if (config.max_model_len > capacity)
    fail(
        "engine: --max-model-len {} needs {} KV blocks of {} tokens, but the pool has {} ({} tokens); give more KV "
        "memory (--kv-blocks / --kv-mem) or lower --max-model-len",
        config.max_model_len, kv_blocks_for_sequence(kv.group_windows, config.max_model_len, kv.block_size),
        kv.block_size, kv.n_blocks, capacity);
  if (config.max_model_len > limits.max_model_len)
    fail("engine: --max-model-len {} is more than the model runner was built for ({}); build it with the same "
         "--max-model-len",
         config.max_model_len, limits.max_model_len);
  // One sequence alone must always fit in the pool, or it could be preempted forever.
  max_model_len_ = config.max_model_len > 0 ? config.max_model_len : std::min(capacity, limits.max_model_len);
  impl_ = std::make_unique<Impl>(std::move(parts), config, max_model_len_);
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(impl_->inbox->mutex);
    impl_->inbox->stopping = true;
  }
  impl_->inbox->wake.notify_all();
  impl_->thread.join();
}

void Engine::validate_request(const GenerationRequest& request) const {
  const int64_t n_prompt = int64_t(request.prompt.size());
  if (n_prompt == 0) fail("request: the prompt is empty; give at least one token");
  for (size_t i = 0; i < request.prompt.size(); ++i)
    if (request.prompt[i] < 0 || request.prompt[i] >= spec_.vocab_size)
      fail("request: prompt token {} is id {}, outside the model's vocabulary of {}", i, request.prompt[i],
           spec_.vocab_size);
  if (n_prompt > max_model_len_)
    fail(
        "request: the prompt has {} tokens, more than the context limit of {} tokens (the model's context is {}, the "
        "KV cache holds {}); shorten the prompt, or give the engine more KV memory (--kv-blocks / --kv-mem)",
        n_prompt, max_model_len_, spec_.max_position_embeddings, impl_->runner->kv_config().pool_tokens());
  if (request.max_tokens && *request.max_tokens < 1)
    fail("request: max_tokens must be at least 1, got {}", *request.max_tokens);
  try {
    request.sampling.validate();
  } catch (const Error& e) {
    fail("request: {}", e.what());
  }
  for (const std::string& s : request.stop)
    if (s.empty()) fail("request: stop strings must not be empty");
  if (!request.stop.empty() && !tokenizer_)
    fail(
        "request: stop strings need a tokenizer, and this engine has none (give the model a tokenizer.json, or use "
        "stop_token_ids)");
}

RequestStream Engine::submit(GenerationRequest request) {
  Impl& im = *impl_;
  try {
    validate_request(request);
  } catch (const Error&) {
    std::lock_guard lock(im.inbox->mutex);
    ++im.inbox->rejected_count;
    throw;
  }
  const int64_t n_prompt = int64_t(request.prompt.size());

  uint64_t id;
  {
    std::lock_guard lock(im.inbox->mutex);
    id = im.inbox->next_id++;
  }
  auto req = std::make_unique<ActiveRequest>(request.sampling, request.prompt, mix_seed(im.engine_seed ^ id));
  req->id = id;
  req->n_prompt = n_prompt;
  req->tokens = std::move(request.prompt);
  req->cache_salt = request.cache_salt;
  req->max_tokens = request.max_tokens;
  req->want_logprobs = request.sampling.logprobs;
  if (tokenizer_) req->decoder.emplace(*tokenizer_, request.skip_special_tokens);
  req->stops = StopStringMatcher(std::move(request.stop));
  if (!request.ignore_eos) req->stop_tokens = spec_.eos_token_ids;
  req->stop_tokens.insert(req->stop_tokens.end(), request.stop_token_ids.begin(), request.stop_token_ids.end());
  req->submitted = Clock::now();
  req->channel = std::make_shared<detail::RequestChannel>();
  req->channel->id = id;
  req->channel->request_cancel = [weak = std::weak_ptr<EngineInbox>(im.inbox), id] {
    if (auto inbox = weak.lock()) {
      {
        std::lock_guard lock(inbox->mutex);
        if (inbox->stopped) return;
        inbox->cancels.push_back(id);
      }
      inbox->wake.notify_all();
    }
  };
  RequestStream stream(req->channel);
  {
    std::lock_guard lock(im.inbox->mutex);
    EngineInbox& in = *im.inbox;
    if (in.stopped) {
      ++in.rejected_count;
      throw EngineStoppedError(fmt::format("engine: stopped{}; no new requests are accepted",
                                           in.stopped_why.empty() ? "" : " (" + in.stopped_why + ")"));
    }
    const int64_t queued = int64_t(in.submitted.size()) + in.engine_waiting;
    if (queued >= im.config.max_waiting) {
      ++in.rejected_count;
      throw QueueFullError(
          fmt::format("engine: the waiting queue is full ({} requests, limit --max-waiting {}); retry later", queued,
                      im.config.max_waiting));
    }
    ++in.submitted_count;
    in.submitted.push_back(std::move(req));
  }
  im.inbox->wake.notify_all();
  return stream;
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  {
    std::lock_guard lock(impl_->metrics_mutex);
    m = impl_->metrics;
  }
  std::lock_guard lock(impl_->inbox->mutex);
  m.waiting = impl_->inbox->engine_waiting + int64_t(impl_->inbox->submitted.size());
  m.requests_submitted = impl_->inbox->submitted_count;
  m.requests_rejected = impl_->inbox->rejected_count;
  return m;
}

// ---- the engine thread ---------------------------------------------------------------------

void Engine::Impl::run() {
  std::string fatal;
  try {
    // The runner's expert gauges (where its experts live) before the first step.
    experts = runner->expert_traffic();
    publish_metrics();
    while (drain_inbox()) {
      if (scheduler.running().empty() && scheduler.waiting().empty()) continue;
      step();
    }
  } catch (const DeviceFatalError& e) {
    // The runner's device is gone: no later step can run, so nobody waits for one.
    fatal = std::string("engine stopped: the model runner's device failed: ") + e.what();
  } catch (const std::exception& e) {
    // A bug, not a request's fault: every open request learns why, and the engine refuses more.
    fatal = std::string("engine stopped after an internal error: ") + e.what();
  }
  finish_everything(fatal.empty() ? FinishReason::Cancelled : FinishReason::Error,
                    fatal.empty() ? "engine shut down" : fatal);
}

// Takes new requests and cancellations; waits for some when there is nothing to run. Returns
// false when the engine is to stop.
bool Engine::Impl::drain_inbox() {
  std::vector<std::unique_ptr<ActiveRequest>> arrived;
  std::vector<uint64_t> cancels;
  {
    std::unique_lock lock(inbox->mutex);
    const bool idle = scheduler.running().empty() && scheduler.waiting().empty();
    if (idle)
      inbox->wake.wait(lock, [&] { return inbox->stopping || !inbox->submitted.empty() || !inbox->cancels.empty(); });
    if (inbox->stopping) return false;
    arrived.swap(inbox->submitted);
    cancels.swap(inbox->cancels);
    // They are about to join the waiting queue; count them there already, so that the queue
    // limit and metrics() never miss them in between.
    inbox->engine_waiting += int64_t(arrived.size());
  }
  for (auto& req : arrived) {
    ActiveRequest* r = req.get();
    live.emplace(r->id, std::move(req));
    scheduler.enqueue(r);
  }
  for (uint64_t id : cancels) {
    auto it = live.find(id);
    if (it == live.end()) continue;  // already finished
    RequestOutput out;
    flush_text(*it->second, out);
    finish(*it->second, std::move(out), {.reason = FinishReason::Cancelled});
  }
  if (!arrived.empty() || !cancels.empty()) publish_metrics();
  return true;
}

void Engine::Impl::step() {
  scheduler.plan(plan);
  const Clock::time_point now = Clock::now();
  for (Sequence* s : plan.chunk_seqs) {
    auto* req = static_cast<ActiveRequest*>(s);
    if (!req->first_scheduled) req->first_scheduled = now;
  }
  if (plan.empty()) {
    // Cannot happen while max_model_len fits the pool (a sequence alone always fits); failing
    // the head of the queue beats spinning forever if it ever does.
    if (!scheduler.waiting().empty()) {
      auto* req = static_cast<ActiveRequest*>(scheduler.waiting().front());
      finish(*req, {},
             {.reason = FinishReason::Error,
              .error = "engine: the request could not be scheduled even alone (internal error)"});
    }
    return;
  }
  samplers.clear();
  for (Sequence* s : plan.logit_seqs) samplers.push_back(&static_cast<ActiveRequest*>(s)->sampler);
  try {
    runner->forward_sample(plan.batch, samplers, sampled, config.observer);
  } catch (const DeviceFatalError&) {
    throw;  // ends the engine (run()): every open request, running or waiting, gets the error
  } catch (const std::exception& e) {
    experts = runner->expert_traffic();
    // The step's KV writes are incomplete; those sequences cannot continue. Others are intact:
    // a step only writes the blocks of its own chunks.
    const std::string why = std::string("the model's forward failed: ") + e.what();
    std::vector<ActiveRequest*> failed;
    for (Sequence* s : plan.chunk_seqs) failed.push_back(static_cast<ActiveRequest*>(s));
    for (ActiveRequest* req : failed) finish(*req, {}, {.reason = FinishReason::Error, .error = why});
    publish_metrics();
    return;
  }
  experts = runner->expert_traffic();
  scheduler.commit(plan);
  // Before any token reaches a client, so that what a client sees never runs ahead of metrics().
  publish_metrics();
  if (sampled.rows.size() != plan.logit_seqs.size())
    throw std::logic_error(fmt::format("the runner returned {} sampled rows for {} sequences", sampled.rows.size(),
                                       plan.logit_seqs.size()));
  for (size_t r = 0; r < plan.logit_seqs.size(); ++r)
    handle_token(*static_cast<ActiveRequest*>(plan.logit_seqs[r]), sampled.rows[r]);
  publish_metrics();
  if (config.on_step) config.on_step(plan.trace);
}

// Takes the token the runner sampled for req, streams it, and ends the request if a stop
// condition is met. A row with nothing to sample fails this request only.
void Engine::Impl::handle_token(ActiveRequest& req, SampledRow& row) {
  if (!row.ok()) {
    finish(req, {}, {.reason = FinishReason::Error, .error = row.error});
    return;
  }
  SampledToken& picked = row.sampled;
  const int32_t token = picked.token;
  if (token < 0 || token >= spec.vocab_size) {
    finish(req, {},
           {.reason = FinishReason::Error,
            .error = fmt::format("the model runner sampled token id {}, outside the vocabulary of {} (internal error)",
                                 token, spec.vocab_size)});
    return;
  }
  req.tokens.push_back(token);
  ++generated_tokens;
  if (!req.first_token) req.first_token = Clock::now();

  RequestOutput out;
  out.token_ids.push_back(token);
  if (req.want_logprobs) out.logprobs.push_back(std::move(picked));

  const bool is_stop_token = std::find(req.stop_tokens.begin(), req.stop_tokens.end(), token) != req.stop_tokens.end();
  if (is_stop_token) {
    // The stop token is reported as a token but its text is not part of the output.
    flush_text(req, out);
    finish(req, std::move(out), {.reason = FinishReason::Stop, .stop_token = token});
    return;
  }
  if (req.decoder) {
    StopStringMatcher::Result r = req.stops.push(req.decoder->push(token));
    out.text = std::move(r.text);
    if (r.matched) {
      finish(req, std::move(out), {.reason = FinishReason::Stop, .stop_string = std::move(r.matched)});
      return;
    }
  }
  // The next step would compute this token at position n_tokens - 1, which must be inside the
  // context limit (and so inside the KV pool).
  const bool out_of_tokens = req.max_tokens && req.n_generated() >= *req.max_tokens;
  const bool out_of_context = req.n_tokens() > max_model_len;
  if (out_of_tokens || out_of_context) {
    flush_text(req, out);
    finish(req, std::move(out), {.reason = FinishReason::Length});
    return;
  }
  emit(req, std::move(out));
}

// Releases text held back by the detokenizer (an unfinished character) and the stop matcher.
void Engine::Impl::flush_text(ActiveRequest& req, RequestOutput& out) {
  if (!req.decoder) return;
  StopStringMatcher::Result r = req.stops.push(req.decoder->finish());
  out.text += r.text;
  if (!r.matched) out.text += req.stops.flush();
}

void Engine::Impl::emit(ActiveRequest& req, RequestOutput&& out) {
  detail::RequestChannel& c = *req.channel;
  {
    std::lock_guard lock(c.mutex);
    c.pending.append(std::move(out));
  }
  c.changed.notify_all();
}

// Ends a request: its blocks go back to the pool first, then the client gets the finish.
void Engine::Impl::finish(ActiveRequest& req, RequestOutput&& out, FinishCause cause) {
  scheduler.remove(&req);
  const Clock::time_point now = Clock::now();
  const FinishReason reason = cause.reason;
  RequestFinish f;
  f.reason = reason;
  f.error = std::move(cause.error);
  f.stop_string = std::move(cause.stop_string);
  f.stop_token = cause.stop_token;
  f.prompt_tokens = req.n_prompt;
  f.completion_tokens = req.n_generated();
  f.cached_tokens = std::max<int64_t>(0, req.cached_tokens);
  f.preemptions = req.preemptions;
  f.timings.queue_ms =
      req.first_scheduled ? ms_between(req.submitted, *req.first_scheduled) : ms_between(req.submitted, now);
  f.timings.ttft_ms = req.first_token ? ms_between(req.submitted, *req.first_token) : -1.0;
  f.timings.total_ms = ms_between(req.submitted, now);
  out.finish = std::move(f);
  ++finished_count;
  if (reason == FinishReason::Cancelled) ++cancelled_count;
  if (reason == FinishReason::Error) ++failed_count;
  publish_metrics();
  emit(req, std::move(out));
  live.erase(req.id);  // req is gone after this line
}

void Engine::Impl::finish_everything(FinishReason reason, const std::string& why) {
  std::vector<std::unique_ptr<ActiveRequest>> arrived;
  {
    std::lock_guard lock(inbox->mutex);
    inbox->stopped = true;
    inbox->stopped_why = why;
    arrived.swap(inbox->submitted);
    inbox->cancels.clear();
  }
  for (auto& req : arrived) {
    ActiveRequest* r = req.get();
    live.emplace(r->id, std::move(req));
    scheduler.enqueue(r);
  }
  std::vector<ActiveRequest*> open;
  for (auto& [id, req] : live) open.push_back(req.get());
  std::sort(open.begin(), open.end(), [](auto* a, auto* b) { return a->id < b->id; });
  for (ActiveRequest* req : open) {
    RequestOutput out;
    flush_text(*req, out);
    finish(*req, std::move(out), {.reason = reason, .error = why});
  }
}

void Engine::Impl::publish_metrics() {
  const BlockManagerStats bs = blocks.stats();
  const SchedulerCounters& sc = scheduler.counters();
  EngineMetrics m;
  m.running = int64_t(scheduler.running().size());
  m.waiting = int64_t(scheduler.waiting().size());
  m.kv_block_size = blocks.block_size();
  m.kv_blocks_total = bs.n_blocks;
  m.kv_blocks_in_use = bs.in_use;
  m.kv_blocks_cached = bs.cached;
  m.kv_blocks_free = bs.free;
  m.prefix_query_tokens = sc.prefix_query_tokens;
  m.prefix_hit_tokens = sc.prefix_hit_tokens;
  m.steps = sc.steps;
  m.preemptions = sc.preemptions;
  m.computed_tokens = sc.computed_tokens;
  m.generated_tokens = generated_tokens;
  m.requests_finished = finished_count;
  m.requests_cancelled = cancelled_count;
  m.requests_failed = failed_count;
  m.experts = experts;
  {
    std::lock_guard lock(metrics_mutex);
    metrics = m;
  }
  std::lock_guard lock(inbox->mutex);
  inbox->engine_waiting = m.waiting;
}

}  // namespace spill
