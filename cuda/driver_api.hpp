// Driver-API functions the backend needs, reached through cudaGetDriverEntryPointByVersion so
// that nothing links libcuda: binaries start on machines without a driver, and each function is
// simply absent (nullptr) when the installed driver is too old to provide it.
//
// Every entry point is requested at the ABI version of the `PFN_<symbol>_v<version>` typedef in
// <cudaTypedefs.h> whose signature we call. The list below is the single place that names both:
// each member's type is that typedef (token-pasted from the same version number that is
// requested), so a version for which the header has no typedef does not compile, and
// tests/cuda/cpu_side_test.cpp checks the list against the header text as well. A symbol
// requested below the version that introduced it resolves to nothing, silently: that is how
// cuGreenCtxStreamCreate (introduced in 12.5, typedef ..._v12050) was once requested at 12040
// and every device ran in grid-cap mode.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace pipefill::cuda {

// X(member, symbol, version, group). group: Core (wanted on every driver that has the symbol),
// GreenContext (all of them are needed for the green-context partition). One symbol may appear
// at two versions when their signatures differ (cuCtxGetDevice: the current context's device at
// 2000, any context's at 13000).
//
// Graphs the library did not build (a user's, torch's, cuBLAS's) are read only through the
// graph_* entry points, never the runtime's cudaGraph*: our CUDA runtime is linked statically and
// never registered torch's or cuBLAS's kernels, so its cudaGraphKernelNodeGetParams returns
// cudaErrorInvalidDeviceFunction for their nodes (issue 24; cuda/graph_inspect.hpp).
#define PIPEFILL_DRIVER_ENTRY_POINTS(X)                                        \
  X(get_error_name, cuGetErrorName, 6000, Core)                                \
  X(device_get, cuDeviceGet, 2000, Core)                                       \
  X(stream_write_value64, cuStreamWriteValue64, 11070, Core)                   \
  X(ctx_push_current, cuCtxPushCurrent, 4000, Core)                            \
  X(ctx_pop_current, cuCtxPopCurrent, 4000, Core)                              \
  X(ctx_get_current, cuCtxGetCurrent, 4000, Core)                              \
  X(stream_get_ctx, cuStreamGetCtx, 9020, Core)                                \
  X(ctx_get_device, cuCtxGetDevice, 2000, Core)                               \
  X(ctx_get_device_of, cuCtxGetDevice, 13000, Core)                            \
  X(device_primary_ctx_retain, cuDevicePrimaryCtxRetain, 7000, Core)           \
  X(device_primary_ctx_release, cuDevicePrimaryCtxRelease, 11000, Core)        \
  X(stream_get_id, cuStreamGetId, 12000, Core)                                 \
  X(graph_get_nodes, cuGraphGetNodes, 10000, Core)                             \
  X(graph_node_get_type, cuGraphNodeGetType, 10000, Core)                      \
  X(graph_kernel_node_get_params, cuGraphKernelNodeGetParams, 12000, Core)     \
  X(graph_child_graph_node_get_graph, cuGraphChildGraphNodeGetGraph, 10000, Core) \
  X(graph_add_child_graph_node, cuGraphAddChildGraphNode, 10000, Core)         \
  X(ctx_from_green_ctx, cuCtxFromGreenCtx, 12040, GreenContext)                \
  X(device_get_dev_resource, cuDeviceGetDevResource, 12040, GreenContext)      \
  X(dev_sm_resource_split_by_count, cuDevSmResourceSplitByCount, 12040, GreenContext) \
  X(dev_resource_generate_desc, cuDevResourceGenerateDesc, 12040, GreenContext) \
  X(green_ctx_create, cuGreenCtxCreate, 12040, GreenContext)                   \
  X(green_ctx_stream_create, cuGreenCtxStreamCreate, 12050, GreenContext)      \
  X(green_ctx_destroy, cuGreenCtxDestroy, 12040, GreenContext)

enum class EntryPointGroup { Core, GreenContext };

// One row of the list, for tests and logs.
struct EntryPointInfo {
  const char* member;
  const char* symbol;
  int version;  // CUDA version encoding: 12050 = 12.5
  EntryPointGroup group;
};

#define PIPEFILL_ENTRY_POINT_INFO(member, symbol, version, group) \
  EntryPointInfo{#member, #symbol, version, EntryPointGroup::group},
inline constexpr EntryPointInfo kDriverEntryPoints[] = {
    PIPEFILL_DRIVER_ENTRY_POINTS(PIPEFILL_ENTRY_POINT_INFO)};
#undef PIPEFILL_ENTRY_POINT_INFO

// Oldest driver with every entry point of a group (the largest version in the group).
constexpr int oldest_driver_for(EntryPointGroup group) {
  int version = 0;
  for (const EntryPointInfo& entry : kDriverEntryPoints)
    if (entry.group == group && entry.version > version) version = entry.version;
  return version;
}

// Oldest driver with each feature (CUDA version encoding).
inline constexpr int kGreenContextDriverVersion = oldest_driver_for(EntryPointGroup::GreenContext);
inline constexpr int kStreamWriteValue64DriverVersion = 11070;
static_assert(kGreenContextDriverVersion == 12050, "green contexts need cuGreenCtxStreamCreate (12.5)");

struct DriverApi {
  int driver_version = 0;  // cudaDriverGetVersion (0: no driver)

#define PIPEFILL_ENTRY_POINT_MEMBER(member, symbol, version, group) \
  PFN_##symbol##_v##version member = nullptr;
  PIPEFILL_DRIVER_ENTRY_POINTS(PIPEFILL_ENTRY_POINT_MEMBER)
#undef PIPEFILL_ENTRY_POINT_MEMBER

  bool has_green_contexts() const {
    return device_get && device_get_dev_resource && dev_sm_resource_split_by_count &&
           dev_resource_generate_desc && green_ctx_create && green_ctx_stream_create &&
           green_ctx_destroy;
  }
  // Why green contexts are unavailable ("" when they are available).
  const char* green_context_absence_reason() const;
  // Entry points of `group` that did not resolve, comma-separated ("" when none).
  std::string missing_entry_points(EntryPointGroup group) const;
};

// Resolved once per process (thread-safe); every pointer may be null.
const DriverApi& driver_api();

}  // namespace pipefill::cuda
