// Expert parallelism on the GPUs of one host: one ModelRunner over a group of CudaRunners, one per
// GPU of an expert-parallel plan (docs/placement.md). Each GPU holds the routed experts the plan
// gives it (in its VRAM, or in host RAM it reads over its own link) and a copy of everything else:
// attention with its own KV cache, shared experts, dense MLPs, embedding and head. Every GPU runs
// every layer on the same tokens; after each MoE layer's routed experts the GPUs' rows are summed
// (NCCL all-reduce, in place), so all of them carry the same hidden rows on. GPU 0 computes the
// logits and samples; the engine sees one runner.
//
// Threads: the engine thread drives GPU 0; each further GPU has a thread of this runner that runs
// the same step on its GPU, started by forward()/forward_sample() and joined before they return.
//
// This header does not include CUDA: a build without CUDA gets a factory that throws.
#pragma once
#include <memory>
#include <vector>

#include "backend/cuda/cuda_runner.h"

namespace spill {

struct ExpertParallelConfig {
  // Every GPU's runner config: expert_plan is the (version 2) plan; device and shard are set per GPU.
  CudaRunnerConfig runner;
  // The CUDA device of the plan's GPU g; empty: 0, 1, ..., n_gpus - 1.
  std::vector<int> devices{};
  // How the GPUs sum their experts' rows: NCCL (distinct GPUs; captured into the decode graphs), or
  // through host memory, every rank adding the ranks' rows in rank order (slow, steps run without
  // graphs; lets several ranks share one GPU, which is how one GPU tests the group's arithmetic).
  enum class Sums { Nccl, Host };
  Sums sums = Sums::Nccl;
};

#if SPILL_HAVE_CUDA
// Builds one CudaRunner per GPU of config.runner.expert_plan (GPU 0 first; the others get its KV
// block count and limits, so every GPU's pool holds the same blocks). Throws spill::Error naming
// the GPU and what to do when the plan, the devices or NCCL do not fit.
std::unique_ptr<ModelRunner> make_expert_parallel_runner(const Model& model, const ExpertParallelConfig& config);
#else
inline std::unique_ptr<ModelRunner> make_expert_parallel_runner(const Model&, const ExpertParallelConfig&) {
  fail("spill was built without CUDA (-DSPILL_CUDA=OFF or no nvcc at configure time); use the CPU runner");
}
#endif

}  // namespace spill
