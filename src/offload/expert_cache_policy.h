// The VRAM expert cache's decisions: which host experts get a VRAM slot, and when. Pure host code,
// tested in CI; offload/expert_cache.h executes the decisions on a GPU.
//
// The plan puts each routed expert in VRAM or in host RAM once, from a profile. Live traffic can
// differ (another language, another task, a skewed user), so a fixed number of VRAM slots holds
// copies of the host experts that steps read most now. What a slot saves: the MoE kernels read a
// host expert's bytes over PCIe once in every step that routes a token to it (however many
// tokens), so a cached expert saves its bytes in each step that touches it.
//
// Why not LRU on misses: a host expert is read in place whether or not it is cached, and a copy
// into a slot costs the same PCIe bytes as one more read. Copying on every miss doubles the host
// traffic of the experts that are touched once and not again soon, which at batch 1 is most of
// them. A copy pays only when the expert will be touched several times while it stays. So each
// host expert has a score, the steps that touched it decayed exponentially (half-life
// `half_life_steps`), an expert is admitted when its score reaches `admit_score`, and it takes the
// slot of the lowest-scored cached expert only when it outscores it by `replace_margin` (so two
// experts of similar heat do not swap slots back and forth, each swap a copy).
//
// Slots are one pool shared by every MoE layer: layers whose traffic is hotter get more of them.
// Copies in flight are bounded (`max_copies_in_flight`): they share PCIe with the in-place reads
// of the steps running meanwhile, and a slot only serves once its copy has landed.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace spill::offload {

struct CachePolicyOptions {
  int64_t slots = 0;
  double half_life_steps = 32;  // a touch's weight halves after this many steps
  double admit_score = 1.5;     // a score below this is not worth a copy (one touch scores 1)
  double replace_margin = 1.0;  // a candidate must beat a cached expert's score by this to take its slot
  int64_t max_copies_in_flight = 2;
};

// One expert: its MoE layer's index among the model's MoE layers, and its id in the layer.
struct CachedExpert {
  int32_t moe_layer = -1;
  int32_t expert = -1;
  bool valid() const { return moe_layer >= 0; }
  bool operator==(const CachedExpert&) const = default;
};

// One decision: copy `expert` into `slot`; `evicted`, when valid, held the slot and goes back to
// being read in place (before the copy may start writing the slot).
struct CacheAdmission {
  int64_t slot = -1;
  CachedExpert expert{};
  CachedExpert evicted{};
};

class ExpertCachePolicy {
 public:
  // host[l][e]: the plan puts expert e of MoE layer l in host RAM (only those are cached).
  // Throws spill::Error for options that cannot work (negative slots, a half-life <= 0, ...).
  ExpertCachePolicy(std::vector<std::vector<bool>> host, const CachePolicyOptions& options);

  // One step's (or several steps') touches: touches[l * n_experts + e] is how many times the MoE
  // kernels read expert e of MoE layer l since the last call (the steps' counters' differences).
  // `steps` is how many steps the counts cover (>= 1); the scores decay once per step.
  void observe(std::span<const uint32_t> touches, int64_t steps = 1);

  // The copies to start now (none while max_copies_in_flight are pending). An admitted expert is
  // `copying` until landed() says its copy is done; only then is it `served` from its slot.
  std::vector<CacheAdmission> decide();
  void landed(int64_t slot);

  // Expert e of MoE layer l is read from a VRAM slot now (its copy landed).
  bool served(int32_t moe_layer, int32_t expert) const;
  int64_t slot_of(int32_t moe_layer, int32_t expert) const;  // -1: none (neither copying nor served)
  CachedExpert expert_in(int64_t slot) const;                // invalid for a free slot
  double score(int32_t moe_layer, int32_t expert) const;

  int64_t slots() const { return int64_t(slots_.size()); }
  int64_t slots_used() const;       // copying or served
  int64_t copies_in_flight() const { return in_flight_; }
  int64_t admissions() const { return admissions_; }
  int64_t evictions() const { return evictions_; }
  int32_t moe_layers() const { return n_layers_; }
  int32_t n_experts() const { return n_experts_; }

 private:
  enum class SlotState : uint8_t { Free, Copying, Served };
  struct Slot {
    SlotState state = SlotState::Free;
    CachedExpert expert{};
  };
  size_t index(int32_t l, int32_t e) const { return size_t(l) * size_t(n_experts_) + size_t(e); }

  // Runs every step on the thread that runs the steps: flat arrays, no per-step allocation beyond
  // the small candidate lists, a free-slot stack instead of a scan.
  int32_t n_layers_ = 0, n_experts_ = 0;
  std::vector<uint8_t> host_;     // [layers * experts]
  CachePolicyOptions options_;
  double decay_ = 1.0;            // per step: 0.5^(1 / half_life)
  std::vector<double> scores_;    // [layers * experts], host experts only are non-zero
  std::vector<int64_t> slot_of_;  // [layers * experts], -1 none
  std::vector<Slot> slots_;
  std::vector<int64_t> free_slots_;  // a stack; the lowest slot on top
  std::vector<size_t> candidates_;
  std::vector<int64_t> served_;
  int64_t in_flight_ = 0, admissions_ = 0, evictions_ = 0;
};

}  // namespace spill::offload
