#include <gtest/gtest.h>

#include <string>

#include "analysis/chrome_trace.hpp"
#include "common/error.hpp"

namespace pipefill::analysis {
namespace {

constexpr uint64_t kMiB = 1 << 20;

std::string data_file(const char* name) { return std::string(PIPEFILL_TEST_DATA_DIR) + "/" + name; }

TEST(ChromeTraceImport, ReadsAPyTorchProfilerTrace) {
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace_file(data_file("torch_stage_baseline.json"), ImportOptions{}, &t),
            pfSuccess)
      << last_error_message();
  EXPECT_EQ(t.events_total, 47u);
  EXPECT_EQ(t.records.size(), 20u);
  EXPECT_EQ(t.events_skipped, 27u);  // metadata, cpu_op, cuda_runtime, flows, host memory
  EXPECT_EQ(t.devices(), std::vector<int>{0});
  ASSERT_EQ(t.device_memory_bytes.size(), 1u);
  EXPECT_EQ(t.device_memory_bytes.at(0), 150754820096u);  // deviceProperties[0].totalGlobalMem

  const ActivityRecord& host_step = t.records[0];
  EXPECT_EQ(host_step.kind, ActivityKind::Marker);
  EXPECT_EQ(host_step.name, "ProfilerStep#1");
  EXPECT_EQ(host_step.device, kHostDevice);
  EXPECT_DOUBLE_EQ(host_step.start_us, 950);
  EXPECT_DOUBLE_EQ(host_step.end_us, 1850);

  const ActivityRecord& gpu_step = t.records[2];
  EXPECT_EQ(gpu_step.kind, ActivityKind::Marker);
  EXPECT_EQ(gpu_step.device, 0);  // from pid: the event has no "device" arg
  EXPECT_EQ(gpu_step.stream, 7u);
  EXPECT_DOUBLE_EQ(gpu_step.end_us, 2000);

  const ActivityRecord& first_kernel = t.records[4];
  EXPECT_EQ(first_kernel.kind, ActivityKind::Kernel);
  EXPECT_EQ(first_kernel.name, "gemm_fwd");
  EXPECT_EQ(first_kernel.device, 0);
  EXPECT_EQ(first_kernel.stream, 7u);
  EXPECT_EQ(first_kernel.correlation, 100u);
  EXPECT_EQ(first_kernel.grid_blocks, 8);  // grid [4, 2, 1]
  EXPECT_DOUBLE_EQ(first_kernel.start_us, 1000);
  EXPECT_DOUBLE_EQ(first_kernel.end_us, 1100);

  const ActivityRecord& nccl = t.records[12];
  EXPECT_EQ(nccl.kind, ActivityKind::Comm);
  EXPECT_EQ(nccl.stream, 20u);
  EXPECT_EQ(nccl.grid_blocks, 2);
  EXPECT_DOUBLE_EQ(nccl.end_us, 1400);

  const ActivityRecord& copy = t.records[14];
  EXPECT_EQ(copy.kind, ActivityKind::Memcpy);
  EXPECT_EQ(copy.bytes, kMiB);
  EXPECT_DOUBLE_EQ(copy.start_us, 2700);
  EXPECT_DOUBLE_EQ(copy.end_us, 2720);

  const ActivityRecord& alloc = t.records[15];
  EXPECT_EQ(alloc.kind, ActivityKind::MemoryAlloc);
  EXPECT_EQ(alloc.bytes, kMiB);
  EXPECT_EQ(alloc.in_use_bytes, static_cast<int64_t>(10 * kMiB));
  EXPECT_DOUBLE_EQ(alloc.start_us, 1000);
  const ActivityRecord& release = t.records[17];
  EXPECT_EQ(release.kind, ActivityKind::MemoryFree);
  EXPECT_EQ(release.bytes, 2 * kMiB);
  EXPECT_EQ(release.in_use_bytes, static_cast<int64_t>(10 * kMiB));
}

TEST(ChromeTraceImport, FillKernelsAreRecognisedByNameAndStream) {
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace_file(data_file("torch_stage_filled.json"), ImportOptions{}, &t),
            pfSuccess);
  auto kind_of = [&](const std::string& name) {
    for (const ActivityRecord& r : t.records) {
      if (r.name == name) return r.kind;
    }
    ADD_FAILURE() << name << " not imported";
    return ActivityKind::Marker;
  };
  EXPECT_EQ(kind_of("void pipefill::ticket_kernel<InferenceItem>(pfSliceArgs)"), ActivityKind::Fill);
  EXPECT_EQ(kind_of("inference_gemm"), ActivityKind::Kernel);

  ImportOptions options;
  options.fill_streams = {31};
  ASSERT_EQ(import_chrome_trace_file(data_file("torch_stage_filled.json"), options, &t), pfSuccess);
  EXPECT_EQ(kind_of("inference_gemm"), ActivityKind::Fill);
  EXPECT_EQ(kind_of("gemm_fwd"), ActivityKind::Kernel);
}

TEST(ChromeTraceImport, ToleratesMissingAndLooselyTypedFields) {
  // A bare event array; ids as strings; a quoted number; no args; no name; unknown phases.
  const std::string json = R"json([
    {"ph": "X", "cat": "Kernel", "pid": "GPU 2", "tid": "stream 13 13", "ts": "12.5", "dur": 4},
    {"ph": "X", "cat": "kernel", "name": "k", "ts": 20, "dur": 1, "args": {"grid": "bad"}},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 1, "tid": 3, "ts": 30,
     "dur": 2, "args": {"device": 1, "stream": 3, "bytes": 64}},
    {"ph": "B", "name": "begin-end pairs are not read", "ts": 1},
    {"ph": "i", "name": "[memory]", "ts": 40, "args": {"Device Id": 1, "Bytes": 256}},
    {"ph": "i", "name": "[memory]", "ts": 41, "args": {"Device Id": 1}},
    {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#7", "pid": 9, "tid": 9, "ts": 0, "dur": 50},
    {"name": "no phase"},
    {"ph": "X", "cat": "graph, kernel", "name": "replayed", "pid": 0, "tid": 7, "ts": 60, "dur": 5},
    {"ph": "X", "cat": "gpu_memcpy", "name": "odd", "pid": 3.7, "tid": -5, "ts": 70, "dur": 1,
     "args": {"bytes": "12", "correlation": -3}}
  ])json";
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace(json, "inline.json", ImportOptions{}, &t), pfSuccess)
      << last_error_message();
  EXPECT_EQ(t.events_total, 10u);
  ASSERT_EQ(t.records.size(), 7u);
  EXPECT_EQ(t.events_skipped, 3u);
  EXPECT_EQ(t.records[0].kind, ActivityKind::Kernel);
  EXPECT_EQ(t.records[0].name, "");
  EXPECT_EQ(t.records[0].device, 2);
  EXPECT_EQ(t.records[0].stream, 13u);
  EXPECT_DOUBLE_EQ(t.records[0].start_us, 12.5);
  EXPECT_DOUBLE_EQ(t.records[0].end_us, 16.5);
  EXPECT_EQ(t.records[1].device, 0);
  EXPECT_EQ(t.records[1].grid_blocks, 0);
  EXPECT_EQ(t.records[2].kind, ActivityKind::Memset);
  EXPECT_EQ(t.records[2].device, 1);
  EXPECT_EQ(t.records[2].bytes, 64u);
  EXPECT_EQ(t.records[3].kind, ActivityKind::MemoryAlloc);
  EXPECT_EQ(t.records[3].device, 1);
  EXPECT_EQ(t.records[3].in_use_bytes, -1);
  EXPECT_EQ(t.records[4].kind, ActivityKind::Marker);  // by its ProfilerStep name
  EXPECT_EQ(t.records[4].device, kHostDevice);
  EXPECT_EQ(t.records[5].kind, ActivityKind::Kernel);  // one of several categories
  EXPECT_EQ(t.records[5].name, "replayed");
  // Fractional ids truncate, negative stream and correlation ids read as 0, quoted sizes count.
  EXPECT_EQ(t.records[6].device, 3);
  EXPECT_EQ(t.records[6].stream, 0u);
  EXPECT_EQ(t.records[6].correlation, 0u);
  EXPECT_EQ(t.records[6].bytes, 12u);
  EXPECT_EQ(t.devices(), (std::vector<int>{0, 1, 2, 3}));
  // The host marker keeps its process id.
  EXPECT_EQ(t.records[4].process, 9);
  EXPECT_TRUE(t.device_memory_bytes.empty());
}

struct BadTrace {
  const char* json;
  const char* expected_fragment;
};

class ChromeTraceErrors : public ::testing::TestWithParam<BadTrace> {};

TEST_P(ChromeTraceErrors, NameTheFileAndTheEvent) {
  ImportedTrace t;
  EXPECT_EQ(import_chrome_trace(GetParam().json, "bad.json", ImportOptions{}, &t),
            pfErrorInvalidArgument);
  const std::string& message = last_error_message();
  EXPECT_EQ(message.rfind("bad.json: ", 0), 0u) << message;
  EXPECT_NE(message.find(GetParam().expected_fragment), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    Importer, ChromeTraceErrors,
    ::testing::Values(
        BadTrace{R"({"traceEvents": [)", "not valid JSON at byte"},
        BadTrace{"42", "the trace has JSON type number"},
        BadTrace{R"({"displayTimeUnit": "ms"})", "no \"traceEvents\""},
        BadTrace{R"({"traceEvents": {"ph": "X"}})", "\"traceEvents\" has JSON type object"},
        BadTrace{R"({"traceEvents": [{"ph": "M"}, 7]})", "traceEvents[1] has JSON type number"},
        BadTrace{R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 5}]})",
                 "traceEvents[0] ('gemm'): \"dur\" is missing"},
        BadTrace{R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "g", "ts": 5, "dur": -1}]})",
                 "traceEvents[0] ('g'): \"dur\" -1 is negative"},
        // Values beyond what the analysis can hold: errors naming the event and the value.
        BadTrace{R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 1e300, "ts": 5, "dur": 1}]})",
                 "traceEvents[0] ('k'): device id 1e+300 (from pid) is outside [0, 2147483647]"},
        BadTrace{R"({"traceEvents": [{"ph": "M"}, {"ph": "X", "cat": "kernel", "name": "k", "ts": 9.2e18, "dur": 10}]})",
                 "traceEvents[1] ('k'): \"ts\" 9.2e+18 us is beyond 2^52 us"},
        BadTrace{R"({"traceEvents": [{"ph": "i", "name": "[memory]", "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 9e18}}]})",
                 "traceEvents[0] ([memory]): \"Bytes\" 9e+18 is outside [-2^53, 2^53]"},
        BadTrace{R"({"traceEvents": [{"ph": "i", "name": "[memory]", "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Bytes": -9e18}}]})",
                 "\"Bytes\" -9e+18 is outside [-2^53, 2^53]"},
        BadTrace{R"({"traceEvents": [{"ph": "X", "cat": "gpu_memcpy", "name": "c", "ts": 1, "dur": 1, "args": {"bytes": 1e300}}]})",
                 "traceEvents[0] ('c'): \"bytes\" 1e+300 is outside [0, 2^53]"},
        // nlohmann-json cannot hold 1e400 at all: a clear error, not "internal error".
        BadTrace{R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1e400, "dur": 1}]})",
                 "1e400"},
        BadTrace{R"({"traceEvents": [{"ph":"M"},{"ph":"M"},{"ph": "X", "cat": "kernel", "name": "g", "ts": "soon", "dur": 1}]})",
                 "traceEvents[2] ('g'): \"ts\""},
        BadTrace{R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": 5, "ts": 1, "dur": 1}]})",
                 "\"name\" has JSON type number"},
        BadTrace{R"({"traceEvents": [{"ph": "i", "name": "[memory]", "args": {"Device Type": 1, "Bytes": 8}}]})",
                 "traceEvents[0] ([memory]): \"ts\""}));

TEST(ChromeTraceImport, CommunicationKernelPatternsAreConfigurable) {
  const std::string json = R"json([
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "pid": 0, "ts": 0, "dur": 5},
    {"ph": "X", "cat": "kernel", "name": "void nvshmemi_transfer_kernel<float>()", "pid": 0, "ts": 10, "dur": 5},
    {"ph": "X", "cat": "kernel", "name": "userbuffers_fp16_sum_inplace_gpu_rr_rs", "pid": 0, "ts": 20, "dur": 5},
    {"ph": "X", "cat": "kernel", "name": "kuserbuffers_pullrecv", "pid": 0, "ts": 30, "dur": 5},
    {"ph": "X", "cat": "kernel", "name": "my_allgather_kernel", "pid": 0, "ts": 40, "dur": 5},
    {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "ts": 50, "dur": 5}
  ])json";
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace(json, "comm.json", ImportOptions{}, &t), pfSuccess);
  const ActivityKind defaults[] = {ActivityKind::Comm, ActivityKind::Comm, ActivityKind::Comm,
                                   ActivityKind::Comm, ActivityKind::Kernel, ActivityKind::Kernel};
  ASSERT_EQ(t.records.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(t.records[i].kind, defaults[i]) << t.records[i].name;

  ImportOptions custom;
  custom.comm_name_patterns = {"ALLGATHER"};  // replaces the defaults; any case
  ASSERT_EQ(import_chrome_trace(json, "comm.json", custom, &t), pfSuccess);
  const ActivityKind only_custom[] = {ActivityKind::Kernel, ActivityKind::Kernel,
                                      ActivityKind::Kernel, ActivityKind::Kernel,
                                      ActivityKind::Comm,   ActivityKind::Kernel};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(t.records[i].kind, only_custom[i]) << t.records[i].name;
}

TEST(ChromeTraceImport, KernelsKnowTheProcessThatLaunchedThem) {
  // Correlation ids tie a kernel to the cuda_runtime launch on its host process.
  const std::string json = R"json({"traceEvents": [
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 77, "tid": 77, "ts": 0, "dur": 2, "args": {"correlation": 5}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 88, "tid": 88, "ts": 0, "dur": 2, "args": {"correlation": 6}},
    {"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "ts": 3, "dur": 1, "args": {"device": 0, "correlation": 5}},
    {"ph": "X", "cat": "kernel", "name": "b", "pid": 1, "ts": 3, "dur": 1, "args": {"device": 1, "correlation": 6}},
    {"ph": "X", "cat": "kernel", "name": "c", "pid": 1, "ts": 5, "dur": 1, "args": {"device": 1, "correlation": 9}}
  ]})json";
  ImportedTrace t;
  ASSERT_EQ(import_chrome_trace(json, "launch.json", ImportOptions{}, &t), pfSuccess);
  ASSERT_EQ(t.records.size(), 3u);  // runtime events leave no record
  EXPECT_EQ(t.events_skipped, 2u);
  EXPECT_EQ(t.records[0].process, 77);
  EXPECT_EQ(t.records[1].process, 88);
  EXPECT_EQ(t.records[2].process, -1);  // no launch with that id
}

TEST(ChromeTraceImport, MissingFileIsAnIoError) {
  ImportedTrace t;
  EXPECT_EQ(import_chrome_trace_file(data_file("no_such_trace.json"), ImportOptions{}, &t),
            pfErrorIo);
  EXPECT_NE(last_error_message().find("no_such_trace.json"), std::string::npos);
  EXPECT_EQ(import_chrome_trace("[]", "x", ImportOptions{}, static_cast<ImportedTrace*>(nullptr)),
            pfErrorInvalidArgument);
}

}  // namespace
}  // namespace pipefill::analysis
