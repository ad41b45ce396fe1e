#include "cpu/thread_pool.hpp"

#include <algorithm>

namespace kernel_align::cpu {

ThreadPool& ThreadPool::instance() {
  static ThreadPool pool;
  return pool;
}

ThreadPool::~ThreadPool() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::grow(int workers) {
  while (static_cast<int>(workers_.size()) < workers) {
    const int index = static_cast<int>(workers_.size());
    workers_.emplace_back([this, index] { work_loop(index); });
  }
}

void ThreadPool::drain() {
  std::unique_lock lock(mutex_);
  while (next_task_ < tasks_) {
    const std::int64_t t = next_task_++;
    const auto* task = task_;
    lock.unlock();
    (*task)(t);
    lock.lock();
    if (++finished_tasks_ == tasks_) done_.notify_all();
  }
}

void ThreadPool::work_loop(int worker) {
  std::uint64_t seen_job = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || (job_ != seen_job && worker < active_workers_); });
      if (stopping_) return;
      seen_job = job_;
    }
    drain();
  }
}

void ThreadPool::run(int threads, std::int64_t tasks, TaskRef task) {
  if (tasks <= 0) return;
  if (threads <= 1 || tasks == 1) {
    for (std::int64_t t = 0; t < tasks; ++t) task(t);
    return;
  }
  const std::lock_guard one_job(run_mutex_);
  const int helpers = static_cast<int>(std::min<std::int64_t>(threads, tasks)) - 1;
  {
    const std::lock_guard lock(mutex_);
    grow(helpers);
    task_ = &task;
    tasks_ = tasks;
    next_task_ = 0;
    finished_tasks_ = 0;
    active_workers_ = helpers;
    ++job_;
  }
  wake_.notify_all();
  drain();
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return finished_tasks_ == tasks_; });
  task_ = nullptr;
  tasks_ = 0;
}

}  // namespace kernel_align::cpu
