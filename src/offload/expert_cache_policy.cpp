#include "offload/expert_cache_policy.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace spill::offload {

ExpertCachePolicy::ExpertCachePolicy(std::vector<std::vector<bool>> host, const CachePolicyOptions& options)
    : options_(options) {
  if (options.slots < 0) fail("expert cache: {} slots", options.slots);
  if (!(options.half_life_steps > 0) || !std::isfinite(options.half_life_steps))
    fail("expert cache: the score half-life must be a positive number of steps, got {}", options.half_life_steps);
  if (!(options.admit_score >= 0) || !(options.replace_margin >= 0))
    fail("expert cache: admit score ({}) and replace margin ({}) must be >= 0", options.admit_score,
         options.replace_margin);
  if (options.max_copies_in_flight < 1) fail("expert cache: at least one copy in flight, got {}", options.max_copies_in_flight);
  n_layers_ = int32_t(host.size());
  n_experts_ = host.empty() ? 0 : int32_t(host[0].size());
  for (const auto& layer : host) {
    if (int32_t(layer.size()) != n_experts_)
      fail("expert cache: MoE layers with {} and {} experts; one pool needs one expert count", n_experts_, layer.size());
    for (bool h : layer) host_.push_back(h ? 1 : 0);
  }
  decay_ = std::pow(0.5, 1.0 / options.half_life_steps);
  scores_.assign(host_.size(), 0.0);
  slot_of_.assign(scores_.size(), -1);
  slots_.resize(size_t(options.slots));
  for (int64_t s = options.slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

void ExpertCachePolicy::observe(std::span<const uint32_t> touches, int64_t steps) {
  if (touches.size() != scores_.size())
    fail("expert cache: {} touch counts for {} MoE layers of {} experts (internal error)", touches.size(), n_layers_,
         n_experts_);
  if (steps < 1) fail("expert cache: counts of {} steps (internal error)", steps);
  // Several steps at once: the scores decay once per step; their touches are taken as of the last
  // (at most `steps` per expert, since an expert is read at most once per call).
  const double decay = steps == 1 ? decay_ : std::pow(decay_, double(steps));
  for (size_t i = 0; i < scores_.size(); ++i)
    scores_[i] = host_[i] ? scores_[i] * decay + double(touches[i]) : 0.0;
}

std::vector<CacheAdmission> ExpertCachePolicy::decide() {
  std::vector<CacheAdmission> out;
  const int64_t room = options_.max_copies_in_flight - in_flight_;
  if (room <= 0 || slots_.empty()) return out;
  // The hottest host experts without a slot that are worth a copy, hottest first.
  candidates_.clear();
  for (size_t i = 0; i < scores_.size(); ++i)
    if (scores_[i] >= options_.admit_score && scores_[i] > 0 && slot_of_[i] < 0) candidates_.push_back(i);
  if (candidates_.empty()) return out;
  auto hotter = [&](size_t a, size_t b) { return scores_[a] != scores_[b] ? scores_[a] > scores_[b] : a < b; };
  const size_t take = std::min(candidates_.size(), size_t(room));
  std::partial_sort(candidates_.begin(), candidates_.begin() + std::ptrdiff_t(take), candidates_.end(), hotter);
  candidates_.resize(take);
  // Slots to give: free ones first, then served ones from the coldest up (a slot still copying is
  // not taken: its copy is paid for and has not served yet). Only as many of the coldest as the
  // free slots leave short are sorted.
  auto slot_score = [&](int64_t s) {
    const CachedExpert& x = slots_[size_t(s)].expert;
    return scores_[index(x.moe_layer, x.expert)];
  };
  served_.clear();
  const size_t short_of = take > free_slots_.size() ? take - free_slots_.size() : 0;
  if (short_of > 0) {
    for (int64_t s = 0; s < int64_t(slots_.size()); ++s)
      if (slots_[size_t(s)].state == SlotState::Served) served_.push_back(s);
    const size_t k = std::min(short_of, served_.size());
    std::partial_sort(served_.begin(), served_.begin() + std::ptrdiff_t(k), served_.end(), [&](int64_t a, int64_t b) {
      const double sa = slot_score(a), sb = slot_score(b);
      return sa != sb ? sa < sb : a < b;
    });
    served_.resize(k);
  }
  size_t next_victim = 0;
  for (size_t c : candidates_) {
    CacheAdmission admission;
    admission.expert = {int32_t(c / size_t(n_experts_)), int32_t(c % size_t(n_experts_))};
    if (!free_slots_.empty()) {
      admission.slot = free_slots_.back();
      free_slots_.pop_back();
    } else if (next_victim < served_.size() &&
               scores_[c] > slot_score(served_[next_victim]) + options_.replace_margin) {
      admission.slot = served_[next_victim++];
      admission.evicted = slots_[size_t(admission.slot)].expert;
      slot_of_[index(admission.evicted.moe_layer, admission.evicted.expert)] = -1;
      ++evictions_;
    } else {
      break;  // candidates come hottest first: no later one beats the coldest slot either
    }
    slots_[size_t(admission.slot)] = {SlotState::Copying, admission.expert};
    slot_of_[c] = admission.slot;
    ++in_flight_;
    ++admissions_;
    out.push_back(admission);
  }
  return out;
}

void ExpertCachePolicy::landed(int64_t slot) {
  if (slot < 0 || slot >= int64_t(slots_.size()) || slots_[size_t(slot)].state != SlotState::Copying)
    fail("expert cache: slot {} landed but was not copying (internal error)", slot);
  slots_[size_t(slot)].state = SlotState::Served;
  --in_flight_;
}

bool ExpertCachePolicy::served(int32_t moe_layer, int32_t expert) const {
  const int64_t s = slot_of(moe_layer, expert);
  return s >= 0 && slots_[size_t(s)].state == SlotState::Served;
}

int64_t ExpertCachePolicy::slot_of(int32_t moe_layer, int32_t expert) const {
  if (moe_layer < 0 || moe_layer >= n_layers_ || expert < 0 || expert >= n_experts_) return -1;
  return slot_of_[index(moe_layer, expert)];
}

CachedExpert ExpertCachePolicy::expert_in(int64_t slot) const {
  if (slot < 0 || slot >= int64_t(slots_.size()) || slots_[size_t(slot)].state == SlotState::Free) return {};
  return slots_[size_t(slot)].expert;
}

double ExpertCachePolicy::score(int32_t moe_layer, int32_t expert) const {
  if (moe_layer < 0 || moe_layer >= n_layers_ || expert < 0 || expert >= n_experts_) return 0;
  return scores_[index(moe_layer, expert)];
}

int64_t ExpertCachePolicy::slots_used() const {
  return std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.state != SlotState::Free; });
}

}  // namespace spill::offload
