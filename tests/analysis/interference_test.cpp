#include <gtest/gtest.h>

#include "analysis/interference.hpp"
#include "common/error.hpp"
#include "test_records.hpp"

namespace pipefill::analysis {
namespace {

using namespace pipefill::analysis::testing;

// Three steps "A B" with a comm-only bubble before each B: A [s, s+a), recv until s+300,
// B starts `delay` after the recv ends and lasts 50 us.
std::vector<ActivityRecord> steps(const std::vector<double>& a_durations, double delay,
                                  bool with_fill) {
  std::vector<ActivityRecord> records;
  double s = 0;
  for (double a : a_durations) {
    records.push_back(kernel(s, s + a, "A"));
    records.push_back(comm(s + a, s + 300));
    if (with_fill) records.push_back(record(ActivityKind::Fill, s + a + 10, s + 290, "fill", 0, 30));
    records.push_back(kernel(s + 300 + delay, s + 350 + delay, "B"));
    s += 1000;
  }
  return records;
}

TEST(Interference, MatchesKernelsByNameAndOrderAndSumsTheirDurations) {
  const auto baseline = steps({100, 100, 100}, 5, false);
  auto filled = steps({110, 100, 120, 100}, 15, true);  // one step more than the baseline
  InterferenceAnalysis a;
  ASSERT_EQ(compare_traces(baseline, filled, 0, AnalysisOptions{}, &a), pfSuccess)
      << last_error_message();
  EXPECT_EQ(a.baseline_kernels, 9u);
  EXPECT_EQ(a.filled_kernels, 12u);  // fill kernels are not the main job's
  EXPECT_EQ(a.matched_kernels, 9u);
  ASSERT_EQ(a.kernels.size(), 3u);
  EXPECT_EQ(a.kernels[0].name, "A");  // largest extra time first
  EXPECT_EQ(a.kernels[0].matched, 3u);
  EXPECT_DOUBLE_EQ(a.kernels[0].baseline_us, 300);
  EXPECT_DOUBLE_EQ(a.kernels[0].filled_us, 330);
  EXPECT_DOUBLE_EQ(a.kernels[0].slowdown(), 1.1);
  // Compute: A 300 -> 330, B 150 -> 150. Comm waits 200+200+200 -> 190+200+180.
  EXPECT_DOUBLE_EQ(a.compute_baseline_us, 450);
  EXPECT_DOUBLE_EQ(a.compute_filled_us, 480);
  EXPECT_DOUBLE_EQ(a.compute_slowdown, 480.0 / 450.0);
  EXPECT_DOUBLE_EQ(a.comm_baseline_us, 600);
  EXPECT_DOUBLE_EQ(a.comm_filled_us, 570);
  EXPECT_DOUBLE_EQ(a.baseline_start_delay.p50, 5);
  EXPECT_DOUBLE_EQ(a.filled_start_delay.p50, 15);
  EXPECT_EQ(a.filled_start_delay.count, 4u);
  // Bubbles of the filled trace: A's end to B's start (205, 215, 195, 215) and the idle 635 us
  // from B's end to the next A. Fill covers 10 us after A to 10 us before the recv ends.
  EXPECT_DOUBLE_EQ(a.filled_bubble_us, 205 + 215 + 195 + 215 + 3 * 635);
  EXPECT_DOUBLE_EQ(a.fill_in_bubbles_us, 170 + 180 + 160 + 180);
  // The filled trace's fourth step has nothing to match.
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("only 9 of 12"), std::string::npos) << a.notes[0];
}

TEST(Interference, IterationTimesAreCompared) {
  AnalysisOptions o;
  o.iteration_period_us = 1000;
  const auto baseline = steps({100, 100}, 5, false);
  const auto filled = steps({100, 100}, 15, true);
  InterferenceAnalysis a;
  ASSERT_EQ(compare_traces(baseline, filled, 0, o, &a), pfSuccess);
  // Both traces cut into 1000 us periods from their first kernel: 2 iterations each.
  EXPECT_DOUBLE_EQ(a.baseline_iteration_us, 1000);
  EXPECT_DOUBLE_EQ(a.filled_iteration_us, 1000);
  EXPECT_DOUBLE_EQ(a.iteration_slowdown, 1.0);
  EXPECT_DOUBLE_EQ(a.compute_slowdown, 1.0);
}

TEST(Interference, PoorlyMatchingTracesAreNoted) {
  const auto baseline = steps({100, 100}, 5, false);
  std::vector<ActivityRecord> filled = {kernel(0, 100, "X"), kernel(500, 600, "Y")};
  InterferenceAnalysis a;
  ASSERT_EQ(compare_traces(baseline, filled, 0, AnalysisOptions{}, &a), pfSuccess);
  EXPECT_EQ(a.matched_kernels, 0u);
  EXPECT_TRUE(a.kernels.empty());
  EXPECT_DOUBLE_EQ(a.compute_slowdown, 1.0);
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("only 0 of 6"), std::string::npos) << a.notes[0];
}

TEST(Interference, ErrorsSayWhichTraceIsBad) {
  InterferenceAnalysis a;
  const auto good = steps({100}, 5, false);
  EXPECT_EQ(compare_traces({}, good, 0, AnalysisOptions{}, &a), pfErrorInvalidArgument);
  EXPECT_EQ(last_error_message().rfind("baseline trace: ", 0), 0u) << last_error_message();
  EXPECT_EQ(compare_traces(good, {comm(0, 10)}, 0, AnalysisOptions{}, &a), pfErrorInvalidArgument);
  EXPECT_EQ(last_error_message().rfind("filled trace: device 0", 0), 0u) << last_error_message();
}

}  // namespace
}  // namespace pipefill::analysis
