#include "backend/cuda/collectives.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <vector>

#include "core/error.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
#endif

namespace spill::cuda {
namespace {

// NCCL's ABI as spill uses it (nccl.h: ncclResult_t, ncclDataType_t, ncclRedOp_t are C enums).
constexpr int kNcclSuccess = 0;
constexpr int kNcclFloat32 = 7;
constexpr int kNcclSum = 0;
#if __has_include(<nccl.h>)  // the header only checks the values: nothing below calls through it
static_assert(kNcclSuccess == ncclSuccess && kNcclFloat32 == ncclFloat32 && kNcclSum == ncclSum,
              "NCCL's enum values are not the ones spill passes");
static_assert(sizeof(ncclResult_t) == sizeof(int) && sizeof(ncclDataType_t) == sizeof(int) &&
              sizeof(ncclRedOp_t) == sizeof(int), "NCCL's enums are not int-sized");
#endif

struct Nccl {
  void* lib = nullptr;
  std::string path, why;
  int (*get_version)(int*) = nullptr;
  const char* (*get_error_string)(int) = nullptr;
  int (*comm_init_all)(void** comms, int ndev, const int* devlist) = nullptr;
  int (*comm_destroy)(void* comm) = nullptr;
  int (*comm_abort)(void* comm) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  int (*all_reduce)(const void* send, void* recv, size_t count, int type, int op, void* comm, cudaStream_t stream) =
      nullptr;

  template <class F>
  bool bind(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib, name));
    if (!f) why = fmt::format("{} has no symbol {}: not an NCCL library (SPILL_NCCL_LIB names another file)", path, name);
    return f != nullptr;
  }
  std::string error(int rc) const {
    const char* s = get_error_string ? get_error_string(rc) : nullptr;
    return fmt::format("NCCL error {} ({})", rc, s ? s : "no description");
  }
};

Nccl load(const std::string& path) {
  Nccl n;
  n.path = path;
  n.lib = dlopen(n.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!n.lib) {
    const char* err = dlerror();
    n.why = fmt::format("cannot load NCCL ({}: {}); install NCCL (the CUDA toolkit's, or a Python wheel's "
                        "nvidia/nccl/lib) and point SPILL_NCCL_LIB at its libnccl.so.2",
                        n.path, err ? err : "not found");
    return n;
  }
  if (!n.bind(n.get_version, "ncclGetVersion") || !n.bind(n.get_error_string, "ncclGetErrorString") ||
      !n.bind(n.comm_init_all, "ncclCommInitAll") || !n.bind(n.comm_destroy, "ncclCommDestroy") ||
      !n.bind(n.comm_abort, "ncclCommAbort") ||
      !n.bind(n.group_start, "ncclGroupStart") || !n.bind(n.group_end, "ncclGroupEnd") ||
      !n.bind(n.all_reduce, "ncclAllReduce")) {
    dlclose(n.lib);
    n.lib = nullptr;
  }
  return n;
}

// The process's NCCL, loaded once; SPILL_NCCL_LIB is read at that moment.
const Nccl& nccl() {
  static const Nccl n = [] {
    const char* env = std::getenv("SPILL_NCCL_LIB");
    return load(env && *env ? env : "libnccl.so.2");
  }();
  return n;
}

NcclInfo info_of(const Nccl& n) {
  NcclInfo info{.ok = n.lib != nullptr, .path = n.path, .version = {}, .why = n.why};
  if (!info.ok) return info;
  int code = 0;
  if (n.get_version(&code) != kNcclSuccess) {
    info.ok = false;
    info.why = fmt::format("{}: ncclGetVersion failed", n.path);
    return info;
  }
  // NCCL_VERSION_CODE: major x 10000 + minor x 100 + patch (since 2.9).
  info.version = fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  return info;
}

void cuda_ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) fail("collectives: {} failed: {}", what, cudaGetErrorString(rc));
}

}  // namespace

NcclInfo nccl_info(const std::string& path) {
  if (path.empty()) return info_of(nccl());
  const Nccl n = load(path);
  NcclInfo info = info_of(n);
  if (n.lib) dlclose(n.lib);
  return info;
}

std::unique_ptr<Collectives> Collectives::open(std::span<const int> devices) {
  const Nccl& n = nccl();
  if (!n.lib) fail("collectives across {} GPUs: {}", devices.size(), n.why);
  if (devices.empty()) fail("collectives: no GPUs listed");
  int count = 0;
  cuda_ok(cudaGetDeviceCount(&count), "counting the GPUs");
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= count)
      fail("collectives: GPU {} is not one of the {} this process sees (CUDA_VISIBLE_DEVICES)", devices[i], count);
    for (size_t j = 0; j < i; ++j)
      if (devices[j] == devices[i]) fail("collectives: GPU {} is listed twice", devices[i]);
  }
  // NVLink SHARP / multicast off, whatever the environment says: a program using it can put a
  // shared host's GPUs out of service, and an all-reduce of a few KiB gains nothing from it.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  std::unique_ptr<Collectives> c(new Collectives());
  c->devices_.assign(devices.begin(), devices.end());
  c->comms_.assign(devices.size(), nullptr);
  const int rc = n.comm_init_all(c->comms_.data(), int(devices.size()), c->devices_.data());
  if (rc != kNcclSuccess) {
    c->comms_.clear();
    fail("collectives: creating NCCL communicators for GPUs {} failed: {} ({} {})", fmt::join(devices, ","), n.error(rc),
         n.path, nccl_info().version);
  }
  return c;
}

void Collectives::abort() {
  const Nccl& n = nccl();
  std::lock_guard lock(abort_mu_);
  for (void*& comm : comms_)
    if (comm) {
      n.comm_abort(comm);
      comm = nullptr;
    }
}

Collectives::~Collectives() {
  const Nccl& n = nccl();
  for (void* comm : comms_)
    if (comm) n.comm_destroy(comm);
}

void Collectives::all_reduce_sum(std::span<float* const> buffers, int64_t count, std::span<const cudaStream_t> streams) {
  const Nccl& n = nccl();
  if (buffers.size() != comms_.size() || streams.size() != comms_.size())
    fail("collectives: all-reduce over {} ranks given {} buffers and {} streams", comms_.size(), buffers.size(),
         streams.size());
  if (count < 0) fail("collectives: all-reduce of {} floats", count);
  if (count == 0) return;
  int rc = n.group_start();
  for (size_t r = 0; r < comms_.size() && rc == kNcclSuccess; ++r)
    rc = n.all_reduce(buffers[r], buffers[r], size_t(count), kNcclFloat32, kNcclSum, comms_[r], streams[r]);
  const int end_rc = n.group_end();
  if (rc == kNcclSuccess) rc = end_rc;
  if (rc != kNcclSuccess) fail("collectives: all-reduce of {} floats over {} GPUs failed: {}", count, comms_.size(), n.error(rc));
}

void Collectives::all_reduce_sum_of_rank(int rank, float* buffer, int64_t count, cudaStream_t stream) {
  const Nccl& n = nccl();
  if (rank < 0 || rank >= size()) fail("collectives: rank {} of {} (internal error)", rank, size());
  if (!comms_[size_t(rank)]) fail("collectives: the communicators were aborted after a GPU of the group failed");
  if (count < 0) fail("collectives: all-reduce of {} floats", count);
  if (count == 0) return;
  const int rc = n.all_reduce(buffer, buffer, size_t(count), kNcclFloat32, kNcclSum, comms_[size_t(rank)], stream);
  if (rc != kNcclSuccess)
    fail("collectives: all-reduce of {} floats on GPU {} (rank {} of {}) failed: {}", count, devices_[size_t(rank)], rank,
         size(), n.error(rc));
}

}  // namespace spill::cuda
