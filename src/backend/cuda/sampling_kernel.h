// The CUDA sampling kernel's interface (C++17, for sampling.cu): per-row parameters, penalty
// entries, results, and the launch. Callers use SamplingPlan (sampling.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace spill::cuda {

// Most top logprobs a row reports (kMaxTopLogprobs of sampling/sampler.h, checked there).
inline constexpr int32_t kSampledRowTopMax = 20;

// One row's parameters, as the kernel reads them.
struct SamplingRowParams {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t top_logprobs = 0;
  uint64_t seed = 0;
  uint64_t token_index = 0;      // SequenceSampler::n_sampled(): the Philox counter
  int32_t penalty_offset = 0;    // into the plan's penalty list
  int32_t penalty_count = 0;     // distinct tokens of prompt (when repetition_penalty is on) and output
  int32_t logprobs = 0;          // 1: report logprobs
  int32_t pad = 0;
};

// A token the penalties touch: in the prompt (repetition_penalty) and/or generated output_count times.
struct SamplingPenaltyEntry {
  int32_t token = 0;
  int32_t output_count = 0;
};

// One row's result. token is -1 when no logit is finite (finish() then throws).
struct GpuSampledToken {
  int32_t token = -1;
  float logprob = 0.0f;
  int32_t top_count = 0;
  int32_t pad = 0;
  int32_t top_tokens[kSampledRowTopMax] = {};
  float top_logprobs[kSampledRowTopMax] = {};
};

struct SampleRowsArgs {
  const float* logits = nullptr;                 // [rows, vocab]
  int64_t vocab = 0;
  const SamplingRowParams* params = nullptr;     // [rows]
  const SamplingPenaltyEntry* penalties = nullptr;
  float* scores = nullptr;                       // scratch [rows, vocab]
  uint64_t* mass = nullptr;                      // scratch [rows, vocab]
  GpuSampledToken* out = nullptr;                     // [rows]
};

// One block per row; asynchronous on stream.
void launch_sample_rows(const SampleRowsArgs& args, int32_t rows, cudaStream_t stream);

}  // namespace spill::cuda
