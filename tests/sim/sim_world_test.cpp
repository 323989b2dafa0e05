// Execution-model tests of the simulated world: stream order, priorities, SM accounting,
// events, the ticket/opaque fill kernels, determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <atomic>
#include <numeric>
#include <thread>

#include "common/error.hpp"
#include "sim_test_support.hpp"

namespace pipefill::sim {
namespace {

using testing::ItemLog;
using testing::make_event;
using testing::make_stream;
using testing::make_world;
using testing::records_of;
using testing::records_of_stream;
using testing::TicketWords;

TEST(SimWorld, OpsOnOneStreamRunInFifoOrderEvenWithFreeSms) {
  auto world = make_world(1, 10);
  void* stream = make_stream(*world, 0, 0);
  ASSERT_EQ(world->launch_kernel(stream, 10.0, 5), pfSuccess);
  ASSERT_EQ(world->delay(stream, 7.0), pfSuccess);
  ASSERT_EQ(world->launch_kernel(stream, 20.0, 5), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);

  const auto records = records_of_stream(*world, 0, stream);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].kind, ActivityKind::Kernel);
  EXPECT_DOUBLE_EQ(records[0].start_us, 0.0);
  EXPECT_DOUBLE_EQ(records[0].end_us, 10.0);
  EXPECT_EQ(records[0].grid_blocks, 5);
  EXPECT_EQ(records[1].kind, ActivityKind::Memcpy);
  EXPECT_DOUBLE_EQ(records[1].start_us, 10.0);
  EXPECT_DOUBLE_EQ(records[1].end_us, 17.0);
  EXPECT_DOUBLE_EQ(records[2].start_us, 17.0);
  EXPECT_DOUBLE_EQ(records[2].end_us, 37.0);
  EXPECT_DOUBLE_EQ(world->now(), 37.0);
}

TEST(SimWorld, IndependentStreamsShareSmsConcurrently) {
  auto world = make_world(1, 10);
  void* a = make_stream(*world, 0, 0);
  void* b = make_stream(*world, 0, 0);
  ASSERT_EQ(world->launch_kernel(a, 10.0, 4), pfSuccess);
  ASSERT_EQ(world->launch_kernel(b, 10.0, 6), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, a).at(0).start_us, 0.0);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, b).at(0).start_us, 0.0);
  EXPECT_DOUBLE_EQ(world->now(), 10.0);
}

TEST(SimWorld, PendingKernelsAreServedByPriorityThenEnqueueOrder) {
  auto world = make_world(1, 10);
  void* blocker = make_stream(*world, 0, -2);
  void* low = make_stream(*world, 0, 0);
  void* low2 = make_stream(*world, 0, 0);
  void* high = make_stream(*world, 0, -1);
  ASSERT_EQ(world->launch_kernel(blocker, 100.0, 10), pfSuccess);
  // Enqueued low first, then high: high still runs first once the SMs free up.
  ASSERT_EQ(world->launch_kernel(low, 10.0, 10), pfSuccess);
  ASSERT_EQ(world->launch_kernel(low2, 10.0, 10), pfSuccess);
  ASSERT_EQ(world->launch_kernel(high, 10.0, 10), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, high).at(0).start_us, 100.0);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, low).at(0).start_us, 110.0);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, low2).at(0).start_us, 120.0);
}

TEST(SimWorld, PendingHigherPriorityKernelBlocksLowerOneFromFreeSms) {
  auto world = make_world(1, 10);
  void* half = make_stream(*world, 0, 0);
  void* high = make_stream(*world, 0, -1);
  void* low = make_stream(*world, 0, 0);
  ASSERT_EQ(world->launch_kernel(half, 100.0, 5), pfSuccess);  // 5 SMs until 100
  ASSERT_EQ(world->delay(high, 1.0), pfSuccess);
  ASSERT_EQ(world->launch_kernel(high, 10.0, 10), pfSuccess);
  ASSERT_EQ(world->delay(low, 1.0), pfSuccess);
  ASSERT_EQ(world->launch_kernel(low, 10.0, 1), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  // Block-level dispatch: at 1 high's first 5 blocks take the 5 free SMs (1..11), its other 5
  // take them again at 11 (11..21). While high has pending blocks, low gets no SM.
  const auto high_records = records_of_stream(*world, 0, high);  // the delay, then the kernel
  ASSERT_EQ(high_records.size(), 2u);
  EXPECT_DOUBLE_EQ(high_records[1].start_us, 1.0);
  EXPECT_DOUBLE_EQ(high_records[1].end_us, 21.0);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, low).at(1).start_us, 21.0);
}

TEST(SimWorld, KernelSmCountIsClampedToTheDevice) {
  auto world = make_world(1, 8);
  void* stream = make_stream(*world, 0, 0);
  ASSERT_EQ(world->launch_kernel(stream, 5.0, 1000), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_EQ(records_of_stream(*world, 0, stream).at(0).grid_blocks, 8);
}

TEST(SimWorld, MainKernelIsDelayedExactlyByTheResidentFillItemsRemainingTime) {
  auto world = make_world(1, 10);
  void* fill = make_stream(*world, 0, 0, /*fill=*/true);
  void* main = make_stream(*world, 0, -1);
  TicketWords words;
  pfSliceDesc_t slice = words.slice(/*bubble_id=*/1, /*max_items=*/1000, /*total=*/1000, 10);
  ASSERT_EQ(world->launch_ticket(fill, &slice, 10, 100.0, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(world->delay(main, 30.0), pfSuccess);
  ASSERT_EQ(world->write_word(main, &words.gate, 1), pfSuccess);  // bubble 1 ends at t=30
  ASSERT_EQ(world->launch_kernel(main, 50.0, 10), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);

  const auto kernels = records_of(*world, 0, ActivityKind::Kernel);
  ASSERT_EQ(kernels.size(), 1u);
  // Ready at 30; the 10 resident items (started at 0, 100 µs each) end at 100: 70 µs delay.
  EXPECT_DOUBLE_EQ(kernels[0].start_us, 100.0);
  EXPECT_DOUBLE_EQ(kernels[0].end_us, 150.0);
  const auto fills = records_of(*world, 0, ActivityKind::Fill);
  ASSERT_EQ(fills.size(), 1u);
  EXPECT_DOUBLE_EQ(fills[0].start_us, 0.0);
  EXPECT_DOUBLE_EQ(fills[0].end_us, 100.0);
  EXPECT_EQ(fills[0].grid_blocks, 10);
  EXPECT_EQ(words.cursor, 10u);
}

TEST(SimWorld, InterferenceSlowsAMainKernelStartingNextToFillBlocks) {
  auto world = make_world(1, 10, /*jitter=*/0.0, /*interference=*/0.4);
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
  const auto kernels = records_of(*world, 0, ActivityKind::Kernel);
  ASSERT_EQ(kernels.size(), 1u);
  // 5 fill blocks resident on 10 SMs: 100 * (1 + 0.4 * 5 / 10) = 120.
  EXPECT_DOUBLE_EQ(kernels[0].start_us, 1.0);
  EXPECT_DOUBLE_EQ(kernels[0].end_us, 121.0);
}

TEST(SimWorld, CrossDeviceEventWaitAddsLatency) {
  auto world = make_world(2, 10);
  void* sender = make_stream(*world, 0, 0);
  void* receiver = make_stream(*world, 1, 0);
  void* event = make_event(*world);
  ASSERT_EQ(world->launch_kernel(sender, 40.0, 10), pfSuccess);
  ASSERT_EQ(world->record_event(event, sender), pfSuccess);
  ASSERT_EQ(world->wait_event(receiver, event, 15.0, 0), pfSuccess);
  ASSERT_EQ(world->launch_kernel(receiver, 10.0, 10), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);

  const auto received = records_of(*world, 1, ActivityKind::Kernel);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_DOUBLE_EQ(received[0].start_us, 55.0);
  EXPECT_DOUBLE_EQ(received[0].end_us, 65.0);
  bool recorded = false;
  bool done = false;
  double time = 0.0;
  ASSERT_EQ(world->event_state(event, &recorded, &done, &time), pfSuccess);
  EXPECT_TRUE(recorded);
  EXPECT_TRUE(done);
  EXPECT_DOUBLE_EQ(time, 40.0);
}

TEST(SimWorld, WaitUsesTheRecordThatWasLatestWhenTheWaitWasEnqueued) {
  auto world = make_world(1, 10);
  void* a = make_stream(*world, 0, 0);
  void* b = make_stream(*world, 0, 0);
  void* event = make_event(*world);
  ASSERT_EQ(world->delay(a, 20.0), pfSuccess);
  ASSERT_EQ(world->record_event(event, a), pfSuccess);  // completes at 20
  ASSERT_EQ(world->wait_event(b, event, 0.0, 0), pfSuccess);
  ASSERT_EQ(world->delay(a, 80.0), pfSuccess);
  ASSERT_EQ(world->record_event(event, a), pfSuccess);  // re-recorded: completes at 100
  ASSERT_EQ(world->launch_kernel(b, 1.0, 1), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, b).at(0).start_us, 20.0);
}

TEST(SimWorld, WaitOnANeverRecordedEventDoesNotWait) {
  auto world = make_world(1, 10);
  void* a = make_stream(*world, 0, 0);
  void* b = make_stream(*world, 0, 0);
  void* event = make_event(*world);
  ASSERT_EQ(world->wait_event(b, event, 50.0, 4), pfSuccess);  // nothing recorded yet
  ASSERT_EQ(world->delay(a, 20.0), pfSuccess);
  ASSERT_EQ(world->record_event(event, a), pfSuccess);
  ASSERT_EQ(world->launch_kernel(b, 1.0, 1), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_DOUBLE_EQ(records_of_stream(*world, 0, b).at(0).start_us, 0.0);
  EXPECT_TRUE(records_of(*world, 0, ActivityKind::Comm).empty());
}

TEST(SimWorld, CommWaitHoldsItsSmsAndLeavesTheRestToFill) {
  auto world = make_world(1, 10);
  void* comm = make_stream(*world, 0, -1);
  void* peer = make_stream(*world, 0, -1);
  void* fill = make_stream(*world, 0, 0, true);
  void* event = make_event(*world);
  ASSERT_EQ(world->delay(peer, 50.0), pfSuccess);
  ASSERT_EQ(world->record_event(event, peer), pfSuccess);
  ASSERT_EQ(world->wait_event(comm, event, 5.0, 3), pfSuccess);  // spins on 3 SMs until 55
  TicketWords words;
  pfSliceDesc_t slice = words.slice(1, 1000, 16, 10);
  ItemLog log;
  ASSERT_EQ(world->launch_ticket(fill, &slice, 10, 10.0, &ItemLog::on_item, &log), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);

  const auto comms = records_of(*world, 0, ActivityKind::Comm);
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_DOUBLE_EQ(comms[0].start_us, 0.0);
  EXPECT_DOUBLE_EQ(comms[0].end_us, 55.0);
  EXPECT_EQ(comms[0].grid_blocks, 3);
  // 7 SMs left: 16 items of 10 µs on 7 blocks -> rounds of 7, 7, 2 -> ends at 30.
  EXPECT_EQ(log.max_concurrency(10.0), 7);
  EXPECT_EQ(log.items.size(), 16u);
  const auto fills = records_of(*world, 0, ActivityKind::Fill);
  ASSERT_EQ(fills.size(), 1u);
  EXPECT_DOUBLE_EQ(fills[0].end_us, 30.0);
}

TEST(SimWorld, GateClosingStopsTicketBlocksWithinOneItem) {
  auto world = make_world(1, 10);
  void* fill = make_stream(*world, 0, 0, true);
  void* main = make_stream(*world, 0, -1);
  TicketWords words;
  pfSliceDesc_t slice = words.slice(3, 1000, 1000, 4);
  ItemLog log;
  ASSERT_EQ(world->launch_ticket(fill, &slice, 8, 30.0, &ItemLog::on_item, &log), pfSuccess);
  ASSERT_EQ(world->delay(main, 50.0), pfSuccess);
  ASSERT_EQ(world->write_word(main, &words.gate, 3), pfSuccess);  // gate closes at 50
  ASSERT_EQ(world->run_until_idle(), pfSuccess);

  const auto fills = records_of(*world, 0, ActivityKind::Fill);
  ASSERT_EQ(fills.size(), 1u);
  // 4 blocks (max_blocks): items 0-3 in [0,30], 4-7 claimed at 30 (gate open) end at 60.
  const double overrun = fills[0].end_us - 50.0;
  EXPECT_DOUBLE_EQ(overrun, 10.0);
  EXPECT_LE(overrun, 30.0);
  EXPECT_EQ(fills[0].grid_blocks, 4);
  EXPECT_EQ(words.cursor, 8u);
  EXPECT_EQ(log.items.size(), 8u);
}

TEST(SimWorld, GateClosedByAnEarlierBubbleIdStillLetsALaterBubbleRun) {
  auto world = make_world(1, 4);
  void* fill = make_stream(*world, 0, 0, true);
  TicketWords words;
  words.gate = 4;  // bubble 4 closed; this slice belongs to bubble 5
  pfSliceDesc_t slice = words.slice(5, 3, 100, 4);
  ASSERT_EQ(world->launch_ticket(fill, &slice, 4, 1.0, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_EQ(words.cursor, 3u);
}

TEST(SimWorld, CursorResumesAcrossLaunchesAndEveryItemRunsExactlyOnce) {
  auto world = make_world(1, 6);
  void* fill = make_stream(*world, 0, 0, true);
  TicketWords words;
  ItemLog log;
  constexpr uint64_t kTotal = 13;
  for (uint64_t bubble = 1; bubble <= 4; ++bubble) {
    // What the runtime does per slice: zero the budget counter in stream order, then launch.
    ASSERT_EQ(world->write_word(fill, &words.budget, 0), pfSuccess);
    pfSliceDesc_t slice = words.slice(bubble, 5, kTotal, 6);
    ASSERT_EQ(world->launch_ticket(fill, &slice, 3, 7.0, &ItemLog::on_item, &log), pfSuccess);
  }
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  std::vector<uint64_t> expected(kTotal);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(log.sorted_items(), expected);
  // The shared claim protocol (item_protocol.hpp, as on the GPU) moves the cursor on every claim
  // that passed the gate and the budget, also past the end: in the third launch the blocks'
  // second claims are the slice's 4th and 5th (cursor 13, 14: past the end) and a 6th that
  // fails on the budget; in the fourth launch each of the 3 blocks makes one such claim.
  EXPECT_EQ(words.cursor, kTotal + 2 + 3);
  // 5 + 5 + 3 items, the fourth launch finds the job done and processes nothing.
  EXPECT_EQ(records_of(*world, 0, ActivityKind::Fill).size(), 3u);
}

TEST(SimWorld, SliceBudgetLimitsTheItemsClaimed) {
  auto world = make_world(1, 10);
  void* fill = make_stream(*world, 0, 0, true);
  TicketWords words;
  pfSliceDesc_t slice = words.slice(1, 6, 100, 10);
  ASSERT_EQ(world->launch_ticket(fill, &slice, 4, 10.0, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_EQ(words.cursor, 6u);
  // Claims: 4 at t=0, 4 at t=10 (2 succeed), 2 at t=20 (fail): every check increments.
  EXPECT_EQ(words.budget, 10u);
  const auto fills = records_of(*world, 0, ActivityKind::Fill);
  ASSERT_EQ(fills.size(), 1u);
  EXPECT_DOUBLE_EQ(fills[0].end_us, 20.0);
}

TEST(SimWorld, OpaqueWorkIgnoresTheGate) {
  auto world = make_world(1, 10);
  void* fill = make_stream(*world, 0, 0, true);
  TicketWords words;
  words.gate = 9;  // closed for bubble 1
  pfSliceDesc_t slice = words.slice(1, 100, 100, 10);
  ItemLog ticket_log;
  ItemLog opaque_log;
  ASSERT_EQ(world->launch_ticket(fill, &slice, 4, 10.0, &ItemLog::on_item, &ticket_log),
            pfSuccess);
  ASSERT_EQ(world->launch_opaque(fill, 100, 7, 3, 10.0, &ItemLog::on_item, &opaque_log),
            pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_TRUE(ticket_log.items.empty());
  EXPECT_EQ(opaque_log.sorted_items(),
            (std::vector<uint64_t>{100, 101, 102, 103, 104, 105, 106}));
  const auto fills = records_of(*world, 0, ActivityKind::Fill);
  ASSERT_EQ(fills.size(), 1u);  // the ticket launch processed nothing: no record
  EXPECT_EQ(fills[0].name, "fill_opaque");
  EXPECT_DOUBLE_EQ(fills[0].start_us, 0.0);
  EXPECT_DOUBLE_EQ(fills[0].end_us, 30.0);  // 7 items on 3 blocks: 3 rounds
}

TEST(SimWorld, FillNeverUsesMoreThanThePartitionsSms) {
  auto world = make_world(1, 10);
  FillPartition partition;
  ASSERT_EQ(world->configure_partition(0, 6, &partition), pfSuccess);
  EXPECT_EQ(partition.fill_sms, 4);
  EXPECT_EQ(partition.reserved_sms, 6);
  EXPECT_EQ(partition.total_sms, 10);
  EXPECT_TRUE(partition.hardware_confined);
  EXPECT_EQ(partition.mode, "simulated-partition");
  void* fill_a = make_stream(*world, 0, 0, true);
  void* fill_b = make_stream(*world, 0, 0, true);
  void* main = make_stream(*world, 0, -1);
  TicketWords words;
  pfSliceDesc_t slice = words.slice(1, 100, 40, 10);
  ItemLog log;
  ASSERT_EQ(world->launch_ticket(fill_a, &slice, 10, 5.0, &ItemLog::on_item, &log), pfSuccess);
  ASSERT_EQ(world->launch_opaque(fill_b, 1000, 20, 10, 5.0, &ItemLog::on_item, &log), pfSuccess);
  ASSERT_EQ(world->launch_kernel(main, 100.0, 6), pfSuccess);  // the reserved SMs stay usable
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_EQ(log.items.size(), 60u);
  EXPECT_EQ(log.max_concurrency(5.0), 4);
  EXPECT_EQ(records_of(*world, 0, ActivityKind::Fill).at(0).grid_blocks, 4);
  EXPECT_DOUBLE_EQ(records_of(*world, 0, ActivityKind::Kernel).at(0).start_us, 0.0);
  // 60 items x 5 µs over 4 SMs = 75 µs of fill.
  double last_fill_end = 0.0;
  for (const auto& record : records_of(*world, 0, ActivityKind::Fill)) {
    last_fill_end = std::max(last_fill_end, record.end_us);
  }
  EXPECT_DOUBLE_EQ(last_fill_end, 75.0);
}

// A small pipeline-like program with jitter, used for the determinism tests.
std::vector<ActivityRecord> run_jittered_program(uint64_t seed) {
  auto world = make_world(2, 16, /*jitter=*/0.2, /*interference=*/0.1, seed);
  void* s0 = make_stream(*world, 0, -1);
  void* s1 = make_stream(*world, 1, -1);
  void* f0 = make_stream(*world, 0, 0, true);
  void* event = make_event(*world);
  TicketWords words;
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(world->launch_kernel(s0, 50.0, 16), pfSuccess);
    EXPECT_EQ(world->record_event(event, s0), pfSuccess);
    EXPECT_EQ(world->wait_event(s1, event, 3.0, 2), pfSuccess);
    EXPECT_EQ(world->launch_kernel(s1, 40.0, 16), pfSuccess);
    EXPECT_EQ(world->write_word(f0, &words.budget, 0), pfSuccess);
    pfSliceDesc_t slice = words.slice(static_cast<uint64_t>(i) + 1, 8, 1000, 16);
    EXPECT_EQ(world->launch_ticket(f0, &slice, 16, 4.0, nullptr, nullptr), pfSuccess);
  }
  EXPECT_EQ(world->run_until_idle(), pfSuccess);
  auto log = world->activities(0);
  auto log1 = world->activities(1);
  log.insert(log.end(), log1.begin(), log1.end());
  return log;
}

bool same_records(const std::vector<ActivityRecord>& a, const std::vector<ActivityRecord>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].kind != b[i].kind || a[i].name != b[i].name || a[i].device != b[i].device ||
        a[i].stream != b[i].stream || a[i].start_us != b[i].start_us ||
        a[i].end_us != b[i].end_us || a[i].correlation != b[i].correlation ||
        a[i].grid_blocks != b[i].grid_blocks) {
      return false;
    }
  }
  return true;
}

TEST(SimWorld, SameSeedGivesIdenticalActivityLogs) {
  const auto first = run_jittered_program(42);
  const auto second = run_jittered_program(42);
  ASSERT_FALSE(first.empty());
  EXPECT_TRUE(same_records(first, second));
}

TEST(SimWorld, DifferentSeedGivesDifferentLogsWithJitter) {
  EXPECT_FALSE(same_records(run_jittered_program(42), run_jittered_program(43)));
}

TEST(SimWorld, JitterScalesDurationsAroundTheirMean) {
  auto world = make_world(1, 1, /*jitter=*/0.1, 0.0, 7);
  void* stream = make_stream(*world, 0, 0);
  constexpr int kKernels = 4000;
  for (int i = 0; i < kKernels; ++i) ASSERT_EQ(world->launch_kernel(stream, 100.0, 1), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  double sum = 0.0;
  double sum_sq = 0.0;
  for (const auto& r : records_of(*world, 0, ActivityKind::Kernel)) {
    const double d = r.end_us - r.start_us;
    sum += d;
    sum_sq += d * d;
  }
  const double mean = sum / kKernels;
  const double stddev = std::sqrt(sum_sq / kKernels - mean * mean);
  // Mean 100 and std-dev 10 within sampling error (~0.16 and ~0.11 standard errors).
  EXPECT_NEAR(mean, 100.0, 1.0);
  EXPECT_NEAR(stddev, 10.0, 0.7);
}

TEST(SimWorld, RunUntilStopsAtTheRequestedTime) {
  auto world = make_world(1, 4);
  void* stream = make_stream(*world, 0, 0);
  ASSERT_EQ(world->launch_kernel(stream, 10.0, 4), pfSuccess);
  ASSERT_EQ(world->launch_kernel(stream, 10.0, 4), pfSuccess);
  ASSERT_EQ(world->run_until(15.0), pfSuccess);
  EXPECT_DOUBLE_EQ(world->now(), 15.0);
  EXPECT_EQ(records_of(*world, 0, ActivityKind::Kernel).size(), 1u);
  ASSERT_EQ(world->run_until(5.0), pfSuccess);  // the past: nothing happens
  EXPECT_DOUBLE_EQ(world->now(), 15.0);
  ASSERT_EQ(world->run_until(1000.0), pfSuccess);  // goes idle at 20 first
  EXPECT_DOUBLE_EQ(world->now(), 20.0);
  EXPECT_EQ(records_of(*world, 0, ActivityKind::Kernel).size(), 2u);
  // Work enqueued later starts at the current virtual time.
  ASSERT_EQ(world->launch_kernel(stream, 1.0, 1), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_DOUBLE_EQ(records_of(*world, 0, ActivityKind::Kernel).at(2).start_us, 20.0);
}

TEST(SimWorld, DeadlockIsReportedInsteadOfHanging) {
  auto world = make_world(1, 4);
  void* comm = make_stream(*world, 0, -1);
  void* compute = make_stream(*world, 0, 0);
  void* event = make_event(*world);
  ASSERT_EQ(world->delay(compute, 1.0), pfSuccess);
  ASSERT_EQ(world->launch_kernel(compute, 5.0, 4), pfSuccess);  // needs the SMs the wait holds
  ASSERT_EQ(world->record_event(event, compute), pfSuccess);
  ASSERT_EQ(world->wait_event(comm, event, 0.0, 4), pfSuccess);
  EXPECT_EQ(world->run_until_idle(), pfErrorInvalidState);
  EXPECT_NE(last_error_message().find("deadlock"), std::string::npos) << last_error_message();
  EXPECT_EQ(world->synchronize_event(event), pfErrorInvalidState);
}

TEST(SimWorld, SynchronizeRunsOnlyAsFarAsNeededAndSkipsHooks) {
  auto world = make_world(1, 4);
  int hook_calls = 0;
  world->add_pre_run_hook(&hook_calls, [&hook_calls] { ++hook_calls; });
  void* a = make_stream(*world, 0, 0);
  void* b = make_stream(*world, 0, 0);
  void* event = make_event(*world);
  ASSERT_EQ(world->synchronize_event(event), pfSuccess);  // never recorded: returns at once
  ASSERT_EQ(world->launch_kernel(a, 10.0, 1), pfSuccess);
  ASSERT_EQ(world->record_event(event, a), pfSuccess);
  ASSERT_EQ(world->launch_kernel(b, 100.0, 1), pfSuccess);
  ASSERT_EQ(world->synchronize_event(event), pfSuccess);
  EXPECT_DOUBLE_EQ(world->now(), 10.0);
  ASSERT_EQ(world->synchronize_stream(b), pfSuccess);
  EXPECT_DOUBLE_EQ(world->now(), 100.0);
  EXPECT_EQ(hook_calls, 0);
  world->remove_pre_run_hook(&hook_calls);
}

TEST(SimWorld, PreRunHooksRunInOrderBeforeTheRunAndCanEnqueue) {
  auto world = make_world(1, 4);
  void* stream = make_stream(*world, 0, 0);
  std::vector<int> calls;
  int owner_a = 0;
  int owner_b = 0;
  world->add_pre_run_hook(&owner_a, [&] {
    calls.push_back(1);
    EXPECT_EQ(world->launch_kernel(stream, 3.0, 1), pfSuccess);  // no world lock is held
  });
  world->add_pre_run_hook(&owner_b, [&] { calls.push_back(2); });
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_EQ(calls, (std::vector<int>{1, 2}));
  EXPECT_DOUBLE_EQ(world->now(), 3.0);
  ASSERT_EQ(world->run_until(10.0), pfSuccess);
  EXPECT_EQ(calls, (std::vector<int>{1, 2, 1, 2}));
  world->remove_pre_run_hook(&owner_a);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_EQ(calls, (std::vector<int>{1, 2, 1, 2, 2}));
  world->remove_pre_run_hook(&owner_b);
}

TEST(SimWorld, StreamOpsWriteAndCopyWordsInStreamOrder) {
  auto world = make_world(1, 4);
  void* stream = make_stream(*world, 0, 0);
  uint64_t* words = nullptr;
  ASSERT_EQ(world->allocate_words(2, &words), pfSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(words) % 256, 0u);
  EXPECT_EQ(words[0], 0u);
  EXPECT_EQ(words[1], 0u);
  uint64_t host = 99;
  ASSERT_EQ(world->launch_kernel(stream, 5.0, 1), pfSuccess);
  ASSERT_EQ(world->write_word(stream, &words[0], 17), pfSuccess);
  ASSERT_EQ(world->copy_word(stream, &words[0], &host), pfSuccess);
  EXPECT_EQ(words[0], 0u);  // nothing runs before the world runs
  ASSERT_EQ(world->run_until(4.0), pfSuccess);
  EXPECT_EQ(words[0], 0u);
  EXPECT_EQ(host, 99u);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_EQ(words[0], 17u);
  EXPECT_EQ(host, 17u);
  EXPECT_EQ(world->free_words(words), pfSuccess);
  EXPECT_EQ(world->free_words(words), pfErrorInvalidArgument);
}

TEST(SimWorld, DestroyedStreamFinishesItsWorkButRejectsNewWork) {
  auto world = make_world(1, 4);
  void* stream = make_stream(*world, 0, 0);
  ASSERT_EQ(world->launch_kernel(stream, 5.0, 1), pfSuccess);
  ASSERT_EQ(world->destroy_stream(stream), pfSuccess);
  EXPECT_FALSE(world->is_live_stream(stream));
  EXPECT_EQ(world->launch_kernel(stream, 5.0, 1), pfErrorInvalidArgument);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_EQ(records_of(*world, 0, ActivityKind::Kernel).size(), 1u);
  EXPECT_EQ(world->destroy_stream(stream), pfErrorInvalidArgument);
}

TEST(SimWorld, ManyKernelsRunQuickly) {
  // Not a timing assertion: checks that a long program completes with the expected clock.
  auto world = make_world(1, 132);
  world->set_activity_recording(false);
  void* a = make_stream(*world, 0, -1);
  void* b = make_stream(*world, 0, 0);
  void* event = make_event(*world);
  constexpr int kSteps = 20000;
  for (int i = 0; i < kSteps; ++i) {
    ASSERT_EQ(world->launch_kernel(a, 1.0, 132), pfSuccess);
    ASSERT_EQ(world->record_event(event, a), pfSuccess);
    ASSERT_EQ(world->wait_event(b, event, 0.0, 0), pfSuccess);
    ASSERT_EQ(world->launch_kernel(b, 0.5, 66), pfSuccess);
  }
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  // a's kernels (higher priority, all 132 SMs) are always pending first, so b's kernels only
  // run once a has drained: 20000 x 1 µs + 20000 x 0.5 µs.
  EXPECT_DOUBLE_EQ(world->now(), 1.5 * kSteps);
  EXPECT_TRUE(world->activities(0).empty());
}

}  // namespace
}  // namespace pipefill::sim

namespace pipefill::sim {
namespace {

TEST(SimWorldThreads, EnqueueFromAnotherThreadWhileRunning) {
  auto world = testing::make_world(1, 4);
  void* producer_stream = testing::make_stream(*world, 0, 0);
  void* consumer_stream = testing::make_stream(*world, 0, -1);
  void* event = testing::make_event(*world);
  constexpr int kKernels = 2000;
  std::atomic<bool> producing{true};
  std::thread producer([&] {
    for (int i = 0; i < kKernels; ++i) {
      EXPECT_EQ(world->launch_kernel(producer_stream, 1.0, 1), pfSuccess);
      EXPECT_EQ(world->record_event(event, producer_stream), pfSuccess);
      bool recorded = false;
      bool done = false;
      double time = 0.0;
      EXPECT_EQ(world->event_state(event, &recorded, &done, &time), pfSuccess);
    }
    producing = false;
  });
  double horizon = 0.0;
  while (producing.load()) {
    horizon += 5.0;
    EXPECT_EQ(world->run_until(horizon), pfSuccess);
    EXPECT_EQ(world->launch_kernel(consumer_stream, 0.5, 1), pfSuccess);
  }
  producer.join();
  ASSERT_EQ(world->synchronize_event(event), pfSuccess);
  ASSERT_EQ(world->run_until_idle(), pfSuccess);
  EXPECT_EQ(testing::records_of_stream(*world, 0, producer_stream).size(),
            static_cast<size_t>(kKernels));
  // Sequential 1 µs kernels on a stream that never waited for SMs: it ends at kKernels µs or
  // later (later only if the producer was idle while the clock moved on).
  EXPECT_GE(world->now(), static_cast<double>(kKernels));
}

}  // namespace
}  // namespace pipefill::sim
