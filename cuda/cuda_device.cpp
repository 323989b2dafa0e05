// Placeholder until the CUDA device lands (issue 3): reports the device count honestly and
// refuses to create a device.
#include <cuda_runtime_api.h>

#include "common/error.hpp"
#include "device/device.hpp"

namespace pipefill {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

pfResult_t make_cuda_device(const RuntimeOptions&, std::unique_ptr<Device>*) {
  return fail(pfErrorNotSupported, "the CUDA device is not implemented yet");
}

}  // namespace pipefill
