// NCCL across the GPUs of this machine (backend/cuda/collectives.h): the library loads and names
// its version without a GPU, a missing one is an error that says what to do, and an all-reduce over
// every visible GPU gives each rank the exact sum (small integers, exact in f32). On a one-GPU
// machine that is world size 1: the buffer must come back unchanged through the same NCCL calls.
#include <gtest/gtest.h>

#if SPILL_HAVE_CUDA
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/collectives.h"
#include "core/error.h"
#include "cuda_test_util.h"

namespace spill {
namespace {

TEST(CudaCollectives, TheLibraryLoadsAndNamesItsVersionWithoutAGpu) {
  const cuda::NcclInfo info = cuda::nccl_info();
  if (!info.ok) GTEST_SKIP() << "no NCCL on this machine: " << info.why;
  // major.minor.patch of NCCL 2
  EXPECT_EQ(info.version.rfind("2.", 0), 0u) << info.version;
  EXPECT_EQ(std::count(info.version.begin(), info.version.end(), '.'), 2) << info.version;
  EXPECT_FALSE(info.path.empty());
}

TEST(CudaCollectives, AMissingLibraryIsAnErrorThatSaysWhatToDo) {
  const cuda::NcclInfo info = cuda::nccl_info("/nonexistent/libnccl.so.2");
  EXPECT_FALSE(info.ok);
  EXPECT_NE(info.why.find("/nonexistent/libnccl.so.2"), std::string::npos) << info.why;
  EXPECT_NE(info.why.find("SPILL_NCCL_LIB"), std::string::npos) << info.why;
  // A file that is a library but not NCCL: named, with the symbol it lacks.
  const cuda::NcclInfo wrong = cuda::nccl_info("libm.so.6");
  EXPECT_FALSE(wrong.ok);
  EXPECT_NE(wrong.why.find("no symbol nccl"), std::string::npos) << wrong.why;
}

TEST(CudaCollectives, AllReduceGivesEveryGpuTheExactSum) {
  SPILL_SKIP_WITHOUT_GPU();
  const cuda::NcclInfo info = cuda::nccl_info();
  if (!info.ok) GTEST_SKIP() << "no NCCL: " << info.why;
  int n_gpus = 0;
  CUDA_OK(cudaGetDeviceCount(&n_gpus));
  std::vector<int> devices;
  for (int d = 0; d < n_gpus; ++d) devices.push_back(d);
  std::printf("all-reduce over %d GPU(s), NCCL %s (%s)\n", n_gpus, info.version.c_str(), info.path.c_str());
  const std::unique_ptr<cuda::Collectives> c = cuda::Collectives::open(devices);
  ASSERT_EQ(c->size(), n_gpus);
  // Lengths around NCCL's protocol switches (one float, a decode step's hidden row of 5120, an
  // odd count, 1 MiB of floats).
  for (int64_t count : {int64_t(1), int64_t(5120), int64_t(77777), int64_t(1) << 18}) {
    std::vector<float*> buffers(static_cast<size_t>(n_gpus));
    std::vector<cudaStream_t> streams(static_cast<size_t>(n_gpus));
    auto value = [](int rank, int64_t i) { return float((i * 7 + rank * 13) % 1001) - 500.0f; };
    for (int r = 0; r < n_gpus; ++r) {
      CUDA_OK(cudaSetDevice(devices[size_t(r)]));
      CUDA_OK(cudaMalloc(&buffers[size_t(r)], size_t(count) * 4));
      CUDA_OK(cudaStreamCreate(&streams[size_t(r)]));
      std::vector<float> host(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) host[size_t(i)] = value(r, i);
      CUDA_OK(cudaMemcpy(buffers[size_t(r)], host.data(), size_t(count) * 4, cudaMemcpyHostToDevice));
    }
    c->all_reduce_sum(buffers, count, streams);
    for (int r = 0; r < n_gpus; ++r) {
      CUDA_OK(cudaSetDevice(devices[size_t(r)]));
      CUDA_OK(cudaStreamSynchronize(streams[size_t(r)]));
      std::vector<float> got(static_cast<size_t>(count));
      CUDA_OK(cudaMemcpy(got.data(), buffers[size_t(r)], size_t(count) * 4, cudaMemcpyDeviceToHost));
      int64_t wrong = 0;
      for (int64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n_gpus; ++q) want += value(q, i);  // integers below 2^24: exact in any order
        wrong += got[size_t(i)] != want;
      }
      EXPECT_EQ(wrong, 0) << "rank " << r << ", " << count << " floats";
      CUDA_OK(cudaFree(buffers[size_t(r)]));
      CUDA_OK(cudaStreamDestroy(streams[size_t(r)]));
    }
  }
  // Mismatched arguments are errors, not a hang in NCCL.
  std::vector<float*> none;
  std::vector<cudaStream_t> no_streams;
  EXPECT_THROW(c->all_reduce_sum(none, 16, no_streams), Error);
  EXPECT_THROW(cuda::Collectives::open(std::vector<int>{n_gpus}), Error);  // past the last GPU
}

}  // namespace
}  // namespace spill
#endif  // SPILL_HAVE_CUDA
