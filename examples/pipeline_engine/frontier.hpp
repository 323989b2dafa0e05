// The fill modes' slowdown-vs-filled frontiers (issue 32 item 4): every mode (PipeFill and the
// peers of peers.hpp) run across its own knob (EngineOptions::mode_knob) on the same pipeline,
// fill job, seed and interference, where ours stands against each peer point, and the ceiling
// the model allows at zero slowdown.
#pragma once

#include <string>
#include <vector>

#include "peers.hpp"

namespace engine {

struct KnobSweep {
  FillMode mode = FillMode::PipeFill;
  const char* knob = "";        // what mode_knob means for this mode
  std::vector<double> values;   // the knob's values, the mode's default among them
  double default_value = 0.0;   // the value its headline row runs with
  // The values are EngineOptions::notice_lead_us (the sending stage's notice, pfBubbleCloseFill)
  // instead of mode_knob: PipeFill with an engine that also tells each receiver when the send
  // is near. Its points are printed as "PipeFill+notice" and kept off ours' plain curve.
  bool notice_lead = false;
  // The values are EngineOptions::margin_us instead (the runtime's safety margin before every
  // bubble's end; >= 0, and with it no per-class margins), mode_knob at its default: PipeFill's
  // second knob, with less margin than the receive's transfer (84 us) the gate lets items run
  // beside the message's bytes. Its points are on ours' plain curve. Not with notice_lead.
  bool margin = false;
  // With margin: the gated quantile (EngineOptions::mode_knob) the margin sweep runs at; < 0:
  // the mode's default. Ours' two knobs together: a high quantile sizes each slice to the
  // class's long bubbles, and less margin lets it run beside the bytes.
  double at_quantile = -1.0;
};

// PipeFill: gated quantile, its safety margin (us) at the default quantile and at quantile 1,
// then its notice lead (us); naive: share of the expected bubble; FreeRide-style: admission pad;
// Tally-style: SM share; paper-style: prediction quantile (engine.hpp EngineOptions::mode_knob).
std::vector<KnobSweep> default_knob_sweeps();

struct FrontierPoint {
  FillMode mode = FillMode::None;
  const char* knob = "";
  double value = 0.0;
  bool is_default = false;
  bool notice = false;  // KnobSweep::notice_lead
  PeerRow row;
};

struct Frontier {
  PeerRow none;                       // the no-fill run every point is measured against
  std::vector<FrontierPoint> points;  // in sweep order
};

Status run_frontier(const EngineOptions& options, const std::vector<KnobSweep>& sweeps,
                    Frontier* out);

// Ours' slowdown at `filled_pct` on its plain curve (the gated-quantile and margin points, no
// notice; straight lines between its points, the lowest where the curve folds back); false when
// no point of ours fills that much.
bool ours_slowdown_at(const Frontier& frontier, double filled_pct, double* slowdown_pct);

// The table (one line per point, each peer point with ours' slowdown at its filled share and the
// verdict), the zero-slowdown ceiling and the targets' distance to it. Lines start with `prefix`.
std::string format_frontier(const EngineOptions& options, const Frontier& frontier,
                            const std::string& prefix);

}  // namespace engine
