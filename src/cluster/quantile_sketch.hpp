// Quantiles of a stream of non-negative values (delays in µs) in bounded memory: exact while
// the stream is short (tests, small runs), a log-binned histogram with 1% wide bins once it is
// long (8K GPUs x 1000 iterations x bubbles). Zeros, the common case, are only counted.
// Deterministic: the same values in the same order give the same answers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace pipefill::cluster {

class QuantileSketch {
 public:
  void add(double v) {
    ++count_;
    if (!(v > 0)) {
      ++zeros_;
      return;
    }
    if (!binned_) {
      exact_.push_back(v);
      if (exact_.size() > kExactLimit) to_bins();
      return;
    }
    ++bins_[bin_of(v)];
  }

  uint64_t count() const { return count_; }

  // Nearest rank: the smallest value with at least q x count values at or below it. Exact in
  // the exact phase; afterwards the upper edge of the value's bin (at most 2.3% above it).
  double quantile(double q) const {
    if (count_ == 0) return 0.0;
    q = std::clamp(q, 0.0, 1.0);
    uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_) - 1e-9));
    if (rank == 0) rank = 1;
    if (rank <= zeros_) return 0.0;
    rank -= zeros_;
    if (!binned_) {
      std::vector<double> v = exact_;
      std::nth_element(v.begin(), v.begin() + static_cast<long>(rank - 1), v.end());
      return v[rank - 1];
    }
    uint64_t seen = 0;
    for (size_t i = 0; i < bins_.size(); ++i) {
      seen += bins_[i];
      if (seen >= rank) return upper_edge(i);
    }
    return upper_edge(bins_.size() - 1);
  }

 private:
  static constexpr size_t kExactLimit = size_t{1} << 16;
  static constexpr double kLowLog10 = -3.0;  // 1 ns
  static constexpr int kPerDecade = 100;
  static constexpr int kDecades = 15;        // up to 1e12 µs

  static size_t bin_of(double v) {
    const double x = (std::log10(v) - kLowLog10) * kPerDecade;
    if (!(x > 0)) return 0;
    const size_t last = static_cast<size_t>(kPerDecade * kDecades) - 1;
    return std::min(last, static_cast<size_t>(x));
  }
  static double upper_edge(size_t i) {
    return std::pow(10.0, kLowLog10 + static_cast<double>(i + 1) / kPerDecade);
  }
  void to_bins() {
    bins_.assign(static_cast<size_t>(kPerDecade * kDecades), 0);
    for (double v : exact_) ++bins_[bin_of(v)];
    exact_.clear();
    exact_.shrink_to_fit();
    binned_ = true;
  }

  uint64_t count_ = 0, zeros_ = 0;
  bool binned_ = false;
  std::vector<double> exact_;
  std::vector<uint64_t> bins_;
};

}  // namespace pipefill::cluster
