#include "cluster/run_plan.hpp"

#include <cmath>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "common/error.hpp"
#include "core/scheduler.hpp"
#include "schedule/schedule.hpp"

namespace pipefill::cluster {

pfResult_t plan_runs(const SimConfig& config, const RunOverrides& o, std::vector<PlannedRun>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "plan_runs: out must not be null");
  SimConfig cfg = config;
  ClusterSimSpec& sim = cfg.sim;
  auto& par = sim.training.parallel;
  // Ranges are checked by the model's validation (naming the config field); the flags are
  // only required to be positive here, so that the message says which flag was wrong.
  auto positive = [](const char* flag, const std::optional<int>& v) -> pfResult_t {
    if (v && *v < 1) return fail(pfErrorInvalidArgument, "{} must be >= 1, got {}", flag, *v);
    return pfSuccess;
  };
  PF_TRY(positive("--tp", o.tensor));
  PF_TRY(positive("--pp", o.pipeline));
  PF_TRY(positive("--global-batch", o.global_batch));
  PF_TRY(positive("--micro-batch", o.micro_batch));
  PF_TRY(positive("--chunks", o.chunks));
  PF_TRY(positive("--iterations", o.iterations));
  PF_TRY(positive("--gpus", o.gpus));
  if (o.microbatch_group_size && *o.microbatch_group_size < 0)
    return fail(pfErrorInvalidArgument, "--microbatch-group-size must be >= 0, got {}", *o.microbatch_group_size);
  if (o.record_iteration && *o.record_iteration < -1)
    return fail(pfErrorInvalidArgument, "--record-iteration must be >= -1, got {}", *o.record_iteration);
  if (o.tensor) par.tensor = *o.tensor;
  if (o.pipeline) par.pipeline = *o.pipeline;
  if (o.global_batch) par.global_batch = *o.global_batch;
  if (o.micro_batch) par.micro_batch = *o.micro_batch;
  if (o.chunks) par.chunks = *o.chunks;
  if (o.microbatch_group_size) par.microbatch_group_size = *o.microbatch_group_size;
  if (o.iterations) {
    sim.iterations = *o.iterations;
    sim.names.iterations = "--iterations";
  }
  if (o.record_iteration) sim.record_iteration = *o.record_iteration;
  if (o.seed) sim.workload.seed = *o.seed;
  if (o.jitter) sim.fill.jitter = *o.jitter;
  if (o.efficiency) sim.fill.efficiency = *o.efficiency;
  if (o.no_fill) sim.fill.enabled = false;
  if (!o.policy.empty() && !parse_policy(o.policy.c_str(), &sim.fill.policy))
    return fail(pfErrorInvalidArgument, "--policy must be fifo, priority, srpt or fair, got '{}'", o.policy);
  auto real = [](const char* flag, const std::optional<double>& v, double lo, double hi, double* dst) -> pfResult_t {
    if (!v) return pfSuccess;
    if (!std::isfinite(*v) || *v < lo || *v > hi)
      return fail(pfErrorInvalidArgument, "{} must be in [{}, {}], got {}", flag, lo, hi, *v);
    *dst = *v;
    return pfSuccess;
  };
  PF_TRY(real("--mem-interference", o.mem_interference, 0, 100, &sim.interference.mem_slowdown));
  PF_TRY(real("--comm-interference", o.comm_interference, 0, 100, &sim.interference.comm_slowdown));
  PF_TRY(real("--min-bubble-us", o.min_bubble_us, 0, 1e15, &sim.fill.min_bubble_us));
  PF_TRY(real("--max-arena-gib", o.max_arena_gib, 0, 1 << 20, &sim.fill.max_arena_gib));
  PF_TRY(real("--arrivals-per-gpu-hour", o.arrivals_per_gpu_hour, 0, 1e9, &sim.workload.arrivals_per_gpu_hour));
  if (o.reserved_sms) {
    if (*o.reserved_sms < 0) return fail(pfErrorInvalidArgument, "--reserved-sms must be >= 0, got {}", *o.reserved_sms);
    sim.fill.reserved_sms = *o.reserved_sms;
  }
  if (o.no_optimizer_fill && o.optimizer_fill)
    return fail(pfErrorInvalidArgument, "--optimizer-fill and --no-optimizer-fill contradict each other");
  if (o.no_optimizer_fill) sim.fill.fill_optimizer_bubble = false;
  if (o.optimizer_fill) sim.fill.fill_optimizer_bubble = true;
  if (!o.strategy.empty() && !parse_strategy(o.strategy, &sim.fill.strategy))
    return fail(pfErrorInvalidArgument, "--strategy must be {}, got '{}'", strategy_choices(), o.strategy);
  if (!o.mix.empty()) {
    std::map<std::string, double> mix;
    size_t pos = 0;
    while (pos <= o.mix.size()) {
      const size_t comma = std::min(o.mix.find(',', pos), o.mix.size());
      const std::string item = o.mix.substr(pos, comma - pos);
      const size_t eq = item.find('=');
      char* end = nullptr;
      const double w = eq == std::string::npos ? -1.0 : std::strtod(item.c_str() + eq + 1, &end);
      if (eq == std::string::npos || eq == 0 || end == nullptr || *end != '\0' || !std::isfinite(w) || w < 0)
        return fail(pfErrorInvalidArgument, "--mix entries must be name=weight with weight >= 0, got '{}'", item);
      const std::string name = item.substr(0, eq);
      bool known = false;
      for (const auto& t : sim.job_types) known = known || t.name == name;
      if (!known) return fail(pfErrorInvalidArgument, "--mix names unknown job type '{}'", name);
      mix[name] = w;
      pos = comma + 1;
    }
    sim.workload.mix = std::move(mix);
  }
  sim.bounds = o.bounds;

  // Schedules: --schedule-csv, --schedule, the config's sweep, its CSV, its schedule.
  if (!o.schedule.empty() && !o.schedule_csv.empty())
    return fail(pfErrorInvalidArgument, "give --schedule or --schedule-csv, not both");
  std::vector<schedule::ScheduleKind> kinds;
  bool custom = false;
  if (!o.schedule_csv.empty()) {
    PF_TRY(load_schedule_csv(o.schedule_csv, "--schedule-csv", &sim.training));
    custom = true;
  } else if (!o.schedule.empty()) {
    schedule::ScheduleKind k;
    if (!schedule::parse_schedule_kind(o.schedule, &k))
      return fail(pfErrorInvalidArgument, "--schedule must be {}, got '{}'", schedule::schedule_kind_choices(), o.schedule);
    kinds.push_back(k);
    sim.training.custom_schedule = nullptr;  // a named schedule replaces the config's CSV
  } else if (sim.training.custom_schedule) {
    custom = true;
  } else if (!cfg.sweep_schedules.empty()) {
    kinds = cfg.sweep_schedules;
  } else {
    kinds.push_back(sim.training.schedule);
  }

  // GPU counts, each with the field or flag it came from.
  std::vector<std::pair<int, std::string>> gpu_counts;
  if (o.gpus) {
    gpu_counts.emplace_back(*o.gpus, "--gpus");
  } else if (!o.sweep_gpus.empty()) {
    std::vector<int> list;
    PF_TRY(parse_int_list(o.sweep_gpus, "--sweep-gpus", &list));
    for (size_t i = 0; i < list.size(); ++i) gpu_counts.emplace_back(list[i], fmt::format("--sweep-gpus[{}]", i));
  } else if (!cfg.sweep_gpus.empty()) {
    for (size_t i = 0; i < cfg.sweep_gpus.size(); ++i)
      gpu_counts.emplace_back(cfg.sweep_gpus[i], fmt::format("sweep_gpus[{}]", i));
  } else {
    const long long product = static_cast<long long>(par.tensor) * par.pipeline * par.data;
    if (product > 2147483647LL)
      return fail(pfErrorInvalidArgument,
                  "parallelism.tensor ({}) x parallelism.pipeline ({}) x parallelism.data ({}) GPUs exceed 2147483647",
                  par.tensor, par.pipeline, par.data);
    gpu_counts.emplace_back(static_cast<int>(product), "parallelism.gpus");
  }

  std::vector<PlannedRun> runs;
  const size_t schedule_count = custom ? 1 : kinds.size();
  for (const auto& [gpus, field] : gpu_counts) {
    for (size_t k = 0; k < schedule_count; ++k) {
      PlannedRun run;
      run.gpus = gpus;
      run.spec = sim;
      run.spec.names.gpus = field;
      if (custom) {
        run.schedule = "custom";
      } else {
        run.spec.training.schedule = kinds[k];
        run.schedule = schedule::schedule_kind_name(kinds[k]);
      }
      if (set_gpu_count(&run.spec.training, gpus, field) != pfSuccess) run.error = last_error_message();
      runs.push_back(std::move(run));
    }
  }
  *out = std::move(runs);
  return pfSuccess;
}

}  // namespace pipefill::cluster
