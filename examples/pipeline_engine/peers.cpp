#include "peers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "analysis/stats.hpp"

namespace engine {
namespace {

// p50 and p99 (nearest rank) of a delay list, 0 when empty.
std::pair<double, double> p50_p99(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return {pipefill::analysis::quantile_nearest_rank(values, 0.5),
          pipefill::analysis::quantile_nearest_rank(values, 0.99)};
}

}  // namespace

Status measure_fill_mode(const EngineOptions& options, FillMode mode, double none_iteration_us,
                         PeerRow* row_out) {
  if (options.transport != "sim")
    return Status{pfErrorNotSupported,
                  fmt::format("the fill modes side by side run on the sim transport, got '{}'",
                              options.transport)};
  if (options.warm_iterations < 0 || options.warm_iterations >= options.iterations)
    return Status{pfErrorInvalidArgument,
                  fmt::format("warm_iterations must be in [0, iterations = {}), got {}",
                              options.iterations, options.warm_iterations)};
  const size_t warm = static_cast<size_t>(options.warm_iterations);
  const double fill_sms = options.pipeline.sm_count - options.pipeline.comm_sms;
  // The kind's default job (1,000,000 MLP items) runs out within ~20 iterations of this pipeline
  // at ours' highest-filling settings; a comparison sizes it by the run's length instead.
  EngineOptions sized = options;
  if (sized.fill_items == 0)
    sized.fill_items = kComparisonItemsPerIteration * static_cast<uint64_t>(options.iterations);
  RunResult r;
  ENGINE_TRY(run_engine(sized, mode, &r));
  // Ours' jobs are the runtime's, with a fixed item count (the peers' fill never runs out): a job
  // that completed ran out during the run, and its later bubbles had nothing to fill. Its filled
  // share would measure the job's size, not the fill mode, so no figure is made of it.
  for (size_t s = 0; s < r.stages.size(); ++s)
    if (r.stages[s].job_status == pfJobCompleted)
      return Status{pfErrorInvalidArgument,
                    fmt::format("{} on stage {}: its fill job completed all {} items before "
                                "iteration {} ended, so its filled share would be capped by the "
                                "job's size, not by the fill mode; give the comparison more "
                                "items (fill_items, --fill-items; it had {})",
                                fill_mode_name(mode), s, r.stages[s].items_completed,
                                options.iterations, sized.fill_items)};
  PeerRow row;
  row.mode = mode;
  double sum = 0.0;
  for (size_t i = warm; i < r.iterations.size(); ++i) sum += r.iterations[i].time_us;
  row.iteration_us = sum / static_cast<double>(r.iterations.size() - warm);
  if (r.bubble_us > 0) {
    row.filled_pct = 100.0 * r.filled_sm_us / (r.bubble_us * fill_sms);
    row.throughput = r.item_work_sm_us / (r.bubble_us * options.pipeline.sm_count);
    row.transfer_free_pct = 100.0 * r.transfer_free_us / r.bubble_us;
  }
  std::tie(row.first_block_p50_us, row.first_block_p99_us) = p50_p99(r.first_block_delays_us);
  std::tie(row.all_blocks_p50_us, row.all_blocks_p99_us) = p50_p99(r.all_blocks_delays_us);
  row.bubbles = r.first_block_delays_us.size();
  row.slowdown_pct =
      none_iteration_us > 0 ? 100.0 * (row.iteration_us / none_iteration_us - 1.0) : 0.0;
  *row_out = row;
  return {};
}

Status compare_fill_modes(const EngineOptions& options, const std::vector<FillMode>& modes,
                          std::vector<PeerRow>* rows) {
  std::vector<PeerRow> out(1);
  ENGINE_TRY(measure_fill_mode(options, FillMode::None, 0.0, &out.front()));
  for (FillMode mode : modes) {
    if (mode == FillMode::None) continue;
    PeerRow row;
    ENGINE_TRY(measure_fill_mode(options, mode, out.front().iteration_us, &row));
    out.push_back(row);
  }
  *rows = std::move(out);
  return {};
}

std::string format_peer_table(const EngineOptions& o, const std::vector<PeerRow>& rows,
                              const std::string& prefix) {
  const PeerRow* ours = nullptr;
  for (const PeerRow& r : rows)
    if (r.mode == FillMode::PipeFill && r.label.empty()) ours = &r;
  auto ratio = [](double value, double of) {
    return of > 0 ? fmt::format("{:.2f}", value / of) : std::string("n/a");
  };
  std::string s;
  s += fmt::format("{}{:<15} {:>10} {:>8} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
                   prefix, "mode", "slowdown%", "filled%", "thr/dedic", "start p50", "start p99",
                   "own p50", "own p99", "slow/ours", "fill/ours", "thr/ours");
  for (const PeerRow& r : rows) {
    s += fmt::format("{}{:<15} {:>10.3f} {:>8.1f} {:>10.3f} {:>10.2f} {:>10.2f} {:>9.2f} {:>9.2f} {:>9} {:>9} {:>9}\n",
                     prefix, r.label.empty() ? fill_mode_name(r.mode) : r.label.c_str(),
                     r.slowdown_pct, r.filled_pct, r.throughput,
                     r.first_block_p50_us, r.first_block_p99_us, r.all_blocks_p50_us,
                     r.all_blocks_p99_us,
                     ours ? ratio(r.slowdown_pct, ours->slowdown_pct) : "n/a",
                     ours ? ratio(r.filled_pct, ours->filled_pct) : "n/a",
                     ours ? ratio(r.throughput, ours->throughput) : "n/a");
  }
  s += fmt::format(
      "{}columns: slowdown% = mean iteration time from iteration {} vs no fill; filled% = fill "
      "item work (nominal item cost) inside bubbles / (bubble time x {} non-comm SMs); thr/dedic "
      "= all fill item work / (bubble time x {} SMs), i.e. items per bubble-second vs the same "
      "job alone on a dedicated simulated GPU; start = bubble end -> first block of the stage's "
      "next main kernel, own = -> its last block (it holds every SM it needs), p50/p99 over {} "
      "bubbles (us); x/ours = ratio to PipeFill's\n",
      prefix, o.warm_iterations + 1, o.pipeline.sm_count - o.pipeline.comm_sms,
      o.pipeline.sm_count, rows.empty() ? 0 : rows.front().bubbles);
  return s;
}

}  // namespace engine
