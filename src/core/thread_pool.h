// A fixed pool of worker threads for data-parallel loops in the CPU backend.
//
// A decode step is dozens of small parallel loops (one per matmul), each a few microseconds of work,
// so waking a sleeping thread per loop (a futex round trip, tens of microseconds on a VM) would cost
// more than the work. Workers and the caller therefore spin for a short while (kSpinSeconds) on an
// atomic generation counter / pending count before falling back to the condition variables, so
// back-to-back loops hand over in well under a microsecond and an idle pool still sleeps.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace spill {

class ThreadPool {
 public:
  // n_threads <= 0: one per hardware thread.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) split into contiguous chunks, one per thread (the caller
  // runs one too), and returns when all are done. Not reentrant: fn must not call parallel_for.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  // Written by the caller before it publishes a generation (release), read by workers after they
  // see it (acquire); never changed while a loop runs, since the caller waits for pending_ == 0.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  std::atomic<uint64_t> generation_{0};  // incremented (under mutex_) once per loop
  std::atomic<int> pending_{0};          // workers still running the current loop
  std::atomic<bool> stop_{false};
};

}  // namespace spill
