// The graph job kind (pfJobGraph, pfJobCreateGraph): a fill job whose item is one run of a captured
// CUDA graph, gated by the runtime before every item (see pfGraphJobDesc_t in pipefill_graph.h and
// docs/api.md, "Graph fill jobs"). Two pieces live here, so the rest of the core needs to know only
// that a job is gated:
//
//   graph_job_from_desc   validation of the description (the message names the field) into the
//                         job's description part and the device's GraphJobSpec;
//   launch_graph_slice    the launch of one slice of such a job - what a launch callback is for
//                         the other kinds. The slice launcher calls it per slice with the stream
//                         and the slice description it built; it enqueues the device's gated items
//                         (CUDA: one launch of the instantiated gated graph) and nothing else.
#pragma once

#include <cstddef>

#include "core/job_state.hpp"
#include "device/device.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::core {

// Resident bytes of a graph job: the device's scratch words (CUDA: the slice's bubble id and item
// budget, written by the graph's first claim and read by the claims inside its loop).
inline constexpr size_t kGraphJobResidentBytes = kGraphScratchWords * sizeof(uint64_t);

// The layouts this library knows: a caller's desc->size must cover V1; the fields after it
// (available) are read only when the size covers them.
inline constexpr size_t kGraphJobDescSizeV1 = offsetof(pfGraphJobDesc_t, available);
inline constexpr size_t kGraphJobDescSizeV2 = offsetof(pfGraphJobDesc_t, on_item_is_work);
inline constexpr size_t kGraphJobDescSizeV3 = sizeof(pfGraphJobDesc_t);

// Validates `desc` and fills job's description part (kind, name, priority, item count, the one
// configuration, user, teardown) and *spec (all but the words and the stream, which come with the
// job's slot). A failure sets the message and changes nothing else.
pfResult_t graph_job_from_desc(const pfGraphJobDesc_t* desc, JobState* job, GraphJobSpec* spec);

// One slice of a graph job on `stream`. No allocation, no synchronisation (executor side, with the
// state lock held). A failure returns its code with the message set; the caller ends the job.
pfResult_t launch_graph_slice(Device& device, const JobState& job, const pfSliceDesc_t& slice,
                              Stream stream);

}  // namespace pipefill::core
