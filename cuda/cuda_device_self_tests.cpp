// The CUDA device's self-tests, run once on the real stream pair before a partition or a main
// stream's context is accepted: word operations on a fill stream (read-back, cuStreamWriteValue64,
// pinned copy) and cross-context event records, waits and timings (fallbacks.hpp judges them).
#include "cuda_device_impl.hpp"

#include "common/error.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "fill_kernels.hpp"
#include "stream_context.hpp"

namespace pipefill::cuda {

// The fill stream's word operations, checked once on the real stream (fallbacks.hpp says what
// and why). Raw allocations: the caller holds mutex_, which allocate_words takes.
MemoryOpsSelfTest CudaDevice::run_memory_ops_self_test(cudaStream_t fill) {
  MemoryOpsSelfTest test;
  constexpr uint64_t kSentinel = 0x5E5E5E5E5E5E5E5Eull;
  constexpr uint64_t kWritten = 0x5049504546494c4cull;  // "PIPEFILL"
  constexpr uint64_t kCopied = 0x434f5059574f5244ull;   // "COPYWORD"
  void* probe = nullptr;
  void* host = nullptr;  // [0]: read-back target, [1]: pinned source of the copy
  auto name = [](const char* call, cudaError_t error) {
    (void)cudaGetLastError();
    return fmt::format("{}: {}", call, cudaGetErrorName(error));
  };
  cudaError_t error = cudaMalloc(&probe, sizeof(uint64_t));
  if (error == cudaSuccess) error = cudaHostAlloc(&host, 2 * sizeof(uint64_t), cudaHostAllocPortable);
  if (error == cudaSuccess) error = cudaMemsetAsync(probe, 0, sizeof(uint64_t), control_stream_);
  if (error == cudaSuccess) error = cudaStreamSynchronize(control_stream_);
  if (error != cudaSuccess) {
    test.readback_error = name("setting up the probe word", error);
  } else {
    auto* words = static_cast<volatile uint64_t*>(host);
    // Copies `probe` to words[0] on the fill stream and waits; "" or the failing call.
    auto read_back = [&](uint64_t* seen) -> std::string {
      words[0] = kSentinel;
      cudaError_t e = cudaMemcpyAsync(host, probe, sizeof(uint64_t), cudaMemcpyDeviceToHost, fill);
      if (e != cudaSuccess) return name("cudaMemcpyAsync(pinned <- probe, fill stream)", e);
      e = cudaStreamSynchronize(fill);
      if (e != cudaSuccess) return name("cudaStreamSynchronize(fill stream)", e);
      *seen = words[0];
      return "";
    };
    uint64_t seen = kSentinel;
    test.readback_error = read_back(&seen);
    test.readback_landed = test.readback_error.empty() && seen == 0;
    test.stream_write_tried = gate_mode_ == GateWriteMode::StreamWriteValue;
    if (test.readback_landed && test.stream_write_tried) {
      const CUresult write = driver_api().stream_write_value64(
          reinterpret_cast<CUstream>(fill), reinterpret_cast<CUdeviceptr>(probe), kWritten,
          CU_STREAM_WRITE_VALUE_DEFAULT);
      if (write != CUDA_SUCCESS) {
        test.stream_write_error = fmt::format("cuStreamWriteValue64(fill stream): {}", driver_result_name(write));
      } else {
        test.stream_write_error = read_back(&seen);
        test.stream_write_landed = test.stream_write_error.empty() && seen == kWritten;
      }
    }
    if (test.readback_landed) {
      words[1] = kCopied;
      const cudaError_t copy = cudaMemcpyAsync(probe, static_cast<uint64_t*>(host) + 1, sizeof(uint64_t),
                                               cudaMemcpyHostToDevice, fill);
      if (copy != cudaSuccess) {
        test.pinned_copy_error = name("cudaMemcpyAsync(probe <- pinned slot, fill stream)", copy);
      } else {
        test.pinned_copy_error = read_back(&seen);
        test.pinned_copy_landed = test.pinned_copy_error.empty() && seen == kCopied;
      }
    }
  }
  if (cudaStreamSynchronize(fill) != cudaSuccess) (void)cudaGetLastError();
  if (probe != nullptr && cudaFree(probe) != cudaSuccess) (void)cudaGetLastError();
  if (host != nullptr && cudaFreeHost(host) != cudaSuccess) (void)cudaGetLastError();
  return test;
}

// The runtime records primary-context events (its slice events) on the fill stream and times
// them against primary-context events (the reference, the bubble's begin/end); cudaEventRecord
// documents event and stream from the same context. Checked here once, on the real pair.
EventSelfTest CudaDevice::run_event_self_test(cudaStream_t fill) {
  EventSelfTest test;
  test.kernel_ms = static_cast<double>(kEventSelfTestKernelNs) / 1e6;
  cudaEvent_t a = nullptr, b = nullptr, c = nullptr;
  const auto ok = &self_test_step;
  bool good = ok(&test.create_error, "cudaEventCreate(A)", cudaEventCreate(&a)) &&
              ok(&test.create_error, "cudaEventCreate(B)", cudaEventCreate(&b)) &&
              ok(&test.create_error, "cudaEventCreate(C)", cudaEventCreate(&c)) &&
              ok(&test.create_error, "cudaEventRecord(A, main)", cudaEventRecord(a, control_stream_));
  finish_event_self_test(&test, good, fill, a, "A", b, c);
  return test;
}

// One step of an event self-test: true on success, else the call and its error in *slot.
bool CudaDevice::self_test_step(std::string* slot, const char* call, cudaError_t error) {
  if (error == cudaSuccess) return true;
  (void)cudaGetLastError();
  *slot = fmt::format("{}: {}", call, cudaGetErrorName(error));
  return false;
}

// The shared second half of both event self-tests, after `first` was recorded on its stream:
// a kernel of known length on the main side, B recorded after it, the fill stream waiting for
// B and recording C; elapsed(first, C) must span the kernel. Destroys the three events.
void CudaDevice::finish_event_self_test(EventSelfTest* test, bool good, cudaStream_t fill, cudaEvent_t first,
                            const char* first_name, cudaEvent_t b, cudaEvent_t c) {
  const auto ok = &self_test_step;
  if (good && launch_spin_and_stamp(control_stream_, kEventSelfTestKernelNs, nullptr) != pfSuccess) {
    test->create_error = last_error_message();
    clear_last_error();
    good = false;
  }
  good = good && ok(&test->create_error, "cudaEventRecord(B, main)", cudaEventRecord(b, control_stream_)) &&
         ok(&test->wait_error, "cudaStreamWaitEvent(fill, B)", cudaStreamWaitEvent(fill, b, 0)) &&
         ok(&test->record_error, "cudaEventRecord(C, fill)", cudaEventRecord(c, fill)) &&
         ok(&test->sync_error, "cudaEventSynchronize(C)", cudaEventSynchronize(c));
  float elapsed_ms = -1.0f;
  const std::string elapsed_call = fmt::format("cudaEventElapsedTime({}, C)", first_name);
  if (good && ok(&test->elapsed_error, elapsed_call.c_str(), cudaEventElapsedTime(&elapsed_ms, first, c)))
    test->elapsed_ms = elapsed_ms;
  if (cudaStreamSynchronize(control_stream_) != cudaSuccess) (void)cudaGetLastError();
  if (cudaStreamSynchronize(fill) != cudaSuccess) (void)cudaGetLastError();
  for (cudaEvent_t e : {first, b, c})
    if (e != nullptr && cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
}

// The self-test of the per-context path on the real pair: fill side records F (a fill-context
// event) before the main side's kernel starts, waits for the main side's B (a primary-context
// event, cross-context wait) and records C (fill context); elapsed(F, C) spans the kernel.
EventSelfTest CudaDevice::run_per_context_event_self_test(cudaStream_t fill) {
  EventSelfTest test;
  test.kernel_ms = static_cast<double>(kEventSelfTestKernelNs) / 1e6;
  cudaEvent_t f = nullptr, b = nullptr, c = nullptr;
  const auto ok = &self_test_step;
  bool good = true;
  {
    ScopedStreamContext scope;
    if (scope.enter(fill) != pfSuccess) {
      test.create_error = last_error_message();
      clear_last_error();
      good = false;
    }
    good = good && ok(&test.create_error, "cudaEventCreate(F, fill context)", cudaEventCreate(&f)) &&
           ok(&test.create_error, "cudaEventCreate(C, fill context)", cudaEventCreate(&c));
  }
  good = good && ok(&test.create_error, "cudaEventCreate(B)", cudaEventCreate(&b)) &&
         ok(&test.record_error, "cudaEventRecord(F, fill)", cudaEventRecord(f, fill));
  finish_event_self_test(&test, good, fill, f, "F", b, c);
  return test;
}

}  // namespace pipefill::cuda
