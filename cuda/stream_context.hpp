// Makes a stream's context current on the calling thread for a scope. Work built for a stream
// of a green context (a captured graph, its conditional handle, a cuBLAS handle) must be built
// with that context current throughout: built in the primary context and launched into the
// green one, a graph mixes contexts.
//
// A green context may be current on only one thread at a time, and the driver does not
// synchronize calls on one green context from several threads (cuda.h, cuGreenCtxCreate). So
// every push of a green context holds a mutex until its pop (a nested scope on the same thread
// re-enters):
//  - the fill partition's green context (pushed by the executor for graph and GEMM launches, by
//    job creation for warm-ups and graph building, by teardown): one process-wide recursive
//    mutex, held per launch or per build;
//  - a private capture context (one green context per capture stream, on the fill partition's
//    SMs: cuda_device_capture.cpp): a mutex of its own, registered with the context. A capture
//    keeps its context pushed for its whole length (seconds for a training step); with the
//    process-wide mutex that blocked every graph launch, an inline pfBubbleBegin's included
//    (issue 33 item 4). The capture thread never touches the fill partition's context.
#pragma once

#include <memory>
#include <mutex>

#include "driver_api.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cuda {

class ScopedStreamContext {
 public:
  explicit ScopedStreamContext(const DriverApi& api = driver_api()) : api_(&api) {}
  ScopedStreamContext(const ScopedStreamContext&) = delete;
  ScopedStreamContext& operator=(const ScopedStreamContext&) = delete;
  // Pops what enter() pushed (a failure there is logged: the scope is ending).
  ~ScopedStreamContext();

  // Pushes the context of `stream` when it is not already current. A driver without
  // cuStreamGetCtx (no green contexts either) has nothing to switch: success, no change. Call at
  // most once per object (enter or enter_context).
  pfResult_t enter(void* stream);
  // The same for a context known by handle (a graph built in its kernels' capture context).
  pfResult_t enter_context(CUcontext context);
  bool switched() const { return pushed_; }

 private:
  const DriverApi* api_;
  bool pushed_ = false;
  std::shared_ptr<std::recursive_mutex> mutex_;  // kept alive while locked
  std::unique_lock<std::recursive_mutex> lock_;  // held from the push to the pop
};

// The mutex every push of the fill partition's context holds (ScopedStreamContext); exposed for tests.
std::recursive_mutex& context_push_mutex();

// A private context gets a mutex of its own (pushes of it hold that one, not context_push_mutex)
// from registration until unregistration (after its last stream is gone).
void register_private_context(CUcontext context);
void unregister_private_context(CUcontext context);

}  // namespace pipefill::cuda
