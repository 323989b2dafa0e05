// The fill partition (issue 33 item 6): with a fake driver, a green-context size the driver
// refuses with CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION is followed by the next smaller valid size
// (multiples of 8 SMs, at least 8), not by grid-cap mode, and other errors end the attempt; and the
// warning when the SMs reserved for the main job may be fewer than an NCCL collective's CTAs.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "driver_api.hpp"
#include "green_split.hpp"
#include "partition.hpp"

namespace pipefill::cuda {
namespace {

// An H100-like device: 132 SMs in groups of 8. Groups round their minimum count up to 8; the
// descriptor handle carries the group's size so that the context creation can refuse by size.
struct FakeSmDriver {
  unsigned total = 132, min_partition = 8, alignment = 8;
  std::set<int> refused_contexts;  // group sizes cuGreenCtxCreate refuses
  std::set<int> refused_splits;    // minimum counts cuDevSmResourceSplitByCount refuses
  CUresult other_error = CUDA_SUCCESS;  // returned by cuGreenCtxCreate for every size, when set
  std::vector<std::string> calls;
};
FakeSmDriver* fake = nullptr;

CUresult CUDAAPI get_resource(CUdevice, CUdevResource* resource, CUdevResourceType type) {
  fake->calls.push_back("resource");
  *resource = CUdevResource{};
  resource->type = type;
  resource->sm.smCount = fake->total;
  resource->sm.minSmPartitionSize = fake->min_partition;
  resource->sm.smCoscheduledAlignment = fake->alignment;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI split(CUdevResource* result, unsigned* groups, const CUdevResource* input, CUdevResource* rest,
                       unsigned, unsigned min_count) {
  fake->calls.push_back("split " + std::to_string(min_count));
  if (fake->refused_splits.count(static_cast<int>(min_count))) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  const unsigned size = (min_count + fake->alignment - 1) / fake->alignment * fake->alignment;
  if (size > input->sm.smCount) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  *result = *input;
  result->sm.smCount = size;
  *rest = *input;
  rest->sm.smCount = input->sm.smCount - size;
  *groups = 1;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI generate_desc(CUdevResourceDesc* desc, CUdevResource* resources, unsigned count) {
  fake->calls.push_back("desc " + std::to_string(resources[0].sm.smCount));
  if (count != 1) return CUDA_ERROR_INVALID_VALUE;
  *desc = reinterpret_cast<CUdevResourceDesc>(static_cast<uintptr_t>(resources[0].sm.smCount));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI create_context(CUgreenCtx* context, CUdevResourceDesc desc, CUdevice, unsigned flags) {
  const int size = static_cast<int>(reinterpret_cast<uintptr_t>(desc));
  fake->calls.push_back("create " + std::to_string(size));
  if (flags != CU_GREEN_CTX_DEFAULT_STREAM) return CUDA_ERROR_INVALID_VALUE;
  if (fake->other_error != CUDA_SUCCESS) return fake->other_error;
  if (fake->refused_contexts.count(size)) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  *context = reinterpret_cast<CUgreenCtx>(static_cast<uintptr_t>(0x10000 + size));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI unused_stream_create(CUstream*, CUgreenCtx, unsigned, int) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult CUDAAPI unused_destroy(CUgreenCtx) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult CUDAAPI unused_device_get(CUdevice*, int) { return CUDA_ERROR_NOT_SUPPORTED; }

class GreenSplitFake : public ::testing::Test {
 protected:
  void SetUp() override {
    fake = &driver_;
    api_.driver_version = 13000;
    api_.device_get = &unused_device_get;
    api_.device_get_dev_resource = &get_resource;
    api_.dev_sm_resource_split_by_count = &split;
    api_.dev_resource_generate_desc = &generate_desc;
    api_.green_ctx_create = &create_context;
    api_.green_ctx_stream_create = &unused_stream_create;
    api_.green_ctx_destroy = &unused_destroy;
  }
  void TearDown() override { fake = nullptr; }
  FakeSmDriver driver_;
  DriverApi api_;
};

TEST_F(GreenSplitFake, AnAcceptedFirstSizeIsTheMainGroupsRemainder) {
  GreenSplit split;
  ASSERT_EQ(create_green_split(api_, 0, 16, &split), pfSuccess) << last_error_message();
  EXPECT_EQ(split.context, reinterpret_cast<CUgreenCtx>(0x10000 + 116));
  EXPECT_EQ(split.fill_sms, 116);
  EXPECT_EQ(split.reserved_sms, 16);
  EXPECT_TRUE(split.refused_sizes.empty());
  EXPECT_EQ(driver_.calls, (std::vector<std::string>{"resource", "split 16", "desc 116", "create 116"}));
}

// The 116-SM remainder and then the 112-SM fill group are refused: 104 SMs is the next valid size.
TEST_F(GreenSplitFake, RefusedSizesAreFollowedByTheNextSmallerMultipleOfEight) {
  driver_.refused_contexts = {116, 112};
  GreenSplit split;
  ASSERT_EQ(create_green_split(api_, 0, 16, &split), pfSuccess) << last_error_message();
  EXPECT_EQ(split.fill_sms, 104);
  EXPECT_EQ(split.reserved_sms, 28);
  EXPECT_EQ(split.refused_sizes, (std::vector<int>{116, 112}));
  EXPECT_EQ(driver_.calls, (std::vector<std::string>{"resource", "split 16", "desc 116", "create 116", "split 112",
                                                     "desc 112", "create 112", "split 104", "desc 104", "create 104"}));
}

TEST_F(GreenSplitFake, ARefusedSplitIsRetriedSmallerToo) {
  driver_.refused_splits = {16, 112};
  GreenSplit split;
  ASSERT_EQ(create_green_split(api_, 0, 16, &split), pfSuccess) << last_error_message();
  EXPECT_EQ(split.fill_sms, 104);
  EXPECT_EQ(split.refused_sizes, (std::vector<int>{112}));
}

TEST_F(GreenSplitFake, WhenEverySizeIsRefusedTheReasonListsThem) {
  driver_.total = 32;
  driver_.refused_contexts = {8, 16, 24};
  GreenSplit split;
  ASSERT_EQ(create_green_split(api_, 0, 8, &split), pfSuccess) << last_error_message();
  EXPECT_EQ(split.context, nullptr);
  EXPECT_EQ(split.refused_sizes, (std::vector<int>{24, 16, 8}));
  EXPECT_NE(split.why_not.find("sizes refused with CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION: 24, 16, 8"),
            std::string::npos)
      << split.why_not;
}

TEST_F(GreenSplitFake, AnyOtherErrorEndsTheAttemptWithThatError) {
  driver_.other_error = CUDA_ERROR_OUT_OF_MEMORY;
  GreenSplit split;
  EXPECT_EQ(create_green_split(api_, 0, 16, &split), pfErrorCudaFailure);
  EXPECT_EQ(split.context, nullptr);
  EXPECT_NE(last_error_message().find("cuGreenCtxCreate"), std::string::npos) << last_error_message();
  EXPECT_EQ(driver_.calls.back(), "create 116") << "no further size is tried";
}

TEST(GreenSplitSizes, TheNextSizeIsTheLargestMultipleOfEightBelowTheRefusedOne) {
  EXPECT_EQ(next_green_size_after_refusal(116, 8, 8), 112);
  EXPECT_EQ(next_green_size_after_refusal(112, 8, 8), 104);
  EXPECT_EQ(next_green_size_after_refusal(112, 2, 2), 104) << "at least Hopper's step of 8";
  EXPECT_EQ(next_green_size_after_refusal(48, 8, 16), 32) << "a coarser driver alignment wins";
  EXPECT_EQ(next_green_size_after_refusal(16, 8, 8), 8);
  EXPECT_EQ(next_green_size_after_refusal(8, 8, 8), 0) << "never below 8";
  EXPECT_EQ(next_green_size_after_refusal(24, 24, 8), 0) << "never below the driver's minimum";
}

TEST(GreenSplitSizes, AMissingEntryPointIsNamed) {
  DriverApi none;
  GreenSplit split;
  EXPECT_EQ(create_green_split(none, 0, 16, &split), pfErrorNotSupported);
  EXPECT_NE(last_error_message().find("cuGreenCtxCreate"), std::string::npos) << last_error_message();
}

EnvLookup env_of(std::map<std::string, std::string> values) {
  return [values](const char* name) -> const char* {
    const auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  };
}

TEST(NcclReservation, TheDefaultWithoutAnNcclBoundWarns) {
  const std::string warning = nccl_reservation_warning(env_of({}), 16, "default");
  EXPECT_NE(warning.find("16 SMs reserved for the main job by default"), std::string::npos) << warning;
  EXPECT_NE(warning.find("up to 32 CTAs per collective"), std::string::npos) << warning;
  EXPECT_NE(warning.find("NCCL_MAX_CTAS"), std::string::npos) << warning;
}

TEST(NcclReservation, MoreCtasThanReservedSmsWarnsNamingTheVariable) {
  const std::string warning = nccl_reservation_warning(env_of({{"NCCL_MIN_CTAS", "24"}}), 16, "config");
  EXPECT_NE(warning.find("NCCL_MIN_CTAS=24 lets an NCCL collective launch 24 CTAs, more than the 16 SMs reserved"),
            std::string::npos)
      << warning;
  EXPECT_NE(nccl_reservation_warning(env_of({{"NCCL_MAX_NCHANNELS", "32"}}), 24, "config").find("NCCL_MAX_NCHANNELS=32"),
            std::string::npos);
}

TEST(NcclReservation, ABoundAtOrBelowTheReservationIsQuiet) {
  EXPECT_EQ(nccl_reservation_warning(env_of({{"NCCL_MAX_CTAS", "16"}}), 16, "NCCL_MAX_CTAS"), "");
  EXPECT_EQ(nccl_reservation_warning(env_of({{"NCCL_MAX_NCHANNELS", "8"}}), 24, "config"), "");
  EXPECT_EQ(nccl_reservation_warning(env_of({}), 32, "config"), "") << "R chosen in config: no bound to compare";
}

}  // namespace
}  // namespace pipefill::cuda
