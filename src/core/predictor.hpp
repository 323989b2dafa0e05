// Per-bubble-class duration prediction. A bubble class is the k-th bubble of an iteration, or
// the hint's label when given. Fill work is sized to a quantile of the class's recent history:
// the median by default for gated work (the gate bounds a too-long prediction to one item of
// overrun), a conservative low one for ungated work (RuntimeOptions); EWMA and count are kept for
// stats and traces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

namespace pipefill {

struct BubblePrediction {
  uint64_t count = 0;       // samples seen
  double ewma_us = 0.0;     // exponentially weighted mean
  double quantile_us = 0.0; // the requested quantile of the kept window
  double min_us = 0.0;
  double max_us = 0.0;
  bool ready = false;       // count >= min_samples
};

class BubblePredictor {
 public:
  // window: samples kept per class for quantiles; alpha: EWMA weight of a new sample.
  explicit BubblePredictor(int min_samples = 2, size_t window = 64, double alpha = 0.2);

  void add_sample(const std::string& class_key, double duration_us);
  // Prediction for the class at quantile q in (0,1] (nearest-rank on the window).
  BubblePrediction predict(const std::string& class_key, double quantile) const;
  size_t class_count() const { return classes_.size(); }
  // Every class with a sample, sorted (a deterministic order).
  std::vector<std::string> class_keys() const;
  int min_samples() const { return min_samples_; }

 private:
  struct ClassHistory {
    uint64_t count = 0;
    double ewma = 0.0;
    double min = 0.0;
    double max = 0.0;
    std::deque<double> window;
    std::vector<double> sorted;  // the window's values in order: O(1) quantiles
  };
  int min_samples_;
  size_t window_;
  double alpha_;
  std::unordered_map<std::string, ClassHistory> classes_;
};

// Class key of the k-th bubble of an iteration (label wins when non-empty).
std::string bubble_class_key(uint64_t index_in_iteration, const char* label);

}  // namespace pipefill
