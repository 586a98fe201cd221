#include "offload/expert_staging.h"

#include <algorithm>
#include <cmath>

namespace spill::offload {

bool worth_staging(int64_t n_tokens, int64_t call_tokens, int64_t top_k, int64_t n_experts) {
  if (n_tokens <= 0 || call_tokens <= 0 || top_k <= 0 || n_experts <= 0) return false;
  const int64_t calls = (n_tokens + call_tokens - 1) / call_tokens;
  const int64_t per_call = (n_tokens + calls - 1) / calls;
  const double untouched = std::pow(1.0 - double(std::min(top_k, n_experts)) / double(n_experts), double(per_call));
  return double(calls) * (1.0 - untouched) >= 0.5;
}

}  // namespace spill::offload

#if SPILL_HAVE_CUDA
#include <fmt/format.h>

#include "core/error.h"

namespace spill::offload {
namespace {

void staging_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail("expert staging: {}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

int64_t align_up(int64_t v) { return (v + kSpanAlignment - 1) / kSpanAlignment * kSpanAlignment; }

// One projection of one host expert: where its bytes are (device-visible) and which table field.
struct Part {
  const uint8_t* src;
  int64_t bytes;
  int32_t expert;
  int8_t field;  // 0 gate, 1 up, 2 down
};

// A layer's host experts as copies into a slot: parts sorted by address, neighbours merged.
struct Merged {
  std::vector<Part> parts;
  std::vector<int64_t> part_offset;  // into the slot
  std::vector<std::pair<const uint8_t*, std::pair<int64_t, int64_t>>> copies;  // src, (offset, bytes)
  int64_t bytes = 0;
};

Merged merge_layer(const ExpertStore& store, const LayerLayout& ll) {
  const cuda::MoeShape shape = store.shape(ll.layer);
  const int64_t gate_bytes = shape.width * row_bytes(shape.gate_up_type, shape.hidden);
  const int64_t down_bytes = shape.hidden * row_bytes(shape.down_type, shape.width);
  const std::vector<cuda::ExpertWeights>& table = store.host_table(ll.layer);
  Merged m;
  for (size_t e = 0; e < ll.experts.size(); ++e) {
    if (!on_host(ll.experts[e].home)) continue;
    const cuda::ExpertWeights& w = table[e];
    m.parts.push_back({static_cast<const uint8_t*>(w.gate), gate_bytes, int32_t(e), 0});
    m.parts.push_back({static_cast<const uint8_t*>(w.up), gate_bytes, int32_t(e), 1});
    m.parts.push_back({static_cast<const uint8_t*>(w.down), down_bytes, int32_t(e), 2});
  }
  std::sort(m.parts.begin(), m.parts.end(), [](const Part& a, const Part& b) { return a.src < b.src; });
  m.part_offset.resize(m.parts.size());
  const uint8_t* run_src = nullptr;
  int64_t run_offset = 0, run_bytes = 0;
  auto close_run = [&] {
    if (run_bytes > 0) m.copies.push_back({run_src, {run_offset, run_bytes}});
    m.bytes = align_up(run_offset + run_bytes);
  };
  for (size_t i = 0; i < m.parts.size(); ++i) {
    const Part& p = m.parts[i];
    // Contiguous with the run, or a gap of at most the span alignment (the arena's padding): one
    // copy, the padding's few bytes copied along.
    const bool joins = run_bytes > 0 && p.src >= run_src + run_bytes && p.src - (run_src + run_bytes) < kSpanAlignment;
    if (!joins) {
      close_run();
      run_src = p.src;
      // Same offset within 256 bytes as the source: the kernels read 16-byte words at the
      // part's own alignment, and a copy keeps the source's alignment on both sides.
      run_offset = m.bytes + int64_t(uintptr_t(p.src) % uintptr_t(kSpanAlignment));
      run_bytes = 0;
    }
    m.part_offset[i] = run_offset + (p.src - run_src);
    run_bytes = (p.src + p.bytes) - run_src;
  }
  close_run();
  return m;
}

}  // namespace

int64_t ExpertStaging::bytes_needed(const ExpertStore& store) {
  int64_t slot = 0;
  for (const LayerLayout& ll : store.layout().layers)
    if (ll.host_in_place + ll.host_copied > 0) slot = std::max(slot, merge_layer(store, ll).bytes);
  return 2 * slot;
}

std::unique_ptr<ExpertStaging> ExpertStaging::build(const ExpertStore& store) {
  const StoreLayout& lay = store.layout();
  std::vector<Merged> merged;
  std::unique_ptr<ExpertStaging> s(new ExpertStaging());
  int64_t n_layers = 0, entries = 0;
  for (const LayerLayout& ll : lay.layers) {
    merged.push_back(merge_layer(store, ll));
    s->slot_bytes_ = std::max(s->slot_bytes_, merged.back().bytes);
    s->bytes_per_step_ += merged.back().bytes;
    n_layers = std::max(n_layers, ll.layer + 1);
    entries += int64_t(ll.experts.size());
  }
  if (s->slot_bytes_ == 0) return nullptr;
  s->device_ = store.report().cuda_device;
  staging_ok(cudaSetDevice(s->device_), "selecting the device");
  void* mem = nullptr;
  const cudaError_t err = cudaMalloc(&mem, size_t(2 * s->slot_bytes_));
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail("expert staging: allocating two slots of {:.2f} GiB for a layer's host experts: {}", s->slot_bytes_ / 1073741824.0,
         cudaGetErrorString(err));
  }
  s->slots_ = static_cast<uint8_t*>(mem);
  staging_ok(cudaMalloc(reinterpret_cast<void**>(&s->tables_), size_t(entries) * sizeof(cuda::ExpertWeights)),
          "allocating the staged tables");
  staging_ok(cudaStreamCreateWithFlags(&s->copy_stream_, cudaStreamNonBlocking), "creating the copy stream");
  for (int i = 0; i < 2; ++i) {
    staging_ok(cudaEventCreateWithFlags(&s->ready_[i], cudaEventDisableTiming), "creating an event");
    staging_ok(cudaEventCreateWithFlags(&s->free_[i], cudaEventDisableTiming), "creating an event");
  }
  s->by_layer_.assign(size_t(n_layers), -1);
  cuda::ExpertWeights* table = s->tables_;
  for (size_t i = 0; i < lay.layers.size(); ++i) {
    const LayerLayout& ll = lay.layers[i];
    const Merged& m = merged[i];
    uint8_t* slot = s->slots_ + (i % 2) * size_t(s->slot_bytes_);
    std::vector<cuda::ExpertWeights> entries_h = store.host_table(ll.layer);
    for (size_t p = 0; p < m.parts.size(); ++p) {
      cuda::ExpertWeights& w = entries_h[size_t(m.parts[p].expert)];
      const void* at = slot + m.part_offset[p];
      (m.parts[p].field == 0 ? w.gate : m.parts[p].field == 1 ? w.up : w.down) = at;
    }
    staging_ok(cudaMemcpy(table, entries_h.data(), entries_h.size() * sizeof(cuda::ExpertWeights), cudaMemcpyHostToDevice),
            "uploading a staged table");
    Layer L{.layer = ll.layer, .copies = {}, .table = table};
    for (const auto& [src, where] : m.copies) L.copies.push_back({src, where.first, where.second});
    s->by_layer_[size_t(ll.layer)] = int64_t(s->layers_.size());
    s->layers_.push_back(std::move(L));
    table += entries_h.size();
  }
  return s;
}

ExpertStaging::~ExpertStaging() {
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  for (int i = 0; i < 2; ++i) {
    if (ready_[i]) cudaEventDestroy(ready_[i]);
    if (free_[i]) cudaEventDestroy(free_[i]);
  }
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (tables_) cudaFree(tables_);
  if (slots_) cudaFree(slots_);
  if (previous >= 0) cudaSetDevice(previous);
}

const cuda::ExpertWeights* ExpertStaging::table(int64_t layer) const {
  if (layer < 0 || layer >= int64_t(by_layer_.size()) || by_layer_[size_t(layer)] < 0)
    fail("expert staging: layer {} has no staged table", layer);
  return layers_[size_t(by_layer_[size_t(layer)])].table;
}

void ExpertStaging::issue(int64_t m) {
  if (m >= int64_t(layers_.size())) return;
  staging_ok(cudaStreamWaitEvent(copy_stream_, free_[m % 2], 0), "ordering a staging copy");
  uint8_t* slot = slots_ + (m % 2) * size_t(slot_bytes_);
  for (const Copy& c : layers_[size_t(m)].copies)
    staging_ok(cudaMemcpyAsync(slot + c.offset, c.src, size_t(c.bytes), cudaMemcpyDefault, copy_stream_),
            "copying a layer's host experts to VRAM");
  staging_ok(cudaEventRecord(ready_[m % 2], copy_stream_), "ordering a staging copy");
}

void ExpertStaging::begin(cudaStream_t stream) {
  // Both slots are free once the stream's earlier work (the previous step) is done.
  for (int i = 0; i < 2; ++i) staging_ok(cudaEventRecord(free_[i], stream), "ordering a staging copy");
  issue(0);
  issue(1);
}

void ExpertStaging::before_experts(int64_t m, cudaStream_t stream) {
  staging_ok(cudaStreamWaitEvent(stream, ready_[m % 2], 0), "waiting for a staging copy");
}

void ExpertStaging::after_experts(int64_t m, cudaStream_t stream) {
  staging_ok(cudaEventRecord(free_[m % 2], stream), "ordering a staging copy");
  issue(m + 2);
}

}  // namespace spill::offload
#endif
