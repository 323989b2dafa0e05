// Slowdown-vs-filled frontiers of the fill modes (frontier.hpp).
#include "frontier.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace engine {

std::vector<KnobSweep> default_knob_sweeps() {
  return {
      {FillMode::PipeFill, "gated quantile",
       {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0}, 0.5},
      // Below the engine's margin (the receive's transfer time, 84 us): fill beside the bytes.
      {FillMode::PipeFill, "margin us", {60, 40, 20, 0}, -1.0, false, true},
      // Both knobs at once: every slice sized to the class's longest bubble, run beside the bytes.
      {FillMode::PipeFill, "margin us, q 1", {40, 20, 0}, -1.0, false, true, 1.0},
      {FillMode::PipeFill, "notice lead us", {40, 30, 20, 10, 5}, kDefaultNoticeLeadUs, true},
      {FillMode::Naive, "bubble share", {0.25, 0.5, 0.75, 1.0}, 1.0},
      {FillMode::FreeRide, "admission pad", {1.0, 1.2, 2.0, 4.0}, 1.2},
      {FillMode::Tally, "SM share", {0.25, 0.5, 0.75, 1.0}, 1.0},
      {FillMode::PaperStyle, "quantile", {0.05, 0.1, 0.2, 0.3, 0.5}, 0.1},
  };
}

Status run_frontier(const EngineOptions& options, const std::vector<KnobSweep>& sweeps,
                    Frontier* out) {
  Frontier f;
  EngineOptions base = options;
  base.mode_knob = -1.0;
  ENGINE_TRY(measure_fill_mode(base, FillMode::None, 0.0, &f.none));
  for (const KnobSweep& sweep : sweeps) {
    if (sweep.margin && sweep.notice_lead)
      return Status{pfErrorInvalidArgument,
                    fmt::format("frontier: {} sweep '{}' varies both the margin and the notice "
                                "lead; one at a time",
                                fill_mode_name(sweep.mode), sweep.knob)};
    if (sweep.at_quantile >= 0 && (!sweep.margin || sweep.mode != FillMode::PipeFill ||
                                   !(sweep.at_quantile > 0 && sweep.at_quantile <= 1)))
      return Status{pfErrorInvalidArgument,
                    fmt::format("frontier: {} sweep '{}' has at_quantile {}: only a PipeFill "
                                "margin sweep runs at a quantile, one in (0, 1]",
                                fill_mode_name(sweep.mode), sweep.knob, sweep.at_quantile)};
    for (double value : sweep.values) {
      if (sweep.margin ? !(value >= 0) : !(value > 0))
        return Status{pfErrorInvalidArgument,
                      fmt::format("frontier: {} knob '{}' values must be {}, got {}",
                                  fill_mode_name(sweep.mode), sweep.knob,
                                  sweep.margin ? ">= 0" : "> 0", value)};
      EngineOptions o = options;
      if (sweep.notice_lead) {
        o.notice_lead_us = value;
      } else if (sweep.margin) {
        o.margin_us = value;
        if (sweep.at_quantile > 0) o.mode_knob = sweep.at_quantile;
      } else {
        o.mode_knob = value;
      }
      FrontierPoint point;
      point.notice = sweep.notice_lead;
      point.mode = sweep.mode;
      point.knob = sweep.knob;
      point.value = value;
      point.is_default = value == sweep.default_value;
      ENGINE_TRY(measure_fill_mode(o, sweep.mode, f.none.iteration_us, &point.row));
      f.points.push_back(point);
    }
  }
  *out = std::move(f);
  return {};
}

bool ours_slowdown_at(const Frontier& frontier, double filled_pct, double* slowdown_pct) {
  // Ours' points by filled share; between two of them, the straight line (alternating the two
  // knob values across iterations gets it), beyond the last none.
  std::vector<std::pair<double, double>> curve;  // (filled%, slowdown%)
  for (const FrontierPoint& p : frontier.points)
    if (p.mode == FillMode::PipeFill && !p.notice)
      curve.emplace_back(p.row.filled_pct, p.row.slowdown_pct);
  std::sort(curve.begin(), curve.end());
  if (curve.empty() || filled_pct > curve.back().first) return false;
  double best = 1e300;
  for (size_t i = 0; i < curve.size(); ++i) {
    if (curve[i].first >= filled_pct) best = std::min(best, curve[i].second);
    if (i + 1 < curve.size() && curve[i].first < filled_pct && filled_pct <= curve[i + 1].first) {
      const double t = (filled_pct - curve[i].first) / (curve[i + 1].first - curve[i].first);
      best = std::min(best, curve[i].second + t * (curve[i + 1].second - curve[i].second));
    }
  }
  *slowdown_pct = best;
  return true;
}

std::string format_frontier(const EngineOptions& o, const Frontier& f, const std::string& prefix) {
  std::string s = fmt::format(
      "{}frontier: every mode across its own knob (* = its default), same pipeline, job, seed and "
      "interference; 'ours at' = ours' slowdown on its curve (straight between its points) at the peer point's filled share\n",
      prefix);
  s += fmt::format("{}{:<15} {:<15} {:>6} {:>10} {:>8} {:>10} {:>9} {:>12}  {}\n", prefix, "mode",
                   "knob", "value", "slowdown%", "filled%", "thr/dedic", "own p99", "ours at",
                   "verdict");
  int peer_points = 0, ours_lower = 0, beyond = 0;
  for (const FrontierPoint& p : f.points) {
    std::string at = "-", verdict = p.notice ? "ours + notice" : "ours' curve";
    if (p.mode != FillMode::PipeFill) {
      ++peer_points;
      double ours = 0.0;
      if (!ours_slowdown_at(f, p.row.filled_pct, &ours)) {
        ++beyond;
        verdict = "fills more than any ours point";
      } else {
        at = fmt::format("{:.3f}", ours);
        const bool lower = ours < p.row.slowdown_pct;
        ours_lower += lower ? 1 : 0;
        verdict = lower ? "ours lower" : "OURS NOT LOWER";
      }
    }
    s += fmt::format("{}{:<15} {:<15} {:>5g}{} {:>10.3f} {:>8.1f} {:>10.3f} {:>9.2f} {:>12}  {}\n",
                     prefix, p.notice ? "PipeFill+notice" : fill_mode_name(p.mode), p.knob,
                     p.value, p.is_default ? "*" : " ",
                     p.row.slowdown_pct, p.row.filled_pct, p.row.throughput,
                     p.row.all_blocks_p99_us, at, verdict);
  }
  s += fmt::format(
      "{}frontier verdict: ours lower at {} of {} peer points; {} peer points fill more than any "
      "ours point (at the cost above)\n",
      prefix, ours_lower, peer_points - beyond, beyond);
  // The zero-slowdown ceiling: fill on every fill SM of every bubble until the bytes of the
  // receive that ends it start to move (the fill load then stretches the transfer for as long as
  // it runs beside it, gamma), with each bubble's end known exactly and no whole-item loss.
  const double ceiling = f.none.transfer_free_pct;
  const double fill_sms = o.pipeline.sm_count - o.pipeline.comm_sms;
  const double thr_ceiling = ceiling / 100.0 * fill_sms / o.pipeline.sm_count;
  // The best filled share at <= 0.5% slowdown among ours' points, without or with the notice.
  const auto best_at_target = [&](bool notice) {
    double best = -1.0;
    for (const FrontierPoint& p : f.points)
      if (p.mode == FillMode::PipeFill && p.notice == notice && p.row.slowdown_pct <= 0.5)
        best = std::max(best, p.row.filled_pct);
    if (best < 0) return std::string("none");
    return best >= 90.0 ? fmt::format("{:.1f}% (90% met, {:.1f} points above)", best, best - 90.0)
                        : fmt::format("{:.1f}% ({:.1f} points from 90%)", best, 90.0 - best);
  };
  const double stretch = o.comm_slowdown * 0.5 * fill_sms / o.pipeline.sm_count;
  s += fmt::format(
      "{}bound: filled% <= (bubble time - transfer time of the receives that end bubbles, their "
      "latency excluded) / bubble time = {:.1f}% at zero slowdown (every bubble's end known, no "
      "whole-item loss); thr/dedic <= that x {:.0f}/{} fill SMs = {:.3f}. Target 90% filled: "
      "{:.1f} points {} the ceiling; 0.85 of dedicated: {:.3f} {} it. Past the ceiling fill runs "
      "beside a message's bytes: gamma {:.2f} x the MLP's mem intensity 0.5 x {:.0f}/{} SMs = "
      "x{:.3f} on that transfer while it does. "
      "Ours' best filled% at <= 0.5% slowdown on its curve: {}; with the sender notice: {}\n",
      prefix, ceiling, fill_sms, o.pipeline.sm_count, thr_ceiling, std::fabs(90.0 - ceiling),
      ceiling >= 90.0 ? "below" : "ABOVE", std::fabs(0.85 - thr_ceiling),
      thr_ceiling >= 0.85 ? "below" : "ABOVE", o.comm_slowdown, fill_sms, o.pipeline.sm_count,
      1.0 + stretch, best_at_target(false), best_at_target(true));
  return s;
}

}  // namespace engine
