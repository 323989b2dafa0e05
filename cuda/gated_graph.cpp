// Graph fill jobs on CUDA: the gated graph around the user's item graph (gated_graph.hpp).
#include "gated_graph.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "gated_graph_launchers.hpp"
#include "graph_inspect.hpp"
#include "stream_context.hpp"

namespace pipefill::cuda {
namespace {

// WHILE conditional nodes whose body holds child-graph, memcpy and memset nodes: CUDA 12.4
// (runtime and driver; 12.3 conditional bodies are more restricted).
constexpr int kConditionalNodesVersion = 12040;

class CudaGatedGraph final : public GraphItems {
 public:
  ~CudaGatedGraph() override {
    ScopedStreamContext scope;
    if (fill_stream_ != nullptr && enter(scope) != pfSuccess) clear_last_error();
    if (exec_ != nullptr && cudaGraphExecDestroy(exec_) != cudaSuccess) (void)cudaGetLastError();
    if (graph_ != nullptr && cudaGraphDestroy(graph_) != cudaSuccess) (void)cudaGetLastError();
  }

  // `context`: the one context of the item's kernels (nullptr: the fill stream's).
  pfResult_t build(const GraphJobSpec& spec, CUcontext context) {
    fill_stream_ = spec.fill_stream;
    slice_words_ = spec.scratch_words;
    context_ = context;
    ScopedStreamContext scope;  // one context throughout: the item's (capture, green or primary)
    PF_TRY(enter(scope));
    PF_CUDA_CHECK(detail::load_graph_claim_kernel());  // no module load inside a bubble
    PF_CUDA_CHECK(cudaGraphCreate(&graph_, 0));
    cudaGraphConditionalHandle handle{};
    PF_CUDA_CHECK(cudaGraphConditionalHandleCreate(&handle, graph_, 0, cudaGraphCondAssignDefault));
    GraphClaimWords words{};
    words.gate = spec.gate;
    words.slice_words = spec.scratch_words;
    words.cursor = spec.cursor;
    words.budget_counter = spec.budget_counter;
    words.index_word = spec.index_word;
    words.item_count = spec.item_count;
    void* args[] = {&handle, &words};
    cudaKernelNodeParams claim{};
    claim.func = const_cast<void*>(detail::graph_claim_kernel_function());
    claim.gridDim = dim3(1);
    claim.blockDim = dim3(1);
    claim.kernelParams = args;
    cudaGraphNode_t first_claim = nullptr;
    PF_CUDA_CHECK(cudaGraphAddKernelNode(&first_claim, graph_, nullptr, 0, &claim));
    cudaGraphNodeParams loop{};
    loop.type = cudaGraphNodeTypeConditional;
    loop.conditional.handle = handle;
    loop.conditional.type = cudaGraphCondTypeWhile;
    loop.conditional.size = 1;
    cudaGraphNode_t while_node = nullptr;
    PF_CUDA_CHECK(cudaGraphAddNode(&while_node, graph_, &first_claim, nullptr, 1, &loop));
    cudaGraph_t body = loop.conditional.phGraph_out[0];
    // The user's graph, cloned (the caller may destroy theirs) through the driver, like every
    // other access to a graph we did not build (cuda/graph_inspect.hpp).
    CUgraphNode item = nullptr;
    PF_DRIVER_CHECK(driver_api().graph_add_child_graph_node(&item, reinterpret_cast<CUgraph>(body), nullptr, 0,
                                                            static_cast<CUgraph>(spec.graph)));
    cudaGraphNode_t next_claim = nullptr;
    const cudaGraphNode_t after_item = reinterpret_cast<cudaGraphNode_t>(item);
    PF_CUDA_CHECK(cudaGraphAddKernelNode(&next_claim, body, &after_item, 1, &claim));
    PF_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    // Upload now, on a private stream of the same context (never the fill stream, whose queued
    // slices may wait for bubbles the caller has yet to enqueue), so no lazy upload happens in a
    // bubble.
    cudaStream_t upload = nullptr;
    PF_CUDA_CHECK(cudaStreamCreateWithFlags(&upload, cudaStreamNonBlocking));
    cudaError_t error = cudaGraphUpload(exec_, upload);
    if (error == cudaSuccess) error = cudaStreamSynchronize(upload);
    const cudaError_t destroyed = cudaStreamDestroy(upload);
    PF_CUDA_CHECK(error);
    PF_CUDA_CHECK(destroyed);
    return pfSuccess;
  }

  // Under the mutex of the graph's context only (a private capture context's own, stream_context.hpp).
  pfResult_t launch(void* stream) {
    ScopedStreamContext scope;
    PF_TRY(enter(scope));
    PF_CUDA_CHECK(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(stream)));
    return pfSuccess;
  }

  uint64_t* slice_words() const { return slice_words_; }
  // The SMs one item may occupy: its kernels' blocks (the runtime caps it at the partition);
  // 0 (unknown, the whole partition) for a graph without kernels.
  int sms_used() const override {
    return static_cast<int>(std::min<uint64_t>(blocks_, std::numeric_limits<int>::max()));
  }
  void set_blocks(uint64_t blocks) { blocks_ = blocks; }

 private:
  pfResult_t enter(ScopedStreamContext& scope) const {
    return context_ != nullptr ? scope.enter_context(context_) : scope.enter(fill_stream_);
  }

  void* fill_stream_ = nullptr;
  CUcontext context_ = nullptr;  // the item's kernels' context (the graph's), nullptr: the fill stream's
  uint64_t* slice_words_ = nullptr;
  uint64_t blocks_ = 0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

pfResult_t make_gated_graph(const GraphJobSpec& spec, void* primary_context,
                            const std::vector<void*>& capture_contexts, std::unique_ptr<GraphItems>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "make_gated_graph: out is null");
  if (spec.graph == nullptr)
    return fail(pfErrorInvalidArgument,
                "desc->graph is NULL (the CUDA backend needs the cudaGraph_t of one item)");
  if (spec.on_item != nullptr)
    return fail(pfErrorInvalidArgument,
                "desc->on_item must be NULL on the CUDA backend (the graph is the item's work)");
  if (spec.scratch_words == nullptr || spec.gate == nullptr || spec.cursor == nullptr ||
      spec.budget_counter == nullptr || spec.fill_stream == nullptr)
    return fail(pfErrorInternal, "make_gated_graph: job '{}' has no device words or fill stream", spec.name);
  int driver = 0, runtime = 0;
  PF_CUDA_CHECK(cudaDriverGetVersion(&driver));
  PF_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  if (driver < kConditionalNodesVersion || runtime < kConditionalNodesVersion)
    return fail(pfErrorNotSupported,
                "graph fill jobs need conditional (WHILE) graph nodes: CUDA 12.4 or later, but the "
                "driver is {} and the runtime {}",
                driver, runtime);
  cudaPointerAttributes attributes{};
  PF_CUDA_CHECK(cudaPointerGetAttributes(&attributes, spec.index_word));
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    return fail(pfErrorInvalidArgument,
                "desc->index_word {} is not device memory (cudaPointerGetAttributes type {}): the "
                "graph's kernels read it",
                static_cast<const void*>(spec.index_word), static_cast<int>(attributes.type));
  if (driver_api().graph_add_child_graph_node == nullptr)
    return fail(pfErrorNotSupported, "graph fill jobs need the driver's cuGraphAddChildGraphNode, which "
                                     "did not resolve (driver {})", driver);
  GraphContexts contexts;
  contexts.primary = static_cast<CUcontext>(primary_context);
  for (void* context : capture_contexts) contexts.capture.push_back(static_cast<CUcontext>(context));
  if (driver_api().stream_get_ctx != nullptr)
    PF_DRIVER_CHECK(driver_api().stream_get_ctx(static_cast<CUstream>(spec.fill_stream), &contexts.fill));
  ItemGraphFacts facts;
  PF_TRY(inspect_item_graph(GraphReadApi::from(driver_api()), static_cast<CUgraph>(spec.graph), contexts, &facts));
  auto graph = std::make_unique<CudaGatedGraph>();
  graph->set_blocks(facts.blocks);
  PF_TRY(graph->build(spec, facts.kernel_context));
  log::info("graph job '{}': gated graph instantiated ({} items)", spec.name, spec.item_count);
  *out = std::move(graph);
  return pfSuccess;
}

uint64_t* gated_graph_slice_words(GraphItems& items) {
  return static_cast<CudaGatedGraph&>(items).slice_words();
}

pfResult_t launch_gated_graph(GraphItems& items, void* stream) {
  return static_cast<CudaGatedGraph&>(items).launch(stream);
}

bool is_gated_graph(const GraphItems& items) {
  return dynamic_cast<const CudaGatedGraph*>(&items) != nullptr;
}

}  // namespace pipefill::cuda
