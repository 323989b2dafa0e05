// The report layer: --device-map (remap_devices), the rank of a trace file, and the cross-rank
// summary of a folder of rank traces, on hand-built inputs with hand-computed figures.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "analysis/report.hpp"
#include "common/error.hpp"
#include "test_records.hpp"

namespace pipefill::analysis {
namespace {

using ::testing::HasSubstr;
using testing::kernel;

// One stage on `device`: kernels [0,100), [300,400), [700,800); bubbles of 200 and 300 us.
std::vector<ActivityRecord> stage(int device, double stretch = 1.0) {
  return {kernel(0, 100 * stretch, "fwd", device), kernel(300, 300 + 100 * stretch, "fwd", device),
          kernel(700, 700 + 100 * stretch, "bwd", device)};
}

TEST(DeviceMap, ABaselineTracedOnAnotherDeviceIsComparedAfterRemapping) {
  const CompactTrace filled = compact_from_activity(stage(0, 1.1), "filled");
  CompactTrace baseline = compact_from_activity(stage(3), "baseline");
  baseline.device_memory_bytes[3] = 1000;
  TraceReport report;
  EXPECT_EQ(build_report(filled, &baseline, {0}, AnalysisOptions{}, &report), pfErrorInvalidArgument);
  EXPECT_THAT(last_error_message(), HasSubstr("device 0 has no compute kernels"));

  ASSERT_EQ(remap_devices({{3, 0}}, &baseline), pfSuccess) << last_error_message();
  EXPECT_EQ(baseline.devices(), std::vector<int>{0});
  EXPECT_EQ(baseline.device_memory_bytes, (std::map<int, uint64_t>{{0, 1000}}));
  ASSERT_EQ(build_report(filled, &baseline, {0}, AnalysisOptions{}, &report), pfSuccess)
      << last_error_message();
  ASSERT_EQ(report.interference.size(), 1u);
  const InterferenceAnalysis& i = report.interference[0];
  EXPECT_EQ(i.matched_kernels, 3u);
  EXPECT_DOUBLE_EQ(i.compute_baseline_us, 300.0);
  EXPECT_NEAR(i.compute_filled_us, 330.0, 1e-9);
  EXPECT_NEAR(i.compute_slowdown, 1.1, 1e-12);
}

TEST(DeviceMap, SwapsAreAllowedAndHostRecordsStayOnTheHost) {
  std::vector<ActivityRecord> records = stage(0);
  for (const ActivityRecord& r : stage(1, 0.5)) records.push_back(r);
  records.push_back(testing::marker(0, 1000, "ProfilerStep#1", kHostDevice));
  CompactTrace trace = compact_from_activity(records, "t");
  trace.device_memory_bytes = {{0, 10}, {1, 20}};
  ASSERT_EQ(remap_devices({{0, 1}, {1, 0}}, &trace), pfSuccess) << last_error_message();
  EXPECT_EQ(trace.records[0].device, 1);   // was device 0
  EXPECT_EQ(trace.records[3].device, 0);   // was device 1
  EXPECT_EQ(trace.records[3].end_us, 50);  // the half-length kernels now are device 0's
  EXPECT_EQ(trace.records[6].device, kHostDevice);
  EXPECT_EQ(trace.device_memory_bytes, (std::map<int, uint64_t>{{0, 20}, {1, 10}}));
}

TEST(DeviceMap, MappingsThatWouldMixOrLoseDevicesAreRefusedAndChangeNothing) {
  std::vector<ActivityRecord> records = stage(0);
  for (const ActivityRecord& r : stage(1)) records.push_back(r);
  const CompactTrace original = compact_from_activity(records, "t.json");
  struct Case {
    std::vector<std::pair<int, int>> mapping;
    std::string expected;
  };
  const Case cases[] = {
      {{{0, 1}}, "--device-map 0:1: t.json already has records of device 1; map that one away too (e.g. --device-map 1:0)"},
      {{{5, 0}}, "--device-map 5:0: t.json has no records of device 5 (devices: [0, 1])"},
      {{{0, 2}, {0, 3}}, "device 0 is mapped twice"},
      {{{-1, 0}}, "device ids must be >= 0"},
  };
  for (const Case& c : cases) {
    CompactTrace trace = original;
    EXPECT_EQ(remap_devices(c.mapping, &trace), pfErrorInvalidArgument);
    EXPECT_THAT(last_error_message(), HasSubstr(c.expected));
    for (size_t i = 0; i < trace.records.size(); ++i) {
      EXPECT_EQ(trace.records[i].device, original.records[i].device);
    }
  }
}

TEST(RankFromFileName, PrefersTheNumberAfterRankThenTheLastNumber) {
  EXPECT_EQ(rank_from_file_name("traces/rank-3.json.gz"), 3);
  EXPECT_EQ(rank_from_file_name("run7/trace_rank_12_step_3.json"), 12);
  EXPECT_EQ(rank_from_file_name("RANK5.json"), 5);
  EXPECT_EQ(rank_from_file_name("worker7.pt.trace.json"), 7);
  EXPECT_EQ(rank_from_file_name("host-a_1234.1700000000123.pt.trace.json"), -1);  // a timestamp
  EXPECT_EQ(rank_from_file_name("dir3/trace.json"), -1);  // folder names do not count
  EXPECT_EQ(rank_from_file_name("ranking.json"), -1);
}

DeviceAnalysis row(int device, double span, double bubble, double idle, double comm,
                   double copy, double iteration) {
  DeviceAnalysis d;
  d.device = device;
  d.span_start_us = 1000;
  d.span_end_us = 1000 + span;
  d.bubble_us = bubble;
  d.idle_bubble_us = idle;
  d.comm_only_bubble_us = comm;
  d.copy_bubble_us = copy;
  d.bubble_share = bubble / span;
  d.mean_iteration_us = iteration;
  return d;
}

TEST(CrossRankSummary, SharesPerRowAndOverAllRanks) {
  TraceReport r0, r1;
  r0.rank = 0;
  r0.source = "rank-0.json";
  r0.devices = {row(0, 1000, 400, 200, 150, 50, 500)};          // 40%
  r1.rank = 1;
  r1.source = "rank-1.json";
  r1.devices = {row(1, 2000, 200, 200, 0, 0, 800),              // 10%
                row(2, 1000, 700, 100, 500, 100, 700)};         // 70%
  const CrossRankSummary s = summarize_ranks({r0, r1});
  EXPECT_EQ(s.ranks, 2u);
  EXPECT_EQ(s.devices, 3u);
  EXPECT_DOUBLE_EQ(s.share_min, 0.1);
  EXPECT_EQ(s.rank_min, 1);
  EXPECT_DOUBLE_EQ(s.share_max, 0.7);
  EXPECT_EQ(s.rank_max, 1);
  EXPECT_DOUBLE_EQ(s.share_median, 0.4);
  EXPECT_DOUBLE_EQ(s.share_mean, 0.4);
  EXPECT_DOUBLE_EQ(s.bubble_us, 1300);
  EXPECT_DOUBLE_EQ(s.span_us, 4000);
  EXPECT_DOUBLE_EQ(s.overall_share, 1300.0 / 4000.0);
  EXPECT_DOUBLE_EQ(s.idle_us, 500);
  EXPECT_DOUBLE_EQ(s.comm_only_us, 650);
  EXPECT_DOUBLE_EQ(s.copy_us, 150);
  EXPECT_DOUBLE_EQ(s.iteration_min_us, 500);
  EXPECT_DOUBLE_EQ(s.iteration_max_us, 800);
  const std::string text = format_ranks({r0, r1}, s);
  EXPECT_THAT(text, HasSubstr("Across 2 ranks (3 devices): bubble share min 10.0% (rank 1), "
                              "median 40.0%, mean 40.0%, max 70.0% (rank 1); all ranks together "
                              "1.300 ms of 4.000 ms = 32.5%"));
}

}  // namespace
}  // namespace pipefill::analysis
