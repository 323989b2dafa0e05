// Job.cost_info(): pfJobGetCostInfo as a dict - the item cost a job was created with and the one
// the planner learned from its measured slices (src/core/cost_model.hpp), its probes and its
// too-short streak. The native values are taken with the GIL released (the call takes the
// runtime's state lock, which a fill thread may hold while it waits for a Python item); the
// dict is built after, with the GIL.
#include "jobs.hpp"

namespace pfpy {

nb::dict Job::cost_info() {
  pfJobCostInfo_t info{};
  info.size = sizeof info;
  const std::string label = job_label();
  without_gil([&] {
    Use use(core_->life, label.c_str());
    check(pfJobGetCostInfo(core_->job, &info));
  });
  nb::dict d;
  d["config_index"] = info.config_index;
  d["prior_cost_us"] = info.prior_cost_us;
  d["learned_cost_us"] = info.learned_cost_us;
  d["samples"] = info.samples;
  d["probes"] = info.probes;
  d["too_short_streak"] = info.too_short_streak;
  d["too_short_bubbles"] = info.too_short_bubbles;
  d["warned"] = info.warned != 0;
  return d;
}

}  // namespace pfpy
