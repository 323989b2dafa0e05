// pfRuntimeGetFillStreams: the runtime's fill streams, for a framework to observe fill work
// (torch.cuda.ExternalStream); the count follows config.fill_streams and bad arguments are named.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "fixtures.hpp"

namespace pipefill::testing {
namespace {

TEST(FillStreams, OneHandlePerConfiguredStreamDistinctFromTheMainStreams) {
  ManualStage stage;
  stage.init();
  pfConfig_t config = sim_config(stage.world.get(), 0, 1, stage.comm_sms);
  config.fill_streams = 3;
  pfRuntime_t rt = stage.runtime(&config);
  ASSERT_NE(rt, nullptr);
  size_t count = 0;
  PF_ASSERT_OK(pfRuntimeGetFillStreams(rt, nullptr, 0, &count));  // asks the count only
  EXPECT_EQ(count, 3u);
  std::vector<void*> streams(5, nullptr);
  PF_ASSERT_OK(pfRuntimeGetFillStreams(rt, streams.data(), streams.size(), &count));
  EXPECT_EQ(count, 3u);
  const std::set<void*> distinct(streams.begin(), streams.begin() + 3);
  EXPECT_EQ(distinct.size(), 3u);
  EXPECT_EQ(distinct.count(nullptr), 0u);
  EXPECT_EQ(distinct.count(stage.main), 0u);
  EXPECT_EQ(streams[3], nullptr);  // nothing written past the count
  // A smaller buffer gets the first ones and still the full count.
  void* first = nullptr;
  PF_ASSERT_OK(pfRuntimeGetFillStreams(rt, &first, 1, &count));
  EXPECT_EQ(first, streams[0]);
  EXPECT_EQ(count, 3u);

  EXPECT_EQ(pfRuntimeGetFillStreams(rt, streams.data(), 2, nullptr), pfErrorInvalidArgument);
  EXPECT_EQ(pfRuntimeGetFillStreams(rt, nullptr, 2, &count), pfErrorInvalidArgument);
  EXPECT_NE(std::string(pfGetLastErrorMessage()).find("capacity 2"), std::string::npos);
  EXPECT_EQ(pfRuntimeGetFillStreams(nullptr, nullptr, 0, &count), pfErrorInvalidArgument);
  pfRuntimeDestroy(rt);
}

}  // namespace
}  // namespace pipefill::testing
