// Shared setup of the GPU microbenchmarks: one CUDA device (its fill partition and fill stream),
// a primary-context low-priority stream for the naive and grid-cap variants, a high-priority
// main stream, slice words, and a main() that skips cleanly without a GPU. Each benchmark runs the
// baseline and PipeFill's mechanism in the same process and prints the ratio at the end.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "core/config.hpp"
#include "device/device.hpp"
#include "fill_kernels.hpp"

namespace pipefill::cuda::bench {

inline void die(const char* what) {
  std::fprintf(stderr, "benchmark setup failed: %s: %s\n", what, pipefill::last_error_message().c_str());
  std::exit(1);
}
#define BENCH_OK(expr) \
  do {                 \
    if ((expr) != pfSuccess) ::pipefill::cuda::bench::die(#expr); \
  } while (0)
#define BENCH_CUDA(expr) \
  do {                   \
    const cudaError_t e_ = (expr); \
    if (e_ != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorName(e_)); std::exit(1); } \
  } while (0)

struct GpuContext {
  std::unique_ptr<Device> device;
  FillPartition partition;
  Stream fill = nullptr;        // the device's fill stream (green context when available)
  cudaStream_t plain_fill = nullptr;  // primary context, lowest priority
  Stream main = nullptr;        // highest priority
  uint64_t* words = nullptr;    // gate, cursor, budget
  uint64_t* stamps = nullptr;   // [0]: bubble end; [1..]: per-block records
  size_t fill_smem = 0;         // dynamic smem that makes a fill block own its SM
  int sms = 0;
  // Host-mapped flag a "bubble" kernel sets when it starts (see start_bubble_kernel).
  volatile uint32_t* started_host = nullptr;
  uint32_t* started_device = nullptr;

  uint64_t* gate() const { return &words[0]; }
  uint64_t* cursor() const { return &words[1]; }
  uint64_t* budget() const { return &words[2]; }

  void reset_words() {
    BENCH_CUDA(cudaMemset(words, 0, 3 * sizeof(uint64_t)));
    BENCH_CUDA(cudaDeviceSynchronize());
  }
  // Launches the bubble's 1-block wait kernel on the main stream and returns once it is resident
  // on an SM. Fill blocks that each own an SM must start after it: launched first they take
  // every SM, the wait kernel never starts, and the gate write queued behind it never runs.
  pfResult_t start_bubble_kernel(uint64_t ns, uint64_t* end_ns) {
    *started_host = 0;
    PF_TRY(launch_spin_and_stamp(main, ns, end_ns, started_device));
    return wait_for_flag(started_host, 1e6, "the bubble's wait kernel");
  }
  std::vector<uint64_t> read(const uint64_t* device_words, size_t count) const {
    std::vector<uint64_t> host(count);
    BENCH_CUDA(cudaMemcpy(host.data(), device_words, count * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    return host;
  }
};

inline GpuContext& gpu() {
  static GpuContext context = [] {
    GpuContext c;
    RuntimeOptions options;
    BENCH_OK(make_cuda_device(options, &c.device));
    BENCH_OK(c.device->configure_partition(-1, &c.partition));
    BENCH_OK(c.device->create_fill_stream(&c.fill));
    int lowest = 0, highest = 0;
    BENCH_OK(c.device->priority_range(&lowest, &highest));
    BENCH_OK(c.device->create_stream(highest, &c.main));
    BENCH_CUDA(cudaStreamCreateWithPriority(&c.plain_fill, cudaStreamNonBlocking, lowest));
    BENCH_OK(c.device->allocate_words(3, &c.words));
    c.sms = c.device->sm_count();
    BENCH_OK(c.device->allocate_words(static_cast<size_t>(4 * c.sms + 8), &c.stamps));
    BENCH_OK(max_dynamic_smem_per_block(&c.fill_smem));
    c.fill_smem -= 1024;  // leave room for the static item word
    BENCH_OK(warm_up_fill_kernels(c.plain_fill));
    void* flag = nullptr;
    BENCH_CUDA(cudaHostAlloc(&flag, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
    c.started_host = static_cast<volatile uint32_t*>(flag);
    *c.started_host = 0;
    void* device_flag = nullptr;
    BENCH_CUDA(cudaHostGetDevicePointer(&device_flag, flag, 0));
    c.started_device = static_cast<uint32_t*>(device_flag);
    return c;
  }();
  return context;
}

// Results recorded by the benchmarks, printed as ratios after the run.
inline std::map<std::string, double>& results() {
  static std::map<std::string, double> values;
  return values;
}

inline void print_ratio(const char* what, const std::string& baseline, const std::string& ours) {
  auto& r = results();
  if (!r.count(baseline) || !r.count(ours) || r[ours] <= 0) return;
  std::printf("RATIO %-44s baseline %-22s %10.2f | ours %-22s %10.2f | baseline/ours %.2fx\n", what,
              baseline.c_str(), r[baseline], ours.c_str(), r[ours], r[baseline] / r[ours]);
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace pipefill::cuda::bench

// main(): skips (exit 0, one line) without a GPU, else runs the benchmarks and the summary.
#define PIPEFILL_GPU_BENCHMARK_MAIN(summary)                                          \
  int main(int argc, char** argv) {                                                   \
    if (pipefill::cuda_device_count() == 0) {                                         \
      std::printf("SKIPPED: no CUDA device (this benchmark needs a GPU)\n");          \
      return 0;                                                                       \
    }                                                                                 \
    benchmark::Initialize(&argc, argv);                                               \
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;                 \
    benchmark::RunSpecifiedBenchmarks();                                              \
    benchmark::Shutdown();                                                            \
    summary();                                                                        \
    return 0;                                                                         \
  }
