// Item costs learned online (cost_model.hpp): the window, its quantile, the streak and probes.
#include "core/cost_model.hpp"

#include <algorithm>
#include <cmath>

namespace pipefill::core {

void CostWindow::add(double sample_us, uint64_t rounds, double busy_us) {
  if (!(sample_us > 0) || !std::isfinite(sample_us)) return;
  samples_[next_] = sample_us;
  rounds_[next_] = static_cast<double>(std::max<uint64_t>(1, rounds));
  busy_[next_] = busy_us > 0 && std::isfinite(busy_us) ? busy_us : sample_us * rounds_[next_];
  next_ = (next_ + 1) % kCapacity;
  kept_ = std::min(kept_ + 1, kCapacity);
  ++total_;
}

double CostWindow::quantile(double q) const {
  if (kept_ == 0) return 0.0;
  std::array<double, kCapacity> sorted = samples_;  // a copy on the stack, no allocation
  // Nearest rank: the smallest sample with at least q of the kept ones at or below it.
  const double rank = std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(kept_));
  const size_t index = static_cast<size_t>(std::max(1.0, rank)) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(index),
                   sorted.begin() + static_cast<std::ptrdiff_t>(kept_));
  return sorted[index];
}

double CostWindow::rounds_slope() const {
  // Every pair of kept samples: at most kCapacity * (kCapacity - 1) / 2 slopes, on the stack.
  std::array<double, kCapacity * (kCapacity - 1) / 2> slopes{};
  size_t n = 0;
  for (size_t i = 0; i < kept_; ++i) {
    for (size_t j = i + 1; j < kept_; ++j) {
      const double d_rounds = rounds_[j] - rounds_[i];
      if (d_rounds == 0.0) continue;
      slopes[n++] = (busy_[j] - busy_[i]) / d_rounds;
    }
  }
  if (n < kMinSlopePairs) return 0.0;
  // Lower median (nearest rank 0.5), as quantile() takes it.
  const size_t index = (n + 1) / 2 - 1;
  std::nth_element(slopes.begin(), slopes.begin() + static_cast<std::ptrdiff_t>(index),
                   slopes.begin() + static_cast<std::ptrdiff_t>(n));
  return slopes[index];
}

double CostWindow::tail_at(double slope) const {
  std::array<double, kCapacity> rest{};
  for (size_t i = 0; i < kept_; ++i) rest[i] = busy_[i] - slope * rounds_[i];
  const size_t index = (kept_ + 1) / 2 - 1;
  std::nth_element(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(index),
                   rest.begin() + static_cast<std::ptrdiff_t>(kept_));
  return std::max(0.0, rest[index]);
}

void JobCostModel::init(bool gated_kind) {
  gated = gated_kind;
  probe_interval = gated ? kFirstProbeAfterGated : kFirstProbeAfterOpaque;
  next_probe_at = probe_interval;
}

double JobCostModel::estimate(size_t config, double prior_us) const {
  if (fixed) return prior_us;
  if (config >= windows.size() || windows[config].kept() == 0) return prior_us;
  const CostWindow& w = windows[config];
  if (!gated) return w.quantile(kOpaqueCostQuantile);
  double learned = w.quantile(fastest ? 0.0 : kGatedCostQuantile);
  if (!fastest) {
    // The per-item cost without the slice's tail: the slope, when the rounds vary enough to give
    // one. The tail only adds time, so a slope above the median per-round time is noise (kept
    // out), and one below half of it is not a tail the workers' spread explains (ignored).
    const double slope = w.rounds_slope();
    if (slope >= 0.5 * learned && slope < learned) learned = slope;
  }
  return w.kept() < kGatedSamplesToRaise ? std::min(learned, prior_us) : learned;
}

double JobCostModel::slice_tail(size_t config) const {
  if (fixed || !gated || fastest || config >= windows.size()) return 0.0;
  const CostWindow& w = windows[config];
  if (w.kept() == 0) return 0.0;
  const double median = w.quantile(kGatedCostQuantile);
  const double slope = w.rounds_slope();
  if (!(slope >= 0.5 * median && slope < median)) return 0.0;
  return w.tail_at(slope);
}

double JobCostModel::add_slice(size_t config, double busy_us, uint64_t items_done, int workers,
                               double prior_us) {
  if (config >= windows.size() || items_done == 0 || workers <= 0) return estimate(config, prior_us);
  // The planner's model of a slice: ceil(items / workers) rounds of one item per worker.
  const uint64_t w = static_cast<uint64_t>(workers);
  const uint64_t rounds = (items_done + w - 1) / w;
  windows[config].add(busy_us / static_cast<double>(rounds), rounds, busy_us);
  return estimate(config, prior_us);
}

void JobCostModel::note_too_short(double predicted_us, double budget_us) {
  const size_t at = static_cast<size_t>(too_short_bubbles % kRecentTooShort);
  recent_predicted_us[at] = predicted_us;
  recent_budget_us[at] = budget_us;
  ++too_short_bubbles;
  ++too_short_streak;
}

void JobCostModel::note_fitted() {
  too_short_streak = 0;
  probe_interval = gated ? kFirstProbeAfterGated : kFirstProbeAfterOpaque;
  next_probe_at = probe_interval;
}

void JobCostModel::note_probe() {
  ++probes;
  const uint32_t cap = gated ? kMaxProbeIntervalGated : kMaxProbeIntervalOpaque;
  probe_interval = std::min(cap, probe_interval * 2);
  next_probe_at = too_short_streak + probe_interval;
}

size_t JobCostModel::recent(std::span<double> predicted, std::span<double> budget) const {
  const size_t n = static_cast<size_t>(std::min<uint64_t>(too_short_bubbles, kRecentTooShort));
  for (size_t i = 0; i < n && i < predicted.size() && i < budget.size(); ++i) {
    const size_t at = static_cast<size_t>((too_short_bubbles - n + i) % kRecentTooShort);
    predicted[i] = recent_predicted_us[at];
    budget[i] = recent_budget_us[at];
  }
  return n;
}

}  // namespace pipefill::core
