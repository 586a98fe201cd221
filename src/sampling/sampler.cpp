#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/philox.h"
#include "sampling/sampling_math.h"

namespace spill {

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    fail("sampling: temperature must be a finite number >= 0 (0 means greedy), got {}", temperature);
  if (top_k < -1) fail("sampling: top_k must be >= 1, or 0 / -1 to disable it, got {}", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("sampling: top_p must be in (0, 1], got {}", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("sampling: min_p must be in [0, 1], got {}", min_p);
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    fail("sampling: repetition_penalty must be a finite number > 0 (1 disables it), got {}", repetition_penalty);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    fail("sampling: presence_penalty must be in [-2, 2], got {}", presence_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    fail("sampling: frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs)
    fail("sampling: top_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, top_logprobs);
  if (top_logprobs > 0 && !logprobs) fail("sampling: top_logprobs needs logprobs = true");
}

namespace {

// Higher score first; among equal scores the lower token id first (torch.argmax / stable sort).
struct MoreLikely {
  std::span<const float> scores;
  bool operator()(int32_t a, int32_t b) const {
    const float sa = scores[size_t(a)], sb = scores[size_t(b)];
    return sa > sb || (sa == sb && a < b);
  }
};

}  // namespace

void compute_logprobs(std::span<const float> logits, int32_t token, int32_t top_n, SampledToken& out) {
  float max = -std::numeric_limits<float>::infinity();
  for (float v : logits)
    if (v > max) max = v;
  double sum = 0.0;
  for (float v : logits)
    if (v > -std::numeric_limits<float>::infinity()) sum += std::exp(double(v) - double(max));
  const double log_z = double(max) + std::log(sum);
  auto logprob_of = [&](int32_t t) {
    const float v = logits[size_t(t)];
    return std::isnan(v) ? -std::numeric_limits<float>::infinity() : float(double(v) - log_z);
  };
  out.logprob = logprob_of(token);
  out.top.clear();
  if (top_n <= 0) return;
  // A bounded heap keeps this O(vocab * log n) with no vocab-sized allocation.
  const MoreLikely more_likely{logits};
  std::vector<int32_t> heap;  // min-heap under more_likely: the least likely of the best n on top
  heap.reserve(size_t(top_n) + 1);
  for (int32_t t = 0; t < int32_t(logits.size()); ++t) {
    if (std::isnan(logits[size_t(t)])) continue;
    if (int32_t(heap.size()) < top_n) {
      heap.push_back(t);
      std::push_heap(heap.begin(), heap.end(), more_likely);
    } else if (more_likely(t, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), more_likely);
      heap.back() = t;
      std::push_heap(heap.begin(), heap.end(), more_likely);
    }
  }
  std::sort(heap.begin(), heap.end(), more_likely);
  for (int32_t t : heap) out.top.push_back({t, logprob_of(t)});
}

SequenceSampler::SequenceSampler(const SamplingParams& params, std::span<const int32_t> prompt, uint64_t fallback_seed)
    : params_(params), seed_(params.seed.value_or(fallback_seed)) {
  if (params_.repetition_penalty != 1.0f) {
    prompt_tokens_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
    prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()), prompt_tokens_.end());
  }
}

void SequenceSampler::record(int32_t token) {
  auto [it, inserted] = output_counts_.try_emplace(token, 0);
  if (inserted) output_tokens_.push_back(token);
  ++it->second;
}

int32_t SequenceSampler::output_count(int32_t token) const {
  auto it = output_counts_.find(token);
  return it == output_counts_.end() ? 0 : it->second;
}

void SequenceSampler::accept(int32_t token) {
  if (token < 0) fail("sampler: cannot accept token id {}; ids are non-negative", token);
  record(token);
  ++n_sampled_;
}

void SequenceSampler::apply_penalties(std::span<float> scores) const {
  const int64_t vocab = int64_t(scores.size());
  auto in_vocab = [vocab](int32_t t) { return t >= 0 && t < vocab; };
  const float rp = params_.repetition_penalty;
  if (rp != 1.0f) {
    auto penalise = [&](int32_t t) {
      float& s = scores[size_t(t)];
      s = s > 0.0f ? s / rp : s * rp;
    };
    // A token in both prompt and output is penalised once, as HF's gather/scatter over the set does.
    for (int32_t t : prompt_tokens_)
      if (in_vocab(t)) penalise(t);
    for (int32_t t : output_tokens_)
      if (in_vocab(t) && !std::binary_search(prompt_tokens_.begin(), prompt_tokens_.end(), t)) penalise(t);
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (int32_t t : output_tokens_) {
      if (!in_vocab(t)) continue;
      const int32_t count = output_counts_.at(t);
      scores[size_t(t)] -= sampling_count_penalty(params_.presence_penalty, params_.frequency_penalty, count);
    }
  }
}

int32_t SequenceSampler::pick_greedy(std::span<const float> scores) const {
  int32_t best = -1;
  float best_score = -std::numeric_limits<float>::infinity();
  for (int32_t t = 0; t < int32_t(scores.size()); ++t) {
    // Strictly greater: the first (lowest id) of equal maxima wins.
    if (scores[size_t(t)] > best_score) {
      best_score = scores[size_t(t)];
      best = t;
    }
  }
  return best;  // -1: every score is -inf or NaN
}

namespace {

// The least likely candidate with mass whose mass before it (over the more likely candidates, in
// key order) is <= threshold; -1 when no candidate has mass. Found digit by digit (8 bits of the
// 64-bit key a pass), summing exact integer masses, as the CUDA sampler does with a block-wide
// histogram: the same function of the masses, whatever the order of the candidates.
int32_t select_by_mass(std::span<const uint64_t> keys, std::span<const uint64_t> mass, uint64_t threshold) {
  if (keys.size() <= 32) {
    // Few candidates (after top-k, or a tiny vocabulary): walk them in key order directly; the
    // integer sums make this the same function as the digit search below.
    uint64_t order[32];
    size_t n = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      if (mass[i] > 0) order[n++] = i;
    std::sort(order, order + n, [&](uint64_t a, uint64_t b) { return keys[a] > keys[b]; });
    int32_t picked = -1;
    uint64_t before = 0;
    for (size_t j = 0; j < n && before <= threshold; ++j) {
      picked = sampling_key_token(keys[order[j]]);
      before += mass[order[j]];
    }
    return picked;
  }
  uint64_t prefix = 0, prefix_mask = 0, before = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    uint64_t hist[256] = {};
    for (size_t i = 0; i < keys.size(); ++i)
      if (mass[i] > 0 && (keys[i] & prefix_mask) == prefix) hist[(keys[i] >> shift) & 255] += mass[i];
    int chosen = -1;
    uint64_t running = before, chosen_before = 0;
    for (int b = 255; b >= 0; --b) {
      if (hist[b] == 0) continue;
      if (running <= threshold) {
        chosen = b;
        chosen_before = running;
      }
      running += hist[b];
    }
    if (chosen < 0) return -1;
    before = chosen_before;
    prefix |= uint64_t(chosen) << shift;
    prefix_mask |= uint64_t(255) << shift;
  }
  return sampling_key_token(prefix);
}

}  // namespace

int32_t SequenceSampler::pick_random(std::span<float> scores, SamplerWorkspace& ws) {
  // A row's integer masses (2^45 for the top token) must sum below 2^63.
  if (scores.size() > kMaxSampledVocab)
    fail("sampler: a vocabulary of {} logits is more than the {} the sampler's integer masses hold", scores.size(),
         kMaxSampledVocab);
  const float inv_t = 1.0f / params_.temperature;
  std::vector<int32_t>& cand = ws.candidates;
  cand.clear();
  for (int32_t t = 0; t < int32_t(scores.size()); ++t) {
    float& s = scores[size_t(t)];
    s *= inv_t;
    // -inf has no mass and NaN cannot be ranked: neither can be picked.
    if (s > -std::numeric_limits<float>::infinity()) cand.push_back(t);
  }
  if (cand.empty()) return -1;
  const MoreLikely more_likely{scores};

  // top-k: the k best under MoreLikely, which is the order of sampling_key.
  if (params_.top_k > 0 && size_t(params_.top_k) < cand.size()) {
    std::nth_element(cand.begin(), cand.begin() + params_.top_k, cand.end(), more_likely);
    cand.resize(static_cast<size_t>(params_.top_k));
  }

  float max_score = -std::numeric_limits<float>::infinity();
  for (int32_t t : cand) max_score = std::max(max_score, scores[size_t(t)]);
  std::vector<uint64_t>& keys = ws.keys;
  std::vector<uint64_t>& mass = ws.mass;
  keys.resize(cand.size());
  mass.resize(cand.size());
  uint64_t total = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    const float s = scores[size_t(cand[i])];
    keys[i] = sampling_key(s, cand[i]);
    mass[i] = sampling_mass(sampling_weight(s, max_score));
    total += mass[i];
  }

  if (params_.top_p < 1.0f) {
    // Keep tokens while the mass before them is below top_p: the smallest prefix (in MoreLikely
    // order) whose mass reaches top_p (HF removes the tail whose cumulative mass is <= 1 - top_p).
    const int32_t last = select_by_mass(keys, mass, sampling_top_p_limit(params_.top_p, total) - 1);
    const uint64_t last_key = keys[size_t(std::find(cand.begin(), cand.end(), last) - cand.begin())];
    total = 0;
    for (size_t i = 0; i < cand.size(); ++i) {
      if (keys[i] < last_key) mass[i] = 0;
      total += mass[i];
    }
  }
  if (params_.min_p > 0.0f) {
    // p / p_max = w / w_max, and w_max = 1 (the top token is always a candidate).
    const double floor = double(params_.min_p);
    total = 0;
    for (size_t i = 0; i < cand.size(); ++i) {
      if (mass[i] > 0 && sampling_weight(scores[size_t(cand[i])], max_score) < floor) mass[i] = 0;
      total += mass[i];
    }
  }
  return select_by_mass(keys, mass, sampling_target(seed_, n_sampled_, total));
}

SampledToken SequenceSampler::sample(std::span<const float> logits, SamplerWorkspace& ws) {
  ws.scores.assign(logits.begin(), logits.end());
  std::span<float> scores(ws.scores);
  apply_penalties(scores);
  const int32_t token = params_.greedy() ? pick_greedy(scores) : pick_random(scores, ws);
  if (token < 0)
    fail("sampler: every logit is -inf or NaN, so no token can be picked (vocab of {}); the model's output is broken",
         logits.size());
  SampledToken out;
  out.token = token;
  if (params_.logprobs) compute_logprobs(logits, token, params_.top_logprobs, out);
  accept(token);  // the one way a pick is recorded, also for picks made on a device
  return out;
}

}  // namespace spill
