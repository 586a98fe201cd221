// Shared by the libFuzzer targets in this folder (built by -DSPILL_FUZZ=ON, run by scripts/fuzz.sh).
// A target may only fail by crashing, hanging or tripping a sanitizer: spill::Error (and the
// server's ApiError) are the expected answers to bad input and are swallowed here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spill::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Splits off the first byte as a selector (mode, chunk size, ...); 0 when there is none.
inline uint8_t take_byte(std::string_view& text) {
  if (text.empty()) return 0;
  const auto b = static_cast<uint8_t>(text[0]);
  text.remove_prefix(1);
  return b;
}

}  // namespace spill::fuzz
