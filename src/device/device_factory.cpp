// Picks the Device implementation for a resolved backend. The core calls only this, so it never
// names a backend's type (CUDA, simulator, host device).
#include "common/error.hpp"
#include "core/config.hpp"
#include "device/device.hpp"

namespace pipefill {

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
