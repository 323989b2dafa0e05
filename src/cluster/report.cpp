#include "cluster/report.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "core/scheduler.hpp"

namespace pipefill::cluster {
namespace {

using nlohmann::json;

const char* op_name(schedule::OpType t) {
  switch (t) {
    case schedule::OpType::Forward: return "F";
    case schedule::OpType::Backward: return "B";
    case schedule::OpType::BackwardInput: return "B(input)";
    case schedule::OpType::BackwardWeight: return "W";
    case schedule::OpType::AllReduce: return "all-reduce";
    case schedule::OpType::OptimizerStep: return "optimizer";
    case schedule::OpType::SendActivation: return "send-act";
    case schedule::OpType::RecvActivation: return "recv-act";
    case schedule::OpType::SendGradient: return "send-grad";
    case schedule::OpType::RecvGradient: return "recv-grad";
  }
  return "?";
}

const char* op_colour(schedule::OpType t) {
  switch (t) {
    case schedule::OpType::Forward: return "#4C78A8";
    case schedule::OpType::Backward:
    case schedule::OpType::BackwardInput: return "#54A24B";
    case schedule::OpType::BackwardWeight: return "#72B7B2";
    case schedule::OpType::AllReduce: return "#9D9D9D";
    case schedule::OpType::OptimizerStep: return "#595959";
    default: return "#BBBBBB";
  }
}

const char* bubble_kind_name(pfBubbleKind_t k) {
  switch (k) {
    case pfBubbleWarmup: return "warmup";
    case pfBubbleCooldown: return "cooldown";
    case pfBubbleDrain: return "drain";
    case pfBubbleOptimizer: return "optimizer";
    default: return "other";
  }
}

std::string type_name(const std::vector<FillJobType>& types, int t) {
  return t >= 0 && t < static_cast<int>(types.size()) ? types[t].name : fmt::format("type{}", t);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string summary_table(const std::vector<RunRecord>& runs) {
  std::string out = fmt::format("{:>6} {:>3} {:>3} {:>4} {:>4} {:<16} {:>8} {:>8} {:>6} {:>6} {:>8} {:>6} {:>7} {:>9} {:>6}\n",
                                "GPUs", "TP", "PP", "DP", "m", "schedule", "iter ms", "bubble%", "idle%", "main%",
                                "filled%", "+fill%", "gain%", "slowdown%", "jobs");
  for (const auto& run : runs) {
    if (!run.ok) {
      out += fmt::format("{:>6} {:>3} {:>3} {:>4} {:>4} {:<16} n/a: {}\n", run.gpus, "", "", "", "", run.schedule, run.error);
      continue;
    }
    const ClusterResult& r = run.result;
    out += fmt::format("{:>6} {:>3} {:>3} {:>4} {:>4} {:<16} {:>8.1f} {:>8.2f} {:>6.2f} {:>6.2f} {:>8.2f} {:>6.2f} {:>7.2f} {:>9.3f} {:>6}\n",
                       r.gpus, r.tensor, r.pipeline, r.data, r.microbatches,
                       r.chunks > 1 ? fmt::format("{}(v={})", r.schedule, r.chunks) : r.schedule,
                       r.iteration_us / 1e3, 100 * r.bubble_share, 100 * r.idle_share, 100 * r.main_busy_share,
                       100 * r.filled_share, 100 * r.fill_gpu_equivalents / r.gpus, 100 * r.utilisation_gain,
                       100 * r.slowdown_fraction, r.jobs_completed);
  }
  return out;
}

std::string csv_report(const std::vector<RunRecord>& runs) {
  std::string out =
      "gpus,tensor,pipeline,data,microbatches,schedule,chunks,iteration_us,pipeline_us,bubble_share,bubble_ratio,"
      "idle_share,main_busy_share,main_mfu,filled_share,fill_gpu_equivalents,utilisation_gain,slowdown_fraction,"
      "mean_gpu_overrun_fraction,slices,overrun_slices,jobs_arrived,jobs_started,jobs_completed,jobs_unplaceable,"
      "completion_mean_s,completion_p50_s,completion_p95_s,wait_mean_s,iterations,error\n";
  for (const auto& run : runs) {
    if (!run.ok) {
      std::string err = run.error;
      std::replace(err.begin(), err.end(), '"', '\'');
      out += fmt::format("{},,,,,{},,,,,,,,,,,,,,,,,,,,,,,,,\"{}\"\n", run.gpus, run.schedule, err);
      continue;
    }
    const ClusterResult& r = run.result;
    out += fmt::format("{},{},{},{},{},{},{},{:.3f},{:.3f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.4f},{:.6f},{:.6f},"
                       "{:.6f},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.3f},{},\n",
                       r.gpus, r.tensor, r.pipeline, r.data, r.microbatches, r.schedule, r.chunks, r.iteration_us,
                       r.pipeline_us, r.bubble_share, r.bubble_ratio, r.idle_share, r.main_busy_share, r.main_mfu,
                       r.filled_share, r.fill_gpu_equivalents, r.utilisation_gain, r.slowdown_fraction,
                       r.mean_gpu_overrun_fraction, r.slices, r.overrun_slices, r.jobs_arrived, r.jobs_started,
                       r.jobs_completed, r.jobs_unplaceable, r.completion_mean_s, r.completion_p50_s,
                       r.completion_p95_s, r.wait_mean_s, r.iterations);
  }
  return out;
}

json json_report(const std::vector<RunRecord>& runs, const std::vector<FillJobType>& types) {
  json out = json::array();
  for (const auto& run : runs) {
    json j;
    j["gpus"] = run.gpus;
    j["schedule"] = run.schedule;
    j["ok"] = run.ok;
    if (!run.ok) {
      j["error"] = run.error;
      out.push_back(j);
      continue;
    }
    const ClusterResult& r = run.result;
    j["shape"] = {{"tensor", r.tensor}, {"pipeline", r.pipeline}, {"data", r.data},
                  {"microbatches", r.microbatches}, {"chunks", r.chunks}, {"iterations", r.iterations}};
    j["main"] = {{"iteration_us", r.iteration_us}, {"pipeline_us", r.pipeline_us}, {"bubble_share", r.bubble_share},
                 {"bubble_ratio", r.bubble_ratio}, {"idle_share", r.idle_share},
                 {"main_busy_share", r.main_busy_share}, {"mfu", r.main_mfu}};
    j["fill"] = {{"fillable_bubble_us", r.fillable_bubble_us}, {"filled_us", r.filled_us},
                 {"filled_share", r.filled_share}, {"work_dedicated_us", r.fill_work_dedicated_us},
                 {"gpu_equivalents", r.fill_gpu_equivalents}, {"utilisation_gain", r.utilisation_gain},
                 {"slowdown_fraction", r.slowdown_fraction},
                 {"mean_gpu_overrun_fraction", r.mean_gpu_overrun_fraction}, {"slices", r.slices},
                 {"overrun_slices", r.overrun_slices}, {"strategy", r.strategy}, {"reserved_sms", r.reserved_sms},
                 {"post_bubble_us", r.post_us}, {"fill_rate", r.fill_rate},
                 {"fill_per_bubble_second", r.fill_per_bubble_second},
                 {"loss_fractions", {{"wait_sms", r.yield_fraction}, {"co_run", r.corun_fraction},
                                     {"transfers", r.comm_fraction}}},
                 {"bubble_end_to_main_us",
                  {{"first_block_p50", r.first_block_p50_us}, {"first_block_p99", r.first_block_p99_us},
                   {"owns_sms_p50", r.sm_own_p50_us}, {"owns_sms_p99", r.sm_own_p99_us},
                   {"lost_p50", r.end_delay_p50_us}, {"lost_p99", r.end_delay_p99_us}}}};
    j["interference"] = {{"mem_slowdown", r.interference.mem_slowdown},
                         {"comm_slowdown", r.interference.comm_slowdown}};
    json per_type = json::object();
    for (size_t t = 0; t < r.completed_per_type.size(); ++t) per_type[type_name(types, static_cast<int>(t))] = r.completed_per_type[t];
    j["jobs"] = {{"generated", r.jobs_generated}, {"arrived", r.jobs_arrived}, {"started", r.jobs_started},
                 {"completed", r.jobs_completed}, {"unplaceable", r.jobs_unplaceable},
                 {"completion_mean_s", r.completion_mean_s}, {"completion_p50_s", r.completion_p50_s},
                 {"completion_p95_s", r.completion_p95_s}, {"wait_mean_s", r.wait_mean_s},
                 {"completed_per_type", per_type}};
    json stages = json::array();
    for (const auto& s : r.stages)
      stages.push_back({{"stage", s.stage}, {"bubbles_per_iteration", s.bubbles_per_iteration},
                        {"compute_us", s.compute_us}, {"bubble_us", s.bubble_us},
                        {"optimizer_bubble_us", s.optimizer_bubble_us}, {"filled_share", s.filled_share},
                        {"arena_bytes", s.arena_bytes}, {"peak_in_flight", s.peak_in_flight}});
    j["stages"] = stages;
    j["note"] = r.note;
    out.push_back(j);
  }
  return out;
}

std::string utilisation_svg(const std::vector<RunRecord>& runs) {
  const double W = 760, H = 440, left = 70, right = 200, top = 40, bottom = 60;
  const double pw = W - left - right, ph = H - top - bottom;
  std::vector<int> gpu_counts;
  std::vector<std::string> schedules;
  double ymax = 10.0;
  for (const auto& run : runs) {
    if (!run.ok) continue;
    if (std::find(gpu_counts.begin(), gpu_counts.end(), run.gpus) == gpu_counts.end()) gpu_counts.push_back(run.gpus);
    if (std::find(schedules.begin(), schedules.end(), run.schedule) == schedules.end()) schedules.push_back(run.schedule);
  }
  std::sort(gpu_counts.begin(), gpu_counts.end());
  ymax = 100.0;  // utilisation: share of GPU time doing useful work
  auto x_of = [&](int gpus) {
    if (gpu_counts.size() <= 1) return left + pw / 2;
    const double lo = std::log2(gpu_counts.front()), hi = std::log2(gpu_counts.back());
    return left + pw * (std::log2(gpus) - lo) / (hi - lo);
  };
  auto y_of = [&](double pct) { return top + ph * (1.0 - pct / ymax); };
  const char* colours[] = {"#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2"};
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"22\" font-size=\"15\">GPU utilisation vs GPU count: training only (dashed) and with filling (solid)</text>\n",
      W, H, left);
  // Axes and grid.
  for (double v = 0; v <= ymax + 1e-9; v += 10) {
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", left, y_of(v),
                     left + pw, y_of(v));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}%</text>\n", left - 6, y_of(v) + 4, v);
  }
  for (int g : gpu_counts)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x_of(g), top + ph + 18, g);
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">GPUs (log scale)</text>\n", left + pw / 2,
                   H - 15);
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", left, top, pw, ph);
  for (size_t i = 0; i < schedules.size(); ++i) {
    const char* c = colours[i % 6];
    std::string bubble_pts, gain_pts;
    for (const auto& run : runs) {
      if (!run.ok || run.schedule != schedules[i]) continue;
      const ClusterResult& r = run.result;
      const double main = 100 * r.main_busy_share;
      const double filled = main + 100 * r.fill_gpu_equivalents / r.gpus;
      bubble_pts += fmt::format("{:.1f},{:.1f} ", x_of(run.gpus), y_of(main));
      gain_pts += fmt::format("{:.1f},{:.1f} ", x_of(run.gpus), y_of(filled));
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"><title>{} GPUs {}: {:.1f}% -> {:.1f}% "
                       "(+{:.0f}% relative)</title></circle>\n",
                       x_of(run.gpus), y_of(filled), c, run.gpus, xml_escape(schedules[i]), main, filled,
                       100 * r.utilisation_gain);
    }
    s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-dasharray=\"5,4\"/>\n", bubble_pts, c);
    s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", gain_pts, c);
    const double ly = top + 10 + 36 * i;
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-dasharray=\"5,4\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\">{} training only</text>\n",
                     left + pw + 12, ly, left + pw + 40, ly, c, left + pw + 46, ly + 4, xml_escape(schedules[i]));
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\">{} + fill</text>\n",
                     left + pw + 12, ly + 16, left + pw + 40, ly + 16, c, left + pw + 46, ly + 20,
                     xml_escape(schedules[i]));
  }
  s += "</svg>\n";
  return s;
}

std::string timeline_svg(const ClusterResult& r, const std::vector<FillJobType>& types) {
  const auto& tl = r.timeline;
  const int p = static_cast<int>(tl.stages.size());
  const double W = 1200, left = 80, right = 20, top = 50, row = 26, legend = 40;
  const double H = top + row * p + legend + 20;
  const double pw = W - left - right;
  const double span = tl.iteration_us > 0 ? tl.iteration_us : 1.0;
  auto x_of = [&](double us) { return left + pw * us / span; };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{:.0f}\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"20\" font-size=\"14\">One iteration ({}): {} GPUs, TP {} PP {} DP {}, m={}, {:.1f} ms; bubbles "
      "(pink) and fill slices (orange) on the first GPU of each stage</text>\n",
      W, H, left, r.recorded_iteration, r.gpus, r.tensor, r.pipeline, r.data, r.microbatches, tl.iteration_us / 1e3);
  for (int st = 0; st < p; ++st) {
    const double y = top + row * st;
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">stage {}</text>\n", left - 6, y + row * 0.6, st);
    for (const auto& b : tl.stages[st].bubbles)
      s += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"#F6D0D0\"><title>bubble {} "
                       "({}) {:.0f} us</title></rect>\n",
                       x_of(b.start_us), y + 2, std::max(0.5, x_of(b.start_us + b.duration_us) - x_of(b.start_us)),
                       row - 4, b.index_in_iteration, bubble_kind_name(b.kind), b.duration_us);
    for (const auto& op : tl.stages[st].ops) {
      if (op.type == schedule::OpType::AllReduce) continue;  // drawn as the optimizer bubble
      s += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" stroke=\"white\" "
                       "stroke-width=\"0.3\"><title>{} mb {} chunk {}</title></rect>\n",
                       x_of(op.start_us), y + 2, std::max(0.5, x_of(op.end_us) - x_of(op.start_us)), row - 4,
                       op_colour(op.type), op_name(op.type), op.microbatch, op.chunk);
    }
  }
  for (const auto& f : r.recorded_slices) {
    const double y = top + row * f.stage;
    s += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"#F58518\" opacity=\"0.9\">"
                     "<title>{} job {}: {} items, {:.0f} us</title></rect>\n",
                     x_of(f.start_us), y + row * 0.45, std::max(0.5, x_of(f.start_us + f.busy_us) - x_of(f.start_us)),
                     row * 0.5 - 2, xml_escape(type_name(types, f.job_type)), f.job, f.items, f.busy_us);
  }
  const double ly = top + row * p + 18;
  const std::pair<const char*, const char*> items[] = {
      {"forward", "#4C78A8"}, {"backward (B)", "#54A24B"}, {"weight grad (W)", "#72B7B2"},
      {"optimizer step", "#595959"}, {"bubble", "#F6D0D0"}, {"fill slice", "#F58518"}};
  double lx = left;
  for (const auto& [label, colour] : items) {
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"14\" height=\"12\" fill=\"{}\"/><text x=\"{:.1f}\" "
                     "y=\"{:.1f}\">{}</text>\n",
                     lx, ly, colour, lx + 18, ly + 10, label);
    lx += 150;
  }
  s += "</svg>\n";
  return s;
}

json chrome_trace(const ClusterResult& r, const std::vector<FillJobType>& types) {
  json events = json::array();
  const auto& tl = r.timeline;
  for (size_t st = 0; st < tl.stages.size(); ++st) {
    const int base = static_cast<int>(st) * 3;
    const char* lanes[] = {"ops", "bubbles", "fill"};
    for (int lane = 0; lane < 3; ++lane)
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", base + lane},
                        {"args", {{"name", fmt::format("stage {} {}", st, lanes[lane])}}}});
    for (const auto& op : tl.stages[st].ops)
      events.push_back({{"ph", "X"}, {"name", op_name(op.type)}, {"cat", "op"}, {"pid", 0}, {"tid", base},
                        {"ts", op.start_us}, {"dur", op.end_us - op.start_us},
                        {"args", {{"microbatch", op.microbatch}, {"chunk", op.chunk}}}});
    for (const auto& b : tl.stages[st].bubbles)
      events.push_back({{"ph", "X"}, {"name", fmt::format("bubble {} ({})", b.index_in_iteration, bubble_kind_name(b.kind))},
                        {"cat", "bubble"}, {"pid", 0}, {"tid", base + 1}, {"ts", b.start_us}, {"dur", b.duration_us},
                        {"args", {{"free_bytes", b.free_bytes}, {"op_before", b.op_before}}}});
  }
  for (const auto& f : r.recorded_slices)
    events.push_back({{"ph", "X"}, {"name", type_name(types, f.job_type)}, {"cat", "fill"}, {"pid", 0},
                      {"tid", f.stage * 3 + 2}, {"ts", f.start_us}, {"dur", f.busy_us},
                      {"args", {{"job", f.job}, {"items", f.items}, {"bubble", f.bubble_index}}}});
  return json{{"traceEvents", events},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"gpus", r.gpus}, {"schedule", r.schedule}, {"iteration", r.recorded_iteration},
                             {"note", r.note}}}};
}

pfResult_t write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return fail(pfErrorIo, "cannot open '{}' for writing", path);
  out << text;
  out.close();
  if (!out) return fail(pfErrorIo, "failed writing '{}'", path);
  return pfSuccess;
}

}  // namespace pipefill::cluster
