// A comm transfer under fill load (docs/simulated-device.md, "Interference"): after the record
// and the fixed latency, the transfer progresses at 1 / (1 + gamma x L_fill) of each moment, so
// fill slows it only while the two run together. Every expected time is a closed form of the
// model written out here.
#include <gtest/gtest.h>

#include <memory>

#include "pipefill/pipefill.h"
#include "sim_test_support.hpp"

namespace pipefill::sim {
namespace {

using testing::make_event;
using testing::make_stream;
using testing::records_of;

constexpr double kGamma = 0.5;
constexpr double kIntensity = 0.5;
constexpr int kSms = 10;
constexpr int kFillBlocks = 8;
// The fill load of 8 resident blocks of intensity 0.5 on 10 SMs, and the transfer's slowdown.
constexpr double kLoad = kFillBlocks * kIntensity / kSms;
constexpr double kFactor = 1.0 + kGamma * kLoad;
// The peer records at 50; the wait's fixed latency is 5 and its transfer 20 (unslowed).
constexpr double kRecord = 50.0, kLatency = 5.0, kTransfer = 20.0;

struct TransferWorld {
  std::unique_ptr<World> world;
  void* comm = nullptr;
  void* fill = nullptr;
};

// A world whose fill stream first waits `fill_start` (a delay), then runs one item of `item_us`
// on each of 8 SMs; the comm stream waits for the peer's record with the transfer above.
TransferWorld run_with_fill(double fill_start, double item_us) {
  TransferWorld t;
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;
  desc.sm_count = kSms;
  desc.comm_slowdown = kGamma;
  desc.fill_mem_intensity = kIntensity;
  EXPECT_EQ(World::create(1, &desc, 1, &t.world), pfSuccess);
  FillPartition partition;
  EXPECT_EQ(t.world->configure_partition(0, 2, &partition), pfSuccess);
  void* peer = make_stream(*t.world, 0, -1);
  t.comm = make_stream(*t.world, 0, -1);
  t.fill = make_stream(*t.world, 0, 0, true);
  void* event = make_event(*t.world);
  if (fill_start > 0) EXPECT_EQ(t.world->delay(t.fill, fill_start), pfSuccess);
  EXPECT_EQ(t.world->launch_opaque(t.fill, 0, kFillBlocks, kFillBlocks, item_us, nullptr, nullptr),
            pfSuccess);
  EXPECT_EQ(t.world->delay(peer, kRecord), pfSuccess);
  EXPECT_EQ(t.world->record_event(event, peer), pfSuccess);
  EXPECT_EQ(t.world->wait_event_transfer(t.comm, event, kLatency, kTransfer, 2), pfSuccess);
  EXPECT_EQ(t.world->run_until_idle(), pfSuccess);
  return t;
}

double comm_end(const TransferWorld& t) {
  const auto comms = records_of(*t.world, 0, ActivityKind::Comm);
  EXPECT_EQ(comms.size(), 1u);
  return comms.empty() ? -1.0 : comms[0].end_us;
}

TEST(SimTransfer, FillResidentThroughoutSlowsTheWholeTransfer) {
  const TransferWorld t = run_with_fill(0.0, 1000.0);
  EXPECT_DOUBLE_EQ(comm_end(t), kRecord + kLatency + kTransfer * kFactor);
}

TEST(SimTransfer, FillThatEndsDuringTheLatencyDoesNotSlowTheTransfer) {
  // The fill is resident when the peer records (50) but leaves at 53, before the bytes move (55).
  const TransferWorld t = run_with_fill(0.0, 53.0);
  EXPECT_DOUBLE_EQ(comm_end(t), kRecord + kLatency + kTransfer);
}

TEST(SimTransfer, FillThatEndsMidTransferSlowsOnlyWhileItRuns) {
  // 55-60 at the slowed rate moves 5 / factor of the transfer; the rest moves unslowed from 60.
  const TransferWorld t = run_with_fill(0.0, 60.0);
  const double moved_slowed = (60.0 - (kRecord + kLatency)) / kFactor;
  EXPECT_NEAR(comm_end(t), 60.0 + (kTransfer - moved_slowed), 1e-9);
  EXPECT_LT(comm_end(t), kRecord + kLatency + kTransfer * kFactor);
}

TEST(SimTransfer, FillThatStartsMidTransferSlowsTheRest) {
  // Unslowed 55-60, then the 15 left at the slowed rate.
  const TransferWorld t = run_with_fill(60.0, 1000.0);
  EXPECT_NEAR(comm_end(t), 60.0 + (kTransfer - 5.0) * kFactor, 1e-9);
}

TEST(SimTransfer, FillThatComesAndGoesMidTransferSlowsTheSpanItRuns) {
  // Unslowed 55-58, slowed 58-64 (it moves 6 / factor), unslowed for the rest.
  const TransferWorld t = run_with_fill(58.0, 6.0);
  const double moved = 3.0 + 6.0 / kFactor;
  EXPECT_NEAR(comm_end(t), 64.0 + (kTransfer - moved), 1e-9);
}

}  // namespace
}  // namespace pipefill::sim
