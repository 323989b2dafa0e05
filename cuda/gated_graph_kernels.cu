// The claim kernel of graph fill jobs (cuda/gated_graph.cpp): one thread that makes the ticket
// claim of pipefill/item_protocol.hpp for the next item of a graph job, writes the claimed item to
// the job's index word, and sets the WHILE node's condition (1: run the user's graph for it, 0:
// stop). No fmt here (nvcc); see gated_graph_launchers.hpp.
#include <cuda_runtime.h>

#include "gated_graph_launchers.hpp"
#include "pipefill/device.cuh"

namespace pipefill::cuda {
namespace {

__global__ void graph_claim_kernel(cudaGraphConditionalHandle handle, GraphClaimWords words) {
  pfSliceDesc_t slice{};
  slice.gate = words.gate;
  // The slice's bubble id and item budget are written by the runtime on the fill stream before
  // each launch (stream-ordered, so every claim of the launch reads the slice's values).
  slice.bubble_id = *reinterpret_cast<volatile uint64_t*>(&words.slice_words[0]);
  slice.max_items = *reinterpret_cast<volatile uint64_t*>(&words.slice_words[1]);
  slice.total_items = words.item_count;
  slice.cursor = words.cursor;
  slice.budget_counter = words.budget_counter;
  const uint64_t item = protocol::claim_item(slice, device::CudaAtomics{});
  const bool run = item != protocol::kStopItem;
  if (run) *reinterpret_cast<volatile uint64_t*>(words.index_word) = item;
  // The item index must be visible to the user's kernels, which run after this kernel in graph
  // order (kernel boundaries order global memory); the fence also orders it before the condition.
  __threadfence();
  cudaGraphSetConditional(handle, run ? 1u : 0u);
}

}  // namespace

namespace detail {

const void* graph_claim_kernel_function() { return reinterpret_cast<const void*>(graph_claim_kernel); }

cudaError_t load_graph_claim_kernel() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, graph_claim_kernel);
}

}  // namespace detail
}  // namespace pipefill::cuda
