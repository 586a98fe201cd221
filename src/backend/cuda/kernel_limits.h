// Per-kernel launch limits that are process-wide state of the CUDA function.
#pragma once
#include <cuda_runtime.h>

namespace spill::cuda {

// Lets `kernel` take as much dynamic shared memory per block as the current device allows (its
// opt-in limit less the kernel's static shared memory), set once per kernel and device. Kernels
// whose shared memory depends on the call (a GEMV's row length, a MoE call's pairs) call this
// rather than setting the limit to each call's need: the limit belongs to the function, not the
// launch, so two host threads launching it on one GPU (ranks of an expert-parallel group sharing
// it) would lower it under each other's launches. The limit is a ceiling: a launch still takes
// only the shared memory it asks for, so occupancy is unchanged. Thread-safe.
cudaError_t allow_max_dynamic_smem(const void* kernel);

template <class... Params>
cudaError_t allow_max_dynamic_smem(void (*kernel)(Params...)) {
  return allow_max_dynamic_smem(reinterpret_cast<const void*>(kernel));
}

}  // namespace spill::cuda
