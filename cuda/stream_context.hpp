// Makes a stream's context current on the calling thread for a scope. Work built for a stream
// of a green context (a captured graph, its conditional handle, a cuBLAS handle) must be built
// with that context current throughout: built in the primary context and launched into the
// green one, a graph mixes contexts. No CUDA header here (streams are void*).
//
// A green context may be current on only one thread at a time, and the driver does not
// synchronize calls on one green context from several threads (cuda.h, cuGreenCtxCreate). The
// library pushes it from the pfJobCreate thread (warm-up launches, graph building), the executor
// (graph launches, GEMM items) and teardown (graph destruction): every push holds one process-wide
// recursive mutex until its pop, so at most one thread has a pushed context at a time (a nested
// scope on the same thread re-enters). Process-wide rather than per device: pushes happen at job
// creation and once per slice of a graph job, never in a loop, and a process rarely drives more
// than one GPU.
#pragma once

#include <mutex>

#include "pipefill/pipefill.h"

namespace pipefill::cuda {

class ScopedStreamContext {
 public:
  ScopedStreamContext() = default;
  ScopedStreamContext(const ScopedStreamContext&) = delete;
  ScopedStreamContext& operator=(const ScopedStreamContext&) = delete;
  // Pops what enter() pushed (a failure there is logged: the scope is ending).
  ~ScopedStreamContext();

  // Pushes the context of `stream` when it is not already current. A driver without
  // cuStreamGetCtx (no green contexts either) has nothing to switch: success, no change. Call at
  // most once per object.
  pfResult_t enter(void* stream);
  bool switched() const { return pushed_; }

 private:
  bool pushed_ = false;
  std::unique_lock<std::recursive_mutex> lock_;  // held from the push to the pop
};

// The mutex every push of a stream's context holds (ScopedStreamContext); exposed for tests.
std::recursive_mutex& context_push_mutex();

}  // namespace pipefill::cuda
