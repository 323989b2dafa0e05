// Reading a CUDA graph the library did not build (the item graph of a graph fill job: a user's,
// torch's, cuBLAS's) - through the driver API only.
//
// Why not the runtime's cudaGraph* calls: our CUDA runtime is linked statically (cuda/CMakeLists),
// so it knows only the kernels registered with it. cudaGraphKernelNodeGetParams maps a node's
// CUfunction back to the host stub its own runtime registered; for a kernel torch or cuBLAS
// launched (registered with *their* runtime) it finds none and returns
// cudaErrorInvalidDeviceFunction - every node of a torch-captured graph (issue 24 item 1; llama.cpp
// and Paddle hit the same with nodes from another library). The driver's cuGraph* calls take the
// node as it is. The table below is the whole interface, so a test can hand it fakes and check
// that nothing else is asked.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "driver_api.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cuda {

struct GraphReadApi {
  PFN_cuGraphGetNodes_v10000 get_nodes = nullptr;
  PFN_cuGraphNodeGetType_v10000 node_get_type = nullptr;
  PFN_cuGraphKernelNodeGetParams_v12000 kernel_node_get_params = nullptr;
  PFN_cuGraphChildGraphNodeGetGraph_v10000 child_graph = nullptr;

  static GraphReadApi from(const DriverApi& api);
  // The entry points that did not resolve ("" when all did).
  std::string missing() const;
};

// The contexts a refusal names: the one every kernel must belong to, and the device's primary
// context (may be the same, in grid-cap mode; nullptr when unknown).
struct GraphContexts {
  CUcontext fill = nullptr;
  CUcontext primary = nullptr;
  // Private capture contexts (green contexts on the fill partition's SMs, one per capture stream:
  // cuda_device_capture.cpp): an item captured in one of them may keep all its kernels there.
  std::vector<CUcontext> capture;
};

struct ItemGraphFacts {
  uint64_t blocks = 0;        // thread blocks of every kernel node (an upper bound of SMs used)
  uint64_t kernel_nodes = 0;  // in the graph and its child graphs
  // The one context of the item's kernels: contexts.fill, or the capture context they were
  // captured in (nullptr: no kernel reported one). The gated graph is built in it.
  CUcontext kernel_context = nullptr;
};

// Checks the contract of a graph fill job's item (docs/api.md, "Graph fill jobs"): only kernel,
// memcpy, memset, empty and child-graph nodes (CUDA accepts no other inside a conditional body,
// and none of them allocates or waits for the host), child graphs nested at most 8 deep, and every
// kernel in contexts.fill or all in one of contexts.capture (all kernels of a conditional body must belong to one context). A
// refusal is pfErrorInvalidArgument naming the node; for kernels of the wrong context it names
// every kernel node's context. pfErrorNotSupported when an entry point of `api` is missing.
pfResult_t inspect_item_graph(const GraphReadApi& api, CUgraph graph, const GraphContexts& contexts,
                              ItemGraphFacts* out);

}  // namespace pipefill::cuda
