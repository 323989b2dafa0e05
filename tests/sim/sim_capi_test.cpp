// The pfSim* C functions: a small two-stage program, and every invalid argument.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/error.hpp"
#include "pipefill/pipefill.h"
#include "sim/sim_world.hpp"
#include "sim_test_support.hpp"

namespace {

using pipefill::last_error_message;

// Expects `call` to fail with `code` and a message containing `needle`.
#define EXPECT_FAILS_WITH(call, code, needle)                                         \
  do {                                                                                \
    EXPECT_EQ((call), (code));                                                        \
    EXPECT_NE(last_error_message().find(needle), std::string::npos)                   \
        << "message: '" << last_error_message() << "' lacks '" << (needle) << "'";    \
  } while (0)

class SimCApi : public ::testing::Test {
 protected:
  void SetUp() override {
    pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
    desc.sm_count = 8;
    desc.memory_bytes = 4096;
    ASSERT_EQ(pfSimWorldCreate(2, &desc, 3, &world_), pfSuccess);
    ASSERT_EQ(pfSimStreamCreate(world_, 0, -1, &stream_), pfSuccess);
    ASSERT_EQ(pfSimEventCreate(world_, &event_), pfSuccess);
  }
  void TearDown() override { EXPECT_EQ(pfSimWorldDestroy(world_), pfSuccess); }

  pfSimWorld_t world_ = nullptr;
  void* stream_ = nullptr;
  pfSimEvent_t event_ = nullptr;
};

TEST_F(SimCApi, TwoStagePipelineWithCommunication) {
  void* stage1 = nullptr;
  void* fill1 = nullptr;
  ASSERT_EQ(pfSimStreamCreate(world_, 1, -1, &stage1), pfSuccess);
  ASSERT_EQ(pfSimStreamCreate(world_, 1, 0, &fill1), pfSuccess);
  pfSimEvent_t sent = nullptr;
  ASSERT_EQ(pfSimEventCreate(world_, &sent), pfSuccess);
  // Stage 0 forwards for 30 µs and sends; stage 1 spins a 2-SM recv, then computes 20 µs.
  ASSERT_EQ(pfSimLaunchKernel(stream_, 30.0, 8), pfSuccess);
  ASSERT_EQ(pfSimEventRecord(sent, stream_), pfSuccess);
  ASSERT_EQ(pfSimStreamWaitEvent(stage1, sent, 4.0, 2), pfSuccess);
  ASSERT_EQ(pfSimLaunchKernel(stage1, 20.0, 8), pfSuccess);
  // Stage 1's bubble is filled by ungated work on the 6 free SMs: 24 items x 10 µs = 4 rounds.
  uint64_t done = 0;
  auto count = [](void* user, uint64_t) { ++*static_cast<uint64_t*>(user); };
  ASSERT_EQ(pfSimLaunchOpaque(fill1, 0, 24, 6, 10.0, count, &done), pfSuccess);
  double time = 0.0;
  ASSERT_EQ(pfSimEventTime(sent, &time), pfSuccess);
  EXPECT_LT(time, 0.0);  // not completed yet
  ASSERT_EQ(pfSimRunUntilIdle(world_), pfSuccess);
  ASSERT_EQ(pfSimEventTime(sent, &time), pfSuccess);
  EXPECT_DOUBLE_EQ(time, 30.0);
  EXPECT_EQ(done, 24u);
  ASSERT_EQ(pfSimNow(world_, &time), pfSuccess);
  // The recv ends at 34; the 8-SM compute then waits for the fill blocks to leave at 40.
  EXPECT_DOUBLE_EQ(time, 60.0);
  ASSERT_EQ(pfSimEventDestroy(sent), pfSuccess);
  ASSERT_EQ(pfSimStreamDestroy(stage1), pfSuccess);
  ASSERT_EQ(pfSimStreamDestroy(fill1), pfSuccess);
}

TEST_F(SimCApi, RunUntilAndNow) {
  ASSERT_EQ(pfSimLaunchKernel(stream_, 100.0, 1), pfSuccess);
  ASSERT_EQ(pfSimRunUntil(world_, 40.0), pfSuccess);
  double now = 0.0;
  ASSERT_EQ(pfSimNow(world_, &now), pfSuccess);
  EXPECT_DOUBLE_EQ(now, 40.0);
  ASSERT_EQ(pfSimRunUntilIdle(world_), pfSuccess);
  ASSERT_EQ(pfSimNow(world_, &now), pfSuccess);
  EXPECT_DOUBLE_EQ(now, 100.0);
}

TEST_F(SimCApi, WorldCreateRejectsBadArguments) {
  pfSimWorld_t world = nullptr;
  EXPECT_FAILS_WITH(pfSimWorldCreate(0, nullptr, 1, &world), pfErrorInvalidArgument,
                    "device_count 0");
  EXPECT_FAILS_WITH(pfSimWorldCreate(1, nullptr, 1, nullptr), pfErrorInvalidArgument, "NULL");
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.sm_count = 0;
  EXPECT_FAILS_WITH(pfSimWorldCreate(1, &desc, 1, &world), pfErrorInvalidArgument, "sm_count 0");
  desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.memory_bytes = 0;
  EXPECT_FAILS_WITH(pfSimWorldCreate(1, &desc, 1, &world), pfErrorInvalidArgument,
                    "memory_bytes 0");
  desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.jitter_fraction = -0.5;
  EXPECT_FAILS_WITH(pfSimWorldCreate(1, &desc, 1, &world), pfErrorInvalidArgument,
                    "jitter_fraction -0.5");
  desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.interference = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FAILS_WITH(pfSimWorldCreate(1, &desc, 1, &world), pfErrorInvalidArgument,
                    "interference nan");
  EXPECT_EQ(world, nullptr);
}

TEST_F(SimCApi, DeadOrForeignHandlesAreRejected) {
  int not_a_handle = 0;
  auto* fake_world = reinterpret_cast<pfSimWorld_t>(&not_a_handle);
  auto* fake_event = reinterpret_cast<pfSimEvent_t>(&not_a_handle);
  void* fake_stream = &not_a_handle;
  EXPECT_FAILS_WITH(pfSimWorldDestroy(nullptr), pfErrorInvalidArgument, "not a live simulated world");
  EXPECT_FAILS_WITH(pfSimWorldDestroy(fake_world), pfErrorInvalidArgument, "not a live simulated world");
  void* stream = nullptr;
  EXPECT_FAILS_WITH(pfSimStreamCreate(fake_world, 0, 0, &stream), pfErrorInvalidArgument,
                    "not a live simulated world");
  pfSimEvent_t event = nullptr;
  EXPECT_FAILS_WITH(pfSimEventCreate(fake_world, &event), pfErrorInvalidArgument,
                    "not a live simulated world");
  EXPECT_FAILS_WITH(pfSimRunUntilIdle(fake_world), pfErrorInvalidArgument, "not a live simulated world");
  EXPECT_FAILS_WITH(pfSimRunUntil(fake_world, 1.0), pfErrorInvalidArgument, "not a live simulated world");
  double now = 0.0;
  EXPECT_FAILS_WITH(pfSimNow(fake_world, &now), pfErrorInvalidArgument, "not a live simulated world");
  EXPECT_FAILS_WITH(pfSimSetMemoryUsed(fake_world, 0, 1), pfErrorInvalidArgument,
                    "not a live simulated world");

  EXPECT_FAILS_WITH(pfSimStreamDestroy(fake_stream), pfErrorInvalidArgument, "not a live simulated stream");
  EXPECT_FAILS_WITH(pfSimLaunchKernel(fake_stream, 1.0, 1), pfErrorInvalidArgument,
                    "not a live simulated stream");
  EXPECT_FAILS_WITH(pfSimLaunchKernel(nullptr, 1.0, 1), pfErrorInvalidArgument,
                    "not a live simulated stream");
  EXPECT_FAILS_WITH(pfSimStreamDelay(fake_stream, 1.0), pfErrorInvalidArgument,
                    "not a live simulated stream");
  EXPECT_FAILS_WITH(pfSimEventRecord(event_, fake_stream), pfErrorInvalidArgument,
                    "not a live simulated stream");
  EXPECT_FAILS_WITH(pfSimEventRecord(fake_event, stream_), pfErrorInvalidArgument,
                    "not a live simulated event");
  EXPECT_FAILS_WITH(pfSimStreamWaitEvent(fake_stream, event_, 0.0, 0), pfErrorInvalidArgument,
                    "not a live simulated stream");
  EXPECT_FAILS_WITH(pfSimStreamWaitEvent(stream_, fake_event, 0.0, 0), pfErrorInvalidArgument,
                    "not a live simulated event");
  EXPECT_FAILS_WITH(pfSimEventTime(fake_event, &now), pfErrorInvalidArgument,
                    "not a live simulated event");
  EXPECT_FAILS_WITH(pfSimEventDestroy(fake_event), pfErrorInvalidArgument, "not a live simulated event");
  pfSliceDesc_t slice{};
  EXPECT_FAILS_WITH(pfSimLaunchTicketKernel(fake_stream, &slice, 1, 1.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "not a live simulated stream");
  EXPECT_FAILS_WITH(pfSimLaunchOpaque(fake_stream, 0, 1, 1, 1.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "not a live simulated stream");

  // A destroyed stream / event is dead too.
  void* doomed = nullptr;
  ASSERT_EQ(pfSimStreamCreate(world_, 0, 0, &doomed), pfSuccess);
  ASSERT_EQ(pfSimStreamDestroy(doomed), pfSuccess);
  EXPECT_FAILS_WITH(pfSimLaunchKernel(doomed, 1.0, 1), pfErrorInvalidArgument,
                    "not a live simulated stream");
  pfSimEvent_t doomed_event = nullptr;
  ASSERT_EQ(pfSimEventCreate(world_, &doomed_event), pfSuccess);
  ASSERT_EQ(pfSimEventDestroy(doomed_event), pfSuccess);
  EXPECT_FAILS_WITH(pfSimEventRecord(doomed_event, stream_), pfErrorInvalidArgument,
                    "not a live simulated event");
}

TEST_F(SimCApi, StreamAndEventArgumentsAreValidated) {
  void* stream = nullptr;
  EXPECT_FAILS_WITH(pfSimStreamCreate(world_, 2, 0, &stream), pfErrorInvalidArgument, "device 2");
  EXPECT_FAILS_WITH(pfSimStreamCreate(world_, -1, 0, &stream), pfErrorInvalidArgument, "device -1");
  EXPECT_FAILS_WITH(pfSimStreamCreate(world_, 0, 1, &stream), pfErrorInvalidArgument, "priority 1");
  EXPECT_FAILS_WITH(pfSimStreamCreate(world_, 0, -6, &stream), pfErrorInvalidArgument,
                    "priority -6");
  EXPECT_FAILS_WITH(pfSimStreamCreate(world_, 0, 0, nullptr), pfErrorInvalidArgument, "NULL");
  EXPECT_FAILS_WITH(pfSimEventCreate(world_, nullptr), pfErrorInvalidArgument, "NULL");

  EXPECT_FAILS_WITH(pfSimLaunchKernel(stream_, -1.0, 1), pfErrorInvalidArgument,
                    "duration_us -1");
  EXPECT_FAILS_WITH(pfSimLaunchKernel(stream_, std::numeric_limits<double>::infinity(), 1),
                    pfErrorInvalidArgument, "duration_us inf");
  EXPECT_FAILS_WITH(pfSimLaunchKernel(stream_, 1.0, 0), pfErrorInvalidArgument, "sm_count 0");
  EXPECT_FAILS_WITH(pfSimStreamDelay(stream_, -2.0), pfErrorInvalidArgument, "duration_us -2");
  EXPECT_FAILS_WITH(pfSimStreamWaitEvent(stream_, event_, -3.0, 0), pfErrorInvalidArgument,
                    "latency_us -3");
  EXPECT_FAILS_WITH(pfSimStreamWaitEvent(stream_, event_, 0.0, -4), pfErrorInvalidArgument,
                    "sm_count -4");
  EXPECT_FAILS_WITH(pfSimEventTime(event_, nullptr), pfErrorInvalidArgument, "NULL");
  double time = 0.0;
  ASSERT_EQ(pfSimEventTime(event_, &time), pfSuccess);
  EXPECT_DOUBLE_EQ(time, -1.0);  // never recorded

  // Handles from two different worlds cannot be combined.
  pfSimWorld_t other = nullptr;
  ASSERT_EQ(pfSimWorldCreate(1, nullptr, 1, &other), pfSuccess);
  void* other_stream = nullptr;
  ASSERT_EQ(pfSimStreamCreate(other, 0, 0, &other_stream), pfSuccess);
  EXPECT_FAILS_WITH(pfSimEventRecord(event_, other_stream), pfErrorInvalidArgument,
                    "different worlds");
  EXPECT_FAILS_WITH(pfSimStreamWaitEvent(other_stream, event_, 0.0, 0), pfErrorInvalidArgument,
                    "different worlds");
  ASSERT_EQ(pfSimWorldDestroy(other), pfSuccess);
  // Destroying the world invalidated its stream handle.
  EXPECT_FAILS_WITH(pfSimLaunchKernel(other_stream, 1.0, 1), pfErrorInvalidArgument,
                    "not a live simulated stream");
}

TEST_F(SimCApi, FillLaunchArgumentsAreValidated) {
  pipefill::sim::testing::TicketWords words;
  pfSliceDesc_t good = words.slice(1, 10, 10, 4);
  EXPECT_FAILS_WITH(pfSimLaunchTicketKernel(stream_, nullptr, 1, 1.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "slice pointer is NULL");
  pfSliceDesc_t slice = good;
  slice.gate = nullptr;
  EXPECT_FAILS_WITH(pfSimLaunchTicketKernel(stream_, &slice, 1, 1.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "slice->gate");
  slice = good;
  slice.cursor = nullptr;
  EXPECT_FAILS_WITH(pfSimLaunchTicketKernel(stream_, &slice, 1, 1.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "slice->cursor");
  slice = good;
  slice.budget_counter = nullptr;
  EXPECT_FAILS_WITH(pfSimLaunchTicketKernel(stream_, &slice, 1, 1.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "slice->budget_counter");
  slice = good;
  slice.max_blocks = 0;
  EXPECT_FAILS_WITH(pfSimLaunchTicketKernel(stream_, &slice, 1, 1.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "max_blocks 0");
  EXPECT_FAILS_WITH(pfSimLaunchTicketKernel(stream_, &good, 0, 1.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "blocks 0");
  EXPECT_FAILS_WITH(pfSimLaunchTicketKernel(stream_, &good, 1, 0.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "item_cost_us 0");
  EXPECT_FAILS_WITH(pfSimLaunchOpaque(stream_, 0, 1, 0, 1.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "blocks 0");
  EXPECT_FAILS_WITH(pfSimLaunchOpaque(stream_, 0, 1, 1, -1.0, nullptr, nullptr),
                    pfErrorInvalidArgument, "item_cost_us -1");
  EXPECT_FAILS_WITH(
      pfSimLaunchOpaque(stream_, std::numeric_limits<uint64_t>::max(), 2, 1, 1.0, nullptr, nullptr),
      pfErrorInvalidArgument, "overflows");
  // Nothing invalid was enqueued: the world runs idle immediately.
  ASSERT_EQ(pfSimRunUntilIdle(world_), pfSuccess);
  double now = 1.0;
  ASSERT_EQ(pfSimNow(world_, &now), pfSuccess);
  EXPECT_DOUBLE_EQ(now, 0.0);
}

TEST_F(SimCApi, RunAndMemoryArgumentsAreValidated) {
  EXPECT_FAILS_WITH(pfSimRunUntil(world_, std::numeric_limits<double>::quiet_NaN()),
                    pfErrorInvalidArgument, "NaN");
  EXPECT_FAILS_WITH(pfSimNow(world_, nullptr), pfErrorInvalidArgument, "NULL");
  EXPECT_FAILS_WITH(pfSimSetMemoryUsed(world_, 2, 0), pfErrorInvalidArgument, "device 2");
  EXPECT_FAILS_WITH(pfSimSetMemoryUsed(world_, 0, 4097), pfErrorInvalidArgument, "4097");
  EXPECT_EQ(pfSimSetMemoryUsed(world_, 0, 4096), pfSuccess);
}

}  // namespace
