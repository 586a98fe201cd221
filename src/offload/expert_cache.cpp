// CUDA builds only: the file is empty otherwise, so the library's source glob needs no exception.
#if SPILL_HAVE_CUDA
#include "offload/expert_cache.h"

#include <algorithm>

#include "core/dtype.h"
#include "core/error.h"

namespace spill::offload {

namespace {

void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail("expert cache: {}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

}  // namespace

ExpertCache::ExpertCache(const ExpertStore& store, CachePolicyOptions policy)
    : store_(store), policy_([&] {
        std::vector<std::vector<bool>> host;
        for (const LayerLayout& l : store.layout().layers) {
          std::vector<bool> h(l.experts.size());
          for (size_t e = 0; e < l.experts.size(); ++e) h[e] = on_host(l.experts[e].home);
          host.push_back(std::move(h));
        }
        return host;
      }(), policy) {
  for (const LayerLayout& l : store.layout().layers) layers_.push_back(l.layer);
  effective_.assign(layers_.size() * size_t(policy_.n_experts()), 0);
}

std::unique_ptr<ExpertCache> ExpertCache::build(const ExpertStore& store, int64_t bytes, CachePolicyOptions policy) {
  int64_t slot_bytes = 0;
  for (const LayerLayout& l : store.layout().layers) slot_bytes = std::max(slot_bytes, l.span.bytes);
  slot_bytes = (std::max<int64_t>(slot_bytes, 1) + kSpanAlignment - 1) / kSpanAlignment * kSpanAlignment;
  if (store.layout().layers.empty()) fail("expert cache: the expert store holds no MoE layer");
  if (bytes < slot_bytes)
    fail("expert cache: {} bytes hold no expert; one slot takes {} bytes ({:.1f} MiB): raise --expert-cache-mem or "
         "leave it out",
         bytes, slot_bytes, double(slot_bytes) / 1048576.0);
  policy.slots = bytes / slot_bytes;
  std::unique_ptr<ExpertCache> cache(new ExpertCache(store, policy));
  cache->slot_bytes_ = slot_bytes;
  cuda_ok(cudaSetDevice(store.report().cuda_device), "selecting the device");
  void* mem = nullptr;
  const cudaError_t err = cudaMalloc(&mem, size_t(policy.slots * slot_bytes));
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("expert cache: allocating {} slots ({:.2f} GiB) of VRAM: {}; {:.2f} GiB are free: lower --expert-cache-mem",
         policy.slots, double(policy.slots * slot_bytes) / 1073741824.0, cudaGetErrorString(err),
         double(free_b) / 1073741824.0);
  }
  cache->slots_mem_ = static_cast<uint8_t*>(mem);
  cuda_ok(cudaStreamCreateWithFlags(&cache->copy_stream_, cudaStreamNonBlocking), "creating the copy stream");
  cuda_ok(cudaEventCreateWithFlags(&cache->tables_written_, cudaEventDisableTiming), "creating an event");
  cache->staged_capacity_ = size_t(2 * policy.max_copies_in_flight + 4);
  void* staged = nullptr;
  cuda_ok(cudaMallocHost(&staged, cache->staged_capacity_ * sizeof(cuda::ExpertWeights)),
          "allocating pinned memory for table entries");
  cache->staged_ = static_cast<cuda::ExpertWeights*>(staged);
  return cache;
}

ExpertCache::~ExpertCache() {
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  for (const Pending& p : pending_) cudaEventDestroy(p.landed);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  if (tables_written_) cudaEventDestroy(tables_written_);
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (staged_) cudaFreeHost(staged_);
  if (slots_mem_) cudaFree(slots_mem_);
}

cuda::ExpertWeights ExpertCache::entry(int32_t moe_index, int32_t expert, int64_t slot) const {
  const int64_t layer = layers_[size_t(moe_index)];
  if (slot < 0) return store_.host_table(layer)[size_t(expert)];
  const SpanLayout& span = store_.layout().layers[size_t(moe_index)].span;
  const uint8_t* base = slots_mem_ + slot * slot_bytes_;
  return {base + span.gate, base + span.up, base + span.down};
}

void ExpertCache::write_entry(int32_t moe_index, int32_t expert, const cuda::ExpertWeights& w, cudaStream_t stream) {
  if (staged_used_ == staged_capacity_) fail("expert cache: more table writes than staged (internal error)");
  cuda::ExpertWeights* src = staged_ + staged_used_++;
  *src = w;
  changes_.push_back({size_t(moe_index) * size_t(policy_.n_experts()) + size_t(expert),
                      uint8_t(w.gate != store_.host_table(layers_[size_t(moe_index)])[size_t(expert)].gate)});
  auto* table = const_cast<cuda::ExpertWeights*>(store_.device_table(layers_[size_t(moe_index)]));
  cuda_ok(cudaMemcpyAsync(table + expert, src, sizeof(cuda::ExpertWeights), cudaMemcpyHostToDevice, stream),
          "writing an expert table entry");
}

void ExpertCache::update(std::span<const uint32_t> touches, cudaStream_t stream) {
  // Everything enqueued before the current step has completed: the last call's table writes (the
  // current step reads them) and the staged entries they were copied from.
  for (const auto& [i, on] : changes_) effective_[i] = on;
  changes_.clear();
  staged_used_ = 0;
  policy_.observe(touches);

  // Copies that landed: their entries now point at their slots.
  for (size_t i = 0; i < pending_.size();) {
    const cudaError_t q = cudaEventQuery(pending_[i].landed);
    if (q == cudaErrorNotReady) {
      ++i;
      continue;
    }
    cuda_ok(q, "copying an expert into its slot");
    const int64_t slot = pending_[i].slot;
    policy_.landed(slot);
    free_events_.push_back(pending_[i].landed);
    pending_.erase(pending_.begin() + std::ptrdiff_t(i));
    const CachedExpert x = policy_.expert_in(slot);
    write_entry(x.moe_layer, x.expert, entry(x.moe_layer, x.expert, slot), stream);
  }

  const std::vector<CacheAdmission> admissions = policy_.decide();
  if (admissions.empty()) return;
  // Evicted experts go back to their host pages on the runner's stream; the copies into their
  // slots wait for that (no step after this one reads the slot for them).
  for (const CacheAdmission& a : admissions)
    if (a.evicted.valid()) write_entry(a.evicted.moe_layer, a.evicted.expert, entry(a.evicted.moe_layer, a.evicted.expert, -1), stream);
  cuda_ok(cudaEventRecord(tables_written_, stream), "recording an event");
  cuda_ok(cudaStreamWaitEvent(copy_stream_, tables_written_, 0), "ordering the copy stream");
  for (const CacheAdmission& a : admissions) {
    const int64_t layer = layers_[size_t(a.expert.moe_layer)];
    const cuda::MoeShape shape = store_.shape(layer);
    const int64_t gate_bytes = shape.width * row_bytes(shape.gate_up_type, shape.hidden);
    const int64_t down_bytes = shape.hidden * row_bytes(shape.down_type, shape.width);
    const cuda::ExpertWeights from = entry(a.expert.moe_layer, a.expert.expert, -1);
    const cuda::ExpertWeights to = entry(a.expert.moe_layer, a.expert.expert, a.slot);
    cuda_ok(cudaMemcpyAsync(const_cast<void*>(to.gate), from.gate, size_t(gate_bytes), cudaMemcpyDefault, copy_stream_),
            "copying an expert into its slot");
    cuda_ok(cudaMemcpyAsync(const_cast<void*>(to.up), from.up, size_t(gate_bytes), cudaMemcpyDefault, copy_stream_),
            "copying an expert into its slot");
    cuda_ok(cudaMemcpyAsync(const_cast<void*>(to.down), from.down, size_t(down_bytes), cudaMemcpyDefault, copy_stream_),
            "copying an expert into its slot");
    cudaEvent_t landed = nullptr;
    if (!free_events_.empty()) {
      landed = free_events_.back();
      free_events_.pop_back();
    } else {
      cuda_ok(cudaEventCreateWithFlags(&landed, cudaEventDisableTiming), "creating an event");
    }
    cuda_ok(cudaEventRecord(landed, copy_stream_), "recording an event");
    pending_.push_back({a.slot, landed});
    ++copies_;
    copy_bytes_ += 2 * gate_bytes + down_bytes;
  }
}

ExpertCacheReport ExpertCache::report() const {
  return {.slots = policy_.slots(),
          .slot_bytes = slot_bytes_,
          .bytes = policy_.slots() * slot_bytes_,
          .copies = copies_,
          .copy_bytes = copy_bytes_,
          .evictions = policy_.evictions(),
          .slots_used = policy_.slots_used()};
}

}  // namespace spill::offload
#endif
