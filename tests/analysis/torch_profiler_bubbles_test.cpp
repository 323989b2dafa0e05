// pipefill.Runtime's torch.profiler ranges (user_annotation events named "bubble <class key>",
// python/pipefill/_profiler.py) are bubble markers: a CPU-only torch trace of a stage that marks
// bubbles through the Python package is analysed in explicit-bubble mode, with the process id as
// the device. Other user annotations stay host markers. (tests/python/test_experience.py runs
// pipefill-analyze on a trace the real torch.profiler wrote.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "analysis/bubbles.hpp"
#include "analysis/chrome_trace.hpp"
#include "common/error.hpp"

namespace pipefill::analysis {
namespace {

TEST(TorchProfilerBubbles, BubbleRangesOfATorchTraceAreTheBubbles) {
  const std::string json = R"json({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 4242, "tid": 1, "ts": 0, "dur": 1000},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 1, "ts": 10, "dur": 80},
    {"ph": "X", "cat": "user_annotation", "name": "bubble #0", "pid": 4242, "tid": 1, "ts": 100, "dur": 200},
    {"ph": "X", "cat": "user_annotation", "name": "my own range", "pid": 4242, "tid": 1, "ts": 320, "dur": 50},
    {"ph": "X", "cat": "user_annotation", "name": "bubble #1", "pid": 4242, "tid": 1, "ts": 400, "dur": 300},
    {"ph": "X", "cat": "user_annotation", "name": "bubble fwd:s1:mb0", "pid": 4242, "tid": 1, "ts": 800, "dur": 100}
  ]})json";
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace(json, "torch.json", ImportOptions{}, &t), pfSuccess)
      << last_error_message();
  EXPECT_EQ(analysable_devices(t.records), std::vector<int>{4242});
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(t.records, 4242, AnalysisOptions{}, &a), pfSuccess)
      << last_error_message();
  EXPECT_TRUE(a.explicit_bubbles);
  ASSERT_EQ(a.bubbles.size(), 3u);
  EXPECT_DOUBLE_EQ(a.bubble_us, 600.0);
  std::vector<std::string> labels;
  for (const auto& c : a.classes) labels.push_back(c.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"#0", "#1", "fwd:s1:mb0"}));
}

TEST(TorchProfilerBubbles, OtherUserAnnotationsStayHostMarkers) {
  const std::string json = R"json([
    {"ph": "X", "cat": "user_annotation", "name": "bubbles are fun", "pid": 7, "tid": 1, "ts": 0, "dur": 10},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 7, "tid": 1, "ts": 0, "dur": 10}
  ])json";
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace(json, "torch.json", ImportOptions{}, &t), pfSuccess);
  EXPECT_TRUE(analysable_devices(t.records).empty());
  ASSERT_EQ(t.records.size(), 2u);
  for (const auto& r : t.records) EXPECT_EQ(r.device, kHostDevice) << r.name;
}

}  // namespace
}  // namespace pipefill::analysis
