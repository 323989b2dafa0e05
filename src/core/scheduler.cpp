#include "core/scheduler.hpp"

#include <algorithm>
#include <strings.h>

namespace pipefill {

std::vector<size_t> schedule_order(pfSchedulePolicy_t policy, std::span<const JobSchedView> jobs) {
  std::vector<size_t> order;
  order.reserve(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].runnable) order.push_back(i);
  }
  // Every comparator ends with `sequence`, so the order is total and deterministic.
  auto by_sequence = [&](size_t a, size_t b) { return jobs[a].sequence < jobs[b].sequence; };
  switch (policy) {
    case pfPolicyPriority:
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (jobs[a].priority != jobs[b].priority) return jobs[a].priority > jobs[b].priority;
        return by_sequence(a, b);
      });
      break;
    case pfPolicyShortestRemaining:
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (jobs[a].remaining_work_us != jobs[b].remaining_work_us)
          return jobs[a].remaining_work_us < jobs[b].remaining_work_us;
        return by_sequence(a, b);
      });
      break;
    case pfPolicyFairShare:
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (jobs[a].received_bubble_us != jobs[b].received_bubble_us)
          return jobs[a].received_bubble_us < jobs[b].received_bubble_us;
        return by_sequence(a, b);
      });
      break;
    case pfPolicyFifo:
    default:
      std::sort(order.begin(), order.end(), by_sequence);
      break;
  }
  return order;
}

const char* policy_name(pfSchedulePolicy_t policy) {
  switch (policy) {
    case pfPolicyFifo: return "fifo";
    case pfPolicyPriority: return "priority";
    case pfPolicyShortestRemaining: return "srpt";
    case pfPolicyFairShare: return "fair";
  }
  return "unknown";
}

bool parse_policy(const char* text, pfSchedulePolicy_t* out) {
  if (text == nullptr || out == nullptr) return false;
  if (strcasecmp(text, "fifo") == 0) *out = pfPolicyFifo;
  else if (strcasecmp(text, "priority") == 0) *out = pfPolicyPriority;
  else if (strcasecmp(text, "srpt") == 0 || strcasecmp(text, "shortest-remaining") == 0)
    *out = pfPolicyShortestRemaining;
  else if (strcasecmp(text, "fair") == 0 || strcasecmp(text, "fair-share") == 0)
    *out = pfPolicyFairShare;
  else return false;
  return true;
}

}  // namespace pipefill
