// A persistent pool of worker threads. Work is a number of tasks; which thread runs
// which task does not matter to any result (each task writes its own outputs), so
// tasks are claimed first come, first served.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace kernel_align::cpu {

// A reference to a callable taking a task index, valid while the callable lives (a
// call of ThreadPool::run, at most). Unlike std::function it never allocates: the
// kernels' lambdas capture more than std::function keeps inline, and a call must not pay
// a heap allocation.
class TaskRef {
 public:
  template <class F>
  TaskRef(
      const F& f)  // NOLINT(google-explicit-constructor): passed as a lambda, like std::function
      : object_(&f),
        call_([](const void* object, std::int64_t t) { (*static_cast<const F*>(object))(t); }) {}
  void operator()(std::int64_t t) const { call_(object_, t); }

 private:
  const void* object_;
  void (*call_)(const void*, std::int64_t);
};

class ThreadPool {
 public:
  static ThreadPool& instance();

  // Runs task(0) .. task(tasks - 1) on at most `threads` threads, the caller being
  // one of them, and returns when all are done. Calls from several threads at once
  // are served one after the other.
  void run(int threads, std::int64_t tasks, TaskRef task);

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

 private:
  ThreadPool() = default;
  void grow(int workers);
  void work_loop(int worker);
  void drain();  // claims and runs tasks of the current job until none is left

  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  // The current job, guarded by mutex_.
  const TaskRef* task_ = nullptr;
  std::int64_t tasks_ = 0;
  std::int64_t next_task_ = 0;
  std::int64_t finished_tasks_ = 0;
  int active_workers_ = 0;  // workers allowed to join the current job
  std::uint64_t job_ = 0;
  bool stopping_ = false;
};

}  // namespace kernel_align::cpu
