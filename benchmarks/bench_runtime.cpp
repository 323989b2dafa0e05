// Host cost of the bubble instructions and of the fill decisions.
//
//  BM_BubbleInstructions: pfBubbleBegin + pfBubbleEnd on the simulated device, side by side
//    with the raw device operations they must enqueue (event record at begin; gate write and
//    event record at end) issued directly on a simulated world. Counters: ns per begin+end
//    pair for both, and their ratio. Target (design brief): <= 1 µs on the simulator.
//  BM_PairCost/<backend>/<launch mode>: the wall time of one pfBubbleBegin + pfBubbleEnd pair
//    with a ticket fill job attached (so every bubble is filled: in inline mode begin enqueues
//    the slices itself) on the simulated (0), host (1) and CUDA (2; skipped without a GPU)
//    backends, in executor (1) and inline (2) launch mode, side by side with the bare stream
//    operations a pair must enqueue (event record; gate write + event record) issued straight on
//    a device of the same kind. Counters: mean and best-batch ns per pair for both, their ratio,
//    the share of bubbles filled and the bubbles inline mode left to the executor rather than
//    wait for its lock. Each bubble lasts 50 µs on the device (a main-stream delay, enqueued in
//    both loops); the host calls never wait for it.
//  BM_PipelineFill: a simulated 4-stage 1F1B pipeline (8 micro-batches, 10 iterations) without
//    and with one ticket fill job per stage, side by side. Counters: main-job slowdown (target
//    <= 0.5%), share of bubble time filled after 2 warm-up iterations (target >= 90%), host
//    time per simulated iteration for both runs.
//  BM_ScheduleOrder / BM_FillDecision: the scheduler's order and the planner's slice for the
//    first job, with 1, 10 and 1000 queued jobs (what the executor does per bubble).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "core/handles.hpp"
#include "core/planner.hpp"
#include "core/runtime.hpp"
#include "host/host_engine.hpp"
#include "core/scheduler.hpp"
#include "pipefill/pipefill.h"
#include "sim/sim_pipeline.hpp"
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

// ---- BM_PairCost ------------------------------------------------------------------------------

// Ticket jobs of empty items (the fill work's cost is not what is measured).
pfResult_t pair_cost_launch_sim(void*, const pfSliceDesc_t* slice, void* stream) {
  if (slice->max_items == 0) return pfSuccess;
  return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, 1.0, nullptr, nullptr);
}
pfResult_t pair_cost_launch_host(void*, const pfSliceDesc_t* slice, void* stream) {
  if (slice->max_items == 0) return pfSuccess;
  return pfHostLaunchTicketKernel(stream, slice, slice->max_blocks, nullptr, nullptr);
}

// The bare operations of a pair on a device of the backend's kind, `pairs` times; seconds.
class BareOps {
 public:
  explicit BareOps(pfBackend_t backend) : backend_(backend) {
    if (backend == pfBackendSim) {
      pipefill::sim::World::create(1, nullptr, 1, &world_);
      world_->create_stream(0, pipefill::sim::kHighestPriority, false, &stream_);
      world_->create_event(&begin_);
      world_->create_event(&end_);
      world_->allocate_words(1, &gate_);
    } else if (backend == pfBackendHost) {
      pipefill::host::Engine::create(pipefill::host::EngineOptions{}, &engine_);
      engine_->create_stream(pipefill::host::kHighestPriority, false, &stream_);
      engine_->create_event(&begin_);
      engine_->create_event(&end_);
      engine_->allocate_words(1, &gate_);
    }
  }
  ~BareOps() {
    if (engine_) engine_->shutdown();
  }
  bool available() const { return world_ != nullptr || engine_ != nullptr; }
  double run(int pairs, double bubble_us) {
    const auto t0 = Clock::now();
    for (int i = 0; i < pairs; ++i) {
      if (world_) {
        world_->record_event(begin_, stream_);
        world_->delay(stream_, bubble_us);
        world_->write_word(stream_, gate_, ++id_);
        world_->record_event(end_, stream_);
      } else {
        engine_->record_event(begin_, stream_);
        engine_->delay(stream_, bubble_us);
        engine_->write_word(stream_, gate_, ++id_);
        engine_->record_event(end_, stream_);
      }
    }
    return seconds_since(t0);
  }
  void drain() {
    if (world_) world_->run_until_idle();
    if (engine_) engine_->synchronize_stream(stream_);
  }

 private:
  pfBackend_t backend_;
  std::unique_ptr<pipefill::sim::World> world_;
  std::shared_ptr<pipefill::host::Engine> engine_;
  void* stream_ = nullptr;
  void* begin_ = nullptr;
  void* end_ = nullptr;
  uint64_t* gate_ = nullptr;
  uint64_t id_ = 0;
};

void BM_PairCost(benchmark::State& state) {
  const pfBackend_t backend = state.range(0) == 0   ? pfBackendSim
                              : state.range(0) == 1 ? pfBackendHost
                                                    : pfBackendCuda;
  const int mode = static_cast<int>(state.range(1));
  state.SetLabel(fmt::format("{} {}", backend == pfBackendSim    ? "sim"
                                      : backend == pfBackendHost ? "host"
                                                                 : "cuda",
                             mode == pfLaunchInline ? "inline" : "executor"));
  pfConfig_t config = PF_CONFIG_INITIALIZER;
  config.backend = backend;
  config.launch_mode = mode;
  config.log_level = pfLogError;
  config.safety_margin_us = 0.0;
  config.safety_margin_fraction = 0.0;
  config.arena_bytes = size_t{1} << 20;
  pfRuntime_t rt = nullptr;
  if (pfRuntimeCreate(&config, &rt) != pfSuccess) {
    state.SkipWithError(pfGetLastErrorMessage());  // e.g. cuda without a GPU
    return;
  }
  void* stream = nullptr;
  pfStreamCreateHighPriority(rt, &stream);
  pfSimWorld_t world = nullptr;
  if (backend == pfBackendSim) pfRuntimeGetSimWorld(rt, &world);
  pfJobDesc_t desc = PF_JOB_DESC_INITIALIZER;
  desc.name = "empty-items";
  desc.item_count = uint64_t{1} << 40;
  desc.item_cost_hint_us = 1.0;
  desc.launch = backend == pfBackendSim ? &pair_cost_launch_sim : &pair_cost_launch_host;
  pfJob_t job = nullptr;
  if (backend != pfBackendCuda && pfJobCreate(rt, &desc, &job) != pfSuccess) {
    state.SkipWithError(pfGetLastErrorMessage());
    pfRuntimeDestroy(rt);
    return;
  }
  BareOps bare(backend);
  // Each bubble lasts 50 µs on the device (a delay on the main stream between begin and end, as
  // the recv wait would): the slices run inside it. The host calls do not wait for it; both loops
  // time the delay's enqueue too.
  constexpr double kBubbleUs = 50.0;
  pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
  hint.label = "recv";              // one class: planned from measured history after the first
  hint.expected_duration_us = kBubbleUs;
  double ours_s = 0.0, bare_s = 0.0, ours_min = 1e30, bare_min = 1e30;
  uint64_t pairs = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    for (int i = 0; i < kPairsPerBatch; ++i) {
      pfBubbleBegin(rt, stream, &hint);
      if (backend == pfBackendSim) pfSimStreamDelay(stream, kBubbleUs);
      if (backend == pfBackendHost) pfHostStreamDelay(stream, kBubbleUs);
      pfBubbleEnd(rt, stream);
    }
    const double ours = seconds_since(t0);
    const double base = bare.available() ? bare.run(kPairsPerBatch, kBubbleUs) : 0.0;
    state.SetIterationTime(ours);
    ours_s += ours;
    bare_s += base;
    ours_min = std::min(ours_min, ours);
    bare_min = std::min(bare_min, base);
    pairs += kPairsPerBatch;
    // Untimed: run what was enqueued, harvest it (frees the event pairs).
    pfIterationEnd(rt);
    if (world != nullptr) pfSimRunUntilIdle(world);
    pfRuntimeSynchronize(rt);
    bare.drain();
  }
  uint64_t deferred = 0;
  {
    pipefill::core::RuntimeRef ref;
    if (pipefill::core::acquire_runtime(rt, "bench", &ref) == pfSuccess) {
      deferred = ref->state_for_tests().inline_deferred.load();
    }
  }
  pfStats_t stats{};
  pfRuntimeGetStatsV2(rt, &stats, sizeof stats);
  state.counters["pair_ns"] = ours_s * 1e9 / static_cast<double>(pairs);
  state.counters["pair_best_batch_ns"] = ours_min * 1e9 / kPairsPerBatch;
  state.counters["bare_ops_ns"] = bare_s * 1e9 / static_cast<double>(pairs);
  state.counters["bare_best_batch_ns"] = bare_min * 1e9 / kPairsPerBatch;
  state.counters["ratio_pair_over_bare"] = bare_s > 0 ? ours_s / bare_s : 0.0;
  state.counters["filled_share"] =
      stats.bubbles > 0 ? static_cast<double>(stats.bubbles_filled) / stats.bubbles : 0.0;
  state.counters["inline_left_to_executor"] = static_cast<double>(deferred);
  if (job != nullptr) pfJobDestroy(job);
  pfStreamDestroy(rt, stream);
  pfRuntimeDestroy(rt);
}
BENCHMARK(BM_PairCost)
    ->ArgsProduct({{0, 1, 2}, {pfLaunchExecutor, pfLaunchInline}})
    ->ArgNames({"backend", "mode"})
    ->UseManualTime()
    ->Iterations(40)
    ->Unit(benchmark::kMicrosecond);

struct PipelineOutcome {
  double virtual_us = 0.0;        // simulated time of the measured iterations
  double bubble_us = 0.0;         // after warm-up
  double filled_us = 0.0;
  double host_s = 0.0;
};

pfResult_t fill_launch(void*, const pfSliceDesc_t* slice, void* stream) {
  return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, 10.0, nullptr, nullptr);
}

// 4-stage 1F1B, 8 micro-batches: 2 warm-up iterations, then 8 measured ones.
PipelineOutcome run_pipeline(bool fill, double margin_us, double margin_fraction) {
  constexpr int kStages = 4;
  PipelineOutcome out;
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  pfSimWorld_t world = nullptr;
  pfSimWorldCreate(kStages, &desc, 1, &world);
  std::vector<pfRuntime_t> runtimes;
  std::vector<pfJob_t> jobs;
  if (fill) {
    for (int s = 0; s < kStages; ++s) {
      pfConfig_t c = PF_CONFIG_INITIALIZER;
      c.backend = pfBackendSim;
      c.sim_world = world;
      c.device = s;
      c.stage_id = s;
      c.stage_count = kStages;
      c.reserved_sms = 8;
      c.safety_margin_us = margin_us;
      c.safety_margin_fraction = margin_fraction;
      c.log_level = pfLogError;
      pfRuntime_t rt = nullptr;
      pfRuntimeCreate(&c, &rt);
      runtimes.push_back(rt);
      pfJobDesc_t d = PF_JOB_DESC_INITIALIZER;
      d.name = "inference";
      d.item_count = uint64_t{1} << 40;
      d.item_cost_hint_us = 10.0;
      d.launch = &fill_launch;
      pfJob_t job = nullptr;
      pfJobCreate(rt, &d, &job);
      jobs.push_back(job);
    }
  }
  pipefill::sim::PipelineOptions options;
  options.spec.kind = pipefill::schedule::ScheduleKind::OneFOneB;
  options.spec.stages = kStages;
  options.spec.microbatches = 8;
  pipefill::schedule::StageCosts costs;
  costs.forward_us = 1000.0;
  costs.backward_us = 2000.0;
  options.spec.costs.assign(kStages, costs);
  options.spec.p2p_latency_us = 10.0;
  options.comm_sms = 8;
  options.runtimes = runtimes;
  std::unique_ptr<pipefill::sim::Pipeline> pipeline;
  pipefill::sim::Pipeline::create(world, options, &pipeline);
  const auto t0 = Clock::now();
  std::vector<pipefill::sim::IterationResult> warm, measured;
  pipeline->run(2, &warm);
  std::vector<pfStats_t> before(runtimes.size());
  for (size_t s = 0; s < runtimes.size(); ++s) {
    pfRuntimeSynchronize(runtimes[s]);
    pfRuntimeGetStats(runtimes[s], &before[s]);
  }
  pipeline->run(8, &measured);
  out.host_s = seconds_since(t0);
  out.virtual_us = measured.back().end_us - measured.front().start_us;
  for (size_t s = 0; s < runtimes.size(); ++s) {
    pfStats_t after;
    pfRuntimeSynchronize(runtimes[s]);
    pfRuntimeGetStats(runtimes[s], &after);
    out.bubble_us += after.bubble_time_us - before[s].bubble_time_us;
    out.filled_us += after.filled_time_us - before[s].filled_time_us;
  }
  for (pfJob_t j : jobs) pfJobDestroy(j);
  pipeline.reset();
  for (pfRuntime_t rt : runtimes) pfRuntimeDestroy(rt);
  pfSimWorldDestroy(world);
  return out;
}

// Arg 0: the default margins (20 µs + 5%); arg 1: margins off.
void BM_PipelineFill(benchmark::State& state) {
  const bool default_margins = state.range(0) == 0;
  PipelineOutcome base, filled;
  for (auto _ : state) {
    base = run_pipeline(false, 0.0, 0.0);
    filled = default_margins ? run_pipeline(true, 20.0, 0.05) : run_pipeline(true, 0.0, 0.0);
  }
  state.counters["slowdown_percent"] = 100.0 * (filled.virtual_us - base.virtual_us) / base.virtual_us;
  state.counters["filled_share_percent"] =
      filled.bubble_us > 0 ? 100.0 * filled.filled_us / filled.bubble_us : 0.0;
  state.counters["host_ms_per_iteration_nofill"] = base.host_s * 1e3 / 8;
  state.counters["host_ms_per_iteration_fill"] = filled.host_s * 1e3 / 8;
  state.SetLabel(default_margins ? "margins 20us+5%" : "margins off");
}
BENCHMARK(BM_PipelineFill)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(1);

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
