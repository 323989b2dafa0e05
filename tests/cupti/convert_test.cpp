// CUPTI record conversion, tested on CPU from constructed CUPTI record structs (no GPU needed).
#include <gtest/gtest.h>

#include <cstring>

#include "cupti_convert.hpp"

namespace pipefill::cuda {
namespace {

// 1 ms after the alignment point in CUPTI time is device time 5000 + 1000 µs.
constexpr ClockAlignment kClock{1'000'000'000ull, 5000.0};

CuptiKernelRecord kernel_record(const char* name, uint32_t stream, uint64_t start_ns, uint64_t end_ns) {
  CuptiKernelRecord record;
  std::memset(&record, 0, sizeof record);
  record.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  record.name = name;
  record.streamId = stream;
  record.deviceId = 3;
  record.correlationId = 77;
  record.start = start_ns;
  record.end = end_ns;
  record.gridX = 4;
  record.gridY = 2;
  record.gridZ = 1;
  return record;
}

const CUpti_Activity& as_activity(const void* record) { return *static_cast<const CUpti_Activity*>(record); }

TEST(ClockAlignment, MapsNanosecondsToDeviceMicroseconds) {
  EXPECT_DOUBLE_EQ(kClock.to_device_us(1'000'000'000ull), 5000.0);
  EXPECT_DOUBLE_EQ(kClock.to_device_us(1'001'000'000ull), 6000.0);
  EXPECT_DOUBLE_EQ(kClock.to_device_us(999'999'500ull), 4999.5);  // before the alignment point
}

TEST(Convert, ComputeKernel) {
  const ActivityConverter converter(kClock);
  const auto record = kernel_record("_Z4gemmPfS_", 7, 1'000'010'000ull, 1'000'030'500ull);
  ActivityRecord out;
  ASSERT_TRUE(converter.convert(as_activity(&record), &out));
  EXPECT_EQ(out.kind, ActivityKind::Kernel);
  EXPECT_EQ(out.name, "_Z4gemmPfS_");
  EXPECT_EQ(out.device, 3);
  EXPECT_EQ(out.stream, 7u);
  EXPECT_DOUBLE_EQ(out.start_us, 5010.0);
  EXPECT_DOUBLE_EQ(out.end_us, 5030.5);
  EXPECT_EQ(out.correlation, 77u);
  EXPECT_EQ(out.grid_blocks, 8);
  EXPECT_EQ(out.bytes, 0u);
}

TEST(Convert, NcclKernelIsCommunication) {
  const ActivityConverter converter(kClock);
  const auto record = kernel_record("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 9,
                                    1'000'000'000ull, 1'000'100'000ull);
  ActivityRecord out;
  ASSERT_TRUE(converter.convert(as_activity(&record), &out));
  EXPECT_EQ(out.kind, ActivityKind::Comm);
  EXPECT_DOUBLE_EQ(out.end_us - out.start_us, 100.0);
}

TEST(Convert, KernelOnFillStreamIsFill) {
  ActivityConverter converter(kClock);
  converter.add_fill_stream(/*context*/ 2, /*stream*/ 12);
  auto fill = kernel_record("spin_items_kernel", 12, 1'000'000'000ull, 1'000'000'100ull);
  fill.contextId = 2;
  auto main = kernel_record("spin_items_kernel", 13, 1'000'000'000ull, 1'000'000'100ull);
  main.contextId = 2;
  ActivityRecord out;
  ASSERT_TRUE(converter.convert(as_activity(&fill), &out));
  EXPECT_EQ(out.kind, ActivityKind::Fill);
  ASSERT_TRUE(converter.convert(as_activity(&main), &out));
  EXPECT_EQ(out.kind, ActivityKind::Kernel);
}

// CUPTI stream ids are unique per context only: the green context's fill stream and a primary-
// context main stream can both be stream 12. Matching on the stream id alone called the main
// job's kernel fill work.
TEST(Convert, SameStreamIdInAnotherContextIsNotFill) {
  ActivityConverter converter(kClock);
  converter.add_fill_stream(/*context*/ 5, /*stream*/ 12);
  auto green = kernel_record("spin_items_kernel", 12, 1'000'000'000ull, 1'000'000'100ull);
  green.contextId = 5;
  auto primary = kernel_record("_Z4gemmPfS_", 12, 1'000'000'000ull, 1'000'000'100ull);
  primary.contextId = 1;
  ActivityRecord out;
  ASSERT_TRUE(converter.convert(as_activity(&primary), &out));
  EXPECT_EQ(out.kind, ActivityKind::Kernel);
  ASSERT_TRUE(converter.convert(as_activity(&green), &out));
  EXPECT_EQ(out.kind, ActivityKind::Fill);
  EXPECT_TRUE(converter.is_fill_stream(5, 12));
  EXPECT_FALSE(converter.is_fill_stream(1, 12));
  EXPECT_FALSE(converter.is_fill_stream(5, 13));
}

TEST(Convert, LegacyKernelKindUsesSameLayout) {
  const ActivityConverter converter(kClock);
  auto record = kernel_record("k", 1, 1'000'000'000ull, 1'000'002'000ull);
  record.kind = CUPTI_ACTIVITY_KIND_KERNEL;
  ActivityRecord out;
  ASSERT_TRUE(converter.convert(as_activity(&record), &out));
  EXPECT_EQ(out.kind, ActivityKind::Kernel);
  EXPECT_DOUBLE_EQ(out.end_us, 5002.0);
}

TEST(Convert, MalformedKernelsAreDropped) {
  const ActivityConverter converter(kClock);
  ActivityRecord out;
  out.name = "untouched";
  auto no_name = kernel_record(nullptr, 1, 1'000'000'000ull, 1'000'000'100ull);
  EXPECT_FALSE(converter.convert(as_activity(&no_name), &out));
  auto backwards = kernel_record("k", 1, 1'000'000'100ull, 1'000'000'000ull);
  EXPECT_FALSE(converter.convert(as_activity(&backwards), &out));
  EXPECT_EQ(out.name, "untouched");
}

TEST(Convert, Memcpy) {
  const ActivityConverter converter(kClock);
  CuptiMemcpyRecord record;
  std::memset(&record, 0, sizeof record);
  record.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  record.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_DTOH;
  record.bytes = 1 << 20;
  record.start = 1'000'002'000ull;
  record.end = 1'000'004'000ull;
  record.deviceId = 1;
  record.streamId = 5;
  record.correlationId = 9;
  ActivityRecord out;
  ASSERT_TRUE(converter.convert(as_activity(&record), &out));
  EXPECT_EQ(out.kind, ActivityKind::Memcpy);
  EXPECT_EQ(out.name, "Memcpy DtoH");
  EXPECT_EQ(out.bytes, 1u << 20);
  EXPECT_DOUBLE_EQ(out.start_us, 5002.0);
  EXPECT_DOUBLE_EQ(out.end_us, 5004.0);
  EXPECT_EQ(out.device, 1);
  EXPECT_EQ(out.stream, 5u);
  EXPECT_EQ(out.correlation, 9u);
}

TEST(Convert, MemcpyKindNames) {
  EXPECT_STREQ(memcpy_kind_name(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD), "Memcpy HtoD");
  EXPECT_STREQ(memcpy_kind_name(CUPTI_ACTIVITY_MEMCPY_KIND_DTOD), "Memcpy DtoD");
  EXPECT_STREQ(memcpy_kind_name(CUPTI_ACTIVITY_MEMCPY_KIND_PTOP), "Memcpy PtoP");
  EXPECT_STREQ(memcpy_kind_name(200), "Memcpy");
}

TEST(Convert, Memset) {
  const ActivityConverter converter(kClock);
  CuptiMemsetRecord record;
  std::memset(&record, 0, sizeof record);
  record.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  record.bytes = 4096;
  record.start = 1'000'000'000ull;
  record.end = 1'000'000'500ull;
  record.streamId = 2;
  ActivityRecord out;
  ASSERT_TRUE(converter.convert(as_activity(&record), &out));
  EXPECT_EQ(out.kind, ActivityKind::Memset);
  EXPECT_EQ(out.bytes, 4096u);
  EXPECT_DOUBLE_EQ(out.end_us, 5000.5);
}

TEST(Convert, MemoryAllocationAndRelease) {
  const ActivityConverter converter(kClock);
  CuptiMemoryRecord record;
  std::memset(&record, 0, sizeof record);
  record.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
  record.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
  record.bytes = 256 << 20;
  record.timestamp = 1'000'003'000ull;
  record.deviceId = 0;
  ActivityRecord out;
  ASSERT_TRUE(converter.convert(as_activity(&record), &out));
  EXPECT_EQ(out.kind, ActivityKind::MemoryAlloc);
  EXPECT_EQ(out.bytes, 256u << 20);
  EXPECT_DOUBLE_EQ(out.start_us, 5003.0);
  EXPECT_DOUBLE_EQ(out.end_us, 5003.0);

  record.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
  ASSERT_TRUE(converter.convert(as_activity(&record), &out));
  EXPECT_EQ(out.kind, ActivityKind::MemoryFree);

  record.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_INVALID;
  EXPECT_FALSE(converter.convert(as_activity(&record), &out));
}

TEST(Convert, UnusedKindsAreIgnored) {
  const ActivityConverter converter(kClock);
  CuptiKernelRecord record = kernel_record("k", 1, 0, 1);
  record.kind = CUPTI_ACTIVITY_KIND_DRIVER;
  ActivityRecord out;
  EXPECT_FALSE(converter.convert(as_activity(&record), &out));
}

}  // namespace
}  // namespace pipefill::cuda
