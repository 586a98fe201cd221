// Sampling on the GPU: one row of logits per sequence already on the device, one token id (and
// its logprobs when asked) per row back to the host. The CPU twin is SequenceSampler
// (sampling/sampler.h): same penalties, temperature, top-k, top-p, min-p, the same Philox draw per
// (seed, token index), and the same integer-mass selection (sampling/sampling_math.h), so the GPU
// picks exactly the CPU's token for the same logits (tests/cuda_sampling_test.cpp).
//
// Work split: one block of 1024 threads per row. Greedy rows are one block-wide argmax (ties to the
// lowest id) over the logits, through a scratch copy only when penalties apply. Sampled rows write
// their penalised, temperature-scaled scores and integer masses to a scratch row, then top-k,
// top-p's cut and the draw are each a radix search over the 64-bit ranking key (8 passes of a
// 256-bin shared histogram summing exact masses). Logprobs: log-softmax of the raw logits in double.
//
// Use: build a plan once for the most rows and the vocabulary; each step, set_row() for every row
// from its SequenceSampler (parameters, seed, token index, and the sparse penalty lists), launch()
// on the logits, finish() to wait for the small result copy, then per row to_sampled_token() and
// SequenceSampler::accept(token). One launch in flight per plan (its staging buffers are reused).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cuda/sampling_kernel.h"
#include "sampling/sampler.h"

namespace spill::cuda {

class SamplingPlan {
 public:
  // max_rows: most rows one launch samples; vocab: logits per row. Allocates the scratch rows
  // (12 bytes per logit per row: 117 MB for 64 rows of 151936) and pinned result buffers.
  SamplingPlan(int32_t max_rows, int64_t vocab);
  ~SamplingPlan();
  SamplingPlan(const SamplingPlan&) = delete;
  SamplingPlan& operator=(const SamplingPlan&) = delete;

  int32_t max_rows() const { return max_rows_; }
  int64_t vocab() const { return vocab_; }

  // Row `row` of the next launch samples for `sampler` (its state now: call after the previous
  // token was accepted). Rows are numbered from 0; a launch of n rows uses rows 0..n-1.
  void set_row(int32_t row, const SequenceSampler& sampler);
  // For callers without a SequenceSampler: the parameters and penalty list directly.
  void set_row(int32_t row, const SamplingRowParams& params, std::span<const SamplingPenaltyEntry> penalties);

  // Samples rows 0..rows-1 of logits ([rows, vocab] f32 on the device, row stride vocab) on
  // stream: uploads the rows' parameters and penalty lists, runs the kernel, and starts the copy
  // of the results to pinned host memory. No host synchronisation.
  void launch(const float* logits, int32_t rows, cudaStream_t stream);
  // Waits for the launch's results (valid until the next launch). A row with no finite logit has
  // token -1: to_sampled_token() turns it into that row's spill::Error, as SequenceSampler::sample
  // would have thrown, so one broken row need not fail the batch.
  std::span<const GpuSampledToken> finish(cudaStream_t stream);

 private:
  void release();

  int32_t max_rows_;
  int64_t vocab_;
  int32_t launched_rows_ = 0;
  std::vector<SamplingRowParams> params_;                 // host staging, per row
  std::vector<std::vector<SamplingPenaltyEntry>> row_penalties_;
  SamplingRowParams* params_host_ = nullptr;              // pinned
  SamplingPenaltyEntry* penalties_host_ = nullptr;        // pinned
  int64_t penalty_capacity_ = 0;
  SamplingRowParams* params_dev_ = nullptr;
  SamplingPenaltyEntry* penalties_dev_ = nullptr;
  float* scores_dev_ = nullptr;     // [max_rows, vocab]
  uint64_t* mass_dev_ = nullptr;    // [max_rows, vocab]
  GpuSampledToken* out_dev_ = nullptr;
  GpuSampledToken* out_host_ = nullptr;  // pinned
};

// The host's SampledToken of a row (logprobs only when the row asked); throws spill::Error for a row
// with no finite logit. The caller then records the pick: SequenceSampler::accept(token).
SampledToken to_sampled_token(const GpuSampledToken& row, const SamplingParams& params);

}  // namespace spill::cuda
