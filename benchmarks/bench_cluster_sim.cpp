// Cluster simulator speed: the 40B scale config (configs/llm40b_scale.json, 1F1B) at 1K-8K GPUs
// x 1000 iterations with the fill-job queue, against the schedule-only baseline (same loop over
// GPUs, iterations and bubbles, filling disabled) in the same run. Target (design brief):
// 8192 GPUs x 1000 iterations with a fill-job queue in <= 10 s on 2 cores.
// Then the fill strategies side by side (issue 11: no fill, naive, FreeRide, Tally, the
// PipeFill paper's style, ours) on the same config at 8192 GPUs, with the ratios to ours, the
// interference sensitivity table and the targets printed as met / missed (never asserted).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "cluster/cluster_sim.hpp"
#include "cluster/compare.hpp"
#include "cluster/config_io.hpp"
#include "common/error.hpp"

using namespace pipefill;
using namespace pipefill::cluster;

namespace {

constexpr int kIterations = 1000;
std::map<int, double> g_baseline_s, g_fill_s;

bool load(int gpus, bool fill, ClusterSimSpec* spec) {
  SimConfig cfg;
  if (load_sim_config(std::string(PIPEFILL_SOURCE_DIR) + "/configs/llm40b_scale.json", &cfg) != pfSuccess) return false;
  cfg.sim.training.schedule = schedule::ScheduleKind::OneFOneB;
  cfg.sim.iterations = kIterations;
  cfg.sim.fill.enabled = fill;
  if (set_gpu_count(&cfg.sim.training, gpus) != pfSuccess) return false;
  *spec = std::move(cfg.sim);
  return true;
}

void run(benchmark::State& state, bool fill) {
  const int gpus = static_cast<int>(state.range(0));
  ClusterSimSpec spec;
  if (!load(gpus, fill, &spec)) {
    state.SkipWithError(last_error_message().c_str());
    return;
  }
  ClusterResult result;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    if (run_cluster_sim(spec, &result) != pfSuccess) {
      state.SkipWithError(last_error_message().c_str());
      return;
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(result.fill_work_dedicated_us);
  }
  const double gpu_iterations = static_cast<double>(gpus) * kIterations;
  state.counters["ns_per_gpu_iteration"] = seconds * 1e9 / gpu_iterations;
  state.counters["run_s"] = seconds;
  (fill ? g_fill_s : g_baseline_s)[gpus] = seconds;
  if (fill) {
    state.counters["jobs_completed"] = static_cast<double>(result.jobs_completed);
    state.counters["slices"] = static_cast<double>(result.slices);
    if (g_baseline_s.count(gpus)) state.counters["x_vs_schedule_only"] = seconds / g_baseline_s[gpus];
  }
}

void BM_ScheduleOnly(benchmark::State& state) { run(state, false); }
void BM_WithFillQueue(benchmark::State& state) { run(state, true); }

}  // namespace

// Registered baseline first so the ratio counter of the filled run can refer to it.
BENCHMARK(BM_ScheduleOnly)->Arg(1024)->Arg(2048)->Arg(4096)->Arg(8192)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WithFillQueue)->Arg(1024)->Arg(2048)->Arg(4096)->Arg(8192)->Iterations(1)->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("\n%8s %14s %14s %8s %16s\n", "GPUs", "schedule-only", "with fill", "ratio", "fill ns/GPU-iter");
  for (const auto& [gpus, fill_s] : g_fill_s) {
    const double base = g_baseline_s.count(gpus) ? g_baseline_s[gpus] : 0.0;
    std::printf("%8d %12.3f s %12.3f s %7.2fx %16.1f\n", gpus, base, fill_s, base > 0 ? fill_s / base : 0.0,
                fill_s * 1e9 / (static_cast<double>(gpus) * kIterations));
  }
  if (g_fill_s.count(8192))
    std::printf("[%s] 8192 GPUs x %d iterations with the fill-job queue: %.2f s (target <= 10 s)\n",
                g_fill_s[8192] <= 10.0 ? "met   " : "MISSED", kIterations, g_fill_s[8192]);

  // The side-by-side comparison (PIPEFILL_BENCH_COMPARE_ITERATIONS, default 100, 0 skips it).
  int compare_iterations = 100;
  if (const char* env = std::getenv("PIPEFILL_BENCH_COMPARE_ITERATIONS")) compare_iterations = std::atoi(env);
  if (compare_iterations > 0) {
    ClusterSimSpec spec;
    if (!load(8192, true, &spec)) {
      std::printf("comparison skipped: %s\n", last_error_message().c_str());
      return 1;
    }
    spec.iterations = compare_iterations;
    Comparison c;
    if (run_comparison(spec, true, &c) != pfSuccess) {
      std::printf("comparison failed: %s\n", last_error_message().c_str());
      return 1;
    }
    std::printf("\n%s", comparison_report(c).c_str());
  }
  return 0;
}
