// Placeholder until the real-time host device (src/host/) lands: the factory says so instead of
// failing to link. Delete this file when src/host/host_device.cpp defines make_host_device.
#include "common/error.hpp"
#include "device/device.hpp"

namespace pipefill {

pfResult_t make_host_device(const RuntimeOptions&, std::unique_ptr<Device>*) {
  return fail(pfErrorNotSupported, "the real-time host device (backend=host) is not built yet");
}

}  // namespace pipefill
