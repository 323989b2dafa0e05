// Graph fill jobs on a GPU, through the C API: a captured graph whose kernel reads the item index
// from the job's index word runs as gated items inside bubbles of a main stream; every item runs
// exactly once with its own index (out[i] = 2i + 1, computed here), and graphs that break the
// contract (a host node, an index word in host memory) are refused naming the field. Skips
// without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.hpp"
#include "graph_job_kernels.hpp"
#include "driver_api.hpp"
#include "pipefill/pipefill.h"
#include "stream_context.hpp"

namespace pipefill::cuda::testing {
namespace {

bool have_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

class GraphJobGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    pfConfig_t c = PF_CONFIG_INITIALIZER;
    c.backend = pfBackendCuda;
    c.arena_bytes = size_t{64} << 20;
    c.log_level = pfLogWarn;
    ASSERT_EQ(pfRuntimeCreate(&c, &rt_), pfSuccess) << pfGetLastErrorMessage();
    ASSERT_EQ(pfStreamCreateHighPriority(rt_, &main_), pfSuccess) << pfGetLastErrorMessage();
    ASSERT_EQ(pfGraphCaptureStreamCreate(rt_, &capture_), pfSuccess) << pfGetLastErrorMessage();
  }
  void TearDown() override {
    if (rt_ == nullptr) return;
    if (capture_ != nullptr) EXPECT_EQ(pfStreamDestroy(rt_, capture_), pfSuccess);
    EXPECT_EQ(pfRuntimeDestroy(rt_), pfSuccess) << pfGetLastErrorMessage();
  }

  // A graph of one item: the indexed kernel, captured on the capture stream with that stream's
  // context current (a green context's, in green-context mode: every kernel of the conditional
  // body the runtime wraps it in must belong to one context, issue 16 item 7).
  cudaGraph_t capture_item(const uint64_t* index_word, float* out, uint32_t* runs, uint64_t spin_ns) {
    auto stream = static_cast<cudaStream_t>(capture_);
    ScopedStreamContext scope;
    EXPECT_EQ(scope.enter(capture_), pfSuccess) << last_error_message();
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_EQ(launch_indexed_item(stream, index_word, out, runs, spin_ns), cudaSuccess);
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    return graph;
  }

  pfRuntime_t rt_ = nullptr;
  void* main_ = nullptr;
  void* capture_ = nullptr;
};

TEST_F(GraphJobGpu, EveryItemRunsOnceWithItsIndexInsideBubbles) {
  constexpr uint64_t kItems = 200;
  constexpr uint64_t kItemNs = 20'000;
  uint64_t* index_word = nullptr;
  float* out = nullptr;
  uint32_t* runs = nullptr;
  ASSERT_EQ(cudaMalloc(&index_word, sizeof(uint64_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, kItems * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&runs, kItems * sizeof(uint32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemset(out, 0, kItems * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(runs, 0, kItems * sizeof(uint32_t)), cudaSuccess);
  cudaGraph_t graph = capture_item(index_word, out, runs, kItemNs);
  ASSERT_NE(graph, nullptr);

  pfGraphJobDesc_t d = PF_GRAPH_JOB_DESC_INITIALIZER;
  d.name = "indexed";
  d.item_count = kItems;
  d.item_cost_us = kItemNs / 1000.0;
  d.graph = graph;
  d.index_word = index_word;
  pfJob_t job = nullptr;
  ASSERT_EQ(pfJobCreateGraph(rt_, &d, &job), pfSuccess) << pfGetLastErrorMessage();
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess) << "the runtime keeps its own clone";

  pfJobInfo_t info{};
  int bubbles = 0;
  for (; bubbles < 400; ++bubbles) {
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
  EXPECT_GT(bubbles, 1);
  std::vector<float> host_out(kItems);
  std::vector<uint32_t> host_runs(kItems);
  ASSERT_EQ(cudaMemcpy(host_out.data(), out, kItems * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host_runs.data(), runs, kItems * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint64_t i = 0; i < kItems; ++i) {
    EXPECT_EQ(host_runs[i], 1u) << "item " << i;
    EXPECT_EQ(host_out[i], 2.0f * i + 1.0f) << "item " << i;
  }
  pfStats_t s{};
  ASSERT_EQ(pfRuntimeGetStats(rt_, &s), pfSuccess);
  EXPECT_EQ(s.items_completed, kItems);
  std::printf("[ info ] graph job: %llu items in %d bubbles, max overrun %.1f us (item %.1f us)\n",
              static_cast<unsigned long long>(kItems), bubbles, s.max_overrun_us, kItemNs / 1000.0);
  EXPECT_EQ(pfJobDestroy(job), pfSuccess);
  (void)cudaFree(index_word);
  (void)cudaFree(out);
  (void)cudaFree(runs);
}

TEST_F(GraphJobGpu, ContractBreakingGraphsAreRefused) {
  uint64_t* index_word = nullptr;
  ASSERT_EQ(cudaMalloc(&index_word, sizeof(uint64_t)), cudaSuccess);
  // A host node.
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaGraphCreate(&graph, 0), cudaSuccess);
  cudaHostNodeParams host{};
  host.fn = [](void*) {};
  cudaGraphNode_t node = nullptr;
  ASSERT_EQ(cudaGraphAddHostNode(&node, graph, nullptr, 0, &host), cudaSuccess);
  pfGraphJobDesc_t d = PF_GRAPH_JOB_DESC_INITIALIZER;
  d.item_count = 4;
  d.item_cost_us = 10.0;
  d.graph = graph;
  d.index_word = index_word;
  pfJob_t job = nullptr;
  EXPECT_EQ(pfJobCreateGraph(rt_, &d, &job), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("is a host node"), std::string::npos) << pfGetLastErrorMessage();
  // An index word in host memory.
  alignas(8) static uint64_t host_word = 0;
  cudaGraph_t empty = nullptr;
  ASSERT_EQ(cudaGraphCreate(&empty, 0), cudaSuccess);
  d.graph = empty;
  d.index_word = &host_word;
  EXPECT_EQ(pfJobCreateGraph(rt_, &d, &job), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("desc->index_word"), std::string::npos) << pfGetLastErrorMessage();
  // No graph at all.
  d.graph = nullptr;
  d.index_word = index_word;
  EXPECT_EQ(pfJobCreateGraph(rt_, &d, &job), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("desc->graph is NULL"), std::string::npos);
  EXPECT_EQ(job, nullptr);
  (void)cudaGraphDestroy(graph);
  (void)cudaGraphDestroy(empty);
  (void)cudaFree(index_word);
}

// A graph whose kernel belongs to another context than the fill partition's is refused by node,
// naming both contexts (issue 16 item 7). Only meaningful in green-context mode, where the fill
// context is not the primary one: the kernel is captured on an ordinary stream of the primary
// context.
TEST_F(GraphJobGpu, KernelOfAnotherContextIsRefusedByNode) {
  CUcontext fill_context = nullptr, primary = nullptr;
  const auto& api = driver_api();
  ASSERT_NE(api.stream_get_ctx, nullptr);
  ASSERT_EQ(api.stream_get_ctx(static_cast<CUstream>(capture_), &fill_context), CUDA_SUCCESS);
  cudaStream_t ordinary = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&ordinary, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(api.stream_get_ctx(reinterpret_cast<CUstream>(ordinary), &primary), CUDA_SUCCESS);
  if (fill_context == primary) {
    (void)cudaStreamDestroy(ordinary);
    GTEST_SKIP() << "grid-cap mode: the fill partition is the primary context";
  }
  uint64_t* index_word = nullptr;
  float* out = nullptr;
  uint32_t* runs = nullptr;
  ASSERT_EQ(cudaMalloc(&index_word, sizeof(uint64_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&runs, sizeof(uint32_t)), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(ordinary, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(launch_indexed_item(ordinary, index_word, out, runs, 1000), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(ordinary, &graph), cudaSuccess);
  pfGraphJobDesc_t d = PF_GRAPH_JOB_DESC_INITIALIZER;
  d.item_count = 4;
  d.item_cost_us = 1.0;
  d.graph = graph;
  d.index_word = index_word;
  pfJob_t job = nullptr;
  EXPECT_EQ(pfJobCreateGraph(rt_, &d, &job), pfErrorInvalidArgument);
  const std::string message = pfGetLastErrorMessage();
  EXPECT_NE(message.find("kernel node 0"), std::string::npos) << message;
  EXPECT_NE(message.find("belongs to context"), std::string::npos) << message;
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(ordinary);
  (void)cudaFree(index_word);
  (void)cudaFree(out);
  (void)cudaFree(runs);
}

}  // namespace
}  // namespace pipefill::cuda::testing
