// Errors from the CUDA runtime and from bad arguments to the CUDA kernels' host API, as spill::Error
// (defined in cuda_check.cpp, compiled as C++20, so .cu files need not include fmt).
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace spill::cuda {

// Throws spill::Error with `what` (the caller says where and what to do).
[[noreturn]] void throw_error(const std::string& what);

// Throws when a CUDA call failed: "<what>: <CUDA's message> (<error name>)".
inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw_error(std::string(what) + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

}  // namespace spill::cuda
