// The whole path a user takes: PyTorch-like trace files -> importer -> analyser -> report.
// Expected values are worked out from tests/data/make_torch_traces.py.
#include <gtest/gtest.h>

#include <cmath>

#include "analysis/chrome_trace.hpp"
#include "analysis/report.hpp"
#include "common/error.hpp"

namespace pipefill::analysis {
namespace {

constexpr int64_t kMiB = 1 << 20;

std::string data_file(const char* name) { return std::string(PIPEFILL_TEST_DATA_DIR) + "/" + name; }

ImportedTrace load(const char* name, const ImportOptions& options = {}) {
  ImportedTrace t;
  EXPECT_EQ(import_chrome_trace_file(data_file(name), options, &t), pfSuccess)
      << last_error_message();
  return t;
}

TEST(AnalyzerOnFiles, BaselineStageBubblesIterationsAndMemory) {
  const ImportedTrace t = load("torch_stage_baseline.json");
  AnalysisOptions o;
  o.device_memory_bytes = 16 * kMiB;
  o.item_cost_us = 50;
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(t.records, 0, o, &a), pfSuccess) << last_error_message();

  EXPECT_EQ(a.compute_kernels, 8u);
  EXPECT_EQ(a.comm_kernels, 2u);
  EXPECT_DOUBLE_EQ(a.span_us(), 2000);
  EXPECT_DOUBLE_EQ(a.compute_busy_us, 845);
  ASSERT_EQ(a.bubbles.size(), 5u);
  const double starts[] = {1100, 1600, 1950, 2110, 2660};
  const double ends[] = {1405, 1800, 2010, 2460, 2900};
  // [2660,2900) holds a 20 us copy: mostly idle, so labelled idle.
  const BubbleKind kinds[] = {BubbleKind::CommOnly, BubbleKind::Idle, BubbleKind::Idle,
                              BubbleKind::CommOnly, BubbleKind::Idle};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_DOUBLE_EQ(a.bubbles[i].start_us, starts[i]) << i;
    EXPECT_DOUBLE_EQ(a.bubbles[i].end_us, ends[i]) << i;
    EXPECT_EQ(a.bubbles[i].kind, kinds[i]) << i;
  }
  EXPECT_DOUBLE_EQ(a.bubbles[0].comm_us, 300);
  EXPECT_DOUBLE_EQ(a.bubbles[3].comm_us, 340);
  EXPECT_DOUBLE_EQ(a.bubbles[4].copy_us, 20);
  EXPECT_DOUBLE_EQ(a.bubbles[4].idle_us, 220);
  EXPECT_DOUBLE_EQ(a.bubble_us, 1155);
  EXPECT_DOUBLE_EQ(a.bubble_share, 1155.0 / 2000.0);
  // Time split: comm-only 300 + 340; copy 20; idle 5 + 200 + 60 + 10 + 220.
  EXPECT_DOUBLE_EQ(a.comm_only_bubble_us, 640);
  EXPECT_DOUBLE_EQ(a.idle_bubble_us, 495);
  EXPECT_DOUBLE_EQ(a.copy_bubble_us, 20);
  // Start delays of the comm-only bubbles: 1405-1400 and 2460-2450; the idle one has none.
  EXPECT_EQ(a.start_delay.count, 2u);
  EXPECT_DOUBLE_EQ(a.start_delay.min, 5);
  EXPECT_DOUBLE_EQ(a.start_delay.max, 10);

  // GPU-side ProfilerStep markers win over the host ones (they cover their steps' kernels).
  EXPECT_EQ(a.iteration_source, IterationSource::Markers);
  EXPECT_FALSE(a.host_markers);
  ASSERT_EQ(a.iterations.size(), 2u);
  EXPECT_EQ(a.iterations[0].label, "ProfilerStep#1");
  EXPECT_DOUBLE_EQ(a.iterations[0].start_us, 1000);
  EXPECT_DOUBLE_EQ(a.iterations[1].end_us, 3000);
  EXPECT_EQ(a.iterations[0].bubble_count, 3);
  EXPECT_EQ(a.iterations[1].bubble_count, 2);
  EXPECT_DOUBLE_EQ(a.mean_iteration_us, 1000);
  EXPECT_DOUBLE_EQ(a.bubble_us_per_iteration, 577.5);

  ASSERT_EQ(a.classes.size(), 3u);
  EXPECT_EQ(a.classes[0].duration.count, 2u);
  EXPECT_DOUBLE_EQ(a.classes[0].duration.mean, 327.5);
  EXPECT_EQ(a.classes[0].comm_only, 2u);
  EXPECT_EQ(a.classes[1].idle, 2u);
  EXPECT_EQ(a.classes[1].copy, 0u);
  EXPECT_DOUBLE_EQ(a.classes[1].idle_us, 200 + 220);
  EXPECT_DOUBLE_EQ(a.classes[1].copy_us, 20);
  EXPECT_DOUBLE_EQ(a.classes[2].occurrence, 0.5);

  // Memory: 10 MiB in use, 12 MiB during bubble 0, 14 MiB from 2200 to 2700.
  EXPECT_TRUE(a.memory_absolute);
  EXPECT_EQ(a.memory_peak_bytes, 14 * kMiB);
  EXPECT_EQ(a.bubbles[0].memory.min_bytes, 10 * kMiB);
  EXPECT_EQ(a.bubbles[0].memory.max_bytes, 12 * kMiB);
  EXPECT_EQ(a.bubbles[4].memory.min_bytes, 10 * kMiB);
  EXPECT_EQ(a.bubbles[4].memory.max_bytes, 14 * kMiB);
  EXPECT_EQ(a.classes[0].free_bytes, 2 * kMiB);
  EXPECT_EQ(a.classes[2].free_bytes, 6 * kMiB);

  // Usable: 305*0.95-20, 200*0.95-20, 60*0.95-20 (class 2 in half the iterations).
  EXPECT_DOUBLE_EQ(a.classes[0].usable_us, 269.75);
  EXPECT_DOUBLE_EQ(a.classes[1].usable_us, 170);
  EXPECT_DOUBLE_EQ(a.classes[2].usable_us, 37);
  EXPECT_DOUBLE_EQ(a.fill.fillable_us_per_iteration, 269.75 + 170 + 0.5 * 37);
  EXPECT_DOUBLE_EQ(a.fill.items_per_iteration, 5 + 3 + 0);
  EXPECT_DOUBLE_EQ(a.fill.items_per_second, 8000);
  EXPECT_DOUBLE_EQ(a.fill.dedicated_gpu_share, 0.4);
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("2 to 3 bubbles"), std::string::npos) << a.notes[0];
}

TEST(AnalyzerOnFiles, FilledStageNeedsItsFillStreamNamed) {
  const ImportedTrace plain = load("torch_stage_filled.json");
  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(plain.records, 0, AnalysisOptions{}, &a), pfSuccess);
  // The other job's kernel on stream 31 looks like the main job's and splits a bubble into
  // two gaps below 50 us.
  EXPECT_EQ(a.compute_kernels, 9u);
  EXPECT_EQ(a.bubbles.size(), 4u);

  ImportOptions options;
  options.fill_streams = {31};
  const ImportedTrace filled = load("torch_stage_filled.json", options);
  ASSERT_EQ(analyze_device(filled.records, 0, AnalysisOptions{}, &a), pfSuccess);
  EXPECT_EQ(a.compute_kernels, 8u);
  EXPECT_EQ(a.fill_kernels, 2u);
  ASSERT_EQ(a.bubbles.size(), 5u);
  EXPECT_DOUBLE_EQ(a.bubbles[0].fill_us, 280);
  EXPECT_DOUBLE_EQ(a.bubbles[1].fill_us, 170);
  EXPECT_DOUBLE_EQ(a.fill_in_bubbles_us, 450);
}

TEST(AnalyzerOnFiles, ReportComparesFilledWithBaseline) {
  ImportOptions options;
  options.fill_streams = {31};
  const ImportedTrace baseline = load("torch_stage_baseline.json", options);
  const ImportedTrace filled = load("torch_stage_filled.json", options);
  AnalysisOptions o;
  TraceReport report;
  ASSERT_EQ(build_report("filled.json", filled.records, "baseline.json", &baseline.records,
                         devices_with_compute(filled.records), o, &report,
                         filled.device_memory_bytes),
            pfSuccess)
      << last_error_message();
  ASSERT_EQ(report.interference.size(), 1u);
  const InterferenceAnalysis& i = report.interference[0];
  EXPECT_EQ(i.baseline_kernels, 10u);
  EXPECT_EQ(i.filled_kernels, 10u);
  EXPECT_EQ(i.matched_kernels, 10u);
  EXPECT_DOUBLE_EQ(i.compute_baseline_us, 845);
  EXPECT_DOUBLE_EQ(i.compute_filled_us, 850);
  EXPECT_DOUBLE_EQ(i.comm_baseline_us, 660);
  EXPECT_DOUBLE_EQ(i.comm_filled_us, 660);
  EXPECT_DOUBLE_EQ(i.baseline_start_delay.min, 5);
  EXPECT_DOUBLE_EQ(i.filled_start_delay.min, 10);
  EXPECT_DOUBLE_EQ(i.iteration_slowdown, 1.0);
  ASSERT_FALSE(i.kernels.empty());
  EXPECT_EQ(i.kernels[0].name, "gemm_fwd");
  EXPECT_DOUBLE_EQ(i.kernels[0].baseline_us, 395);
  EXPECT_DOUBLE_EQ(i.kernels[0].filled_us, 400);

  const std::string text = format_report(report);
  EXPECT_NE(text.find("Trace filled.json (22 records)"), std::string::npos) << text;
  EXPECT_NE(text.find("bubbles >= 50 us: 5, 1.150 ms = 57.5% of the span"), std::string::npos)
      << text;
  EXPECT_NE(text.find("fill kernels cover 0.450 ms = 39.1% of the bubbles"), std::string::npos)
      << text;
  EXPECT_NE(text.find("Interference on device 0"), std::string::npos) << text;
  EXPECT_NE(text.find("compute: 0.845 ms -> 0.850 ms, slowdown +0.59%"), std::string::npos) << text;
  EXPECT_NE(text.find("+1.27%  gemm_fwd"), std::string::npos) << text;
  EXPECT_EQ(text.find("iteration  "), std::string::npos) << "no bubble list unless asked";
  const std::string listed = format_report(report, 32, 10, 2);
  // Bubble 0 of the filled trace: [1100,1410), 300 us of receive (97%), 10 us idle (3%).
  EXPECT_NE(listed.find("  ProfilerStep#1           #0        0.100      0.100      310.0 comm-only       3%    97%     0%     280.0      10.0"),
            std::string::npos)
      << listed;
  EXPECT_NE(listed.find("  ... 3 more bubbles"), std::string::npos) << listed;
  EXPECT_NE(text.find("memory in use: peak 14.0 MiB (absolute); device memory 140.40 GiB"),
            std::string::npos)
      << text;

  const nlohmann::json j = report_to_json(report);
  EXPECT_EQ(j["source"], "filled.json");
  EXPECT_EQ(j["baseline_source"], "baseline.json");
  ASSERT_EQ(j["devices"].size(), 1u);
  EXPECT_EQ(j["devices"][0]["bubbles"].size(), 5u);
  EXPECT_EQ(j["devices"][0]["bubbles"][1]["kind"], "idle");
  EXPECT_TRUE(j["devices"][0]["bubbles"][1]["wake_us"].is_null());
  EXPECT_DOUBLE_EQ(j["devices"][0]["bubbles"][0]["wake_us"].get<double>(), 1400);
  EXPECT_DOUBLE_EQ(j["devices"][0]["classes"][0]["duration_us"]["mean"].get<double>(), 330);
  EXPECT_EQ(j["devices"][0]["iteration_source"], "markers");
  EXPECT_EQ(j["devices"][0]["device_memory_bytes"], 150754820096u);
  // The H200's memory from deviceProperties: free = total - 14 MiB at peak.
  EXPECT_EQ(j["devices"][0]["classes"][0]["free_bytes"], 150754820096 - 14 * kMiB);
  EXPECT_DOUBLE_EQ(j["interference"][0]["compute_slowdown"].get<double>(), 850.0 / 845.0);
  EXPECT_EQ(j["interference"][0]["kernels"][0]["name"], "gemm_fwd");
}

TEST(AnalyzerOnFiles, ReportNeedsADeviceWithKernels) {
  const ImportedTrace t = load("torch_stage_baseline.json");
  TraceReport report;
  EXPECT_EQ(build_report("x.json", t.records, "", nullptr, {}, AnalysisOptions{}, &report),
            pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("x.json"), std::string::npos);
  EXPECT_EQ(build_report("x.json", t.records, "", nullptr, {4}, AnalysisOptions{}, &report),
            pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("device 4"), std::string::npos);
}

}  // namespace
}  // namespace pipefill::analysis

namespace pipefill::analysis {
namespace {

// What pfTraceWrite writes (src/core/runtime.cpp): bubbles (cat "bubble", name "bubble <class
// key>") and fill slices (cat "fill") of stage 2; no main-job kernels.
constexpr const char* kPipeFillTrace = R"json({"traceEvents":[
{"name":"process_name","ph":"M","pid":2,"tid":0,"args":{"name":"PipeFill stage 2"}},
{"name":"bubble #0","cat":"bubble","ph":"X","pid":2,"tid":1,"ts":100.000,"dur":200.000,"args":{"id":1,"iteration":0,"kind":"warmup","predicted_us":0.000,"slices":1}},
{"name":"predicted bubble us","ph":"C","pid":2,"tid":1,"ts":100.000,"args":{"#0":200.000}},
{"name":"bubble opt","cat":"bubble","ph":"X","pid":2,"tid":1,"ts":500.000,"dur":100.000,"args":{"id":2,"iteration":0,"kind":"optimizer","predicted_us":0.000,"slices":1}},
{"name":"bubble #0","cat":"bubble","ph":"X","pid":2,"tid":1,"ts":1100.000,"dur":300.000,"args":{"id":3,"iteration":1,"kind":"warmup","predicted_us":200.000,"slices":1}},
{"name":"infer","cat":"fill","ph":"X","pid":2,"tid":2,"ts":110.000,"dur":180.000,"args":{"bubble":1,"items":18,"config":0}},
{"name":"infer","cat":"fill","ph":"X","pid":2,"tid":2,"ts":1100.000,"dur":310.000,"args":{"bubble":3,"items":31,"config":0}}
],"displayTimeUnit":"ms","otherData":{"truncated":false}})json";

TEST(AnalyzerOnPipeFillTrace, BubbleMarkersAreTheBubblesAndClassKeysTheClasses) {
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace(kPipeFillTrace, "pf.json", ImportOptions{}, &t), pfSuccess)
      << last_error_message();
  EXPECT_EQ(t.records.size(), 5u);  // 3 bubbles + 2 slices; metadata and counter skipped
  EXPECT_TRUE(devices_with_compute(t.records).empty());
  EXPECT_EQ(analysable_devices(t.records), std::vector<int>{2});

  DeviceAnalysis a;
  ASSERT_EQ(analyze_device(t.records, 2, AnalysisOptions{}, &a), pfSuccess) << last_error_message();
  EXPECT_TRUE(a.explicit_bubbles);
  ASSERT_EQ(a.bubbles.size(), 3u);  // no minimum gap: these are measured bubbles
  EXPECT_DOUBLE_EQ(a.span_start_us, 100);
  EXPECT_DOUBLE_EQ(a.span_end_us, 1400);
  EXPECT_DOUBLE_EQ(a.bubble_us, 600);
  EXPECT_DOUBLE_EQ(a.fill_in_bubbles_us, 180 + 300);
  EXPECT_DOUBLE_EQ(a.fill_busy_us, 490);
  EXPECT_DOUBLE_EQ(a.fill_outside_bubbles_us, 10);  // the second slice's overrun
  ASSERT_EQ(a.classes.size(), 2u);
  EXPECT_EQ(a.classes[0].label, "#0");
  EXPECT_EQ(a.classes[0].duration.count, 2u);
  EXPECT_DOUBLE_EQ(a.classes[0].duration.mean, 250);
  EXPECT_DOUBLE_EQ(a.classes[0].fill_us, 480);
  EXPECT_EQ(a.classes[1].label, "opt");
  EXPECT_DOUBLE_EQ(a.classes[1].fill_us, 0);
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("PipeFill's bubble markers"), std::string::npos) << a.notes[0];

  // With a period the classes stay keyed by name.
  AnalysisOptions o;
  o.iteration_period_us = 1000;
  ASSERT_EQ(analyze_device(t.records, 2, o, &a), pfSuccess);
  ASSERT_EQ(a.iterations.size(), 2u);
  EXPECT_EQ(a.classes.size(), 2u);
  EXPECT_DOUBLE_EQ(a.classes[0].occurrence, 1.0);
  EXPECT_DOUBLE_EQ(a.classes[1].occurrence, 0.5);
  EXPECT_DOUBLE_EQ(a.bubbles[2].offset_us, 0);  // iteration 1 starts at 1100

  TraceReport report;
  ASSERT_EQ(build_report("pf.json", t.records, "", nullptr, analysable_devices(t.records),
                         AnalysisOptions{}, &report),
            pfSuccess);
  const std::string text = format_report(report);
  EXPECT_NE(text.find("fill kernels cover 0.480 ms = 80.0% of the bubbles; 0.010 ms of fill ran "
                      "outside bubbles"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("      #0      2 idle"), std::string::npos) << text;
}

}  // namespace
}  // namespace pipefill::analysis
