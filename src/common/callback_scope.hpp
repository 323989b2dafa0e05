// Marks the current thread as running a user callback (a job's setup/launch/teardown, a
// simulated item's on_item). Library calls that would deadlock or corrupt state when made from
// inside a callback check `CallbackScope::active()` and fail with pfErrorInvalidState naming
// the callback, instead of hanging (NCCL refuses calls from inside its own callbacks the same
// way). Scopes nest; the innermost name is reported.
#pragma once

namespace pipefill {

class CallbackScope {
 public:
  explicit CallbackScope(const char* what) : previous_(current_) { current_ = what; }
  ~CallbackScope() { current_ = previous_; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

  // Name of the callback this thread is inside ("launch", "on_item", ...), or nullptr.
  static const char* active() { return current_; }

 private:
  const char* previous_;
  static inline thread_local const char* current_ = nullptr;
};

}  // namespace pipefill
