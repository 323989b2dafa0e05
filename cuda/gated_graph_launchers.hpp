// The raw pieces of cuda/gated_graph_kernels.cu (nvcc, no fmt): the claim kernel's parameter
// block and its function pointer for graph kernel nodes.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace pipefill::cuda {

// The claim kernel's words (all device memory, the job's for its whole life).
struct GraphClaimWords {
  const volatile uint64_t* gate;  // the runtime's gate (last closed bubble id)
  uint64_t* slice_words;          // [0] the slice's bubble id, [1] its item budget
  uint64_t* cursor;               // the job's next unclaimed item
  uint64_t* budget_counter;       // claims of the current slice (zeroed before each slice)
  uint64_t* index_word;           // where the user's graph reads the item index
  uint64_t item_count;
};

namespace detail {
// graph_claim_kernel(cudaGraphConditionalHandle handle, GraphClaimWords words)
const void* graph_claim_kernel_function();
// cudaFuncGetAttributes on the claim kernel: loads it into the current context.
cudaError_t load_graph_claim_kernel();
}  // namespace detail

}  // namespace pipefill::cuda
