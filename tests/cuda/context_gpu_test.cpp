// GPU tests of issue 24 (run by scripts/gpu-check.sh's cuda_tests step; each skips without a GPU):
//  - the calling thread's current context is the same after pfRuntimeCreate, bubbles, job
//    creation and pfRuntimeDestroy: no context at all, a green context of the caller's, another
//    device's context (two GPUs);
//  - the default device is the caller's current one;
//  - a graph with a cuBLAS GEMM (kernels our static CUDA runtime never registered) becomes a gated
//    job and runs inside bubbles; captured with the capture context pushed, its kernels belong to
//    the fill context; captured without, the refusal (if any) names each node's context;
//  - a stream destroyed with its bubble open is reported by name at pfBubbleEnd;
//  - pfGraphCaptureContextPush/Pop pair and refuse what they must.
#include <cuda.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "cublas_api.hpp"
#include "driver_api.hpp"
#include "graph_job_kernels.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cuda::testing {
namespace {

int gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

CUcontext current_context() {
  CUcontext context = nullptr;
  EXPECT_EQ(driver_api().ctx_get_current(&context), CUDA_SUCCESS);
  return context;
}

pfRuntime_t make_runtime(int device = PF_UNSET_INT) {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.backend = pfBackendCuda;
  c.device = device;
  c.arena_bytes = size_t{64} << 20;
  c.log_level = pfLogWarn;
  pfRuntime_t rt = nullptr;
  EXPECT_EQ(pfRuntimeCreate(&c, &rt), pfSuccess) << pfGetLastErrorMessage();
  return rt;
}

int runtime_device(pfRuntime_t rt) {
  pfConfig_t used = PF_CONFIG_INITIALIZER;
  EXPECT_EQ(pfRuntimeGetConfig(rt, &used), pfSuccess);
  return used.device;
}

// A few bubbles on `stream`, with a spin kernel as the receive wait when `spin` (the test's own
// launch: the CUDA runtime binds a context to a thread without one, and a launch needs the
// stream's context current, so the context tests run bubbles without it); `expect` is checked
// after every call (the caller's context stays current throughout).
void run_bubbles(pfRuntime_t rt, void* stream, int count, CUcontext expect, bool spin = true) {
  for (int i = 0; i < count; ++i) {
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = 200.0;
    ASSERT_EQ(pfBubbleBegin(rt, stream, &hint), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(current_context(), expect) << "pfBubbleBegin changed the caller's context";
    if (spin) ASSERT_EQ(launch_spin(static_cast<cudaStream_t>(stream), 200'000), cudaSuccess);
    ASSERT_EQ(pfBubbleEnd(rt, stream), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(current_context(), expect) << "pfBubbleEnd changed the caller's context";
    ASSERT_EQ(pfIterationEnd(rt), pfSuccess);
  }
  ASSERT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
  EXPECT_EQ(current_context(), expect);
}

// A thread with no CUDA context (a fresh thread): nothing the runtime does leaves one behind.
TEST(CallerContext, AThreadWithoutAContextIsLeftWithoutOne) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::thread([] {
    ASSERT_EQ(current_context(), nullptr);
    pfRuntime_t rt = make_runtime();
    ASSERT_NE(rt, nullptr);
    EXPECT_EQ(current_context(), nullptr) << "pfRuntimeCreate bound a context to the thread";
    EXPECT_EQ(runtime_device(rt), 0);
    void* main = nullptr;
    ASSERT_EQ(pfStreamCreateHighPriority(rt, &main), pfSuccess);
    EXPECT_EQ(current_context(), nullptr);
    ASSERT_NO_FATAL_FAILURE(run_bubbles(rt, main, 3, nullptr, false));
    EXPECT_EQ(pfStreamDestroy(rt, main), pfSuccess);
    EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(current_context(), nullptr);
  }).join();
}

// A green context the caller made current (what torch's GreenContext.set_context does, through the
// driver here): still current after create, bubbles (on a primary-context stream, and on a stream
// of that green context, admitted or refused by name), job creation and destroy.
TEST(CallerContext, AGreenContextOfTheCallerStaysCurrent) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA device";
  const DriverApi& api = driver_api();
  if (!api.has_green_contexts() || api.ctx_from_green_ctx == nullptr)
    GTEST_SKIP() << "no green contexts: " << api.green_context_absence_reason();
  std::thread([&api] {
    CUdevice device = 0;
    ASSERT_EQ(api.device_get(&device, 0), CUDA_SUCCESS);
    CUdevResource sms{};
    ASSERT_EQ(api.device_get_dev_resource(device, &sms, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
    CUdevResource group{}, rest{};
    unsigned groups = 1;
    ASSERT_EQ(api.dev_sm_resource_split_by_count(&group, &groups, &sms, &rest, 0, sms.sm.smCount / 2), CUDA_SUCCESS);
    CUdevResourceDesc desc = nullptr;
    ASSERT_EQ(api.dev_resource_generate_desc(&desc, &group, 1), CUDA_SUCCESS);
    CUgreenCtx green = nullptr;
    ASSERT_EQ(api.green_ctx_create(&green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
    CUcontext mine = nullptr;
    ASSERT_EQ(api.ctx_from_green_ctx(&mine, green), CUDA_SUCCESS);
    ASSERT_EQ(api.ctx_push_current(mine), CUDA_SUCCESS);

    pfRuntime_t rt = make_runtime();
    ASSERT_NE(rt, nullptr);
    EXPECT_EQ(current_context(), mine) << "pfRuntimeCreate replaced the caller's green context";
    EXPECT_EQ(runtime_device(rt), 0) << "the default device is the green context's";
    void* main = nullptr;
    ASSERT_EQ(pfStreamCreateHighPriority(rt, &main), pfSuccess);
    EXPECT_EQ(current_context(), mine);
    ASSERT_NO_FATAL_FAILURE(run_bubbles(rt, main, 3, mine, false));
    // A main stream of the caller's green context: the runtime's primary-context events on it are
    // self-tested once; admitted, bubbles work; refused, the message names the stream's context.
    CUstream green_stream = nullptr;
    ASSERT_EQ(api.green_ctx_stream_create(&green_stream, green, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    const pfResult_t begun = pfBubbleBegin(rt, green_stream, &hint);
    const std::string why = begun == pfSuccess ? "" : pfGetLastErrorMessage();
    EXPECT_EQ(current_context(), mine);
    if (begun == pfSuccess) {
      EXPECT_EQ(pfBubbleEnd(rt, green_stream), pfSuccess) << pfGetLastErrorMessage();
      std::printf("[ info ] a main stream of the caller's green context is admitted (self-test passed)\n");
    } else {
      EXPECT_EQ(begun, pfErrorNotSupported) << why;
      EXPECT_NE(why.find("belongs to context"), std::string::npos) << why;
      std::printf("[ info ] a main stream of the caller's green context is refused: %s\n", why.c_str());
    }
    EXPECT_EQ(current_context(), mine);
    ASSERT_EQ(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(green_stream)), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(reinterpret_cast<cudaStream_t>(green_stream)), cudaSuccess);
    EXPECT_EQ(pfStreamDestroy(rt, main), pfSuccess);
    EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(current_context(), mine) << "pfRuntimeDestroy replaced the caller's green context";
    CUcontext popped = nullptr;
    EXPECT_EQ(api.ctx_pop_current(&popped), CUDA_SUCCESS);
    EXPECT_EQ(popped, mine);
    EXPECT_EQ(api.green_ctx_destroy(green), CUDA_SUCCESS);
  }).join();
}

// Two GPUs: a thread on device 1 gets a runtime on device 1 by default, and a runtime on device 0
// (config.device) that leaves device 1 current - each rank of a node keeps its own GPU.
TEST(CallerDevice, TwoRuntimesOnTwoDevicesLeaveTheCallersDeviceCurrent) {
  if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs (" << gpu_count() << " visible)";
  std::thread([] {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);  // the test's own thread: the "rank" of GPU 1
    const CUcontext on_one = current_context();
    pfRuntime_t first = make_runtime();
    pfRuntime_t second = make_runtime(0);
    ASSERT_NE(first, nullptr);
    ASSERT_NE(second, nullptr);
    EXPECT_EQ(runtime_device(first), 1) << "the default device is the caller's current one";
    EXPECT_EQ(runtime_device(second), 0);
    int device = -1;
    EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
    EXPECT_EQ(device, 1) << "creating a runtime on device 0 moved the caller to it";
    EXPECT_EQ(current_context(), on_one);
    void* main_one = nullptr;
    void* main_zero = nullptr;
    ASSERT_EQ(pfStreamCreateHighPriority(first, &main_one), pfSuccess);
    ASSERT_EQ(pfStreamCreateHighPriority(second, &main_zero), pfSuccess);
    ASSERT_NO_FATAL_FAILURE(run_bubbles(first, main_one, 3, on_one));
    // Device 0's bubbles while device 1 is current (no spin kernel: a launch on device 0's stream
    // would need device 0 current, which is the test's business, not the runtime's).
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(pfBubbleBegin(second, main_zero, nullptr), pfSuccess) << pfGetLastErrorMessage();
      EXPECT_EQ(current_context(), on_one);
      ASSERT_EQ(pfBubbleEnd(second, main_zero), pfSuccess) << pfGetLastErrorMessage();
      EXPECT_EQ(current_context(), on_one);
    }
    EXPECT_EQ(pfRuntimeSynchronize(second), pfSuccess);
    EXPECT_EQ(pfStreamDestroy(first, main_one), pfSuccess);
    EXPECT_EQ(pfStreamDestroy(second, main_zero), pfSuccess);
    EXPECT_EQ(pfRuntimeDestroy(second), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(pfRuntimeDestroy(first), pfSuccess) << pfGetLastErrorMessage();
    EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
    EXPECT_EQ(device, 1);
    EXPECT_EQ(current_context(), on_one);
  }).join();
}

class ForeignGraphGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_count() == 0) GTEST_SKIP() << "no CUDA device";
    const CublasApi& blas = cublas_api();
    if (!blas.ok) GTEST_SKIP() << blas.error;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // the test's thread, for its own allocations
    rt_ = make_runtime(0);
    ASSERT_NE(rt_, nullptr);
    ASSERT_EQ(pfStreamCreateHighPriority(rt_, &main_), pfSuccess);
    ASSERT_EQ(pfGraphCaptureStreamCreate(rt_, &capture_), pfSuccess);
    ASSERT_EQ(cudaMalloc(&index_word_, sizeof(uint64_t)), cudaSuccess);
    for (float** m : {&a_, &b_, &c_}) ASSERT_EQ(cudaMalloc(m, kN * kN * sizeof(float)), cudaSuccess);
    std::vector<float> ones(kN * kN, 1.0f);
    ASSERT_EQ(cudaMemcpy(a_, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(b_, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(c_, 0, kN * kN * sizeof(float)), cudaSuccess);
  }
  void TearDown() override {
    if (rt_ != nullptr) (void)pfRuntimeSynchronize(rt_);
    for (cublasHandle_t handle : handles_)
      if (handle != nullptr) (void)cublas_api().cublasDestroy(handle);
    for (float* m : {a_, b_, c_})
      if (m != nullptr) (void)cudaFree(m);
    if (index_word_ != nullptr) (void)cudaFree(index_word_);
    if (rt_ == nullptr) return;
    if (capture_ != nullptr) EXPECT_EQ(pfStreamDestroy(rt_, capture_), pfSuccess);
    if (main_ != nullptr) EXPECT_EQ(pfStreamDestroy(rt_, main_), pfSuccess);
    EXPECT_EQ(pfRuntimeDestroy(rt_), pfSuccess) << pfGetLastErrorMessage();
  }

  // One SGEMM C = A * B (every element of A and B is 1, so every element of C is kN), captured on
  // the capture stream; with `push`, inside pfGraphCaptureContextPush/Pop. The handle is made and
  // warmed up (cuBLAS loads its kernels) before the capture, in the same context.
  // Without `push` a failing cuBLAS or capture call is not a test failure but the answer
  // (*why says which call failed; nullptr is returned).
  cudaGraph_t capture_gemm(bool push, std::string* why = nullptr) {
    const CublasApi& blas = cublas_api();
    auto stream = static_cast<cudaStream_t>(capture_);
    if (push) EXPECT_EQ(pfGraphCaptureContextPush(rt_, capture_), pfSuccess) << pfGetLastErrorMessage();
    std::string failed;
    auto check = [&](bool ok, const char* call) {
      if (!ok && failed.empty()) failed = call;
      if (push) EXPECT_TRUE(ok) << call;
      return ok;
    };
    cublasHandle_t handle = nullptr;
    check(blas.cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
    check(blas.cublasSetStream(handle, stream) == CUBLAS_STATUS_SUCCESS, "cublasSetStream");
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&] {
      return blas.cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, kN, kN, kN, &one, a_, kN, b_, kN, &zero, c_, kN);
    };
    check(gemm() == CUBLAS_STATUS_SUCCESS, "cublasSgemm (warm-up)");
    check(cudaStreamSynchronize(stream) == cudaSuccess, "cudaStreamSynchronize");
    cudaGraph_t graph = nullptr;
    if (check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess,
              "cudaStreamBeginCapture")) {
      check(gemm() == CUBLAS_STATUS_SUCCESS, "cublasSgemm (captured)");
      check(cudaStreamEndCapture(stream, &graph) == cudaSuccess, "cudaStreamEndCapture");
    }
    (void)cudaGetLastError();
    check(cudaStreamSynchronize(stream) == cudaSuccess, "cudaStreamSynchronize");
    handles_.push_back(handle);  // destroyed at TearDown: the graph uses the handle's workspace
    if (push) EXPECT_EQ(pfGraphCaptureContextPop(rt_), pfSuccess) << pfGetLastErrorMessage();
    if (why != nullptr) *why = failed;
    if (!failed.empty() && graph != nullptr) {
      (void)cudaGraphDestroy(graph);
      graph = nullptr;
    }
    return graph;
  }

  pfResult_t create_job(cudaGraph_t graph, uint64_t items, pfJob_t* job) {
    pfGraphJobDesc_t d = PF_GRAPH_JOB_DESC_INITIALIZER;
    d.name = "cublas-gemm";
    d.item_count = items;
    d.item_cost_us = 20.0;
    d.graph = graph;
    d.index_word = index_word_;
    return pfJobCreateGraph(rt_, &d, job);
  }

  static constexpr int kN = 256;
  pfRuntime_t rt_ = nullptr;
  void* main_ = nullptr;
  void* capture_ = nullptr;
  uint64_t* index_word_ = nullptr;
  std::vector<cublasHandle_t> handles_;
  float* a_ = nullptr;
  float* b_ = nullptr;
  float* c_ = nullptr;
};

// Issue 24 item 1: the item's nodes are cuBLAS's kernels, which our statically linked CUDA runtime
// never registered (its cudaGraphKernelNodeGetParams returned cudaErrorInvalidDeviceFunction and
// pfJobCreateGraph failed); read through the driver, the graph becomes a gated job.
TEST_F(ForeignGraphGpu, ACublasGemmGraphBecomesAGatedJobAndRunsInsideBubbles) {
  cudaGraph_t graph = capture_gemm(true);
  ASSERT_NE(graph, nullptr);
  constexpr uint64_t kItems = 40;
  pfJob_t job = nullptr;
  ASSERT_EQ(create_job(graph, kItems, &job), pfSuccess) << pfGetLastErrorMessage();
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaMemset(c_, 0, kN * kN * sizeof(float)), cudaSuccess);
  pfJobInfo_t info{};
  int bubbles = 0;
  for (; bubbles < 300; ++bubbles) {
    ASSERT_EQ(pfJobGetStatus(job, &info), pfSuccess);
    if (info.status == pfJobCompleted || info.status == pfJobFailed) break;
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = 300.0;
    ASSERT_EQ(pfBubbleBegin(rt_, main_, &hint), pfSuccess) << pfGetLastErrorMessage();
    ASSERT_EQ(launch_spin(static_cast<cudaStream_t>(main_), 300'000), cudaSuccess);
    ASSERT_EQ(pfBubbleEnd(rt_, main_), pfSuccess) << pfGetLastErrorMessage();
    ASSERT_EQ(pfIterationEnd(rt_), pfSuccess);
    ASSERT_EQ(pfRuntimeSynchronize(rt_), pfSuccess) << pfGetLastErrorMessage();
  }
  ASSERT_EQ(info.status, pfJobCompleted) << "after " << bubbles << " bubbles: " << pfGetLastErrorMessage();
  EXPECT_EQ(info.items_completed, kItems);
  std::vector<float> c(kN * kN);
  ASSERT_EQ(cudaMemcpy(c.data(), c_, c.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < c.size(); i += 997) EXPECT_EQ(c[i], float(kN)) << "element " << i;
  pfStats_t s{};
  ASSERT_EQ(pfRuntimeGetStats(rt_, &s), pfSuccess);
  std::printf("[ info ] cuBLAS GEMM graph job: %llu items in %d bubbles, max overrun %.1f us\n",
              static_cast<unsigned long long>(kItems), bubbles, s.max_overrun_us);
  EXPECT_EQ(pfJobDestroy(job), pfSuccess);
}

// Issue 24 item 6: captured with the primary context current (no push), cuBLAS's kernels belong to
// the context current at the launch. In green-context mode that is not the fill context: refused,
// naming each node's context - or accepted, if the driver places a launch on a green-context
// stream in the stream's context (the [ info ] line says which; either way nothing is left).
TEST_F(ForeignGraphGpu, WithoutTheCaptureContextKernelsAreRefusedByContextOrAccepted) {
  std::string failed;
  cudaGraph_t graph = capture_gemm(false, &failed);
  if (graph == nullptr) {
    std::printf("[ info ] without the capture context, cuBLAS on the capture stream fails at %s: the "
                "capture context is needed to capture at all\n", failed.c_str());
    return;
  }
  pfJob_t job = nullptr;
  const pfResult_t created = create_job(graph, 4, &job);
  const std::string why = created == pfSuccess ? "" : pfGetLastErrorMessage();
  if (created == pfSuccess) {
    std::printf("[ info ] a cuBLAS graph captured on the capture stream without the capture context pushed "
                "is accepted (its kernels are in the fill context, or grid-cap mode)\n");
    EXPECT_EQ(pfJobDestroy(job), pfSuccess);
  } else {
    EXPECT_EQ(created, pfErrorInvalidArgument) << why;
    EXPECT_NE(why.find("Kernel nodes by context:"), std::string::npos) << why;
    EXPECT_NE(why.find("the device's primary context"), std::string::npos) << why;
    std::printf("[ info ] without the capture context: %s\n", why.c_str());
  }
  (void)cudaGraphDestroy(graph);
}

TEST_F(ForeignGraphGpu, CaptureContextPushAndPopPairUpAndRefuseOtherStreams) {
  const CUcontext before = current_context();
  CUcontext stream_context = nullptr;
  ASSERT_EQ(driver_api().stream_get_ctx(static_cast<CUstream>(capture_), &stream_context), CUDA_SUCCESS);
  EXPECT_EQ(pfGraphCaptureContextPop(rt_), pfErrorInvalidState);
  EXPECT_EQ(pfGraphCaptureContextPush(rt_, main_), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("is not a capture stream"), std::string::npos);
  ASSERT_EQ(pfGraphCaptureContextPush(rt_, capture_), pfSuccess) << pfGetLastErrorMessage();
  EXPECT_EQ(current_context(), stream_context);
  ASSERT_EQ(pfGraphCaptureContextPush(rt_, capture_), pfSuccess) << "pairs nest";
  EXPECT_EQ(pfGraphCaptureContextPop(rt_), pfSuccess);
  EXPECT_EQ(current_context(), stream_context);
  EXPECT_EQ(pfGraphCaptureContextPop(rt_), pfSuccess);
  EXPECT_EQ(current_context(), before);
  EXPECT_EQ(pfGraphCaptureContextPop(rt_), pfErrorInvalidState);
}

// Issue 24 item 11: a stream destroyed (cudaStreamDestroy) while its bubble is open: pfBubbleEnd
// returns pfErrorInvalidArgument naming it, the bubble is abandoned and the runtime goes on.
TEST(DestroyedStream, BubbleEndNamesTheStreamAndTheRuntimeGoesOn) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA device";
  pfRuntime_t rt = make_runtime();
  ASSERT_NE(rt, nullptr);
  cudaStream_t doomed = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&doomed, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(pfBubbleBegin(rt, doomed, nullptr), pfSuccess) << pfGetLastErrorMessage();
  ASSERT_EQ(cudaStreamSynchronize(doomed), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(doomed), cudaSuccess);
  cudaStream_t next = nullptr;  // may reuse the handle
  ASSERT_EQ(cudaStreamCreateWithFlags(&next, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(pfBubbleEnd(rt, doomed), pfErrorInvalidArgument);
  const std::string message = pfGetLastErrorMessage();
  char name[32];
  std::snprintf(name, sizeof name, "%p", static_cast<void*>(doomed));
  EXPECT_NE(message.find(std::string("stream ") + name), std::string::npos) << message;
  EXPECT_NE(message.find("abandoned"), std::string::npos) << message;
  std::printf("[ info ] destroyed stream at pfBubbleEnd (handle %s): %s\n",
              next == doomed ? "reused" : "not reused", message.c_str());
  ASSERT_NO_FATAL_FAILURE(run_bubbles(rt, next, 2, current_context()));
  EXPECT_EQ(cudaStreamDestroy(next), cudaSuccess);
  EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess) << pfGetLastErrorMessage();
}

}  // namespace
}  // namespace pipefill::cuda::testing
