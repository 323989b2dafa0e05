// Host cost of the bubble instructions and of the fill decisions.
//
//  BM_BubbleInstructions: pfBubbleBegin + pfBubbleEnd on the simulated device, side by side
//    with the raw device operations they must enqueue (event record at begin; gate write and
//    event record at end) issued directly on a simulated world. Counters: ns per begin+end
//    pair for both, and their ratio. Target (design brief): <= 1 µs on the simulator.
//  BM_ScheduleOrder / BM_FillDecision: the scheduler's order and the planner's slice for the
//    first job, with 1, 10 and 1000 queued jobs (what the executor does per bubble).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "core/planner.hpp"
#include "core/scheduler.hpp"
#include "pipefill/pipefill.h"
#include "sim/sim_world.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kPairsPerBatch = 256;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void BM_BubbleInstructions(benchmark::State& state) {
  // Ours: a runtime on a private simulated device.
  pfConfig_t config = PF_CONFIG_INITIALIZER;
  config.backend = pfBackendSim;
  config.log_level = pfLogError;
  pfRuntime_t rt = nullptr;
  if (pfRuntimeCreate(&config, &rt) != pfSuccess) {
    state.SkipWithError(pfGetLastErrorMessage());
    return;
  }
  pfSimWorld_t world = nullptr;
  pfRuntimeGetSimWorld(rt, &world);
  void* stream = nullptr;
  pfStreamCreateHighPriority(rt, &stream);

  // Baseline: the same three stream operations, straight on a simulated world.
  std::unique_ptr<pipefill::sim::World> raw;
  pipefill::sim::World::create(1, nullptr, 1, &raw);
  void* raw_stream = nullptr;
  void* begin_event = nullptr;
  void* end_event = nullptr;
  uint64_t* gate = nullptr;
  raw->create_stream(0, pipefill::sim::kHighestPriority, false, &raw_stream);
  raw->create_event(&begin_event);
  raw->create_event(&end_event);
  raw->allocate_words(1, &gate);

  double ours_s = 0.0, raw_s = 0.0;
  // Per-batch minimums too: on a loaded machine preemption inflates the means.
  double ours_min = 1e30, raw_min = 1e30;
  uint64_t pairs = 0, bubble_id = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    for (int i = 0; i < kPairsPerBatch; ++i) {
      pfBubbleBegin(rt, stream, nullptr);
      pfBubbleEnd(rt, stream);
    }
    const double ours = seconds_since(t0);
    t0 = Clock::now();
    for (int i = 0; i < kPairsPerBatch; ++i) {
      raw->record_event(begin_event, raw_stream);
      raw->write_word(raw_stream, gate, ++bubble_id);
      raw->record_event(end_event, raw_stream);
    }
    const double base = seconds_since(t0);
    state.SetIterationTime(ours);
    ours_s += ours;
    raw_s += base;
    ours_min = std::min(ours_min, ours);
    raw_min = std::min(raw_min, base);
    pairs += kPairsPerBatch;
    // Untimed: let both worlds execute what was enqueued (and the runtime harvest it).
    pfIterationEnd(rt);
    pfSimRunUntilIdle(world);
    raw->run_until_idle();
  }
  pfRuntimeSynchronize(rt);
  pfStats_t stats;
  pfRuntimeGetStats(rt, &stats);
  state.counters["ours_ns_per_pair"] = ours_s * 1e9 / static_cast<double>(pairs);
  state.counters["raw_ops_ns_per_pair"] = raw_s * 1e9 / static_cast<double>(pairs);
  state.counters["ratio_ours_over_raw"] = raw_s > 0 ? ours_s / raw_s : 0.0;
  state.counters["ours_min_batch_ns_per_pair"] = ours_min * 1e9 / kPairsPerBatch;
  state.counters["raw_min_batch_ns_per_pair"] = raw_min * 1e9 / kPairsPerBatch;
  state.counters["ratio_min_batch"] = raw_min > 0 ? ours_min / raw_min : 0.0;
  state.counters["runtime_reported_ns"] = stats.host_begin_end_ns;
  state.SetItemsProcessed(static_cast<int64_t>(pairs));
  pfStreamDestroy(rt, stream);
  pfRuntimeDestroy(rt);
}
BENCHMARK(BM_BubbleInstructions)->UseManualTime()->Unit(benchmark::kMicrosecond);

std::vector<pipefill::JobSchedView> make_views(size_t n) {
  std::vector<pipefill::JobSchedView> views(n);
  for (size_t i = 0; i < n; ++i) {
    views[i].sequence = i;
    views[i].priority = static_cast<int>((i * 7) % 5);
    views[i].remaining_work_us = static_cast<double>((i * 7919) % 1000);
    views[i].received_bubble_us = static_cast<double>((i * 104729) % 500);
  }
  return views;
}

void BM_ScheduleOrder(benchmark::State& state) {
  const auto policy = static_cast<pfSchedulePolicy_t>(state.range(0));
  const auto views = make_views(static_cast<size_t>(state.range(1)));
  for (auto _ : state) {
    auto order = pipefill::schedule_order(policy, views);
    benchmark::DoNotOptimize(order.data());
  }
  state.SetLabel(pipefill::policy_name(policy));
}
BENCHMARK(BM_ScheduleOrder)
    ->ArgsProduct({{pfPolicyFifo, pfPolicyPriority, pfPolicyShortestRemaining, pfPolicyFairShare},
                   {1, 10, 1000}});

// What the executor decides per bubble: the policy's order, then the plan of the first job
// (4 configurations each).
void BM_FillDecision(benchmark::State& state) {
  const size_t jobs = static_cast<size_t>(state.range(0));
  const auto views = make_views(jobs);
  std::vector<std::vector<pipefill::JobConfigModel>> configs(jobs);
  for (size_t j = 0; j < jobs; ++j) {
    for (int c = 0; c < 4; ++c) {
      pipefill::JobConfigModel m;
      m.item_cost_us = 5.0 + c * 3.0 + static_cast<double>(j % 7);
      m.parallelism = 16 << c;
      m.workspace_bytes_per_item = size_t{1} << (16 + c);
      m.work_per_item = 1.0 + c;
      configs[j].push_back(m);
    }
  }
  pipefill::PlanRequest request;
  request.predicted_us = 480.0;
  request.margin_us = 20.0;
  request.margin_fraction = 0.05;
  request.free_bytes = size_t{8} << 30;
  request.fill_sms = 124;
  request.remaining_items = 100000;
  for (auto _ : state) {
    const auto order = pipefill::schedule_order(pfPolicyShortestRemaining, views);
    const auto plan = pipefill::plan_slice(request, configs[order.front()]);
    benchmark::DoNotOptimize(plan.items);
  }
}
BENCHMARK(BM_FillDecision)->Arg(1)->Arg(10)->Arg(1000);

}  // namespace

BENCHMARK_MAIN();
