#include "opaque_gemm.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
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

class CublasGemmItem final : public GemmItem {
 public:
  explicit CublasGemmItem(const GemmItemDesc& desc) : desc_(desc) {}

  ~CublasGemmItem() override {
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    if (graph_) (void)cudaGraphDestroy(graph_);
    if (handle_) (void)cublas_api().cublasDestroy(handle_);
    (void)cudaGetLastError();
  }

  double item_us() const override { return item_us_; }
  bool conditional() const override { return exec_ != nullptr; }

  // Everything (cuBLAS handle, measurement, graph, its conditional handle, capture,
  // instantiation, upload) is made with the setup stream's context current: for a fill stream
  // in a green context, that context - one context throughout, never a primary-context graph
  // launched into a green-context stream.
  pfResult_t init(cudaStream_t setup_stream) {
    ScopedStreamContext scope;
    PF_TRY(scope.enter(setup_stream));
    if (!cublas_api().ok) return fail(pfErrorNotSupported, "GEMM fill item: {}", cublas_api().error);
    PF_CUBLAS_CHECK(cublas_api().cublasCreate(&handle_));
    if (desc_.workspace != nullptr && desc_.workspace_bytes > 0)
      PF_CUBLAS_CHECK(cublas_api().cublasSetWorkspace(handle_, desc_.workspace, desc_.workspace_bytes));
    PF_TRY(measure(setup_stream));
    if (desc_.allow_conditional) {
      if (build_conditional_graph(setup_stream) != pfSuccess) {
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

  pfResult_t launch(void* stream, uint64_t bubble_id) override {
    auto cuda_stream = static_cast<cudaStream_t>(stream);
    ScopedStreamContext scope;  // the graph and handle live in the stream's context
    PF_TRY(scope.enter(stream));
    if (exec_ == nullptr) {  // direct mode: admission (fits) is the only protection
      PF_CUBLAS_CHECK(cublas_api().cublasSetStream(handle_, cuda_stream));
      return enqueue_gemm();
    }
    // The graph is shared by every launch: updating the condition kernel's parameter changes
    // only later launches, so items already enqueued keep their bubble id.
    cudaKernelNodeParams params = condition_params_;
    void* args[] = {&condition_handle_, &gate_arg_, &bubble_id};
    params.kernelParams = args;
    PF_CUDA_CHECK(cudaGraphExecKernelNodeSetParams(exec_, condition_node_, &params));
    PF_CUDA_CHECK(cudaGraphLaunch(exec_, cuda_stream));
    return pfSuccess;
  }

 private:
  pfResult_t enqueue_gemm() {
    const float one = 1.0f, zero = 0.0f;
    PF_CUBLAS_CHECK(cublas_api().cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, desc_.m, desc_.n, desc_.k, &one, desc_.a,
                                desc_.m, desc_.b, desc_.k, &zero, desc_.c, desc_.m));
    return pfSuccess;
  }

  // Times `measure_runs` GEMMs with events; the median is the item cost.
  pfResult_t measure(cudaStream_t stream) {
    PF_CUBLAS_CHECK(cublas_api().cublasSetStream(handle_, stream));
    PF_TRY(enqueue_gemm());  // warm-up: loads the cuBLAS kernel, picks the algorithm
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
      if (error == cudaSuccess && (result = enqueue_gemm()) != pfSuccess) break;
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
  pfResult_t build_conditional_graph(cudaStream_t stream) {
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
    // Capture the GEMM straight into the IF node's body.
    PF_CUBLAS_CHECK(cublas_api().cublasSetStream(handle_, stream));
    PF_CUDA_CHECK(cudaStreamBeginCaptureToGraph(stream, body, nullptr, nullptr, 0,
                                                cudaStreamCaptureModeThreadLocal));
    const pfResult_t captured = enqueue_gemm();
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
  cublasHandle_t handle_ = nullptr;
  double item_us_ = 0.0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  cudaGraphNode_t condition_node_ = nullptr;
  cudaGraphConditionalHandle condition_handle_{};
  cudaKernelNodeParams condition_params_{};
  const volatile uint64_t* gate_arg_ = nullptr;
};

}  // namespace

pfResult_t make_gemm_item(const GemmItemDesc& desc, void* setup_stream, std::unique_ptr<GemmItem>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "make_gemm_item: out is null");
  if (desc.m <= 0 || desc.n <= 0 || desc.k <= 0)
    return fail(pfErrorInvalidArgument, "make_gemm_item: dimensions m={} n={} k={} must be > 0", desc.m, desc.n,
                desc.k);
  if (desc.a == nullptr || desc.b == nullptr || desc.c == nullptr)
    return fail(pfErrorInvalidArgument, "make_gemm_item: null matrix pointer (a={}, b={}, c={})",
                static_cast<const void*>(desc.a), static_cast<const void*>(desc.b), static_cast<void*>(desc.c));
  if (desc.allow_conditional && desc.gate == nullptr)
    return fail(pfErrorInvalidArgument, "make_gemm_item: a conditional item needs the gate word (gate is null)");
  auto item = std::make_unique<CublasGemmItem>(desc);
  PF_TRY(item->init(static_cast<cudaStream_t>(setup_stream)));
  *out = std::move(item);
  return pfSuccess;
}

}  // namespace pipefill::cuda
