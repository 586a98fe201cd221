// The VRAM expert cache on one GPU: executes ExpertCachePolicy's decisions (expert_cache_policy.h
// says what is cached and why) against an ExpertStore's tables.
//   - one device allocation of `slots` slots, each one expert's span (gate, up, down at the
//     layer's SpanLayout offsets; the slot size is the largest layer's span);
//   - a copy stream: each admission copies the expert's three matrices from their host pages
//     (pinned, mapped) into its slot and records an event;
//   - the layer's device table entry of a cached expert points at its slot once that event has
//     completed, and back at the host pages before its slot is given to another expert. Table
//     entries are written on the runner's stream between steps, so a step reads one consistent
//     table, and the bytes behind an entry are the same whether it points at the slot or at host
//     RAM: logits do not change when the cache does.
// The runner calls update() right after enqueuing a step, so its host work (the policy, the table
// writes, starting copies) overlaps the step on the GPU instead of adding to it; what it writes
// takes effect from the next step.
// CUDA builds only (SPILL_HAVE_CUDA).
#pragma once
#if SPILL_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "offload/expert_cache_policy.h"
#include "offload/expert_store.h"

namespace spill::offload {

struct ExpertCacheReport {
  int64_t slots = 0, slot_bytes = 0, bytes = 0;
  int64_t copies = 0, copy_bytes = 0, evictions = 0;
  int64_t slots_used = 0;
};

class ExpertCache {
 public:
  // `bytes` of VRAM for slots (as many whole slots as fit; at least one, else spill::Error saying
  // the size one slot needs). The store must outlive the cache; its layers' tables are rewritten.
  static std::unique_ptr<ExpertCache> build(const ExpertStore& store, int64_t bytes, CachePolicyOptions policy);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Right after a step was enqueued on `stream`, everything enqueued before it complete: the
  // touches of the last finished step ([moe_layers * n_experts], the MoE kernels' counters'
  // differences, MoE layers ascending) feed the policy, copies that landed are switched
  // in and new ones started. Table writes are enqueued on `stream` after the step, so they take
  // effect from the next one.
  void update(std::span<const uint32_t> touches, cudaStream_t stream);

  // Expert e of the store's `moe_index`-th MoE layer was read from its VRAM slot by the step
  // enqueued before the last update() (the table as that step saw it: for counting its reads).
  bool served_last_step(int32_t moe_index, int32_t expert) const {
    return effective_[size_t(moe_index) * size_t(policy_.n_experts()) + size_t(expert)] != 0;
  }
  const ExpertCachePolicy& policy() const { return policy_; }
  ExpertCacheReport report() const;

 private:
  ExpertCache(const ExpertStore& store, CachePolicyOptions policy);
  struct Pending {
    int64_t slot = -1;
    cudaEvent_t landed = nullptr;
  };
  // The entry for `expert` of MoE layer `moe_index` when read from `slot` (slot < 0: its host pages).
  cuda::ExpertWeights entry(int32_t moe_index, int32_t expert, int64_t slot) const;
  void write_entry(int32_t moe_index, int32_t expert, const cuda::ExpertWeights& w, cudaStream_t stream);

  const ExpertStore& store_;
  ExpertCachePolicy policy_;
  std::vector<int64_t> layers_;  // model layer of each MoE layer of the store
  int64_t slot_bytes_ = 0;
  uint8_t* slots_mem_ = nullptr;  // cudaMalloc, slots * slot_bytes
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t tables_written_ = nullptr;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  // Table entries staged for the runner's stream (pinned; reused once the stream has drained).
  cuda::ExpertWeights* staged_ = nullptr;
  size_t staged_capacity_ = 0, staged_used_ = 0;
  int64_t copies_ = 0, copy_bytes_ = 0;
  // The table the GPU reads, per (MoE layer, expert): 1 where the entry points at a slot; and the
  // changes written during the last update(), which the step after it is the first to see.
  std::vector<uint8_t> effective_;
  std::vector<std::pair<size_t, uint8_t>> changes_;
};

}  // namespace spill::offload
#endif
