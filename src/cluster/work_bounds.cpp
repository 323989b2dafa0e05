#include "cluster/work_bounds.hpp"

#include <fmt/format.h>

#include "common/error.hpp"

namespace pipefill::cluster {

std::string format_count(double value) {
  if (value < 1e7) return fmt::format("{:.0f}", value);
  return fmt::format("{:.3g}", value);
}

uint64_t schedule_memory_bytes(const schedule::ScheduleSpec& schedule) {
  const double ops = static_cast<double>(schedule::compute_op_count(schedule));
  const double keys = static_cast<double>(schedule.stages) * schedule.chunks * schedule.microbatches;
  // Op list + timeline copy; two end-time tables (8 bytes) and two waiter tables (4 bytes).
  const double bytes = ops * 2.0 * sizeof(schedule::Op) + keys * 24.0 + schedule.stages * 256.0;
  return bytes > 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(bytes);
}

pfResult_t check_schedule_work(const schedule::ScheduleSpec& schedule, const TrainingSpec& training,
                               const SimBounds& bounds) {
  const uint64_t ops = schedule::compute_op_count(schedule);
  if (ops <= bounds.max_schedule_ops) return pfSuccess;
  const auto& par = training.parallel;
  std::string shape;
  if (schedule.kind == schedule::ScheduleKind::Custom) {
    shape = fmt::format("the schedule_csv '{}'", training.custom_schedule_source);
  } else {
    shape = fmt::format("{} stages (parallelism.pipeline) x {} chunks{} x {} micro-batches (parallelism.global_batch {} / "
                        "(parallelism.data {} x parallelism.micro_batch {})) x {} ops",
                        schedule.stages, schedule.chunks, schedule.chunks > 1 ? " (parallelism.chunks)" : "",
                        schedule.microbatches, par.global_batch, par.data, par.micro_batch,
                        schedule::uses_weight_split(schedule.kind) ? 3 : 2);
  }
  return fail(pfErrorInvalidArgument,
              "the {} schedule has {} compute ops per iteration ({}), more than the bound of {} (--max-schedule-ops)",
              schedule::schedule_kind_name(schedule.kind), format_count(static_cast<double>(ops)), shape,
              format_count(static_cast<double>(bounds.max_schedule_ops)));
}

}  // namespace pipefill::cluster
