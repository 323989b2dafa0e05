// Acting on the runtime's GPU without moving the caller (issue 24 item 3). A library linked into a
// training process never changes the calling thread's current CUDA context or device:
// cudaSetDevice binds the device's primary context on the calling thread, which undoes a torch
// green context the trainer made current and, with a default device of 0, moved every rank of an
// 8-GPU node to GPU 0. So the backend
//  - takes the caller's current device as its default (caller_device_ordinal: the device of the
//    current context, read through the driver, nothing set);
//  - holds the device's primary context (cuDevicePrimaryCtxRetain) and, for a call that needs it
//    current, pushes it for that call only (DeviceContextScope) - never cudaSetDevice, never
//    cuCtxSetCurrent on a thread it does not own.
// The driver calls come from a DriverApi table, so a test can hand it fakes that model a thread's
// context stack and check what is called and that the thread's state is unchanged afterwards.
#pragma once

#include <cuda.h>

#include <string>

#include "driver_api.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cuda {

// What a call needs from the calling thread's current context.
enum class ContextNeed {
  // The device's primary context itself: calls that create or free objects (streams, events,
  // memory), launch kernels, or ask the current device something. Pushed unless already current.
  Primary,
  // Any context of the device: stream-ordered calls on a given stream (event records and waits,
  // word writes and copies) and event queries take their context from their handles, and a special
  // stream handle (the legacy NULL stream, cudaStreamPerThread) means the caller's current
  // context's stream, which a push would change - so a context of the runtime's device (a torch
  // green context, say) stays current. A thread with no context gets the primary one pushed (or
  // the CUDA runtime would bind device 0's primary context to it for good), and so does one whose
  // current context belongs to another device.
  Any,
};

// For one scope: the device's primary context current on the calling thread (as `need` says),
// and afterwards exactly the context that was current before. Not movable; one enter per object.
class DeviceContextScope {
 public:
  explicit DeviceContextScope(const DriverApi& api = driver_api()) : api_(&api) {}
  DeviceContextScope(const DeviceContextScope&) = delete;
  DeviceContextScope& operator=(const DeviceContextScope&) = delete;
  // Pops what enter() pushed; a pop that returns another context than the pushed one (someone
  // changed the stack inside the scope) is logged.
  ~DeviceContextScope();

  // `primary`: the device's primary context; `device`: that device (for ContextNeed::Any). Without
  // the context entry points (no driver) there is nothing to keep: success, no change.
  pfResult_t enter(CUcontext primary, CUdevice device, ContextNeed need);
  bool pushed() const { return pushed_ != nullptr; }

 private:
  const DriverApi* api_;
  CUcontext pushed_ = nullptr;
};

// The ordinal of the calling thread's current device, changing nothing: the device of the current
// context (cuCtxGetCurrent, cuCtxGetDevice) mapped to its ordinal among `device_count` devices
// (cuDeviceGet); with no context current, device 0 (what the CUDA runtime would bind). *source
// says which ("the calling thread's current context (device 1)", ...).
pfResult_t caller_device_ordinal(const DriverApi& api, int device_count, int* ordinal, std::string* source);

}  // namespace pipefill::cuda
