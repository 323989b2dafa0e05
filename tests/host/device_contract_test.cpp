// The Device contract both in-process engines honour through their one shared adapter
// (src/device/engine_device.hpp): NULL outputs refused with a message, an event that was never
// recorded has no time, created streams are main streams and fill streams are not, a destroyed
// handle is refused, and the streams a device leaves behind are cleaned up without error. Run on
// the simulated and the host device alike (label host, so under TSan too).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/error.hpp"
#include "core/config.hpp"
#include "device/device.hpp"

namespace pipefill {
namespace {

class DeviceContract : public ::testing::TestWithParam<pfBackend_t> {
 protected:
  void SetUp() override {
    RuntimeOptions options;
    options.backend = GetParam();
    const pfResult_t made = GetParam() == pfBackendSim ? make_sim_device(options, &device_)
                                                       : make_host_device(options, &device_);
    ASSERT_EQ(made, pfSuccess) << last_error_message();
  }
  static bool says(const std::string& needle) {
    return last_error_message().find(needle) != std::string::npos;
  }
  std::unique_ptr<Device> device_;
};

TEST_P(DeviceContract, NullOutputsAreRefusedWithAMessage) {
  int lowest = 0;
  EXPECT_EQ(device_->priority_range(&lowest, nullptr), pfErrorInvalidArgument);
  EXPECT_TRUE(says("priority_range output pointer is NULL")) << last_error_message();
  size_t free_bytes = 0;
  EXPECT_EQ(device_->memory_info(&free_bytes, nullptr), pfErrorInvalidArgument);
  EXPECT_TRUE(says("memory_info output pointer is NULL")) << last_error_message();
  void* event = nullptr;
  ASSERT_EQ(device_->create_event(&event), pfSuccess) << last_error_message();
  bool done = false;
  EXPECT_EQ(device_->query_event(event, &done, nullptr), pfErrorInvalidArgument);
  EXPECT_TRUE(says("query_event output pointer is NULL")) << last_error_message();
  EXPECT_EQ(device_->destroy_event(event), pfSuccess);
}

TEST_P(DeviceContract, AnUnrecordedEventHasNoTimeAndARecordedOneHasItsTime) {
  void* event = nullptr;
  void* stream = nullptr;
  ASSERT_EQ(device_->create_event(&event), pfSuccess);
  ASSERT_EQ(device_->create_stream(0, &stream), pfSuccess);
  bool done = true;
  double time_us = 0.0;
  EXPECT_EQ(device_->query_event(event, &done, &time_us), pfErrorInvalidState);
  EXPECT_TRUE(says("was never recorded")) << last_error_message();
  ASSERT_EQ(device_->record_event(event, stream), pfSuccess);
  ASSERT_EQ(device_->synchronize_stream(stream), pfSuccess) << last_error_message();
  ASSERT_EQ(device_->query_event(event, &done, &time_us), pfSuccess) << last_error_message();
  EXPECT_TRUE(done);
  EXPECT_GE(time_us, 0.0);
  EXPECT_EQ(device_->destroy_stream(stream), pfSuccess);
  EXPECT_EQ(device_->destroy_event(event), pfSuccess);
}

TEST_P(DeviceContract, StreamsAreMainOrFillAndDestroyedOnce) {
  int lowest = 0, highest = 0;
  ASSERT_EQ(device_->priority_range(&lowest, &highest), pfSuccess);
  EXPECT_LE(highest, lowest);  // CUDA's order: a smaller number is a higher priority
  void* main_stream = nullptr;
  void* fill = nullptr;
  ASSERT_EQ(device_->create_stream(highest, &main_stream), pfSuccess);
  ASSERT_EQ(device_->create_fill_stream(&fill), pfSuccess);
  EXPECT_TRUE(device_->is_valid_main_stream(main_stream));
  EXPECT_FALSE(device_->is_valid_main_stream(fill));
  EXPECT_EQ(device_->destroy_stream(main_stream), pfSuccess);
  EXPECT_FALSE(device_->is_valid_main_stream(main_stream));
  EXPECT_EQ(device_->destroy_stream(main_stream), pfErrorInvalidArgument) << "destroyed once";
  // `fill` is left to the device: destroying the device cleans it up without an error.
  clear_last_error();
  device_.reset();
  EXPECT_EQ(last_error_message(), "");
}

TEST_P(DeviceContract, HostWordsAreUsableAndFreedOnce) {
  uint64_t* words = nullptr;
  ASSERT_EQ(device_->allocate_host_words(4, &words), pfSuccess);
  ASSERT_NE(words, nullptr);
  words[3] = 7;  // plain host memory in both engines
  EXPECT_EQ(device_->free_host_words(words), pfSuccess);
  EXPECT_NE(device_->free_host_words(words), pfSuccess) << "a second free is refused";
}

INSTANTIATE_TEST_SUITE_P(Engines, DeviceContract, ::testing::Values(pfBackendSim, pfBackendHost),
                         [](const ::testing::TestParamInfo<pfBackend_t>& info) {
                           return std::string(info.param == pfBackendSim ? "Simulated" : "Host");
                         });

}  // namespace
}  // namespace pipefill