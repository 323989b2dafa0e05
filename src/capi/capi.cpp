// The C boundary: every pfXxx function of the C API (include/pipefill/pipefill.h and the headers it
// includes) except the pfSim* ones (pipefill_sim.h: src/sim/sim_capi.cpp) and the statistics,
// traces and observers (pipefill_observe.h: capi_stats.cpp). Each call clears this thread's error
// message, refuses calls from inside job callbacks, looks its handles up in the live-handle tables
// (core/handles.hpp) and catches every exception, so nothing throws across the boundary and no
// freed object is ever touched.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <new>

#include "common/callback_scope.hpp"
#include "common/error.hpp"
#include "core/config.hpp"
#include "core/handles.hpp"
#include "core/runtime.hpp"
#include "capi/capi_guard.hpp"

using pipefill::fail;
using pipefill::core::JobRef;
using pipefill::core::JobState;
using pipefill::core::Runtime;
using pipefill::core::RuntimeRef;

using pipefill::capi::check_plausible_size;
using pipefill::capi::guarded;

extern "C" {

PF_API const char* pfGetErrorString(pfResult_t result) {
  switch (result) {
    case pfSuccess: return "pfSuccess: no error";
    case pfErrorInvalidArgument:
      return "pfErrorInvalidArgument: a null handle/pointer or an out-of-range value";
    case pfErrorInvalidState:
      return "pfErrorInvalidState: a call out of order (end without begin, nested begin, ...)";
    case pfErrorOutOfMemory:
      return "pfErrorOutOfMemory: the request does not fit the fill arena or bubble memory";
    case pfErrorNotSupported:
      return "pfErrorNotSupported: backend or feature not available in this build or device";
    case pfErrorNoDevice: return "pfErrorNoDevice: CUDA backend requested but no usable GPU";
    case pfErrorCudaFailure: return "pfErrorCudaFailure: a CUDA runtime/driver call failed";
    case pfErrorCuptiFailure: return "pfErrorCuptiFailure: a CUPTI call failed";
    case pfErrorNcclFailure: return "pfErrorNcclFailure: an NCCL call failed";
    case pfErrorJobFailed:
      return "pfErrorJobFailed: a fill job's callback or item failed; the job is ended";
    case pfErrorCancelled: return "pfErrorCancelled: the job was cancelled";
    case pfErrorTimeout: return "pfErrorTimeout: a wait ran out of time";
    case pfErrorBusy: return "pfErrorBusy: resource in use (e.g. a runtime with live jobs)";
    case pfErrorIo: return "pfErrorIo: a file could not be written or read";
    case pfErrorInternal:
      return "pfErrorInternal: a bug in PipeFill; please report with PIPEFILL_DEBUG=trace";
    case pfResultCount: break;
  }
  return "pfErrorUnknown: not a pfResult_t value";
}

PF_API const char* pfGetLastErrorMessage(void) {
  return pipefill::last_error_message().c_str();
}

PF_API pfResult_t pfGetVersion(int* version) {
  return guarded(__func__, [&] {
    if (version == nullptr) return fail(pfErrorInvalidArgument, "pfGetVersion: version is NULL");
    *version = PIPEFILL_VERSION_CODE;
    return pfSuccess;
  });
}

namespace {
pfResult_t init_config(const char* function, pfConfig_t* config, size_t config_size) {
  if (config == nullptr) return fail(pfErrorInvalidArgument, "{}: config is NULL", function);
  if (config_size < PF_CONFIG_V2_SIZE) {
    return fail(pfErrorInvalidArgument,
                "{}: config_size = {} is smaller than the oldest layout this library fills ({} "
                "bytes); pass sizeof(pfConfig_t)",
                function, config_size, PF_CONFIG_V2_SIZE);
  }
  PF_TRY(check_plausible_size(fmt::format("{}: config_size", function).c_str(), config_size));
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  const size_t bytes = std::min(config_size, sizeof(pfConfig_t));
  c.size = bytes;
  c.version = pipefill::config_version_for_size(bytes);  // the layout that fits
  std::memcpy(config, &c, bytes);
  return pfSuccess;
}
}  // namespace

PF_API pfResult_t pfConfigInitSized(pfConfig_t* config, size_t config_size) {
  return guarded(__func__, [&] { return init_config("pfConfigInitSized", config, config_size); });
}

// The exported pfConfigInit of binaries built against a 0.2 header (the header's macro of the
// same name calls pfConfigInitSized): their struct is the version-2 layout.
#undef pfConfigInit
PF_API pfResult_t pfConfigInit(pfConfig_t* config) {
  return guarded(__func__, [&] { return init_config("pfConfigInit", config, PF_CONFIG_V2_SIZE); });
}

// ---- Runtime ------------------------------------------------------------------------------

PF_API pfResult_t pfRuntimeCreate(const pfConfig_t* config, pfRuntime_t* runtime) {
  return guarded(__func__, [&] {
    PF_TRY(pipefill::core::refuse_inside_callback("pfRuntimeCreate"));
    if (runtime == nullptr) {
      return fail(pfErrorInvalidArgument, "pfRuntimeCreate: runtime (output) is NULL");
    }
    *runtime = nullptr;
    std::unique_ptr<Runtime> created;
    PF_TRY(Runtime::create(config, &created));
    *runtime = pipefill::core::publish_runtime(std::move(created));
    return pfSuccess;
  });
}

PF_API pfResult_t pfRuntimeDestroy(pfRuntime_t runtime) {
  return guarded(__func__, [&] { return pipefill::core::destroy_runtime(runtime); });
}

PF_API pfResult_t pfRuntimeGetConfig(pfRuntime_t runtime, pfConfig_t* config) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetConfig", &rt));
    if (config == nullptr) return fail(pfErrorInvalidArgument, "pfRuntimeGetConfig: config is NULL");
    return pipefill::export_config(rt->options(), config);
  });
}

PF_API pfResult_t pfRuntimeGetBackend(pfRuntime_t runtime, pfBackend_t* backend) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetBackend", &rt));
    if (backend == nullptr) return fail(pfErrorInvalidArgument, "pfRuntimeGetBackend: backend is NULL");
    *backend = rt->options().backend;
    return pfSuccess;
  });
}

PF_API pfResult_t pfStreamCreateHighPriority(pfRuntime_t runtime, void** stream) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfStreamCreateHighPriority", &rt));
    if (stream == nullptr) {
      return fail(pfErrorInvalidArgument, "pfStreamCreateHighPriority: stream (output) is NULL");
    }
    return rt->create_high_priority_stream(stream);
  });
}

PF_API pfResult_t pfStreamDestroy(pfRuntime_t runtime, void* stream) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfStreamDestroy", &rt));
    if (stream == nullptr) return fail(pfErrorInvalidArgument, "pfStreamDestroy: stream is NULL");
    return rt->destroy_stream(stream);
  });
}

PF_API pfResult_t pfRuntimeGetAsyncError(pfRuntime_t runtime, pfResult_t* async_error) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetAsyncError", &rt));
    if (async_error == nullptr) {
      return fail(pfErrorInvalidArgument, "pfRuntimeGetAsyncError: async_error is NULL");
    }
    *async_error = rt->async_error();
    return pfSuccess;
  });
}

PF_API pfResult_t pfRuntimeSynchronize(pfRuntime_t runtime) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeSynchronize", &rt));
    return rt->synchronize();
  });
}

PF_API pfResult_t pfRuntimeGetSimWorld(pfRuntime_t runtime, pfSimWorld_t* world) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetSimWorld", &rt));
    if (world == nullptr) return fail(pfErrorInvalidArgument, "pfRuntimeGetSimWorld: world is NULL");
    const pfSimWorld_t handle = rt->sim_world();
    if (handle == nullptr) {
      return fail(pfErrorNotSupported,
                  "pfRuntimeGetSimWorld: the runtime's device ({}) is not simulated",
                  rt->device().name());
    }
    *world = handle;
    return pfSuccess;
  });
}

// ---- Bubble instructions ------------------------------------------------------------------

PF_API pfResult_t pfBubbleBegin(pfRuntime_t runtime, void* stream, const pfBubbleHint_t* hint) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfBubbleBegin", &rt));
    return rt->bubble_begin(stream, hint);
  });
}

PF_API pfResult_t pfBubbleEnd(pfRuntime_t runtime, void* stream) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfBubbleEnd", &rt));
    return rt->bubble_end(stream);
  });
}

PF_API pfResult_t pfBubbleCloseFill(pfRuntime_t runtime, void* stream) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfBubbleCloseFill", &rt));
    return rt->bubble_close_fill(stream);
  });
}

PF_API pfResult_t pfIterationEnd(pfRuntime_t runtime) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfIterationEnd", &rt));
    return rt->iteration_end();
  });
}

// ---- Jobs ---------------------------------------------------------------------------------

PF_API pfResult_t pfJobCreate(pfRuntime_t runtime, const pfJobDesc_t* desc, pfJob_t* job) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfJobCreate", &rt));
    if (desc == nullptr) return fail(pfErrorInvalidArgument, "pfJobCreate: desc is NULL");
    if (job == nullptr) return fail(pfErrorInvalidArgument, "pfJobCreate: job (output) is NULL");
    *job = nullptr;
    JobState* created = nullptr;
    PF_TRY(rt->create_job(desc, &created));
    *job = created->handle;
    return pfSuccess;
  });
}

PF_API pfResult_t pfJobCreateGraph(pfRuntime_t runtime, const pfGraphJobDesc_t* desc,
                                   pfJob_t* job) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfJobCreateGraph", &rt));
    if (desc == nullptr) return fail(pfErrorInvalidArgument, "pfJobCreateGraph: desc is NULL");
    if (job == nullptr) {
      return fail(pfErrorInvalidArgument, "pfJobCreateGraph: job (output) is NULL");
    }
    *job = nullptr;
    JobState* created = nullptr;
    PF_TRY(rt->create_graph_job(desc, &created));
    *job = created->handle;
    return pfSuccess;
  });
}

PF_API pfResult_t pfGraphCaptureStreamCreate(pfRuntime_t runtime, void** stream) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfGraphCaptureStreamCreate", &rt));
    if (stream == nullptr) {
      return fail(pfErrorInvalidArgument, "pfGraphCaptureStreamCreate: stream (output) is NULL");
    }
    *stream = nullptr;
    return rt->create_capture_stream(stream);
  });
}

PF_API pfResult_t pfGraphCaptureContextPush(pfRuntime_t runtime, void* stream) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfGraphCaptureContextPush", &rt));
    return rt->push_capture_context(stream);
  });
}

PF_API pfResult_t pfGraphCaptureContextPop(pfRuntime_t runtime) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfGraphCaptureContextPop", &rt));
    return rt->pop_capture_context();
  });
}

PF_API pfResult_t pfJobGetStatus(pfJob_t job, pfJobInfo_t* info) {
  return guarded(__func__, [&] {
    JobRef j;
    PF_TRY(pipefill::core::acquire_job(job, "pfJobGetStatus", &j));
    if (info == nullptr) return fail(pfErrorInvalidArgument, "pfJobGetStatus: info is NULL");
    return j.runtime()->job_info(j.get(), info);
  });
}

PF_API pfResult_t pfJobGetCostInfo(pfJob_t job, pfJobCostInfo_t* info) {
  return guarded(__func__, [&] {
    JobRef j;
    PF_TRY(pipefill::core::acquire_job(job, "pfJobGetCostInfo", &j));
    if (info == nullptr) return fail(pfErrorInvalidArgument, "pfJobGetCostInfo: info is NULL");
    const size_t size = info->size;
    if (size < sizeof(pfJobCostInfo_t)) {
      return fail(pfErrorInvalidArgument,
                  "pfJobGetCostInfo: info->size = {} is below the first layout ({} bytes); set "
                  "it to sizeof(pfJobCostInfo_t)",
                  size, sizeof(pfJobCostInfo_t));
    }
    PF_TRY(check_plausible_size("pfJobGetCostInfo: info->size", size));
    pfJobCostInfo_t one{};
    PF_TRY(j.runtime()->job_cost_info(j.get(), &one));
    std::memcpy(info, &one, sizeof one);
    // Fields of a newer header this library does not know read 0.
    if (size > sizeof one) std::memset(reinterpret_cast<char*>(info) + sizeof one, 0, size - sizeof one);
    return pfSuccess;
  });
}

PF_API pfResult_t pfJobSetCostPolicy(pfJob_t job, int policy) {
  return guarded(__func__, [&] {
    JobRef j;
    PF_TRY(pipefill::core::acquire_job(job, "pfJobSetCostPolicy", &j));
    if (policy < 0 || policy > 2) {
      return fail(pfErrorInvalidArgument,
                  "pfJobSetCostPolicy: policy = {} (0 learned median, 1 learned fastest sample, "
                  "2 stated cost kept)",
                  policy);
    }
    return j.runtime()->set_job_cost_policy(j.get(), policy);
  });
}

PF_API pfResult_t pfJobCancel(pfJob_t job) {
  return guarded(__func__, [&] {
    if (pipefill::CallbackScope::active()) return pipefill::core::cancel_from_callback(job);
    JobRef j;
    PF_TRY(pipefill::core::acquire_job(job, "pfJobCancel", &j));
    return j.runtime()->cancel_job(j.get());
  });
}

PF_API pfResult_t pfJobSetAvailable(pfJob_t job, uint64_t available) {
  return guarded(__func__, [&] {
    JobRef j;
    PF_TRY(pipefill::core::acquire_job(job, "pfJobSetAvailable", &j));
    return j.runtime()->set_job_available(j.get(), available);
  });
}

PF_API pfResult_t pfJobEndInput(pfJob_t job) {
  return guarded(__func__, [&] {
    JobRef j;
    PF_TRY(pipefill::core::acquire_job(job, "pfJobEndInput", &j));
    return j.runtime()->end_job_input(j.get());
  });
}

PF_API pfResult_t pfJobWait(pfJob_t job, double timeout_us) {
  return guarded(__func__, [&] {
    JobRef j;
    PF_TRY(pipefill::core::acquire_job(job, "pfJobWait", &j));
    if (std::isnan(timeout_us)) return fail(pfErrorInvalidArgument, "pfJobWait: timeout_us is NaN");
    return j.runtime()->wait_job(j.get(), timeout_us);
  });
}

PF_API pfResult_t pfJobDestroy(pfJob_t job) {
  return guarded(__func__, [&] {
    if (pipefill::CallbackScope::active()) return pipefill::core::refuse_destroy_from_callback(job);
    JobRef j;
    PF_TRY(pipefill::core::acquire_job(job, "pfJobDestroy", &j));
    return j.runtime()->destroy_job(j.get());
  });
}

}  // extern "C"
