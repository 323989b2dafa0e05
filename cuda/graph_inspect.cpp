#include "graph_inspect.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "cuda_check.hpp"

namespace pipefill::cuda {
namespace {

constexpr int kMaxChildDepth = 8;
constexpr size_t kNodesNamedPerContext = 8;

const char* node_type_name(CUgraphNodeType type) {
  switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return "kernel";
    case CU_GRAPH_NODE_TYPE_MEMCPY: return "memcpy";
    case CU_GRAPH_NODE_TYPE_MEMSET: return "memset";
    case CU_GRAPH_NODE_TYPE_HOST: return "host";
    case CU_GRAPH_NODE_TYPE_GRAPH: return "child graph";
    case CU_GRAPH_NODE_TYPE_EMPTY: return "empty";
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return "event wait";
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return "event record";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL: return "external semaphore signal";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT: return "external semaphore wait";
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: return "memory allocation";
    case CU_GRAPH_NODE_TYPE_MEM_FREE: return "memory free";
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: return "batch memory operation";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return "conditional";
    default: return "unknown";
  }
}

// One kernel node's context and where the node is ("node 3 of child graph 1 of the graph").
struct KernelPlace {
  CUcontext context = nullptr;
  std::string where;
};

class Walker {
 public:
  Walker(const GraphReadApi& api, const GraphContexts& contexts) : api_(api), contexts_(contexts) {}

  pfResult_t walk(CUgraph graph, const std::string& where, int depth) {
    if (depth > kMaxChildDepth)
      return fail(pfErrorInvalidArgument, "desc->graph: child graphs nested deeper than {} ({})",
                  kMaxChildDepth, where);
    size_t count = 0;
    PF_DRIVER_CHECK(api_.get_nodes(graph, nullptr, &count));
    std::vector<CUgraphNode> nodes(count);
    if (count > 0) PF_DRIVER_CHECK(api_.get_nodes(graph, nodes.data(), &count));
    nodes.resize(count);
    for (size_t i = 0; i < nodes.size(); ++i) {
      const std::string place = "node " + std::to_string(i) + " of " + where;
      CUgraphNodeType type{};
      PF_DRIVER_CHECK(api_.node_get_type(nodes[i], &type));
      switch (type) {
        case CU_GRAPH_NODE_TYPE_KERNEL: {
          CUDA_KERNEL_NODE_PARAMS_v2 params{};
          PF_DRIVER_CHECK(api_.kernel_node_get_params(nodes[i], &params));
          facts_.blocks += static_cast<uint64_t>(params.gridDimX) * params.gridDimY * params.gridDimZ;
          ++facts_.kernel_nodes;
          kernels_.push_back({params.ctx, place});
          break;
        }
        case CU_GRAPH_NODE_TYPE_MEMCPY:
        case CU_GRAPH_NODE_TYPE_MEMSET:
        case CU_GRAPH_NODE_TYPE_EMPTY:
          break;
        case CU_GRAPH_NODE_TYPE_GRAPH: {
          CUgraph child = nullptr;
          PF_DRIVER_CHECK(api_.child_graph(nodes[i], &child));
          PF_TRY(walk(child, "child graph " + std::to_string(i) + " of " + where, depth + 1));
          break;
        }
        default:
          return fail(pfErrorInvalidArgument,
                      "desc->graph: {} is a {} node; a graph fill job's item may hold only kernel, "
                      "memcpy, memset, empty and child-graph nodes (no allocation, no host "
                      "synchronisation, no events or conditionals)",
                      place, node_type_name(type));
      }
    }
    return pfSuccess;
  }

  // A kernel whose context the driver reports and that is not the fill context breaks the
  // one-context rule of conditional bodies (nullptr: the driver reports none; accepted).
  // Kernels captured in a private capture context (all of them there) are accepted in it.
  pfResult_t check_contexts() {
    if (contexts_.fill == nullptr) return pfSuccess;
    expected_ = contexts_.fill;
    for (const KernelPlace& kernel : kernels_)
      if (kernel.context != nullptr) {
        if (std::find(contexts_.capture.begin(), contexts_.capture.end(), kernel.context) != contexts_.capture.end())
          expected_ = kernel.context;
        break;
      }
    const KernelPlace* first_wrong = nullptr;
    for (const KernelPlace& kernel : kernels_)
      if (kernel.context != nullptr && kernel.context != expected_) {
        first_wrong = &kernel;
        break;
      }
    if (first_wrong == nullptr) return pfSuccess;
    return fail(pfErrorInvalidArgument,
                "desc->graph: kernel {} belongs to context {}, not to the fill partition's context "
                "{}: every kernel of the item must belong to the fill partition's context, or all to one "
                "capture context (CUDA "
                "runs a conditional body in one context). Kernel nodes by context: {}. Capture the "
                "graph on a stream of pfGraphCaptureStreamCreate with that stream's context current "
                "(pfGraphCaptureContextPush; pipefill.torch.graph_fill_job does both)",
                first_wrong->where, describe(first_wrong->context), describe(expected_),
                by_context());
  }

  ItemGraphFacts facts() const {
    ItemGraphFacts facts = facts_;
    facts.kernel_context = expected_;
    return facts;
  }

 private:
  std::string describe(CUcontext context) const {
    std::string text = fmt::format("{}", static_cast<void*>(context));
    if (context == nullptr) return text + " (not reported by the driver)";
    if (context == contexts_.fill && context == contexts_.primary)
      return text + " (the device's primary context, which holds the fill partition)";
    if (context == contexts_.fill) return text + " (the fill partition's green context)";
    if (context == contexts_.primary) return text + " (the device's primary context)";
    if (std::find(contexts_.capture.begin(), contexts_.capture.end(), context) != contexts_.capture.end())
      return text + " (a capture context of the fill partition)";
    return text + " (another context)";
  }

  // "<context>: node 0 of the graph, node 2 of the graph; <context>: ..." in first-seen order.
  std::string by_context() const {
    std::vector<std::pair<CUcontext, std::vector<const std::string*>>> groups;
    for (const KernelPlace& kernel : kernels_) {
      auto it = groups.begin();
      while (it != groups.end() && it->first != kernel.context) ++it;
      if (it == groups.end()) it = groups.insert(groups.end(), {kernel.context, {}});
      it->second.push_back(&kernel.where);
    }
    std::string text;
    for (const auto& [context, places] : groups) {
      if (!text.empty()) text += "; ";
      text += describe(context) + ": ";
      for (size_t i = 0; i < places.size() && i < kNodesNamedPerContext; ++i)
        text += (i > 0 ? ", " : "") + *places[i];
      if (places.size() > kNodesNamedPerContext)
        text += fmt::format(" and {} more", places.size() - kNodesNamedPerContext);
    }
    return text;
  }

  const GraphReadApi& api_;
  const GraphContexts& contexts_;
  CUcontext expected_ = nullptr;  // the context every kernel must belong to (check_contexts)
  ItemGraphFacts facts_;
  std::vector<KernelPlace> kernels_;
};

}  // namespace

GraphReadApi GraphReadApi::from(const DriverApi& api) {
  GraphReadApi read;
  read.get_nodes = api.graph_get_nodes;
  read.node_get_type = api.graph_node_get_type;
  read.kernel_node_get_params = api.graph_kernel_node_get_params;
  read.child_graph = api.graph_child_graph_node_get_graph;
  return read;
}

std::string GraphReadApi::missing() const {
  std::string names;
  const std::pair<bool, const char*> entries[] = {
      {get_nodes != nullptr, "cuGraphGetNodes@10000"},
      {node_get_type != nullptr, "cuGraphNodeGetType@10000"},
      {kernel_node_get_params != nullptr, "cuGraphKernelNodeGetParams@12000"},
      {child_graph != nullptr, "cuGraphChildGraphNodeGetGraph@10000"}};
  for (const auto& [present, name] : entries) {
    if (present) continue;
    if (!names.empty()) names += ", ";
    names += name;
  }
  return names;
}

pfResult_t inspect_item_graph(const GraphReadApi& api, CUgraph graph, const GraphContexts& contexts,
                              ItemGraphFacts* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "inspect_item_graph: out is null");
  if (graph == nullptr) return fail(pfErrorInvalidArgument, "desc->graph is NULL");
  if (const std::string missing = api.missing(); !missing.empty())
    return fail(pfErrorNotSupported,
                "graph fill jobs read the item graph through the driver API, and the driver lacks "
                "{}",
                missing);
  Walker walker(api, contexts);
  PF_TRY(walker.walk(graph, "the graph", 0));
  PF_TRY(walker.check_contexts());
  *out = walker.facts();
  return pfSuccess;
}

}  // namespace pipefill::cuda
