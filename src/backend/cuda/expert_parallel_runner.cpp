#include "backend/cuda/expert_parallel_runner.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "backend/cuda/collectives.h"
#include "core/error.h"
#include "model/model.h"

namespace spill {
namespace {

void ep_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail("expert-parallel runner: {}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

// A barrier for the group's threads that a failing rank breaks for good, so that the others stop
// waiting and fail too instead of waiting for it forever.
class GroupBarrier {
 public:
  explicit GroupBarrier(int parties) : parties_(parties) {}
  // Returns false when broken.
  bool arrive_and_wait() {
    std::unique_lock lock(mu_);
    if (broken_) return false;
    const uint64_t gen = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lock, [&] { return generation_ != gen || broken_; });
    return !broken_ || generation_ != gen;
  }
  void break_it() {
    std::lock_guard lock(mu_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int parties_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
};

// What a rank throws when it stops because another rank failed (not a failure of its own).
struct GroupStopped : Error {
  GroupStopped() : Error("expert-parallel runner: stopped because another GPU of the group failed during the step") {}
};

// NCCL's in-place all-reduce, each rank's part called from the thread that drives its GPU.
class NcclSums final : public PartialSums {
 public:
  explicit NcclSums(std::unique_ptr<cuda::Collectives> c) : c_(std::move(c)) {}
  void sum(int rank, float* rows, int64_t count, void* stream) override {
    c_->all_reduce_sum_of_rank(rank, rows, count, static_cast<cudaStream_t>(stream));
  }
  bool capturable() const override { return true; }
  void abort() override { c_->abort(); }

 private:
  std::unique_ptr<cuda::Collectives> c_;
};

// The same sums through host memory: every rank copies its rows out, waits for the others, and adds
// the ranks' rows in rank order (each rank the same additions, so the same bits), then copies the
// sum back. For ranks that share a GPU (NCCL refuses that) and as the reference for NCCL's sums.
class HostSums final : public PartialSums {
 public:
  explicit HostSums(int world) : barrier_(world), rows_(size_t(world)), sums_(size_t(world)) {}
  void sum(int rank, float* rows, int64_t count, void* stream) override {
    auto s = static_cast<cudaStream_t>(stream);
    std::vector<float>& mine = rows_[size_t(rank)];
    mine.resize(size_t(count));
    ep_check(cudaMemcpyAsync(mine.data(), rows, size_t(count) * 4, cudaMemcpyDeviceToHost, s), "copying rows to sum");
    ep_check(cudaStreamSynchronize(s), "copying rows to sum");
    if (!barrier_.arrive_and_wait()) throw GroupStopped();
    std::vector<float>& out = sums_[size_t(rank)];
    out = rows_[0];
    for (size_t r = 1; r < rows_.size(); ++r) {
      if (rows_[r].size() != out.size()) fail("expert-parallel runner: the GPUs summed rows of different sizes (internal error)");
      for (size_t i = 0; i < out.size(); ++i) out[i] += rows_[r][i];
    }
    // Nobody refills its rows (the next layer) before every rank has read them all.
    if (!barrier_.arrive_and_wait()) throw GroupStopped();
    ep_check(cudaMemcpyAsync(rows, out.data(), size_t(count) * 4, cudaMemcpyHostToDevice, s), "copying the sum back");
    ep_check(cudaStreamSynchronize(s), "copying the sum back");
  }
  bool capturable() const override { return false; }
  void abort() override { barrier_.break_it(); }

 private:
  GroupBarrier barrier_;
  std::vector<std::vector<float>> rows_, sums_;
};

class ExpertParallelRunner final : public ModelRunner {
 public:
  ExpertParallelRunner(const Model& model, const ExpertParallelConfig& config) {
    if (!config.runner.expert_plan || !config.runner.expert_plan->expert_parallel)
      fail("expert-parallel runner: needs an expert-parallel plan (version 2: spill plan --parallel experts)");
    const offload::PlacementPlan& plan = *config.runner.expert_plan;
    const int world = plan.n_gpus;
    std::vector<int> devices = config.devices;
    if (devices.empty())
      for (int g = 0; g < world; ++g) devices.push_back(config.runner.device + g);
    if (int(devices.size()) != world)
      fail("expert-parallel runner: {} is a plan for {} GPUs; {} devices were given", plan.where, world, devices.size());
    int n_devices = 0;
    ep_check(cudaGetDeviceCount(&n_devices), "counting devices");
    for (int g = 0; g < world; ++g) {
      if (devices[size_t(g)] < 0 || devices[size_t(g)] >= n_devices)
        fail("expert-parallel runner: {} needs {} GPUs; GPU {} would be cuda:{}, and this machine has {} (cuda:0 to "
             "cuda:{})",
             plan.where, world, g, devices[size_t(g)], n_devices, n_devices - 1);
      for (int h = 0; h < g; ++h)
        if (devices[size_t(h)] == devices[size_t(g)] && config.sums == ExpertParallelConfig::Sums::Nccl)
          fail("expert-parallel runner: GPUs {} and {} of the plan are both cuda:{}; NCCL needs a device per GPU",
               h, g, devices[size_t(g)]);
    }
    if (config.sums == ExpertParallelConfig::Sums::Nccl) {
      sums_ = std::make_unique<NcclSums>(cuda::Collectives::open(devices));
    } else {
      sums_ = std::make_unique<HostSums>(world);
    }
    for (int g = 0; g < world; ++g) {
      CudaRunnerConfig c = config.runner;
      c.device = devices[size_t(g)];
      c.shard = {.rank = g, .world = world, .sums = sums_.get()};
      if (g > 0) {
        // The same pool and limits as GPU 0: the engine's block ids are valid on every GPU.
        c.kv.n_blocks = shards_[0]->kv_config().n_blocks;
        c.kv_budget_bytes = 0;
        c.max_model_len = shards_[0]->limits().max_model_len;
      }
      try {
        shards_.push_back(make_cuda_runner(model, c));
      } catch (const Error& e) {
        fail("expert-parallel runner: GPU {} (cuda:{}) of {}: {}", g, c.device, world, e.what());
      }
    }
    errors_.resize(size_t(world));
    for (int g = 1; g < world; ++g) threads_.emplace_back([this, g] { follow(g); });
  }

  ~ExpertParallelRunner() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  const ModelSpec& spec() const override { return shards_[0]->spec(); }
  const KvCacheConfig& kv_config() const override { return shards_[0]->kv_config(); }
  const RunnerLimits& limits() const override { return shards_[0]->limits(); }

  std::string describe() const override {
    std::string s = fmt::format("expert-parallel over {} GPUs:", shards_.size());
    for (const auto& r : shards_) {
      s += ' ';
      s += r->describe();
      s += ';';
    }
    s.pop_back();
    return s;
  }

  void forward(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer) override {
    run_group(batch, [&] { shards_[0]->forward(batch, logits, observer); });
  }

  void forward_sample(const ForwardBatch& batch, std::span<SequenceSampler* const> samplers, StepResult& out,
                      ForwardObserver* observer) override {
    run_group(batch, [&] { shards_[0]->forward_sample(batch, samplers, out, observer); });
  }

  // The GPUs' counts together: every GPU counts the routings to the experts it holds; tokens and
  // step time are GPU 0's (every GPU ran the same tokens in the same steps).
  ExpertTraffic expert_traffic() const override {
    ExpertTraffic t = shards_[0]->expert_traffic();
    for (size_t g = 1; g < shards_.size(); ++g) {
      const ExpertTraffic o = shards_[g]->expert_traffic();
      t.routings += o.routings;
      t.host_routings += o.host_routings;
      t.cache_routings += o.cache_routings;
      t.host_bytes += o.host_bytes;
      t.cpu_routings += o.cpu_routings;
      t.cpu_bytes += o.cpu_bytes;
      t.staged_bytes += o.staged_bytes;
      t.cache_copies += o.cache_copies;
      t.cache_copy_bytes += o.cache_copy_bytes;
      t.cache_evictions += o.cache_evictions;
      t.vram_expert_bytes += o.vram_expert_bytes;
      t.host_expert_bytes += o.host_expert_bytes;
      t.cache_bytes += o.cache_bytes;
      t.cache_slots += o.cache_slots;
      t.cache_slots_used += o.cache_slots_used;
    }
    return t;
  }

 private:
  // Runs the step on every GPU: the followers on their threads, GPU 0 here (`lead`), then waits for
  // all. A GPU that fails breaks the host exchange's barrier, so no rank waits for it there.
  template <class Lead>
  void run_group(const ForwardBatch& batch, Lead&& lead) {
    if (!failed_.empty())
      throw DeviceFatalError(fmt::format("expert-parallel runner: the group stopped when {}; it runs no further steps",
                                         failed_));
    // Bad input fails here, before any GPU starts (every GPU would refuse it alike); what fails
    // after this is a GPU's own failure, which stops the group.
    cuda_runner_check_batch(*shards_[0], batch);
    {
      std::lock_guard lock(mu_);
      batch_ = &batch;
      pending_ = int(threads_.size());
      for (std::exception_ptr& e : errors_) e = nullptr;
      ++serial_;
    }
    cv_.notify_all();
    try {
      lead();
    } catch (...) {
      errors_[0] = std::current_exception();
      sums_->abort();
    }
    {
      std::unique_lock lock(mu_);
      done_cv_.wait(lock, [&] { return pending_ == 0; });
      batch_ = nullptr;
    }
    // A failed step leaves the GPUs at different points of it and the sums aborted: the group ends
    // (the engine fails the open requests), naming the GPU that failed rather than those it stopped.
    bool failed = false;
    for (size_t g = 0; g < errors_.size() && failed_.empty(); ++g) {
      if (!errors_[g]) continue;
      failed = true;
      try {
        std::rethrow_exception(errors_[g]);
      } catch (const GroupStopped&) {
        // stopped by another GPU's failure: keep looking for that one
      } catch (const std::exception& e) {
        failed_ = fmt::format("GPU {} failed: {}", g, e.what());
      }
    }
    if (!failed) return;
    if (failed_.empty()) failed_ = "its GPUs stopped";
    // The GPUs stopped at different points of the step: their KV caches and the sums no longer
    // agree, so no later step can run (the engine ends every open request).
    throw DeviceFatalError(fmt::format("expert-parallel runner: {}; the group of {} GPUs runs no further steps", failed_,
                                       shards_.size()));
  }

  void follow(int rank) {
    uint64_t seen = 0;
    std::vector<float> no_logits;
    for (;;) {
      const ForwardBatch* batch = nullptr;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || serial_ != seen; });
        if (stop_) return;
        seen = serial_;
        batch = batch_;
      }
      try {
        shards_[size_t(rank)]->forward(*batch, no_logits, nullptr);
      } catch (...) {
        errors_[size_t(rank)] = std::current_exception();
        sums_->abort();
      }
      {
        std::lock_guard lock(mu_);
        --pending_;
      }
      done_cv_.notify_all();
    }
  }

  std::unique_ptr<PartialSums> sums_;  // before the shards, which point at it
  std::string failed_;  // set when a step failed: the group runs no more
  std::vector<std::unique_ptr<ModelRunner>> shards_;  // by plan GPU
  std::vector<std::thread> threads_;                  // ranks 1..world-1
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const ForwardBatch* batch_ = nullptr;
  uint64_t serial_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;  // by rank, this step's
};

}  // namespace

std::unique_ptr<ModelRunner> make_expert_parallel_runner(const Model& model, const ExpertParallelConfig& config) {
  return std::make_unique<ExpertParallelRunner>(model, config);
}

}  // namespace spill
