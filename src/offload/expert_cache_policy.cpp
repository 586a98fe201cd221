#include "offload/expert_cache_policy.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace spill::offload {

ExpertCachePolicy::ExpertCachePolicy(std::vector<std::vector<bool>> host, const CachePolicyOptions& options)
    : host_(std::move(host)), options_(options) {
  if (options.slots < 0) fail("expert cache: {} slots", options.slots);
  if (!(options.half_life_steps > 0) || !std::isfinite(options.half_life_steps))
    fail("expert cache: the score half-life must be a positive number of steps, got {}", options.half_life_steps);
  if (!(options.admit_score >= 0) || !(options.replace_margin >= 0))
    fail("expert cache: admit score ({}) and replace margin ({}) must be >= 0", options.admit_score,
         options.replace_margin);
  if (options.max_copies_in_flight < 1) fail("expert cache: at least one copy in flight, got {}", options.max_copies_in_flight);
  n_experts_ = host_.empty() ? 0 : int32_t(host_[0].size());
  for (const auto& layer : host_)
    if (int32_t(layer.size()) != n_experts_)
      fail("expert cache: MoE layers with {} and {} experts; one pool needs one expert count", n_experts_, layer.size());
  decay_ = std::pow(0.5, 1.0 / options.half_life_steps);
  scores_.assign(host_.size() * size_t(n_experts_), 0.0);
  slot_of_.assign(scores_.size(), -1);
  slots_.resize(size_t(options.slots));
}

void ExpertCachePolicy::observe(std::span<const uint32_t> touches, int64_t steps) {
  if (touches.size() != scores_.size())
    fail("expert cache: {} touch counts for {} MoE layers of {} experts (internal error)", touches.size(), host_.size(),
         n_experts_);
  if (steps < 1) fail("expert cache: counts of {} steps (internal error)", steps);
  // Several steps at once: the scores decay once per step; their touches are taken as of the last
  // (at most `steps` per expert, since an expert is read at most once per call).
  const double decay = std::pow(decay_, double(steps));
  for (size_t l = 0; l < host_.size(); ++l)
    for (int32_t e = 0; e < n_experts_; ++e) {
      if (!host_[l][size_t(e)]) continue;
      const size_t i = index(int32_t(l), e);
      scores_[i] = scores_[i] * decay + double(touches[i]);
    }
}

std::vector<CacheAdmission> ExpertCachePolicy::decide() {
  std::vector<CacheAdmission> out;
  const int64_t room = options_.max_copies_in_flight - in_flight_;
  if (room <= 0 || slots_.empty()) return out;
  // The hottest host experts without a slot that are worth a copy, hottest first.
  std::vector<size_t> candidates;
  for (size_t i = 0; i < scores_.size(); ++i)
    if (slot_of_[i] < 0 && scores_[i] >= options_.admit_score && scores_[i] > 0) candidates.push_back(i);
  auto hotter = [&](size_t a, size_t b) { return scores_[a] != scores_[b] ? scores_[a] > scores_[b] : a < b; };
  const size_t take = std::min(candidates.size(), size_t(room));
  std::partial_sort(candidates.begin(), candidates.begin() + std::ptrdiff_t(take), candidates.end(), hotter);
  candidates.resize(take);
  if (candidates.empty()) return out;
  // Slots to give: free ones first, then served ones from the coldest up (a slot still copying is
  // not taken: its copy is paid for and has not served yet).
  std::vector<int64_t> free_slots, served;
  for (int64_t s = 0; s < int64_t(slots_.size()); ++s) {
    if (slots_[size_t(s)].state == SlotState::Free) free_slots.push_back(s);
    else if (slots_[size_t(s)].state == SlotState::Served) served.push_back(s);
  }
  auto slot_score = [&](int64_t s) {
    const CachedExpert& x = slots_[size_t(s)].expert;
    return scores_[index(x.moe_layer, x.expert)];
  };
  std::sort(served.begin(), served.end(), [&](int64_t a, int64_t b) {
    return slot_score(a) != slot_score(b) ? slot_score(a) < slot_score(b) : a < b;
  });
  size_t next_free = 0, next_victim = 0;
  for (size_t c : candidates) {
    CacheAdmission admission;
    admission.expert = {int32_t(c / size_t(n_experts_)), int32_t(c % size_t(n_experts_))};
    if (next_free < free_slots.size()) {
      admission.slot = free_slots[next_free++];
    } else if (next_victim < served.size() &&
               scores_[c] > slot_score(served[next_victim]) + options_.replace_margin) {
      admission.slot = served[next_victim++];
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
  if (moe_layer < 0 || size_t(moe_layer) >= host_.size() || expert < 0 || expert >= n_experts_) return -1;
  return slot_of_[index(moe_layer, expert)];
}

CachedExpert ExpertCachePolicy::expert_in(int64_t slot) const {
  if (slot < 0 || slot >= int64_t(slots_.size()) || slots_[size_t(slot)].state == SlotState::Free) return {};
  return slots_[size_t(slot)].expert;
}

double ExpertCachePolicy::score(int32_t moe_layer, int32_t expert) const {
  if (moe_layer < 0 || size_t(moe_layer) >= host_.size() || expert < 0 || expert >= n_experts_) return 0;
  return scores_[index(moe_layer, expert)];
}

int64_t ExpertCachePolicy::slots_used() const {
  return std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.state != SlotState::Free; });
}

}  // namespace spill::offload
