// GPU tests of the CUDA device and the ticket protocol (skip without a GPU).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "cupti_collector.hpp"
#include "driver_api.hpp"
#include "event_query.hpp"
#include "fallbacks.hpp"
#include "gpu_harness.hpp"
#include "opaque_gemm.hpp"
#include "partition.hpp"

namespace pipefill::cuda::testing {
namespace {

constexpr uint64_t kMicro = 1000;  // ns

TEST_F(CudaGpu, ReportsPartitionAndPriorities) {
  EXPECT_EQ(partition_.total_sms, device_->sm_count());
  EXPECT_GT(partition_.fill_sms, 0);
  EXPECT_EQ(partition_.fill_sms + partition_.reserved_sms, partition_.total_sms);
  EXPECT_GE(partition_.reserved_sms, 16);  // default R (no NCCL_MAX_CTAS in the test env)
  EXPECT_TRUE(partition_.mode == "green-context" || partition_.mode == "grid-cap") << partition_.mode;
  int lowest = 1, highest = 1;
  PF_ASSERT_OK(device_->priority_range(&lowest, &highest));
  EXPECT_EQ(lowest, 0);  // CUDA: 0 is the lowest priority
  EXPECT_LT(highest, lowest);
  std::printf("[ info ] %s: %d SMs, partition %s fill %d reserved %d, priorities %d..%d, gate write %s\n",
              device_->name().c_str(), device_->sm_count(), partition_.mode.c_str(), partition_.fill_sms,
              partition_.reserved_sms, lowest, highest, gate_write_mode_name(extras().gate_write_mode()));
}

// A driver >= 12.5 has every green-context entry point: grid-cap mode there must come with a
// real explanation (a failing call, a failed self-test, an opt-out), never with "entry points
// missing" - which is how requesting cuGreenCtxStreamCreate at 12040 instead of 12050 looked.
TEST_F(CudaGpu, GreenContextOnNewDriversOrAnExplainedFallback) {
  const int driver = driver_api().driver_version;
  const PartitionOutcome& outcome = extras().partition_outcome();
  std::printf("[ info ] driver %d: %s; entry points missing: core [%s] green-context [%s]\n", driver,
              describe(outcome).c_str(), driver_api().missing_entry_points(EntryPointGroup::Core).c_str(),
              driver_api().missing_entry_points(EntryPointGroup::GreenContext).c_str());
  EXPECT_EQ(partition_.mode == "green-context", outcome.cause == FallbackCause::None) << describe(outcome);
  EXPECT_TRUE(fallback_is_explained(driver, outcome)) << "unexplained grid-cap fallback on driver " << driver
                                                      << ": " << describe(outcome);
  if (driver >= kGreenContextDriverVersion) {
    EXPECT_TRUE(driver_api().has_green_contexts()) << driver_api().missing_entry_points(EntryPointGroup::GreenContext);
    EXPECT_NE(outcome.cause, FallbackCause::EntryPointsMissing);
    EXPECT_NE(outcome.cause, FallbackCause::DriverTooOld);
  }
}

// cudaEventQuery's NotReady must not linger as the thread's last error: the executor thread
// queries slice events, then launches kernels and checks cudaGetLastError.
TEST_F(CudaGpu, PendingEventQueryLeavesNoStaleError) {
  Event pending = nullptr;
  PF_ASSERT_OK(device_->create_event(&pending));
  PF_ASSERT_OK(launch_spin_and_stamp(main_, 20'000 * kMicro, nullptr));  // 20 ms
  PF_ASSERT_OK(device_->record_event(pending, main_));
  bool done = true;
  double t = 0;
  PF_ASSERT_OK(device_->query_event(pending, &done, &t));
  EXPECT_FALSE(done);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << "a pending query left its NotReady behind";
  // The next launch's own check sees no stale error.
  PF_EXPECT_OK(launch_spin_and_stamp(fill_, 0, nullptr));
  PF_ASSERT_OK(device_->synchronize_event(pending));
  PF_ASSERT_OK(device_->query_event(pending, &done, &t));
  EXPECT_TRUE(done);
  PF_EXPECT_OK(device_->destroy_event(pending));
}

// A fill block with the opt-in shared memory (a big GEMM tile) must launch on the fill stream,
// also when that stream lives in a green context (the limit was raised in the primary one).
TEST_F(CudaGpu, OptInSharedMemoryWorksOnTheFillStream) {
  size_t optin = 0;
  PF_ASSERT_OK(max_dynamic_smem_per_block(&optin));
  ASSERT_GT(optin, size_t{48} << 10);
  constexpr uint64_t kTotal = 64;
  DeviceArray<uint32_t> runs(kTotal);
  SpinItemsParams params;
  params.item_ns = 1 * kMicro;
  params.dynamic_smem_bytes = optin - 1024;
  params.records.item_runs = runs.get();
  PF_ASSERT_OK(launch_spin_items(slice(1, kTotal, kTotal), fill_, params));
  sync_all();
  for (uint32_t r : runs.to_host()) ASSERT_EQ(r, 1u);
}

TEST_F(CudaGpu, StreamValidity) {
  EXPECT_FALSE(device_->is_valid_main_stream(fill_));
  EXPECT_TRUE(device_->is_valid_main_stream(main_));
  EXPECT_TRUE(device_->is_valid_main_stream(nullptr));  // legacy default stream
  Stream extra = nullptr;
  EXPECT_EQ(device_->create_stream(highest_priority_ - 1, &extra), pfErrorInvalidArgument);
  EXPECT_EQ(device_->create_stream(1, &extra), pfErrorInvalidArgument);
  int dummy = 0;
  EXPECT_EQ(device_->destroy_stream(&dummy), pfErrorInvalidArgument);
}

TEST_F(CudaGpu, WordWriteAndReadBack) {
  uint64_t* host = nullptr;
  PF_ASSERT_OK(device_->allocate_host_words(1, &host));
  constexpr uint64_t kValue = 0x0123456789abcdefull;  // all 64 bits matter (bubble ids)
  PF_ASSERT_OK(device_->write_word(main_, gate(), kValue));
  PF_ASSERT_OK(device_->copy_word_to_host(main_, gate(), host));
  PF_ASSERT_OK(device_->synchronize_stream(main_));
  EXPECT_EQ(*host, kValue);
  PF_EXPECT_OK(device_->free_host_words(host));
  EXPECT_EQ(device_->free_host_words(host), pfErrorInvalidArgument);
}

// pfBubbleCloseFill's gate write (a one-thread atomicMax kernel): never lowers the gate, raises
// it in stream order, all 64 bits kept.
TEST_F(CudaGpu, WordWriteMaxNeverLowersTheGate) {
  uint64_t* host = nullptr;
  PF_ASSERT_OK(device_->allocate_host_words(2, &host));
  constexpr uint64_t kHigh = 0x0123456789abcdefull;
  PF_ASSERT_OK(device_->write_word(main_, gate(), 9));
  PF_ASSERT_OK(device_->write_word_max(main_, gate(), 5));
  PF_ASSERT_OK(device_->copy_word_to_host(main_, gate(), &host[0]));
  PF_ASSERT_OK(device_->write_word_max(main_, gate(), kHigh));
  PF_ASSERT_OK(device_->copy_word_to_host(main_, gate(), &host[1]));
  PF_ASSERT_OK(device_->synchronize_stream(main_));
  EXPECT_EQ(host[0], 9u);
  EXPECT_EQ(host[1], kHigh);
  PF_EXPECT_OK(device_->free_host_words(host));
}

TEST_F(CudaGpu, EventTimesFollowTheDeviceClock) {
  Event a = nullptr, b = nullptr, never = nullptr;
  PF_ASSERT_OK(device_->create_event(&a));
  PF_ASSERT_OK(device_->create_event(&b));
  PF_ASSERT_OK(device_->create_event(&never));
  const double before = device_->now_us();
  PF_ASSERT_OK(device_->record_event(a, main_));
  PF_ASSERT_OK(launch_spin_and_stamp(main_, 1000 * kMicro, nullptr));
  PF_ASSERT_OK(device_->record_event(b, main_));
  PF_ASSERT_OK(device_->synchronize_event(b));
  const double after = device_->now_us();
  bool done_a = false, done_b = false;
  double ta = 0, tb = 0;
  PF_ASSERT_OK(device_->query_event(a, &done_a, &ta));
  PF_ASSERT_OK(device_->query_event(b, &done_b, &tb));
  ASSERT_TRUE(done_a && done_b);
  EXPECT_GE(tb - ta, 990.0);
  EXPECT_LE(tb - ta, 1100.0);
  // Aligned with the host clock (a few µs of alignment error allowed).
  EXPECT_GE(ta, before - 50.0);
  EXPECT_LE(tb, after + 50.0);
  bool done = true;
  double t = 0;
  EXPECT_EQ(device_->query_event(never, &done, &t), pfErrorInvalidState);
  for (Event e : {a, b, never}) PF_EXPECT_OK(device_->destroy_event(e));
}

TEST_F(CudaGpu, ArenaBounds) {
  size_t free_bytes = 0, total_bytes = 0;
  PF_ASSERT_OK(device_->memory_info(&free_bytes, &total_bytes));
  ASSERT_GT(total_bytes, free_bytes);
  void* base = nullptr;
  EXPECT_EQ(device_->allocate_arena(0, &base), pfErrorInvalidArgument);  // sizing is the runtime's
  EXPECT_EQ(device_->allocate_arena(free_bytes + (size_t{1} << 30), &base), pfErrorOutOfMemory);
  EXPECT_EQ(base, nullptr);
  PF_ASSERT_OK(device_->allocate_arena(size_t{64} << 20, &base));
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % 256, 0u);
  size_t free_after = 0;
  PF_ASSERT_OK(device_->memory_info(&free_after, &total_bytes));
  EXPECT_LE(free_after + (size_t{64} << 20), free_bytes + (size_t{2} << 20));  // the arena is really taken
  PF_EXPECT_OK(device_->free_arena(base));
  EXPECT_EQ(device_->free_arena(base), pfErrorInvalidArgument);
}

// The default arena (arena_bytes unset) must leave a trainer that allocates after the runtime
// exists its memory: min(2 GiB, free memory at creation / 8), not "free minus a margin"
// (~125 GiB of an H200). Expected value computed here from cudaMemGetInfo before creation.
TEST(CudaRuntime, DefaultArenaIsMinOf2GiBAndAnEighthOfFreeMemory) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  const double expected = std::min(double(size_t{2} << 30), double(free_bytes) / 8.0);
  pfConfig_t config = PF_CONFIG_INITIALIZER;
  config.backend = pfBackendCuda;
  ::unsetenv("PIPEFILL_ARENA_BYTES");  // the default, not an override from the environment
  pfRuntime_t runtime = nullptr;
  ASSERT_EQ(pfRuntimeCreate(&config, &runtime), pfSuccess) << pfGetLastErrorMessage();
  pfConfig_t used = PF_CONFIG_INITIALIZER;
  EXPECT_EQ(pfRuntimeGetConfig(runtime, &used), pfSuccess);
  std::printf("[ info ] default arena: %zu bytes (%.2f GiB) with %.2f GiB free before creation\n", used.arena_bytes,
              used.arena_bytes / double(size_t{1} << 30), free_bytes / double(size_t{1} << 30));
  // The runtime measures free memory itself, after its own words and streams: allow 2%.
  EXPECT_LE(double(used.arena_bytes), expected * 1.02);
  EXPECT_GE(double(used.arena_bytes), expected * 0.98);
  EXPECT_EQ(pfRuntimeDestroy(runtime), pfSuccess);
}

// Protocol: the budget stops a slice after exactly max_items claims; each block makes one more
// (failing) ticket claim before it exits.
TEST_F(CudaGpu, BudgetLimitsTheSlice) {
  constexpr uint64_t kTotal = 1000, kBudget = 37;
  DeviceArray<uint32_t> runs(kTotal);
  SpinItemsParams params;
  params.item_ns = 2 * kMicro;
  params.records.item_runs = runs.get();
  int grid = 0;
  // Gate never closes during the slice (bubble id far ahead of anything written).
  PF_ASSERT_OK(device_->write_word(fill_, budget(), 0));
  PF_ASSERT_OK(launch_spin_items(slice(1, kBudget, kTotal), fill_, params, &grid));
  sync_all();
  EXPECT_EQ(read_word(cursor()), kBudget);
  EXPECT_EQ(read_word(budget()), kBudget + static_cast<uint64_t>(grid));
  const auto host = runs.to_host();
  for (uint64_t i = 0; i < kTotal; ++i) ASSERT_EQ(host[i], i < kBudget ? 1u : 0u) << "item " << i;
}

TEST_F(CudaGpu, StopsAtTotalItemsAndResumesFromCursor) {
  constexpr uint64_t kTotal = 25;
  DeviceArray<uint32_t> runs(kTotal);
  SpinItemsParams params;
  params.item_ns = 1 * kMicro;
  params.records.item_runs = runs.get();
  int grid = 0;
  PF_ASSERT_OK(launch_spin_items(slice(1, 10, kTotal), fill_, params, &grid));  // items 0..9
  sync_all();
  EXPECT_EQ(read_word(cursor()), 10u);
  PF_ASSERT_OK(device_->write_word(fill_, budget(), 0));
  PF_ASSERT_OK(launch_spin_items(slice(2, 1000, kTotal), fill_, params, &grid));  // resumes at 10
  sync_all();
  // Every block's last claim pushed the cursor past the end once.
  EXPECT_EQ(read_word(cursor()), kTotal + static_cast<uint64_t>(grid));
  const auto host = runs.to_host();
  for (uint64_t i = 0; i < kTotal; ++i) EXPECT_EQ(host[i], 1u) << "item " << i;
}

TEST_F(CudaGpu, ClosedGateRunsNothing) {
  DeviceArray<uint32_t> runs(100);
  SpinItemsParams params;
  params.records.item_runs = runs.get();
  PF_ASSERT_OK(device_->write_word(fill_, gate(), 7));
  PF_ASSERT_OK(launch_spin_items(slice(7, 100, 100), fill_, params));  // bubble 7 already closed
  sync_all();
  EXPECT_EQ(read_word(cursor()), 0u);
  EXPECT_EQ(read_word(budget()), 0u);
  for (uint32_t r : runs.to_host()) ASSERT_EQ(r, 0u);
}

// Several bubbles of different lengths, gates closing mid-work, some slices budget-capped:
// every item runs exactly once, in cursor order across bubbles.
TEST_F(CudaGpu, ExactlyOnceAcrossBubblesWithEarlyGateCloses) {
  constexpr uint64_t kTotal = 4000;
  DeviceArray<uint32_t> runs(kTotal);
  SpinItemsParams params;
  params.item_ns = 20 * kMicro;
  params.records.item_runs = runs.get();
  const uint64_t lengths_us[] = {60, 250, 40, 500, 120, 90, 300};
  uint64_t bubble = 0;
  for (; bubble < 200; ++bubble) {
    const uint64_t budget_items = bubble % 3 == 2 ? 150 : kTotal;  // some slices budget-capped
    run_bubble(bubble + 1, lengths_us[bubble % 7] * kMicro, slice(bubble + 1, budget_items, kTotal), params);
    if (HasFatalFailure()) return;
    sync_all();
    if (read_word(cursor()) >= kTotal) break;
  }
  ASSERT_LT(bubble, 200u) << "the job did not finish in 200 bubbles";
  EXPECT_GE(bubble, 2u) << "bubbles were too long to exercise early closes";
  const auto host = runs.to_host();
  for (uint64_t i = 0; i < kTotal; ++i) ASSERT_EQ(host[i], 1u) << "item " << i;
}

TEST_F(CudaGpu, FillNeverStartsBeforeTheBeginEvent) {
  constexpr uint64_t kTotal = 256;
  DeviceArray<uint64_t> starts(kTotal);
  DeviceArray<uint64_t> wait_end(1);
  SpinItemsParams params;
  params.item_ns = 5 * kMicro;
  params.records.item_start_ns = starts.get();
  // Main: a 2 ms kernel, then the begin event; fill waits for it.
  PF_ASSERT_OK(launch_spin_and_stamp(main_, 2000 * kMicro, wait_end.get()));
  PF_ASSERT_OK(device_->record_event(begin_, main_));
  PF_ASSERT_OK(device_->stream_wait_event(fill_, begin_));
  PF_ASSERT_OK(launch_spin_items(slice(1, kTotal, kTotal), fill_, params));
  sync_all();
  const uint64_t begin_ns = wait_end.to_host()[0];
  const auto host = starts.to_host();
  ASSERT_GT(begin_ns, 0u);
  EXPECT_GE(*std::min_element(host.begin(), host.end()), begin_ns);
}

// Time from the gate close (end of the bubble's wait kernel) to the last fill block's exit:
// bounded by one item plus the gate's propagation.
TEST_F(CudaGpu, GateCloseToLastFillBlockExit) {
  constexpr uint64_t kItemNs = 20 * kMicro;
  const int blocks = max_blocks();
  DeviceArray<uint64_t> exits(static_cast<size_t>(blocks));
  DeviceArray<uint64_t> bubble_end(1);
  SpinItemsParams params;
  params.item_ns = kItemNs;
  params.records.block_exit_ns = exits.get();
  int grid = 0;
  run_bubble(1, 2000 * kMicro, slice(1, 1ull << 40, 1ull << 40), params, bubble_end.get(), &grid);
  if (HasFatalFailure()) return;
  sync_all();
  const uint64_t end_ns = bubble_end.to_host()[0];
  const auto host = exits.to_host();
  const uint64_t last_exit = *std::max_element(host.begin(), host.begin() + grid);
  const double latency_us = (static_cast<double>(last_exit) - static_cast<double>(end_ns)) / 1000.0;
  std::printf("[ info ] gate close -> last fill block exit: %.1f us (item %.0f us, %d blocks)\n", latency_us,
              kItemNs / 1000.0, grid);
  EXPECT_LE(latency_us, kItemNs / 1000.0 + 50.0);
}

// Meaningful only where a hardware partition exists: in grid-cap mode nothing confines blocks.
TEST_F(CudaGpu, FillBlocksStayWithinTheFillSms) {
  if (!partition_.hardware_confined)
    GTEST_SKIP() << "grid-cap mode: fill blocks are not confined to SMs (" << describe(extras().partition_outcome())
                 << ")";
  constexpr uint64_t kTotal = 20000;
  DeviceArray<uint32_t> sms(kTotal);
  SpinItemsParams params;
  params.item_ns = 10 * kMicro;
  params.records.item_sm = sms.get();
  pfSliceDesc_t s = slice(1, kTotal, kTotal);
  s.max_blocks = max_blocks(4);
  PF_ASSERT_OK(launch_spin_items(s, fill_, params));
  sync_all();
  const auto host = sms.to_host();
  const std::set<uint32_t> distinct(host.begin(), host.end());
  cudaDeviceProp properties{};
  ASSERT_EQ(cudaGetDeviceProperties(&properties, 0), cudaSuccess);
  const int allowed = max_observed_fill_sms(partition_.fill_sms, properties.major);
  std::printf("[ info ] %zu distinct SMs used (fill %d of %d, at most %d allowed on sm_%d%d, %s)\n",
              distinct.size(), partition_.fill_sms, partition_.total_sms, allowed, properties.major,
              properties.minor, partition_.mode.c_str());
  EXPECT_LE(static_cast<int>(distinct.size()), allowed);
  EXPECT_GE(static_cast<int>(distinct.size()), partition_.fill_sms / 2) << "the slice did not spread over the partition";
}

TEST_F(CudaGpu, ActivityCollectionNeedsCalibrationMode) {
  std::vector<ActivityRecord> records;
  if (dynamic_cast<CudaDeviceExtras&>(*device_).activity_collector() != nullptr)
    GTEST_SKIP() << "PIPEFILL_CUPTI=1 is set in the environment";
  EXPECT_EQ(device_->collect_activity(&records), pfErrorNotSupported);
  EXPECT_TRUE(records.empty());
}

TEST_F(CudaGpu, CuptiRecordsAgreeWithEvents) {
  std::unique_ptr<ActivityCollector> collector;
  if (start_cupti_collector([this] { return device_->now_us(); }, &collector) != pfSuccess)
    GTEST_SKIP() << "CUPTI unavailable (another subscriber?): " << last_error_message();
  Event a = nullptr, b = nullptr;
  PF_ASSERT_OK(device_->create_event(&a));
  PF_ASSERT_OK(device_->create_event(&b));
  PF_ASSERT_OK(device_->record_event(a, main_));
  for (int i = 0; i < 10; ++i) PF_ASSERT_OK(launch_spin_and_stamp(main_, 100 * kMicro, nullptr));
  PF_ASSERT_OK(device_->record_event(b, main_));
  PF_ASSERT_OK(device_->synchronize_event(b));
  std::vector<ActivityRecord> records;
  PF_ASSERT_OK(collector->flush(&records));
  bool done = false;
  double ta = 0, tb = 0;
  PF_ASSERT_OK(device_->query_event(a, &done, &ta));
  PF_ASSERT_OK(device_->query_event(b, &done, &tb));
  if (records.empty())
    GTEST_SKIP() << "the CUPTI collector started but delivered no record (CUPTI restricted in this sandbox?)";
  int kernels = 0;
  for (const auto& r : records) {
    if (r.kind != ActivityKind::Kernel || r.name.find("spin_and_stamp") == std::string::npos) continue;
    ++kernels;
    EXPECT_GE(r.end_us - r.start_us, 99.0);
    EXPECT_LE(r.end_us - r.start_us, 150.0);
    EXPECT_GE(r.start_us, ta - 100.0);
    EXPECT_LE(r.end_us, tb + 100.0);
  }
  EXPECT_EQ(kernels, 10);
  collector.reset();
  PF_EXPECT_OK(device_->destroy_event(a));
  PF_EXPECT_OK(device_->destroy_event(b));
}

// Fill kernels are told apart from the main job's by (context id, stream id): the fill stream's
// kernels are Fill, the main stream's are not, also when the fill stream is in a green context.
TEST_F(CudaGpu, CuptiClassifiesFillStreamKernels) {
  std::unique_ptr<ActivityCollector> collector;
  if (start_cupti_collector([this] { return device_->now_us(); }, &collector) != pfSuccess)
    GTEST_SKIP() << "CUPTI unavailable (another subscriber?): " << last_error_message();
  PF_ASSERT_OK(collector->register_fill_stream(fill_));
  SpinItemsParams params;
  params.item_ns = 1 * kMicro;
  PF_ASSERT_OK(launch_spin_items(slice(1, 16, 16), fill_, params));
  PF_ASSERT_OK(launch_spin_and_stamp(main_, 10 * kMicro, nullptr));
  sync_all();
  std::vector<ActivityRecord> records;
  PF_ASSERT_OK(collector->flush(&records));
  if (records.empty()) GTEST_SKIP() << "the CUPTI collector started but delivered no record";
  int fill = 0, main = 0;
  for (const auto& r : records) {
    if (r.name.find("spin_items") != std::string::npos) {
      EXPECT_EQ(r.kind, ActivityKind::Fill) << r.name << " on stream " << r.stream;
      ++fill;
    }
    if (r.name.find("spin_and_stamp") != std::string::npos) {
      EXPECT_EQ(r.kind, ActivityKind::Kernel) << r.name << " on stream " << r.stream;
      ++main;
    }
  }
  EXPECT_EQ(fill, 1);
  EXPECT_EQ(main, 1);
}

TEST_F(CudaGpu, GemmItemIsSkippedOnceTheGateIsClosed) {
  constexpr int n = 64;
  DeviceArray<float> a(n * n), b(n * n), c(n * n);
  ASSERT_TRUE(a.fill(std::vector<float>(n * n, 1.0f)));
  ASSERT_TRUE(b.fill(std::vector<float>(n * n, 2.0f)));
  ASSERT_TRUE(c.fill(std::vector<float>(n * n, -1.0f)));
  DeviceArray<uint8_t> workspace(size_t{4} << 20);
  GemmItemDesc desc;
  desc.m = desc.n = desc.k = n;
  desc.a = a.get();
  desc.b = b.get();
  desc.c = c.get();
  desc.workspace = workspace.get();
  desc.workspace_bytes = size_t{4} << 20;
  desc.gate = gate();
  std::unique_ptr<GemmItem> item;
  PF_ASSERT_OK(make_gemm_item(desc, fill_, &item));
  EXPECT_GT(item->item_us(), 0.0);
  EXPECT_TRUE(item->fits(item->item_us() * 2));
  EXPECT_FALSE(item->fits(item->item_us() / 2));
  if (!item->conditional()) {
    // Conditional nodes exist from CUDA 12.4: on such a driver the graph must build (its build
    // runs with the fill stream's context current throughout, see opaque_gemm.cpp).
    if (driver_api().driver_version >= 12040)
      FAIL() << "conditional GEMM graph did not build on driver " << driver_api().driver_version << " ("
             << partition_.mode << "): see the log for the reason";
    GTEST_SKIP() << "conditional graph nodes need a 12.4 driver";
  }
  ASSERT_TRUE(c.fill(std::vector<float>(n * n, -1.0f)));
  PF_ASSERT_OK(device_->write_word(fill_, gate(), 5));
  PF_ASSERT_OK(item->launch(fill_, 3));  // bubble 3 is closed (gate 5): skipped
  sync_all();
  for (float v : c.to_host()) ASSERT_EQ(v, -1.0f);
  PF_ASSERT_OK(item->launch(fill_, 6));  // bubble 6 open: runs
  sync_all();
  for (float v : c.to_host()) ASSERT_EQ(v, 2.0f * n);
}

// Issue 16 item 2: cublasSetStream resets cuBLAS's workspace to its own pool, which it grows with
// cudaMalloc. A GEMM item on two fill streams (each with its own handle, bound once, the caller's
// workspace set after the stream) must allocate no device memory in its launches, run its items
// in launch order across the streams, and refuse a stream it was not prepared for.
TEST_F(CudaGpu, GemmItemOnTwoStreamsUsesOnlyTheGivenWorkspace) {
  constexpr int n = 256;
  DeviceArray<float> a(n * n), b(n * n), c(n * n);
  ASSERT_TRUE(a.fill(std::vector<float>(n * n, 1.0f)));
  ASSERT_TRUE(b.fill(std::vector<float>(n * n, 3.0f)));
  DeviceArray<uint8_t> workspace(size_t{32} << 20);
  GemmItemDesc desc;
  desc.m = desc.n = desc.k = n;
  desc.a = a.get();
  desc.b = b.get();
  desc.c = c.get();
  desc.workspace = workspace.get();
  desc.workspace_bytes = size_t{32} << 20;
  desc.gate = gate();
  desc.allow_conditional = false;  // direct cuBLAS calls: the path the workspace reset hit
  Stream second = nullptr;
  PF_ASSERT_OK(device_->create_fill_stream(&second));
  std::unique_ptr<GemmItem> item;
  PF_ASSERT_OK(make_gemm_item(desc, fill_, &item));
  EXPECT_EQ(item->launch(second, 1), pfErrorInvalidState) << "an unprepared stream was accepted";
  EXPECT_NE(last_error_message().find("not prepared"), std::string::npos) << last_error_message();
  PF_ASSERT_OK(item->prepare_stream(second));
  sync_all();
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  for (int i = 0; i < 8; ++i) PF_ASSERT_OK(item->launch(i % 2 == 0 ? fill_ : second, 1));
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(second)), cudaSuccess);
  sync_all();
  size_t free_after = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(free_after, free_before) << "cuBLAS allocated device memory during the launches";
  for (float v : c.to_host()) ASSERT_EQ(v, 3.0f * n);
  item.reset();
  PF_EXPECT_OK(device_->destroy_stream(second));
}

// Megatron sets CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue per context): rerun the
// bubble tests in a child process with it set (it must be set before CUDA initialises).
TEST_F(CudaGpu, BubblesWorkWithOneDeviceConnection) {
  const char* current = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  if (current && std::string(current) == "1") GTEST_SKIP() << "already running with one connection";
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  char log_path[] = "/tmp/pipefill-one-connection-XXXXXX";
  const int fd = mkstemp(log_path);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string command =
      std::string("CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 120 '") + self +
      "' --gtest_filter='CudaGpu.ExactlyOnce*:CudaGpu.GateClose*:CudaGpu.FillNeverStarts*:CudaGpu.GemmItem*:"
      "CudaGpu.GreenContext*' > '" + log_path + "' 2>&1";
  const int status = std::system(command.c_str());
  // The child's verdicts and measurements, so the run log shows what one connection changes.
  FILE* log = std::fopen(log_path, "r");
  if (log != nullptr) {
    char line[1024];
    while (std::fgets(line, sizeof line, log))
      if (std::strstr(line, "[ info ]") || std::strstr(line, "[  FAILED  ]") || std::strstr(line, "[       OK ]"))
        std::printf("[ child, 1 connection ] %s", line);
    std::fclose(log);
  }
  std::remove(log_path);
  EXPECT_EQ(status, 0) << "child with CUDA_DEVICE_MAX_CONNECTIONS=1 failed or hung (124 = timeout): "
                       << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

}  // namespace
}  // namespace pipefill::cuda::testing
