// SamplingPlan: the host side of the CUDA sampler (sampling.h); the kernel is in sampling.cu.
#include "backend/cuda/sampling.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "sampling/sampling_math.h"

namespace spill::cuda {

static_assert(kSampledRowTopMax == kMaxTopLogprobs, "GpuSampledToken holds kMaxTopLogprobs alternatives");

SamplingPlan::SamplingPlan(int32_t max_rows, int64_t vocab) : max_rows_(max_rows), vocab_(vocab) {
  if (max_rows < 1) throw_error("SamplingPlan: max_rows must be >= 1, got " + std::to_string(max_rows));
  // The integer masses (2^45 per top token) of a row must sum below 2^63.
  if (vocab < 1 || uint64_t(vocab) > kMaxSampledVocab)
    throw_error("SamplingPlan: vocab must be in [1, 262144] (the integer sampling masses' range), got " +
                std::to_string(vocab));
  params_.resize(size_t(max_rows));
  row_penalties_.resize(size_t(max_rows));
  const size_t cells = size_t(max_rows) * size_t(vocab);
  try {
    check(cudaMalloc(&scores_dev_, cells * sizeof(float)), "SamplingPlan: allocating the score rows");
    check(cudaMalloc(&mass_dev_, cells * sizeof(uint64_t)), "SamplingPlan: allocating the mass rows");
    check(cudaMalloc(&params_dev_, size_t(max_rows) * sizeof(SamplingRowParams)), "SamplingPlan: allocating parameters");
    check(cudaMalloc(&out_dev_, size_t(max_rows) * sizeof(GpuSampledToken)), "SamplingPlan: allocating results");
    check(cudaMallocHost(&params_host_, size_t(max_rows) * sizeof(SamplingRowParams)), "SamplingPlan: pinned parameters");
    check(cudaMallocHost(&out_host_, size_t(max_rows) * sizeof(GpuSampledToken)), "SamplingPlan: pinned results");
  } catch (...) {
    release();
    throw;
  }
}

SamplingPlan::~SamplingPlan() { release(); }

void SamplingPlan::release() {
  cudaFree(scores_dev_);
  cudaFree(mass_dev_);
  cudaFree(params_dev_);
  cudaFree(out_dev_);
  cudaFree(penalties_dev_);
  cudaFreeHost(params_host_);
  cudaFreeHost(out_host_);
  cudaFreeHost(penalties_host_);
  scores_dev_ = nullptr;
  mass_dev_ = nullptr;
  params_dev_ = nullptr;
  out_dev_ = nullptr;
  penalties_dev_ = nullptr;
  params_host_ = nullptr;
  out_host_ = nullptr;
  penalties_host_ = nullptr;
}

void SamplingPlan::set_row(int32_t row, const SamplingRowParams& params, std::span<const SamplingPenaltyEntry> penalties) {
  if (row < 0 || row >= max_rows_)
    throw_error("SamplingPlan::set_row: row " + std::to_string(row) + " is outside the plan's " +
                std::to_string(max_rows_) + " rows");
  if (params.top_logprobs < 0 || params.top_logprobs > kMaxTopLogprobs)
    throw_error("SamplingPlan::set_row: top_logprobs must be in [0, 20], got " + std::to_string(params.top_logprobs));
  params_[size_t(row)] = params;
  row_penalties_[size_t(row)].assign(penalties.begin(), penalties.end());
}

void SamplingPlan::set_row(int32_t row, const SequenceSampler& sampler) {
  const SamplingParams& sp = sampler.params();
  SamplingRowParams p;
  p.temperature = sp.temperature;
  p.top_k = sp.top_k;
  p.top_p = sp.top_p;
  p.min_p = sp.min_p;
  p.repetition_penalty = sp.repetition_penalty;
  p.presence_penalty = sp.presence_penalty;
  p.frequency_penalty = sp.frequency_penalty;
  p.logprobs = sp.logprobs ? 1 : 0;
  p.top_logprobs = sp.logprobs ? sp.top_logprobs : 0;
  p.seed = sampler.seed();
  p.token_index = sampler.n_sampled();
  // The union of the prompt's distinct tokens (sorted, present only with repetition_penalty) and
  // the generated ones, each once with its output count.
  std::vector<SamplingPenaltyEntry> list;
  const auto prompt = sampler.prompt_tokens();
  const auto output = sampler.output_tokens();
  list.reserve(prompt.size() + output.size());
  for (int32_t t : prompt) list.push_back({t, sampler.output_count(t)});
  const bool repetition = sp.repetition_penalty != 1.0f;
  for (int32_t t : output)
    if (!std::binary_search(prompt.begin(), prompt.end(), t)) list.push_back({t, sampler.output_count(t)});
  if (!repetition && sp.presence_penalty == 0.0f && sp.frequency_penalty == 0.0f) list.clear();
  set_row(row, p, list);
}

void SamplingPlan::launch(const float* logits, int32_t rows, cudaStream_t stream) {
  if (rows < 1 || rows > max_rows_)
    throw_error("SamplingPlan::launch: " + std::to_string(rows) + " rows, the plan holds 1.." + std::to_string(max_rows_));
  if (logits == nullptr) throw_error("SamplingPlan::launch: logits is null");
  int64_t n_pen = 0;
  for (int32_t r = 0; r < rows; ++r) n_pen += int64_t(row_penalties_[size_t(r)].size());
  if (n_pen > penalty_capacity_) {
    // Grows rarely (the lists grow by one token a step); freeing synchronises, so grow by half again.
    const int64_t cap = std::max<int64_t>(n_pen + n_pen / 2, 4096);
    check(cudaStreamSynchronize(stream), "SamplingPlan::launch: waiting to grow the penalty list");
    cudaFree(penalties_dev_);
    cudaFreeHost(penalties_host_);
    penalties_dev_ = nullptr;
    penalties_host_ = nullptr;
    check(cudaMalloc(&penalties_dev_, size_t(cap) * sizeof(SamplingPenaltyEntry)), "SamplingPlan: penalty list");
    check(cudaMallocHost(&penalties_host_, size_t(cap) * sizeof(SamplingPenaltyEntry)), "SamplingPlan: pinned penalty list");
    penalty_capacity_ = cap;
  }
  int64_t offset = 0;
  for (int32_t r = 0; r < rows; ++r) {
    const auto& list = row_penalties_[size_t(r)];
    SamplingRowParams p = params_[size_t(r)];
    p.penalty_offset = int32_t(offset);
    p.penalty_count = int32_t(list.size());
    params_host_[r] = p;
    if (!list.empty()) std::memcpy(penalties_host_ + offset, list.data(), list.size() * sizeof(SamplingPenaltyEntry));
    offset += int64_t(list.size());
  }
  check(cudaMemcpyAsync(params_dev_, params_host_, size_t(rows) * sizeof(SamplingRowParams), cudaMemcpyHostToDevice, stream),
        "SamplingPlan::launch: uploading parameters");
  if (offset > 0)
    check(cudaMemcpyAsync(penalties_dev_, penalties_host_, size_t(offset) * sizeof(SamplingPenaltyEntry),
                          cudaMemcpyHostToDevice, stream),
          "SamplingPlan::launch: uploading penalty lists");
  const SampleRowsArgs args{logits, vocab_, params_dev_, penalties_dev_, scores_dev_, mass_dev_, out_dev_};
  launch_sample_rows(args, rows, stream);
  check(cudaGetLastError(), "SamplingPlan::launch: the sampling kernel");
  check(cudaMemcpyAsync(out_host_, out_dev_, size_t(rows) * sizeof(GpuSampledToken), cudaMemcpyDeviceToHost, stream),
        "SamplingPlan::launch: copying results");
  launched_rows_ = rows;
}

std::span<const GpuSampledToken> SamplingPlan::finish(cudaStream_t stream) {
  check(cudaStreamSynchronize(stream), "SamplingPlan::finish: the sampling kernel");
  return {out_host_, size_t(launched_rows_)};
}

SampledToken to_sampled_token(const GpuSampledToken& row, const SamplingParams& params) {
  if (row.token < 0)
    throw_error("sampler (GPU): every logit is -inf or NaN, so no token can be picked; the model's output is broken");
  SampledToken out;
  out.token = row.token;
  if (params.logprobs) {
    out.logprob = row.logprob;
    for (int32_t i = 0; i < row.top_count; ++i) out.top.push_back({row.top_tokens[i], row.top_logprobs[i]});
  }
  return out;
}

}  // namespace spill::cuda
