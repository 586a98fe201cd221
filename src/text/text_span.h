// A byte range of a text. The chat template reports which ranges of a rendered prompt came from
// the client (message content, tool definitions); the tokenizer refuses to read special tokens
// inside them, so typed "<|im_end|>" stays text instead of closing the turn.
#pragma once
#include <cstddef>
#include <vector>

namespace spill {

struct TextSpan {
  size_t begin = 0, end = 0;
  bool operator==(const TextSpan&) const = default;
};

// Appends [begin, end) to spans (kept sorted, non-overlapping; adjacent ranges merge).
inline void add_span(std::vector<TextSpan>& spans, size_t begin, size_t end) {
  if (begin >= end) return;
  if (!spans.empty() && spans.back().end >= begin) {
    if (end > spans.back().end) spans.back().end = end;
    return;
  }
  spans.push_back({begin, end});
}

}  // namespace spill
