// The CUDA device's capture streams (pfGraphCaptureStreamCreate) and their context pushes
// (pfGraphCaptureContextPush/Pop).
//
// In green-context mode each capture stream belongs to a private green context made on the fill
// partition's SMs (the same resource descriptor), with a mutex of its own (stream_context.hpp). A
// capture keeps its context pushed for its whole length - seconds for a training step: warm-up,
// capture, timing replays - and a green context may be current on one thread at a time; captured
// in the fill partition's own context it held the process-wide context mutex that every graph
// launch takes, so an inline pfBubbleBegin waited for the capture (issue 33 item 4). Captured in a
// private context, the item's kernels run there (a kernel node runs in its own context, on that
// context's SMs: the same SMs), the gated graph is built in it (gated_graph.cpp: one context per
// conditional body), and its launches hold that context's mutex only.
//
// Before a private context is used, a self-test checks that a graph built in it runs when launched
// on a stream of the fill partition's context; where it fails (or the context cannot be made),
// captures fall back to the fill partition's context with the process-wide mutex, and say so.
// Private contexts live until the device is destroyed: graphs of jobs captured in them may
// outlive their capture stream.
#include "cuda_device_impl.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "fill_kernels.hpp"

namespace pipefill::cuda {

pfResult_t CudaDevice::create_capture_stream(Stream* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "create_capture_stream: out is null");
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  if (!partition_configured()) {
    FillPartition ignored;
    PF_TRY(configure_partition(-1, &ignored));
  }
  if (green_context_ == nullptr) {
    PF_TRY(create_stream(lowest_priority_, out));
  } else {
    CapturedContext context;
    cudaStream_t stream = nullptr;
    if (private_captures_ && env_off("PIPEFILL_CAPTURE_CONTEXT")) {
      log::info("PIPEFILL_CAPTURE_CONTEXT=0: captures use the fill partition's context");
      private_captures_ = false;
    }
    if (private_captures_ && create_private_capture_context(&context, &stream) != pfSuccess) {
      log::warn("captures use the fill partition's context (a capture blocks graph launches while it "
                "lasts): no private capture context ({})",
                last_error_message());
      clear_last_error();
      private_captures_ = false;
    }
    if (stream == nullptr) {
      CUstream raw = nullptr;
      PF_DRIVER_CHECK(driver_api().green_ctx_stream_create(&raw, green_context_, CU_STREAM_NON_BLOCKING,
                                                           lowest_priority_));
      stream = reinterpret_cast<cudaStream_t>(raw);
    }
    std::lock_guard lock(mutex_);
    if (context.green != nullptr) capture_contexts_.push_back(context);
    main_streams_.insert(stream);  // destroy_stream knows it
    *out = stream;
  }
  std::lock_guard lock(mutex_);
  capture_streams_.insert(static_cast<cudaStream_t>(*out));
  return pfSuccess;
}

// A green context on the fill partition's SMs, registered as private (its own push mutex), with a
// stream; checked by the self-test. On failure nothing is left behind.
pfResult_t CudaDevice::create_private_capture_context(CapturedContext* out, cudaStream_t* stream) {
  const DriverApi& api = driver_api();
  if (green_desc_ == nullptr || api.ctx_from_green_ctx == nullptr)
    return fail(pfErrorNotSupported, "the fill partition's resource descriptor or cuCtxFromGreenCtx is unavailable");
  CapturedContext made;
  PF_DRIVER_CHECK(api.green_ctx_create(&made.green, green_desc_, cu_device_, CU_GREEN_CTX_DEFAULT_STREAM));
  CUstream raw = nullptr;
  CUresult result = api.ctx_from_green_ctx(&made.context, made.green);
  if (result == CUDA_SUCCESS)
    result = api.green_ctx_stream_create(&raw, made.green, CU_STREAM_NON_BLOCKING, lowest_priority_);
  if (result != CUDA_SUCCESS) {
    (void)api.green_ctx_destroy(made.green);
    return driver_failure(result, "cuCtxFromGreenCtx/cuGreenCtxStreamCreate(capture context)", __FILE__, __LINE__);
  }
  register_private_context(made.context);
  const pfResult_t tested = run_capture_context_self_test(reinterpret_cast<cudaStream_t>(raw));
  if (tested != pfSuccess) {
    const std::string why = last_error_message();
    if (cudaStreamDestroy(reinterpret_cast<cudaStream_t>(raw)) != cudaSuccess) (void)cudaGetLastError();
    unregister_private_context(made.context);
    (void)api.green_ctx_destroy(made.green);
    return fail(tested, "self-test of a graph built in a private capture context and launched on a "
                        "stream of the fill partition's context: {}", why);
  }
  *out = made;
  *stream = reinterpret_cast<cudaStream_t>(raw);
  return pfSuccess;
}

// A graph captured on `capture` (a kernel of the fill kernels, loaded into the private context by
// the warm-up) and instantiated there, launched on a fresh stream of the fill partition's context
// and waited for. Setup only.
pfResult_t CudaDevice::run_capture_context_self_test(cudaStream_t capture) {
  CUstream raw = nullptr;
  PF_DRIVER_CHECK(driver_api().green_ctx_stream_create(&raw, green_context_, CU_STREAM_NON_BLOCKING,
                                                       lowest_priority_));
  const auto fill = reinterpret_cast<cudaStream_t>(raw);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  const pfResult_t result = [&]() -> pfResult_t {
    {
      // The private context's own mutex (no other thread knows the context yet).
      ScopedStreamContext in_capture;
      PF_TRY(in_capture.enter(capture));
      PF_TRY(warm_up_fill_kernels(capture));
      PF_CUDA_CHECK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal));
      const pfResult_t launched = launch_spin_and_stamp(capture, 1000, nullptr);
      const cudaError_t ended = cudaStreamEndCapture(capture, &graph);
      PF_TRY(launched);
      PF_CUDA_CHECK(ended);
      PF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      PF_CUDA_CHECK(cudaGraphLaunch(exec, fill));
    }
    PF_CUDA_CHECK(cudaStreamSynchronize(fill));  // no context mutex held across the wait
    return pfSuccess;
  }();
  {
    ScopedStreamContext in_capture;  // destroyed in the context they were made in
    if (in_capture.enter(capture) != pfSuccess) clear_last_error();
    if (exec != nullptr && cudaGraphExecDestroy(exec) != cudaSuccess) (void)cudaGetLastError();
    if (graph != nullptr && cudaGraphDestroy(graph) != cudaSuccess) (void)cudaGetLastError();
  }
  if (cudaStreamDestroy(fill) != cudaSuccess) (void)cudaGetLastError();
  return result;
}

// pfGraphCaptureContextPush: the capture stream's context (a private capture context, or the
// fill partition's green context, or none in grid-cap mode) pushed on the calling thread until the
// matching pop, through ScopedStreamContext: under that context's own mutex.
pfResult_t CudaDevice::push_capture_context(Stream stream) {
  {
    std::lock_guard lock(mutex_);
    if (capture_streams_.count(static_cast<cudaStream_t>(stream)) == 0)
      return fail(pfErrorInvalidArgument,
                  "pfGraphCaptureContextPush: stream {} is not a capture stream of this runtime "
                  "(pfGraphCaptureStreamCreate)",
                  stream);
  }
  auto scope = std::make_unique<ScopedStreamContext>();
  PF_TRY(scope->enter(stream));
  capture_context_pushes().push_back({this, std::move(scope)});
  return pfSuccess;
}

pfResult_t CudaDevice::pop_capture_context() {
  auto& pushes = capture_context_pushes();
  if (pushes.empty() || pushes.back().device != this)
    return fail(pfErrorInvalidState,
                "pfGraphCaptureContextPop: no pfGraphCaptureContextPush of this runtime is open on "
                "the calling thread");
  pushes.pop_back();  // the scope pops the context it pushed (if it pushed one)
  return pfSuccess;
}

std::vector<CudaDevice::CapturePush>& CudaDevice::capture_context_pushes() {
  thread_local std::vector<CapturePush> pushes;
  return pushes;
}

// Shutdown: the private capture contexts, after every stream and graph of the device.
void CudaDevice::destroy_capture_contexts() {
  std::vector<CapturedContext> contexts;
  {
    std::lock_guard lock(mutex_);
    contexts.swap(capture_contexts_);
  }
  for (const CapturedContext& context : contexts) {
    unregister_private_context(context.context);
    const CUresult result = driver_api().green_ctx_destroy(context.green);
    if (result != CUDA_SUCCESS) log::warn("cuGreenCtxDestroy(capture context) failed: {}", driver_result_name(result));
  }
}

}  // namespace pipefill::cuda
