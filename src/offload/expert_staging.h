// Staged host experts for steps that touch most of them (prefill chunks, big mixed steps): instead
// of every MoE call of the step reading its host experts in place over PCIe, each MoE layer's
// host experts are copied once into a VRAM slot on a copy stream and read from there.
//   - two slots, each the largest layer's host expert bytes: layer m copies into slot m % 2, so the
//     copy of layer m + 1 runs while layer m computes, and the copy of layer m + 2 starts once
//     layer m's experts are done with the slot (events, no host synchronisation);
//   - a layer's host experts are merged into as few copies as their addresses allow (a pinned
//     arena holds a layer's copied experts back to back: one copy per layer);
//   - a staged table per layer, like the store's but with its host experts at their slot, which
//     the MoE kernels read instead of the store's table on a staged step. The bytes are the same,
//     so the logits are too.
// In place, a step reads each touched host expert once per MoE call; staged, it reads every host
// expert of a layer once, overlapped with the previous layer's compute. worth_staging() is the
// choice between the two (docs/offload.md). Decode steps replayed from graphs always read in place.
// ExpertStaging: CUDA builds only (SPILL_HAVE_CUDA); worth_staging is pure host code.
#pragma once
#include <cstdint>

namespace spill::offload {

// The staging choice for a step of n_tokens tokens run through MoE calls of at most call_tokens
// tokens each, top_k of n_experts experts per token, under uniform routing: in place, a call
// touches a share 1 - (1 - top_k / n_experts)^t of the host experts (t its tokens), read once per
// call; staged, every host expert is copied once. Staged when in place would read at least half
// the bytes staging copies: from there the copy's overlap with the previous layer's compute (in-place
// reads wait for the layer's router) outweighs the bytes it reads in vain.
bool worth_staging(int64_t n_tokens, int64_t call_tokens, int64_t top_k, int64_t n_experts);

}  // namespace spill::offload

#if SPILL_HAVE_CUDA
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "offload/expert_store.h"

namespace spill::offload {

class ExpertStaging {
 public:
  // Two slots for the store's largest layer of host experts; null when the store holds no host
  // expert. Throws spill::Error when the VRAM cannot be had.
  static std::unique_ptr<ExpertStaging> build(const ExpertStore& store);
  // The VRAM build() would take, without allocating it.
  static int64_t bytes_needed(const ExpertStore& store);
  ~ExpertStaging();
  ExpertStaging(const ExpertStaging&) = delete;
  ExpertStaging& operator=(const ExpertStaging&) = delete;

  int64_t bytes() const { return 2 * slot_bytes_; }
  int64_t bytes_per_step() const { return bytes_per_step_; }  // host bytes one staged step copies
  // The staged table of the store's MoE layer `layer` (device memory, [n_experts]).
  const cuda::ExpertWeights* table(int64_t layer) const;

  // A staged step, in the order the runner enqueues it on `stream`: begin() before the first
  // layer (the first two layers' copies, after what the stream holds so far); before_experts(m)
  // before MoE layer m's experts (waits for its copy); after_experts(m) right after them (slot
  // m % 2 is free: starts layer m + 2's copy). m counts the MoE layers from 0.
  void begin(cudaStream_t stream);
  void before_experts(int64_t m, cudaStream_t stream);
  void after_experts(int64_t m, cudaStream_t stream);

 private:
  ExpertStaging() = default;
  struct Copy {
    const void* src;
    int64_t offset, bytes;  // into the slot
  };
  struct Layer {
    int64_t layer = 0;  // the model layer
    std::vector<Copy> copies;
    cuda::ExpertWeights* table = nullptr;  // device
  };
  void issue(int64_t m);

  int device_ = 0;
  int64_t slot_bytes_ = 0, bytes_per_step_ = 0;
  uint8_t* slots_ = nullptr;                // cudaMalloc, 2 x slot_bytes_
  cuda::ExpertWeights* tables_ = nullptr;   // cudaMalloc, every layer's staged table
  std::vector<Layer> layers_;               // the store's MoE layers, ascending
  std::vector<int64_t> by_layer_;           // model layer -> index into layers_, -1 none
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t ready_[2] = {nullptr, nullptr}, free_[2] = {nullptr, nullptr};
};

}  // namespace spill::offload
#endif
