// Opaque fill work: a cuBLAS GEMM as one item of an opaque job (pfJobOpaque). Opaque work cannot
// check the gate between its blocks, so it is admitted only when its measured duration fits the
// time left in the bubble, and, where the toolkit and driver support conditional graph nodes
// (CUDA 12.4+), it is captured into a CUDA graph whose IF node reads the gate through a 1-thread
// set-condition kernel and skips the GEMM once the bubble is closed (e.g. the item was enqueued
// but the bubble ended before it started). Without conditional nodes it is launched directly.
// No CUDA header here: streams are cudaStream_t passed as void*.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "pipefill/pipefill.h"

namespace pipefill::cuda {

struct GemmItemDesc {
  int m = 0, n = 0, k = 0;           // C[m x n] = A[m x k] * B[k x n], fp32, column-major
  const float* a = nullptr;          // device pointers (from the job's arena share)
  const float* b = nullptr;
  float* c = nullptr;
  void* workspace = nullptr;         // cuBLAS workspace (so capture never allocates)
  size_t workspace_bytes = 0;
  const volatile uint64_t* gate = nullptr;  // the runtime's gate word (pfSliceDesc_t::gate)
  int measure_runs = 5;              // runs timed at creation; the median is the item cost
  bool allow_conditional = true;     // false: always launch directly (tests, comparison)
  // SMs cuBLAS sizes its kernels for (cublasSetSmCountTarget on every handle of the item), before
  // the measurement and the capture: pass the fill partition's SM count
  // (CudaDeviceExtras::partition().fill_sms). cuBLAS otherwise picks persistent kernels whose grid
  // is the whole device's SM count: inside a 116-SM green context of a 132-SM H100 the extra
  // blocks run as a second wave (up to 2x the item time; cuBLAS honours green-context limits only
  // from CUDA 13.3), and a captured graph keeps that grid for its life. 0: cuBLAS's default.
  int sm_count_target = 0;
};

struct CublasApi;

// A handle readied for `stream` (opaque_gemm.cpp says why in this order): cublasSetStream, the
// caller's workspace (cublasSetStream drops it), then the SM count target when one is given. Every
// status is checked; a failure names the call and cuBLAS's status name. `api`: the loaded cuBLAS
// (cublas_api()), or a recording fake in tests.
pfResult_t configure_gemm_handle(const CublasApi& api, void* handle, void* stream, const GemmItemDesc& desc);

class GemmItem {
 public:
  virtual ~GemmItem() = default;
  // Median measured duration of one item (µs), from creation.
  virtual double item_us() const = 0;
  // Whether items are gated by a conditional graph node (else launched directly).
  virtual bool conditional() const = 0;
  // Admission rule for opaque work: the item runs only when it fits the time left.
  bool fits(double time_left_us) const { return time_left_us > 0.0 && item_us() <= time_left_us; }
  // Setup only (outside bubbles): readies another stream of the same context as the setup stream
  // for launch() - its own cuBLAS handle bound to it (workspace set after the stream, see
  // opaque_gemm.cpp) and an event in its context. The setup stream is ready from creation.
  virtual pfResult_t prepare_stream(void* stream) = 0;
  // Enqueues one item on a prepared `stream` for bubble `bubble_id` (skipped on the device if the
  // gate is already >= bubble_id when it would start, in conditional mode). Items on different
  // streams run one after another in launch order (they share the workspace and the output). No
  // allocation, no sync; an unprepared stream is refused.
  virtual pfResult_t launch(void* stream, uint64_t bubble_id) = 0;
};

// Setup only (allocates the cuBLAS handle, captures and instantiates the graph, times the GEMM
// on `setup_stream`, synchronising it, and prepares setup_stream for launch()). Dimensions must
// be > 0, pointers non-null and sm_count_target >= 0.
pfResult_t make_gemm_item(const GemmItemDesc& desc, void* setup_stream, std::unique_ptr<GemmItem>* out);

}  // namespace pipefill::cuda
