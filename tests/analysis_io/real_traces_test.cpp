// The analyser on real PyTorch-profiler (Kineto) traces, read as shared (.json.gz) by the
// streaming importer, against figures tests/data/hta/reference.py computed straight from the
// JSON with its own code (elementary-segment bubble shares, launch-correlation step rule).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/bubbles.hpp"
#include "analysis/io/trace_reader.hpp"
#include "analysis/report.hpp"
#include "common/error.hpp"

namespace pipefill::analysis {
namespace {

using json = nlohmann::json;

const std::string kHta = std::string(PIPEFILL_TEST_DATA_DIR) + "/hta/";

json reference() {
  std::ifstream in(kHta + "reference.json");
  EXPECT_TRUE(in.good());
  return json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
}

// Sums of many doubles in a different order: equal to well below a microsecond.
constexpr double kUs = 1e-3;

const char* source_name(const DeviceAnalysis& d) {
  if (d.iteration_source != IterationSource::Markers) return "whole-trace";
  return d.host_markers ? "host" : "gpu";
}

void expect_matches(const json& ref, const DeviceAnalysis& d) {
  EXPECT_EQ(d.compute_kernels, ref["compute_kernels"].get<size_t>());
  EXPECT_EQ(d.comm_kernels, ref["comm_kernels"].get<size_t>());
  EXPECT_NEAR(d.span_us(), ref["span_us"].get<double>(), kUs);
  EXPECT_NEAR(d.compute_busy_us, ref["compute_busy_us"].get<double>(), kUs);
  EXPECT_EQ(d.bubbles.size(), ref["bubbles"].get<size_t>());
  EXPECT_NEAR(d.bubble_us, ref["bubble_us"].get<double>(), kUs);
  EXPECT_NEAR(d.idle_bubble_us, ref["idle_us"].get<double>(), kUs);
  EXPECT_NEAR(d.comm_only_bubble_us, ref["comm_only_us"].get<double>(), kUs);
  EXPECT_NEAR(d.copy_bubble_us, ref["copy_us"].get<double>(), kUs);
  EXPECT_EQ(d.idle_bubbles, ref["labelled_idle"].get<size_t>());
  EXPECT_EQ(d.comm_only_bubbles, ref["labelled_comm_only"].get<size_t>());
  EXPECT_EQ(d.copy_bubbles, ref["labelled_copy"].get<size_t>());
  EXPECT_EQ(d.start_delay.count, ref["start_delays"].get<size_t>());
  if (d.start_delay.count > 0) {
    EXPECT_NEAR(d.start_delay.max, ref["start_delay_max_us"].get<double>(), kUs);
  }
  EXPECT_EQ(source_name(d), ref["iteration_source"].get<std::string>());
  EXPECT_EQ(d.iterations.size(), ref["iterations"].get<size_t>());
  EXPECT_NEAR(d.mean_iteration_us, ref["mean_iteration_us"].get<double>(), kUs);
}

TEST(RealTraces, EveryFigureMatchesTheIndependentReference) {
  const json ref = reference();
  ASSERT_EQ(ref.size(), 5u);
  std::map<std::string, std::vector<json>> by_trace;
  for (const json& row : ref) by_trace[row["trace"].get<std::string>()].push_back(row);
  for (const auto& [name, rows] : by_trace) {
    SCOPED_TRACE(name);
    CompactTrace trace;
    ASSERT_EQ(io::read_trace_file(kHta + name, ImportOptions{}, &trace), pfSuccess)
        << last_error_message();
    EXPECT_EQ(trace.events_total, rows.front()["events"].get<size_t>());
    EXPECT_EQ(trace.rank, rows.front()["rank"].get<int>());
    TraceAnalyzer analyzer(trace);
    std::vector<int> expected_devices;
    for (const json& row : rows) expected_devices.push_back(row["device"].get<int>());
    EXPECT_EQ(analyzer.analysable_devices(), expected_devices);
    for (const json& row : rows) {
      DeviceAnalysis d;
      ASSERT_EQ(analyzer.analyze(row["device"].get<int>(), AnalysisOptions{}, &d), pfSuccess)
          << last_error_message();
      expect_matches(row, d);
      // Shares partition every bubble.
      for (const Bubble& b : d.bubbles) {
        EXPECT_NEAR(b.idle_us + b.comm_only_us + b.copy_us, b.duration_us(), 1e-6);
      }
    }
  }
}

// The ROCm trace of issue 12: the GPU-side ProfilerStep ends at 1.03 ms while the step's
// kernels run until about 8.9 ms; the host-side marker gives the iteration, and says why.
TEST(RealTraces, EarlyEndingGpuStepMarkerOfTheRocmTraceGivesWayToTheHostOne) {
  CompactTrace trace;
  ASSERT_EQ(io::read_trace_file(kHta + "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                                ImportOptions{}, &trace),
            pfSuccess)
      << last_error_message();
  DeviceAnalysis d;
  ASSERT_EQ(analyze_device(trace, 2, AnalysisOptions{}, &d), pfSuccess) << last_error_message();
  EXPECT_TRUE(d.host_markers);
  ASSERT_EQ(d.iterations.size(), 1u);
  // Longer than the device span: the host step starts before the first kernel.
  EXPECT_GT(d.iterations[0].duration_us(), d.span_us());
  EXPECT_THAT(d.notes, ::testing::Contains(::testing::HasSubstr("using the host-side")));
}

// A folder of rank traces: a row per rank, and a cross-rank summary whose figures follow from
// the reference's per-rank ones.
TEST(RealTraces, AFolderOfRankTracesGivesARowPerRankAndACrossRankSummary) {
  const json ref = reference();
  std::vector<json> rows;
  for (const json& row : ref) {
    if (row["trace"].get<std::string>().rfind("sampled_ranks/", 0) == 0) rows.push_back(row);
  }
  ASSERT_EQ(rows.size(), 2u);

  std::vector<std::string> files;
  ASSERT_EQ(io::list_trace_folder(kHta + "sampled_ranks", &files), pfSuccess);
  ASSERT_EQ(files.size(), 2u);
  std::vector<TraceReport> reports;
  for (const std::string& file : files) {
    CompactTrace trace;
    ASSERT_EQ(io::read_trace_file(file, ImportOptions{}, &trace), pfSuccess) << last_error_message();
    TraceReport report;
    ASSERT_EQ(build_report(trace, nullptr, {}, AnalysisOptions{}, &report), pfSuccess)
        << last_error_message();
    reports.push_back(std::move(report));
  }
  const CrossRankSummary s = summarize_ranks(reports);
  EXPECT_EQ(s.ranks, 2u);
  EXPECT_EQ(s.devices, 2u);
  double bubble = 0, span = 0, idle = 0, comm = 0, copy = 0;
  std::vector<std::pair<double, int>> shares;
  for (const json& row : rows) {
    bubble += row["bubble_us"].get<double>();
    span += row["span_us"].get<double>();
    idle += row["idle_us"].get<double>();
    comm += row["comm_only_us"].get<double>();
    copy += row["copy_us"].get<double>();
    shares.push_back({row["bubble_us"].get<double>() / row["span_us"].get<double>(),
                      row["rank"].get<int>()});
  }
  std::sort(shares.begin(), shares.end());
  EXPECT_NEAR(s.bubble_us, bubble, kUs);
  EXPECT_NEAR(s.span_us, span, kUs);
  EXPECT_NEAR(s.idle_us, idle, kUs);
  EXPECT_NEAR(s.comm_only_us, comm, kUs);
  EXPECT_NEAR(s.copy_us, copy, kUs);
  EXPECT_NEAR(s.overall_share, bubble / span, 1e-12);
  EXPECT_NEAR(s.share_min, shares.front().first, 1e-12);
  EXPECT_NEAR(s.share_max, shares.back().first, 1e-12);
  EXPECT_NEAR(s.share_mean, (shares[0].first + shares[1].first) / 2, 1e-12);
  EXPECT_EQ(s.rank_min, shares.front().second);
  EXPECT_EQ(s.rank_max, shares.back().second);

  const std::string text = format_ranks(reports, s);
  EXPECT_THAT(text, ::testing::HasSubstr("2 rank traces"));
  EXPECT_THAT(text, ::testing::HasSubstr("sampled_rank-0.json.gz"));
  EXPECT_THAT(text, ::testing::HasSubstr("sampled_rank-1.json.gz"));
  const json j = ranks_to_json(reports, s);
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][0]["rank"].get<int>(), 0);
  EXPECT_EQ(j["ranks"][1]["rank"].get<int>(), 1);
  EXPECT_NEAR(j["summary"]["bubble_share"].get<double>(), bubble / span, 1e-12);
}

}  // namespace
}  // namespace pipefill::analysis
