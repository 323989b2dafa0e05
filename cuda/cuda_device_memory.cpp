// The CUDA device's memory: device and pinned words (gates, counters), the gate write (a
// stream-ordered cuStreamWriteValue64, or a copy from a pinned slot ring, chosen by self-test),
// and the fill arena. Device memory is allocated only at setup, never in a bubble.
#include "cuda_device_impl.hpp"

#include <cstring>

#include "arena_memory.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "kernel_launchers.hpp"

namespace pipefill::cuda {

pfResult_t CudaDevice::allocate_words(size_t count, uint64_t** words) {
  if (words == nullptr || count == 0)
    return fail(pfErrorInvalidArgument, "allocate_words: count={} (must be > 0) or null output", count);
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  void* memory = nullptr;
  PF_CUDA_CHECK(cudaMalloc(&memory, count * sizeof(uint64_t)));  // 256-byte aligned
  const cudaError_t zero = cudaMemsetAsync(memory, 0, count * sizeof(uint64_t), control_stream_);
  const cudaError_t sync = zero == cudaSuccess ? cudaStreamSynchronize(control_stream_) : zero;
  if (sync != cudaSuccess) {
    (void)cudaFree(memory);
    return cuda_failure(sync, "cudaMemsetAsync/cudaStreamSynchronize(words)", __FILE__, __LINE__);
  }
  std::lock_guard lock(mutex_);
  device_words_.insert(memory);
  *words = static_cast<uint64_t*>(memory);
  return pfSuccess;
}

pfResult_t CudaDevice::free_words(uint64_t* words) {
  {
    std::lock_guard lock(mutex_);
    if (device_words_.erase(words) == 0)
      return fail(pfErrorInvalidArgument, "free_words: {} was not allocated by allocate_words",
                  static_cast<void*>(words));
  }
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  PF_CUDA_CHECK(cudaFree(words));
  return pfSuccess;
}

pfResult_t CudaDevice::allocate_host_words(size_t count, uint64_t** words) {
  if (words == nullptr || count == 0)
    return fail(pfErrorInvalidArgument, "allocate_host_words: count={} (must be > 0) or null output", count);
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  void* memory = nullptr;
  PF_CUDA_CHECK(cudaHostAlloc(&memory, count * sizeof(uint64_t), cudaHostAllocPortable));
  std::memset(memory, 0, count * sizeof(uint64_t));
  std::lock_guard lock(mutex_);
  host_words_.insert(memory);
  *words = static_cast<uint64_t*>(memory);
  return pfSuccess;
}

pfResult_t CudaDevice::free_host_words(uint64_t* words) {
  {
    std::lock_guard lock(mutex_);
    if (host_words_.erase(words) == 0)
      return fail(pfErrorInvalidArgument, "free_host_words: {} was not allocated by allocate_host_words",
                  static_cast<void*>(words));
  }
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  PF_CUDA_CHECK(cudaFreeHost(words));
  return pfSuccess;
}

pfResult_t CudaDevice::write_word(Stream stream, uint64_t* word, uint64_t value) {
  if (word == nullptr) return fail(pfErrorInvalidArgument, "write_word: word is null");
  PF_DEVICE_CONTEXT(ContextNeed::Any);
  if (gate_mode_ == GateWriteMode::StreamWriteValue) {
    PF_DRIVER_CHECK(driver_api().stream_write_value64(static_cast<CUstream>(stream),
                                                      reinterpret_cast<CUdeviceptr>(word), value,
                                                      CU_STREAM_WRITE_VALUE_DEFAULT));
    return pfSuccess;
  }
  const size_t slot = next_gate_slot_.fetch_add(1, std::memory_order_relaxed) % kGateSlotCount;
  gate_slots_[slot] = value;
  PF_CUDA_CHECK(cudaMemcpyAsync(word, &gate_slots_[slot], sizeof(uint64_t), cudaMemcpyHostToDevice,
                                static_cast<cudaStream_t>(stream)));
  return pfSuccess;
}

// A one-thread kernel (cuStreamWriteValue has no max). The module is loaded with the others at
// device creation (load_kernels), so this launch loads nothing inside a bubble.
pfResult_t CudaDevice::write_word_max(Stream stream, uint64_t* word, uint64_t value) {
  if (word == nullptr) return fail(pfErrorInvalidArgument, "write_word_max: word is null");
  PF_DEVICE_CONTEXT(ContextNeed::Any);
  PF_CUDA_CHECK(detail::launch_gate_max_kernel(static_cast<cudaStream_t>(stream), word, value));
  return pfSuccess;
}

pfResult_t CudaDevice::copy_word_to_host(Stream stream, const uint64_t* word, uint64_t* host) {
  if (word == nullptr || host == nullptr)
    return fail(pfErrorInvalidArgument, "copy_word_to_host: null word ({}) or host ({}) pointer",
                static_cast<const void*>(word), static_cast<void*>(host));
  PF_DEVICE_CONTEXT(ContextNeed::Any);
  PF_CUDA_CHECK(cudaMemcpyAsync(host, word, sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                static_cast<cudaStream_t>(stream)));
  return pfSuccess;
}

pfResult_t CudaDevice::memory_info(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr)
    return fail(pfErrorInvalidArgument, "memory_info: null output pointer");
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  PF_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  return pfSuccess;
}

pfResult_t CudaDevice::allocate_arena(size_t bytes, void** base) {
  // The size is the runtime's decision (by default min(2 GiB, free memory / 8), see
  // docs/cuda-backend.md "Memory"); the device has no default of its own to disagree with. The
  // allocation runs in this device's primary context, whatever the calling thread has current.
  void* memory = nullptr;
  PF_TRY(allocate_arena_memory(driver_api(), primary_, cu_device_, bytes, &memory));
  std::lock_guard lock(mutex_);
  arenas_[memory] = bytes;
  *base = memory;
  log::info("fill arena: {} bytes at {}", bytes, memory);
  return pfSuccess;
}

pfResult_t CudaDevice::free_arena(void* base) {
  {
    std::lock_guard lock(mutex_);
    if (arenas_.erase(base) == 0)
      return fail(pfErrorInvalidArgument, "free_arena: {} is not an arena of this device", base);
  }
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  PF_CUDA_CHECK(cudaFree(base));
  return pfSuccess;
}

// Chooses the gate write: cuStreamWriteValue64 when the entry point exists and a self-test
// write lands; otherwise the pinned slot ring.
pfResult_t CudaDevice::init_gate_write() {
  void* slots = nullptr;
  PF_CUDA_CHECK(cudaHostAlloc(&slots, kGateSlotCount * sizeof(uint64_t), cudaHostAllocPortable));
  gate_slots_ = static_cast<uint64_t*>(slots);
  std::memset(gate_slots_, 0, kGateSlotCount * sizeof(uint64_t));
  gate_mode_ = GateWriteMode::PinnedCopy;
  const auto& api = driver_api();
  if (api.stream_write_value64 == nullptr) {
    log::info("cuStreamWriteValue64 unavailable (driver {}): gate writes copy from pinned slots",
              api.driver_version);
    return pfSuccess;
  }
  uint64_t* probe = nullptr;
  PF_TRY(allocate_words(1, &probe));
  constexpr uint64_t kProbeValue = 0x5049504546494c4cull;  // "PIPEFILL"
  uint64_t seen = 0;
  const CUresult write = api.stream_write_value64(reinterpret_cast<CUstream>(control_stream_),
                                                  reinterpret_cast<CUdeviceptr>(probe), kProbeValue,
                                                  CU_STREAM_WRITE_VALUE_DEFAULT);
  cudaError_t copy = cudaSuccess;
  if (write == CUDA_SUCCESS) {
    copy = cudaMemcpyAsync(&seen, probe, sizeof seen, cudaMemcpyDeviceToHost, control_stream_);
    if (copy == cudaSuccess) copy = cudaStreamSynchronize(control_stream_);
  }
  PF_TRY(free_words(probe));
  if (write == CUDA_SUCCESS && copy == cudaSuccess && seen == kProbeValue) {
    gate_mode_ = GateWriteMode::StreamWriteValue;
  } else {
    (void)cudaGetLastError();
    log::info("cuStreamWriteValue64 self-test failed (result {}, copy {}, value {:#x}): gate writes copy "
              "from pinned slots", static_cast<int>(write), cudaGetErrorName(copy), seen);
  }
  return pfSuccess;
}

}  // namespace pipefill::cuda
