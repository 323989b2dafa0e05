// pipefill.Runtime's torch.profiler ranges (user_annotation events named "bubble <class key>",
// python/pipefill/_profiler.py) are bubble markers: a CPU-only torch trace of a stage that marks
// bubbles through the Python package is analysed in explicit-bubble mode, with the process id as
// the device. Other user annotations stay host markers. (tests/python/test_experience.py runs
// pipefill-analyze on a trace the real torch.profiler wrote.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "analysis/activity.hpp"
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

// The host backend's fill slices in a torch trace ("fill slice <job>" ranges on the fill stream
// threads of the same process, python/pipefill/_profiler.py) are fill activity of that process:
// measured against its bubble ranges, an overrun past a bubble's end counted outside.
TEST(TorchProfilerBubbles, FillSliceRangesAreFillActivityOfTheProcess) {
  const std::string json = R"json({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "bubble #0", "pid": 4242, "tid": 1, "ts": 100, "dur": 200},
    {"ph": "X", "cat": "user_annotation", "name": "fill slice mlp", "pid": 4242, "tid": 9, "ts": 120, "dur": 150},
    {"ph": "X", "cat": "user_annotation", "name": "bubble #1", "pid": 4242, "tid": 1, "ts": 400, "dur": 300},
    {"ph": "X", "cat": "user_annotation", "name": "fill slice mlp", "pid": 4242, "tid": 9, "ts": 410, "dur": 320},
    {"ph": "X", "cat": "user_annotation", "name": "fill slice other", "pid": 4242, "tid": 10, "ts": 500, "dur": 100},
    {"ph": "X", "cat": "user_annotation", "name": "filler range of the user", "pid": 4242, "tid": 1, "ts": 800, "dur": 50}
  ]})json";
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace(json, "torch.json", ImportOptions{}, &t), pfSuccess)
      << last_error_message();
  size_t fills = 0;
  for (const auto& r : t.records) {
    if (r.kind == ActivityKind::Fill) {
      ++fills;
      EXPECT_EQ(r.device, 4242) << r.name;
    }
  }
  EXPECT_EQ(fills, 3u);
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(t.records, 4242, AnalysisOptions{}, &a), pfSuccess)
      << last_error_message();
  EXPECT_TRUE(a.explicit_bubbles);
  ASSERT_EQ(a.bubbles.size(), 2u);
  EXPECT_EQ(a.fill_kernels, 3u);
  EXPECT_DOUBLE_EQ(a.bubbles[0].fill_us, 150.0);
  EXPECT_DOUBLE_EQ(a.bubbles[1].fill_us, 290.0);  // 410..700 (the union with 500..600)
  EXPECT_DOUBLE_EQ(a.fill_in_bubbles_us, 440.0);
  EXPECT_DOUBLE_EQ(a.fill_outside_bubbles_us, 30.0);  // 700..730: the overrun
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
