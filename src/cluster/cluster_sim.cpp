#include "cluster/cluster_sim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <stdexcept>

#include "cluster/checks.hpp"
#include "common/error.hpp"
#include "core/config.hpp"
#include "core/planner.hpp"
#include "core/predictor.hpp"
#include "core/scheduler.hpp"

namespace pipefill::cluster {
namespace {

// A bubble class of a stage as the filler sees it.
struct BubbleClass {
  int index = 0;
  double start_us = 0.0;
  double nominal_us = 0.0;
  double predicted_us = 0.0;  // what the runtime's predictor would report (quantile of history)
  size_t free_bytes = 0;
  bool fillable = false;
};

// plan_slice's answer for a (job type, stage, bubble class) with unlimited remaining items.
// plan_slice is a pure function and its inputs are constant per class (the prediction does
// not change once warm), so it is computed once and reused.
struct CachedPlan {
  bool computed = false;
  bool fill = false;
  int config = -1;
  uint64_t items = 0;
  double item_us = 0.0;         // in-bubble item cost of the chosen config
  double work_per_item = 1.0;
};

struct JobState {
  double remaining = 0.0;       // work units
  double start_us = -1.0;
  double completion_us = -1.0;
};

struct GpuState {
  int job = -1;                 // index into jobs, -1: idle
};

// An iteration longer than this (11.6 days) means a nonsensical config; it would also make the
// simulated horizon lose precision.
constexpr double kMaxIterationUs = 1e12;

// Predictions come from the runtime's own predictor, fed with a window of jittered samples of
// each class (what it would have seen after that many iterations).
constexpr size_t kPredictorWindow = 64;

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// The fill loop's bubble visits and the memory of a run, from the timeline; refused when
// above the bounds, naming the fields that make them large.
pfResult_t check_run_work(const ClusterSimSpec& spec, const schedule::Timeline& tl, const schedule::ScheduleSpec& sched,
                          int gpus, int gpus_per_stage) {
  const SimBounds& bounds = spec.bounds;
  const RunFieldNames& names = spec.names;
  double bubbles = 0.0;  // bubble classes per iteration, all GPUs
  double classes = 0.0;  // bubble classes, all stages (each gets kPredictorWindow predictor samples)
  for (const auto& st : tl.stages) {
    bubbles += static_cast<double>(st.bubbles.size()) * gpus_per_stage;
    classes += static_cast<double>(st.bubbles.size());
  }
  const double events = bubbles * spec.iterations + classes * kPredictorWindow;
  if (events > static_cast<double>(bounds.max_fill_events)) {
    const auto& par = spec.training.parallel;
    return fail(pfErrorInvalidArgument,
                "simulated work of {} bubble visits = {} iterations ({}) x {} bubbles per iteration on {} GPUs ({}), "
                "plus {} predictor samples, is more than the bound of {} (--max-sim-events); the {} schedule has {} "
                "bubbles per stage-iteration from parallelism.pipeline {} x {} micro-batches (parallelism.global_batch "
                "{} / (parallelism.data {} x parallelism.micro_batch {})) x {} chunks (parallelism.chunks)",
                format_count(events), spec.iterations, names.iterations, format_count(bubbles), gpus, names.gpus,
                format_count(classes * kPredictorWindow), format_count(static_cast<double>(bounds.max_fill_events)),
                schedule::schedule_kind_name(sched.kind), format_count(classes), sched.stages, sched.microbatches,
                par.global_batch, par.data, par.micro_batch, sched.chunks);
  }
  const double horizon_h = static_cast<double>(spec.iterations) * tl.iteration_us / 3.6e9;
  double jobs = 0.0;
  if (spec.fill.enabled) {
    jobs = spec.workload.initial_jobs_per_gpu * gpus + spec.workload.arrivals_per_gpu_hour * gpus * horizon_h;
    if (!(jobs <= static_cast<double>(bounds.max_jobs)))
      return fail(pfErrorInvalidArgument,
                  "the workload would generate about {} fill jobs = workload.initial_jobs_per_gpu ({}) x {} GPUs ({}) + "
                  "workload.arrivals_per_gpu_hour ({}) x {} GPUs x {:.4g} simulated hours ({} iterations ({}) of {:.4g} "
                  "us), more than the bound of {} (--max-sim-jobs)",
                  format_count(jobs), spec.workload.initial_jobs_per_gpu, gpus, names.gpus,
                  spec.workload.arrivals_per_gpu_hour, gpus, horizon_h, spec.iterations, names.iterations,
                  tl.iteration_us, format_count(static_cast<double>(bounds.max_jobs)));
  }
  // Per job: the job, its state, its queue entry and scheduler view; per GPU its state; the
  // plan cache and bubble classes per (type, stage, class); the schedule's own tables.
  const double bytes = jobs * (sizeof(FillJob) + sizeof(JobState) + 4.0 + sizeof(JobSchedView) + 16.0) +
                       static_cast<double>(gpus) * sizeof(GpuState) +
                       bubbles / std::max(1, gpus_per_stage) *
                           (sizeof(BubbleClass) + sizeof(CachedPlan) * (spec.job_types.size() + 1) + 64.0 * 8.0) +
                       static_cast<double>(schedule_memory_bytes(sched));
  if (bytes > static_cast<double>(bounds.max_memory_bytes))
    return fail(pfErrorInvalidArgument,
                "the simulation would need about {:.3g} GiB ({} fill jobs from workload.*, {} GPUs ({}), {} bubbles per "
                "iteration, a {}-op schedule), more than the bound of {:.3g} GiB (--max-sim-memory-gib)",
                bytes / 1073741824.0, format_count(jobs), gpus, names.gpus, format_count(bubbles),
                format_count(static_cast<double>(schedule::compute_op_count(sched))),
                static_cast<double>(bounds.max_memory_bytes) / 1073741824.0);
  return pfSuccess;
}

}  // namespace

pfResult_t validate_fill_options(const FillOptions& f, int iterations, const std::string& iterations_field) {
  using checks::real_in;
  if (iterations < 1) return fail(pfErrorInvalidArgument, "{} must be >= 1, got {}", iterations_field, iterations);
  PF_TRY(real_in("fill.efficiency", f.efficiency, 0, 1, true));
  if (!std::isfinite(f.jitter) || f.jitter < 0 || f.jitter >= 1)
    return fail(pfErrorInvalidArgument, "fill.jitter must be in [0, 1), got {}", f.jitter);
  PF_TRY(real_in("fill.launch_overhead_us", f.launch_overhead_us, 0, 1e9));
  PF_TRY(real_in("fill.min_bubble_us", f.min_bubble_us, 0, 1e15));
  PF_TRY(real_in("fill.margin_us", f.margin_us, 0, 1e12));
  if (!std::isfinite(f.margin_fraction) || f.margin_fraction < 0 || f.margin_fraction >= 1)
    return fail(pfErrorInvalidArgument, "fill.margin_fraction must be in [0, 1), got {}", f.margin_fraction);
  if (!std::isfinite(f.prediction_quantile) || f.prediction_quantile > 1 || f.prediction_quantile <= 0)
    return fail(pfErrorInvalidArgument, "fill.prediction_quantile must be in (0, 1], got {}", f.prediction_quantile);
  if (f.warmup_iterations < 0)
    return fail(pfErrorInvalidArgument, "fill.warmup_iterations must be >= 0, got {}", f.warmup_iterations);
  return pfSuccess;
}

pfResult_t validate_workload(const WorkloadSpec& w) {
  PF_TRY(checks::real_in("workload.initial_jobs_per_gpu", w.initial_jobs_per_gpu, 0, 1e6));
  PF_TRY(checks::real_in("workload.arrivals_per_gpu_hour", w.arrivals_per_gpu_hour, 0, 1e9));
  for (const auto& [name, weight] : w.mix) PF_TRY(checks::real_in("workload.mix." + name, weight, 0, 1e12));
  return pfSuccess;
}

pfResult_t set_gpu_count(TrainingSpec* spec, int gpus, const std::string& field) {
  const auto& par = spec->parallel;
  const long long per_replica = static_cast<long long>(par.tensor) * par.pipeline;
  if (gpus < 1 || per_replica < 1 || gpus % per_replica != 0)
    return fail(pfErrorInvalidArgument,
                "{} ({}) must be a positive multiple of parallelism.tensor ({}) x parallelism.pipeline ({})", field, gpus,
                par.tensor, par.pipeline);
  const long long data = gpus / per_replica;
  // The data-parallel size it implies must split the global batch into whole micro-batches.
  const long long per_step = data * static_cast<long long>(par.micro_batch);
  if (par.micro_batch >= 1 && par.global_batch >= 1 && par.global_batch % per_step != 0)
    return fail(pfErrorInvalidArgument,
                "{} ({}) gives parallelism.data = {}, but parallelism.global_batch ({}) is not a multiple of "
                "parallelism.data x parallelism.micro_batch ({})", field, gpus, data, par.global_batch, par.micro_batch);
  spec->parallel.data = static_cast<int>(data);
  return pfSuccess;
}

namespace {
pfResult_t run_cluster_sim_impl(const ClusterSimSpec& spec, ClusterResult* out, const ProgressFn& progress);
}  // namespace

pfResult_t run_cluster_sim(const ClusterSimSpec& spec, ClusterResult* out, const ProgressFn& progress) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "run_cluster_sim: out must not be null");
  try {
    return run_cluster_sim_impl(spec, out, progress);
  } catch (const std::bad_alloc&) {
    return fail(pfErrorOutOfMemory, "the cluster simulation ran out of memory (lower --max-sim-memory-gib)");
  } catch (const std::exception& e) {
    return fail(pfErrorInternal, "the cluster simulation failed: {}", e.what());
  }
}

namespace {

pfResult_t run_cluster_sim_impl(const ClusterSimSpec& spec, ClusterResult* out, const ProgressFn& progress) {
  const RuntimeOptions runtime_defaults;
  FillOptions fill = spec.fill;
  if (fill.margin_us < 0) fill.margin_us = runtime_defaults.safety_margin_us;
  if (fill.margin_fraction < 0) fill.margin_fraction = runtime_defaults.safety_margin_fraction;
  if (fill.prediction_quantile < 0) fill.prediction_quantile = runtime_defaults.prediction_quantile;
  if (fill.warmup_iterations < 0) fill.warmup_iterations = runtime_defaults.min_samples;
  PF_TRY(validate_fill_options(fill, spec.iterations, spec.names.iterations));
  PF_TRY(validate_workload(spec.workload));
  if (fill.enabled && spec.job_types.empty())
    return fail(pfErrorInvalidArgument, "fill.enabled is true but no fill job types were given (fill.jobs_file)");

  schedule::ScheduleSpec sched;
  DerivedCosts costs;
  PF_TRY(build_schedule_spec(spec.training, &sched, &costs));
  PF_TRY(check_schedule_work(sched, spec.training, spec.bounds));
  ClusterResult r;
  {
    std::string error;
    if (!schedule::simulate(sched, &r.timeline, &error))
      return fail(pfErrorInvalidArgument, "schedule: {}", error);
  }
  if (!(r.timeline.iteration_us > 0.0) || r.timeline.iteration_us > kMaxIterationUs)
    return fail(pfErrorInvalidArgument,
                "the {} schedule's iteration takes {:.4g} us, outside (0, {:.0e}] us: check the model sizes (model.*), "
                "parallelism.micro_batch, gpu.peak_tflops x gpu.achieved_fraction and the network bandwidths",
                schedule::schedule_kind_name(sched.kind), r.timeline.iteration_us, kMaxIterationUs);
  PF_TRY(check_run_work(spec, r.timeline, sched, costs.gpus, spec.training.parallel.tensor * spec.training.parallel.data));
  const schedule::Timeline& tl = r.timeline;
  const int p = sched.stages;
  const auto& par = spec.training.parallel;
  r.gpus = costs.gpus;
  r.tensor = par.tensor;
  r.pipeline = p;
  r.data = par.data;
  r.microbatches = sched.microbatches;
  r.chunks = sched.chunks;
  r.iterations = spec.iterations;
  r.schedule = schedule::schedule_kind_name(sched.kind);
  r.iteration_us = tl.iteration_us;
  r.pipeline_us = tl.pipeline_us;
  r.bubble_share = tl.bubble_share();
  r.bubble_ratio = tl.bubble_ratio();
  r.note = fmt::format(
      "bubble timeline computed once per pipeline stage and shared by its {} GPUs ({} DP replicas x {} TP "
      "ranks); filling simulated per GPU",
      par.tensor * par.data, par.data, par.tensor);
  double compute_sum = 0.0, idle_sum = 0.0;
  for (const auto& st : tl.stages) {
    compute_sum += st.compute_us;
    idle_sum += st.bubble_us + st.optimizer_bubble_us;
  }
  r.main_busy_share = compute_sum / (p * tl.iteration_us);
  r.idle_share = idle_sum / (p * tl.iteration_us);
  r.main_mfu = costs.model_flops_per_iteration /
               (static_cast<double>(r.gpus) * spec.training.gpu.peak_tflops * 1e12 * tl.iteration_us * 1e-6);

  // Bubble classes per stage and the memory free through the whole iteration (the arena that
  // holds fill jobs' resident state: device memory minus the stage's peak usage).
  const double q = fill.prediction_quantile;
  // Predictions come from the runtime's own predictor, fed with a window of jittered samples of
  // each class (what it would have seen after that many iterations).
  Rng sample_rng(spec.workload.seed ^ 0x5EEDF00Dull);
  std::vector<std::vector<BubbleClass>> classes(p);
  r.stages.resize(p);
  for (int s = 0; s < p; ++s) {
    const auto& st = tl.stages[s];
    const auto& c = sched.costs[s];
    StageSummary& ss = r.stages[s];
    ss.stage = s;
    ss.compute_us = st.compute_us;
    ss.bubble_us = st.bubble_us;
    ss.optimizer_bubble_us = st.optimizer_bubble_us;
    ss.peak_in_flight = st.peak_in_flight;
    ss.bubbles_per_iteration = static_cast<int>(st.bubbles.size());
    const double used = static_cast<double>(c.weight_bytes) + c.optimizer_bytes + st.peak_activation_bytes;
    ss.arena_bytes = used < sched.device_memory_bytes ? static_cast<size_t>(sched.device_memory_bytes - used) : 0;
    BubblePredictor predictor(runtime_defaults.min_samples, kPredictorWindow);
    for (const auto& b : st.bubbles) {
      const std::string key = bubble_class_key(static_cast<uint64_t>(b.index_in_iteration), nullptr);
      // Without jitter every sample is the nominal duration: the runtime's min_samples of them
      // give the same quantile as a full window (and the draws would not change them).
      const size_t samples = fill.jitter > 0 ? kPredictorWindow
                                             : static_cast<size_t>(std::max(1, runtime_defaults.min_samples));
      for (size_t i = 0; i < samples; ++i)
        predictor.add_sample(key, fill.jitter > 0
                                      ? b.duration_us * (1.0 + fill.jitter * (2.0 * sample_rng.uniform() - 1.0))
                                      : b.duration_us);
      BubbleClass bc;
      bc.index = b.index_in_iteration;
      bc.start_us = b.start_us;
      bc.nominal_us = b.duration_us;
      bc.predicted_us = predictor.predict(key, q).quantile_us;
      bc.free_bytes = b.free_bytes;
      bc.fillable = b.duration_us >= fill.min_bubble_us && (fill.fill_optimizer_bubble || b.kind != pfBubbleOptimizer);
      classes[s].push_back(bc);
    }
  }

  // Jobs.
  const double horizon_us = spec.iterations * tl.iteration_us;
  std::vector<FillJob> jobs;
  if (fill.enabled) PF_TRY(generate_jobs(spec.workload, spec.job_types, r.gpus, horizon_us, &jobs, spec.bounds.max_jobs));
  r.jobs_generated = jobs.size();
  const size_t type_count = spec.job_types.size();
  r.completed_per_type.assign(type_count, 0);
  std::vector<std::vector<JobConfigModel>> models(type_count);
  std::vector<double> min_work(type_count, 1.0);
  // setup[type][stage]: choose_setup_config's pick for the stage's arena (-1: does not fit).
  std::vector<std::vector<int>> setup(type_count, std::vector<int>(p, -1));
  std::vector<char> placeable(type_count, 0);
  for (size_t t = 0; t < type_count; ++t) {
    models[t] = planner_configs(spec.job_types[t], fill.efficiency);
    min_work[t] = std::numeric_limits<double>::infinity();
    for (const auto& m : models[t]) min_work[t] = std::min(min_work[t], m.work_per_item);
    for (int s = 0; s < p; ++s) {
      setup[t][s] = choose_setup_config(models[t], r.stages[s].arena_bytes, 1);
      if (setup[t][s] >= 0) placeable[t] = 1;
    }
  }
  std::vector<JobState> state(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) state[j].remaining = jobs[j].size;

  // Plan cache [type][stage][class].
  std::vector<std::vector<std::vector<CachedPlan>>> cache(type_count, std::vector<std::vector<CachedPlan>>(p));
  for (size_t t = 0; t < type_count; ++t)
    for (int s = 0; s < p; ++s) cache[t][s].resize(classes[s].size());

  auto request_for = [&](int type, int s, const BubbleClass& bc, double consumed_us, uint64_t remaining_items) {
    const JobConfigModel& setup_model = models[type][setup[type][s]];
    PlanRequest req;
    req.predicted_us = bc.predicted_us;
    // What earlier slices in this bubble used comes off the budget like the margin does.
    req.margin_us = fill.margin_us + consumed_us;
    req.margin_fraction = fill.margin_fraction;
    req.launch_overhead_us = fill.launch_overhead_us;
    req.free_bytes = bc.free_bytes > setup_model.resident_bytes ? bc.free_bytes - setup_model.resident_bytes : 0;
    req.fill_sms = 1;
    req.remaining_items = remaining_items;
    req.gated = fill.gated;
    req.resident_limit = setup_model.resident_bytes;
    return req;
  };
  auto to_cached = [&](int type, const SlicePlan& plan) {
    CachedPlan c;
    c.computed = true;
    c.fill = plan.fill;
    if (plan.fill) {
      c.config = plan.config_index;
      c.items = plan.items;
      c.item_us = models[type][plan.config_index].item_cost_us;
      c.work_per_item = models[type][plan.config_index].work_per_item;
    }
    return c;
  };

  // Pending queue (arrived, not started), kept in the policy's order.
  std::vector<uint32_t> pending;
  std::vector<size_t> stage_cursor(p, 0);
  size_t next_arrival = 0;
  std::vector<GpuState> gpus(static_cast<size_t>(r.gpus));
  const int gpus_per_stage = par.tensor * par.data;
  std::vector<JobSchedView> views;

  auto take_job = [&](int s, double now_us) -> int {
    size_t& cur = stage_cursor[s];
    while (cur < pending.size()) {
      const uint32_t j = pending[cur];
      if (state[j].start_us < 0 && setup[jobs[j].type][s] >= 0) {
        state[j].start_us = now_us;
        ++r.jobs_started;
        ++cur;
        return static_cast<int>(j);
      }
      ++cur;  // placed elsewhere, or does not fit this stage's arena (a static property)
    }
    return -1;
  };
  // Jobs a stage skipped because they do not fit it stay for the other stages, so a cursor only
  // moves past entries that are placed or unfit for its own stage.

  Rng jitter_rng(spec.workload.seed ^ 0xA5A5A5A5DEADBEEFull);
  const int record_it = spec.record_iteration >= 0 ? std::min(spec.record_iteration, spec.iterations - 1)
                                                   : spec.iterations - 1;
  r.recorded_iteration = record_it;
  std::vector<double> stage_fillable(p, 0.0), stage_filled(p, 0.0);
  double slowdown_sum = 0.0, gpu_overrun_sum = 0.0;
  const double efficiency = fill.efficiency;

  for (int it = 0; it < spec.iterations; ++it) {
    const double t0 = it * tl.iteration_us;
    // Admit arrivals and re-order the pending queue through the policy.
    bool arrived = false;
    while (next_arrival < jobs.size() && jobs[next_arrival].arrival_us <= t0) {
      const FillJob& j = jobs[next_arrival];
      ++r.jobs_arrived;
      if (placeable[j.type]) {
        pending.push_back(static_cast<uint32_t>(next_arrival));
        arrived = true;
      } else {
        ++r.jobs_unplaceable;
      }
      ++next_arrival;
    }
    if (arrived) {
      // Drop started jobs, then let the policy order what is left.
      pending.erase(std::remove_if(pending.begin(), pending.end(), [&](uint32_t j) { return state[j].start_us >= 0; }),
                    pending.end());
      views.resize(pending.size());
      for (size_t i = 0; i < pending.size(); ++i) {
        const FillJob& j = jobs[pending[i]];
        const auto& m0 = models[j.type][0];
        views[i] = JobSchedView{j.sequence, j.priority, j.size / m0.work_per_item * m0.item_cost_us, 0.0, true};
      }
      const std::vector<size_t> order = schedule_order(fill.policy, views);
      std::vector<uint32_t> reordered;
      reordered.reserve(order.size());
      for (size_t i : order) reordered.push_back(pending[i]);
      pending.swap(reordered);
      std::fill(stage_cursor.begin(), stage_cursor.end(), 0);
    }

    const bool filling = fill.enabled && it >= fill.warmup_iterations;
    const bool recording = it == record_it;
    double max_overrun = 0.0;
    for (int g = 0; g < r.gpus; ++g) {
      const int s = g / gpus_per_stage;
      GpuState& gpu = gpus[g];
      double overrun_total = 0.0;
      for (const BubbleClass& bc : classes[s]) {
        if (!bc.fillable) continue;
        const double actual = fill.jitter > 0 ? bc.nominal_us * (1.0 + fill.jitter * (2.0 * jitter_rng.uniform() - 1.0))
                                              : bc.nominal_us;
        stage_fillable[s] += actual;
        if (!filling) continue;
        double consumed = 0.0;  // busy time of earlier slices in this bubble
        while (true) {
          if (gpu.job < 0) {
            gpu.job = take_job(s, t0 + bc.start_us + consumed);
            if (gpu.job < 0) break;
          }
          const int type = jobs[gpu.job].type;
          JobState& js = state[gpu.job];
          CachedPlan plan;
          if (consumed == 0.0) {
            CachedPlan& c = cache[type][s][bc.index];
            if (!c.computed) {
              const SlicePlan sp = plan_slice(request_for(type, s, bc, 0.0, UINT64_MAX), models[type]);
              c = to_cached(type, sp);
            }
            plan = c;
          } else {
            const SlicePlan sp = plan_slice(request_for(type, s, bc, consumed, UINT64_MAX), models[type]);
            plan = to_cached(type, sp);
          }
          if (!plan.fill) break;
          // Items capped at the job's remaining work (what plan_slice does with remaining_items).
          // Items capped at the job's remaining work, compared in double: sizes can exceed 2^64 items.
          const double needed = std::max(1.0, std::ceil(js.remaining / plan.work_per_item - 1e-9));
          uint64_t items = needed < static_cast<double>(plan.items) ? static_cast<uint64_t>(needed) : plan.items;
          // Execution against the actual bubble: the gate is checked before every item, so the
          // item running at the bubble end finishes (the overrun); opaque work runs entirely.
          const double avail = actual - consumed - fill.launch_overhead_us;
          if (fill.gated && avail < items * plan.item_us) {
            const double fits = avail > 0 ? std::ceil(avail / plan.item_us - 1e-12) : 0.0;
            if (fits < static_cast<double>(items)) items = static_cast<uint64_t>(std::max(0.0, fits));
          }
          const double busy = fill.launch_overhead_us + items * plan.item_us;
          const double end = consumed + busy;
          const double overrun = end > actual ? end - actual : 0.0;
          ++r.slices;
          if (overrun > 0) ++r.overrun_slices;
          overrun_total += overrun;
          stage_filled[s] += std::min(end, actual) - consumed;
          const double work = std::min(js.remaining, items * plan.work_per_item);
          js.remaining -= work;
          r.fill_work_dedicated_us += items * plan.item_us * efficiency;
          if (recording && g % gpus_per_stage == 0) {
            FillSlice fs;
            fs.stage = s;
            fs.bubble_index = bc.index;
            fs.start_us = bc.start_us + consumed;
            fs.busy_us = busy;
            fs.job_type = type;
            fs.job = jobs[gpu.job].sequence;
            fs.items = items;
            r.recorded_slices.push_back(fs);
          }
          consumed = end;
          if (js.remaining <= 1e-9) {
            js.remaining = 0;
            js.completion_us = t0 + bc.start_us + end;
            ++r.jobs_completed;
            ++r.completed_per_type[type];
            gpu.job = -1;
            if (consumed < actual) continue;  // the rest of the bubble goes to the next job
          }
          break;
        }
      }
      max_overrun = std::max(max_overrun, overrun_total);
      gpu_overrun_sum += overrun_total;
    }
    slowdown_sum += max_overrun;
    if (progress) progress(it + 1, spec.iterations);
  }

  for (int s = 0; s < p; ++s) {
    r.fillable_bubble_us += stage_fillable[s];
    r.filled_us += stage_filled[s];
    r.stages[s].filled_share = stage_fillable[s] > 0 ? stage_filled[s] / stage_fillable[s] : 0.0;
  }
  r.filled_share = r.fillable_bubble_us > 0 ? r.filled_us / r.fillable_bubble_us : 0.0;
  r.fill_gpu_equivalents = r.fill_work_dedicated_us / horizon_us;
  r.utilisation_gain = r.fill_gpu_equivalents / (r.gpus * r.main_busy_share);
  r.slowdown_fraction = slowdown_sum / spec.iterations / tl.iteration_us;
  r.mean_gpu_overrun_fraction = gpu_overrun_sum / (static_cast<double>(r.gpus) * spec.iterations) / tl.iteration_us;
  std::vector<double> completion, wait;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (state[j].completion_us >= 0) completion.push_back((state[j].completion_us - jobs[j].arrival_us) * 1e-6);
    if (state[j].start_us >= 0) wait.push_back((state[j].start_us - jobs[j].arrival_us) * 1e-6);
  }
  if (!completion.empty()) {
    double sum = 0;
    for (double c : completion) sum += c;
    r.completion_mean_s = sum / completion.size();
    r.completion_p50_s = percentile(completion, 0.5);
    r.completion_p95_s = percentile(completion, 0.95);
  }
  if (!wait.empty()) {
    double sum = 0;
    for (double w : wait) sum += w;
    r.wait_mean_s = sum / wait.size();
  }
  *out = std::move(r);
  return pfSuccess;
}

}  // namespace

}  // namespace pipefill::cluster
