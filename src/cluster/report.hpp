// Outputs of the cluster simulator: summary table, CSV, JSON, hand-written SVG plots and a
// Chrome trace of one iteration. Pure functions of the results (tested on small runs).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cluster/cluster_sim.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cluster {

// One run of a sweep: its result, or why it could not run (e.g. interleaved with m % p != 0).
struct RunRecord {
  int gpus = 0;
  std::string schedule;
  bool ok = false;
  std::string error;
  ClusterResult result;
};

std::string summary_table(const std::vector<RunRecord>& runs);
std::string csv_report(const std::vector<RunRecord>& runs);
nlohmann::json json_report(const std::vector<RunRecord>& runs, const std::vector<FillJobType>& types);
// Utilisation vs GPU count: per schedule, the training job's busy share (dashed) and the
// utilisation with filling (busy share + useful fill work, solid).
std::string utilisation_svg(const std::vector<RunRecord>& runs);
// One iteration of one run: per stage, the ops, the bubbles and the recorded fill slices.
std::string timeline_svg(const ClusterResult& result, const std::vector<FillJobType>& types);
// Chrome trace (chrome://tracing, Perfetto) of the same iteration.
nlohmann::json chrome_trace(const ClusterResult& result, const std::vector<FillJobType>& types);

pfResult_t write_text_file(const std::string& path, const std::string& text);

}  // namespace pipefill::cluster
