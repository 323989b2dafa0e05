// Fill-job workload: job types (data/fill_jobs.json: per-item cost and memory on a dedicated
// H100-class GPU, with provenance) and a seeded generator of Poisson arrivals and job sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/planner.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cluster {

// One way to run a job type (batch size, ...). `item_us` is the time of one item on a whole,
// dedicated GPU; in a bubble an item takes item_us / fill efficiency.
struct FillConfigSpec {
  std::string name;
  double item_us = 0.0;
  double work_per_item = 1.0;     // work units (sequences, images, tokens) per item
  size_t resident_bytes = 0;      // weights (+ optimizer state / KV cache) kept for the job's life
  size_t workspace_bytes = 0;     // per item in flight (activations), from the bubble's memory
};

struct FillJobType {
  std::string name;
  std::string kind;               // "inference" or "training"
  std::string work_unit;          // "sequence", "image", "token"
  std::vector<FillConfigSpec> configs;
  double size_median = 1000.0;    // job size in work units (log-normal median)
  double size_sigma = 0.5;        // log-normal sigma
  int priority = 0;
  std::string provenance;
  // Interference and preemption granularity (docs/simulator.md section 4.2). mem_intensity:
  // the job's share of HBM bandwidth per unit of SM share (src/sim's per-job `mem_intensity`,
  // same name and meaning); default by kind (inference 0.5, training 0.4; the issue-11 research
  // proposal, a judgement). kernel_us: a typical kernel of the job (the host relaunch unit of
  // Tally-style filling); block_us: a typical thread block of those kernels (how soon its SMs
  // free up once the main job's blocks are pending).
  double mem_intensity = -1.0;    // < 0: default by kind
  double kernel_us = 50.0;
  double block_us = 20.0;
};

// mem_intensity with the kind's default applied.
double effective_mem_intensity(const FillJobType& type);

// Parses the "job_types" array of a fill-jobs document. Errors name the entry and field.
pfResult_t parse_fill_job_types(const nlohmann::json& doc, std::vector<FillJobType>* out);
pfResult_t load_fill_job_types(const std::string& path, std::vector<FillJobType>* out);

// The planner's view of a job type's configs in a bubble: item cost slowed by the fill
// efficiency (and, for a strategy that runs on part of the SMs, by partition_speed), one worker
// (an item occupies the fill partition of the GPU).
std::vector<JobConfigModel> planner_configs(const FillJobType& type, double fill_efficiency);

struct WorkloadSpec {
  uint64_t seed = 1;
  double initial_jobs_per_gpu = 1.0;     // jobs queued at time 0, per GPU
  double arrivals_per_gpu_hour = 10.0;   // Poisson arrival rate, per GPU
  std::map<std::string, double> mix;     // type name -> weight; empty: all types equally
};

struct FillJob {
  uint64_t sequence = 0;     // creation order
  int type = 0;              // index into the job types
  double arrival_us = 0.0;
  double size = 0.0;         // work units
  int priority = 0;
};

// Deterministic in (spec, types, gpus, horizon_us): jobs sorted by arrival time (initial jobs at
// 0 first). Sizes: log-normal with the type's median and sigma, at least one item of work and
// at most kMaxJobSize work units. Fails (naming the workload fields) rather than generate more
// than max_jobs jobs.
constexpr double kMaxJobSize = 1e15;
pfResult_t generate_jobs(const WorkloadSpec& spec, const std::vector<FillJobType>& types, int gpus,
                         double horizon_us, std::vector<FillJob>* out, uint64_t max_jobs = UINT64_MAX);

// Small deterministic generator (splitmix64) so results do not depend on the standard
// library's distribution implementations.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double exponential(double rate);
  double normal();

 private:
  uint64_t state_;
};

}  // namespace pipefill::cluster
