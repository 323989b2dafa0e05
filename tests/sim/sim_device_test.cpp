// The Device interface on the simulated world (what the runtime sees).
#include <gtest/gtest.h>

#include <string>

#include "common/error.hpp"
#include "core/config.hpp"
#include "sim/sim_device.hpp"
#include "sim_test_support.hpp"

namespace pipefill::sim {
namespace {

std::unique_ptr<Device> private_device(int sm_count = 20, size_t memory = size_t{1} << 30) {
  RuntimeOptions options;
  options.backend = pfBackendSim;
  options.sim_sm_count = sm_count;
  options.sim_memory_bytes = memory;
  options.sim_seed = 5;
  std::unique_ptr<Device> device;
  EXPECT_EQ(make_sim_device(options, &device), pfSuccess);
  return device;
}

SimDevice& as_sim(Device& device) { return dynamic_cast<SimDevice&>(device); }

bool message_has(const std::string& needle) {
  return last_error_message().find(needle) != std::string::npos;
}

TEST(SimDevice, PrivateWorldTakesItsSizesFromTheOptions) {
  auto device = private_device(20, size_t{1} << 30);
  EXPECT_EQ(device->backend(), pfBackendSim);
  EXPECT_EQ(device->sm_count(), 20);
  EXPECT_EQ(as_sim(*device).device_index(), 0);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  ASSERT_EQ(device->memory_info(&free_bytes, &total_bytes), pfSuccess);
  EXPECT_EQ(total_bytes, size_t{1} << 30);
  EXPECT_EQ(free_bytes, size_t{1} << 30);
  World* world = world_from_handle(as_sim(*device).world_handle());
  ASSERT_NE(world, nullptr);
  EXPECT_EQ(world->device_count(), 1);
  // The private world is attached to its device: it cannot be destroyed from C.
  EXPECT_EQ(pfSimWorldDestroy(as_sim(*device).world_handle()), pfErrorBusy);
  EXPECT_TRUE(message_has("attached")) << last_error_message();
}

TEST(SimDevice, SharedWorldDeviceIsValidatedAndKeepsTheWorldAlive) {
  pfSimWorld_t handle = nullptr;
  ASSERT_EQ(pfSimWorldCreate(2, nullptr, 1, &handle), pfSuccess);
  RuntimeOptions options;
  options.sim_world = handle;
  options.device = 2;
  std::unique_ptr<Device> device;
  EXPECT_EQ(make_sim_device(options, &device), pfErrorInvalidArgument);
  EXPECT_TRUE(message_has("device 2")) << last_error_message();
  options.device = 1;
  ASSERT_EQ(make_sim_device(options, &device), pfSuccess);
  EXPECT_EQ(as_sim(*device).device_index(), 1);
  EXPECT_EQ(as_sim(*device).world_handle(), handle);
  EXPECT_EQ(device->sm_count(), 132);
  EXPECT_EQ(pfSimWorldDestroy(handle), pfErrorBusy);
  device.reset();
  EXPECT_EQ(pfSimWorldDestroy(handle), pfSuccess);
  options.device = 0;
  EXPECT_EQ(make_sim_device(options, &device), pfErrorInvalidArgument);  // a dead world
  EXPECT_TRUE(message_has("not a live simulated world")) << last_error_message();
}

TEST(SimDevice, MainStreamValidationIsSafeForAnyPointer) {
  pfSimWorld_t handle = nullptr;
  ASSERT_EQ(pfSimWorldCreate(2, nullptr, 1, &handle), pfSuccess);
  {
    RuntimeOptions options;
    options.sim_world = handle;
    options.device = 0;
    std::unique_ptr<Device> device;
    ASSERT_EQ(make_sim_device(options, &device), pfSuccess);
    Stream fill = nullptr;
    Stream main = nullptr;
    ASSERT_EQ(device->create_fill_stream(&fill), pfSuccess);
    ASSERT_EQ(device->create_stream(-5, &main), pfSuccess);
    void* user_stream = nullptr;
    void* other_device_stream = nullptr;
    ASSERT_EQ(pfSimStreamCreate(handle, 0, -3, &user_stream), pfSuccess);
    ASSERT_EQ(pfSimStreamCreate(handle, 1, -3, &other_device_stream), pfSuccess);
    int local = 0;
    EXPECT_TRUE(device->is_valid_main_stream(main));
    EXPECT_TRUE(device->is_valid_main_stream(user_stream));
    EXPECT_FALSE(device->is_valid_main_stream(fill));
    EXPECT_FALSE(device->is_valid_main_stream(other_device_stream));
    EXPECT_FALSE(device->is_valid_main_stream(nullptr));
    EXPECT_FALSE(device->is_valid_main_stream(&local));
    ASSERT_EQ(device->destroy_stream(main), pfSuccess);
    EXPECT_FALSE(device->is_valid_main_stream(main));
    EXPECT_EQ(device->create_stream(-6, &main), pfErrorInvalidArgument);
    EXPECT_TRUE(message_has("-6")) << last_error_message();
    int lowest = 1;
    int highest = 1;
    ASSERT_EQ(device->priority_range(&lowest, &highest), pfSuccess);
    EXPECT_EQ(lowest, 0);
    EXPECT_EQ(highest, -5);
  }
  EXPECT_EQ(pfSimWorldDestroy(handle), pfSuccess);
}

TEST(SimDevice, PartitionMustLeaveAtLeastOneFillSm) {
  auto device = private_device(20);
  FillPartition partition;
  EXPECT_EQ(device->configure_partition(20, &partition), pfErrorInvalidArgument);
  EXPECT_TRUE(message_has("reserved_sms 20")) << last_error_message();
  EXPECT_EQ(device->configure_partition(-1, &partition), pfErrorInvalidArgument);
  EXPECT_TRUE(message_has("reserved_sms -1")) << last_error_message();
  ASSERT_EQ(device->configure_partition(8, &partition), pfSuccess);
  EXPECT_EQ(partition.total_sms, 20);
  EXPECT_EQ(partition.reserved_sms, 8);
  EXPECT_EQ(partition.fill_sms, 12);
  EXPECT_TRUE(partition.hardware_confined);
  EXPECT_EQ(partition.mode, "simulated-partition");
}

TEST(SimDevice, MemoryAccountingAndOutOfMemory) {
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  desc.memory_bytes = 1000000;
  pfSimWorld_t handle = nullptr;
  ASSERT_EQ(pfSimWorldCreate(1, &desc, 1, &handle), pfSuccess);
  {
    RuntimeOptions options;
    options.sim_world = handle;
    std::unique_ptr<Device> device;
    ASSERT_EQ(make_sim_device(options, &device), pfSuccess);
    ASSERT_EQ(pfSimSetMemoryUsed(handle, 0, 600000), pfSuccess);
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    ASSERT_EQ(device->memory_info(&free_bytes, &total_bytes), pfSuccess);
    EXPECT_EQ(total_bytes, 1000000u);
    EXPECT_EQ(free_bytes, 400000u);

    void* arena = nullptr;
    EXPECT_EQ(device->allocate_arena(400001, &arena), pfErrorOutOfMemory);
    EXPECT_TRUE(message_has("400001")) << last_error_message();
    EXPECT_TRUE(message_has("400000")) << last_error_message();
    ASSERT_EQ(device->allocate_arena(300000, &arena), pfSuccess);
    EXPECT_NE(arena, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena) % 256, 0u);
    ASSERT_EQ(device->memory_info(&free_bytes, &total_bytes), pfSuccess);
    EXPECT_EQ(free_bytes, 100000u);
    void* second = nullptr;
    ASSERT_EQ(device->allocate_arena(100000, &second), pfSuccess);
    EXPECT_NE(second, arena);
    ASSERT_EQ(device->memory_info(&free_bytes, &total_bytes), pfSuccess);
    EXPECT_EQ(free_bytes, 0u);
    // The main job growing past what is left floors free memory at 0.
    ASSERT_EQ(pfSimSetMemoryUsed(handle, 0, 900000), pfSuccess);
    ASSERT_EQ(device->memory_info(&free_bytes, &total_bytes), pfSuccess);
    EXPECT_EQ(free_bytes, 0u);
    ASSERT_EQ(pfSimSetMemoryUsed(handle, 0, 600000), pfSuccess);
    ASSERT_EQ(device->free_arena(arena), pfSuccess);
    EXPECT_EQ(device->free_arena(arena), pfErrorInvalidArgument);
    ASSERT_EQ(device->free_arena(second), pfSuccess);
    ASSERT_EQ(device->memory_info(&free_bytes, &total_bytes), pfSuccess);
    EXPECT_EQ(free_bytes, 400000u);
  }
  EXPECT_EQ(pfSimWorldDestroy(handle), pfSuccess);
}

TEST(SimDevice, BubbleInstructionsInStreamOrder) {
  // What pfBubbleBegin/End do on the device: record begin, close the gate, record end.
  auto device = private_device(10);
  SimDevice& sim = as_sim(*device);
  World& world = sim.world();
  Stream main = nullptr;
  Stream fill = nullptr;
  ASSERT_EQ(device->create_stream(-1, &main), pfSuccess);
  ASSERT_EQ(device->create_fill_stream(&fill), pfSuccess);
  Event begin = nullptr;
  Event end = nullptr;
  ASSERT_EQ(device->create_event(&begin), pfSuccess);
  ASSERT_EQ(device->create_event(&end), pfSuccess);
  uint64_t* words = nullptr;
  ASSERT_EQ(device->allocate_words(3, &words), pfSuccess);
  uint64_t* host = nullptr;
  ASSERT_EQ(device->allocate_host_words(1, &host), pfSuccess);

  bool done = true;
  double time = 0.0;
  EXPECT_EQ(device->query_event(begin, &done, &time), pfErrorInvalidState);  // never recorded

  ASSERT_EQ(world.launch_kernel(main, 25.0, 10), pfSuccess);
  ASSERT_EQ(device->record_event(begin, main), pfSuccess);
  ASSERT_EQ(world.delay(main, 40.0), pfSuccess);  // the recv the stage waits on
  ASSERT_EQ(device->write_word(main, &words[0], 1), pfSuccess);
  ASSERT_EQ(device->record_event(end, main), pfSuccess);
  // Fill work behind the begin event, as the executor enqueues it.
  ASSERT_EQ(device->stream_wait_event(fill, begin), pfSuccess);
  pfSliceDesc_t slice{};
  slice.bubble_id = 1;
  slice.max_items = 100;
  slice.total_items = 100;
  slice.max_blocks = 10;
  slice.gate = &words[0];
  slice.cursor = &words[1];
  slice.budget_counter = &words[2];
  ASSERT_EQ(world.launch_ticket(fill, &slice, 10, 15.0, nullptr, nullptr), pfSuccess);
  ASSERT_EQ(device->copy_word_to_host(fill, &words[1], host), pfSuccess);

  ASSERT_EQ(device->query_event(begin, &done, &time), pfSuccess);
  EXPECT_FALSE(done);
  ASSERT_EQ(device->synchronize_event(end), pfSuccess);
  ASSERT_EQ(device->query_event(begin, &done, &time), pfSuccess);
  EXPECT_TRUE(done);
  EXPECT_DOUBLE_EQ(time, 25.0);
  ASSERT_EQ(device->query_event(end, &done, &time), pfSuccess);
  EXPECT_TRUE(done);
  EXPECT_DOUBLE_EQ(time, 65.0);
  ASSERT_EQ(device->synchronize_stream(fill), pfSuccess);
  // Items at 25, 40, 55 claim with the gate open (3 rounds x 10 blocks); at 70 it is closed.
  EXPECT_EQ(*host, 30u);
  EXPECT_DOUBLE_EQ(device->now_us(), 70.0);

  EXPECT_EQ(device->free_words(words), pfSuccess);
  EXPECT_EQ(device->free_host_words(host), pfSuccess);
  EXPECT_EQ(device->destroy_event(begin), pfSuccess);
  EXPECT_EQ(device->destroy_event(begin), pfErrorInvalidArgument);
}

TEST(SimDevice, DestroyingTheDeviceReleasesItsStreamsAndEvents) {
  pfSimWorld_t handle = nullptr;
  ASSERT_EQ(pfSimWorldCreate(1, nullptr, 1, &handle), pfSuccess);
  World* world = world_from_handle(handle);
  ASSERT_NE(world, nullptr);
  Stream stream = nullptr;
  Event event = nullptr;
  {
    RuntimeOptions options;
    options.sim_world = handle;
    std::unique_ptr<Device> device;
    ASSERT_EQ(make_sim_device(options, &device), pfSuccess);
    ASSERT_EQ(device->create_stream(0, &stream), pfSuccess);
    ASSERT_EQ(device->create_event(&event), pfSuccess);
    EXPECT_TRUE(world->is_live_stream(stream));
    EXPECT_EQ(world->attached_count(), 1);
  }
  EXPECT_FALSE(world->is_live_stream(stream));
  EXPECT_FALSE(world->is_live_event(event));
  EXPECT_EQ(world->attached_count(), 0);
  EXPECT_EQ(pfSimWorldDestroy(handle), pfSuccess);
}

}  // namespace
}  // namespace pipefill::sim
