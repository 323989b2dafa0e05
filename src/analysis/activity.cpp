#include "analysis/activity.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

namespace pipefill {

const char* activity_kind_name(ActivityKind kind) {
  switch (kind) {
    case ActivityKind::Kernel: return "kernel";
    case ActivityKind::Comm: return "comm";
    case ActivityKind::Fill: return "fill";
    case ActivityKind::Memcpy: return "memcpy";
    case ActivityKind::Memset: return "memset";
    case ActivityKind::MemoryAlloc: return "memory_alloc";
    case ActivityKind::MemoryFree: return "memory_free";
    case ActivityKind::Marker: return "marker";
  }
  return "unknown";
}

namespace {

bool contains_ignoring_case(std::string_view haystack, std::string_view needle) {
  const auto it = std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end(),
                              [](char a, char b) {
                                return std::tolower(static_cast<unsigned char>(a)) ==
                                       std::tolower(static_cast<unsigned char>(b));
                              });
  return it != haystack.end();
}

}  // namespace

bool is_communication_kernel_name(const std::string& name) {
  // NCCL's kernels are ncclKernel_* (<= 2.18) and ncclDevKernel_* (>= 2.19); RCCL and MSCCL
  // keep the same stem. Matching the stem anywhere also covers mangled "void ncclKernel...".
  static constexpr std::array<std::string_view, 3> kStems = {"nccl", "rccl", "msccl"};
  return std::any_of(kStems.begin(), kStems.end(),
                     [&](std::string_view stem) { return contains_ignoring_case(name, stem); });
}

bool is_bubble_marker(const ActivityRecord& record) {
  return record.kind == ActivityKind::Marker && record.name.rfind(kBubbleMarkerPrefix, 0) == 0;
}

}  // namespace pipefill
