// The CUDA device's streams: fill streams (in the fill partition's context), main streams, graph
// fill jobs' launches, and the admission of a caller's main stream of another context at a bubble
// instruction. Capture streams: cuda_device_capture.cpp.
#include "cuda_device_impl.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "fill_kernels.hpp"
#include "gated_graph.hpp"

namespace pipefill::cuda {

pfResult_t CudaDevice::priority_range(int* lowest, int* highest) {
  if (lowest == nullptr || highest == nullptr)
    return fail(pfErrorInvalidArgument, "priority_range: null output pointer");
  *lowest = lowest_priority_;
  *highest = highest_priority_;
  return pfSuccess;
}

pfResult_t CudaDevice::create_fill_stream(Stream* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "create_fill_stream: out is null");
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  if (!partition_configured()) {  // configure_partition not called: default R
    FillPartition ignored;
    PF_TRY(configure_partition(-1, &ignored));
  }
  cudaStream_t stream = nullptr;
  {
    std::lock_guard lock(mutex_);
    std::swap(stream, spare_fill_stream_);  // the green-context stream configure made and tested
  }
  if (stream == nullptr) {
    if (green_context_ != nullptr) {
      CUstream raw = nullptr;
      PF_DRIVER_CHECK(driver_api().green_ctx_stream_create(&raw, green_context_, CU_STREAM_NON_BLOCKING,
                                                           lowest_priority_));
      stream = reinterpret_cast<cudaStream_t>(raw);
    } else {
      PF_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, lowest_priority_));
    }
    // Load the fill kernels into the stream's context now (a green context loads modules on
    // its own), so no lazy load can happen inside a bubble.
    if (const pfResult_t result = warm_up_fill_kernels(stream); result != pfSuccess) {
      (void)cudaStreamDestroy(stream);
      return result;
    }
  }
  if (collector_) (void)collector_->register_fill_stream(stream);
  std::lock_guard lock(mutex_);
  fill_streams_.insert(stream);
  *out = stream;
  return pfSuccess;
}

pfResult_t CudaDevice::create_stream(int priority, Stream* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "create_stream: out is null");
  if (priority > lowest_priority_ || priority < highest_priority_)
    return fail(pfErrorInvalidArgument,
                "stream priority {} is outside the device's range {} (lowest) .. {} (highest)",
                priority, lowest_priority_, highest_priority_);
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  cudaStream_t stream = nullptr;
  PF_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
  std::lock_guard lock(mutex_);
  main_streams_.insert(stream);
  *out = stream;
  return pfSuccess;
}

pfResult_t CudaDevice::destroy_stream(Stream stream) {
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  {
    std::lock_guard lock(mutex_);
    const bool fill = fill_streams_.erase(cuda_stream) > 0;
    const bool main = main_streams_.erase(cuda_stream) > 0;
    capture_streams_.erase(cuda_stream);
    if (!fill && !main)
      return fail(pfErrorInvalidArgument, "destroy_stream: stream {} was not created by this device",
                  stream);
  }
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  PF_CUDA_CHECK(cudaStreamDestroy(cuda_stream));
  return pfSuccess;
}

bool CudaDevice::is_valid_main_stream(Stream stream) const {
  std::lock_guard lock(mutex_);
  return fill_streams_.count(static_cast<cudaStream_t>(stream)) == 0;
}

// cudaStreamIsCapturing: a stream under capture (or, for the legacy NULL stream, any global
// capture on the device: cudaErrorStreamCaptureImplicit) refuses bubble instructions.
bool CudaDevice::is_capturing(Stream stream) const {
  DeviceContextScope scope;
  if (scope.enter(primary_, cu_device_, ContextNeed::Any) != pfSuccess) clear_last_error();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t error = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
  if (error == cudaErrorStreamCaptureImplicit) {
    (void)cudaGetLastError();  // not sticky: clear it so later calls do not report it
    return true;
  }
  if (error != cudaSuccess) {
    // Not a capture: the stream is invalid, and the next stream operation reports why.
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

pfResult_t CudaDevice::synchronize_stream(Stream stream) {
  PF_DEVICE_CONTEXT(ContextNeed::Any);
  PF_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return pfSuccess;
}

pfResult_t CudaDevice::prepare_graph_items(const GraphJobSpec& spec, std::unique_ptr<GraphItems>* out) {
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  std::vector<void*> capture;
  {
    std::lock_guard lock(mutex_);
    for (const CapturedContext& context : capture_contexts_) capture.push_back(context.context);
  }
  return make_gated_graph(spec, primary_, capture, out);
}

// The slice's bubble id and budget go to the graph's words in fill-stream order, then one launch.
pfResult_t CudaDevice::launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice, Stream stream) {
  if (!is_gated_graph(items))
    return fail(pfErrorInternal, "launch_graph_items: the items were not prepared by the CUDA device");
  uint64_t* words = gated_graph_slice_words(items);
  PF_TRY(write_word(stream, &words[0], slice.bubble_id));
  PF_TRY(write_word(stream, &words[1], slice.max_items));
  return launch_gated_graph(items, stream);
}

// A main stream of another context than the device's primary one (a torch green context's
// stream, the NULL stream while such a context is current) gets the runtime's primary-context
// begin/end events and gate writes: CUDA documents event and stream of one context. So the
// first bubble on a stream of a new context runs the event and word-write self-tests for that
// context, once, on a private stream of it (never the caller's stream); a context that fails, or
// belongs to another device, is refused by name from then on (issue 24 item 4).
pfResult_t CudaDevice::admit_main_stream(Stream stream, uint64_t* identity) {
  *identity = 0;
  PF_DEVICE_CONTEXT(ContextNeed::Any);
  const DriverApi& api = driver_api();
  if (api.stream_get_ctx != nullptr) {
    CUcontext context = nullptr;
    PF_DRIVER_CHECK(api.stream_get_ctx(static_cast<CUstream>(stream), &context));
    if (context != primary_ && context != nullptr) PF_TRY(check_main_context(context, stream));
  }
  if (api.stream_get_id != nullptr) {
    unsigned long long id = 0;
    PF_DRIVER_CHECK(api.stream_get_id(static_cast<CUstream>(stream), &id));
    *identity = static_cast<uint64_t>(id) + 1;  // 0 stays "not tracked"
  }
  return pfSuccess;
}

// cuStreamGetId gives every stream a process-unique id: a destroyed stream fails the query (the
// driver no longer knows the handle) or, if the handle was reused, reports another id.
bool CudaDevice::main_stream_unchanged(Stream stream, uint64_t identity) const {
  const DriverApi& api = driver_api();
  if (identity == 0 || api.stream_get_id == nullptr) return true;
  DeviceContextScope scope;
  if (scope.enter(primary_, cu_device_, ContextNeed::Any) != pfSuccess) {
    clear_last_error();
    return true;
  }
  unsigned long long id = 0;
  if (api.stream_get_id(static_cast<CUstream>(stream), &id) != CUDA_SUCCESS) return false;
  return static_cast<uint64_t>(id) + 1 == identity;
}

// admit_main_stream's verdict on a context other than the primary one, cached per context ("":
// admitted; else why not). The first check of a context runs its self-tests (about a millisecond,
// once per context and runtime, before the bubble's first event is recorded).
pfResult_t CudaDevice::check_main_context(CUcontext context, Stream stream) {
  MutexLock lock(main_contexts_mutex_);
  auto it = main_contexts_.find(context);
  if (it == main_contexts_.end()) it = main_contexts_.emplace(context, judge_main_context(context)).first;
  if (it->second.empty()) return pfSuccess;
  return fail(it->second.rfind("device", 0) == 0 ? pfErrorInvalidArgument : pfErrorNotSupported,
              "pfBubbleBegin: stream {} belongs to context {}, not to the primary context {} of the "
              "runtime's device {}: {}",
              stream, static_cast<void*>(context), static_cast<void*>(primary_), ordinal_, it->second);
}

// "" when the runtime's primary-context events and word writes work on streams of `context`.
std::string CudaDevice::judge_main_context(CUcontext context) {
  const DriverApi& api = driver_api();
  CUdevice device = 0;
  CUresult result = CUDA_ERROR_NOT_SUPPORTED;
  if (api.ctx_get_device_of != nullptr) {
    result = api.ctx_get_device_of(&device, context);
  } else {
    DeviceContextScope in_context;
    if (in_context.enter(context, cu_device_, ContextNeed::Primary) != pfSuccess) {
      std::string why = last_error_message();
      clear_last_error();
      return "its device could not be read (" + why + ")";
    }
    result = api.ctx_get_device(&device);
  }
  if (result != CUDA_SUCCESS) return "its device could not be read (cuCtxGetDevice: " + driver_result_name(result) + ")";
  if (device != cu_device_)
    return fmt::format("device handle {} is another device: mark bubbles on streams of the runtime's "
                       "device (config.device)", static_cast<int>(device));
  // A private stream of that context for the self-tests (created with the context current).
  cudaStream_t probe = nullptr;
  {
    DeviceContextScope in_context;
    if (in_context.enter(context, cu_device_, ContextNeed::Primary) != pfSuccess) {
      std::string why = last_error_message();
      clear_last_error();
      return "no stream of it could be made for the self-test (" + why + ")";
    }
    const cudaError_t made = cudaStreamCreateWithFlags(&probe, cudaStreamNonBlocking);
    if (made != cudaSuccess) {
      (void)cudaGetLastError();
      return fmt::format("no stream of it could be made for the self-test ({})", cudaGetErrorName(made));
    }
  }
  std::string verdict;
  {
    DeviceContextScope in_primary;  // the self-tests' own events and words are the runtime's
    if (in_primary.enter(primary_, cu_device_, ContextNeed::Primary) != pfSuccess) {
      verdict = last_error_message();
      clear_last_error();
    } else {
      const MemoryOpsVerdict memory = judge_memory_ops(run_memory_ops_self_test(probe));
      const bool writes = memory.usable && (gate_mode_ != GateWriteMode::StreamWriteValue || memory.stream_write);
      const std::string events = event_self_test_failure(run_event_self_test(probe));
      if (!writes)
        verdict = "the runtime's gate writes fail on its streams (" + memory.detail + ")";
      else if (!events.empty())
        verdict = "the runtime's primary-context events fail on its streams (" + events + ")";
    }
  }
  if (cudaStreamDestroy(probe) != cudaSuccess) (void)cudaGetLastError();
  if (!verdict.empty()) {
    verdict += "; mark bubbles on a stream of the primary context (a torch.cuda.Stream() made with no "
               "green context current)";
    log::warn("main streams of context {} are refused: {}", static_cast<void*>(context), verdict);
  } else {
    log::info("main streams of context {} (not the primary context) passed the event and word-write "
              "self-tests", static_cast<void*>(context));
  }
  return verdict;
}

}  // namespace pipefill::cuda
