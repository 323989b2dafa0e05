// The example engine's figures, baseline and PipeFill side by side in one run:
//  1. main-job iteration time with no fill / PipeFill / a naive fill stream (ungated, at the
//     main job's priority, no SM reservation), as ratios to no fill (simulated transport);
//  2. fill throughput per bubble-second vs the same job on a dedicated simulated GPU;
//  3. gate-close latency: bubble end -> the main job's next kernel start, for bubbles that end
//     earlier than predicted (PipeFill's gate vs the naive stream);
//  4. the same on a GPU (skipped without one: this executable is built without the engine's
//     CUDA transports; run `pipeline_engine --transport auto --naive` on a GPU instead);
//  5. the peers side by side on one simulated stage (BM_PeersSideBySideSim,
//     engine/peers_single_stage.cpp);
//  6. the peers as fill modes of the multi-stage example engine, their slowdown-vs-filled
//     frontiers and the model's ceiling (BM_PeersEngineSim, engine/peers_engine.cpp).
// Times reported as counters are VIRTUAL (simulated) times; the wall time Google Benchmark
// prints is only the cost of simulating.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "analysis/activity.hpp"
#include "core/predictor.hpp"
#include "sim/sim_world.hpp"
#include "engine/common.hpp"

// The engine and fill jobs are example code (not in pipefill_core); compile them in.
#include "../examples/fill_jobs/reference.cpp"
#include "../examples/fill_jobs/jobs.cpp"
#include "../examples/fill_jobs/gpu_job_stub.cpp"
#include "../examples/pipeline_engine/instructions.cpp"
#include "../examples/pipeline_engine/sender_notice.cpp"
#include "../examples/pipeline_engine/sim_transport.cpp"
#include "../examples/pipeline_engine/host_timeline.cpp"   // engine.cpp's host transport
#include "../examples/pipeline_engine/host_transport.cpp"
#include "../examples/pipeline_engine/stage_stats.cpp"     // engine.cpp's per-stage statistics
#include "../examples/pipeline_engine/engine.cpp"
#include "../examples/pipeline_engine/peers.cpp"
#include "../examples/pipeline_engine/frontier.cpp"
#include "../examples/pipeline_engine/cuda_transport_stub.cpp"

namespace {

using namespace engine;

using namespace engine_bench;

EngineOptions options_for(int schedule, const char* fill) {
  EngineOptions o;
  o.transport = "sim";
  o.iterations = 6;
  o.fill = fill;
  o.keep_every = 0;  // count items; computing inference outputs on the CPU is not the point here
  if (schedule == 1) {
    o.pipeline.kind = pipefill::schedule::ScheduleKind::Interleaved1F1B;
    o.pipeline.chunks = 2;
  }
  return o;
}

// 1. Iteration time: no fill vs PipeFill vs naive, same seed, same engine.
void BM_EngineIterationSim(benchmark::State& state) {
  const int schedule = static_cast<int>(state.range(0));
  const char* fill = state.range(1) == 0 ? "mlp" : state.range(1) == 1 ? "encoder" : "train";
  const EngineOptions o = options_for(schedule, fill);
  RunResult none, filled, naive;
  for (auto _ : state) {
    none = filled = naive = RunResult{};
    for (auto [mode, out] : {std::pair{FillMode::None, &none}, std::pair{FillMode::PipeFill, &filled},
                             std::pair{FillMode::Naive, &naive}}) {
      const Status s = run_engine(o, mode, out);
      if (!s.ok()) {
        state.SkipWithError(s.message.c_str());
        return;
      }
    }
  }
  const size_t warm = 2;  // the predictor's min_samples iterations
  const double t_none = mean_after(none, warm, &IterationResult::time_us);
  const double t_fill = mean_after(filled, warm, &IterationResult::time_us);
  const double t_naive = mean_after(naive, warm, &IterationResult::time_us);
  const double bubble = mean_after(filled, warm, &IterationResult::bubble_us);
  const double filled_us = mean_after(filled, warm, &IterationResult::filled_us);
  state.counters["nofill_ms"] = t_none / 1e3;
  state.counters["pipefill_ms"] = t_fill / 1e3;
  state.counters["naive_ms"] = t_naive / 1e3;
  state.counters["pipefill_ratio"] = t_fill / t_none;
  state.counters["naive_ratio"] = t_naive / t_none;
  state.counters["bubble_pct"] = 100.0 * bubble / (o.pipeline.stages * t_none);
  state.counters["filled_pct"] = 100.0 * filled_us / bubble;
  std::printf("[engine] interference beta %.2f beta_f %.2f gamma %.2f | %-11s fill=%-7s no-fill %.3f ms | PipeFill %.3f ms (x%.4f) | naive %.3f ms "
              "(x%.4f) | bubble %.1f%%, %.1f%% of it filled\n",
              o.interference, o.fill_slowdown, o.comm_slowdown,
              schedule ? "interleaved" : "1f1b", fill, t_none / 1e3, t_fill / 1e3, t_fill / t_none,
              t_naive / 1e3, t_naive / t_none, 100.0 * bubble / (o.pipeline.stages * t_none),
              100.0 * filled_us / bubble);
}
BENCHMARK(BM_EngineIterationSim)
    ->ArgsProduct({{0, 1}, {0, 1, 2}})
    ->ArgNames({"interleaved", "fill"})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// 2. Items per bubble-second vs the same job alone on a dedicated simulated GPU (all SMs).
void BM_FillThroughputVsDedicated(benchmark::State& state) {
  const char* fill = state.range(0) == 0 ? "mlp" : "encoder";
  EngineOptions o = options_for(0, fill);
  RunResult filled;
  double dedicated_per_us = 0.0;
  for (auto _ : state) {
    filled = RunResult{};
    Status s = run_engine(o, FillMode::PipeFill, &filled);
    if (!s.ok()) {
      state.SkipWithError(s.message.c_str());
      return;
    }
    // Dedicated GPU: the job's items back to back on every SM of an otherwise idle device.
    fjParams_t p;
    fjParamsInit(&p, parse_fill_kind(fill), pfBackendSim);
    fjJob_t job = nullptr;
    fjJobCreate(&p, &job);
    double cost = 0;
    fjJobItemCost(job, &cost);
    fjJobDestroy(job);
    pfSimWorld_t world = nullptr;
    pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
    desc.sm_count = o.pipeline.sm_count;
    void* stream = nullptr;
    const uint64_t items = 100 * static_cast<uint64_t>(o.pipeline.sm_count);
    if (pfSimWorldCreate(1, &desc, 1, &world) != pfSuccess ||
        pfSimStreamCreate(world, 0, 0, &stream) != pfSuccess ||
        pfSimLaunchOpaque(stream, 0, items, o.pipeline.sm_count, cost, nullptr, nullptr) != pfSuccess ||
        pfSimRunUntilIdle(world) != pfSuccess) {
      state.SkipWithError(pfGetLastErrorMessage());
      return;
    }
    double end = 0;
    pfSimNow(world, &end);
    dedicated_per_us = items / end;
    pfSimStreamDestroy(stream);
    pfSimWorldDestroy(world);
  }
  const size_t warm = 2;
  double items = 0, bubble_us = 0;
  for (size_t i = warm; i < filled.iterations.size(); ++i) {
    items += filled.iterations[i].items;
    bubble_us += filled.iterations[i].bubble_us;
  }
  const double in_bubbles_per_us = items / bubble_us;
  state.counters["bubble_items_per_s"] = in_bubbles_per_us * 1e6;
  state.counters["dedicated_items_per_s"] = dedicated_per_us * 1e6;
  state.counters["ratio"] = in_bubbles_per_us / dedicated_per_us;
  std::printf("[throughput] %-7s in bubbles %.0f items per bubble-second | dedicated GPU %.0f "
              "items/s | ratio %.3f (target >= 0.85)\n",
              fill, in_bubbles_per_us * 1e6, dedicated_per_us * 1e6,
              in_bubbles_per_us / dedicated_per_us);
}
BENCHMARK(BM_FillThroughputVsDedicated)->Arg(0)->Arg(1)->ArgName("encoder")->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// 3. Gate-close latency. One simulated GPU; every iteration: compute, a bubble of class "b",
// compute. Most bubbles last kLong; one in ~12 ends early (30-90% of kLong), so the prediction
// (a low quantile of the history) stays long and the fill work is cut by the gate. Measured per
// bubble: bubble end -> start of the next main kernel (its end minus its fixed duration).
struct GateRun {
  std::vector<double> all_us, early_us;
  uint64_t items = 0;
};

constexpr int kGateIterations = 240;

void count_item(void* user, uint64_t) { ++*static_cast<uint64_t*>(user); }

bool gate_scenario(FillMode mode, GateRun* out, std::string* error) {
  auto check = [&](pfResult_t r, const char* what) {
    if (r != pfSuccess && error->empty()) *error = std::string(what) + ": " + pfGetLastErrorMessage();
    return r == pfSuccess;
  };
  pfSimWorld_t world = nullptr;
  pfRuntime_t rt = nullptr;
  void *main = nullptr, *naive = nullptr;
  fjJob_t fill = nullptr;
  pfJob_t job = nullptr;
  pfSimEvent_t end_event = nullptr, kernel_event = nullptr, begin_event = nullptr;
  bool ok = check(pfSimWorldCreate(1, nullptr, 3, &world), "pfSimWorldCreate");
  pfConfig_t config = PF_CONFIG_INITIALIZER;
  config.backend = pfBackendSim;
  config.sim_world = world;
  config.reserved_sms = mode == FillMode::Naive ? 0 : 8;
  ok = ok && check(pfRuntimeCreate(&config, &rt), "pfRuntimeCreate");
  ok = ok && check(pfStreamCreateHighPriority(rt, &main), "pfStreamCreateHighPriority");
  ok = ok && check(pfSimEventCreate(world, &end_event), "pfSimEventCreate") &&
       check(pfSimEventCreate(world, &kernel_event), "pfSimEventCreate") &&
       check(pfSimEventCreate(world, &begin_event), "pfSimEventCreate");
  fjParams_t p;
  fjParamsInit(&p, fjMlpInference, pfBackendSim);
  p.items = 100000000;
  p.keep_every = 0;
  double cost = 0;
  ok = ok && check(fjJobCreate(&p, &fill), "fjJobCreate") && check(fjJobItemCost(fill, &cost), "cost");
  if (ok && mode == FillMode::PipeFill) {
    pfJobDesc_t desc;
    fjJobGetDesc(fill, &desc);
    ok = check(pfJobCreate(rt, &desc, &job), "pfJobCreate");
  }
  if (ok && mode == FillMode::Naive) ok = check(pfSimStreamCreate(world, 0, -5, &naive), "naive stream");
  uint64_t naive_next = 0;
  for (int i = 0; ok && i < kGateIterations; ++i) {
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.label = "b";
    ok = check(pfSimLaunchKernel(main, kKernel, 124), "kernel") &&
         check(pfBubbleBegin(rt, main, &hint), "pfBubbleBegin");
    if (ok && mode == FillMode::Naive) {
      // Sized to the usual bubble on every SM, no gate.
      const uint64_t items = static_cast<uint64_t>(kLong / cost) * 132;
      ok = check(pfSimEventRecord(begin_event, main), "record") &&
           check(pfSimStreamWaitEvent(naive, begin_event, 0, 0), "wait") &&
           check(pfSimLaunchOpaque(naive, naive_next, items, 132, cost, count_item, &out->items), "opaque");
      naive_next += items;
    }
    ok = ok && check(pfSimStreamDelay(main, bubble_length(i)), "delay") &&
         check(pfBubbleEnd(rt, main), "pfBubbleEnd") &&
         check(pfSimEventRecord(end_event, main), "record") &&
         check(pfSimLaunchKernel(main, kKernel, 124), "kernel") &&
         check(pfSimEventRecord(kernel_event, main), "record") &&
         check(pfIterationEnd(rt), "pfIterationEnd") && check(pfSimRunUntilIdle(world), "run") &&
         check(pfRuntimeSynchronize(rt), "sync");
    double t_end = 0, t_kernel = 0;
    ok = ok && check(pfSimEventTime(end_event, &t_end), "time") &&
         check(pfSimEventTime(kernel_event, &t_kernel), "time");
    if (!ok) break;
    const double delay = t_kernel - kKernel - t_end;
    out->all_us.push_back(delay);
    if (early(i)) out->early_us.push_back(delay);
  }
  if (job) {
    pfJobInfo_t info{};
    pfJobGetStatus(job, &info);
    out->items = info.items_completed;
    pfJobDestroy(job);
  }
  fjJobDestroy(fill);
  for (pfSimEvent_t e : {end_event, kernel_event, begin_event})
    if (e) pfSimEventDestroy(e);
  if (naive) pfSimStreamDestroy(naive);
  if (main) pfStreamDestroy(rt, main);
  if (rt) pfRuntimeDestroy(rt);
  if (world) pfSimWorldDestroy(world);
  return ok;
}

void BM_GateCloseLatencySim(benchmark::State& state) {
  GateRun none, gated, naive;
  std::string error;
  for (auto _ : state) {
    none = gated = naive = GateRun{};
    if (!gate_scenario(FillMode::None, &none, &error) ||
        !gate_scenario(FillMode::PipeFill, &gated, &error) ||
        !gate_scenario(FillMode::Naive, &naive, &error)) {
      state.SkipWithError(error.c_str());
      return;
    }
  }
  state.counters["pipefill_early_p99_us"] = percentile(gated.early_us, 0.99);
  state.counters["pipefill_early_max_us"] = percentile(gated.early_us, 1.0);
  state.counters["naive_early_p99_us"] = percentile(naive.early_us, 0.99);
  state.counters["pipefill_items"] = static_cast<double>(gated.items);
  state.counters["naive_items"] = static_cast<double>(naive.items);
  for (auto [name, run] : {std::pair{"no fill", &none}, std::pair{"PipeFill", &gated},
                           std::pair{"naive", &naive}}) {
    std::printf("[gate] %-8s bubble end -> main kernel end - its nominal duration (interference "
                "on): all %zu bubbles p50 %.2f p99 %.2f "
                "max %.2f us | %zu early-ending: p50 %.2f p99 %.2f max %.2f us | %llu fill items\n",
                name, run->all_us.size(), percentile(run->all_us, 0.5), percentile(run->all_us, 0.99),
                percentile(run->all_us, 1.0), run->early_us.size(), percentile(run->early_us, 0.5),
                percentile(run->early_us, 0.99), percentile(run->early_us, 1.0),
                static_cast<unsigned long long>(run->items));
  }
}
BENCHMARK(BM_GateCloseLatencySim)->Iterations(1)->Unit(benchmark::kMillisecond);

// 4. GPU: the CUDA transports are compiled only into the pipeline_engine example.
void BM_EngineIterationGpu(benchmark::State& state) {
  for (auto _ : state) {
    state.SkipWithError(
        "no GPU transport in this benchmark build (cuda_gpu_count()=0 here); on a GPU run "
        "`pipeline_engine --transport auto --naive` for the same side-by-side table");
    return;
  }
}
BENCHMARK(BM_EngineIterationGpu)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
