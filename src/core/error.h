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

// A model runner's device is gone or in a state no later step can use (a lost GPU, an
// unrecoverable CUDA error, a corrupted KV pool). Unlike an ordinary forward failure, which fails
// only the sequences of that step, the engine ends every open request with an error and stops:
// later submits are refused (EngineStoppedError, HTTP 503).
class DeviceFatalError : public Error {
 public:
  using Error::Error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace spill
