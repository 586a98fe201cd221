// Read bandwidth a kernel gets from HBM and from pinned host memory read in place (zero-copy over
// PCIe): the two ceilings that bound decode speed once experts live in both. Used by spill topo.
// CUDA builds only (SPILL_HAVE_CUDA).
#pragma once
#include <cstdint>
#include <string>

namespace spill::cuda {

struct ReadBandwidth {
  double hbm_read_gbps = 0;   // 1e9 bytes/s
  double host_read_gbps = 0;  // pinned host memory, mapped, read by the kernel in place
  int64_t hbm_buffer_bytes = 0, host_buffer_bytes = 0;
  double hbm_seconds = 0, host_seconds = 0;  // time spent measuring each
};

// Measures device `device` for about `seconds` in all (half HBM, half host). The host buffer is
// allocated by the calling thread, so its pages land where the caller's NUMA policy puts them:
// bind the thread to the GPU's node first. Throws spill::Error on a CUDA error.
ReadBandwidth measure_read_bandwidth(int device, double seconds = 2.0);

// The host half of measure_read_bandwidth alone: a kernel on `device` reading `bytes` of pinned,
// mapped host memory (allocated and first touched by the calling thread) for about `seconds`.
// Returns GB/s; *spent: the seconds the timed reads took. Throws spill::Error on a CUDA error.
double measure_host_read_gbps(int device, int64_t bytes, double seconds, double* spent = nullptr);

// Visible CUDA devices (0 when none or no driver) and each one's PCI bus id, lower case
// ("0000:17:00.0").
int cuda_device_count();
std::string cuda_pci_bus_id(int device);

}  // namespace spill::cuda
