// A/B of the fill partition in the style of NVIDIA holohub's green-context benchmark (issue 33
// item 7): the same kernels on non-default streams, with and without the partition.
//   critical side: short kernels (5 us, one block) on the high-priority main stream, launched one
//                  at a time with ~100 us host gaps (a trainer's latency-sensitive kernels);
//   other side:    back-to-back kernels whose blocks each own an SM (maximum shared memory,
//                  300 us per block, one block per SM of the device) on a low-priority stream:
//                  "shared" - a primary-context stream, no partition;
//                  "partition" - the device's fill stream (the green context when the driver has
//                  one, else the same primary-context stream: grid-cap mode caps grids, not SMs).
//   "alone": the critical side with nothing beside it.
// CUPTI (RUNTIME + CONCURRENT_KERNEL activity, joined on the correlation id) gives each critical
// kernel's launch -> start latency: avg, p50/p95/p99, max per variant; the other side's slowdown is
// its kernels' median duration with the partition over without. Prints "SKIPPED" without a GPU and
// says so when CUPTI cannot start (another subscriber, no CUPTI library).
#include <cupti.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cupti_api.hpp"
#include "cupti_convert.hpp"
#include "gpu_bench_common.hpp"

namespace pipefill::cuda::bench {
namespace {

constexpr int kCriticalLaunches = 300;
constexpr uint64_t kCriticalNs = 5'000;
constexpr uint64_t kOtherBlockNs = 300'000;
constexpr int kOtherKernels = 80;

// Launch API start times and kernel records of the current variant, by correlation id.
struct Activity {
  std::mutex mutex;
  std::map<uint32_t, uint64_t> api_start_ns;
  std::vector<CuptiKernelRecord> kernels;  // name pointers stay valid (CUPTI owns the strings)
};
Activity& activity() {
  static Activity a;
  return a;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, size_t{8} << 20));
  *size = *buffer ? size_t{8} << 20 : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  CUpti_Activity* record = nullptr;
  Activity& a = activity();
  std::lock_guard lock(a.mutex);
  while (cupti_api().cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto& api = reinterpret_cast<const CUpti_ActivityAPI&>(*record);
      a.api_start_ns[api.correlationId] = api.start;
    } else if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      a.kernels.push_back(reinterpret_cast<const CuptiKernelRecord&>(*record));
    }
  }
  std::free(buffer);
}

pfResult_t start_cupti() {
  if (!cupti_api().ok) return fail(pfErrorCuptiFailure, "{}", cupti_api().error);
  PF_CUPTI_CHECK(cuptiActivityRegisterCallbacks, (buffer_requested, buffer_completed));
  PF_CUPTI_CHECK(cuptiActivityEnable, (CUPTI_ACTIVITY_KIND_RUNTIME));
  PF_CUPTI_CHECK(cuptiActivityEnable, (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  return pfSuccess;
}

struct Distribution {
  size_t n = 0;
  double avg = 0, p50 = 0, p95 = 0, p99 = 0, max = 0;
};
Distribution distribution(std::vector<double> v) {
  Distribution d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  d.n = v.size();
  for (double x : v) d.avg += x;
  d.avg /= static_cast<double>(v.size());
  const auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))]; };
  d.p50 = at(0.50);
  d.p95 = at(0.95);
  d.p99 = at(0.99);
  d.max = v.back();
  return d;
}

struct VariantResult {
  Distribution launch_to_start_us;
  double other_median_us = 0;
};

// One variant: the other side's kernels enqueued first (if any), then the critical launches.
VariantResult run_variant(GpuContext& g, cudaStream_t other) {
  BENCH_CUDA(cudaDeviceSynchronize());
  if (cupti_api().cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) != CUPTI_SUCCESS) die("cuptiActivityFlushAll");
  {
    std::lock_guard lock(activity().mutex);
    activity().api_start_ns.clear();
    activity().kernels.clear();
  }
  if (other != nullptr)
    for (int k = 0; k < kOtherKernels; ++k)
      BENCH_OK(launch_stamp_blocks(other, g.sms, 128, g.fill_smem, kOtherBlockNs, nullptr, nullptr));
  for (int i = 0; i < kCriticalLaunches; ++i) {
    BENCH_OK(launch_spin_and_stamp(g.main, kCriticalNs, nullptr));
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  if (cupti_api().cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) != CUPTI_SUCCESS) die("cuptiActivityFlushAll");
  VariantResult result;
  std::vector<double> latency, other_us;
  std::lock_guard lock(activity().mutex);
  for (const CuptiKernelRecord& kernel : activity().kernels) {
    const std::string name = kernel.name != nullptr ? kernel.name : "";
    if (name.find("spin_and_stamp") != std::string::npos) {
      const auto api = activity().api_start_ns.find(kernel.correlationId);
      if (api != activity().api_start_ns.end() && kernel.start >= api->second)
        latency.push_back(static_cast<double>(kernel.start - api->second) / 1000.0);
    } else if (name.find("stamp_blocks") != std::string::npos) {
      other_us.push_back(static_cast<double>(kernel.end - kernel.start) / 1000.0);
    }
  }
  result.launch_to_start_us = distribution(latency);
  result.other_median_us = median(other_us);
  return result;
}

void print(const char* variant, const VariantResult& r) {
  const Distribution& d = r.launch_to_start_us;
  std::printf("AB %-10s critical launch->start us: n=%zu avg %.2f p50 %.2f p95 %.2f p99 %.2f max %.2f | other "
              "side kernel median %.1f us\n",
              variant, d.n, d.avg, d.p50, d.p95, d.p99, d.max, r.other_median_us);
}

int run() {
  GpuContext& g = gpu();
  if (start_cupti() != pfSuccess) {
    std::printf("AB SKIPPED: CUPTI could not start (%s)\n", last_error_message().c_str());
    return 0;
  }
  BENCH_OK(warm_up_fill_kernels(g.fill));
  (void)run_variant(g, nullptr);  // warm-up: lazy loading, first launches
  const VariantResult alone = run_variant(g, nullptr);
  const VariantResult shared = run_variant(g, g.plain_fill);
  const VariantResult partition = run_variant(g, static_cast<cudaStream_t>(g.fill));
  print("alone", alone);
  print("shared", shared);
  print("partition", partition);
  const double p99_ratio = partition.launch_to_start_us.p99 > 0 ? shared.launch_to_start_us.p99 / partition.launch_to_start_us.p99 : 0;
  const double slowdown = shared.other_median_us > 0 ? partition.other_median_us / shared.other_median_us : 0;
  std::printf("AB summary: partition %s (%d fill SMs of %d); critical p99 launch->start shared/partition %.2fx; "
              "other side slowdown with the partition %.2fx\n",
              g.partition.mode.c_str(), g.partition.fill_sms, g.partition.total_sms, p99_ratio, slowdown);
  (void)cupti_api().cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
  (void)cupti_api().cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  return 0;
}

}  // namespace
}  // namespace pipefill::cuda::bench

int main() {
  if (pipefill::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (this benchmark needs a GPU)\n");
    return 0;
  }
  return pipefill::cuda::bench::run();
}
