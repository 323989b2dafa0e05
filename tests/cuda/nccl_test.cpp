// NCCL send/recv between two GPUs while ticket fill kernels run on both (skips with < 2 GPUs).
// It checks the property the SM reservation exists for: the main job's communication completes
// with fill blocks resident, and the fill work still runs every item exactly once.
#include <vector>

#include "gpu_harness.hpp"
#ifdef PIPEFILL_WITH_NCCL
#include <nccl.h>
#endif

namespace pipefill::cuda::testing {
namespace {

#ifdef PIPEFILL_WITH_NCCL
TEST(CudaNccl, SendRecvCompletesWhileFillKernelsRun) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  constexpr int kRanks = 2;
  constexpr size_t kFloats = size_t{1} << 22;  // 16 MiB
  constexpr uint64_t kItems = 20000;
  std::unique_ptr<Device> devices[kRanks];
  Stream fill[kRanks] = {}, main[kRanks] = {};
  uint64_t* words[kRanks] = {};
  std::vector<std::unique_ptr<DeviceArray<uint32_t>>> runs;
  std::vector<std::unique_ptr<DeviceArray<float>>> buffers;
  FillPartition partitions[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    RuntimeOptions options;
    options.device = r;
    PF_ASSERT_OK(make_cuda_device(options, &devices[r]));
    PF_ASSERT_OK(devices[r]->configure_partition(-1, &partitions[r]));
    PF_ASSERT_OK(devices[r]->create_fill_stream(&fill[r]));
    int lowest = 0, highest = 0;
    PF_ASSERT_OK(devices[r]->priority_range(&lowest, &highest));
    PF_ASSERT_OK(devices[r]->create_stream(highest, &main[r]));
    PF_ASSERT_OK(devices[r]->allocate_words(3, &words[r]));
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    runs.push_back(std::make_unique<DeviceArray<uint32_t>>(kItems));
    buffers.push_back(std::make_unique<DeviceArray<float>>(kFloats));
  }
  ASSERT_TRUE(buffers[0]->fill(std::vector<float>(kFloats, 3.5f)));
  ncclComm_t comms[kRanks];
  const int ordinals[kRanks] = {0, 1};
  ASSERT_EQ(ncclCommInitAll(comms, kRanks, ordinals), ncclSuccess);

  // Fill first (resident on every fill SM), then the main job's transfer.
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    pfSliceDesc_t s{};
    s.bubble_id = 1;
    s.max_items = kItems;
    s.total_items = kItems;
    s.max_blocks = partitions[r].fill_sms;
    s.gate = &words[r][0];
    s.cursor = &words[r][1];
    s.budget_counter = &words[r][2];
    SpinItemsParams params;
    params.item_ns = 20'000;
    params.records.item_runs = runs[r]->get();
    PF_ASSERT_OK(launch_spin_items(s, fill[r], params));
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(buffers[0]->get(), kFloats, ncclFloat, 1, comms[0], static_cast<cudaStream_t>(main[0])),
            ncclSuccess);
  ASSERT_EQ(ncclRecv(buffers[1]->get(), kFloats, ncclFloat, 0, comms[1], static_cast<cudaStream_t>(main[1])),
            ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  // The transfer ends the bubble: close both gates behind it.
  for (int r = 0; r < kRanks; ++r) PF_ASSERT_OK(devices[r]->write_word(main[r], &words[r][0], 1));
  for (int r = 0; r < kRanks; ++r) {
    PF_ASSERT_OK(devices[r]->synchronize_stream(main[r]));
    PF_ASSERT_OK(devices[r]->synchronize_stream(fill[r]));
  }
  for (float v : buffers[1]->to_host()) ASSERT_EQ(v, 3.5f);
  for (int r = 0; r < kRanks; ++r) {
    uint64_t cursor = 0;
    ASSERT_EQ(cudaMemcpy(&cursor, &words[r][1], sizeof cursor, cudaMemcpyDeviceToHost), cudaSuccess);
    const auto host = runs[r]->to_host();
    for (uint64_t i = 0; i < kItems; ++i) ASSERT_EQ(host[i], i < cursor ? 1u : 0u) << "rank " << r << " item " << i;
  }
  for (auto& comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  runs.clear();
  buffers.clear();
}
#endif

}  // namespace
}  // namespace pipefill::cuda::testing
