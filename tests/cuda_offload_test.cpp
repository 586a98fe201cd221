// The expert store on a GPU: tables that mix VRAM experts, experts read in place from a GGUF file's
// registered pages and experts in pinned copies give the MoE kernels output bit-identical to a
// table of VRAM experts the test uploads itself (the same kernels reading the same bytes), and
// the host memory the process holds afterwards is what the plan says (measured in /proc).
#if SPILL_HAVE_CUDA
#include <cstdlib>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/cuda/moe.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "offload/expert_store.h"
#include "offload_test_util.h"

// Registering a page range inside a larger read-only file mapping (cudaHostRegister Mapped |
// ReadOnly) did not return on the H200 with driver 580.159 (docs/offload.md), so in-place reads are
// off by default and their tests run only when asked.
#define SPILL_SKIP_UNLESS_IN_PLACE_ASKED()                                                              \
  do {                                                                                                 \
    if (!std::getenv("SPILL_TEST_IN_PLACE"))                                                           \
      GTEST_SKIP() << "in-place GGUF registration hung on driver 580 (docs/offload.md); set SPILL_TEST_IN_PLACE=1 to run"; \
  } while (0)

namespace spill {
namespace {

using offload::ExpertStore;
using offload::Home;
using test::DeviceBuffer;

// The driver calls the store relies on, one at a time, each announced before it is made (a call
// that never returns then names itself in the log): pinning anonymous memory, then read-only
// registration of a read-only private mapping of a file, with its pages written back and dirty,
// and the GPU copying from the registered pages.
TEST(CudaOffloadDriver, RegistersReadOnlyFilePages) {
  SPILL_SKIP_WITHOUT_GPU();
  const size_t bytes = size_t(1) << 20;
  auto step = [](const char* what) {
    std::printf("  driver step: %s\n", what);
    std::fflush(stdout);
  };
  std::vector<uint8_t> pattern(bytes);
  for (size_t i = 0; i < bytes; ++i) pattern[i] = uint8_t(i * 7 + 3);
  {
    step("cudaHostRegister(Mapped) of anonymous memory");
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    std::memset(p, 1, bytes);
    CUDA_OK(cudaHostRegister(p, bytes, cudaHostRegisterMapped));
    CUDA_OK(cudaHostUnregister(p));
    ::munmap(p, bytes);
  }
  int read_only = 0;
  CUDA_OK(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, 0));
  std::printf("  cudaDevAttrHostRegisterReadOnlySupported = %d\n", read_only);
  if (!read_only) GTEST_SKIP() << "no read-only registration on this GPU";
  for (int variant = 0; variant < 3; ++variant) {
    test::TempFile file(fmt::format("driver-{}.bin", variant));
    {
      const int fd = ::open(file.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::write(fd, pattern.data(), bytes), ssize_t(bytes));
      if (variant == 0) ::fsync(fd);
      ::close(fd);
    }
    const int fd = ::open(file.path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    ASSERT_NE(p, MAP_FAILED);
    const unsigned flags = cudaHostRegisterMapped | cudaHostRegisterReadOnly | (variant == 2 ? cudaHostRegisterPortable : 0);
    step(variant == 0 ? "cudaHostRegister(Mapped | ReadOnly) of a written-back file mapping"
         : variant == 1 ? "cudaHostRegister(Mapped | ReadOnly) of a file mapping with dirty pages"
                        : "cudaHostRegister(Mapped | ReadOnly | Portable) of a file mapping with dirty pages");
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_OK(cudaHostRegister(p, bytes, flags));
    std::printf("  registered in %.3f ms\n", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    void* dev = nullptr;
    CUDA_OK(cudaHostGetDevicePointer(&dev, p, 0));
    step("the GPU copies from the registered pages");
    DeviceBuffer d(bytes);
    CUDA_OK(cudaMemcpy(d.ptr, dev, bytes, cudaMemcpyDeviceToDevice));
    EXPECT_EQ(test::download<uint8_t>(d.ptr, bytes), pattern);
    step("cudaHostUnregister");
    CUDA_OK(cudaHostUnregister(p));
    ::munmap(p, bytes);
  }
}

// The reference: every expert of a layer uploaded by hand into VRAM, one cudaMalloc per projection
// of the fused tensor, and its table.
struct HandTable {
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  std::unique_ptr<DeviceBuffer> table;
  HandTable(const test::ExpertBytes& ex, int64_t l) {
    const test::ExpertShape& s = ex.shape;
    for (const auto* v : {&ex.gate[size_t(l)], &ex.up[size_t(l)], &ex.down[size_t(l)]}) {
      buffers.push_back(std::make_unique<DeviceBuffer>(v->size()));
      buffers.back()->upload(v->data(), v->size());
    }
    std::vector<cuda::ExpertWeights> t;
    for (int64_t e = 0; e < s.n_experts; ++e)
      t.push_back({buffers[0]->as<uint8_t>() + e * s.gate_bytes(), buffers[1]->as<uint8_t>() + e * s.gate_bytes(),
                   buffers[2]->as<uint8_t>() + e * s.down_bytes()});
    table = std::make_unique<DeviceBuffer>(t.size() * sizeof(cuda::ExpertWeights));
    table->upload(t.data(), table->bytes);
  }
  const cuda::ExpertWeights* device() const { return table->as<cuda::ExpertWeights>(); }
};

// One MoE call over `table` for n tokens with distinct random experts (every expert gets tokens
// in the larger batches); returns the output rows.
std::vector<float> run_moe(const cuda::MoeShape& shape, const cuda::ExpertWeights* table, int64_t n, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(size_t(n * shape.hidden)), w(size_t(n * shape.top_k));
  std::vector<int32_t> ids;
  for (float& v : x) v = dist(rng);
  std::vector<int32_t> order(size_t(shape.n_experts));
  for (int64_t t = 0; t < n; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    ids.insert(ids.end(), order.begin(), order.begin() + shape.top_k);
  }
  for (float& v : w) v = 0.1f + std::fabs(dist(rng));
  const cuda::MoePlan plan = cuda::plan_moe(shape, n);
  DeviceBuffer dx(x.size() * 4), dids(ids.size() * 4), dw(w.size() * 4), dout(x.size() * 4), ws(size_t(plan.workspace_bytes));
  dx.upload(x.data(), dx.bytes);
  dids.upload(ids.data(), dids.bytes);
  dw.upload(w.data(), dw.bytes);
  dout.poison();
  cuda::init_moe_workspace(plan, ws.ptr, nullptr);
  cuda::moe_experts(plan, {.table = table, .x = dx.as<float>(), .n = n, .ids = dids.as<int32_t>(), .weights = dw.as<float>(),
                           .out = dout.as<float>(), .workspace = ws.ptr},
                    nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return test::download<float>(dout.ptr, x.size());
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << a.size() << " outputs differ from the hand-made VRAM table";
}

// Every MoE layer of the store, at 1 and at 16 tokens, against the hand-made table.
void expect_store_matches(const test::ExpertBytes& ex, const ExpertStore& store, const std::string& what) {
  for (int64_t l = 0; l < ex.shape.n_layers; ++l) {
    if (!ex.shape.moe[size_t(l)]) {
      EXPECT_EQ(store.device_table(l), nullptr);
      continue;
    }
    const HandTable hand(ex, l);
    for (int64_t n : {1, 16}) {
      const uint64_t seed = uint64_t(100 * l + n);
      expect_same_bits(run_moe(store.shape(l), store.device_table(l), n, seed),
                       run_moe(store.shape(l), hand.device(), n, seed),
                       what + fmt::format(", layer {}, {} tokens", l, n));
    }
  }
}

int64_t count_home(const ExpertStore& s, const test::ExpertShape& shape, Home h) {
  int64_t n = 0;
  for (int64_t l = 0; l < shape.n_layers; ++l)
    if (shape.moe[size_t(l)])
      for (int64_t e = 0; e < shape.n_experts; ++e) n += s.home(l, e) == h;
  return n;
}

// The share of experts on host: 0%, 30%, 100% (a parameter, so a sanitizer run can take one).
class CudaOffloadShare : public ::testing::TestWithParam<double> {};

TEST_P(CudaOffloadShare, InPlaceFileExpertsAndPinnedCopiesAreBitIdenticalToVram) {
  SPILL_SKIP_WITHOUT_GPU();
  const test::ExpertShape shape;
  const test::ExpertBytes ex(shape);
  test::TempFile file("experts.gguf");
  ex.write_gguf(file.path);
  const auto gguf = gguf::GgufFile::open(file.path);
  const offload::ExpertSources from_file = test::gguf_sources(*gguf, shape);
  ASSERT_EQ(from_file.moe_layers.size(), 2u);
  const offload::ExpertSources from_memory = ex.sources();

  const offload::PlacementPlan plan = test::share_plan(shape, GetParam());
  const int64_t host = plan.host_expert_count();
  SCOPED_TRACE(fmt::format("{} of {} experts on host", host, 2 * shape.n_experts));
  {
    // In-place reads asked for, but heap bytes are no file's pages: every host expert is copied, for
    // that reason (nothing is registered, so this runs on drivers where registration hangs).
    const auto store = ExpertStore::build(from_memory, plan, {.in_place = true});
    EXPECT_EQ(count_home(*store, shape, Home::HostCopy), host);
    EXPECT_EQ(store->report().copy_reasons.not_file, host);
    expect_store_matches(ex, *store, "pinned copies");
  }
  {
    const auto store = ExpertStore::build(from_file, plan, {.in_place = false});
    EXPECT_EQ(count_home(*store, shape, Home::HostCopy), host);
    expect_store_matches(ex, *store, "GGUF experts copied to pinned memory");
  }
  {
    SPILL_SKIP_UNLESS_IN_PLACE_ASKED();
    const auto store = ExpertStore::build(from_file, plan, {.in_place = true});
    if (!store->report().read_only_registration) GTEST_SKIP() << "this GPU cannot register read-only host memory";
    EXPECT_EQ(count_home(*store, shape, Home::HostInPlace), host);
    EXPECT_EQ(count_home(*store, shape, Home::Vram), 2 * shape.n_experts - host);
    EXPECT_EQ(store->report().host_copy_bytes, 0);
    expect_store_matches(ex, *store, "GGUF pages read in place");
  }
}
INSTANTIATE_TEST_SUITE_P(HostShares, CudaOffloadShare, ::testing::Values(0.0, 0.3, 1.0));

TEST(CudaOffload, HostPointersOfTheTableAreTheFilePagesThemselves) {
  SPILL_SKIP_WITHOUT_GPU();
  SPILL_SKIP_UNLESS_IN_PLACE_ASKED();
  const test::ExpertShape shape;
  const test::ExpertBytes ex(shape);
  test::TempFile file("experts-ptr.gguf");
  ex.write_gguf(file.path);
  const auto gguf = gguf::GgufFile::open(file.path);
  const offload::ExpertSources src = test::gguf_sources(*gguf, shape);
  const auto store = ExpertStore::build(src, test::share_plan(shape, 1.0), {.in_place = true});
  if (!store->report().read_only_registration) GTEST_SKIP() << "this GPU cannot register read-only host memory";
  // Each in-place entry is a device address of the registered file page that holds the expert:
  // cudaPointerGetAttributes gives its host address back.
  for (const offload::MoeLayerSource& ml : src.moe_layers)
    for (size_t e = 0; e < ml.experts.size(); ++e) {
      const cuda::ExpertWeights w = store->host_table(ml.layer)[e];
      cudaPointerAttributes a{};
      ASSERT_EQ(cudaPointerGetAttributes(&a, w.down), cudaSuccess);
      EXPECT_EQ(a.type, cudaMemoryTypeHost);
      EXPECT_EQ(a.hostPointer, static_cast<const void*>(ml.experts[e].down)) << "layer " << ml.layer << " expert " << e;
    }
}

// Host memory in use against the plan, measured: pinned copies grow the process's anonymous
// resident memory by the arena and no more; in-place experts grow only its file pages (the page
// cache's own, pinned), with no second copy.
TEST(CudaOffload, HostMemoryInUseIsThePlansWithinAFewPercent) {
  SPILL_SKIP_WITHOUT_GPU();
  // S30's expert (hidden 2048, width 768, Q4_K: 2.65 MB), 48 experts in one layer: ~127 MB, large
  // against the few MB the runtime itself may allocate meanwhile.
  const test::ExpertShape shape{.n_layers = 1, .moe = {true}, .hidden = 2048, .width = 768, .n_experts = 48,
                                .top_k = 8, .gate_up = DType::Q4_K, .down = DType::Q4_K};
  const test::ExpertBytes ex(shape);
  const offload::PlacementPlan plan = test::share_plan(shape, 1.0);
  const double planned = double(plan.host_expert_bytes());
  CUDA_OK(cudaFree(nullptr));  // the CUDA context exists before the measurements

  {
    const auto store = ExpertStore::build(ex.sources(), plan);
    const offload::ExpertStoreReport& r = store->report();
    std::printf("%s", r.summary().c_str());
    EXPECT_GE(double(r.host_copy_bytes), planned);
    EXPECT_LE(double(r.host_copy_bytes), planned * 1.01);
    ASSERT_GE(r.before.rss_anon, 0) << "/proc/self/status has no RssAnon";
    const double grown = double(r.after.rss_anon - r.before.rss_anon);
    EXPECT_GE(grown, 0.97 * planned) << "the pinned arena is not resident";
    EXPECT_LE(grown, 1.05 * planned) << "pinning took more host memory than the plan";
  }
  {
    test::TempFile file("experts-mem.gguf");
    SPILL_SKIP_UNLESS_IN_PLACE_ASKED();
    ex.write_gguf(file.path);
    const auto gguf = gguf::GgufFile::open(file.path);
    const auto store = ExpertStore::build(test::gguf_sources(*gguf, shape), plan, {.in_place = true});
    const offload::ExpertStoreReport& r = store->report();
    std::printf("%s", r.summary().c_str());
    if (!r.read_only_registration) GTEST_SKIP() << "this GPU cannot register read-only host memory";
    EXPECT_EQ(r.host_copy_bytes, 0);
    EXPECT_GE(double(r.registered_bytes), planned);
    // At most a page at each end of each registered run, plus the alignment gaps between the fused
    // tensors (under 32 bytes each) inside it.
    EXPECT_LE(double(r.registered_bytes), planned + 2.0 * double(offload::page_size()) * double(r.registrations) + 3 * 32);
    // The file pages become resident in this process as they are pinned (tmpfs pages count as
    // shared memory, a disk file's as file pages); anonymous memory does not grow by a copy.
    const double file_grown = double((r.after.rss_file - r.before.rss_file) + (r.after.rss_shmem - r.before.rss_shmem));
    EXPECT_GE(file_grown, 0.97 * planned);
    EXPECT_LE(file_grown, 1.03 * planned);
    EXPECT_LT(double(r.after.rss_anon - r.before.rss_anon), 0.05 * planned) << "a second copy of the experts";
  }
}

TEST(CudaOffload, RefusesAPlanOfAnotherModelBeforeAllocating) {
  SPILL_SKIP_WITHOUT_GPU();
  const test::ExpertShape shape;
  const test::ExpertBytes ex(shape);
  test::ExpertShape other = shape;
  other.down = DType::Q4_K;  // another expert size
  try {
    ExpertStore::build(ex.sources(), test::share_plan(other, 0.5));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert_bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spill
#else
#include <gtest/gtest.h>
TEST(CudaOffload, SkippedWithoutCuda) { GTEST_SKIP() << "spill was built without CUDA"; }
#endif
