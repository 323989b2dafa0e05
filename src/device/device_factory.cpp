// Picks the Device implementation for a resolved backend. The core calls only this, so it never
// names a backend's type (CUDA, simulator, host device). Also the default capture-context pushes
// (device.hpp) of devices without CUDA contexts.
#include "common/error.hpp"
#include "core/config.hpp"
#include "device/device.hpp"

#include <vector>

namespace pipefill {
namespace {
// The capture-context pushes of devices without contexts: one entry per open push, per thread.
thread_local std::vector<const Device*> open_capture_pushes;
}  // namespace

pfResult_t Device::push_capture_context(Stream stream) {
  (void)stream;  // no context to make current: the count alone keeps push and pop paired
  open_capture_pushes.push_back(this);
  return pfSuccess;
}

pfResult_t Device::pop_capture_context() {
  if (open_capture_pushes.empty() || open_capture_pushes.back() != this)
    return fail(pfErrorInvalidState,
                "pfGraphCaptureContextPop: no pfGraphCaptureContextPush of this runtime is open on "
                "the calling thread");
  open_capture_pushes.pop_back();
  return pfSuccess;
}


pfResult_t make_device(const RuntimeOptions& options, std::unique_ptr<Device>* out) {
  switch (options.backend) {
    case pfBackendCuda: return make_cuda_device(options, out);
    case pfBackendSim: return make_sim_device(options, out);
    case pfBackendHost: return make_host_device(options, out);
    default:
      return fail(pfErrorInvalidArgument, "backend {} has no device (pfBackendAuto unresolved?)",
                  static_cast<int>(options.backend));
  }
}

}  // namespace pipefill
