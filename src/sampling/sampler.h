// The sampling layer (src/sampling/): below the engine and the model runners, so that a runner can
// sample where its logits are; this CPU sampler is the exact reference for a device one.
//
// Picks the next token of one sequence from one row of logits: penalties, temperature, top-k,
// top-p, min-p, a per-request random stream, and optional logprobs.
//
// Semantics follow Hugging Face transformers / vLLM so that a client's settings mean what they
// mean elsewhere:
//   1. repetition_penalty (HF): every token that occurs in prompt or output has its logit divided
//      by the penalty when positive, multiplied when negative.
//   2. presence_penalty / frequency_penalty (OpenAI): over generated tokens only,
//      logit -= presence * [count > 0] + frequency * count.
//   3. temperature == 0: greedy (argmax of the penalised logits; ties go to the lowest id, as
//      torch.argmax does). Otherwise logits are divided by the temperature, then
//   4. top-k, 5. top-p (nucleus, on the top-k survivors), 6. min-p (relative to the most likely
//      token), then one draw from what is left.
// Logprobs are those of the model itself: log-softmax of the raw logits, before penalties,
// temperature and truncation (vLLM's default "raw_logprobs"), so they do not depend on how the
// token was picked.
//
// Reproducibility: the draw for a sequence's n-th sampled token is Philox4x32-10 of (counter n,
// key seed) (core/philox.h), a pure function of the request's seed and the token's index. The draw
// picks from integer masses in key order (sampling_math.h), so the GPU's parallel sums are exact. A seeded
// request produces the same tokens whatever else runs in the batch (given the same logits), and a
// sampler on the GPU computes the same draws, so this one stays its exact reference.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace spill {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy; > 0: sample
  int32_t top_k = 0;                // keep the k most likely tokens; 0 or -1: off
  float top_p = 1.0f;               // keep the smallest set with probability >= top_p; 1: off
  float min_p = 0.0f;               // drop tokens less likely than min_p * (top probability); 0: off
  float repetition_penalty = 1.0f;  // 1: off
  float presence_penalty = 0.0f;    // 0: off
  float frequency_penalty = 0.0f;   // 0: off
  std::optional<uint64_t> seed{};   // none: the engine draws one
  bool logprobs = false;            // report the chosen token's logprob
  int32_t top_logprobs = 0;         // and this many most likely alternatives (needs logprobs)

  // Throws spill::Error naming the field and its allowed range.
  void validate() const;
  bool greedy() const { return temperature == 0.0f; }
};

// Largest top_logprobs accepted (OpenAI's limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;           // of token; set when params.logprobs
  std::vector<TokenLogprob> top;  // params.top_logprobs alternatives, most likely first (ties: lower id)
};

// Scratch buffers reused across picks, so a pick allocates nothing in the steady state. One per
// thread that samples (the engine thread has one); not tied to any sequence.
struct SamplerWorkspace {
  std::vector<float> scores;
  std::vector<int32_t> candidates;
  std::vector<uint64_t> keys;  // sampling_key of each candidate
  std::vector<uint64_t> mass;  // sampling_mass of each candidate
};

// The sampling state of one sequence: its parameters, its random stream and the token history
// the penalties need. Lives as long as the request (survives preemption and recompute).
class SequenceSampler {
 public:
  // prompt: the prompt tokens (for repetition_penalty). seed: used when params.seed is absent.
  SequenceSampler(const SamplingParams& params, std::span<const int32_t> prompt, uint64_t fallback_seed);

  // Picks a token from logits (one row, vocab_size entries) and records it as generated (for the
  // penalties). Throws spill::Error when no logit is finite (nothing can be picked).
  SampledToken sample(std::span<const float> logits, SamplerWorkspace& workspace);

  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }

  // For a runner that samples on its device and keeps this sampler as the reference: the state a
  // device sampler needs, and a way to record the token it picked.
  //   n_sampled(): tokens sampled so far, the Philox counter of the next draw.
  //   prompt_tokens(): the prompt's distinct tokens, sorted; empty unless repetition_penalty is on.
  //   output_tokens(): the generated tokens' distinct ids, in first-seen order; output_count(t)
  //   how often t was generated.
  //   accept(token): records a token picked elsewhere exactly as sample() records its own pick, so
  //   the next draw and the penalties are what they would have been had sample() picked it.
  uint64_t n_sampled() const { return n_sampled_; }
  std::span<const int32_t> prompt_tokens() const { return prompt_tokens_; }
  std::span<const int32_t> output_tokens() const { return output_tokens_; }
  int32_t output_count(int32_t token) const;
  void accept(int32_t token);

 private:
  void apply_penalties(std::span<float> scores) const;
  int32_t pick_greedy(std::span<const float> scores) const;
  int32_t pick_random(std::span<float> scores, SamplerWorkspace& ws);
  void record(int32_t token);

  SamplingParams params_;
  uint64_t seed_;
  uint64_t n_sampled_ = 0;  // tokens sampled so far: the Philox counter of the next draw
  // Distinct tokens of the prompt, sorted; kept only when repetition_penalty is on.
  std::vector<int32_t> prompt_tokens_;
  // Generated tokens: count per token, and the distinct ones in first-seen order (so that
  // applying penalties is O(distinct tokens), not O(output length)).
  std::unordered_map<int32_t, int32_t> output_counts_;
  std::vector<int32_t> output_tokens_;
};

// log-softmax of logits at token, and the n most likely tokens; exposed for tests.
void compute_logprobs(std::span<const float> logits, int32_t token, int32_t top_n, SampledToken& out);

}  // namespace spill
