// An annotated mutex, its scoped lock and a condition variable that waits on it: std::mutex
// with the capability attributes clang's -Wthread-safety needs (common/thread_annotations.hpp).
// Same cost as std::mutex; the names follow abseil (Mutex, MutexLock).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.hpp"

namespace pipefill {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mutex_.lock(); }
  void unlock() RELEASE() { mutex_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mutex_.try_lock(); }
  // Tells the analysis the caller holds the lock (e.g. inside a callback run under it).
  void assert_held() const ASSERT_CAPABILITY(this) {}

  std::mutex& native() { return mutex_; }

 private:
  std::mutex mutex_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

// Waits release and re-acquire `mutex`, which the caller must hold.
class CondVar {
 public:
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

  template <typename Predicate>
  void wait(Mutex& mutex, Predicate done) REQUIRES(mutex) {
    std::unique_lock<std::mutex> lock(mutex.native(), std::adopt_lock);
    cv_.wait(lock, done);
    lock.release();  // still held: ownership goes back to the caller's MutexLock
  }
  // false when `timeout` passed with `done()` still false.
  template <typename Rep, typename Period, typename Predicate>
  bool wait_for(Mutex& mutex, std::chrono::duration<Rep, Period> timeout, Predicate done)
      REQUIRES(mutex) {
    std::unique_lock<std::mutex> lock(mutex.native(), std::adopt_lock);
    const bool result = cv_.wait_for(lock, timeout, done);
    lock.release();
    return result;
  }

 private:
  std::condition_variable cv_;
};

}  // namespace pipefill
