// Built without the CUDA backend: the factory says so instead of failing to link.
#ifndef PIPEFILL_WITH_CUDA
#include "common/error.hpp"
#include "device/device.hpp"

namespace pipefill {

pfResult_t make_cuda_device(const RuntimeOptions&, std::unique_ptr<Device>*) {
  return fail(pfErrorNotSupported,
              "PipeFill was built without the CUDA backend (PIPEFILL_ENABLE_CUDA=OFF or no CUDA "
              "toolkit at build time); use backend=sim");
}

int cuda_device_count() { return 0; }

}  // namespace pipefill
#endif
