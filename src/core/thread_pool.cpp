#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace spill {

namespace {

// How long a thread polls before it sleeps: longer than the gap between two matmuls of a decode
// step, far shorter than the gap between steps of an idle server.
constexpr double kSpinSeconds = 200e-6;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#endif
}

// Polls ready() until it holds or kSpinSeconds pass; true if it held.
template <class Ready>
bool spin_until(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kSpinSeconds);
  for (int i = 0;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return ready();
  }
}

void run_chunk(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int index, int count) {
  int64_t begin = n * index / count, end = n * (index + 1) / count;
  if (begin < end) fn(begin, end);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  pending_.store(int(workers_.size()), std::memory_order_relaxed);
  {
    // Under the mutex, so a worker that checks the generation before it sleeps cannot miss it.
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  run_chunk(fn, n, 0, size());
  if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto started = [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(started)) {
      std::unique_lock lock(mutex_);
      start_cv_.wait(lock, started);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunk(*job_, job_n_, index, size());
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // The last worker wakes a caller that stopped spinning; taking the mutex orders the notify
      // after the caller's predicate check.
      std::lock_guard lock(mutex_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace spill
