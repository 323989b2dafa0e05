// The runtime (not the harness's own ordering) under CUDA_DEVICE_MAX_CONNECTIONS=1, Megatron's
// setting (issue 16 item 3). cuda.h's green-context notes say work of green contexts with
// disjoint SMs may still depend on other work through hardware connections, so the CUDA device
// reports one connection as a single hardware queue in green-context mode too, and the runtime's
// auto launch mode goes inline: slices are enqueued in pfBubbleBegin, before the main stream's
// receive wait. The test re-runs itself in a child process with one connection (it must be set
// before CUDA initialises), drives bubbles through the C API like a training loop, and asserts
// that the fill job's items run - exactly once each - inside bubbles (filled time > 0), and that
// the job does not end FAILED as "every slice late". Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fill_kernels.hpp"
#include "graph_job_kernels.hpp"
#include "pipefill/pipefill.h"

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

bool one_connection() {
  const char* value = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

struct SpinJob {
  SpinItemsParams params;
  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    return launch_spin_items(*slice, stream, static_cast<SpinJob*>(user)->params);
  }
};

// The body, run in the child with one connection.
void run_bubbles_with_one_connection() {
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.backend = pfBackendCuda;
  c.arena_bytes = size_t{64} << 20;
  c.log_level = pfLogInfo;  // the partition mode and launch mode go to the log
  pfRuntime_t rt = nullptr;
  ASSERT_EQ(pfRuntimeCreate(&c, &rt), pfSuccess) << pfGetLastErrorMessage();
  pfConfig_t resolved = PF_CONFIG_INITIALIZER;
  ASSERT_EQ(pfRuntimeGetConfig(rt, &resolved), pfSuccess) << pfGetLastErrorMessage();
  EXPECT_EQ(resolved.launch_mode, pfLaunchInline)
      << "one connection must resolve the auto launch mode to inline in every partition mode";
  void* main = nullptr;
  ASSERT_EQ(pfStreamCreateHighPriority(rt, &main), pfSuccess) << pfGetLastErrorMessage();

  constexpr uint64_t kItems = 400;
  constexpr uint64_t kItemNs = 20'000;
  uint32_t* runs = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&runs), kItems * sizeof(uint32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemset(runs, 0, kItems * sizeof(uint32_t)), cudaSuccess);
  SpinJob spin;
  spin.params.item_ns = kItemNs;
  spin.params.records.item_runs = runs;
  pfJobDesc_t d = PF_JOB_DESC_INITIALIZER;
  d.name = "spin-one-connection";
  d.item_count = kItems;
  d.item_cost_hint_us = kItemNs / 1000.0;
  d.launch = &SpinJob::launch;
  d.user = &spin;
  pfJob_t job = nullptr;
  ASSERT_EQ(pfJobCreate(rt, &d, &job), pfSuccess) << pfGetLastErrorMessage();

  pfJobInfo_t info{};
  int bubbles = 0;
  for (; bubbles < 300; ++bubbles) {
    ASSERT_EQ(pfJobGetStatus(job, &info), pfSuccess);
    if (info.status != pfJobPending && info.status != pfJobRunning) break;
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.expected_duration_us = 300.0;
    ASSERT_EQ(pfBubbleBegin(rt, main, &hint), pfSuccess) << pfGetLastErrorMessage();
    ASSERT_EQ(launch_spin(static_cast<cudaStream_t>(main), 300'000), cudaSuccess);  // the receive wait
    ASSERT_EQ(pfBubbleEnd(rt, main), pfSuccess) << pfGetLastErrorMessage();
    ASSERT_EQ(launch_spin(static_cast<cudaStream_t>(main), 100'000), cudaSuccess);  // compute
    ASSERT_EQ(pfIterationEnd(rt), pfSuccess);
    ASSERT_EQ(pfRuntimeSynchronize(rt), pfSuccess) << pfGetLastErrorMessage();
  }
  ASSERT_EQ(info.status, pfJobCompleted)
      << "after " << bubbles << " bubbles, " << info.items_completed << " of " << kItems
      << " items: " << (pfJobWait(job, 0.0) == pfSuccess ? "" : pfGetLastErrorMessage());
  std::vector<uint32_t> host(kItems);
  ASSERT_EQ(cudaMemcpy(host.data(), runs, kItems * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint64_t i = 0; i < kItems; ++i) EXPECT_EQ(host[i], 1u) << "item " << i;
  pfStats_t s{};
  ASSERT_EQ(pfRuntimeGetStatsV2(rt, &s, sizeof s), pfSuccess);
  EXPECT_GT(s.filled_time_us, 0.0) << "no fill work ran inside a bubble";
  EXPECT_EQ(s.jobs_failed, 0u);
  std::printf("[ info ] one connection, launch mode %d: %llu items in %d bubbles, filled %.1f of %.1f "
              "bubble us, max overrun %.1f us (item %.1f us)\n",
              resolved.launch_mode, static_cast<unsigned long long>(kItems), bubbles, s.filled_time_us,
              s.bubble_time_us, s.max_overrun_us, kItemNs / 1000.0);
  EXPECT_EQ(pfJobDestroy(job), pfSuccess);
  EXPECT_EQ(pfStreamDestroy(rt, main), pfSuccess);
  EXPECT_EQ(pfRuntimeDestroy(rt), pfSuccess) << pfGetLastErrorMessage();
  (void)cudaFree(runs);
}

TEST(OneConnectionRuntime, FillItemsRunInsideBubbles) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  if (one_connection()) {
    run_bubbles_with_one_connection();
    return;
  }
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  const std::string command = std::string("CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 120 '") + self +
                              "' --gtest_filter='OneConnectionRuntime.FillItemsRunInsideBubbles' 2>&1";
  FILE* child = popen(command.c_str(), "r");
  ASSERT_NE(child, nullptr);
  char line[2048];
  while (std::fgets(line, sizeof line, child) != nullptr) std::printf("[ child, 1 connection ] %s", line);
  const int status = pclose(child);
  EXPECT_EQ(status, 0) << "child with CUDA_DEVICE_MAX_CONNECTIONS=1 failed or hung (124 = timeout): "
                       << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

}  // namespace
}  // namespace pipefill::cuda::testing
