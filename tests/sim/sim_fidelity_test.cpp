// Fidelity tests of the simulated device: block-level dispatch (a kernel's blocks start as SMs
// free up, in waves, main work ahead of fill work) and the interference model (memory-bandwidth
// sharing between main kernels and fill blocks, fill blocks slowing communication transfers).
// Every expected time is computed here, independently of the engine: closed forms from the
// model's formulas in docs/simulated-device.md, or a reference list scheduler.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "pipefill/pipefill.h"
#include "sim_test_support.hpp"

namespace pipefill::sim {
namespace {

using testing::ItemLog;
using testing::make_event;
using testing::make_stream;
using testing::records_of;
using testing::records_of_stream;
using testing::TicketWords;

std::unique_ptr<World> make_world_with(int devices, const pfSimDeviceDesc_t& desc) {
  std::unique_ptr<World> world;
  EXPECT_EQ(World::create(devices, &desc, 1, &world), pfSuccess);
  return world;
}

pfSimDeviceDesc_t desc_with(int sm_count, double beta, double beta_f, double gamma,
                            double fill_intensity = 1.0) {
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;
  desc.sm_count = sm_count;
  desc.interference = beta;
  desc.fill_slowdown = beta_f;
  desc.comm_slowdown = gamma;
  desc.fill_mem_intensity = fill_intensity;
  return desc;
}

// A reference list scheduler: `blocks` blocks, ready at `ready`, each taking the SM that frees
// first (`sm_free` holds each SM's free time); a block starting at t lasts duration(t). Blocks
// that start together last equally long, so this is the greedy wave dispatch of the model.
struct Span {
  double first_start;
  double last_end;
  double last_start = 0.0;  // when the last block started: the kernel holds every SM it asked for
};
Span list_schedule(std::vector<double> sm_free, int blocks, double ready,
                   const std::function<double(double)>& duration) {
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at(sm_free.begin(),
                                                                          sm_free.end());
  Span span{1e300, 0.0};
  for (int b = 0; b < blocks; ++b) {
    const double start = std::max(ready, free_at.top());
    free_at.pop();
    const double end = start + duration(start);
    free_at.push(end);
    span.first_start = std::min(span.first_start, start);
    span.last_end = std::max(span.last_end, end);
    span.last_start = std::max(span.last_start, start);
  }
  return span;
}

std::vector<ActivityRecord> records_of_kind(const std::vector<ActivityRecord>& log,
                                           ActivityKind kind) {
  std::vector<ActivityRecord> out;
  for (const ActivityRecord& record : log) {
    if (record.kind == kind) out.push_back(record);
  }
  return out;
}

// ---- Block-level dispatch ---------------------------------------------------------------------

TEST(SimDispatch, KernelWithMoreBlocksThanSmsRunsInWaves) {
  auto world = make_world_with(1, desc_with(10, 0, 0, 0));
  void* stream = make_stream(*world, 0, -1);
  ASSERT_EQ(world->launch_kernel_blocks(stream, 25, 10.0), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  const auto kernels = records_of(*world, 0, ActivityKind::Kernel);
  ASSERT_EQ(kernels.size(), 1u);
  // ceil(25 / 10) = 3 waves of 10 µs.
  EXPECT_DOUBLE_EQ(kernels[0].start_us, 0.0);
  EXPECT_DOUBLE_EQ(kernels[0].end_us, std::ceil(25.0 / 10.0) * 10.0);
  EXPECT_EQ(kernels[0].grid_blocks, 25);
}

TEST(SimDispatch, KernelStartsPartiallyAndFillsSmsAsFillBlocksExit) {
  // 10 SMs, 4 reserved: 6 fill blocks in their first 33 µs item; the gate closes at 5, when a
  // kernel of 30 blocks of 10 µs becomes ready. Its blocks take the 4 free SMs at once and the
  // other 6 when the fill items end at 33 (the old model waited for all SMs: start 33).
  auto world = make_world_with(1, desc_with(10, 0, 0, 0));
  FillPartition partition;
  ASSERT_EQ(world->configure_partition(0, 4, &partition), pfSuccess);
  void* fill = make_stream(*world, 0, 0, true);
  void* main = make_stream(*world, 0, -1);
  TicketWords words;
  pfSliceDesc_t slice = words.slice(1, 1000, 1000, 10);
  ASSERT_EQ(world->launch_ticket(fill, &slice, 10, 33.0, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(world->delay(main, 5.0), pfSuccess);
  ASSERT_EQ(world->write_word(main, &words.gate, 1), pfSuccess);
  ASSERT_EQ(world->launch_kernel_blocks(main, 30, 10.0), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);

  std::vector<double> sm_free(4, 5.0);
  sm_free.insert(sm_free.end(), 6, 33.0);
  const Span expected = list_schedule(sm_free, 30, 5.0, [](double) { return 10.0; });
  const auto kernels = records_of(*world, 0, ActivityKind::Kernel);
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_DOUBLE_EQ(kernels[0].start_us, 5.0);
  EXPECT_DOUBLE_EQ(kernels[0].end_us, expected.last_end);
  // The log also says when the kernel held every SM it asked for (its last block's start).
  EXPECT_DOUBLE_EQ(kernels[0].all_blocks_started_us, expected.last_start);
  // Hand check of the reference: groups at 5, 15, 25 (4 blocks), 33 (6), 35 (4), 43 (6), 45 (2).
  EXPECT_DOUBLE_EQ(expected.last_end, 55.0);
  EXPECT_DOUBLE_EQ(expected.last_start, 45.0);
  EXPECT_EQ(words.cursor, 6u);  // the fill claimed one item per block, then saw the gate
}

TEST(SimDispatch, MainKernelAtTheSamePriorityGoesAheadOfAnEarlierFillLaunch) {
  auto world = make_world_with(1, desc_with(10, 0, 0, 0));
  void* busy = make_stream(*world, 0, 0);
  void* fill = make_stream(*world, 0, 0, true);
  void* main = make_stream(*world, 0, 0);  // CUDA's default priority: the lowest, like fill
  ASSERT_EQ(world->launch_kernel_blocks(busy, 10, 20.0), pfSuccess);  // every SM until 20
  TicketWords words;
  pfSliceDesc_t slice = words.slice(1, 100, 100, 10);
  ItemLog log;
  ASSERT_EQ(world->launch_ticket(fill, &slice, 10, 5.0, &ItemLog::on_item, &log), pfSuccess);
  ASSERT_EQ(world->launch_kernel_blocks(main, 10, 10.0), pfSuccess);  // enqueued after the fill
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, main).at(0).start_us, 20.0);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, main).at(0).end_us, 30.0);
  ASSERT_FALSE(log.items.empty());
  double first_item_end = 1e300;
  for (const auto& [end, item] : log.items) first_item_end = std::min(first_item_end, end);
  EXPECT_DOUBLE_EQ(first_item_end, 30.0 + 5.0);  // fill starts only when main's blocks end
}

TEST(SimDispatch, HigherPriorityFillStreamGoesAheadOfALowerPriorityMainKernel) {
  // Priority is what the hardware honours: an ungated fill launch on a high-priority stream
  // (the naive baseline) takes freed SMs before a main kernel on a low-priority stream.
  auto world = make_world_with(1, desc_with(10, 0, 0, 0));
  void* busy = make_stream(*world, 0, -5);
  void* naive = make_stream(*world, 0, -5);
  void* main = make_stream(*world, 0, 0);
  ASSERT_EQ(world->launch_kernel_blocks(busy, 10, 20.0), pfSuccess);
  ASSERT_EQ(world->launch_kernel_blocks(main, 10, 10.0), pfSuccess);
  ASSERT_EQ(world->launch_opaque(naive, 0, 10, 10, 7.0, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, main).at(0).start_us, 27.0);
}

TEST(SimDispatch, CommWaitStartsOnlyWithAllItsSmsAndBlocksWorkBehindIt) {
  auto world = make_world_with(1, desc_with(10, 0, 0, 0));
  void* busy = make_stream(*world, 0, -5);
  void* comm = make_stream(*world, 0, -5);
  void* low = make_stream(*world, 0, 0);
  void* event = make_event(*world);
  ASSERT_EQ(world->launch_kernel_blocks(busy, 9, 50.0), pfSuccess);  // 1 SM left free
  ASSERT_EQ(world->record_event(event, busy), pfSuccess);             // record at 0
  ASSERT_EQ(world->wait_event(comm, event, 4.0, 2), pfSuccess);       // needs 2 SMs at once
  ASSERT_EQ(world->launch_kernel_blocks(low, 1, 3.0), pfSuccess);     // behind the wait
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  const auto comms = records_of(*world, 0, ActivityKind::Comm);
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_DOUBLE_EQ(comms[0].start_us, 50.0);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, low).at(0).start_us, 50.0);
}

// ---- Interference -----------------------------------------------------------------------------

TEST(SimInterference, MainKernelIsSlowedByTheIntensityWeightedFillLoad) {
  const double beta = 0.6;
  const int sms = 10;
  auto world = make_world_with(1, desc_with(sms, beta, 0, 0));
  FillPartition partition;
  ASSERT_EQ(world->configure_partition(0, 5, &partition), pfSuccess);
  void* heavy = make_stream(*world, 0, 0, true);
  void* light = make_stream(*world, 0, 0, true);
  void* main = make_stream(*world, 0, -1);
  TicketWords heavy_words;
  TicketWords light_words;
  pfSliceDesc_t heavy_slice = heavy_words.slice(1, 3, 3, 3);
  pfSliceDesc_t light_slice = light_words.slice(1, 2, 2, 2);
  pfSimFillDesc_t heavy_desc = PF_SIM_FILL_DESC_INITIALIZER;
  heavy_desc.mem_intensity = 1.0;  // decode-like
  pfSimFillDesc_t light_desc = PF_SIM_FILL_DESC_INITIALIZER;
  light_desc.mem_intensity = 0.25;
  ASSERT_EQ(world->launch_ticket(heavy, &heavy_slice, 3, 1000.0, &heavy_desc, nullptr, nullptr),
            pfSuccess);
  ASSERT_EQ(world->launch_ticket(light, &light_slice, 2, 1000.0, &light_desc, nullptr, nullptr),
            pfSuccess);
  ASSERT_EQ(world->delay(main, 1.0), pfSuccess);
  ASSERT_EQ(world->launch_kernel_blocks(main, 5, 100.0), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  const double fill_load = (3 * 1.0 + 2 * 0.25) / sms;
  const auto kernels = records_of(*world, 0, ActivityKind::Kernel);
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_DOUBLE_EQ(kernels[0].start_us, 1.0);
  EXPECT_DOUBLE_EQ(kernels[0].end_us, 1.0 + 100.0 * (1.0 + beta * fill_load));
}

TEST(SimInterference, WavesProgressAtTheFillLoadOfEachMoment) {
  // The dispatch scenario above with beta on: waves progress at 1 / f while the 6 fill blocks
  // are resident (until 33), at full speed after; a wave running at 33 speeds up there.
  const double beta = 0.6;
  const double intensity = 0.5;
  auto world = make_world_with(1, desc_with(10, beta, 0, 0, intensity));
  FillPartition partition;
  ASSERT_EQ(world->configure_partition(0, 4, &partition), pfSuccess);
  void* fill = make_stream(*world, 0, 0, true);
  void* main = make_stream(*world, 0, -1);
  TicketWords words;
  pfSliceDesc_t slice = words.slice(1, 1000, 1000, 10);
  ASSERT_EQ(world->launch_ticket(fill, &slice, 10, 33.0, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(world->delay(main, 5.0), pfSuccess);
  ASSERT_EQ(world->write_word(main, &words.gate, 1), pfSuccess);
  ASSERT_EQ(world->launch_kernel_blocks(main, 30, 10.0), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);

  std::vector<double> sm_free(4, 5.0);
  sm_free.insert(sm_free.end(), 6, 33.0);
  const double f = 1.0 + beta * 6 * intensity / 10.0;
  const Span expected = list_schedule(sm_free, 30, 5.0, [&](double start) {
    if (start >= 33.0) return 10.0;
    if (start + 10.0 * f <= 33.0) return 10.0 * f;
    return (33.0 - start) + (10.0 - (33.0 - start) / f);  // slowed until 33, then full speed
  });
  const auto kernels = records_of(*world, 0, ActivityKind::Kernel);
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_NEAR(kernels[0].end_us, expected.last_end, 1e-9);
  EXPECT_GT(expected.last_end, 55.0);  // slower than without interference
}

TEST(SimInterference, AGroupSlowsWhenFillArrivesAndSpeedsUpWhenItLeaves) {
  const double beta = 0.6;
  const double f = 1.0 + beta * 5 * 1.0 / 10;  // 5 fill blocks of intensity 1 on 10 SMs
  {
    // Fill arrives at 40 under a running group: 40 µs at full speed, the other 60 at 1 / f.
    auto world = make_world_with(1, desc_with(10, beta, 0, 0));
    void* main = make_stream(*world, 0, -1);
    void* fill = make_stream(*world, 0, 0, true);
    ASSERT_EQ(world->launch_kernel_blocks(main, 5, 100.0), pfSuccess);
    ASSERT_EQ(world->delay(fill, 40.0), pfSuccess);
    ASSERT_EQ(world->launch_opaque(fill, 0, 5, 5, 1000.0, nullptr, nullptr), pfSuccess);
    ASSERT_EQ(world->run_until_idle(), pfSuccess);
    EXPECT_NEAR(records_of(*world, 0, ActivityKind::Kernel).at(0).end_us, 40.0 + 60.0 * f, 1e-9);
  }
  {
    // Fill (one 50 µs item per block) leaves at 50: the group started at 1 beside it banks
    // 49 / f µs of work, then runs the rest at full speed.
    auto world = make_world_with(1, desc_with(10, beta, 0, 0));
    void* main = make_stream(*world, 0, -1);
    void* fill = make_stream(*world, 0, 0, true);
    ASSERT_EQ(world->launch_opaque(fill, 0, 5, 5, 50.0, nullptr, nullptr), pfSuccess);
    ASSERT_EQ(world->delay(main, 1.0), pfSuccess);
    ASSERT_EQ(world->launch_kernel_blocks(main, 5, 100.0), pfSuccess);
    ASSERT_EQ(world->run_until_idle(), pfSuccess);
    EXPECT_NEAR(records_of(*world, 0, ActivityKind::Kernel).at(0).end_us,
                50.0 + (100.0 - 49.0 / f), 1e-9);
    EXPECT_NEAR(world->now(), 50.0 + (100.0 - 49.0 / f), 1e-9);  // no stale event moved it
  }
}

TEST(SimInterference, FillItemsAreSlowedByResidentMainBlocks) {
  const double beta_f = 0.6;
  const int sms = 10;
  auto world = make_world_with(1, desc_with(sms, 0, beta_f, 0));
  void* main = make_stream(*world, 0, -1);
  void* fill = make_stream(*world, 0, 0, true);
  ASSERT_EQ(world->launch_kernel_blocks(main, 4, 100.0), pfSuccess);  // 4 SMs, [0, 100)
  pfSimFillDesc_t job = PF_SIM_FILL_DESC_INITIALIZER;
  job.mem_sensitivity = 0.5;
  ItemLog log;
  // 6 blocks x 10 items of 10 µs: each block runs its items back to back.
  ASSERT_EQ(world->launch_opaque(fill, 0, 60, 6, 10.0, &job, &ItemLog::on_item, &log), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  ASSERT_EQ(log.items.size(), 60u);
  const double slowed = 10.0 * (1.0 + beta_f * (4 * 1.0 / sms) * 0.5);  // main intensity 1
  // Items starting before 100 are slowed: ceil(100 / slowed) of them per block, then 10 µs.
  const int slowed_items = static_cast<int>(std::ceil(100.0 / slowed));
  const double block_end = slowed_items * slowed + (10 - slowed_items) * 10.0;
  double first = 1e300;
  double last = 0.0;
  for (const auto& [end, item] : log.items) {
    first = std::min(first, end);
    last = std::max(last, end);
  }
  EXPECT_DOUBLE_EQ(first, slowed);
  EXPECT_NEAR(last, block_end, 1e-9);
}

TEST(SimInterference, FillBlocksSlowOnlyTheTransferOfACommWait) {
  const double gamma = 0.5;
  const double intensity = 0.5;
  const int sms = 10;
  auto world = make_world_with(1, desc_with(sms, 0, 0, gamma, intensity));
  FillPartition partition;
  ASSERT_EQ(world->configure_partition(0, 2, &partition), pfSuccess);
  void* peer = make_stream(*world, 0, -1);
  void* comm = make_stream(*world, 0, -1);
  void* plain = make_stream(*world, 0, -1);
  void* fill = make_stream(*world, 0, 0, true);
  void* event = make_event(*world);
  ASSERT_EQ(world->launch_opaque(fill, 0, 8, 8, 1000.0, nullptr, nullptr), pfSuccess);  // 8 SMs
  ASSERT_EQ(world->delay(peer, 50.0), pfSuccess);
  ASSERT_EQ(world->record_event(event, peer), pfSuccess);  // record at 50
  // The comm kernel spins from 0 (not slowed), then 5 µs fixed latency, then a 20 µs transfer.
  ASSERT_EQ(world->wait_event_transfer(comm, event, 5.0, 20.0, 2), pfSuccess);
  ASSERT_EQ(world->launch_kernel_blocks(comm, 1, 1.0), pfSuccess);
  // A plain dependency (no SMs) is a delay, never slowed.
  void* plain_done = make_event(*world);
  ASSERT_EQ(world->wait_event(plain, event, 25.0, 0), pfSuccess);
  ASSERT_EQ(world->record_event(plain_done, plain), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  const double fill_load = 8 * intensity / sms;
  const auto comms = records_of(*world, 0, ActivityKind::Comm);
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_DOUBLE_EQ(comms[0].start_us, 0.0);
  EXPECT_DOUBLE_EQ(comms[0].end_us, 50.0 + 5.0 + 20.0 * (1.0 + gamma * fill_load));
  bool recorded = false;
  bool done = false;
  double plain_end = 0.0;
  ASSERT_EQ(world->event_state(plain_done, &recorded, &done, &plain_end), pfSuccess);
  EXPECT_DOUBLE_EQ(plain_end, 50.0 + 25.0);
}

TEST(SimInterference, WaitEventWithSmsTreatsItsLatencyAsTheTransfer) {
  const double gamma = 0.5;
  auto world = make_world_with(1, desc_with(10, 0, 0, gamma, 1.0));
  FillPartition partition;
  ASSERT_EQ(world->configure_partition(0, 2, &partition), pfSuccess);
  void* peer = make_stream(*world, 0, -1);
  void* comm = make_stream(*world, 0, -1);
  void* fill = make_stream(*world, 0, 0, true);
  void* event = make_event(*world);
  ASSERT_EQ(world->launch_opaque(fill, 0, 8, 8, 1000.0, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(world->delay(peer, 50.0), pfSuccess);
  ASSERT_EQ(world->record_event(event, peer), pfSuccess);
  ASSERT_EQ(world->wait_event(comm, event, 25.0, 2), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_DOUBLE_EQ(records_of(*world, 0, ActivityKind::Comm).at(0).end_us,
                   50.0 + 25.0 * (1.0 + gamma * 8 * 1.0 / 10));
}

TEST(SimInterference, DefaultDescriptionHasTheCalibratedNonZeroCoefficients) {
  const pfSimDeviceDesc_t defaults = PF_SIM_DEVICE_DESC_INITIALIZER;
  EXPECT_DOUBLE_EQ(defaults.interference, 0.6);
  EXPECT_DOUBLE_EQ(defaults.fill_slowdown, 0.6);
  EXPECT_DOUBLE_EQ(defaults.comm_slowdown, 0.5);
  EXPECT_DOUBLE_EQ(defaults.fill_mem_intensity, 0.5);
  EXPECT_DOUBLE_EQ(defaults.main_mem_intensity, 1.0);
  EXPECT_EQ(defaults.size, sizeof(pfSimDeviceDesc_t));

  // And a world created without a description uses them: 5 fill blocks of the default
  // intensity on 10 SMs slow a main kernel by 0.6 x 5 x 0.5 / 10.
  pfSimWorld_t handle = nullptr;
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.sm_count = 10;
  ASSERT_EQ(pfSimWorldCreate(1, &desc, 1, &handle), pfSuccess);
  void* fill = nullptr;
  void* main = nullptr;
  ASSERT_EQ(pfSimStreamCreate(handle, 0, 0, &fill), pfSuccess);
  ASSERT_EQ(pfSimStreamCreate(handle, 0, -1, &main), pfSuccess);
  ASSERT_EQ(pfSimLaunchOpaque(fill, 0, 5, 5, 1000.0, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(pfSimStreamDelay(main, 1.0), pfSuccess);
  pfSimEvent_t done = nullptr;
  ASSERT_EQ(pfSimEventCreate(handle, &done), pfSuccess);
  ASSERT_EQ(pfSimLaunchKernel(main, 100.0, 5), pfSuccess);
  ASSERT_EQ(pfSimEventRecord(done, main), pfSuccess);
  ASSERT_EQ(pfSimRunUntilIdle(handle), pfSuccess);
  double end = 0.0;
  ASSERT_EQ(pfSimEventTime(done, &end), pfSuccess);
  EXPECT_DOUBLE_EQ(end, 1.0 + 100.0 * (1.0 + 0.6 * 5 * 0.5 / 10));
  EXPECT_EQ(pfSimWorldDestroy(handle), pfSuccess);
}

// ---- Zero interference reproduces the old model -----------------------------------------------

// A small two-stage program: kernels, comm waits holding SMs, a gated fill launch whose gate
// closes mid-item, opaque fill. Returns device 1's log (device 0 runs only main kernels).
std::vector<ActivityRecord> run_program(const pfSimDeviceDesc_t& desc) {
  std::unique_ptr<World> world;
  EXPECT_EQ(World::create(2, &desc, 5, &world), pfSuccess);
  void* s0 = make_stream(*world, 0, -1);
  void* s1 = make_stream(*world, 1, -1);
  void* f1 = make_stream(*world, 1, 0, true);
  void* event = make_event(*world);
  TicketWords words;
  pfSliceDesc_t slice = words.slice(1, 1000, 1000, 16);
  EXPECT_EQ(world->launch_ticket(f1, &slice, 16, 7.0, nullptr, nullptr), pfSuccess);
  EXPECT_EQ(world->launch_opaque(f1, 0, 10, 4, 3.0, nullptr, nullptr), pfSuccess);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(world->launch_kernel(s0, 40.0, 16), pfSuccess);
    EXPECT_EQ(world->record_event(event, s0), pfSuccess);
    EXPECT_EQ(world->wait_event(s1, event, 6.0, 2), pfSuccess);
    if (i == 0) EXPECT_EQ(world->write_word(s1, &words.gate, 1), pfSuccess);
    EXPECT_EQ(world->launch_kernel(s1, 30.0, 16), pfSuccess);
  }
  EXPECT_EQ(world->run_until_idle(), pfSuccess);
  return world->activities(1);
}

TEST(SimInterference, ZeroCoefficientsAndAVersionOneDescriptionGiveTheUnslowedSchedule) {
  pfSimDeviceDesc_t off = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;
  off.sm_count = 16;
  // A version-1 aggregate: four fields, size 0 (the old model, interference 0).
  pfSimDeviceDesc_t version1 = {16, size_t{1} << 30, 0.0, 0.0};
  const auto a = run_program(off);
  const auto b = run_program(version1);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name) << i;
    EXPECT_DOUBLE_EQ(a[i].start_us, b[i].start_us) << i;
    EXPECT_DOUBLE_EQ(a[i].end_us, b[i].end_us) << i;
  }
  // Device 1 by hand, every duration nominal. t=0: the first wait takes 2 SMs, 14 ticket
  // blocks start 7 µs items (2 blocks wait for SMs). Stage 0's kernel records at 40: the wait
  // ends at 46, the gate closes, kernel 1 takes the 2 freed SMs at 46 (until 76) and the 14
  // ticket SMs when their items (started at 42) end at 49 (until 79). The 2 unstarted ticket
  // blocks exit at once at 76; the opaque launch runs its 10 items of 3 µs from 76 to 85. The
  // second wait holds 2 SMs from 79 and ends at 80 + 6; kernel 2 runs [86, 116); the third
  // wait ends at 120 + 6; kernel 3 runs [126, 156).
  std::vector<std::pair<double, double>> kernels;
  for (const auto& record : a) {
    if (record.kind == ActivityKind::Kernel) kernels.emplace_back(record.start_us, record.end_us);
  }
  const std::vector<std::pair<double, double>> expected = {{46, 79}, {86, 116}, {126, 156}};
  EXPECT_EQ(kernels, expected);
  const auto comms = records_of_kind(a, ActivityKind::Comm);
  ASSERT_EQ(comms.size(), 3u);
  EXPECT_DOUBLE_EQ(comms[0].end_us, 46.0);
  const auto fills = records_of_kind(a, ActivityKind::Fill);
  ASSERT_EQ(fills.size(), 2u);
  EXPECT_DOUBLE_EQ(fills[0].end_us, 49.0);
  EXPECT_DOUBLE_EQ(fills[1].start_us, 76.0);
  EXPECT_DOUBLE_EQ(fills[1].end_us, 85.0);

  // With the calibrated defaults the first transfer is slowed by the 14 resident ticket blocks
  // (gamma 0.5, intensity 0.5, 16 SMs), so everything after it moves.
  pfSimDeviceDesc_t on = PF_SIM_DEVICE_DESC_INITIALIZER;
  on.sm_count = 16;
  const auto c = run_program(on);
  const auto comms_on = records_of_kind(c, ActivityKind::Comm);
  ASSERT_EQ(comms_on.size(), 3u);
  EXPECT_DOUBLE_EQ(comms_on[0].end_us, 40.0 + 6.0 * (1.0 + 0.5 * 14 * 0.5 / 16));
}

TEST(SimInterference, VersionOneInterferenceKeepsItsOldFormula) {
  // Version 1: main kernel x (1 + interference x fill blocks / SMs), whatever the intensity.
  pfSimDeviceDesc_t version1 = {10, size_t{1} << 30, 0.0, 0.4};
  auto world = make_world_with(1, version1);
  FillPartition partition;
  ASSERT_EQ(world->configure_partition(0, 5, &partition), pfSuccess);
  void* fill = make_stream(*world, 0, 0, true);
  void* main = make_stream(*world, 0, -1);
  TicketWords words;
  pfSliceDesc_t slice = words.slice(1, 5, 5, 10);
  ASSERT_EQ(world->launch_ticket(fill, &slice, 10, 1000.0, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(world->delay(main, 1.0), pfSuccess);
  ASSERT_EQ(world->launch_kernel(main, 100.0, 5), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_DOUBLE_EQ(records_of(*world, 0, ActivityKind::Kernel).at(0).end_us,
                   1.0 + 100.0 * (1.0 + 0.4 * 5 / 10.0));
}

// ---- Bad input ---------------------------------------------------------------------------------

TEST(SimInterference, BadCoefficientsAndSizesAreRefusedWithTheirName) {
  pfSimWorld_t world = nullptr;
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.comm_slowdown = -0.1;
  EXPECT_EQ(pfSimWorldCreate(1, &desc, 1, &world), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("comm_slowdown"), std::string::npos);
  desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.fill_mem_intensity = std::nan("");
  EXPECT_EQ(pfSimWorldCreate(1, &desc, 1, &world), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("fill_mem_intensity"), std::string::npos);
  desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.size = 8;
  EXPECT_EQ(pfSimWorldCreate(1, &desc, 1, &world), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("size 8"), std::string::npos);
  EXPECT_EQ(world, nullptr);

  ASSERT_EQ(pfSimWorldCreate(1, nullptr, 1, &world), pfSuccess);
  void* stream = nullptr;
  ASSERT_EQ(pfSimStreamCreate(world, 0, 0, &stream), pfSuccess);
  EXPECT_EQ(pfSimLaunchKernelBlocks(stream, 0, 1.0), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("blocks 0"), std::string::npos);
  EXPECT_EQ(pfSimLaunchKernelBlocks(stream, 4, -1.0), pfErrorInvalidArgument);
  pfSimEvent_t event = nullptr;
  ASSERT_EQ(pfSimEventCreate(world, &event), pfSuccess);
  EXPECT_EQ(pfSimStreamWaitEventTransfer(stream, event, 0.0, -2.0, 1), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("transfer_us -2"), std::string::npos);
  pfSimFillDesc_t fill = PF_SIM_FILL_DESC_INITIALIZER;
  fill.size = 4;
  EXPECT_EQ(pfSimLaunchOpaqueEx(stream, 0, 1, 1, 1.0, &fill, nullptr, nullptr),
            pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("fill desc size 4"), std::string::npos);
  fill = PF_SIM_FILL_DESC_INITIALIZER;
  fill.mem_intensity = INFINITY;
  EXPECT_EQ(pfSimLaunchOpaqueEx(stream, 0, 1, 1, 1.0, &fill, nullptr, nullptr),
            pfErrorInvalidArgument);
  // Nothing was enqueued by the failed calls: the world is idle at time 0.
  ASSERT_EQ(pfSimRunUntilIdle(world), pfSuccess);
  double now = -1.0;
  ASSERT_EQ(pfSimNow(world, &now), pfSuccess);
  EXPECT_DOUBLE_EQ(now, 0.0);
  EXPECT_EQ(pfSimWorldDestroy(world), pfSuccess);
}

}  // namespace
}  // namespace pipefill::sim
