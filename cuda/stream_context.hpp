// Makes a stream's context current on the calling thread for a scope. Work built for a stream
// of a green context (a captured graph, its conditional handle, a cuBLAS handle) must be built
// with that context current throughout: built in the primary context and launched into the
// green one, a graph mixes contexts. No CUDA header here (streams are void*).
#pragma once

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
};

}  // namespace pipefill::cuda
