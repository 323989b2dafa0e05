// Graph fill jobs on CUDA (pfJobGraph): the user's captured graph of one item wrapped, once at
// pfJobCreateGraph, in a graph of the runtime's that checks the gate before every item:
//
//   claim -> WHILE (condition) { child graph (the user's item) -> claim }
//
// "claim" (gated_graph_kernels.cu) is a one-thread kernel making the ticket claim of
// pipefill/item_protocol.hpp (gate, slice budget, item count); it writes the claimed item to the
// job's index word and sets the WHILE condition. One launch of the instantiated graph per slice,
// on the fill stream, after the runtime wrote the slice's bubble id and budget to two words of
// the job's resident share: the overrun past a bubble's end is at most one item, and the cursor
// makes every item run exactly once across bubbles. No CUDA header here (the core's Device seam).
#pragma once

#include <memory>
#include <vector>

#include "device/device.hpp"

namespace pipefill::cuda {

// Validates the CUDA side of `spec` (graph present and made only of kernel, memcpy, memset, empty
// and child-graph nodes, every kernel in the fill stream's context or all in one of
// `capture_contexts` (CUcontexts: the device's private capture contexts, on the fill partition's
// SMs) - read through the driver API, cuda/graph_inspect.hpp; index word in device memory; no
// on_item; conditional nodes available) and builds, instantiates and uploads the gated graph with
// the context of the item's kernels current (CUDA runs a conditional body in one context); its
// launches push that context. `primary_context` (a CUcontext) only names the device's primary
// context in a refusal. A failure names the field or the CUDA call, and leaves nothing behind.
pfResult_t make_gated_graph(const GraphJobSpec& spec, void* primary_context,
                            const std::vector<void*>& capture_contexts, std::unique_ptr<GraphItems>* out);

// The two words launch_gated_graph's caller writes (stream-ordered) before each launch:
// [0] the slice's bubble id, [1] its item budget.
uint64_t* gated_graph_slice_words(GraphItems& items);

// One launch of the instantiated graph on `stream` (a fill stream). No allocation, no sync.
pfResult_t launch_gated_graph(GraphItems& items, void* stream);

// Whether `items` were made by make_gated_graph.
bool is_gated_graph(const GraphItems& items);

}  // namespace pipefill::cuda
