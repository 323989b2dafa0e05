#include "analysis/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pipefill::analysis {

double quantile_linear(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  q = std::clamp(q, 0.0, 1.0);
  const double position = q * static_cast<double>(sorted.size() - 1);
  const size_t lower = static_cast<size_t>(std::floor(position));
  const size_t upper = std::min(lower + 1, sorted.size() - 1);
  const double fraction = position - static_cast<double>(lower);
  return sorted[lower] + (sorted[upper] - sorted[lower]) * fraction;
}

double quantile_nearest_rank(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  q = std::clamp(q, 0.0, 1.0);
  // A tiny tolerance keeps q*n that is an integer in exact arithmetic (0.1*10) from rounding up.
  const double rank = std::ceil(q * static_cast<double>(sorted.size()) - 1e-9);
  const size_t index = rank <= 1.0 ? 0 : static_cast<size_t>(rank) - 1;
  return sorted[std::min(index, sorted.size() - 1)];
}

Summary summarize(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = values.size();
  s.sum = std::accumulate(values.begin(), values.end(), 0.0);
  s.mean = s.sum / static_cast<double>(s.count);
  s.min = values.front();
  s.max = values.back();
  s.p10 = quantile_linear(values, 0.10);
  s.p50 = quantile_linear(values, 0.50);
  s.p90 = quantile_linear(values, 0.90);
  return s;
}

std::vector<Interval> merge_intervals(std::vector<Interval> intervals) {
  std::erase_if(intervals, [](const Interval& i) { return !(i.end_us > i.start_us); });
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& a, const Interval& b) { return a.start_us < b.start_us; });
  std::vector<Interval> merged;
  merged.reserve(intervals.size());
  for (const Interval& i : intervals) {
    if (!merged.empty() && i.start_us <= merged.back().end_us) {
      merged.back().end_us = std::max(merged.back().end_us, i.end_us);
    } else {
      merged.push_back(i);
    }
  }
  return merged;
}

double covered_time(const std::vector<Interval>& merged, double start_us, double end_us) {
  if (!(end_us > start_us)) return 0.0;
  // First interval that ends after `start_us`; the union is sorted by start and by end.
  auto it = std::upper_bound(merged.begin(), merged.end(), start_us,
                             [](double t, const Interval& i) { return t < i.end_us; });
  double covered = 0.0;
  for (; it != merged.end() && it->start_us < end_us; ++it) {
    covered += std::min(it->end_us, end_us) - std::max(it->start_us, start_us);
  }
  return covered;
}

}  // namespace pipefill::analysis
