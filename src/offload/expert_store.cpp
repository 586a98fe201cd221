// CUDA builds only: the file is empty otherwise, so the library's source glob needs no exception.
#if SPILL_HAVE_CUDA
#include "offload/expert_store.h"

#include <fcntl.h>
#include <numa.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <thread>

#include "backend/cuda/bandwidth.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace spill::offload {

namespace {

using Clock = std::chrono::steady_clock;
// "1.50 GiB", "12.0 MiB", "512 B" (the store is part of the kernel-only build, without placement/).
std::string format_bytes(int64_t b) {
  const double a = double(b < 0 ? -b : b);
  if (a >= double(int64_t(1) << 30)) return fmt::format("{:.2f} GiB", double(b) / double(int64_t(1) << 30));
  if (a >= double(1 << 20)) return fmt::format("{:.1f} MiB", double(b) / double(1 << 20));
  if (a >= 1024) return fmt::format("{:.1f} KiB", double(b) / 1024.0);
  return fmt::format("{} B", b);
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// SPILL_OFFLOAD_TRACE=1: each start-up step on stderr as it begins, for a build that stalls in a
// driver call (which no timeout inside the process can interrupt).
void trace(const std::string& what) {
  static const bool on = [] {
    const char* v = std::getenv("SPILL_OFFLOAD_TRACE");
    return v && *v && *v != '0';
  }();
  if (!on) return;
  static const Clock::time_point t0 = Clock::now();
  std::fprintf(stderr, "[offload %8.3f s] %s\n", since(t0), what.c_str());
  std::fflush(stderr);
}

void cuda_ok(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess)
    fail("expert store: {}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
}


// Copies `jobs` (dst, src, bytes) on a few threads: filling a pinned arena of tens of GiB on one
// thread is bound by one core's page faults and memcpy.
struct CopyJob {
  uint8_t* dst;
  const uint8_t* src;
  size_t bytes;
};
void parallel_copy(const std::vector<CopyJob>& jobs, int node, const ExpertSources& sources) {
  const unsigned n = std::clamp(std::thread::hardware_concurrency() / 2, 1u, 16u);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      // Copy threads run on the arena's node: its pages are faulted in (first touch) there even
      // where the range's policy is only a preference.
      if (node >= 0 && numa_available() >= 0) numa_run_on_node(node);
      for (size_t i = t; i < jobs.size(); i += n) {
        if (sources.prepare) sources.prepare(jobs[i].src, jobs[i].bytes);
        std::memcpy(jobs[i].dst, jobs[i].src, jobs[i].bytes);
        if (sources.drop) sources.drop(jobs[i].src, jobs[i].bytes);
      }
    });
  for (std::thread& th : threads) th.join();
}

// VRAM experts go up in chunks: a run of a layer's consecutive VRAM experts (back to back in its
// block) packed in their span layout into a pinned buffer, then one cudaMemcpyAsync. Copy threads
// pack (and prepare and drop the model's bytes) one set of buffers while the other set's copies
// run, so the upload is bound by the threads' memcpy or by PCIe, not by one thread's pageable
// cudaMemcpy per matrix.
struct VramChunk {
  size_t layer = 0;             // into the layout's layers
  std::vector<size_t> experts;  // consecutive VRAM experts of the layer
  int64_t offset = 0, bytes = 0;  // into the layer's VRAM block
};
constexpr int64_t kVramChunkBytes = int64_t(32) << 20;

std::vector<VramChunk> vram_chunks(const StoreLayout& lay) {
  std::vector<VramChunk> chunks;
  for (size_t i = 0; i < lay.layers.size(); ++i) {
    const LayerLayout& ll = lay.layers[i];
    VramChunk c;
    c.layer = i;
    for (size_t e = 0; e < ll.experts.size(); ++e) {
      if (ll.experts[e].home != Home::Vram) continue;
      if (!c.experts.empty() && c.bytes + ll.span.bytes > kVramChunkBytes) {
        chunks.push_back(std::move(c));
        c = VramChunk();
        c.layer = i;
      }
      if (c.experts.empty()) c.offset = ll.experts[e].offset;
      c.experts.push_back(e);
      c.bytes += ll.span.bytes;
    }
    if (!c.experts.empty()) chunks.push_back(std::move(c));
  }
  return chunks;
}

void upload_vram_experts(const StoreLayout& lay, const ExpertSources& sources, const std::vector<uint8_t*>& vram) {
  const std::vector<VramChunk> chunks = vram_chunks(lay);
  if (chunks.empty()) return;
  int64_t buffer_bytes = 0;
  for (const VramChunk& c : chunks) buffer_bytes = std::max(buffer_bytes, c.bytes);
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency() / 2, 1, 8);
  struct Set {
    std::vector<void*> buffers;
    cudaEvent_t done = nullptr;
  } sets[2];
  cudaStream_t stream = nullptr;
  auto release = [&] {
    if (stream) cudaStreamSynchronize(stream);
    for (Set& s : sets) {
      for (void* b : s.buffers) cudaFreeHost(b);
      if (s.done) cudaEventDestroy(s.done);
    }
    if (stream) cudaStreamDestroy(stream);
  };
  try {
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating the upload stream");
    for (Set& s : sets) {
      cuda_ok(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "creating an event");
      for (size_t t = 0; t < threads; ++t) {
        void* b = nullptr;
        cuda_ok(cudaHostAlloc(&b, size_t(buffer_bytes), cudaHostAllocDefault), "allocating pinned upload buffers");
        s.buffers.push_back(b);
      }
    }
    for (size_t first = 0, group = 0; first < chunks.size(); first += threads, ++group) {
      Set& set = sets[group % 2];
      cuda_ok(cudaEventSynchronize(set.done), "uploading experts to VRAM");  // this set's previous copies
      const size_t n = std::min(threads, chunks.size() - first);
      std::vector<std::thread> workers;
      for (size_t t = 0; t < n; ++t)
        workers.emplace_back([&, t] {
          const VramChunk& c = chunks[first + t];
          const LayerLayout& ll = lay.layers[c.layer];
          const MoeLayerSource& ml = sources.moe_layers[ll.source];
          uint8_t* buf = static_cast<uint8_t*>(set.buffers[t]);
          for (size_t e : c.experts) {
            const HostExpert& x = ml.experts[e];
            uint8_t* span = buf + (ll.experts[e].offset - c.offset);
            const std::pair<const uint8_t*, int64_t> parts[3] = {
                {x.gate, ml.gate_bytes()}, {x.up, ml.gate_bytes()}, {x.down, ml.down_bytes()}};
            const int64_t at[3] = {ll.span.gate, ll.span.up, ll.span.down};
            for (int k = 0; k < 3; ++k) {
              if (sources.prepare) sources.prepare(parts[k].first, size_t(parts[k].second));
              std::memcpy(span + at[k], parts[k].first, size_t(parts[k].second));
              if (sources.drop) sources.drop(parts[k].first, size_t(parts[k].second));
            }
          }
        });
      for (std::thread& w : workers) w.join();
      for (size_t t = 0; t < n; ++t) {
        const VramChunk& c = chunks[first + t];
        cuda_ok(cudaMemcpyAsync(vram[c.layer] + c.offset, set.buffers[t], size_t(c.bytes), cudaMemcpyHostToDevice, stream),
                "copying experts to VRAM");
      }
      cuda_ok(cudaEventRecord(set.done, stream), "uploading experts to VRAM");
    }
    cuda_ok(cudaStreamSynchronize(stream), "uploading experts to VRAM");
  } catch (...) {
    release();
    throw;
  }
  release();
}

}  // namespace

int gpu_numa_node(int device) {
  std::ifstream in("/sys/bus/pci/devices/" + cuda::cuda_pci_bus_id(device) + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

std::string ExpertStoreReport::summary() const {
  std::string s = fmt::format(
      "expert store on cuda:{}: {} MoE layers; VRAM {} experts ({}); host in place {} experts ({} read, {} registered "
      "in {} ranges); host pinned copies {} experts ({}, {}{}); plan's host bytes {}, store's {} ({:+.2f}%)\n",
      cuda_device, moe_layers, vram_experts, format_bytes(vram_bytes), host_in_place_experts,
      format_bytes(host_in_place_bytes), format_bytes(registered_bytes), registrations, host_copied_experts,
      format_bytes(host_copy_bytes), pinned_allocator.empty() ? "none" : pinned_allocator,
      numa_node >= 0 ? fmt::format(" on NUMA node {}", numa_node) : "", format_bytes(planned_host_bytes),
      format_bytes(host_bytes()),
      planned_host_bytes > 0 ? 100.0 * double(host_bytes() - planned_host_bytes) / double(planned_host_bytes) : 0.0);
  if (copy_reasons.not_file + copy_reasons.unaligned + copy_reasons.disabled > 0)
    s += fmt::format("  copied rather than read in place: {} not in a read-only file mapping, {} not 16-byte aligned, {} "
                     "by request{}\n",
                     copy_reasons.not_file, copy_reasons.unaligned, copy_reasons.disabled,
                     read_only_registration ? "" : " (the device cannot register read-only memory)");
  s += fmt::format(
      "  start-up {:.3f} s: plan check {:.3f}, layout {:.3f}, host alloc {:.3f}, host copy {:.3f}, host register "
      "{:.3f}, VRAM alloc {:.3f}, VRAM copy {:.3f}, tables {:.3f}\n",
      times.total, times.plan_check, times.layout, times.host_alloc, times.host_copy, times.host_register,
      times.vram_alloc, times.vram_copy, times.table_upload);
  auto mib = [](int64_t a, int64_t b) { return a < 0 || b < 0 ? std::string("?") : format_bytes(b - a); };
  s += fmt::format("  process memory growth: RSS {}, anonymous {}, file pages {}, locked {}, pinned {}\n",
                   mib(before.vm_rss, after.vm_rss), mib(before.rss_anon, after.rss_anon),
                   mib(before.rss_file, after.rss_file), mib(before.vm_lck, after.vm_lck), mib(before.vm_pin, after.vm_pin));
  return s;
}

HostReadProbe measure_host_reads(int device, int64_t bytes, double seconds) {
  HostReadProbe probe;
  probe.numa_node = gpu_numa_node(device);
  // On its own thread, bound to the GPU's node: the buffer's pages land where host experts will,
  // and the caller's own placement and policy stay as they were.
  std::exception_ptr error;
  std::thread([&] {
    try {
      if (probe.numa_node >= 0 && numa_available() >= 0 && probe.numa_node <= numa_max_node()) {
        numa_run_on_node(probe.numa_node);
        numa_set_preferred(probe.numa_node);
      }
      const auto t0 = Clock::now();
      probe.gbps = cuda::measure_host_read_gbps(device, bytes, seconds);
      probe.seconds = since(t0);
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  if (error) std::rethrow_exception(error);
  return probe;
}

std::unique_ptr<ExpertStore> ExpertStore::build(const ExpertSources& sources, const PlacementPlan& plan,
                                                const ExpertStoreOptions& options) {
  const Clock::time_point t_start = Clock::now();
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  ExpertStore& st = *store;
  ExpertStoreReport& rep = st.report_;
  rep.before = read_process_memory();

  Clock::time_point t = Clock::now();
  trace("plan check");
  check_plan(plan, sources);
  if (options.plan_gpu < 0 || options.plan_gpu >= plan.n_gpus)
    fail("{}: the store was asked for the plan's GPU {}, the plan has {}", plan.where, options.plan_gpu, plan.n_gpus);
  rep.times.plan_check = since(t);

  if (options.cuda_device >= 0) cuda_ok(cudaSetDevice(options.cuda_device), "selecting the GPU");
  cuda_ok(cudaGetDevice(&st.device_), "reading the current GPU");
  rep.cuda_device = st.device_;
  int read_only = 0;
  cuda_ok(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, st.device_),
          "asking whether the GPU reads read-only registered memory");
  rep.read_only_registration = read_only != 0;

  t = Clock::now();
  trace("layout");
  const uint64_t page = page_size();
  const std::vector<MappedRegion> regions_at_layout = read_only ? read_process_maps() : std::vector<MappedRegion>{};
  st.layout_ = layout_experts(plan, sources, regions_at_layout,
                              {.gpu = options.plan_gpu, .in_place = options.in_place && read_only != 0, .page = page});
  const StoreLayout& lay = st.layout_;
  rep.times.layout = since(t);

  st.tables_.assign(size_t(sources.n_layers), {});
  for (size_t i = 0; i < lay.layers.size(); ++i) {
    const LayerLayout& ll = lay.layers[i];
    const MoeLayerSource& ml = sources.moe_layers[ll.source];
    LayerTable& lt = st.tables_[size_t(ll.layer)];
    lt.layout_index = int64_t(i);
    lt.shape = {.hidden = ml.hidden, .width = ml.width, .n_experts = int32_t(ml.experts.size()),
                .top_k = int32_t(sources.top_k), .gate_up_type = ml.gate_up_type, .down_type = ml.down_type};
    cuda::plan_moe(lt.shape, 1);  // refuses, before anything is allocated, types the kernels cannot decode
  }

  // From here on a failure frees what was placed.
  try {
    // Pinned copies: reserve on the node, fill there, then register.
    if (lay.host_copy_bytes > 0) {
      t = Clock::now();
      int node = options.numa_node == kNumaNodeOfGpu ? gpu_numa_node(st.device_) : options.numa_node;
      st.arena_bytes_ = size_t(lay.host_copy_bytes);
      if (node >= 0 && numa_available() >= 0 && node <= numa_max_node()) {
        st.arena_ = numa_alloc_onnode(st.arena_bytes_, node);
        st.arena_numa_ = st.arena_ != nullptr;
        rep.pinned_allocator = "numa_alloc_onnode + cudaHostRegister";
      } else {
        node = -1;
        void* p = ::mmap(nullptr, st.arena_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        st.arena_ = p == MAP_FAILED ? nullptr : p;
        rep.pinned_allocator = "mmap + cudaHostRegister";
      }
      if (!st.arena_)
        fail("expert store: cannot reserve {} of host memory for {} host experts; give the plan more VRAM or "
             "free host RAM",
             format_bytes(lay.host_copy_bytes), lay.host_copied);
      rep.numa_node = node;
      // Huge pages where the kernel gives them (THP "madvise" or "always"): tens of GiB filled by a
      // few threads fault 512 times less often.
      ::madvise(st.arena_, st.arena_bytes_, MADV_HUGEPAGE);
      rep.times.host_alloc = since(t);

      t = Clock::now();
      std::vector<CopyJob> jobs;
      for (const LayerLayout& ll : lay.layers) {
        const MoeLayerSource& ml = sources.moe_layers[ll.source];
        for (size_t e = 0; e < ll.experts.size(); ++e) {
          if (ll.experts[e].home != Home::HostCopy) continue;
          uint8_t* span = static_cast<uint8_t*>(st.arena_) + ll.experts[e].offset;
          jobs.push_back({span + ll.span.gate, ml.experts[e].gate, size_t(ml.gate_bytes())});
          jobs.push_back({span + ll.span.up, ml.experts[e].up, size_t(ml.gate_bytes())});
          jobs.push_back({span + ll.span.down, ml.experts[e].down, size_t(ml.down_bytes())});
        }
      }
      trace(fmt::format("host copy: {} into the arena", format_bytes(lay.host_copy_bytes)));
      parallel_copy(jobs, node, sources);
      rep.times.host_copy = since(t);

      t = Clock::now();
      trace("registering the arena");
      cuda_ok(cudaHostRegister(st.arena_, st.arena_bytes_, cudaHostRegisterMapped | cudaHostRegisterPortable),
              fmt::format("pinning {} for host experts", format_bytes(lay.host_copy_bytes)));
      st.arena_registered_ = true;
      rep.times.host_register += since(t);
    }

    // In-place experts: register each merged page cover once, read-only. The files are written back
    // first, so that no pin waits on dirty page-cache pages (a long-term pin may migrate pages);
    // fsync of a clean file returns at once. (On the lent H200 this did not cure the stall of
    // sub-range registrations: docs/perf/offload-h200-2026-12-01.md.)
    t = Clock::now();
    {
      std::vector<int64_t> files;
      for (const AddressRange& r : lay.registrations)
        if (files.empty() || files.back() != r.region) files.push_back(r.region);
      for (int64_t f : files) {
        const std::string& path = regions_at_layout[size_t(f)].path;
        trace("writing back " + path);
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
          ::fsync(fd);
          ::close(fd);
        }
      }
    }
    std::vector<uint8_t*> cover_device(lay.registrations.size(), nullptr);
    for (size_t i = 0; i < lay.registrations.size(); ++i) {
      const AddressRange& r = lay.registrations[i];
      void* host = reinterpret_cast<void*>(r.begin);
      trace(fmt::format("registering file pages {}/{}: {} at {:#x}", i + 1, lay.registrations.size(), format_bytes(int64_t(r.bytes())), r.begin));
      cuda_ok(cudaHostRegister(host, r.bytes(), cudaHostRegisterMapped | cudaHostRegisterReadOnly | cudaHostRegisterPortable),
              fmt::format("registering {} of the model file's pages for in-place reads (set in_place off to copy "
                          "them into pinned memory instead)",
                          format_bytes(int64_t(r.bytes()))));
      st.registered_.push_back(host);
      void* dev = nullptr;
      cuda_ok(cudaHostGetDevicePointer(&dev, host, 0), "mapping registered file pages for the GPU");
      cover_device[i] = static_cast<uint8_t*>(dev);
    }
    rep.times.host_register += since(t);
    // The device address of a host byte read in place: its cover's mapping plus the offset.
    auto in_place_address = [&](const uint8_t* p) -> const void* {
      const uintptr_t a = uintptr_t(p);
      auto it = std::upper_bound(lay.registrations.begin(), lay.registrations.end(), a,
                                 [](uintptr_t x, const AddressRange& r) { return x < r.begin; });
      if (it == lay.registrations.begin() || a >= std::prev(it)->end) fail("expert store: internal: an in-place expert outside its cover");
      const size_t i = size_t(std::prev(it) - lay.registrations.begin());
      return cover_device[i] + (a - lay.registrations[i].begin);
    };

    uint8_t* arena_device = nullptr;
    if (st.arena_) {
      void* dev = nullptr;
      cuda_ok(cudaHostGetDevicePointer(&dev, st.arena_, 0), "mapping the pinned host experts for the GPU");
      arena_device = static_cast<uint8_t*>(dev);
    }

    // VRAM: one block per layer, then the copies.
    t = Clock::now();
    trace(fmt::format("VRAM: {} in {} layers", format_bytes(lay.vram_bytes), lay.layers.size()));
    std::vector<uint8_t*> vram(lay.layers.size(), nullptr);
    for (size_t i = 0; i < lay.layers.size(); ++i) {
      if (lay.layers[i].vram_bytes == 0) continue;
      void* p = nullptr;
      cuda_ok(cudaMalloc(&p, size_t(lay.layers[i].vram_bytes)),
              fmt::format("allocating {} of VRAM for layer {}'s experts (the plan's VRAM budget is too large for "
                          "this GPU's free memory; plan with a smaller --gpu-mem)",
                          format_bytes(lay.layers[i].vram_bytes), lay.layers[i].layer));
      st.vram_blocks_.push_back(p);
      vram[i] = static_cast<uint8_t*>(p);
    }
    rep.times.vram_alloc = since(t);

    t = Clock::now();
    trace("VRAM copy");
    upload_vram_experts(lay, sources, vram);
    for (size_t i = 0; i < lay.layers.size(); ++i) {
      const LayerLayout& ll = lay.layers[i];
      const MoeLayerSource& ml = sources.moe_layers[ll.source];
      LayerTable& lt = st.tables_[size_t(ll.layer)];
      lt.host.resize(ll.experts.size());
      lt.cpu.assign(ll.experts.size(), cuda::ExpertWeights{});
      for (size_t e = 0; e < ll.experts.size(); ++e) {
        const ExpertPlace& place = ll.experts[e];
        const HostExpert& x = ml.experts[e];
        cuda::ExpertWeights& w = lt.host[e];
        if (place.home == Home::AnotherGpu) {
          w = {};  // never read: this GPU's router share sends no token to it
          continue;
        }
        if (place.home == Home::HostInPlace) {
          w = {in_place_address(x.gate), in_place_address(x.up), in_place_address(x.down)};
          lt.cpu[e] = {x.gate, x.up, x.down};
          continue;
        }
        uint8_t* span = nullptr;
        if (place.home == Home::HostCopy) {
          span = arena_device + place.offset;
          const uint8_t* host = static_cast<const uint8_t*>(st.arena_) + place.offset;
          lt.cpu[e] = {host + ll.span.gate, host + ll.span.up, host + ll.span.down};
        } else {
          span = vram[i] + place.offset;  // uploaded above
        }
        w = {span + ll.span.gate, span + ll.span.up, span + ll.span.down};
      }
    }
    rep.times.vram_copy = since(t);

    // Tables: every layer's in one allocation.
    t = Clock::now();
    trace("tables");
    size_t entries = 0;
    for (const LayerTable& lt : st.tables_) entries += lt.host.size();
    rep.table_bytes = int64_t(entries * sizeof(cuda::ExpertWeights));
    if (entries > 0) {
      cuda_ok(cudaMalloc(&st.device_tables_, entries * sizeof(cuda::ExpertWeights)), "allocating the expert tables");
      auto* dev = static_cast<cuda::ExpertWeights*>(st.device_tables_);
      for (LayerTable& lt : st.tables_) {
        if (lt.host.empty()) continue;
        cuda_ok(cudaMemcpy(dev, lt.host.data(), lt.host.size() * sizeof(cuda::ExpertWeights), cudaMemcpyHostToDevice),
                "uploading an expert table");
        lt.device = dev;
        dev += lt.host.size();
      }
    }
    cuda_ok(cudaDeviceSynchronize(), "finishing the expert uploads");
    rep.times.table_upload = since(t);
  } catch (...) {
    store->release();
    throw;
  }

  rep.moe_layers = int64_t(lay.layers.size());
  rep.vram_experts = lay.vram_experts;
  rep.vram_bytes = lay.vram_bytes;
  rep.host_in_place_experts = lay.host_in_place;
  rep.host_in_place_bytes = lay.in_place_bytes;
  rep.registered_bytes = lay.registered_bytes;
  rep.registrations = int64_t(lay.registrations.size());
  rep.host_copied_experts = lay.host_copied;
  rep.host_copy_bytes = lay.host_copy_bytes;
  rep.planned_host_bytes = lay.planned_host_bytes;
  rep.copy_reasons = lay.copy_reasons;
  rep.after = read_process_memory();
  rep.times.total = since(t_start);
  trace("built");
  return store;
}

void ExpertStore::release() noexcept {
  trace("releasing");
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  for (void* p : vram_blocks_) cudaFree(p);
  vram_blocks_.clear();
  if (device_tables_) cudaFree(device_tables_);
  device_tables_ = nullptr;
  for (void* p : registered_) cudaHostUnregister(p);
  registered_.clear();
  if (arena_) {
    if (arena_registered_) cudaHostUnregister(arena_);
    if (arena_numa_) numa_free(arena_, arena_bytes_);
    else ::munmap(arena_, arena_bytes_);
  }
  arena_ = nullptr;
  arena_registered_ = false;
  for (LayerTable& lt : tables_) lt.device = nullptr;
  if (previous >= 0) cudaSetDevice(previous);
}

ExpertStore::~ExpertStore() { release(); }

const cuda::ExpertWeights* ExpertStore::device_table(int64_t layer) const {
  if (layer < 0 || layer >= int64_t(tables_.size())) fail("expert store: no layer {}", layer);
  return tables_[size_t(layer)].device;
}

const std::vector<cuda::ExpertWeights>& ExpertStore::host_table(int64_t layer) const {
  if (layer < 0 || layer >= int64_t(tables_.size())) fail("expert store: no layer {}", layer);
  return tables_[size_t(layer)].host;
}

const std::vector<cuda::ExpertWeights>& ExpertStore::cpu_table(int64_t layer) const {
  if (layer < 0 || layer >= int64_t(tables_.size())) fail("expert store: no layer {}", layer);
  return tables_[size_t(layer)].cpu;
}

cuda::MoeShape ExpertStore::shape(int64_t layer) const {
  if (layer < 0 || layer >= int64_t(tables_.size()) || tables_[size_t(layer)].layout_index < 0)
    fail("expert store: layer {} has no routed experts on this GPU", layer);
  return tables_[size_t(layer)].shape;
}

Home ExpertStore::home(int64_t layer, int64_t expert) const {
  if (layer < 0 || layer >= int64_t(tables_.size()) || tables_[size_t(layer)].layout_index < 0)
    fail("expert store: layer {} has no routed experts on this GPU", layer);
  const LayerLayout& ll = layout_.layers[size_t(tables_[size_t(layer)].layout_index)];
  if (expert < 0 || expert >= int64_t(ll.experts.size())) fail("expert store: layer {} has no expert {}", layer, expert);
  return ll.experts[size_t(expert)].home;
}

}  // namespace spill::offload
#endif
