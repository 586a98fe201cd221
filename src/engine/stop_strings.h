// Stop strings on streamed text: text is released only once no stop string can still match
// across it, so a client never sees the beginning of a stop string that then completes.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spill {

class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  // Empty stop strings are refused by the engine before they get here; they are ignored.
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;                    // safe to show now
    std::optional<std::string> matched;  // a stop string completed; text ends right before it
  };

  // Appends newly decoded text. On a match, text is everything before the earliest match (of the
  // longest stop string starting there) and the matcher must not be used again.
  Result push(std::string_view text);
  // The end of the stream: whatever was held back is released (it cannot match any more).
  std::string flush();

  bool empty() const { return stops_.empty(); }
  size_t held_bytes() const { return pending_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // text held back because it ends with the beginning of a stop string
};

}  // namespace spill
