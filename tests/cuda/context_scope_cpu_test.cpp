// Every CUDA object the device creates is created in the context it belongs to (issue 33 items 5
// and 6), checked two ways without a GPU:
//  - recorded calls: the fill arena's cudaMalloc runs with the device's primary context pushed,
//    from a thread with no context or another device's, which is left as it was;
//  - the sources: in cuda/cuda_device*.cpp every call that creates memory, an event or a stream
//    runs inside a context scope that is still open at that point (PF_DEVICE_CONTEXT(Primary), a
//    DeviceContextScope or ScopedStreamContext entered in an enclosing block), or in a helper whose
//    every call site is itself inside one. The arena's cudaMalloc and the primary clock's re-base
//    event (created in whatever context the querying thread had current) failed this check.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "arena_memory.hpp"
#include "common/error.hpp"
#include "driver_api.hpp"

namespace pipefill::cuda {
namespace {

// ---- A fake thread context stack and a recording CUDA runtime ------------------------------------

const CUcontext kPrimaryOfDevice1 = reinterpret_cast<CUcontext>(0x1000);
const CUcontext kContextOfDevice0 = reinterpret_cast<CUcontext>(0x4000);
constexpr CUdevice kDevice1 = 101;

thread_local std::vector<CUcontext> stack;
std::vector<std::string> calls;  // "malloc in 0x1000", ...

CUresult CUDAAPI get_current(CUcontext* context) {
  *context = stack.empty() ? nullptr : stack.back();
  return CUDA_SUCCESS;
}
CUresult CUDAAPI push(CUcontext context) {
  stack.push_back(context);
  calls.push_back("push");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI pop(CUcontext* context) {
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  *context = stack.back();
  stack.pop_back();
  calls.push_back("pop");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI get_device(CUdevice* device) {
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  *device = stack.back() == kContextOfDevice0 ? 100 : kDevice1;
  return CUDA_SUCCESS;
}

std::string current_name() {
  std::ostringstream name;
  name << (stack.empty() ? static_cast<void*>(nullptr) : static_cast<void*>(stack.back()));
  return name.str();
}

size_t free_bytes = size_t{1} << 30;
cudaError_t malloc_result = cudaSuccess;
cudaError_t fake_mem_get_info(size_t* free, size_t* total) {
  calls.push_back("mem_get_info in " + current_name());
  *free = free_bytes;
  *total = size_t{80} << 30;
  return cudaSuccess;
}
cudaError_t fake_malloc(void** memory, size_t bytes) {
  calls.push_back("malloc " + std::to_string(bytes) + " in " + current_name());
  *memory = malloc_result == cudaSuccess ? reinterpret_cast<void*>(0xA000) : nullptr;
  return malloc_result;
}
cudaError_t fake_get_last_error() { return cudaSuccess; }

class ArenaContext : public ::testing::Test {
 protected:
  void SetUp() override {
    stack.clear();
    calls.clear();
    free_bytes = size_t{1} << 30;
    malloc_result = cudaSuccess;
    driver_.ctx_get_current = &get_current;
    driver_.ctx_push_current = &push;
    driver_.ctx_pop_current = &pop;
    driver_.ctx_get_device = &get_device;
  }
  DriverApi driver_;
  const ArenaMemoryApi api_{&fake_mem_get_info, &fake_malloc, &fake_get_last_error};
};

// device=1 from a thread with no context (the executor, a fresh Python thread): the arena lands in
// device 1's primary context, not in the device-0 context the CUDA runtime would have bound.
TEST_F(ArenaContext, AThreadWithoutAContextAllocatesInTheDevicesPrimaryContext) {
  void* base = nullptr;
  ASSERT_EQ(allocate_arena_memory(driver_, kPrimaryOfDevice1, kDevice1, 4096, &base, api_), pfSuccess)
      << last_error_message();
  EXPECT_EQ(base, reinterpret_cast<void*>(0xA000));
  const std::string primary = "0x1000";
  EXPECT_EQ(calls, (std::vector<std::string>{"push", "mem_get_info in " + primary, "malloc 4096 in " + primary, "pop"}));
  EXPECT_TRUE(stack.empty()) << "the thread is left with no context";
}

TEST_F(ArenaContext, AnotherDevicesContextIsRestored) {
  stack = {kContextOfDevice0};
  void* base = nullptr;
  ASSERT_EQ(allocate_arena_memory(driver_, kPrimaryOfDevice1, kDevice1, 64, &base, api_), pfSuccess);
  EXPECT_EQ(calls[2], "malloc 64 in 0x1000");
  EXPECT_EQ(stack, std::vector<CUcontext>{kContextOfDevice0});
}

TEST_F(ArenaContext, FailuresNameTheFiguresAndLeaveTheThreadAsItWas) {
  void* base = reinterpret_cast<void*>(0x1);
  free_bytes = 100;
  EXPECT_EQ(allocate_arena_memory(driver_, kPrimaryOfDevice1, kDevice1, 4096, &base, api_), pfErrorOutOfMemory);
  EXPECT_NE(last_error_message().find("4096 bytes requested but only 100 of"), std::string::npos)
      << last_error_message();
  free_bytes = size_t{1} << 30;
  malloc_result = cudaErrorMemoryAllocation;
  EXPECT_EQ(allocate_arena_memory(driver_, kPrimaryOfDevice1, kDevice1, 4096, &base, api_), pfErrorOutOfMemory);
  EXPECT_NE(last_error_message().find("cudaMalloc of 4096 bytes failed"), std::string::npos) << last_error_message();
  EXPECT_EQ(base, reinterpret_cast<void*>(0x1)) << "a failed call changes nothing";
  EXPECT_TRUE(stack.empty());
  EXPECT_EQ(allocate_arena_memory(driver_, kPrimaryOfDevice1, kDevice1, 0, &base, api_), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("bytes=0"), std::string::npos);
}

// ---- The sources ---------------------------------------------------------------------------------

std::string code_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string code = std::regex_replace(text.str(), std::regex("/\\*[\\s\\S]*?\\*/"), " ");
  return std::regex_replace(code, std::regex("//[^\n]*"), " ");
}

// Where, in a function, a call is made, and whether a context scope is open there.
struct CallSite {
  std::string file, function, call;
  bool in_scope;
};

// Top-level functions of a file (definitions start in column 0, namespace lines excepted); a scope
// opened at brace depth d stays open until the block it was declared in closes.
std::vector<CallSite> call_sites(const std::filesystem::path& path, const std::regex& calls) {
  static const std::regex definition("^[A-Za-z][^;(]*?(?:CudaDevice::)?(\\w+)\\(");
  static const std::regex scope_entry("(PF_DEVICE_CONTEXT\\(ContextNeed::Primary\\)|(\\.|->)enter\\()");
  std::vector<CallSite> sites;
  std::istringstream lines(code_of(path));
  std::string line, function;
  int depth = 0;
  std::vector<int> scopes;
  while (std::getline(lines, line)) {
    if (line.rfind("namespace", 0) == 0 || line.rfind("}  ", 0) == 0) continue;
    std::smatch match;
    if (depth == 0 && std::regex_search(line, match, definition)) {
      function = match[1];
      scopes.clear();
    }
    if (std::regex_search(line, scope_entry) && line.find("ContextNeed::Any") == std::string::npos)
      scopes.push_back(depth);
    for (auto it = std::sregex_iterator(line.begin(), line.end(), calls); it != std::sregex_iterator(); ++it)
      sites.push_back({path.filename().string(), function, (*it)[1], !scopes.empty()});
    for (char c : line) {
      if (c == '{') ++depth;
      if (c == '}') {
        --depth;
        while (!scopes.empty() && scopes.back() > depth) scopes.pop_back();
      }
    }
  }
  return sites;
}

std::vector<std::filesystem::path> device_sources() {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(PIPEFILL_SOURCE_DIR) / "cuda"))
    if (entry.path().filename().string().rfind("cuda_device", 0) == 0 && entry.path().extension() == ".cpp")
      files.push_back(entry.path());
  return files;
}

TEST(ContextScopeSources, EveryCreationRunsInsideAnOpenContextScope) {
  // Helpers that create objects without a scope of their own; each is called only where one is open.
  const std::set<std::string> helpers = {
      "init_reference",                   // init -> init_clock
      "init_gate_write",                  // init
      "try_green_context",                // configure_partition
      "enable_per_context_events",        // try_green_context
      "run_memory_ops_self_test",         // try_green_context, judge_main_context (primary pushed)
      "run_event_self_test",              // the same
      "run_per_context_event_self_test",  // try_green_context
      "create_private_capture_context",   // create_capture_stream
      "run_capture_context_self_test",    // create_private_capture_context
  };
  const std::regex creations(
      "\\b(cudaMalloc|cudaHostAlloc|cudaEventCreate|cudaEventCreateWithFlags|cudaStreamCreate\\w*|"
      "green_ctx_stream_create)\\(");
  const auto files = device_sources();
  ASSERT_GE(files.size(), 6u);
  int creations_seen = 0;
  std::set<std::string> helpers_seen;
  for (const auto& file : files) {
    for (const CallSite& site : call_sites(file, creations)) {
      ++creations_seen;
      if (helpers.count(site.function)) {
        helpers_seen.insert(site.function);
        continue;
      }
      EXPECT_TRUE(site.in_scope) << site.file << ": " << site.function << " calls " << site.call
                                 << " with no context scope open (the calling thread's context decides where "
                                    "it lands)";
    }
  }
  EXPECT_GT(creations_seen, 20);
  EXPECT_EQ(helpers_seen, helpers) << "a helper that creates nothing any more leaves the list";

  // Every call of a helper is made inside an open scope or from another helper, init_clock from init.
  std::string alternatives = "init_clock";
  for (const std::string& helper : helpers) alternatives += "|" + helper;
  const std::regex helper_calls("\\b(" + alternatives + ")\\(");
  int helper_calls_seen = 0;
  for (const auto& file : files) {
    for (const CallSite& site : call_sites(file, helper_calls)) {
      if (site.function == site.call) continue;  // the definition itself
      ++helper_calls_seen;
      const bool from_helper = helpers.count(site.function) > 0 || site.function == "init_clock";
      EXPECT_TRUE(site.in_scope || from_helper)
          << site.file << ": " << site.function << " calls " << site.call << " with no context scope open";
    }
  }
  EXPECT_GE(helper_calls_seen, static_cast<int>(helpers.size()));
}

}  // namespace
}  // namespace pipefill::cuda
