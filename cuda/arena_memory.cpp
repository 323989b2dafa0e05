// The fill arena's device allocation in the runtime's device's primary context (arena_memory.hpp).
#include "arena_memory.hpp"

#include "common/error.hpp"
#include "cuda_check.hpp"
#include "device_context.hpp"

namespace pipefill::cuda {

pfResult_t allocate_arena_memory(const DriverApi& driver, CUcontext primary, CUdevice device, size_t bytes,
                                 void** base, const ArenaMemoryApi& api) {
  if (base == nullptr) return fail(pfErrorInvalidArgument, "allocate_arena: base is null");
  if (bytes == 0) return fail(pfErrorInvalidArgument, "allocate_arena: bytes=0 (the caller sizes the arena)");
  DeviceContextScope in_primary(driver);
  PF_TRY(in_primary.enter(primary, device, ContextNeed::Primary));
  size_t free_bytes = 0, total_bytes = 0;
  PF_CUDA_CHECK(api.mem_get_info(&free_bytes, &total_bytes));
  if (bytes > free_bytes)
    return fail(pfErrorOutOfMemory, "allocate_arena: {} bytes requested but only {} of {} bytes are free",
                bytes, free_bytes, total_bytes);
  void* memory = nullptr;
  const cudaError_t error = api.malloc(&memory, bytes);
  if (error == cudaErrorMemoryAllocation) {
    (void)api.get_last_error();
    return fail(pfErrorOutOfMemory, "allocate_arena: cudaMalloc of {} bytes failed ({} bytes free)", bytes,
                free_bytes);
  }
  PF_CUDA_CHECK(error);
  *base = memory;
  return pfSuccess;
}

}  // namespace pipefill::cuda
