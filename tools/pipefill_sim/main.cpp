// pipefill-sim: how much pipeline bubble does a training job have at a given scale, and what
// would filling it with other jobs give? See docs/simulator.md.
//
//   pipefill-sim --config configs/llm40b_scale.json [--sweep-gpus 1024,2048] [--schedule 1f1b]
//                [--schedule-csv pytorch.csv] [--csv out.csv] [--json out.json]
//                [--svg-utilisation u.svg] [--svg-timeline t.svg] [--trace trace.json]
//                [--iterations N] [--seed S] [--max-sim-events N] [--quiet]
//                [--compare [--no-sensitivity]] [--strategy S] [--mem-interference B] [--comm-interference G]
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <new>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cluster/cluster_sim.hpp"
#include "cluster/compare.hpp"
#include "cluster/config_io.hpp"
#include "cluster/report.hpp"
#include "cluster/run_plan.hpp"
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

int run_main(int argc, char** argv) {
  CLI::App app{"pipefill-sim: pipeline-bubble and fill simulation of a training cluster"};
  std::string config_path, csv_path, json_path, svg_util_path, svg_timeline_path, trace_path;
  RunOverrides o;
  std::optional<uint64_t> max_schedule_ops, max_sim_events, max_sim_jobs;
  std::optional<double> max_sim_memory_gib;
  bool quiet = false;
  app.add_option("--config", config_path, "JSON config (see configs/)")->required();
  app.add_option("--gpus", o.gpus, "GPU count (overrides the config; disables its sweep)");
  app.add_option("--sweep-gpus", o.sweep_gpus, "comma-separated GPU counts, e.g. 1024,2048,4096,8192");
  app.add_option("--schedule", o.schedule,
                 std::string(schedule::schedule_kind_choices()) + " (overrides the config and its sweep)");
  app.add_option("--schedule-csv", o.schedule_csv,
                 "PyTorch CSV schedule (_dump_csv format: one row of actions per rank) to simulate instead");
  app.add_option("--iterations", o.iterations, "training iterations to simulate");
  app.add_option("--seed", o.seed, "workload seed");
  app.add_option("--tp", o.tensor, "tensor-parallel size");
  app.add_option("--pp", o.pipeline, "pipeline-parallel size (stages)");
  app.add_option("--global-batch", o.global_batch, "global batch in sequences");
  app.add_option("--micro-batch", o.micro_batch, "micro-batch in sequences");
  app.add_option("--chunks", o.chunks, "model chunks per stage for the looped multi-chunk schedules");
  app.add_option("--microbatch-group-size", o.microbatch_group_size,
                 "interleaved schedules: Megatron's microbatch_group_size_per_vp_stage (0: PyTorch's rounds)");
  app.add_option("--policy", o.policy, "fill-job policy: fifo | priority | srpt | fair");
  app.add_option("--jitter", o.jitter, "bubble duration jitter (fraction, uniform +-)");
  app.add_option("--efficiency", o.efficiency, "fill throughput in a bubble vs a dedicated GPU (0, 1]");
  app.add_option("--record-iteration", o.record_iteration, "iteration recorded for --svg-timeline/--trace (default: last)");
  app.add_flag("--no-fill", o.no_fill, "schedule only: no fill jobs");
  bool compare = false, no_sensitivity = false;
  app.add_option("--strategy", o.strategy, std::string("fill strategy: ") + strategy_choices());
  app.add_flag("--compare", compare,
               "run no fill and every strategy on the same pipeline, jobs and seed; print the side-by-side table, the "
               "ratios to ours, an interference sensitivity table and the targets (met / missed)");
  app.add_flag("--no-sensitivity", no_sensitivity, "with --compare: skip the interference sensitivity runs");
  bool frontier = false;
  app.add_flag("--frontier", frontier,
               "with --compare: also run each strategy across its own knob (ours' gated quantile, paper-style's "
               "quantile, FreeRide's step margin) and print the slowdown-vs-filled frontier");
  app.add_option("--mem-interference", o.mem_interference,
                 "beta: main work beside fill runs (1 + beta x SM share x mem_intensity) times longer (default 0.6)");
  app.add_option("--comm-interference", o.comm_interference,
                 "gamma: the transfer part of a comm kernel beside fill, the same form (default 0.5)");
  app.add_option("--reserved-sms", o.reserved_sms, "ours: SMs kept free for the main job");
  app.add_option("--min-bubble-us", o.min_bubble_us, "bubbles shorter than this are not filled");
  app.add_option("--max-arena-gib", o.max_arena_gib, "cap on the memory a fill job may use per GPU (0: none)");
  app.add_option("--arrivals-per-gpu-hour", o.arrivals_per_gpu_hour, "fill-job arrivals per GPU-hour");
  app.add_option("--mix", o.mix, "fill-job mix, name=weight,... (replaces the config's workload.mix)");
  app.add_flag("--no-optimizer-fill", o.no_optimizer_fill, "do not fill the DP all-reduce window (the default)");
  app.add_flag("--optimizer-fill", o.optimizer_fill, "also fill the DP all-reduce window (the runtime's fill_optimizer_bubbles = 1)");
  app.add_option("--max-schedule-ops", max_schedule_ops,
                 fmt::format("refuse schedules with more compute ops per iteration (default {})", o.bounds.max_schedule_ops));
  app.add_option("--max-sim-events", max_sim_events,
                 fmt::format("refuse runs with more GPU x iteration x bubble visits (default {})", o.bounds.max_fill_events));
  app.add_option("--max-sim-jobs", max_sim_jobs,
                 fmt::format("refuse workloads generating more fill jobs (default {})", o.bounds.max_jobs));
  app.add_option("--max-sim-memory-gib", max_sim_memory_gib,
                 fmt::format("refuse runs estimated to need more memory (default {} GiB)", o.bounds.max_memory_bytes >> 30));
  app.add_option("--csv", csv_path, "write one CSV row per run");
  app.add_option("--json", json_path, "write the full results as JSON");
  app.add_option("--svg-utilisation", svg_util_path, "write an SVG plot of bubble share and utilisation gain vs GPUs");
  app.add_option("--svg-timeline", svg_timeline_path, "write an SVG timeline of one iteration (last run)");
  app.add_option("--trace", trace_path, "write a Chrome trace of one iteration (last run)");
  app.add_flag("--quiet", quiet, "no summary table, no progress bar");
  CLI11_PARSE(app, argc, argv);
  if (max_schedule_ops) o.bounds.max_schedule_ops = *max_schedule_ops;
  if (max_sim_events) o.bounds.max_fill_events = *max_sim_events;
  if (max_sim_jobs) o.bounds.max_jobs = *max_sim_jobs;
  if (max_sim_memory_gib) {
    if (!std::isfinite(*max_sim_memory_gib) || *max_sim_memory_gib <= 0 || *max_sim_memory_gib > 1e9)
      return error_exit(fmt::format("--max-sim-memory-gib must be in (0, 1e9], got {}", *max_sim_memory_gib));
    o.bounds.max_memory_bytes = static_cast<uint64_t>(*max_sim_memory_gib * 1073741824.0);
  }

  SimConfig cfg;
  if (load_sim_config(config_path, &cfg) != pfSuccess) return error_exit(last_error_message());
  std::vector<PlannedRun> plan;
  if (plan_runs(cfg, o, &plan) != pfSuccess) return error_exit(last_error_message());
  const bool single = plan.size() == 1;
  const int iterations = plan.empty() ? 0 : plan.front().spec.iterations;

  const bool show_progress = !quiet && isatty(STDERR_FILENO);
  ProgressBar bar(show_progress, static_cast<long long>(plan.size()) * iterations);
  long long done_before = 0;
  std::vector<RunRecord> runs;
  const auto started = std::chrono::steady_clock::now();
  for (PlannedRun& planned : plan) {
    RunRecord rec;
    rec.gpus = planned.gpus;
    rec.schedule = planned.schedule;
    pfResult_t rc = planned.error.empty() ? pfSuccess : pfErrorInvalidArgument;
    if (rc == pfSuccess)
      rc = run_cluster_sim(planned.spec, &rec.result, [&](int it, int) { bar.update(done_before + it); });
    rec.ok = rc == pfSuccess;
    if (!rec.ok) {
      rec.error = planned.error.empty() ? last_error_message() : planned.error;
      if (single) return error_exit(rec.error);
    }
    done_before += iterations;
    bar.update(done_before);
    runs.push_back(std::move(rec));
  }
  if (compare) {
    for (const PlannedRun& planned : plan) {
      if (!planned.error.empty()) continue;
      Comparison c;
      if (run_comparison(planned.spec, !no_sensitivity, &c) != pfSuccess) return error_exit(last_error_message());
      if (!quiet) std::printf("%s\n", comparison_report(c).c_str());
      if (frontier) {
        std::vector<FrontierPoint> points;
        if (run_frontier(planned.spec, &points) != pfSuccess) return error_exit(last_error_message());
        if (!quiet) std::printf("%s\n", frontier_report(points).c_str());
      }
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
                  "utilisation gain); slowdown%% = main time lost to the fill (waiting for SMs, co-running, stretched "
                  "transfers; max over GPUs) / iteration.\nstrategy %s; %s.\n%s.\nSimulated in %.2f s.\n",
                  r.iterations, r.strategy.c_str(), interference_statement(r.interference, r).c_str(), r.note.c_str(),
                  seconds);
    }
  }
  const auto& types = cfg.sim.job_types;
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

}  // namespace

// Nothing the simulator does may end the process with an uncaught exception: every one is
// reported with a message and exit status 2 (1: a refused input).
int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "pipefill-sim: error: out of memory (lower the --max-sim-* bounds or the config's sizes)\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipefill-sim: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "pipefill-sim: internal error: unknown exception\n");
  }
  return 2;
}
