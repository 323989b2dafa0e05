// A stage runtime's statistics at one moment (totals, per bubble class, skip causes), and the
// difference of two such moments: what the iterations between them did (engine.hpp
// StageFillSummary's counted_* fields and classes).
#pragma once

#include <vector>

#include "engine.hpp"

namespace engine {

struct StageSnapshot {
  pfStats_t stats{};
  std::vector<pfClassStats_t> classes;
};

// Reads the runtime's statistics (outside any bubble: after pfRuntimeSynchronize).
Status take_stage_snapshot(pfRuntime_t runtime, StageSnapshot* out);

// Fills summary's counted_* fields and classes with `after` minus `before` (a class that did not
// exist at `before` counts from zero).
void summarize_stage(const StageSnapshot& before, const StageSnapshot& after,
                     StageFillSummary* summary);

}  // namespace engine
