// GPU checks of the fill partition's size (issue 33 items 1 and 6). Item 1: one captured GEMM
// item timed inside the fill partition with and without cublasSetSmCountTarget(fill SMs). Without
// the target cuBLAS may pick a persistent kernel whose grid is the whole device's SM count, which
// runs as a second wave inside a smaller green context. Prints both medians and their ratio (a
// measurement, not an assertion: speed is never asserted); asserts that both items compute the
// right product. Item 6: the partition's cluster occupancy next to the whole device's (printed).
// Skip without a GPU.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "gpu_harness.hpp"
#include "opaque_gemm.hpp"

namespace pipefill::cuda::testing {
namespace {

class GemmPartition : public CudaGpu {
 protected:
  // Median time of `runs` launches of `item` on the fill stream (bubble 1, gate 0: every item runs).
  double median_item_us(GemmItem& item, int runs) {
    Event start = nullptr, stop = nullptr;
    EXPECT_EQ(device_->create_event(&start), pfSuccess);
    EXPECT_EQ(device_->create_event(&stop), pfSuccess);
    std::vector<double> samples;
    EXPECT_EQ(item.launch(fill_, 1), pfSuccess) << last_error_message();  // warm-up launch
    for (int run = 0; run < runs; ++run) {
      EXPECT_EQ(device_->record_event(start, fill_), pfSuccess);
      EXPECT_EQ(item.launch(fill_, 1), pfSuccess) << last_error_message();
      EXPECT_EQ(device_->record_event(stop, fill_), pfSuccess);
      EXPECT_EQ(device_->synchronize_event(stop), pfSuccess);
      bool done = false;
      double t0 = 0.0, t1 = 0.0;
      EXPECT_EQ(device_->query_event(start, &done, &t0), pfSuccess);
      EXPECT_EQ(device_->query_event(stop, &done, &t1), pfSuccess);
      samples.push_back(t1 - t0);
    }
    (void)device_->destroy_event(start);
    (void)device_->destroy_event(stop);
    std::sort(samples.begin(), samples.end());
    return samples.empty() ? 0.0 : samples[samples.size() / 2];
  }
};

TEST_F(GemmPartition, CapturedGemmItemWithAndWithoutTheSmCountTarget) {
  constexpr int n = 4096;
  DeviceArray<float> a(size_t{n} * n), b(size_t{n} * n), c(size_t{n} * n);
  ASSERT_NE(c.get(), nullptr);
  ASSERT_TRUE(a.fill(std::vector<float>(size_t{n} * n, 1.0f)));
  ASSERT_TRUE(b.fill(std::vector<float>(size_t{n} * n, 0.5f)));
  DeviceArray<uint8_t> workspace(size_t{32} << 20);
  GemmItemDesc desc;
  desc.m = desc.n = desc.k = n;
  desc.a = a.get();
  desc.b = b.get();
  desc.c = c.get();
  desc.workspace = workspace.get();
  desc.workspace_bytes = size_t{32} << 20;
  desc.gate = gate();
  desc.measure_runs = 3;
  PF_ASSERT_OK(device_->write_word(fill_, gate(), 0));
  double median_us[2] = {0.0, 0.0};
  for (int with_target = 0; with_target < 2; ++with_target) {
    desc.sm_count_target = with_target ? partition_.fill_sms : 0;
    std::unique_ptr<GemmItem> item;
    PF_ASSERT_OK(make_gemm_item(desc, fill_, &item));
    if (!item->conditional()) GTEST_SKIP() << "no conditional graph (driver < 12.4): the item is not captured";
    ASSERT_TRUE(c.fill(std::vector<float>(size_t{n} * n, -1.0f)));
    median_us[with_target] = median_item_us(*item, 9);
    sync_all();
    const std::vector<float> result = c.to_host();
    ASSERT_FALSE(result.empty());
    EXPECT_EQ(result.front(), 0.5f * n);
    EXPECT_EQ(result.back(), 0.5f * n);
  }
  std::printf("GEMM %dx%dx%d captured item in the fill partition (%s, %d of %d SMs): %.1f us without "
              "cublasSetSmCountTarget, %.1f us with target %d (ratio with/without %.3f)\n",
              n, n, n, partition_.mode.c_str(), partition_.fill_sms, partition_.total_sms, median_us[0],
              median_us[1], partition_.fill_sms, median_us[0] > 0 ? median_us[1] / median_us[0] : 0.0);
}

TEST_F(CudaGpu, ClusterOccupancyOfTheFillPartition) {
  const ClusterOccupancy clusters = extras().cluster_occupancy();
  ASSERT_EQ(clusters.cluster_size, 2);
  EXPECT_GT(clusters.device, 0) << "the occupancy query failed (see the log)";
  EXPECT_GT(clusters.fill_partition, 0);
  EXPECT_LE(clusters.fill_partition, clusters.device);
  std::printf("cluster occupancy (clusters of %d blocks): fill partition (%s, %d of %d SMs) %d, whole device %d\n",
              clusters.cluster_size, partition_.mode.c_str(), partition_.fill_sms, partition_.total_sms,
              clusters.fill_partition, clusters.device);
}

}  // namespace
}  // namespace pipefill::cuda::testing
