// Built without CUDA: only the simulated transport exists.
#ifndef ENGINE_WITH_CUDA
#include "transport.hpp"

namespace engine {

std::unique_ptr<Transport> make_emulated_transport(std::string* why) {
  *why = "this build has no CUDA support (configure with the CUDA toolkit present)";
  return nullptr;
}

std::unique_ptr<Transport> make_nccl_transport(int, std::string* why) {
  *why = "this build has no CUDA support (configure with the CUDA toolkit present)";
  return nullptr;
}

int cuda_gpu_count() { return 0; }

}  // namespace engine
#endif
