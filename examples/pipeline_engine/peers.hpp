// The fill modes side by side (no fill, PipeFill and the peers' mechanisms, engine.hpp FillMode)
// on the same pipeline, fill job, seed and interference, each run on a fresh simulated
// transport; the figures every mode is measured by the same way (sim_transport.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine.hpp"

namespace engine {

struct PeerRow {
  FillMode mode = FillMode::None;
  std::string label;  // the table's name of the row; empty: fill_mode_name(mode)
  double iteration_us = 0.0;   // mean from options.warm_iterations on
  double slowdown_pct = 0.0;   // vs the no-fill run
  double filled_pct = 0.0;     // fill item work inside bubbles / (bubble time x non-comm SMs)
  double throughput = 0.0;     // fill item work / (bubble time x all SMs): vs a dedicated device
  double first_block_p50_us = 0.0, first_block_p99_us = 0.0;  // bubble end -> next main kernel
  double all_blocks_p50_us = 0.0, all_blocks_p99_us = 0.0;    // ... holds every SM it needs
  size_t bubbles = 0;          // bubbles behind the percentiles
  // The zero-slowdown ceiling of filled%: bubble time before the message of the receive that
  // ends each bubble is sent (Transport::FillAccounting::transfer_free_us), over this mode's bubbles.
  double transfer_free_pct = 0.0;
};

// Fill-job items per iteration a comparison gives each stage's job when options.fill_items is 0
// (ours fills at most ~56,000 3.5 us MLP items per iteration and stage of the default pipeline).
inline constexpr uint64_t kComparisonItemsPerIteration = 200000;

// One mode's run with `options` (its mode_knob included), measured against a no-fill run whose
// mean iteration time is `none_iteration_us` (0: this is the no-fill run; slowdown 0). Fails when
// a stage's PipeFill job completed during the run (its filled share would be capped by the
// job's size); options.fill_items 0 gives each job kComparisonItemsPerIteration x iterations.
Status measure_fill_mode(const EngineOptions& options, FillMode mode, double none_iteration_us,
                         PeerRow* row);

// Runs `modes` (FillMode::None first, added when missing) with the same options. Needs
// options.transport "sim" (the peers run only there).
Status compare_fill_modes(const EngineOptions& options, const std::vector<FillMode>& modes,
                          std::vector<PeerRow>* rows);

// The table: one row per mode, its ratios to PipeFill's (the unlabelled PipeFill row: slowdown,
// filled, throughput), the column definitions. Lines start with `prefix`.
std::string format_peer_table(const EngineOptions& options, const std::vector<PeerRow>& rows,
                              const std::string& prefix);

}  // namespace engine
