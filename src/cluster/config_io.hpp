// JSON configuration of a cluster simulation (configs/*.json; schema in docs/simulator.md).
// Unknown keys are errors (they are usually typos); every error names the field and the value.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cluster/cluster_sim.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cluster {

struct SimConfig {
  ClusterSimSpec sim;
  std::string jobs_file;                  // resolved path of the fill-job types file
  std::string schedule_csv;               // resolved path of a PyTorch CSV schedule ("schedule_csv")
  std::vector<int> sweep_gpus;            // optional: GPU counts to sweep
  std::vector<schedule::ScheduleKind> sweep_schedules;  // optional: schedules to sweep
};

// `base_dir` resolves a relative "fill.jobs_file". Does not load the jobs file.
pfResult_t parse_sim_config(const nlohmann::json& doc, const std::string& base_dir, SimConfig* out);
// Parses the file and loads the files it names (load_config_files).
pfResult_t load_sim_config(const std::string& path, SimConfig* out);
// Loads the fill-job types (cfg->jobs_file) and the schedule CSV (cfg->schedule_csv) a parsed
// config names; errors name the field ("fill.jobs_file: ...").
pfResult_t load_config_files(SimConfig* cfg);
// Reads a PyTorch CSV schedule into training->custom_schedule; errors start with `field`.
pfResult_t load_schedule_csv(const std::string& path, const std::string& field, TrainingSpec* training);

// "1024,2048" -> {1024, 2048}; fails naming the bad element.
pfResult_t parse_int_list(const std::string& text, const char* what, std::vector<int>* out);

}  // namespace pipefill::cluster
