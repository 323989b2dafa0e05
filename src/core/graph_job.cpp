#include "core/graph_job.hpp"

#include <cmath>

#include "common/error.hpp"

namespace pipefill::core {

pfResult_t graph_job_from_desc(const pfGraphJobDesc_t* desc, JobState* job, GraphJobSpec* spec) {
  if (desc->size < kGraphJobDescSizeV1) {
    return fail(pfErrorInvalidArgument,
                "pfJobCreateGraph: desc->size = {} is smaller than pfGraphJobDesc_t ({} bytes): "
                "start from PF_GRAPH_JOB_DESC_INITIALIZER",
                desc->size, kGraphJobDescSizeV1);
  }
  if (desc->size > PF_MAX_STRUCT_SIZE) {
    return fail(pfErrorInvalidArgument,
                "pfJobCreateGraph: desc->size = {} is implausible (above PF_MAX_STRUCT_SIZE = {}); "
                "start from PF_GRAPH_JOB_DESC_INITIALIZER",
                desc->size, PF_MAX_STRUCT_SIZE);
  }
  const std::string name = desc->name != nullptr ? desc->name : "graph-job";
  if (desc->item_count == 0) {
    return fail(pfErrorInvalidArgument,
                "pfJobCreateGraph: job '{}': desc->item_count = 0 (must be > 0)", name);
  }
  if (!(desc->item_cost_us > 0) || !std::isfinite(desc->item_cost_us)) {
    return fail(pfErrorInvalidArgument,
                "pfJobCreateGraph: job '{}': desc->item_cost_us = {} must be > 0 and finite (the "
                "measured duration of one run of the graph)",
                name, desc->item_cost_us);
  }
  if (desc->parallelism != 0 && desc->parallelism != 1) {
    return fail(pfErrorInvalidArgument,
                "pfJobCreateGraph: job '{}': desc->parallelism = {} must be 0 or 1 (one instance "
                "of the graph runs its items one after another)",
                name, desc->parallelism);
  }
  if (desc->index_word == nullptr) {
    return fail(pfErrorInvalidArgument,
                "pfJobCreateGraph: job '{}': desc->index_word is NULL (the word the graph reads "
                "the item index from)",
                name);
  }
  if (reinterpret_cast<uintptr_t>(desc->index_word) % alignof(uint64_t) != 0) {
    return fail(pfErrorInvalidArgument,
                "pfJobCreateGraph: job '{}': desc->index_word {} is not 8-byte aligned", name,
                static_cast<const void*>(desc->index_word));
  }
  job->kind = pfJobGraph;
  job->name = name;
  job->priority = desc->priority;
  job->item_count = desc->item_count;
  job->user = desc->user;
  job->teardown = desc->teardown;
  job->available = desc->size >= kGraphJobDescSizeV2 ? desc->available : UINT64_MAX;
  JobConfigModel config;
  config.item_cost_us = desc->item_cost_us;
  config.parallelism = 1;
  config.resident_bytes = kGraphJobResidentBytes;
  job->configs.assign(1, config);

  spec->name = name;
  spec->graph = desc->graph;
  spec->index_word = desc->index_word;
  spec->item_count = desc->item_count;
  spec->item_cost_us = desc->item_cost_us;
  spec->on_item = desc->on_item;
  spec->on_item_is_work = desc->size >= kGraphJobDescSizeV3 && desc->on_item_is_work != 0;
  job->cost.fixed = desc->size >= kGraphJobDescSizeV3 && desc->on_item_is_work == 2;
  job->cost.fastest = spec->on_item_is_work;
  spec->user = desc->user;
  return pfSuccess;
}

pfResult_t launch_graph_slice(Device& device, const JobState& job, const pfSliceDesc_t& slice,
                              Stream stream) {
  if (job.graph_items == nullptr) {
    return fail(pfErrorInternal, "graph job '{}' has no prepared graph items (torn down?)",
                job.name);
  }
  return device.launch_graph_items(*job.graph_items, slice, stream);
}

}  // namespace pipefill::core
