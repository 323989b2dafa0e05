#include "cluster/compare.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "common/error.hpp"

namespace pipefill::cluster {
namespace {

pfResult_t run_one(const ClusterSimSpec& base, bool fill, FillStrategy s, const InterferenceModel& m, ComparisonRow* row) {
  ClusterSimSpec spec = base;
  spec.fill.enabled = fill;
  spec.fill.strategy = s;
  spec.interference = m;
  row->fill = fill;
  row->strategy = s;
  row->name = fill ? strategy_name(s) : "none";
  const pfResult_t rc = run_cluster_sim(spec, &row->result);
  if (rc != pfSuccess) return fail(rc, "{} run: {}", row->name, last_error_message());
  // The comparison never needs the per-stage timelines of every run: keep the memory flat.
  row->result.timeline = {};
  row->result.recorded_slices.clear();
  return pfSuccess;
}

std::string ratio(double value, double ours) {
  if (ours == 0.0) return value == 0.0 ? "-" : "inf";
  return fmt::format("{:.2f}", value / ours);
}

struct Metric {
  const char* header;
  double (*get)(const ClusterResult&);
  const char* format;  // for the value table
};

const Metric kMetrics[] = {
    {"slowdown%", [](const ClusterResult& r) { return 100 * r.slowdown_fraction; }, "{:>10.3f}"},
    {"filled%", [](const ClusterResult& r) { return 100 * r.filled_share; }, "{:>10.2f}"},
    {"fill/bub", [](const ClusterResult& r) { return r.fill_per_bubble_second; }, "{:>10.3f}"},
    {"fill-rate", [](const ClusterResult& r) { return r.fill_rate; }, "{:>10.3f}"},
    {"start p50", [](const ClusterResult& r) { return r.first_block_p50_us; }, "{:>10.1f}"},
    {"start p99", [](const ClusterResult& r) { return r.first_block_p99_us; }, "{:>10.1f}"},
    {"own p50", [](const ClusterResult& r) { return r.sm_own_p50_us; }, "{:>10.1f}"},
    {"own p99", [](const ClusterResult& r) { return r.sm_own_p99_us; }, "{:>10.1f}"},
    {"lost p50", [](const ClusterResult& r) { return r.end_delay_p50_us; }, "{:>10.1f}"},
    {"lost p99", [](const ClusterResult& r) { return r.end_delay_p99_us; }, "{:>10.1f}"},
};

}  // namespace

const ComparisonRow* Comparison::find(const std::string& name) const {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

std::vector<std::pair<std::string, InterferenceModel>> interference_sensitivity_points() {
  return {{"none", {0.0, 0.0}}, {"low", {0.2, 0.1}}, {"calibrated", {0.6, 0.5}}, {"high", {1.6, 2.2}}};
}

pfResult_t run_comparison(const ClusterSimSpec& spec, bool sensitivity, Comparison* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "run_comparison: out must not be null");
  if (spec.job_types.empty())
    return fail(pfErrorInvalidArgument, "the comparison needs fill job types (fill.jobs_file)");
  Comparison c;
  c.interference = spec.interference;
  ComparisonRow none;
  PF_TRY(run_one(spec, false, FillStrategy::Ours, spec.interference, &none));
  c.rows.push_back(std::move(none));
  for (FillStrategy s : all_strategies()) {
    ComparisonRow row;
    PF_TRY(run_one(spec, true, s, spec.interference, &row));
    c.rows.push_back(std::move(row));
  }
  if (sensitivity) {
    for (const auto& [label, model] : interference_sensitivity_points()) {
      SensitivityRow sr;
      sr.label = label;
      sr.interference = model;
      for (FillStrategy s : all_strategies()) {
        ComparisonRow row;
        PF_TRY(run_one(spec, true, s, model, &row));
        sr.rows.push_back(std::move(row));
      }
      c.sensitivity.push_back(std::move(sr));
    }
  }
  *out = std::move(c);
  return pfSuccess;
}

pfResult_t run_frontier(const ClusterSimSpec& spec, std::vector<FrontierPoint>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "run_frontier: out must not be null");
  std::vector<FrontierPoint> points;
  const auto add = [&](FillStrategy s, const char* knob, double value) -> pfResult_t {
    ClusterSimSpec at = spec;
    if (s == FillStrategy::Ours && value > 0) at.fill.gated_prediction_quantile = value;
    if (s == FillStrategy::PaperStyle && value > 0) at.fill.prediction_quantile = value;
    if ((s == FillStrategy::FreeRide || s == FillStrategy::FreeRideIdeal) && value > 0)
      at.fill.freeride.step_margin = value;
    FrontierPoint p;
    p.knob = knob;
    p.value = value;
    PF_TRY(run_one(at, true, s, spec.interference, &p.row));
    points.push_back(std::move(p));
    return pfSuccess;
  };
  for (double q : {0.1, 0.3, 0.5, 0.7, 0.9}) PF_TRY(add(FillStrategy::Ours, "gated quantile", q));
  PF_TRY(add(FillStrategy::Naive, "", 0.0));
  for (FillStrategy s : {FillStrategy::FreeRide, FillStrategy::FreeRideIdeal})
    for (double m : {1.0, 1.2, 2.0}) PF_TRY(add(s, "step margin", m));
  PF_TRY(add(FillStrategy::Tally, "", 0.0));
  for (double q : {0.05, 0.1, 0.3, 0.5}) PF_TRY(add(FillStrategy::PaperStyle, "quantile", q));
  *out = std::move(points);
  return pfSuccess;
}

std::string frontier_report(const std::vector<FrontierPoint>& points) {
  std::vector<std::pair<double, double>> ours;  // (filled%, slowdown%)
  for (const auto& p : points)
    if (p.row.strategy == FillStrategy::Ours)
      ours.emplace_back(100 * p.row.result.filled_share, 100 * p.row.result.slowdown_fraction);
  std::sort(ours.begin(), ours.end());
  const auto ours_at = [&](double filled, double* slowdown) {
    if (ours.empty() || filled > ours.back().first) return false;
    double best = 1e300;
    for (size_t i = 0; i < ours.size(); ++i) {
      if (ours[i].first >= filled) best = std::min(best, ours[i].second);
      if (i + 1 < ours.size() && ours[i].first < filled && filled <= ours[i + 1].first)
        best = std::min(best, ours[i].second + (filled - ours[i].first) / (ours[i + 1].first - ours[i].first) *
                                                   (ours[i + 1].second - ours[i].second));
    }
    *slowdown = best;
    return true;
  };
  std::string out =
      "Frontier: each strategy across its own knob, same pipeline, jobs and seed; 'ours at' = ours' slowdown on its "
      "curve (straight between its points) at that point's filled share:\n";
  out += fmt::format("{:<15}{:<16}{:>7}{:>11}{:>10}{:>10}{:>10}  {}\n", "strategy", "knob", "value", "slowdown%",
                     "filled%", "fill/bub", "ours at", "verdict");
  int lower = 0, compared = 0;
  for (const auto& p : points) {
    const ClusterResult& r = p.row.result;
    std::string at = "-", verdict = "ours' curve";
    if (p.row.strategy != FillStrategy::Ours) {
      double s = 0.0;
      if (ours_at(100 * r.filled_share, &s)) {
        ++compared;
        lower += s < 100 * r.slowdown_fraction ? 1 : 0;
        at = fmt::format("{:.3f}", s);
        verdict = s < 100 * r.slowdown_fraction ? "ours lower" : "OURS NOT LOWER";
      } else {
        verdict = "fills more than any ours point";
      }
    }
    out += fmt::format("{:<15}{:<16}{:>7}{:>11.3f}{:>10.2f}{:>10.3f}{:>10}  {}\n", p.row.name, p.knob.empty() ? "-" : p.knob,
                       p.knob.empty() ? std::string("-") : fmt::format("{:g}", p.value), 100 * r.slowdown_fraction,
                       100 * r.filled_share, r.fill_per_bubble_second, at, verdict);
  }
  out += fmt::format("frontier verdict: ours lower at {} of {} points within ours' filled range\n", lower, compared);
  return out;
}

std::vector<TargetCheck> check_targets(const Comparison& c, const Targets& t) {
  std::vector<TargetCheck> out;
  const ComparisonRow* ours = c.find(strategy_name(FillStrategy::Ours));
  if (ours == nullptr) return out;
  const ClusterResult& r = ours->result;
  out.push_back({fmt::format("ours: main-job slowdown <= {:.1f}%", 100 * t.max_slowdown),
                 fmt::format("{:.3f}%", 100 * r.slowdown_fraction), r.slowdown_fraction <= t.max_slowdown});
  out.push_back({fmt::format("ours: share of bubble time filled >= {:.0f}%", 100 * t.min_filled_share),
                 fmt::format("{:.2f}%", 100 * r.filled_share), r.filled_share >= t.min_filled_share});
  out.push_back({fmt::format("ours: fill throughput per bubble-second >= {:.2f} of a dedicated GPU", t.min_fill_per_bubble_s),
                 fmt::format("{:.3f}", r.fill_per_bubble_second), r.fill_per_bubble_second >= t.min_fill_per_bubble_s});
  out.push_back({fmt::format("ours: bubble end -> main kernel owns its SMs, p99 <= {:.0f} us", t.max_sm_own_p99_us),
                 fmt::format("{:.1f} us", r.sm_own_p99_us), r.sm_own_p99_us <= t.max_sm_own_p99_us});
  for (const auto& row : c.rows) {
    if (!row.fill || row.strategy == FillStrategy::Ours) continue;
    const ClusterResult& b = row.result;
    const bool slower = r.slowdown_fraction < b.slowdown_fraction ||
                        (r.slowdown_fraction == b.slowdown_fraction && r.slowdown_fraction == 0.0);
    const bool fills = r.filled_share >= b.filled_share;
    const bool behind = b.slowdown_fraction <= r.slowdown_fraction && b.filled_share >= r.filled_share;
    const char* verdict = slower && fills ? "ahead" : behind ? "behind" : fills ? "fills more, loses more" : "loses less, fills less";
    out.push_back({fmt::format("ours ahead of {} on slowdown at equal or better filled share", row.name),
                   fmt::format("{}: slowdown {:.3f}% vs {:.3f}%, filled {:.2f}% vs {:.2f}%", verdict,
                               100 * r.slowdown_fraction, 100 * b.slowdown_fraction, 100 * r.filled_share,
                               100 * b.filled_share),
                   slower && fills});
  }
  return out;
}

std::string interference_statement(const InterferenceModel& m, const ClusterResult& ours) {
  return fmt::format(
      "assumed: interference beta (mem) = {:g}, gamma (comm) = {:g} (defaults calibrated from arXiv 2604.22430, "
      "arXiv 2507.03114, NVIDIA/nccl#1428 and #1433; docs/simulator.md section 4.2); per-job mem_intensity from the "
      "jobs file, else inference 0.5 / training 0.4; ours reserves {} of {} SMs; simulator output, not a measurement",
      m.mem_slowdown, m.comm_slowdown, ours.reserved_sms, ours.sm_count);
}

std::string comparison_report(const Comparison& c, const Targets& targets) {
  const ComparisonRow* ours = c.find(strategy_name(FillStrategy::Ours));
  if (ours == nullptr || c.rows.empty()) return "no comparison\n";
  const ClusterResult& o = ours->result;
  std::string out = fmt::format("Fill strategies side by side: {} GPUs, {} (TP {} PP {} DP {}, m {}), {} iterations, same "
                                "jobs and seed.\n{}.\n\n",
                                o.gpus, o.schedule, o.tensor, o.pipeline, o.data, o.microbatches, o.iterations,
                                interference_statement(c.interference, o));
  out += fmt::format("{:<15}", "strategy");
  for (const Metric& m : kMetrics) out += fmt::format("{:>10}", m.header);
  out += fmt::format("{:>8}\n", "jobs");
  for (const auto& row : c.rows) {
    out += fmt::format("{:<15}", row.name);
    for (const Metric& m : kMetrics) out += fmt::format(fmt::runtime(m.format), m.get(row.result));
    out += fmt::format("{:>8}\n", row.result.jobs_completed);
  }
  out += "\nRatio to ours (value / ours; '-' both zero, 'inf' ours zero):\n";
  out += fmt::format("{:<15}", "strategy");
  for (const Metric& m : kMetrics) out += fmt::format("{:>10}", m.header);
  out += "\n";
  for (const auto& row : c.rows) {
    if (!row.fill) continue;
    out += fmt::format("{:<15}", row.name);
    for (const Metric& m : kMetrics) out += fmt::format("{:>10}", ratio(m.get(row.result), m.get(o)));
    out += "\n";
  }
  out += "\nslowdown% = main time lost to the fill (waiting for SMs + co-running beta + stretched transfers gamma), max "
         "over GPUs, / iteration; filled% = fill busy time in bubbles / fillable bubble time; fill/bub = useful fill "
         "work (dedicated-GPU time) / fillable bubble time; fill-rate = the same / fill running time; start = bubble end "
         "-> first block of the main kernel starts; own = -> the main kernel owns every SM it needs; lost = main time "
         "lost at that bubble end; p50/p99 over bubble visits, us.\n";
  out += "\nWhere the main job's time goes (mean per GPU, % of the iteration; slowdown% above is the max over GPUs):\n";
  out += fmt::format("{:<15}{:>12}{:>12}{:>12}{:>12}\n", "strategy", "wait SMs", "co-run", "transfers", "total");
  for (const auto& row : c.rows) {
    if (!row.fill) continue;
    const ClusterResult& r = row.result;
    out += fmt::format("{:<15}{:>12.3f}{:>12.3f}{:>12.3f}{:>12.3f}\n", row.name, 100 * r.yield_fraction,
                       100 * r.corun_fraction, 100 * r.comm_fraction, 100 * r.mean_gpu_overrun_fraction);
  }
  if (!c.sensitivity.empty()) {
    out += "\nSensitivity to interference (main-job slowdown%, same runs otherwise):\n";
    out += fmt::format("{:<12}{:>6}{:>6}", "setting", "beta", "gamma");
    for (const auto& row : c.sensitivity.front().rows) out += fmt::format("{:>15}", row.name);
    out += "\n";
    for (const auto& sr : c.sensitivity) {
      out += fmt::format("{:<12}{:>6g}{:>6g}", sr.label, sr.interference.mem_slowdown, sr.interference.comm_slowdown);
      for (const auto& row : sr.rows) out += fmt::format("{:>15.3f}", 100 * row.result.slowdown_fraction);
      out += "\n";
    }
  }
  out += "\nTargets (printed, never asserted by a test):\n";
  for (const TargetCheck& t : check_targets(c, targets))
    out += fmt::format("  [{}] {}: {}\n", t.met ? "met   " : "MISSED", t.what, t.value);
  return out;
}

}  // namespace pipefill::cluster
