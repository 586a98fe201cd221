#include "bench/client.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace spill::bench {

using json = nlohmann::json;

namespace {

// "http://h:p/v1/" -> ("http://h:p", ""); "http://h:p/proxy/v1" -> ("http://h:p", "/proxy").
std::pair<std::string, std::string> split_url(const std::string& url) {
  size_t scheme = url.find("://");
  if (scheme == std::string::npos || (url.substr(0, scheme) != "http" && url.substr(0, scheme) != "https"))
    fail("bench: '{}' is not an http:// or https:// URL (e.g. http://127.0.0.1:8080)", url);
  size_t path = url.find('/', scheme + 3);
  std::string host = url.substr(0, path);
  std::string prefix = path == std::string::npos ? "" : url.substr(path);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.size() >= 3 && prefix.substr(prefix.size() - 3) == "/v1") prefix.resize(prefix.size() - 3);
  return {host, prefix};
}

httplib::Headers auth_headers(const Endpoint& e) {
  httplib::Headers h;
  if (!e.api_key.empty()) h.emplace("Authorization", "Bearer " + e.api_key);
  return h;
}

std::string short_body(const std::string& body) {
  std::string s = body.substr(0, 300);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

ApiClient::ApiClient(const Endpoint& endpoint) : endpoint_(endpoint), model_(endpoint.model) {
  auto [host, prefix] = split_url(endpoint.url);
  prefix_ = prefix;
  http_ = std::make_unique<httplib::Client>(host);
  if (!http_->is_valid()) fail("bench: cannot use the URL '{}' (https needs a TLS-enabled build)", endpoint.url);
  http_->set_keep_alive(true);
  http_->set_connection_timeout(10, 0);
  auto secs = time_t(endpoint.timeout_s);
  http_->set_read_timeout(secs, 0);
  http_->set_write_timeout(secs, 0);
}

ApiClient::~ApiClient() = default;

ServerInfo ApiClient::server_info() {
  ServerInfo info;
  auto res = http_->Get((prefix_ + "/v1/models").c_str(), auth_headers(endpoint_));
  if (!res) fail("bench: cannot reach {} ({}); is the server running?", endpoint_.url, httplib::to_string(res.error()));
  if (res->status == 401) fail("bench: {} answered 401 to /v1/models; pass its key with --api-key", endpoint_.url);
  if (res->status != 200) fail("bench: GET {}/v1/models answered {}: {}", endpoint_.url, res->status, short_body(res->body));
  json j;
  try {
    j = json::parse(res->body);
  } catch (const std::exception&) {
    fail("bench: GET {}/v1/models did not return JSON: {}", endpoint_.url, short_body(res->body));
  }
  if (j.contains("data") && j["data"].is_array() && !j["data"].empty()) {
    const json& m = j["data"][0];
    if (m.contains("id") && m["id"].is_string()) info.model_id = m["id"];
    for (const char* key : {"max_model_len", "context_length"})
      if (m.contains(key) && m[key].is_number_integer()) {
        info.max_model_len = m[key];
        break;
      }
    if (info.max_model_len == 0 && m.contains("meta") && m["meta"].is_object() && m["meta"].contains("n_ctx_train"))
      info.max_model_len = m["meta"].value("n_ctx_train", int64_t(0));  // llama-server
    if (m.value("owned_by", "") == "llamacpp") info.kind = "llama.cpp";
    if (m.value("owned_by", "") == "spill") info.kind = "spill";
    if (m.value("owned_by", "") == "vllm") info.kind = "vllm";
  }
  if (model_.empty()) model_ = info.model_id;
  if (info.kind.empty()) {
    auto text = metrics_text();
    info.kind = !text ? "unknown" : text->find("spill:") != std::string::npos ? "spill"
                                  : text->find("vllm:") != std::string::npos   ? "vllm"
                                                                                : "unknown";
  }
  return info;
}

std::optional<std::string> ApiClient::metrics_text() {
  auto res = http_->Get((prefix_ + "/metrics").c_str(), auth_headers(endpoint_));
  if (!res || res->status != 200) return std::nullopt;
  return res->body;
}

int64_t ApiClient::tokenize_count(const std::string& text) {
  json body = {{"prompt", text}, {"content", text}, {"add_special_tokens", false}, {"add_special", false}};
  if (!model_.empty()) body["model"] = model_;
  auto res = http_->Post((prefix_ + "/tokenize").c_str(), auth_headers(endpoint_), body.dump(), "application/json");
  if (!res) fail("bench: POST {}/tokenize failed ({})", endpoint_.url, httplib::to_string(res.error()));
  if (res->status != 200)
    fail("bench: POST {}/tokenize answered {} ({}); this server cannot count tokens for the workload: pass "
         "--tokenizer PATH/tokenizer.json of the served model",
         endpoint_.url, res->status, short_body(res->body));
  json j;
  try {
    j = json::parse(res->body);
  } catch (const std::exception&) {
    fail("bench: POST {}/tokenize did not return JSON: {}", endpoint_.url, short_body(res->body));
  }
  if (j.contains("count") && j["count"].is_number_integer()) return j["count"];
  if (j.contains("tokens") && j["tokens"].is_array()) return int64_t(j["tokens"].size());
  fail("bench: POST {}/tokenize returned neither \"count\" nor \"tokens\": {}", endpoint_.url, short_body(res->body));
}

int64_t feed_sse(StreamState& state, std::string_view bytes) {
  state.pending.append(bytes);
  int64_t tokens = 0;
  for (;;) {
    // Events end with a blank line; accept \r\n line ends too.
    size_t end = state.pending.find("\n\n");
    size_t crlf = state.pending.find("\r\n\r\n");
    size_t sep_len = 2;
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
      end = crlf;
      sep_len = 4;
    }
    if (end == std::string::npos) break;
    std::string block = state.pending.substr(0, end);
    state.pending.erase(0, end + sep_len);
    std::string data;
    size_t pos = 0;
    while (pos <= block.size()) {
      size_t eol = block.find('\n', pos);
      if (eol == std::string::npos) eol = block.size();
      std::string line = block.substr(pos, eol - pos);
      pos = eol + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) == 0) {
        std::string value = line.substr(5);
        if (!value.empty() && value[0] == ' ') value.erase(0, 1);
        if (!data.empty()) data += '\n';
        data += value;
      }
    }
    if (data.empty()) continue;  // comments (": ping") and other fields
    if (data == "[DONE]") {
      state.done = true;
      continue;
    }
    json j;
    try {
      j = json::parse(data);
    } catch (const std::exception&) {
      state.error = "the stream carried an event that is not JSON: " + short_body(data);
      continue;
    }
    if (j.contains("error") && !j["error"].is_null()) {
      state.error = j["error"].is_object() ? j["error"].value("message", j["error"].dump()) : j["error"].dump();
      continue;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const json& u = j["usage"];
      if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number()) state.prompt_tokens = u["prompt_tokens"].get<int64_t>();
      if (u.contains("completion_tokens") && u["completion_tokens"].is_number())
        state.completion_tokens = u["completion_tokens"].get<int64_t>();
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object() &&
          u["prompt_tokens_details"].contains("cached_tokens") && u["prompt_tokens_details"]["cached_tokens"].is_number())
        state.cached_tokens = u["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    }
    if (j.contains("choices") && j["choices"].is_array()) {
      for (const json& c : j["choices"]) {
        if (c.contains("finish_reason") && c["finish_reason"].is_string()) state.finish_reason = c["finish_reason"];
        if (!c.contains("delta") || !c["delta"].is_object()) continue;
        const json& d = c["delta"];
        bool token = false;
        for (const char* key : {"content", "reasoning_content", "reasoning"}) {
          if (d.contains(key) && d[key].is_string() && !d[key].get<std::string>().empty()) {
            token = true;
            if (std::string_view(key) == "content") state.content += d[key].get<std::string>();
          }
        }
        if (d.contains("tool_calls") && d["tool_calls"].is_array() && !d["tool_calls"].empty()) token = true;
        if (token) ++tokens;
      }
    }
  }
  state.token_chunks += tokens;
  return tokens;
}

void ApiClient::chat_stream(const ChatRequest& request, Clock::time_point run_start, RequestRecord& rec, std::string* reply) {
  json messages = json::array();
  for (const ChatMessage& m : request.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
  json body = {{"model", model_},
               {"messages", messages},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"max_tokens", request.max_tokens},
               {"temperature", request.temperature}};
  if (request.ignore_eos) body["ignore_eos"] = true;
  if (request.seed) body["seed"] = *request.seed;
  rec.max_tokens = request.max_tokens;

  httplib::Request req;
  req.method = "POST";
  req.path = prefix_ + "/v1/chat/completions";
  req.headers = auth_headers(endpoint_);
  req.headers.emplace("Accept", "text/event-stream");
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");

  StreamState state;
  std::string error_body;
  int status = 0;
  Clock::time_point sent = Clock::now();
  Clock::time_point last_token{};
  bool have_token = false;
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(data, len);
      return true;
    }
    int64_t tokens = feed_sse(state, std::string_view(data, len));
    Clock::time_point now = Clock::now();
    for (int64_t i = 0; i < tokens; ++i) {
      if (!have_token) {
        rec.ttft_s = std::chrono::duration<double>(now - sent).count();
        have_token = true;
      } else {
        rec.itl_s.push_back(std::chrono::duration<double>(now - last_token).count());
      }
      last_token = now;
    }
    return true;
  };
  rec.start_s = std::chrono::duration<double>(sent - run_start).count();
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  bool ok = http_->send(req, res, err);
  if (!ok && status == 0 && (err == httplib::Error::Read || err == httplib::Error::Write)) {
    // A kept-alive connection the server had closed (httplib servers close after 5 requests, as
    // llama-server does): nothing was answered, so send again on a fresh connection, timed anew.
    sent = Clock::now();
    rec.start_s = std::chrono::duration<double>(sent - run_start).count();
    res = httplib::Response();
    err = httplib::Error::Success;
    ok = http_->send(req, res, err);
  }
  Clock::time_point end = Clock::now();
  // As vLLM's benchmark does: the reply ends with its last token (the usage chunk and [DONE] after
  // it are bookkeeping), so TPOT = (latency - TTFT) / (tokens - 1) spans token to token.
  rec.latency_s = std::chrono::duration<double>((have_token ? last_token : end) - sent).count();
  rec.http_status = status;
  if (!ok) {
    rec.error = fmt::format("request failed: {}", httplib::to_string(err));
    return;
  }
  if (status != 200) {
    rec.error = fmt::format("HTTP {}: {}", status, short_body(error_body));
    return;
  }
  if (!state.error.empty()) {
    rec.error = state.error;
    return;
  }
  if (!state.done) rec.error = "the stream ended without data: [DONE]";
  rec.finish_reason = state.finish_reason;
  rec.usage_reported = state.completion_tokens.has_value();
  rec.output_tokens = state.completion_tokens.value_or(state.token_chunks);
  rec.prompt_tokens = state.prompt_tokens.value_or(0);
  rec.cached_tokens = state.cached_tokens.value_or(0);
  if (reply) *reply = std::move(state.content);
}

}  // namespace spill::bench
