// Marks the current thread as running a user callback (a job's setup/launch/teardown, a
// simulated item's on_item). Library calls that would deadlock or corrupt state when made from
// inside a callback check `CallbackScope::active()` and fail with pfErrorInvalidState naming
// the callback, instead of hanging (NCCL refuses calls from inside its own callbacks the same
// way). Scopes nest; the innermost name is reported.
#pragma once

namespace pipefill {

class CallbackScope {
 public:
  // `subject`: what the callback belongs to (a job's callbacks pass the job), so that the few
  // calls a callback may make on its own subject (pfJobCancel) can recognise it.
  explicit CallbackScope(const char* what, void* subject = nullptr)
      : previous_(current_), previous_subject_(subject_) {
    current_ = what;
    subject_ = subject;
  }
  ~CallbackScope() {
    current_ = previous_;
    subject_ = previous_subject_;
  }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

  // Name of the callback this thread is inside ("launch", "on_item", ...), or nullptr.
  static const char* active() { return current_; }
  // The subject of the innermost callback (nullptr when none, or none was given).
  static void* subject() { return subject_; }

 private:
  const char* previous_;
  void* previous_subject_;
  static inline thread_local const char* current_ = nullptr;
  static inline thread_local void* subject_ = nullptr;
};

}  // namespace pipefill
