#include "analysis/activity.hpp"

#include <algorithm>
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

const std::vector<std::string>& default_comm_name_patterns() {
  // Matching the stem anywhere also covers mangled or prefixed names ("void ncclKernel...").
  static const std::vector<std::string> kPatterns = {"nccl", "rccl", "msccl", "nvshmem",
                                                     "userbuffers"};
  return kPatterns;
}

bool is_communication_kernel_name(std::string_view name, const std::vector<std::string>& patterns) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& pattern) {
    return !pattern.empty() && contains_ignoring_case(name, pattern);
  });
}

bool is_communication_kernel_name(std::string_view name) {
  return is_communication_kernel_name(name, default_comm_name_patterns());
}

bool is_bubble_marker(const ActivityRecord& record) {
  return record.kind == ActivityKind::Marker && record.name.rfind(kBubbleMarkerPrefix, 0) == 0;
}

}  // namespace pipefill
