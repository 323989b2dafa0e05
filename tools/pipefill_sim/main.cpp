// pipefill-sim: how much pipeline bubble does a training job have at a given scale, and what
// would filling it with other jobs give? See docs/simulator.md.
//
//   pipefill-sim --config configs/llm40b_scale.json [--sweep-gpus 1024,2048] [--schedule 1f1b]
//                [--csv out.csv] [--json out.json] [--svg-utilisation u.svg] [--svg-timeline t.svg]
//                [--trace trace.json] [--iterations N] [--seed S] [--quiet]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cluster/cluster_sim.hpp"
#include "cluster/config_io.hpp"
#include "cluster/report.hpp"
#include "common/error.hpp"
#include "core/scheduler.hpp"

using namespace pipefill;
using namespace pipefill::cluster;

namespace {

int error_exit(const std::string& message) {
  std::fprintf(stderr, "pipefill-sim: error: %s\n", message.c_str());
  return 1;
}

// Progress on stderr, redrawn at most every whole percent.
class ProgressBar {
 public:
  ProgressBar(bool enabled, long long total) : enabled_(enabled), total_(total) {}
  void update(long long done) {
    if (!enabled_ || total_ <= 0) return;
    const int pct = static_cast<int>(100 * done / total_);
    if (pct == last_) return;
    last_ = pct;
    const int width = 40, filled = pct * width / 100;
    std::fprintf(stderr, "\r[%.*s%*s] %3d%%", filled, "========================================", width - filled, "", pct);
    if (done >= total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  long long total_;
  int last_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipefill-sim: pipeline-bubble and fill simulation of a training cluster"};
  std::string config_path, csv_path, json_path, svg_util_path, svg_timeline_path, trace_path;
  std::string sweep_gpus_text, schedule_text, policy_text;
  std::optional<int> gpus, iterations, tensor, pipeline, global_batch, micro_batch, chunks, record_iteration;
  std::optional<uint64_t> seed;
  std::optional<double> jitter, efficiency;
  bool quiet = false, no_fill = false;
  app.add_option("--config", config_path, "JSON config (see configs/)")->required();
  app.add_option("--gpus", gpus, "GPU count (overrides the config; disables its sweep)");
  app.add_option("--sweep-gpus", sweep_gpus_text, "comma-separated GPU counts, e.g. 1024,2048,4096,8192");
  app.add_option("--schedule", schedule_text, "gpipe | 1f1b | interleaved | zbh1 (overrides the config and its sweep)");
  app.add_option("--iterations", iterations, "training iterations to simulate");
  app.add_option("--seed", seed, "workload seed");
  app.add_option("--tp", tensor, "tensor-parallel size");
  app.add_option("--pp", pipeline, "pipeline-parallel size (stages)");
  app.add_option("--global-batch", global_batch, "global batch in sequences");
  app.add_option("--micro-batch", micro_batch, "micro-batch in sequences");
  app.add_option("--chunks", chunks, "model chunks per stage for interleaved 1F1B");
  app.add_option("--policy", policy_text, "fill-job policy: fifo | priority | srpt | fair");
  app.add_option("--jitter", jitter, "bubble duration jitter (fraction, uniform +-)");
  app.add_option("--efficiency", efficiency, "fill throughput in a bubble vs a dedicated GPU (0, 1]");
  app.add_option("--record-iteration", record_iteration, "iteration recorded for --svg-timeline/--trace (default: last)");
  app.add_flag("--no-fill", no_fill, "schedule only: no fill jobs");
  app.add_option("--csv", csv_path, "write one CSV row per run");
  app.add_option("--json", json_path, "write the full results as JSON");
  app.add_option("--svg-utilisation", svg_util_path, "write an SVG plot of bubble share and utilisation gain vs GPUs");
  app.add_option("--svg-timeline", svg_timeline_path, "write an SVG timeline of one iteration (last run)");
  app.add_option("--trace", trace_path, "write a Chrome trace of one iteration (last run)");
  app.add_flag("--quiet", quiet, "no summary table, no progress bar");
  CLI11_PARSE(app, argc, argv);

  SimConfig cfg;
  if (load_sim_config(config_path, &cfg) != pfSuccess) return error_exit(last_error_message());
  ClusterSimSpec& sim = cfg.sim;
  auto& par = sim.training.parallel;
  if (tensor) par.tensor = *tensor;
  if (pipeline) par.pipeline = *pipeline;
  if (global_batch) par.global_batch = *global_batch;
  if (micro_batch) par.micro_batch = *micro_batch;
  if (chunks) par.chunks = *chunks;
  if (iterations) {
    if (*iterations < 1) return error_exit(fmt::format("--iterations must be >= 1, got {}", *iterations));
    sim.iterations = *iterations;
  }
  if (record_iteration) sim.record_iteration = *record_iteration;
  if (seed) sim.workload.seed = *seed;
  if (jitter) sim.fill.jitter = *jitter;
  if (efficiency) sim.fill.efficiency = *efficiency;
  if (no_fill) sim.fill.enabled = false;
  if (!policy_text.empty() && !parse_policy(policy_text.c_str(), &sim.fill.policy))
    return error_exit(fmt::format("--policy must be fifo, priority, srpt or fair, got '{}'", policy_text));

  std::vector<schedule::ScheduleKind> schedules;
  if (!schedule_text.empty()) {
    schedule::ScheduleKind k;
    if (!schedule::parse_schedule_kind(schedule_text, &k))
      return error_exit(fmt::format("--schedule must be gpipe, 1f1b, interleaved or zbh1, got '{}'", schedule_text));
    schedules.push_back(k);
  } else if (!cfg.sweep_schedules.empty()) {
    schedules = cfg.sweep_schedules;
  } else {
    schedules.push_back(sim.training.schedule);
  }
  std::vector<int> gpu_counts;
  if (gpus) {
    gpu_counts.push_back(*gpus);
  } else if (!sweep_gpus_text.empty()) {
    if (parse_int_list(sweep_gpus_text, "--sweep-gpus", &gpu_counts) != pfSuccess) return error_exit(last_error_message());
  } else if (!cfg.sweep_gpus.empty()) {
    gpu_counts = cfg.sweep_gpus;
  } else {
    gpu_counts.push_back(par.tensor * par.pipeline * par.data);
  }
  const bool single = gpu_counts.size() == 1 && schedules.size() == 1;

  const bool show_progress = !quiet && isatty(STDERR_FILENO);
  ProgressBar bar(show_progress, static_cast<long long>(gpu_counts.size() * schedules.size()) * sim.iterations);
  long long done_before = 0;
  std::vector<RunRecord> runs;
  const auto started = std::chrono::steady_clock::now();
  for (int g : gpu_counts) {
    for (schedule::ScheduleKind kind : schedules) {
      RunRecord rec;
      rec.gpus = g;
      rec.schedule = schedule::schedule_kind_name(kind);
      ClusterSimSpec run = sim;
      run.training.schedule = kind;
      pfResult_t rc = set_gpu_count(&run.training, g);
      if (rc == pfSuccess)
        rc = run_cluster_sim(run, &rec.result, [&](int it, int) { bar.update(done_before + it); });
      rec.ok = rc == pfSuccess;
      if (!rec.ok) {
        rec.error = last_error_message();
        if (single) return error_exit(rec.error);
      }
      done_before += sim.iterations;
      bar.update(done_before);
      runs.push_back(std::move(rec));
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  const RunRecord* last_ok = nullptr;
  for (const auto& r : runs)
    if (r.ok) last_ok = &r;
  if (!quiet) {
    std::printf("%s", summary_table(runs).c_str());
    if (last_ok != nullptr) {
      const ClusterResult& r = last_ok->result;
      std::printf("\n%d iterations per run; bubble%% = pipeline bubbles / pipeline time; idle%% adds the all-reduce "
                  "window; main%% = training compute / GPU time; filled%% = fill busy time / fillable bubble time; "
                  "+fill%% = useful fill work in dedicated-GPU time / GPU time; gain%% = +fill / main (relative "
                  "utilisation gain); slowdown%% = modelled gate overrun (max over GPUs) / iteration.\n%s.\nSimulated in %.2f s.\n",
                  r.iterations, r.note.c_str(), seconds);
    }
  }
  const auto& types = sim.job_types;
  if (!csv_path.empty() && write_text_file(csv_path, csv_report(runs)) != pfSuccess) return error_exit(last_error_message());
  if (!json_path.empty() && write_text_file(json_path, json_report(runs, types).dump(2) + "\n") != pfSuccess)
    return error_exit(last_error_message());
  if (!svg_util_path.empty() && write_text_file(svg_util_path, utilisation_svg(runs)) != pfSuccess)
    return error_exit(last_error_message());
  if ((!svg_timeline_path.empty() || !trace_path.empty()) && last_ok == nullptr)
    return error_exit("no run succeeded: nothing to draw");
  if (!svg_timeline_path.empty() &&
      write_text_file(svg_timeline_path, timeline_svg(last_ok->result, types)) != pfSuccess)
    return error_exit(last_error_message());
  if (!trace_path.empty() && write_text_file(trace_path, chrome_trace(last_ok->result, types).dump() + "\n") != pfSuccess)
    return error_exit(last_error_message());
  if (last_ok == nullptr) return error_exit("no run succeeded");
  return 0;
}
