#include "core/predictor.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

namespace pipefill {

BubblePredictor::BubblePredictor(int min_samples, size_t window, double alpha)
    : min_samples_(min_samples < 0 ? 0 : min_samples),
      window_(window == 0 ? 1 : window),
      alpha_(alpha <= 0 || alpha > 1 ? 0.2 : alpha) {}

void BubblePredictor::add_sample(const std::string& class_key, double duration_us) {
  if (!std::isfinite(duration_us)) return;  // keeps the sorted window well ordered
  ClassHistory& h = classes_[class_key];
  if (h.count == 0) {
    h.ewma = duration_us;
    h.min = duration_us;
    h.max = duration_us;
  } else {
    h.ewma = alpha_ * duration_us + (1.0 - alpha_) * h.ewma;
    h.min = std::min(h.min, duration_us);
    h.max = std::max(h.max, duration_us);
  }
  ++h.count;
  h.window.push_back(duration_us);
  h.sorted.insert(std::upper_bound(h.sorted.begin(), h.sorted.end(), duration_us), duration_us);
  if (h.window.size() > window_) {
    const double oldest = h.window.front();
    h.window.pop_front();
    h.sorted.erase(std::lower_bound(h.sorted.begin(), h.sorted.end(), oldest));
  }
}

BubblePrediction BubblePredictor::predict(const std::string& class_key, double quantile) const {
  BubblePrediction p;
  const auto it = classes_.find(class_key);
  if (it == classes_.end() || it->second.count == 0) return p;
  const ClassHistory& h = it->second;
  p.count = h.count;
  p.ewma_us = h.ewma;
  p.min_us = h.min;
  p.max_us = h.max;
  p.ready = h.count >= static_cast<uint64_t>(min_samples_);
  // Nearest rank: the smallest value with at least q*n samples at or below it.
  const std::vector<double>& sorted = h.sorted;
  const double q = std::clamp(quantile, 0.0, 1.0);
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  p.quantile_us = sorted[rank - 1];
  return p;
}

std::vector<std::string> BubblePredictor::class_keys() const {
  std::vector<std::string> keys;
  keys.reserve(classes_.size());
  for (const auto& [key, history] : classes_) {
    if (history.count > 0) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::string bubble_class_key(uint64_t index_in_iteration, const char* label) {
  if (label != nullptr && *label != '\0') return std::string(label);
  return fmt::format("#{}", index_in_iteration);
}

}  // namespace pipefill
