#include "engine/stop_strings.h"

#include <algorithm>

namespace spill {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view text) {
  Result out;
  if (stops_.empty()) {
    out.text.assign(text);
    return out;
  }
  pending_.append(text);
  // pending_ never holds a complete match (it would have been found on an earlier push), so the
  // search is over at most (longest stop - 1) old bytes plus the new text.
  size_t best_pos = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& s : stops_) {
    const size_t pos = pending_.find(s);
    if (pos == std::string::npos) continue;
    if (pos < best_pos || (pos == best_pos && s.size() > best->size())) {
      best_pos = pos;
      best = &s;
    }
  }
  if (best) {
    out.text = pending_.substr(0, best_pos);
    out.matched = *best;
    pending_.clear();
    return out;
  }
  // Hold back the longest tail of pending_ that is a proper prefix of some stop string. Such a
  // tail starts where a stop string starts, so it never splits a UTF-8 character.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_k = std::min(s.size() - 1, pending_.size());
    for (size_t k = max_k; k > hold; --k) {
      if (std::string_view(pending_).substr(pending_.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  out.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace spill
