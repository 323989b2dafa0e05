// Shared by the example engine's benchmarks (bench_engine.cpp, engine/*.cpp): the helpers and
// the gate scenario's bubble lengths (400 us, one in ~12 ending early at 30-90%).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../../examples/fill_jobs/reference.hpp"
#include "../../examples/pipeline_engine/engine.hpp"

namespace engine_bench {

inline double mean_after(const engine::RunResult& r, size_t warm,
                         double engine::IterationResult::*field) {
  double sum = 0;
  size_t n = 0;
  for (size_t i = warm; i < r.iterations.size(); ++i, ++n) sum += r.iterations[i].*field;
  return n ? sum / n : 0.0;
}

inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// The gate and single-stage peer scenarios: bubbles of kLong, main kernels of kKernel.
constexpr double kLong = 400.0, kKernel = 150.0;
inline bool early(int i) { return fill_jobs::item_seed(42, static_cast<uint64_t>(i)) % 12 == 0; }
inline double bubble_length(int i) {
  if (!early(i)) return kLong;
  const uint64_t r = fill_jobs::item_seed(43, static_cast<uint64_t>(i)) % 1000;
  return kLong * (0.3 + 0.6 * r / 1000.0);
}

}  // namespace engine_bench
