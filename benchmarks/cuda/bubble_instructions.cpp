// Host cost of the bubble instructions on a GPU: what pfBubbleBegin + pfBubbleEnd enqueue
// (begin event; gate write + end event) against the raw stream operations a hand-written
// engine would need anyway (two cudaEventRecord). Target: no more than the raw operations
// (~3 µs). Also the full C API path (pfBubbleBegin/End on a CUDA runtime with no jobs).
#include <chrono>

#include "gpu_bench_common.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cuda::bench {
namespace {

constexpr int kBatch = 256;  // instructions per timed batch; the stream is drained between batches

double ns_per_pair(benchmark::State& state, const std::chrono::steady_clock::duration& elapsed) {
  return std::chrono::duration<double, std::nano>(elapsed).count() / kBatch;
}

void BM_RawTwoEventRecords(benchmark::State& state) {
  GpuContext& g = gpu();
  cudaEvent_t begin = nullptr, end = nullptr;
  BENCH_CUDA(cudaEventCreate(&begin));
  BENCH_CUDA(cudaEventCreate(&end));
  std::vector<double> samples;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) {
      BENCH_CUDA(cudaEventRecord(begin, static_cast<cudaStream_t>(g.main)));
      BENCH_CUDA(cudaEventRecord(end, static_cast<cudaStream_t>(g.main)));
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    samples.push_back(ns_per_pair(state, elapsed));
    state.SetIterationTime(std::chrono::duration<double>(elapsed).count() / kBatch);
    state.PauseTiming();
    BENCH_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(g.main)));
    state.ResumeTiming();
  }
  results()["raw_two_event_records_ns"] = median(samples);
  BENCH_CUDA(cudaEventDestroy(begin));
  BENCH_CUDA(cudaEventDestroy(end));
}
BENCHMARK(BM_RawTwoEventRecords)->Iterations(200)->UseManualTime()->Unit(benchmark::kNanosecond);

// Exactly what the runtime's begin/end enqueue through the device interface.
void BM_DeviceBeginEnd(benchmark::State& state) {
  GpuContext& g = gpu();
  Event begin = nullptr, end = nullptr;
  BENCH_OK(g.device->create_event(&begin));
  BENCH_OK(g.device->create_event(&end));
  std::vector<double> samples;
  uint64_t bubble = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) {
      BENCH_OK(g.device->record_event(begin, g.main));
      BENCH_OK(g.device->write_word(g.main, g.gate(), ++bubble));
      BENCH_OK(g.device->record_event(end, g.main));
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    samples.push_back(ns_per_pair(state, elapsed));
    state.SetIterationTime(std::chrono::duration<double>(elapsed).count() / kBatch);
    state.PauseTiming();
    BENCH_OK(g.device->synchronize_stream(g.main));
    state.ResumeTiming();
  }
  results()["device_begin_end_ns"] = median(samples);
  BENCH_OK(g.device->destroy_event(begin));
  BENCH_OK(g.device->destroy_event(end));
}
BENCHMARK(BM_DeviceBeginEnd)->Iterations(200)->UseManualTime()->Unit(benchmark::kNanosecond);

// The whole C API (bubble tracker, executor hand-off) on a CUDA runtime without jobs.
void BM_CApiBeginEnd(benchmark::State& state) {
  GpuContext& g = gpu();
  pfConfig_t config = PF_CONFIG_INITIALIZER;
  config.backend = pfBackendCuda;
  config.arena_bytes = size_t{64} << 20;
  pfRuntime_t runtime = nullptr;
  if (pfRuntimeCreate(&config, &runtime) != pfSuccess) {
    state.SkipWithError(pfGetLastErrorMessage());
    return;
  }
  std::vector<double> samples;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) {
      if (pfBubbleBegin(runtime, g.main, nullptr) != pfSuccess || pfBubbleEnd(runtime, g.main) != pfSuccess) {
        state.SkipWithError(pfGetLastErrorMessage());
        break;
      }
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    samples.push_back(ns_per_pair(state, elapsed));
    state.SetIterationTime(std::chrono::duration<double>(elapsed).count() / kBatch);
    state.PauseTiming();
    (void)pfIterationEnd(runtime);
    (void)pfRuntimeSynchronize(runtime);
    state.ResumeTiming();
  }
  results()["capi_begin_end_ns"] = median(samples);
  (void)pfRuntimeSynchronize(runtime);
  (void)pfRuntimeDestroy(runtime);
}
BENCHMARK(BM_CApiBeginEnd)->Iterations(50)->UseManualTime()->Unit(benchmark::kNanosecond);

void summary() {
  print_ratio("begin+end host cost (ns): device interface", "raw_two_event_records_ns", "device_begin_end_ns");
  print_ratio("begin+end host cost (ns): C API", "raw_two_event_records_ns", "capi_begin_end_ns");
  std::printf("(baseline/ours >= 1.0 means the bubble instructions cost no more than two raw event records)\n");
}

}  // namespace
}  // namespace pipefill::cuda::bench

PIPEFILL_GPU_BENCHMARK_MAIN(pipefill::cuda::bench::summary)
