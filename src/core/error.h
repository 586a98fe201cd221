// Errors a user can act on: what is wrong, where (file, tensor, field), what to do.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace spill {

// The one exception type spill throws for bad input (files, configs, requests, flags).
// Callers at the edge (CLI, HTTP handlers) turn it into a message; nothing below them catches it.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace spill
