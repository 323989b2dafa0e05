// Small numeric helpers of the trace analyser: quantiles, summaries and interval unions.
#pragma once

#include <cstddef>
#include <vector>

namespace pipefill::analysis {

// Quantile of an ascending `sorted` sample by linear interpolation between closest ranks
// (NumPy's default, Hyndman-Fan type 7): position (n-1)*q. 0 for an empty sample; q is
// clamped to [0,1].
double quantile_linear(const std::vector<double>& sorted, double q);

// Nearest-rank quantile: the ceil(q*n)-th smallest value (1-based, at least the first). This is
// what the runtime's bubble predictor uses, so fill estimates use it too. 0 when empty.
double quantile_nearest_rank(const std::vector<double>& sorted, double q);

struct Summary {
  size_t count = 0;
  double sum = 0.0;
  double mean = 0.0;
  double min = 0.0;
  double p10 = 0.0;  // linear-interpolation quantiles
  double p50 = 0.0;
  double p90 = 0.0;
  double max = 0.0;
};

Summary summarize(std::vector<double> values);

struct Interval {
  double start_us = 0.0;
  double end_us = 0.0;
};

// Union of `intervals` as ascending, disjoint intervals (touching or overlapping ones merged;
// empty ones dropped).
std::vector<Interval> merge_intervals(std::vector<Interval> intervals);

// Length of [start, end) covered by `merged` (the output of merge_intervals).
double covered_time(const std::vector<Interval>& merged, double start_us, double end_us);

}  // namespace pipefill::analysis
