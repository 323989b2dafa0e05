#include "cluster/cluster_sim.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <new>
#include <stdexcept>

#include "cluster/checks.hpp"
#include "cluster/quantile_sketch.hpp"
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
  // What the runtime's predictor would report: prediction_quantile of the history (ungated work,
  // the peers) and gated_prediction_quantile of it (ours with the gate).
  double predicted_us = 0.0;
  double gated_predicted_us = 0.0;
  size_t free_bytes = 0;
  bool fillable = false;
  // Communication the fill runs beside (strategies.hpp BubbleInput).
  double transfer_out_us = 0.0;
  double transfer_in_us = 0.0;
  double comm_window_share = 0.0;
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
  double dedicated_item_us = 0.0;
};

struct JobState {
  double remaining = 0.0;       // work units
  double start_us = -1.0;
  double completion_us = -1.0;
};

struct GpuState {
  int job = -1;                 // index into jobs, -1: idle
  int type = -1;                // its type (cached: the jobs array is large and read at random)
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
  if (!std::isfinite(f.gated_prediction_quantile) || f.gated_prediction_quantile > 1 ||
      f.gated_prediction_quantile <= 0)
    return fail(pfErrorInvalidArgument, "fill.gated_prediction_quantile must be in (0, 1], got {}",
                f.gated_prediction_quantile);
  if (f.warmup_iterations < 0)
    return fail(pfErrorInvalidArgument, "fill.warmup_iterations must be >= 0, got {}", f.warmup_iterations);
  if (f.reserved_sms < 0) return fail(pfErrorInvalidArgument, "fill.reserved_sms must be >= 0, got {}", f.reserved_sms);
  PF_TRY(real_in("fill.gate_visibility_us", f.gate_visibility_us, 0, 1e9));
  PF_TRY(real_in("fill.max_arena_gib", f.max_arena_gib, 0, 1 << 20));
  PF_TRY(real_in("fill.freeride.step_rounding_us", f.freeride.step_rounding_us, 0, 1e12));
  PF_TRY(real_in("fill.freeride.step_margin", f.freeride.step_margin, 0, 100, true));
  PF_TRY(real_in("fill.freeride.scheduler_poll_us", f.freeride.scheduler_poll_us, 0, 1e12));
  PF_TRY(real_in("fill.freeride.task_poll_us", f.freeride.task_poll_us, 0, 1e12));
  PF_TRY(real_in("fill.tally.preemption_budget_us", f.tally.preemption_budget_us, 0, 1e9, true));
  PF_TRY(real_in("fill.tally.norm_speed", f.tally.norm_speed, 0, 1, true));
  PF_TRY(real_in("fill.tally.signal_us", f.tally.signal_us, 0, 1e9));
  PF_TRY(real_in("fill.tally.relaunch_gap_us", f.tally.relaunch_gap_us, 0, 1e9));
  PF_TRY(real_in("fill.tally.hp_arrival_us", f.tally.hp_arrival_us, 0, 1e15));
  return pfSuccess;
}

pfResult_t validate_interference(const InterferenceModel& m) {
  PF_TRY(checks::real_in("interference.mem_slowdown", m.mem_slowdown, 0, 100));
  PF_TRY(checks::real_in("interference.comm_slowdown", m.comm_slowdown, 0, 100));
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
  if (fill.gated_prediction_quantile < 0) fill.gated_prediction_quantile = runtime_defaults.gated_prediction_quantile;
  if (fill.warmup_iterations < 0) fill.warmup_iterations = runtime_defaults.min_samples;
  PF_TRY(validate_fill_options(fill, spec.iterations, spec.names.iterations));
  PF_TRY(validate_interference(spec.interference));
  PF_TRY(validate_workload(spec.workload));
  if (fill.enabled && spec.job_types.empty())
    return fail(pfErrorInvalidArgument, "fill.enabled is true but no fill job types were given (fill.jobs_file)");
  if (fill.reserved_sms >= spec.training.gpu.sm_count)
    return fail(pfErrorInvalidArgument, "fill.reserved_sms ({}) must be less than gpu.sm_count ({})", fill.reserved_sms,
                spec.training.gpu.sm_count);

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
  const double gated_q = fill.gated_prediction_quantile;
  // Like the runtime: ours behind the gate plans to the gated quantile (the gate bounds a too-long
  // prediction to one item of overrun); everything with no device gate plans to the low one.
  const bool gated_planning = fill.gated && fill.strategy == FillStrategy::Ours;
  // Predictions come from the runtime's own predictor, fed with a window of jittered samples of
  // each class (what it would have seen after that many iterations).
  Rng sample_rng(spec.workload.seed ^ 0x5EEDF00Dull);
  // The p2p transfers that start and end a bubble (their bandwidth part, which fill beside
  // them can stretch) and the all-reduce window's bandwidth share.
  const double transfer_us =
      p > 1 && sched.p2p_bytes_per_us > 0 ? static_cast<double>(sched.p2p_message_bytes) / sched.p2p_bytes_per_us : 0.0;
  const double allreduce_bandwidth_share =
      sched.allreduce_us > 0 ? std::max(0.0, 1.0 - costs.dp_allreduce_latency_us / sched.allreduce_us) : 0.0;
  const int virtual_stages = static_cast<int>(tl.stage_of_virtual.size());
  auto on_other_stage = [&](int vs, int s) {
    return vs >= 0 && vs < virtual_stages && tl.stage_of_virtual[vs] != s;
  };
  auto sends_across = [&](const schedule::Op& op, int s) {
    if (op.type == schedule::OpType::Forward) return on_other_stage(op.virtual_stage + 1, s);
    if (op.type == schedule::OpType::Backward || op.type == schedule::OpType::BackwardInput)
      return on_other_stage(op.virtual_stage - 1, s);
    return false;
  };
  auto receives_across = [&](const schedule::Op& op, int s) {
    if (op.type == schedule::OpType::Forward) return on_other_stage(op.virtual_stage - 1, s);
    if (op.type == schedule::OpType::Backward || op.type == schedule::OpType::BackwardInput)
      return on_other_stage(op.virtual_stage + 1, s);
    return false;
  };
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
      bc.gated_predicted_us = predictor.predict(key, gated_q).quantile_us;
      bc.free_bytes = b.free_bytes;
      bc.fillable = b.duration_us >= fill.min_bubble_us && (fill.fill_optimizer_bubble || b.kind != pfBubbleOptimizer);
      if (b.kind == pfBubbleOptimizer) {
        bc.comm_window_share = allreduce_bandwidth_share;
      } else {
        const int before = b.op_before;
        if (before >= 0 && before < static_cast<int>(st.ops.size()) && sends_across(st.ops[before], s))
          bc.transfer_out_us = transfer_us;
        if (before + 1 < static_cast<int>(st.ops.size()) && receives_across(st.ops[before + 1], s))
          bc.transfer_in_us = transfer_us;
      }
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

  // The strategy: ours fills gpu.sm_count - reserved_sms SMs, so its items run at
  // partition_speed of a whole GPU's rate; the peers use every SM.
  StrategyParams params;
  params.strategy = fill.strategy;
  params.gated = fill.gated;
  params.sm_count = spec.training.gpu.sm_count;
  params.reserved = fill.strategy == FillStrategy::Ours && fill.reserved_sms > 0;
  params.fill_sm_share = fill.strategy == FillStrategy::Ours
                             ? static_cast<double>(spec.training.gpu.sm_count - fill.reserved_sms) / spec.training.gpu.sm_count
                             : 1.0;
  params.launch_overhead_us = fill.launch_overhead_us;
  params.gate_visibility_us = fill.gate_visibility_us;
  params.interference = spec.interference;
  params.freeride = fill.freeride;
  params.tally = fill.tally;
  params = effective_params(params);
  const bool planned = fill.strategy == FillStrategy::Ours || fill.strategy == FillStrategy::PaperStyle;
  r.strategy = fill.enabled ? strategy_name(fill.strategy) : "none";
  r.interference = spec.interference;
  r.reserved_sms = params.reserved ? fill.reserved_sms : 0;
  r.sm_count = spec.training.gpu.sm_count;

  // Memory a fill job may use: the stage's arena for resident state, the bubble's free memory
  // for workspace, both capped by fill.max_arena_gib.
  const size_t arena_cap = fill.max_arena_gib > 0 ? static_cast<size_t>(fill.max_arena_gib * 1073741824.0) : SIZE_MAX;
  for (int s = 0; s < p; ++s) {
    r.stages[s].arena_bytes = std::min(r.stages[s].arena_bytes, arena_cap);
    for (BubbleClass& bc : classes[s]) bc.free_bytes = std::min(bc.free_bytes, arena_cap);
  }

  std::vector<std::vector<JobConfigModel>> models(type_count);
  std::vector<double> intensity(type_count, 0.5);
  // setup[type][stage]: the config the job runs on that stage, -1: it does not fit. Ours and
  // paper-style: choose_setup_config for the arena (the planner then picks per bubble). The
  // peers that do not plan run one config: the best throughput whose resident + workspace
  // memory fits the stage's arena, FreeRide's per-stage memory cap rule (a task is admitted
  // only if `stage_id_gpu_memory_map[stage] > gpu_memory`), given to naive and Tally too.
  std::vector<std::vector<int>> setup(type_count, std::vector<int>(p, -1));
  std::vector<char> placeable(type_count, 0);
  for (size_t t = 0; t < type_count; ++t) {
    intensity[t] = effective_mem_intensity(spec.job_types[t]);
    models[t] = planner_configs(spec.job_types[t], fill.efficiency * partition_speed(params.fill_sm_share, intensity[t]));
    for (int s = 0; s < p; ++s) {
      const size_t arena = r.stages[s].arena_bytes;
      if (planned) {
        setup[t][s] = choose_setup_config(models[t], arena, 1);
      } else {
        double best_rate = 0.0;
        for (size_t k = 0; k < models[t].size(); ++k) {
          const JobConfigModel& m = models[t][k];
          if (m.resident_bytes > arena || m.workspace_bytes_per_item > arena - m.resident_bytes) continue;
          const double rate = m.work_per_item / m.item_cost_us;
          if (setup[t][s] < 0 || rate > best_rate) {
            setup[t][s] = static_cast<int>(k);
            best_rate = rate;
          }
        }
      }
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
    req.predicted_us = gated_planning ? bc.gated_predicted_us : bc.predicted_us;
    // What earlier slices in this bubble used comes off the budget like the margin does.
    req.margin_us = fill.margin_us + consumed_us;
    req.margin_fraction = fill.margin_fraction;
    req.launch_overhead_us = fill.launch_overhead_us;
    req.free_bytes = bc.free_bytes > setup_model.resident_bytes ? bc.free_bytes - setup_model.resident_bytes : 0;
    req.fill_sms = 1;
    req.remaining_items = remaining_items;
    req.gated = gated_planning;
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
      c.dedicated_item_us = spec.job_types[type].configs[plan.config_index].item_us;
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

  // The queue as one bubble on one GPU sees it (strategies.hpp's JobSource).
  struct GpuQueue final : JobSource {
    std::function<int(int, double)> take;
    std::function<void(int, double)> completed;
    std::function<void(const FillSlice&)> recorded;
    const std::vector<FillJob>* jobs = nullptr;
    std::vector<JobState>* state = nullptr;
    const std::vector<std::vector<JobConfigModel>>* models = nullptr;
    const std::vector<std::vector<int>>* setup = nullptr;
    const std::vector<FillJobType>* types = nullptr;
    const std::vector<double>* intensity = nullptr;
    // The job view of each (type, stage) with a setup config, all but remaining_work.
    const std::vector<JobView>* views = nullptr;
    size_t stages = 0;
    std::function<CachedPlan(int type, double consumed)> planner;
    GpuState* gpu = nullptr;
    int stage = 0;
    int bubble_index = 0;
    double bubble_abs_us = 0.0;  // bubble start, absolute
    double bubble_rel_us = 0.0;  // bubble start in the iteration
    bool record_slices = false;

    bool current(double at_us, JobView* out) override {
      if (gpu->job < 0) {
        gpu->job = take(stage, bubble_abs_us + at_us);
        if (gpu->job < 0) return false;
        gpu->type = (*jobs)[gpu->job].type;
      }
      *out = (*views)[static_cast<size_t>(gpu->type) * stages + stage];
      out->remaining_work = (*state)[gpu->job].remaining;
      return true;
    }
    PlannedSegment plan(double consumed_us) override {
      const CachedPlan c = planner(gpu->type, consumed_us);
      PlannedSegment seg;
      seg.fill = c.fill;
      seg.items = c.items;
      seg.item_us = c.item_us;
      seg.dedicated_item_us = c.dedicated_item_us;
      seg.work_per_item = c.work_per_item;
      return seg;
    }
    void consume(double work, double end_us) override {
      JobState& js = (*state)[gpu->job];
      js.remaining -= work;
      if (js.remaining <= 1e-9) {
        js.remaining = 0;
        js.completion_us = bubble_abs_us + end_us;
        completed((*jobs)[gpu->job].type, end_us);
        gpu->job = -1;
      }
    }
    void record(double start_us, double end_us, double items) override {
      if (!record_slices) return;
      FillSlice fs;
      fs.stage = stage;
      fs.bubble_index = bubble_index;
      fs.start_us = bubble_rel_us + start_us;
      fs.busy_us = end_us - start_us;
      fs.job_type = (*jobs)[gpu->job].type;
      fs.job = (*jobs)[gpu->job].sequence;
      fs.items = static_cast<uint64_t>(std::llround(items));
      recorded(fs);
    }
  };
  std::vector<JobView> job_views(type_count * static_cast<size_t>(p));
  for (size_t t = 0; t < type_count; ++t) {
    for (int s = 0; s < p; ++s) {
      const int k = setup[t][s];
      if (k < 0) continue;
      JobView& v = job_views[t * p + s];
      v.item_us = models[t][k].item_cost_us;
      v.dedicated_item_us = spec.job_types[t].configs[k].item_us;
      v.work_per_item = models[t][k].work_per_item;
      v.mem_intensity = intensity[t];
      v.kernel_us = spec.job_types[t].kernel_us;
      v.block_us = spec.job_types[t].block_us;
    }
  }
  GpuQueue queue;
  queue.views = &job_views;
  queue.stages = static_cast<size_t>(p);
  queue.take = take_job;
  queue.completed = [&](int type, double) {
    ++r.jobs_completed;
    ++r.completed_per_type[type];
  };
  queue.recorded = [&](const FillSlice& fs) { r.recorded_slices.push_back(fs); };
  queue.jobs = &jobs;
  queue.state = &state;
  queue.models = &models;
  queue.setup = &setup;
  queue.types = &spec.job_types;
  queue.intensity = &intensity;
  const BubbleClass* current_class = nullptr;
  queue.planner = [&](int type, double consumed) -> CachedPlan {
    const int s = queue.stage;
    if (consumed == 0.0) {
      CachedPlan& c = cache[type][s][current_class->index];
      if (!c.computed) c = to_cached(type, plan_slice(request_for(type, s, *current_class, 0.0, UINT64_MAX), models[type]));
      return c;
    }
    return to_cached(type, plan_slice(request_for(type, s, *current_class, consumed, UINT64_MAX), models[type]));
  };

  Rng jitter_rng(spec.workload.seed ^ 0xA5A5A5A5DEADBEEFull);
  Rng host_rng(spec.workload.seed ^ 0x0F0E0D0C0B0A0908ull);  // FreeRide's host polling only
  const int record_it = spec.record_iteration >= 0 ? std::min(spec.record_iteration, spec.iterations - 1)
                                                   : spec.iterations - 1;
  r.recorded_iteration = record_it;
  std::vector<double> stage_fillable(p, 0.0), stage_filled(p, 0.0);
  double slowdown_sum = 0.0, gpu_overrun_sum = 0.0, yield_sum = 0.0, corun_sum = 0.0, comm_sum = 0.0;
  QuantileSketch first_block, sm_own, end_delay;

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
    double max_delay = 0.0;
    for (int g = 0; g < r.gpus; ++g) {
      const int s = g / gpus_per_stage;
      double delay_total = 0.0;
      queue.gpu = &gpus[g];
      queue.stage = s;
      queue.record_slices = recording && g % gpus_per_stage == 0;
      for (const BubbleClass& bc : classes[s]) {
        if (!bc.fillable) continue;
        const double actual = fill.jitter > 0 ? bc.nominal_us * (1.0 + fill.jitter * (2.0 * jitter_rng.uniform() - 1.0))
                                              : bc.nominal_us;
        stage_fillable[s] += actual;
        if (!filling) continue;
        BubbleInput in;
        in.actual_us = actual;
        in.predicted_us = gated_planning ? bc.gated_predicted_us : bc.predicted_us;
        in.transfer_out_us = bc.transfer_out_us;
        in.transfer_in_us = bc.transfer_in_us;
        in.comm_window_share = bc.comm_window_share;
        current_class = &bc;
        queue.bubble_index = bc.index;
        queue.bubble_abs_us = t0 + bc.start_us;
        queue.bubble_rel_us = bc.start_us;
        const BubbleOutcome o = simulate_bubble(params, in, queue, host_rng);
        stage_filled[s] += o.filled_us;
        r.fill_work_dedicated_us += o.work_dedicated_us;
        r.post_us += o.post_us;
        r.slices += static_cast<uint64_t>(o.segments);
        if (o.overran) ++r.overrun_slices;
        ++r.bubble_visits;
        delay_total += o.main_delay_us();
        yield_sum += o.yield_us;
        corun_sum += o.corun_us;
        comm_sum += o.comm_us;
        first_block.add(o.first_block_us);
        sm_own.add(o.sm_own_us);
        end_delay.add(o.yield_us + o.corun_us);
      }
      max_delay = std::max(max_delay, delay_total);
      gpu_overrun_sum += delay_total;
    }
    slowdown_sum += max_delay;
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
  r.fill_rate = r.filled_us + r.post_us > 0 ? r.fill_work_dedicated_us / (r.filled_us + r.post_us) : 0.0;
  r.fill_per_bubble_second = r.fillable_bubble_us > 0 ? r.fill_work_dedicated_us / r.fillable_bubble_us : 0.0;
  r.slowdown_fraction = slowdown_sum / spec.iterations / tl.iteration_us;
  const double gpu_iterations_us = static_cast<double>(r.gpus) * spec.iterations * tl.iteration_us;
  r.mean_gpu_overrun_fraction = gpu_overrun_sum / gpu_iterations_us;
  r.yield_fraction = yield_sum / gpu_iterations_us;
  r.corun_fraction = corun_sum / gpu_iterations_us;
  r.comm_fraction = comm_sum / gpu_iterations_us;
  r.first_block_p50_us = first_block.quantile(0.5);
  r.first_block_p99_us = first_block.quantile(0.99);
  r.sm_own_p50_us = sm_own.quantile(0.5);
  r.sm_own_p99_us = sm_own.quantile(0.99);
  r.end_delay_p50_us = end_delay.quantile(0.5);
  r.end_delay_p99_us = end_delay.quantile(0.99);
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
