// Bounds on the work one cluster simulation may do, checked before the work is done: the
// schedule's compute ops, the fill loop's bubble visits (GPUs x iterations x bubbles), the fill
// jobs the workload generates and the memory all of it needs. A run whose estimate exceeds a
// bound is refused with a message naming the config fields that make it large and the flag
// that raises the bound (pipefill-sim --max-schedule-ops, --max-sim-events, --max-sim-jobs,
// --max-sim-memory-gib). Defaults: docs/simulator.md section 5.
#pragma once

#include <cstdint>
#include <string>

#include "cluster/model.hpp"
#include "pipefill/pipefill.h"
#include "schedule/schedule.hpp"

namespace pipefill::cluster {

struct SimBounds {
  uint64_t max_schedule_ops = 10'000'000;      // compute ops of one iteration, all stages (~1 GB)
  uint64_t max_fill_events = 2'000'000'000;    // GPU x iteration x bubble visits (~30 s on one core)
  uint64_t max_jobs = 10'000'000;              // fill jobs generated (initial + arrivals)
  uint64_t max_memory_bytes = uint64_t{4} << 30;  // estimated simulator memory
};

// The config fields (or flags) a run's GPU count and iteration count came from, for messages.
struct RunFieldNames {
  std::string gpus = "parallelism.gpus";
  std::string iterations = "iterations";
};

// Estimated bytes the timing of `schedule` allocates (op lists, timeline, dependency tables).
uint64_t schedule_memory_bytes(const schedule::ScheduleSpec& schedule);

// Refuses a schedule with more compute ops than bounds.max_schedule_ops, naming the fields of
// `training` that set stages, chunks and micro-batches.
pfResult_t check_schedule_work(const schedule::ScheduleSpec& schedule, const TrainingSpec& training,
                               const SimBounds& bounds);

// "1.23e+09" for large counts, the plain number for small ones.
std::string format_count(double value);

}  // namespace pipefill::cluster
