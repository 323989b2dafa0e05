// The pfHost* C functions: find the stream's host device, validate, forward to its engine, and
// make sure no exception crosses the C boundary. Every call clears the last error on success.
#include <memory>

#include "common/c_boundary.hpp"
#include "common/callback_scope.hpp"
#include "common/error.hpp"
#include "host/host_engine.hpp"
#include "pipefill/pipefill.h"

using pipefill::fail;
using pipefill::host::Engine;

namespace {

using pipefill::c_boundary;

// The engine of `stream`, kept alive for the call.
pfResult_t find_engine(const char* function, const void* stream, std::shared_ptr<Engine>* out) {
  *out = Engine::engine_of_stream(stream);
  if (*out == nullptr) {
    return fail(pfErrorInvalidArgument,
                "{}: stream {} is not a live host-device stream (destroyed, or not made by a "
                "runtime on pfBackendHost)", function, stream);
  }
  return pfSuccess;
}

}  // namespace

extern "C" {

PF_API pfResult_t pfHostLaunchTicketKernel(void* stream, const pfSliceDesc_t* slice, int blocks,
                                           pfHostItemFn item_fn, void* user) {
  return c_boundary(__func__, [&]() -> pfResult_t {
    std::shared_ptr<Engine> engine;
    PF_TRY(find_engine(__func__, stream, &engine));
    return engine->launch_ticket(stream, slice, blocks, item_fn, user);
  });
}

PF_API pfResult_t pfHostLaunchOpaque(void* stream, uint64_t first_item, uint64_t items,
                                     int blocks, pfHostItemFn item_fn, void* user) {
  return c_boundary(__func__, [&]() -> pfResult_t {
    std::shared_ptr<Engine> engine;
    PF_TRY(find_engine(__func__, stream, &engine));
    return engine->launch_opaque(stream, first_item, items, blocks, item_fn, user);
  });
}

PF_API pfResult_t pfHostStreamDelay(void* stream, double duration_us) {
  return c_boundary(__func__, [&]() -> pfResult_t {
    std::shared_ptr<Engine> engine;
    PF_TRY(find_engine(__func__, stream, &engine));
    return engine->delay(stream, duration_us);
  });
}

PF_API pfResult_t pfHostLaunchHostFunc(void* stream, pfHostFn fn, void* user) {
  return c_boundary(__func__, [&]() -> pfResult_t {
    std::shared_ptr<Engine> engine;
    PF_TRY(find_engine(__func__, stream, &engine));
    return engine->host_func(stream, fn, user);
  });
}

PF_API pfResult_t pfHostNow(void* stream, double* time_us) {
  return c_boundary(__func__, [&]() -> pfResult_t {
    if (time_us == nullptr) return fail(pfErrorInvalidArgument, "{}: time_us is NULL", __func__);
    std::shared_ptr<Engine> engine;
    PF_TRY(find_engine(__func__, stream, &engine));
    *time_us = engine->now_us();
    return pfSuccess;
  });
}

PF_API pfResult_t pfHostStreamSynchronize(void* stream) {
  return c_boundary(__func__, [&]() -> pfResult_t {
    if (const char* callback = pipefill::CallbackScope::active()) {
      return fail(pfErrorInvalidState,
                  "{}: called from inside the {} callback, where waiting for a stream may wait "
                  "for the caller itself", __func__, callback);
    }
    std::shared_ptr<Engine> engine;
    PF_TRY(find_engine(__func__, stream, &engine));
    return engine->synchronize_stream(stream);
  });
}

}  // extern "C"
