#include "opaque_gemm.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <cstdint>
#include <vector>

#include "common/log.hpp"
#include "cublas_api.hpp"
#include "cuda_check.hpp"
#include "kernel_launchers.hpp"
#include "stream_context.hpp"

#define PF_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                            \
    const cublasStatus_t pf_cublas_status_ = (call);                                              \
    if (pf_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      return ::pipefill::fail(pfErrorCudaFailure, "{} failed at {}:{}: {}", #call,                \
                              ::pipefill::cuda::short_file_name(__FILE__), __LINE__,              \
                              cublas_api().cublasGetStatusName(pf_cublas_status_));                            \
  } while (0)

namespace pipefill::cuda {
namespace {

// Streams and the cuBLAS workspace. cublasSetStream "unconditionally resets the cuBLAS library
// workspace back to the default workspace pool" (cuBLAS docs, cublasSetStream), which cuBLAS may
// grow with cudaMalloc: every cublasSetStream here is followed by cublasSetWorkspace (bind()), so
// a GEMM only ever uses the workspace the caller gave (no allocation inside a bubble).
//
// Several streams: each prepared stream gets its own handle, bound to it once outside bubbles
// (a handle's stream is host state; one handle re-bound per launch would race between threads
// launching on different streams), made with that stream's context current. They share the one
// workspace and the output C, so items are serialized across streams in stream order: each
// launch records its stream's event after the item, and a launch on another stream first waits
// for the previous stream's event (cudaStreamWaitEvent may wait on an event of another context;
// cudaEventRecord needs event and stream of one context, hence one event per stream, created in
// its context). Chosen over a workspace per stream: opaque items are admitted only when they fit
// the time left, one at a time, so per-stream copies would cost memory and gain no overlap.
class CublasGemmItem final : public GemmItem {
 public:
  explicit CublasGemmItem(const GemmItemDesc& desc) : desc_(desc) {}

  ~CublasGemmItem() override {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    if (graph_) (void)cudaGraphDestroy(graph_);
    for (StreamSlot& slot : streams_) {
      if (slot.done) (void)cudaEventDestroy(slot.done);
      if (slot.handle) (void)cublas_api().cublasDestroy(slot.handle);  // made only when loaded
    }
    (void)cudaGetLastError();
  }

  double item_us() const override { return item_us_; }
  bool conditional() const override { return exec_ != nullptr; }

  // Everything (cuBLAS handle, measurement, graph, its conditional handle, capture,
  // instantiation, upload) is made with the setup stream's context current: for a fill stream
  // in a green context, that context - one context throughout, never a primary-context graph
  // launched into a green-context stream.
  pfResult_t init(cudaStream_t setup_stream) {
    if (!cublas_api().ok) return fail(pfErrorNotSupported, "GEMM item: {}", cublas_api().error);
    ScopedStreamContext scope;
    PF_TRY(scope.enter(setup_stream));
    PF_TRY(add_stream(setup_stream));
    const cublasHandle_t handle = streams_[0].handle;
    PF_TRY(measure(handle, setup_stream));
    if (desc_.allow_conditional) {
      if (build_conditional_graph(handle, setup_stream) != pfSuccess) {
        log::info("conditional graph for the GEMM item unavailable ({}); launching it directly",
                  last_error_message());
        clear_last_error();
        if (exec_) (void)cudaGraphExecDestroy(exec_);
        if (graph_) (void)cudaGraphDestroy(graph_);
        exec_ = nullptr;
        graph_ = nullptr;
      }
    }
    return pfSuccess;
  }

  pfResult_t prepare_stream(void* stream) override {
    if (stream == nullptr) return fail(pfErrorInvalidArgument, "GemmItem::prepare_stream: stream is null");
    if (find(static_cast<cudaStream_t>(stream)) != nullptr) return pfSuccess;
    ScopedStreamContext scope;
    PF_TRY(scope.enter(stream));
    return add_stream(static_cast<cudaStream_t>(stream));
  }

  pfResult_t launch(void* stream, uint64_t bubble_id) override {
    auto cuda_stream = static_cast<cudaStream_t>(stream);
    StreamSlot* slot = find(cuda_stream);
    if (slot == nullptr)
      return fail(pfErrorInvalidState,
                  "GemmItem::launch: stream {} was not prepared (prepare_stream, outside bubbles: "
                  "making its cuBLAS handle here could allocate inside a bubble)",
                  stream);
    ScopedStreamContext scope;  // the graph and handle live in the stream's context
    PF_TRY(scope.enter(stream));
    // The previous item, on another stream, used the same workspace and output: after it.
    const size_t index = static_cast<size_t>(slot - streams_.data());
    if (last_ != kNone && last_ != index)
      PF_CUDA_CHECK(cudaStreamWaitEvent(cuda_stream, streams_[last_].done, 0));
    if (exec_ == nullptr) {  // direct mode: admission (fits) is the only protection
      PF_TRY(enqueue_gemm(slot->handle));
    } else {
      // The graph is shared by every launch: updating the condition kernel's parameter changes
      // only later launches, so items already enqueued keep their bubble id.
      cudaKernelNodeParams params = condition_params_;
      void* args[] = {&condition_handle_, &gate_arg_, &bubble_id};
      params.kernelParams = args;
      PF_CUDA_CHECK(cudaGraphExecKernelNodeSetParams(exec_, condition_node_, &params));
      PF_CUDA_CHECK(cudaGraphLaunch(exec_, cuda_stream));
    }
    PF_CUDA_CHECK(cudaEventRecord(slot->done, cuda_stream));
    last_ = index;
    return pfSuccess;
  }

 private:
  struct StreamSlot {
    cudaStream_t stream = nullptr;
    cublasHandle_t handle = nullptr;
    cudaEvent_t done = nullptr;  // recorded after each item on this stream, in its context
  };

  StreamSlot* find(cudaStream_t stream) {
    for (StreamSlot& slot : streams_)
      if (slot.stream == stream) return &slot;
    return nullptr;
  }

  // With `stream`'s context current: its handle, bound to it, and its event.
  pfResult_t add_stream(cudaStream_t stream) {
    StreamSlot slot;
    slot.stream = stream;
    PF_CUBLAS_CHECK(cublas_api().cublasCreate(&slot.handle));
    const pfResult_t bound = bind(slot.handle, stream);
    const cudaError_t event = bound == pfSuccess ? cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming)
                                                 : cudaSuccess;
    if (bound != pfSuccess || event != cudaSuccess) {
      (void)cublas_api().cublasDestroy(slot.handle);
      PF_TRY(bound);
      PF_CUDA_CHECK(event);
    }
    streams_.push_back(slot);
    return pfSuccess;
  }

  pfResult_t bind(cublasHandle_t handle, cudaStream_t stream) {
    return configure_gemm_handle(cublas_api(), handle, stream, desc_);
  }

  pfResult_t enqueue_gemm(cublasHandle_t handle) {
    const float one = 1.0f, zero = 0.0f;
    PF_CUBLAS_CHECK(cublas_api().cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, desc_.m, desc_.n, desc_.k, &one,
                                             desc_.a, desc_.m, desc_.b, desc_.k, &zero, desc_.c, desc_.m));
    return pfSuccess;
  }

  // Times `measure_runs` GEMMs with events; the median is the item cost.
  pfResult_t measure(cublasHandle_t handle, cudaStream_t stream) {
    PF_TRY(enqueue_gemm(handle));  // warm-up: loads the cuBLAS kernel, picks the algorithm
    cudaEvent_t start = nullptr, stop = nullptr;
    PF_CUDA_CHECK(cudaEventCreate(&start));
    const cudaError_t created = cudaEventCreate(&stop);
    if (created != cudaSuccess) {
      (void)cudaEventDestroy(start);
      PF_CUDA_CHECK(created);
    }
    std::vector<double> samples;
    pfResult_t result = pfSuccess;
    for (int run = 0; run < std::max(1, desc_.measure_runs) && result == pfSuccess; ++run) {
      float ms = 0.0f;
      cudaError_t error = cudaEventRecord(start, stream);
      if (error == cudaSuccess && (result = enqueue_gemm(handle)) != pfSuccess) break;
      if (error == cudaSuccess) error = cudaEventRecord(stop, stream);
      if (error == cudaSuccess) error = cudaEventSynchronize(stop);
      if (error == cudaSuccess) error = cudaEventElapsedTime(&ms, start, stop);
      if (error != cudaSuccess) result = cuda_failure(error, "timing the GEMM item", __FILE__, __LINE__);
      samples.push_back(ms * 1000.0);
    }
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    PF_TRY(result);
    std::sort(samples.begin(), samples.end());
    item_us_ = samples[samples.size() / 2];
    return pfSuccess;
  }

  // graph: [set-condition kernel] -> IF(condition) { captured GEMM }
  pfResult_t build_conditional_graph(cublasHandle_t handle, cudaStream_t stream) {
    PF_CUDA_CHECK(cudaGraphCreate(&graph_, 0));
    PF_CUDA_CHECK(cudaGraphConditionalHandleCreate(&condition_handle_, graph_, 0, cudaGraphCondAssignDefault));
    gate_arg_ = desc_.gate;
    uint64_t initial_bubble = 0;  // condition false until launch() sets the real id
    void* args[] = {&condition_handle_, &gate_arg_, &initial_bubble};
    condition_params_ = cudaKernelNodeParams{};
    condition_params_.func = const_cast<void*>(detail::gate_condition_kernel_function());
    condition_params_.gridDim = dim3(1);
    condition_params_.blockDim = dim3(1);
    condition_params_.kernelParams = args;
    PF_CUDA_CHECK(cudaGraphAddKernelNode(&condition_node_, graph_, nullptr, 0, &condition_params_));
    cudaGraphNodeParams node{};
    node.type = cudaGraphNodeTypeConditional;
    node.conditional.handle = condition_handle_;
    node.conditional.type = cudaGraphCondTypeIf;
    node.conditional.size = 1;
    cudaGraphNode_t if_node = nullptr;
    PF_CUDA_CHECK(cudaGraphAddNode(&if_node, graph_, &condition_node_, nullptr, 1, &node));
    cudaGraph_t body = node.conditional.phGraph_out[0];
    // Capture the GEMM straight into the IF node's body (the handle is bound to `stream`, with
    // the caller's workspace: nothing allocates during capture).
    PF_CUDA_CHECK(cudaStreamBeginCaptureToGraph(stream, body, nullptr, nullptr, 0,
                                                cudaStreamCaptureModeThreadLocal));
    const pfResult_t captured = enqueue_gemm(handle);
    cudaGraph_t ended = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream, &ended);
    PF_TRY(captured);
    PF_CUDA_CHECK(end);
    PF_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    PF_CUDA_CHECK(cudaGraphUpload(exec_, stream));  // no lazy upload inside a bubble
    PF_CUDA_CHECK(cudaStreamSynchronize(stream));
    return pfSuccess;
  }

  GemmItemDesc desc_;
  std::vector<StreamSlot> streams_;  // [0]: the setup stream; grown only by prepare_stream
  static constexpr size_t kNone = SIZE_MAX;
  size_t last_ = kNone;              // index of the latest launch's stream in streams_
  double item_us_ = 0.0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  cudaGraphNode_t condition_node_ = nullptr;
  cudaGraphConditionalHandle condition_handle_{};
  cudaKernelNodeParams condition_params_{};
  const volatile uint64_t* gate_arg_ = nullptr;
};

}  // namespace

// cublasSetStream drops the workspace back to cuBLAS's own pool: set ours again right after. The
// SM count target is handle state that cublasSetStream leaves alone; set last, before any GEMM
// of the handle is enqueued or captured, so cuBLAS's heuristics pick kernels for the partition.
pfResult_t configure_gemm_handle(const CublasApi& api, void* handle_ptr, void* stream, const GemmItemDesc& desc) {
  const auto handle = static_cast<cublasHandle_t>(handle_ptr);
  const auto check = [&](cublasStatus_t status, const char* call) {
    if (status == CUBLAS_STATUS_SUCCESS) return pfSuccess;
    return fail(pfErrorCudaFailure, "{} failed: {}", call,
                api.cublasGetStatusName != nullptr ? api.cublasGetStatusName(status) : "cublasStatus_t");
  };
  PF_TRY(check(api.cublasSetStream(handle, static_cast<cudaStream_t>(stream)), "cublasSetStream"));
  if (desc.workspace != nullptr && desc.workspace_bytes > 0)
    PF_TRY(check(api.cublasSetWorkspace(handle, desc.workspace, desc.workspace_bytes), "cublasSetWorkspace"));
  if (desc.sm_count_target > 0) {
    const std::string call = fmt::format("cublasSetSmCountTarget({})", desc.sm_count_target);
    PF_TRY(check(api.cublasSetSmCountTarget(handle, desc.sm_count_target), call.c_str()));
  }
  return pfSuccess;
}

pfResult_t make_gemm_item(const GemmItemDesc& desc, void* setup_stream, std::unique_ptr<GemmItem>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "make_gemm_item: out is null");
  if (desc.m <= 0 || desc.n <= 0 || desc.k <= 0)
    return fail(pfErrorInvalidArgument, "make_gemm_item: dimensions m={} n={} k={} must be > 0", desc.m, desc.n,
                desc.k);
  if (desc.a == nullptr || desc.b == nullptr || desc.c == nullptr)
    return fail(pfErrorInvalidArgument, "make_gemm_item: null matrix pointer (a={}, b={}, c={})",
                static_cast<const void*>(desc.a), static_cast<const void*>(desc.b), static_cast<void*>(desc.c));
  if (desc.sm_count_target < 0)
    return fail(pfErrorInvalidArgument, "make_gemm_item: sm_count_target={} must be >= 0 (0: cuBLAS's default)",
                desc.sm_count_target);
  if (desc.allow_conditional && desc.gate == nullptr)
    return fail(pfErrorInvalidArgument, "make_gemm_item: a conditional item needs the gate word (gate is null)");
  auto item = std::make_unique<CublasGemmItem>(desc);
  PF_TRY(item->init(static_cast<cudaStream_t>(setup_stream)));
  *out = std::move(item);
  return pfSuccess;
}

}  // namespace pipefill::cuda
