// CPU-side tests of the CUDA backend: they run on machines without a GPU (and without libcuda).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <memory>
#include <string>

#include "common/error.hpp"
#include "core/config.hpp"
#include "cuda_check.hpp"
#include "cublas_api.hpp"
#include "cupti_api.hpp"
#include "cupti_collector.hpp"
#include "device/device.hpp"
#include "driver_api.hpp"
#include "event_query.hpp"
#include "fallbacks.hpp"
#include "fill_kernels.hpp"
#include "opaque_gemm.hpp"
#include "partition.hpp"

namespace pipefill::cuda {
namespace {

cudaError_t returns(cudaError_t error) { return error; }

pfResult_t checked_call(cudaError_t error, int* line) {
  *line = __LINE__ + 1;
  PF_CUDA_CHECK(returns(error));
  return pfSuccess;
}

TEST(CudaCheck, FailureNamesCallFileLineAndError) {
  int line = 0;
  EXPECT_EQ(checked_call(cudaErrorMemoryAllocation, &line), pfErrorCudaFailure);
  EXPECT_EQ(last_error_message(),
            "returns(error) failed at tests/cuda/cpu_side_test.cpp:" + std::to_string(line) +
                ": cudaErrorMemoryAllocation (out of memory)");
}

TEST(CudaCheck, SuccessLeavesNoMessage) {
  clear_last_error();
  int line = 0;
  EXPECT_EQ(checked_call(cudaSuccess, &line), pfSuccess);
  EXPECT_EQ(last_error_message(), "");
}

TEST(CudaCheck, ShortFileNameKeepsProjectRelativePath) {
  const std::string root = PIPEFILL_SOURCE_DIR;
  EXPECT_STREQ(short_file_name((root + "/cuda/cuda_device.cpp").c_str()), "cuda/cuda_device.cpp");
  EXPECT_STREQ(short_file_name((root + "/tests/cuda/t.cpp").c_str()), "tests/cuda/t.cpp");
  EXPECT_STREQ(short_file_name("plain.cpp"), "plain.cpp");
  EXPECT_STREQ(short_file_name("/opt/other/file.cpp"), "file.cpp");
}

TEST(CudaCheck, CuptiFailureUsesCuptiName) {
  // CUPTI loads without a driver; it is loaded by the first collector, here by hand.
  const CuptiApi& api = cupti_api();
  if (!api.ok) GTEST_SKIP() << api.error;
  EXPECT_EQ(cupti_failure(1, "cuptiX()", "/s/cuda/c.cpp", 7), pfErrorCuptiFailure);
  EXPECT_EQ(last_error_message(), "cuptiX() failed at c.cpp:7: CUPTI_ERROR_INVALID_PARAMETER (1)");
}

TEST(CudaCheck, DriverFailureNamesResult) {
  EXPECT_EQ(driver_failure(2, "cuY()", "/s/cuda/d.cpp", 9), pfErrorCudaFailure);
  // Without a driver there is no cuGetErrorName to ask, so only the number is given.
  const std::string expected_name = driver_api().get_error_name ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUresult";
  EXPECT_EQ(last_error_message(), "cuY() failed at d.cpp:9: " + expected_name + " (2)");
}

TEST(CudaCheck, NcclFailureIsNcclCode) {
  EXPECT_EQ(nccl_failure(4, "ncclZ()", "/s/cuda/n.cpp", 3), pfErrorNcclFailure);
  EXPECT_EQ(last_error_message().rfind("ncclZ() failed at n.cpp:3: ", 0), 0u) << last_error_message();
  EXPECT_NE(last_error_message().find("(4)"), std::string::npos);
  // Named without NCCL in the process (the library neither links nor loads it).
  if (dlsym(RTLD_DEFAULT, "ncclGetErrorString") == nullptr)
    EXPECT_STREQ(nccl_result_name(4), "ncclInvalidArgument");
}

// ---- R from NCCL's environment ----------------------------------------------------------------

EnvLookup fake_env(std::map<std::string, std::string> values) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(values));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

TEST(ReservedSms, DefaultWithoutNcclSettings) {
  int reserved = -1;
  std::string source;
  ASSERT_EQ(reserved_sms_from_nccl_env(fake_env({}), &reserved, &source), pfSuccess);
  EXPECT_EQ(reserved, 16);
  EXPECT_EQ(source, "default");
}

TEST(ReservedSms, MaxCtasWinsOverMaxChannels) {
  int reserved = -1;
  std::string source;
  ASSERT_EQ(reserved_sms_from_nccl_env(fake_env({{"NCCL_MAX_CTAS", "8"}, {"NCCL_MAX_NCHANNELS", "24"}}),
                                       &reserved, &source),
            pfSuccess);
  EXPECT_EQ(reserved, 8);
  EXPECT_EQ(source, "NCCL_MAX_CTAS");
}

TEST(ReservedSms, MaxChannelsWhenOnlyItIsSet) {
  int reserved = -1;
  std::string source;
  ASSERT_EQ(reserved_sms_from_nccl_env(fake_env({{"NCCL_MAX_NCHANNELS", "24"}}), &reserved, &source), pfSuccess);
  EXPECT_EQ(reserved, 24);
  EXPECT_EQ(source, "NCCL_MAX_NCHANNELS");
}

TEST(ReservedSms, EmptyValueCountsAsUnset) {
  int reserved = -1;
  ASSERT_EQ(reserved_sms_from_nccl_env(fake_env({{"NCCL_MAX_CTAS", ""}, {"NCCL_MAX_NCHANNELS", "4"}}),
                                       &reserved, nullptr),
            pfSuccess);
  EXPECT_EQ(reserved, 4);
}

TEST(ReservedSms, MalformedValuesAreRejectedWithTheirName) {
  for (const char* bad : {"abc", "0", "-3", "8x", " 8"}) {
    int reserved = 123;
    EXPECT_EQ(reserved_sms_from_nccl_env(fake_env({{"NCCL_MAX_CTAS", bad}}), &reserved, nullptr),
              pfErrorInvalidArgument)
        << bad;
    EXPECT_EQ(last_error_message(), std::string("NCCL_MAX_CTAS='") + bad + "' is not a positive integer");
    EXPECT_EQ(reserved, 123);
  }
}

TEST(ReservedSms, NullOutputIsInvalid) {
  EXPECT_EQ(reserved_sms_from_nccl_env(fake_env({}), nullptr, nullptr), pfErrorInvalidArgument);
}

// ---- Partition rounding -------------------------------------------------------------------------

TEST(Partition, RoundsReservationUpToAlignment) {
  // H100/H200-like: 132 SMs; an 8-SM alignment turns R=16 into 20 reserved (112 fill SMs).
  EXPECT_EQ(plan_fill_sms(132, 16, {8, 8}), 112);
  EXPECT_EQ(plan_fill_sms(132, 16, {2, 2}), 116);
  EXPECT_EQ(plan_fill_sms(132, 17, {2, 2}), 114);
  EXPECT_EQ(plan_fill_sms(132, 0, {8, 8}), 128);
  EXPECT_EQ(plan_fill_sms(132, 124, {8, 8}), 8);
}

TEST(Partition, NoPartitionBelowTheMinimum) {
  EXPECT_EQ(plan_fill_sms(132, 130, {8, 8}), 0);
  EXPECT_EQ(plan_fill_sms(132, 127, {8, 4}), 0);  // 5 -> 4 aligned, below minimum 8
  EXPECT_EQ(plan_fill_sms(132, 132, {1, 1}), 0);
  EXPECT_EQ(plan_fill_sms(132, 140, {1, 1}), 0);
}

TEST(Partition, ZeroGranularityMeansOne) {
  EXPECT_EQ(plan_fill_sms(132, 16, {0, 0}), 116);
}

TEST(Partition, ReservedRangeIsChecked) {
  EXPECT_EQ(check_reserved_sms(0, 132), pfSuccess);
  EXPECT_EQ(check_reserved_sms(131, 132), pfSuccess);
  EXPECT_EQ(check_reserved_sms(132, 132), pfErrorInvalidArgument);
  EXPECT_EQ(last_error_message(), "reserved_sms=132 is out of range: the device has 132 SMs (need 0 <= R < 132)");
  EXPECT_EQ(check_reserved_sms(-1, 132), pfErrorInvalidArgument);
}

// ---- Behaviour without a GPU ------------------------------------------------------------------

bool has_gpu() { return cuda_device_count() > 0; }

TEST(NoGpu, DeviceCountAgreesWithRuntime) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  EXPECT_EQ(cuda_device_count(), error == cudaSuccess ? count : 0);
}

TEST(NoGpu, MakeCudaDeviceReportsNoDevice) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present";
  std::unique_ptr<Device> device;
  EXPECT_EQ(make_cuda_device(RuntimeOptions{}, &device), pfErrorNoDevice);
  EXPECT_EQ(device, nullptr);
  EXPECT_EQ(last_error_message().rfind("no usable CUDA device: ", 0), 0u) << last_error_message();
}

TEST(NoGpu, MakeCudaDeviceRejectsNullOutput) {
  EXPECT_EQ(make_cuda_device(RuntimeOptions{}, nullptr), pfErrorInvalidArgument);
}

TEST(NoGpu, CuptiCollectorFailsGracefully) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present (the GPU tests cover the collector)";
  std::unique_ptr<ActivityCollector> collector;
  const pfResult_t result = start_cupti_collector([] { return 0.0; }, &collector);
  EXPECT_EQ(result, pfErrorCuptiFailure) << last_error_message();
  EXPECT_EQ(collector, nullptr);
  EXPECT_NE(last_error_message().find("failed at cuda/cupti_collector.cpp:"), std::string::npos)
      << last_error_message();
  // A second try fails the same way (nothing half-started is left behind).
  EXPECT_EQ(start_cupti_collector([] { return 0.0; }, &collector), pfErrorCuptiFailure);
}

TEST(NoGpu, DriverEntryPointsAbsentWithoutDriver) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present";
  const DriverApi& api = driver_api();
  EXPECT_EQ(api.stream_write_value64, nullptr);
  EXPECT_FALSE(api.has_green_contexts());
  EXPECT_NE(std::string(api.green_context_absence_reason()), "");
}

// The binary must start where no driver is installed: nothing may link libcuda.so.
TEST(NoGpu, TestBinaryDoesNotLinkLibcuda) {
  char self[4096] = {};
  const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(length, 0);
  FILE* pipe = popen((std::string("ldd '") + self + "' 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[512];
  while (fgets(buffer, sizeof buffer, pipe)) output += buffer;
  pclose(pipe);
  EXPECT_NE(output.find("libc.so"), std::string::npos) << output;  // ldd did read the binary
  EXPECT_EQ(output.find("libcuda.so"), std::string::npos) << output;
  // The backend's CUDA runtime is static and cuBLAS/CUPTI load at first use (issue 16).
  EXPECT_EQ(output.find("libcudart"), std::string::npos) << output;
  EXPECT_EQ(output.find("libcupti"), std::string::npos) << output;
}

// ---- Driver entry points against cudaTypedefs.h ---------------------------------------------------

std::string read_cuda_typedefs() {
  std::ifstream in(std::string(PIPEFILL_CUDA_INCLUDE_DIR) + "/cudaTypedefs.h");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Versions of every `PFN_<symbol>_v<version>` typedef of the header (per-thread variants aside).
std::vector<int> typedef_versions(const std::string& header, const std::string& symbol) {
  std::vector<int> versions;
  const std::regex pattern("\\bPFN_" + symbol + "_v([0-9]+)\\)");
  for (auto it = std::sregex_iterator(header.begin(), header.end(), pattern); it != std::sregex_iterator(); ++it)
    versions.push_back(std::stoi((*it)[1].str()));
  return versions;
}

TEST(DriverEntryPoints, EachIsRequestedAtAVersionTheHeaderHasATypedefFor) {
  const std::string header = read_cuda_typedefs();
  ASSERT_FALSE(header.empty()) << "cannot read " << PIPEFILL_CUDA_INCLUDE_DIR << "/cudaTypedefs.h";
  for (const EntryPointInfo& entry : kDriverEntryPoints) {
    const std::vector<int> versions = typedef_versions(header, entry.symbol);
    ASSERT_FALSE(versions.empty()) << entry.symbol << " has no PFN typedef";
    EXPECT_NE(std::find(versions.begin(), versions.end(), entry.version), versions.end())
        << entry.symbol << " is requested at " << entry.version << " but cudaTypedefs.h has no PFN_"
        << entry.symbol << "_v" << entry.version << " (a request below the introducing version resolves "
        << "to nothing)";
    // Never below the version that introduced the symbol.
    EXPECT_GE(entry.version, *std::min_element(versions.begin(), versions.end())) << entry.symbol;
  }
}

TEST(DriverEntryPoints, GreenContextsNeedDriver12_5) {
  const std::string header = read_cuda_typedefs();
  const std::vector<int> stream_create = typedef_versions(header, "cuGreenCtxStreamCreate");
  ASSERT_FALSE(stream_create.empty());
  const int introduced = *std::min_element(stream_create.begin(), stream_create.end());
  EXPECT_EQ(introduced, 12050);
  EXPECT_EQ(kGreenContextDriverVersion, 12050);
  for (const EntryPointInfo& entry : kDriverEntryPoints) {
    if (entry.group != EntryPointGroup::GreenContext) continue;
    EXPECT_LE(entry.version, kGreenContextDriverVersion) << entry.symbol;
    const std::vector<int> versions = typedef_versions(header, entry.symbol);
    ASSERT_FALSE(versions.empty()) << entry.symbol;
    EXPECT_EQ(entry.version, *std::max_element(versions.begin(), versions.end()))
        << entry.symbol << ": a green-context entry point requested below its newest typedef";
  }
}

TEST(DriverEntryPoints, WithoutDriverEveryGreenContextEntryPointIsListedMissing) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present";
  const std::string missing = driver_api().missing_entry_points(EntryPointGroup::GreenContext);
  for (const EntryPointInfo& entry : kDriverEntryPoints)
    if (entry.group == EntryPointGroup::GreenContext)
      EXPECT_NE(missing.find(std::string(entry.symbol) + "@" + std::to_string(entry.version)), std::string::npos)
          << missing;
  EXPECT_EQ(driver_result_name(2), driver_api().get_error_name ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUresult 2");
}

// ---- Fallback decisions ---------------------------------------------------------------------------

TEST(Fallback, GreenContextAndOptOutAreAlwaysExplained) {
  EXPECT_TRUE(fallback_is_explained(13000, {FallbackCause::None, ""}));
  EXPECT_TRUE(fallback_is_explained(13000, {FallbackCause::DisabledByEnv, ""}));
  EXPECT_EQ(describe({FallbackCause::None, ""}), "green context");
}

TEST(Fallback, MissingEntryPointsOnANewDriverAreABug) {
  // The 12040-vs-12050 bug: a 13.0 driver, every device in grid-cap mode, "driver lacks ...".
  EXPECT_FALSE(fallback_is_explained(13000, {FallbackCause::EntryPointsMissing, "cuGreenCtxStreamCreate@12040"}));
  EXPECT_FALSE(fallback_is_explained(12050, {FallbackCause::DriverTooOld, "driver 12050"}));
  // On an old driver the same causes are the truth.
  EXPECT_TRUE(fallback_is_explained(12040, {FallbackCause::EntryPointsMissing, "cuGreenCtxStreamCreate@12050"}));
  EXPECT_TRUE(fallback_is_explained(12040, {FallbackCause::DriverTooOld, "driver 12040"}));
  EXPECT_TRUE(fallback_is_explained(0, {FallbackCause::NoDriver, ""}));
  EXPECT_FALSE(fallback_is_explained(13000, {FallbackCause::NoDriver, ""}));
}

TEST(Fallback, RuntimeFailuresNeedTheirCause) {
  for (FallbackCause cause : {FallbackCause::NoUsefulSplit, FallbackCause::DriverCallFailed,
                              FallbackCause::StreamCreationFailed, FallbackCause::WarmUpFailed,
                              FallbackCause::EventSelfTestFailed}) {
    EXPECT_TRUE(fallback_is_explained(13000, {cause, "cuGreenCtxStreamCreate: CUDA_ERROR_INVALID_VALUE"}))
        << fallback_cause_name(cause);
    EXPECT_FALSE(fallback_is_explained(13000, {cause, ""})) << fallback_cause_name(cause);
  }
  EXPECT_EQ(describe({FallbackCause::StreamCreationFailed, "cuGreenCtxStreamCreate: CUDA_ERROR_INVALID_VALUE"}),
            "grid cap: green-context stream creation failed: cuGreenCtxStreamCreate: CUDA_ERROR_INVALID_VALUE");
}

EventSelfTest passing_self_test() {
  EventSelfTest test;
  test.kernel_ms = 0.2;
  test.elapsed_ms = 0.215;
  return test;
}

TEST(EventSelfTest, PassesWhenEveryCallWorkedAndTheOrderHolds) {
  EXPECT_EQ(event_self_test_failure(passing_self_test()), "");
}

TEST(EventSelfTest, ReportsTheFirstFailingCallInOrder) {
  EventSelfTest test = passing_self_test();
  test.record_error = "cudaEventRecord(C, fill): cudaErrorInvalidResourceHandle";
  test.elapsed_error = "cudaEventElapsedTime(A, C): cudaErrorInvalidResourceHandle";
  EXPECT_EQ(event_self_test_failure(test), test.record_error);
  test.wait_error = "cudaStreamWaitEvent(fill, B): cudaErrorInvalidValue";
  EXPECT_EQ(event_self_test_failure(test), test.wait_error);
}

TEST(EventSelfTest, FillEventBeforeTheMainKernelEndedFails) {
  EventSelfTest test = passing_self_test();
  test.elapsed_ms = 0.05;  // the fill side did not wait for the main kernel
  const std::string failure = event_self_test_failure(test);
  EXPECT_NE(failure.find("0.050 ms"), std::string::npos) << failure;
  EXPECT_NE(failure.find("0.200 ms"), std::string::npos) << failure;
  test.elapsed_ms = std::nan("");
  EXPECT_NE(event_self_test_failure(test), "");
  test.elapsed_ms = 0.181;  // within the 10% allowance for timer granularity
  EXPECT_EQ(event_self_test_failure(test), "");
}

// ---- Event queries leave no stale error -------------------------------------------------------------

// A fake CUDA runtime: one thread-local "last error" slot, set by the query like CUDA does.
thread_local cudaError_t fake_last_error = cudaSuccess;
cudaError_t fake_query_result = cudaSuccess;
cudaError_t fake_query(cudaEvent_t) {
  if (fake_query_result != cudaSuccess) fake_last_error = fake_query_result;
  return fake_query_result;
}
cudaError_t fake_get_last_error() {
  const cudaError_t error = fake_last_error;
  fake_last_error = cudaSuccess;
  return error;
}

TEST(EventQuery, NotReadyIsPendingAndClearsTheLastError) {
  const EventQueryApi api{&fake_query, &fake_get_last_error};
  fake_query_result = cudaErrorNotReady;
  fake_last_error = cudaSuccess;
  cudaError_t error = cudaErrorUnknown;
  EXPECT_EQ(query_event_state(nullptr, &error, api), EventState::Pending);
  EXPECT_EQ(error, cudaSuccess);
  // What the next `kernel<<<...>>>; cudaGetLastError()` would see: nothing.
  EXPECT_EQ(fake_get_last_error(), cudaSuccess);
}

TEST(EventQuery, CompleteAndFailedAreReported) {
  const EventQueryApi api{&fake_query, &fake_get_last_error};
  fake_query_result = cudaSuccess;
  cudaError_t error = cudaErrorUnknown;
  EXPECT_EQ(query_event_state(nullptr, &error, api), EventState::Complete);
  EXPECT_EQ(error, cudaSuccess);
  fake_query_result = cudaErrorIllegalAddress;  // sticky: the caller reports it, nothing is hidden
  EXPECT_EQ(query_event_state(nullptr, &error, api), EventState::Failed);
  EXPECT_EQ(error, cudaErrorIllegalAddress);
  fake_last_error = cudaSuccess;
}

TEST(Partition, ObservedFillSmsAllowTwoExtraOnHopperOnly) {
  EXPECT_EQ(max_observed_fill_sms(112, 9), 114);
  EXPECT_EQ(max_observed_fill_sms(112, 8), 112);
  EXPECT_EQ(max_observed_fill_sms(112, 10), 112);
}

// ---- Argument validation that needs no GPU -------------------------------------------------------

TEST(SpinItems, RejectsSliceWithoutDeviceWords) {
  pfSliceDesc_t slice{};
  slice.max_items = 10;
  slice.total_items = 10;
  slice.max_blocks = 4;
  EXPECT_EQ(launch_spin_items(slice, nullptr, SpinItemsParams{}), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("gate/cursor/budget_counter"), std::string::npos);
}

TEST(SpinItems, RejectsBadBlockSize) {
  pfSliceDesc_t slice{};
  SpinItemsParams params;
  params.block_threads = 2048;
  EXPECT_EQ(launch_spin_items(slice, nullptr, params), pfErrorInvalidArgument);
  EXPECT_EQ(last_error_message(), "spin items: block_threads=2048 must be in 1..1024");
}

TEST(SpinItems, RejectsZeroBlockCap) {
  uint64_t words[3] = {};
  pfSliceDesc_t slice{};
  slice.max_items = 1;
  slice.total_items = 1;
  slice.gate = &words[0];
  slice.cursor = &words[1];
  slice.budget_counter = &words[2];
  slice.max_blocks = 0;
  EXPECT_EQ(launch_spin_items(slice, nullptr, SpinItemsParams{}), pfErrorInvalidArgument);
  EXPECT_EQ(last_error_message(), "spin items: slice.max_blocks=0 must be > 0");
}

TEST(GemmItem, RejectsBadShapesAndPointers) {
  std::unique_ptr<GemmItem> item;
  GemmItemDesc desc;
  desc.m = 0;
  desc.n = 4;
  desc.k = 4;
  EXPECT_EQ(make_gemm_item(desc, nullptr, &item), pfErrorInvalidArgument);
  EXPECT_EQ(last_error_message(), "make_gemm_item: dimensions m=0 n=4 k=4 must be > 0");
  desc.m = 4;
  EXPECT_EQ(make_gemm_item(desc, nullptr, &item), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("null matrix pointer"), std::string::npos);
  float fake[1];
  desc.a = desc.b = fake;
  desc.c = fake;
  EXPECT_EQ(make_gemm_item(desc, nullptr, &item), pfErrorInvalidArgument);
  EXPECT_EQ(last_error_message(), "make_gemm_item: a conditional item needs the gate word (gate is null)");
  EXPECT_EQ(item, nullptr);
}

}  // namespace
}  // namespace pipefill::cuda

// ---- CUDA libraries opened at first use (cuda/lazy_library.hpp) --------------------------------

namespace pipefill::cuda {
namespace {

TEST(LazyLibrary, PrefersTheCopyAlreadyLoadedInTheProcess) {
  // Open the toolkit's cuBLAS by absolute path, as torch opens its wheel's copy; asked for by
  // soname afterwards, the loaded copy is found (RTLD_NOLOAD), not a second one.
  void* first = dlopen(PIPEFILL_CUBLAS_FALLBACK, RTLD_NOW | RTLD_LOCAL);
  if (first == nullptr) GTEST_SKIP() << "no " << PIPEFILL_CUBLAS_FALLBACK << ": " << dlerror();
  const LazyLibrary lib = open_lazy_library(PIPEFILL_CUBLAS_SONAME, nullptr);
  ASSERT_NE(lib.handle, nullptr) << lib.error;
  EXPECT_EQ(lib.handle, first);
  EXPECT_NE(lib.path.find("already loaded"), std::string::npos) << lib.path;
  dlclose(lib.handle);
  dlclose(first);
}

TEST(LazyLibrary, AMissingLibraryNamesEveryCandidateTried) {
  const LazyLibrary lib = open_lazy_library("libpipefill-no-such-library.so.7", "/nonexistent/libx.so.7");
  EXPECT_EQ(lib.handle, nullptr);
  EXPECT_NE(lib.error.find("libpipefill-no-such-library.so.7"), std::string::npos) << lib.error;
  EXPECT_NE(lib.error.find("/nonexistent/libx.so.7"), std::string::npos) << lib.error;
}

TEST(LazyLibrary, CublasTableResolvesEverySymbolItCalls) {
  // cuBLAS loads without a driver; every function PipeFill calls must resolve (a renamed or
  // removed symbol shows here, on CPU, not on the first GPU run).
  const CublasApi& api = cublas_api();
  ASSERT_TRUE(api.ok) << api.error;
  EXPECT_NE(api.cublasSgemmStridedBatched, nullptr);
  EXPECT_FALSE(api.where.empty());
}

TEST(LazyLibrary, CuptiTableResolvesEverySymbolItCalls) {
  const CuptiApi& api = cupti_api();
  ASSERT_TRUE(api.ok) << api.error;
  EXPECT_EQ(cupti_api_if_loaded(), &api);
}

}  // namespace
}  // namespace pipefill::cuda
