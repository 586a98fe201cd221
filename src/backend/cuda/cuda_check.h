// Errors from the CUDA runtime and from bad arguments to the CUDA kernels' host API, as spill::Error
// (defined in cuda_check.cpp, compiled as C++20, so .cu files need not include fmt).
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace spill::cuda {

// Throws spill::Error with `what` (the caller says where and what to do).
[[noreturn]] void throw_error(const std::string& what);
// Throws DeviceFatalError (core/error.h) with `what`: the engine ends every open request and stops.
[[noreturn]] void throw_device_fatal(const std::string& what);

// Whether err leaves the device unusable for every later call: CUDA's sticky errors (a kernel's
// illegal address or instruction, a launch failure or timeout, an uncorrectable ECC error: the
// context is lost until the process restarts) and a device that is gone.
bool device_error_is_fatal(cudaError_t err);

// Throws when a CUDA call failed: "<what>: <CUDA's message> (<error name>)", as DeviceFatalError
// when device_error_is_fatal(err) (a step cannot fail alone then: every later one would too).
inline void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const std::string message = std::string(what) + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")";
  if (device_error_is_fatal(err)) throw_device_fatal(message + "; the GPU cannot be used by this process any more: restart spill");
  throw_error(message);
}

}  // namespace spill::cuda
