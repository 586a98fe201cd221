// Collectives across the GPUs of one host (NCCL), for plans that spread a model over several
// GPUs (docs/placement.md, expert parallelism): the sum of every GPU's partial rows, in place.
//
// NCCL is loaded at run time, like NVML (placement/topology.cpp): spill builds and runs without it
// until several GPUs are asked for, and a machine whose NCCL lives elsewhere (a Python wheel's
// nvidia/nccl/lib) names it with SPILL_NCCL_LIB. Only calls whose arguments are integers,
// pointers, opaque handles and enums are used; the enum values are NCCL's ABI (tested against
// nccl.h where the toolkit has it). NVLink multicast (NVLS) is switched off before any
// communicator exists: on shared machines it can take the host's GPUs out of service.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace spill::cuda {

// The NCCL this process uses (path empty; loaded once) or the library at `path` (loaded and
// closed again): its path and version ("2.28.3"), or why there is none. Creates no communicator
// and touches no GPU.
struct NcclInfo {
  bool ok = false;
  std::string path;     // what was loaded (SPILL_NCCL_LIB, else libnccl.so.2 from the loader's path)
  std::string version;  // major.minor.patch
  std::string why;      // when !ok: what failed and what to do
};
NcclInfo nccl_info(const std::string& path = "");

// One communicator per listed CUDA device, all driven from the calling thread.
class Collectives {
 public:
  // Throws spill::Error naming the library, the devices and what to do when NCCL is missing or a
  // communicator cannot be made.
  static std::unique_ptr<Collectives> open(std::span<const int> devices);
  ~Collectives();
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  int size() const { return int(comms_.size()); }
  int device(int rank) const { return devices_[size_t(rank)]; }

  // buffers[r] (count floats on device(r)) becomes the sum over all ranks, enqueued on streams[r];
  // one NCCL group, so every rank's part is issued before any of them waits. Ranks add in NCCL's
  // order, the same on every rank: each GPU ends with the same bits.
  void all_reduce_sum(std::span<float* const> buffers, int64_t count, std::span<const cudaStream_t> streams);
  // One rank's part of the same all-reduce, for a process that drives each GPU from its own thread
  // (every rank's thread must make the matching call; no group needed). Capturable in a CUDA graph.
  void all_reduce_sum_of_rank(int rank, float* buffer, int64_t count, cudaStream_t stream);
  // Aborts every communicator (ncclCommAbort): an all-reduce waiting on the device for a rank that
  // failed returns, and every later call fails. Any thread, once a rank has failed mid-step.
  void abort();

 private:
  Collectives() = default;
  std::vector<void*> comms_;  // ncclComm_t, one per rank (null once aborted)
  std::mutex abort_mu_;
  std::vector<int> devices_;
};

}  // namespace spill::cuda
