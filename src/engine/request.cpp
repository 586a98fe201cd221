#include "engine/request.h"

#include "core/error.h"

namespace spill {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Cancelled:
      return "cancelled";
    case FinishReason::Error:
      return "error";
  }
  return "?";
}

void RequestOutput::append(RequestOutput&& more) {
  text += more.text;
  token_ids.insert(token_ids.end(), more.token_ids.begin(), more.token_ids.end());
  logprobs.insert(logprobs.end(), std::make_move_iterator(more.logprobs.begin()),
                  std::make_move_iterator(more.logprobs.end()));
  if (more.finish) finish = std::move(more.finish);
}

namespace {

RequestOutput take(detail::RequestChannel& c) {
  RequestOutput out = std::move(c.pending);
  c.pending = RequestOutput{};
  if (out.finish) c.finish_taken = true;
  return out;
}

void check_open(const detail::RequestChannel& c) {
  if (c.finish_taken)
    fail("request {}: its stream has already delivered the finish; there is nothing more to read", c.id);
}

}  // namespace

RequestOutput RequestStream::next() {
  detail::RequestChannel& c = *channel_;
  std::unique_lock lock(c.mutex);
  check_open(c);
  c.changed.wait(lock, [&] { return !c.pending.empty(); });
  return take(c);
}

std::optional<RequestOutput> RequestStream::next_for(std::chrono::milliseconds timeout) {
  detail::RequestChannel& c = *channel_;
  std::unique_lock lock(c.mutex);
  check_open(c);
  if (!c.changed.wait_for(lock, timeout, [&] { return !c.pending.empty(); })) return std::nullopt;
  return take(c);
}

RequestOutput RequestStream::collect() {
  RequestOutput all;
  while (!finished()) all.append(next());
  return all;
}

bool RequestStream::finished() const {
  std::lock_guard lock(channel_->mutex);
  return channel_->finish_taken;
}

void RequestStream::cancel() {
  {
    std::lock_guard lock(channel_->mutex);
    if (channel_->finish_taken || channel_->pending.finish) return;
  }
  if (channel_->request_cancel) channel_->request_cancel();
}

}  // namespace spill
