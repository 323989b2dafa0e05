// CPU tests of issue 24's CUDA-path fixes, with the driver API replaced by recording fakes (no
// GPU, no driver here):
//  - foreign graphs (the item graph of a graph fill job, e.g. torch's with cuBLAS kernels) are read
//    only through the driver table (GraphReadApi), never the runtime's cudaGraph* calls, which fail
//    with cudaErrorInvalidDeviceFunction on kernels our static runtime never registered;
//  - the device's context is pushed per call and popped after (DeviceContextScope), so the calling
//    thread's current context - a torch green context, another device's - is unchanged afterwards,
//    and the default device is the caller's current one, read without setting anything;
//  - the fill-context clock is aligned to the primary one by a two-way exchange;
//  - no source of the backend calls cudaSetDevice or the runtime's graph-reading calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "clock_alignment.hpp"
#include "common/error.hpp"
#include "device_context.hpp"
#include "driver_api.hpp"
#include "graph_inspect.hpp"

namespace pipefill::cuda {
namespace {

template <typename T>
T handle(uintptr_t value) {
  return reinterpret_cast<T>(value);
}

// ---- A fake graph behind the driver's graph-reading entry points ------------------------------

struct FakeGraph;
struct FakeNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  unsigned grid[3] = {1, 1, 1};
  CUcontext context = nullptr;
  FakeGraph* child = nullptr;
};
struct FakeGraph {
  std::vector<FakeNode> nodes;
};

std::vector<std::string> driver_calls;  // every fake entry point appends its name

CUresult CUDAAPI fake_get_nodes(CUgraph graph, CUgraphNode* nodes, size_t* count) {
  driver_calls.push_back("cuGraphGetNodes");
  auto* fake = reinterpret_cast<FakeGraph*>(graph);
  if (nodes != nullptr)
    for (size_t i = 0; i < *count && i < fake->nodes.size(); ++i)
      nodes[i] = reinterpret_cast<CUgraphNode>(&fake->nodes[i]);
  *count = fake->nodes.size();
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_node_get_type(CUgraphNode node, CUgraphNodeType* type) {
  driver_calls.push_back("cuGraphNodeGetType");
  *type = reinterpret_cast<FakeNode*>(node)->type;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_kernel_params(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v2* params) {
  driver_calls.push_back("cuGraphKernelNodeGetParams");
  const auto* fake = reinterpret_cast<FakeNode*>(node);
  if (fake->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
  params->gridDimX = fake->grid[0];
  params->gridDimY = fake->grid[1];
  params->gridDimZ = fake->grid[2];
  params->ctx = fake->context;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_child_graph(CUgraphNode node, CUgraph* graph) {
  driver_calls.push_back("cuGraphChildGraphNodeGetGraph");
  *graph = reinterpret_cast<CUgraph>(reinterpret_cast<FakeNode*>(node)->child);
  return CUDA_SUCCESS;
}

GraphReadApi fake_graph_api() {
  GraphReadApi api;
  api.get_nodes = &fake_get_nodes;
  api.node_get_type = &fake_node_get_type;
  api.kernel_node_get_params = &fake_kernel_params;
  api.child_graph = &fake_child_graph;
  return api;
}

FakeNode kernel(unsigned x, unsigned y, unsigned z, CUcontext context) {
  FakeNode node;
  node.type = CU_GRAPH_NODE_TYPE_KERNEL;
  node.grid[0] = x;
  node.grid[1] = y;
  node.grid[2] = z;
  node.context = context;
  return node;
}

const CUcontext kPrimary = handle<CUcontext>(0x1000);
const CUcontext kFill = handle<CUcontext>(0x2000);
const CUcontext kUserGreen = handle<CUcontext>(0x3000);
const CUdevice kDevice = 101;  // the runtime's device (ordinal 1 of fake_device_get)

// What a torch capture with a cuBLAS GEMM looks like: kernels (GEMM, elementwise), a memset, an
// empty join node, and a child graph with one more kernel. Every kernel of the fill context.
struct TorchLikeGraph {
  FakeGraph child;
  FakeGraph top;
  TorchLikeGraph(CUcontext gemm_context, CUcontext others) {
    child.nodes = {kernel(4, 1, 1, others)};
    FakeNode memset;
    memset.type = CU_GRAPH_NODE_TYPE_MEMSET;
    FakeNode join;
    join.type = CU_GRAPH_NODE_TYPE_EMPTY;
    FakeNode sub;
    sub.type = CU_GRAPH_NODE_TYPE_GRAPH;
    sub.child = &child;
    top.nodes = {kernel(16, 8, 1, gemm_context), memset, kernel(32, 1, 1, others), join, sub};
  }
  CUgraph graph() { return reinterpret_cast<CUgraph>(&top); }
};

TEST(ForeignGraph, ReadThroughTheDriverOnlyCountingEveryKernelsBlocks) {
  TorchLikeGraph g(kFill, kFill);
  driver_calls.clear();
  ItemGraphFacts facts;
  ASSERT_EQ(inspect_item_graph(fake_graph_api(), g.graph(), {kFill, kPrimary}, &facts), pfSuccess)
      << last_error_message();
  EXPECT_EQ(facts.blocks, 16u * 8u + 32u + 4u);
  EXPECT_EQ(facts.kernel_nodes, 3u);
  // Each node's type and each kernel's parameters come from the driver table; the runtime's
  // cudaGraphKernelNodeGetParams (cudaErrorInvalidDeviceFunction for torch's and cuBLAS's kernels)
  // is not in the path at all - with a fake node it could not have succeeded here.
  std::map<std::string, int> counts;
  for (const std::string& call : driver_calls) ++counts[call];
  EXPECT_EQ(counts["cuGraphKernelNodeGetParams"], 3);
  EXPECT_EQ(counts["cuGraphNodeGetType"], 6);
  EXPECT_EQ(counts["cuGraphChildGraphNodeGetGraph"], 1);
  EXPECT_EQ(counts["cuGraphGetNodes"], 4);  // count, then nodes, for the graph and its child
}

TEST(ForeignGraph, KernelsOfAnotherContextAreRefusedNamingEveryNodesContext) {
  TorchLikeGraph g(kPrimary, kFill);  // the GEMM captured with the primary context current
  ItemGraphFacts facts;
  facts.blocks = 77;
  EXPECT_EQ(inspect_item_graph(fake_graph_api(), g.graph(), {kFill, kPrimary}, &facts), pfErrorInvalidArgument);
  const std::string message = last_error_message();
  EXPECT_NE(message.find("kernel node 0 of the graph belongs to context 0x1000 (the device's primary context)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("not to the fill partition's context 0x2000 (the fill partition's green context)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("Kernel nodes by context: 0x1000 (the device's primary context): node 0 of the graph; "
                         "0x2000 (the fill partition's green context): node 2 of the graph, node 0 of child "
                         "graph 4 of the graph"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("pfGraphCaptureContextPush"), std::string::npos) << message;
  EXPECT_EQ(facts.blocks, 77u) << "a refusal writes nothing";
}

TEST(ForeignGraph, AUserContextIsNamedAsAnother) {
  TorchLikeGraph g(kUserGreen, kUserGreen);
  ItemGraphFacts facts;
  EXPECT_EQ(inspect_item_graph(fake_graph_api(), g.graph(), {kFill, kPrimary}, &facts), pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("0x3000 (another context): node 0 of the graph, node 2 of the graph, node 0 "
                                      "of child graph 4 of the graph"),
            std::string::npos)
      << last_error_message();
}

// Issue 33 item 4: an item captured in a private capture context keeps all its kernels there.
TEST(ForeignGraph, AnItemOfOneCaptureContextIsBuiltInItAndAMixIsRefused) {
  const CUcontext capture = handle<CUcontext>(0x5000);
  TorchLikeGraph g(capture, capture);
  ItemGraphFacts facts;
  ASSERT_EQ(inspect_item_graph(fake_graph_api(), g.graph(), {kFill, kPrimary, {capture}}, &facts), pfSuccess);
  EXPECT_EQ(facts.kernel_context, capture);
  TorchLikeGraph mixed(capture, kFill);
  EXPECT_EQ(inspect_item_graph(fake_graph_api(), mixed.graph(), {kFill, kPrimary, {capture}}, &facts),
            pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("not to the fill partition's context 0x5000 (a capture context of the fill "
                                      "partition)"),
            std::string::npos)
      << last_error_message();
}

TEST(ForeignGraph, InGridCapModeThePrimaryContextIsTheFillContext) {
  TorchLikeGraph g(kPrimary, kPrimary);
  ItemGraphFacts facts;
  EXPECT_EQ(inspect_item_graph(fake_graph_api(), g.graph(), {kPrimary, kPrimary}, &facts), pfSuccess)
      << last_error_message();
  EXPECT_EQ(facts.kernel_nodes, 3u);
}

TEST(ForeignGraph, NodesOutsideTheContractAreRefusedByPlaceAndType) {
  FakeGraph inner;
  FakeNode host;
  host.type = CU_GRAPH_NODE_TYPE_HOST;
  inner.nodes = {kernel(1, 1, 1, kFill), host};
  FakeGraph top;
  FakeNode sub;
  sub.type = CU_GRAPH_NODE_TYPE_GRAPH;
  sub.child = &inner;
  top.nodes = {sub};
  ItemGraphFacts facts;
  EXPECT_EQ(inspect_item_graph(fake_graph_api(), reinterpret_cast<CUgraph>(&top), {kFill, kPrimary}, &facts),
            pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("desc->graph: node 1 of child graph 0 of the graph is a host node"),
            std::string::npos)
      << last_error_message();
  FakeNode alloc;
  alloc.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  top.nodes = {alloc};
  EXPECT_EQ(inspect_item_graph(fake_graph_api(), reinterpret_cast<CUgraph>(&top), {kFill, kPrimary}, &facts),
            pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("node 0 of the graph is a memory allocation node"), std::string::npos);
}

TEST(ForeignGraph, ChildGraphsNestedTooDeepAreRefused) {
  std::vector<FakeGraph> chain(11);
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    FakeNode sub;
    sub.type = CU_GRAPH_NODE_TYPE_GRAPH;
    sub.child = &chain[i + 1];
    chain[i].nodes = {sub};
  }
  ItemGraphFacts facts;
  EXPECT_EQ(inspect_item_graph(fake_graph_api(), reinterpret_cast<CUgraph>(&chain[0]), {kFill, kPrimary}, &facts),
            pfErrorInvalidArgument);
  EXPECT_NE(last_error_message().find("nested deeper than 8"), std::string::npos) << last_error_message();
}

TEST(ForeignGraph, AMissingDriverEntryPointIsNamed) {
  GraphReadApi api = fake_graph_api();
  api.kernel_node_get_params = nullptr;
  TorchLikeGraph g(kFill, kFill);
  ItemGraphFacts facts;
  EXPECT_EQ(inspect_item_graph(api, g.graph(), {kFill, kPrimary}, &facts), pfErrorNotSupported);
  EXPECT_NE(last_error_message().find("cuGraphKernelNodeGetParams@12000"), std::string::npos) << last_error_message();
  // The table made from the process's driver: without a driver every entry point is missing.
  if (driver_api().driver_version == 0)
    EXPECT_NE(GraphReadApi::from(driver_api()).missing().find("cuGraphGetNodes@10000"), std::string::npos);
}

// ---- A fake thread context stack behind the driver's context entry points ----------------------

// The calling thread's context stack, as the driver keeps it (top = current), and the calls made.
thread_local std::vector<CUcontext> context_stack;
std::vector<std::string> context_calls;
std::map<CUcontext, CUdevice> device_of_context;

CUresult CUDAAPI fake_ctx_get_current(CUcontext* context) {
  context_calls.push_back("get");
  *context = context_stack.empty() ? nullptr : context_stack.back();
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_ctx_push(CUcontext context) {
  context_calls.push_back("push");
  context_stack.push_back(context);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_ctx_pop(CUcontext* context) {
  context_calls.push_back("pop");
  if (context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  *context = context_stack.back();
  context_stack.pop_back();
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_ctx_set_current(CUcontext context) {  // what cudaSetDevice does underneath
  context_calls.push_back("set");
  if (context_stack.empty())
    context_stack.push_back(context);
  else
    context_stack.back() = context;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_ctx_get_device(CUdevice* device) {
  context_calls.push_back("get_device");
  if (context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  *device = device_of_context.at(context_stack.back());
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_device_get(CUdevice* device, int ordinal) {
  context_calls.push_back("device_get");
  *device = 100 + ordinal;  // handles are not ordinals
  return CUDA_SUCCESS;
}

DriverApi fake_context_api() {
  DriverApi api;
  api.driver_version = 13000;
  api.ctx_get_current = &fake_ctx_get_current;
  api.ctx_push_current = &fake_ctx_push;
  api.ctx_pop_current = &fake_ctx_pop;
  api.ctx_get_device = &fake_ctx_get_device;
  api.device_get = &fake_device_get;
  return api;
}

class ContextFake : public ::testing::Test {
 protected:
  void SetUp() override {
    context_stack.clear();
    context_calls.clear();
    device_of_context = {{kPrimary, 101}, {kFill, 101}, {kUserGreen, 101}, {handle<CUcontext>(0x4000), 100}};
  }
  const DriverApi api_ = fake_context_api();
};

// A torch GreenContext the trainer made current (GreenContext.set_context pushes it): every kind
// of call leaves it current, and a call that needs the device's primary context gets it pushed
// for the call only.
TEST_F(ContextFake, AGreenContextOfTheCallerStaysCurrentAcrossEveryKindOfCall) {
  context_stack = {kPrimary, kUserGreen};
  const std::vector<CUcontext> before = context_stack;
  {
    DeviceContextScope scope(api_);
    ASSERT_EQ(scope.enter(kPrimary, kDevice, ContextNeed::Primary), pfSuccess) << last_error_message();
    EXPECT_TRUE(scope.pushed());
    EXPECT_EQ(context_stack.back(), kPrimary) << "object creation and launches run in the primary context";
  }
  EXPECT_EQ(context_stack, before);
  {
    // A bubble instruction's stream-ordered calls: the caller's context stays current (a NULL
    // stream means the caller's context's stream; a push would change what it names).
    DeviceContextScope scope(api_);
    ASSERT_EQ(scope.enter(kPrimary, kDevice, ContextNeed::Any), pfSuccess);
    EXPECT_FALSE(scope.pushed());
    EXPECT_EQ(context_stack.back(), kUserGreen);
  }
  EXPECT_EQ(context_stack, before);
  EXPECT_EQ(std::count(context_calls.begin(), context_calls.end(), "set"), 0) << "never cuCtxSetCurrent";
}

TEST_F(ContextFake, NothingIsPushedWhenThePrimaryContextIsCurrent) {
  context_stack = {kPrimary};
  for (ContextNeed need : {ContextNeed::Primary, ContextNeed::Any}) {
    DeviceContextScope scope(api_);
    ASSERT_EQ(scope.enter(kPrimary, kDevice, need), pfSuccess);
    EXPECT_FALSE(scope.pushed());
  }
  EXPECT_EQ(context_calls, (std::vector<std::string>{"get", "get"}));
  EXPECT_EQ(context_stack, std::vector<CUcontext>{kPrimary});
}

// A thread with no context (the runtime's executor, a fresh Python thread): the primary context is
// pushed even for stream-ordered calls (else the CUDA runtime would bind device 0's primary
// context to the thread for good), and the thread is left with none again.
TEST_F(ContextFake, AThreadWithoutAContextIsLeftWithoutOne) {
  for (ContextNeed need : {ContextNeed::Primary, ContextNeed::Any}) {
    {
      DeviceContextScope scope(api_);
      ASSERT_EQ(scope.enter(kPrimary, kDevice, need), pfSuccess);
      EXPECT_TRUE(scope.pushed());
      EXPECT_EQ(context_stack, std::vector<CUcontext>{kPrimary});
    }
    EXPECT_TRUE(context_stack.empty());
  }
}

// Another device current on the caller's thread (its own rank's GPU): unchanged afterwards.
TEST_F(ContextFake, AnotherDevicesContextIsRestoredAndNestedScopesUnwind) {
  const CUcontext other_device = handle<CUcontext>(0x4000);
  context_stack = {other_device};
  {
    // Even stream-ordered calls push: a context of another device is no context of this one.
    DeviceContextScope scope(api_);
    ASSERT_EQ(scope.enter(kPrimary, kDevice, ContextNeed::Any), pfSuccess);
    EXPECT_TRUE(scope.pushed());
    EXPECT_EQ(context_stack.back(), kPrimary);
  }
  EXPECT_EQ(context_stack, std::vector<CUcontext>{other_device});
  {
    DeviceContextScope outer(api_);
    ASSERT_EQ(outer.enter(kPrimary, kDevice, ContextNeed::Primary), pfSuccess);
    DeviceContextScope inner(api_);  // a nested call (allocate_arena -> memory_info)
    ASSERT_EQ(inner.enter(kPrimary, kDevice, ContextNeed::Primary), pfSuccess);
    EXPECT_FALSE(inner.pushed());
    DeviceContextScope fill(api_);  // a nested push of another context (the fill one)
    ASSERT_EQ(fill.enter(kFill, kDevice, ContextNeed::Primary), pfSuccess);
    EXPECT_EQ(context_stack, (std::vector<CUcontext>{other_device, kPrimary, kFill}));
  }
  EXPECT_EQ(context_stack, std::vector<CUcontext>{other_device});
}

TEST_F(ContextFake, WithoutContextEntryPointsNothingHappens) {
  DriverApi none;
  DeviceContextScope scope(none);
  EXPECT_EQ(scope.enter(kPrimary, kDevice, ContextNeed::Primary), pfSuccess);
  EXPECT_FALSE(scope.pushed());
  EXPECT_TRUE(context_calls.empty());
}

// The default device: the device of the caller's current context, found without setting anything.
TEST_F(ContextFake, TheDefaultDeviceIsTheCallersCurrentOneReadWithoutSideEffects) {
  context_stack = {kUserGreen};  // a green context of device handle 101 = ordinal 1
  int ordinal = -1;
  std::string source;
  ASSERT_EQ(caller_device_ordinal(api_, 4, &ordinal, &source), pfSuccess) << last_error_message();
  EXPECT_EQ(ordinal, 1);
  EXPECT_NE(source.find("device 1: the device of the calling thread's current context 0x3000"), std::string::npos)
      << source;
  EXPECT_EQ(context_stack, std::vector<CUcontext>{kUserGreen});
  for (const std::string& call : context_calls) EXPECT_TRUE(call != "set" && call != "push" && call != "pop") << call;

  context_stack.clear();  // no context at all: device 0, nothing created
  ASSERT_EQ(caller_device_ordinal(api_, 4, &ordinal, &source), pfSuccess);
  EXPECT_EQ(ordinal, 0);
  EXPECT_NE(source.find("no CUDA context is current"), std::string::npos) << source;
  EXPECT_TRUE(context_stack.empty());

  context_stack = {handle<CUcontext>(0x4000)};  // device handle 100 = ordinal 0
  ASSERT_EQ(caller_device_ordinal(api_, 4, &ordinal, &source), pfSuccess);
  EXPECT_EQ(ordinal, 0);
  device_of_context[kPrimary] = 107;  // a device that is not visible (CUDA_VISIBLE_DEVICES)
  context_stack = {kPrimary};
  EXPECT_EQ(caller_device_ordinal(api_, 4, &ordinal, &source), pfErrorInvalidState);
  EXPECT_NE(last_error_message().find("none of the 4 visible device(s); set config.device"), std::string::npos)
      << last_error_message();
}

// ---- The fill clock aligned to the primary one ---------------------------------------------------

// Events of the exchange on a common true time line: the fill clock runs `offset` ahead of the
// primary one; each cross-context wait takes its latency.
struct Exchange {
  double b1 = 1000.0, wait_there = 3.0, gap = 0.7, wait_back = 3.0, offset = 40.0;
  double f1_true() const { return b1 + wait_there; }
  double f2_true() const { return f1_true() + gap; }
  double b2_true() const { return f2_true() + wait_back; }
  ClockAlignment align() const {
    // The fill clock reads true + offset; only differences of it are observable.
    return align_second_clock(b1, b2_true(), (f2_true() + offset) - (f1_true() + offset));
  }
};

TEST(ClockAlignment, EqualWaitsGiveTheExactTime) {
  Exchange x;
  const ClockAlignment a = x.align();
  EXPECT_DOUBLE_EQ(a.time_us, x.f1_true());
  EXPECT_DOUBLE_EQ(a.uncertainty_us, 3.0);
}

TEST(ClockAlignment, UnequalWaitsErrByHalfTheirDifferenceAndStayInTheInterval) {
  for (double there : {0.5, 2.0, 9.0}) {
    for (double back : {0.5, 4.0, 12.0}) {
      Exchange x;
      x.wait_there = there;
      x.wait_back = back;
      const ClockAlignment a = x.align();
      EXPECT_NEAR(a.time_us - x.f1_true(), (back - there) / 2.0, 1e-9) << there << " " << back;
      EXPECT_LE(std::abs(a.time_us - x.f1_true()), a.uncertainty_us + 1e-9);
      EXPECT_GE(a.time_us, x.b1);
      EXPECT_LE(a.time_us + x.gap, x.b2_true());
    }
  }
}

TEST(ClockAlignment, AnIntervalInvertedByRoundingTakesTheDirectBound) {
  const ClockAlignment a = align_second_clock(100.0, 100.4, 0.5);
  EXPECT_DOUBLE_EQ(a.time_us, 100.0);
  EXPECT_DOUBLE_EQ(a.uncertainty_us, 0.0);
}

// ---- What the backend's sources call ----------------------------------------------------------

// Code of a source file without its comments (// and /* */), so that documentation may name the
// calls the code must not make.
std::string code_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string code = std::regex_replace(text.str(), std::regex("/\\*[\\s\\S]*?\\*/"), " ");
  return std::regex_replace(code, std::regex("//[^\n]*"), " ");
}

TEST(BackendSources, NeverSetTheCallersDeviceNorReadGraphsThroughTheRuntime) {
  const std::filesystem::path cuda_dir = std::filesystem::path(PIPEFILL_SOURCE_DIR) / "cuda";
  const std::vector<std::string> forbidden = {
      "cudaSetDevice",                 // binds the primary context on the caller's thread
      "cuCtxSetCurrent",               // replaces the caller's current context
      "cudaGraphKernelNodeGetParams",  // cudaErrorInvalidDeviceFunction on foreign kernels
      "cudaGraphGetNodes", "cudaGraphNodeGetType", "cudaGraphChildGraphNodeGetGraph",
      "cudaGraphAddChildGraphNode"};
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(cuda_dir)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cpp" && ext != ".hpp" && ext != ".cu") continue;
    ++files;
    const std::string code = code_of(entry.path());
    for (const std::string& call : forbidden)
      EXPECT_EQ(code.find(call), std::string::npos) << entry.path().filename() << " calls " << call;
  }
  EXPECT_GT(files, 10);
}

}  // namespace
}  // namespace pipefill::cuda
