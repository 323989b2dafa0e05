// BM_PeersEngineSim (bench_engine section 6): the peers as fill modes of the multi-stage example
// engine, their slowdown-vs-filled frontiers across each mode's own knob, and the model's ceiling.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../../examples/pipeline_engine/frontier.hpp"
#include "../../examples/pipeline_engine/peers.hpp"

namespace {

using namespace engine;

// The comparison's pipeline: 4 stages, 1F1B, 8 micro-batches, MLP fill, kernels jittered 5%,
// 20 iterations of which the first 2 are not counted, the calibrated interference.
EngineOptions peer_options() {
  EngineOptions o;
  o.transport = "sim";
  o.iterations = 20;
  o.warm_iterations = 2;
  o.fill = "mlp";
  o.keep_every = 0;
  o.jitter = 0.05;
  return o;
}

const std::vector<FillMode> kModes{FillMode::PipeFill, FillMode::Naive, FillMode::FreeRide,
                                   FillMode::Tally, FillMode::PaperStyle};

// 6. The peers as fill modes of the multi-stage example engine (examples/pipeline_engine: engine.hpp
// FillMode, sim_transport.cpp peer_fill, peers.cpp): 4 stages, 1F1B, 8 micro-batches, kernel
// durations jittered 5% (so bubbles vary and predictions matter), MLP inference fill on every
// stage, the calibrated interference; 20 iterations, the first 2 (the predictor's history) not
// counted. Every mode is measured the same way by the simulated transport. The engine's margins
// (engine.hpp): the receive's transfer time before each bubble end, no fraction.
void BM_PeersEngineSim(benchmark::State& state) {
  const EngineOptions o = peer_options();
  std::vector<PeerRow> rows;
  for (auto _ : state) {
    Status s = compare_fill_modes(o, kModes, &rows);
    // Ours again with an engine that also sends the sender's notice (pfBubbleCloseFill).
    PeerRow noticed;
    EngineOptions with_notice = o;
    with_notice.notice_lead_us = kDefaultNoticeLeadUs;
    if (s.ok()) s = measure_fill_mode(with_notice, FillMode::PipeFill, rows.front().iteration_us, &noticed);
    if (!s.ok()) {
      state.SkipWithError(s.message.c_str());
      return;
    }
    noticed.label = "PipeFill+notice";
    rows.push_back(noticed);
  }
  std::printf("[engine-peers] example engine on the simulated transport: %d stages, 1f1b, %d "
              "micro-batches, kernel jitter %.2f, fill mlp, interference beta %.2f beta_f %.2f "
              "gamma %.2f (calibrated; docs/simulated-device.md), %d iterations (first %d not "
              "counted), seed %llu\n",
              o.pipeline.stages, o.pipeline.microbatches, o.jitter, o.interference, o.fill_slowdown,
              o.comm_slowdown, o.iterations, o.warm_iterations,
              static_cast<unsigned long long>(o.seed));
  std::printf("%s", format_peer_table(o, rows, "[engine-peers] ").c_str());
  const PeerRow* ours = nullptr;
  for (const PeerRow& r : rows) {
    if (r.mode == FillMode::PipeFill && r.label.empty()) ours = &r;
    const std::string name = r.label.empty() ? fill_mode_name(r.mode) : "pipefill+notice";
    state.counters[name + "_slowdown_pct"] = r.slowdown_pct;
    state.counters[name + "_filled_pct"] = r.filled_pct;
    state.counters[name + "_throughput"] = r.throughput;
  }
  if (ours == nullptr) return;
  for (const PeerRow& r : rows) {
    if (r.mode != FillMode::PipeFill) continue;
    std::printf("[engine-peers] targets (issue 32), %s: <= 0.5%% slowdown: %s (%.3f%%); >= 90%% "
                "filled: %s (%.1f%%); throughput >= 0.85 of dedicated: %s (%.3f); own p99 <= 50 "
                "us: %s (%.2f us)\n",
                r.label.empty() ? "ours" : "ours with the sender notice",
                r.slowdown_pct <= 0.5 ? "met" : "MISSED", r.slowdown_pct,
                r.filled_pct >= 90 ? "met" : "MISSED", r.filled_pct,
                r.throughput >= 0.85 ? "met" : "MISSED", r.throughput,
                r.all_blocks_p99_us <= 50 ? "met" : "MISSED", r.all_blocks_p99_us);
  }
  for (const PeerRow& r : rows) {
    if (r.mode == FillMode::None || r.mode == FillMode::PipeFill) continue;
    const bool ahead = ours->slowdown_pct < r.slowdown_pct && ours->filled_pct >= r.filled_pct;
    std::printf("[engine-peers] ours vs %s: %s (slowdown %.3f%% vs %.3f%%, filled %.1f%% vs "
                "%.1f%%)\n",
                fill_mode_name(r.mode),
                ahead ? "ahead (less slowdown, equal or more filled)"
                : ours->slowdown_pct < r.slowdown_pct ? "less slowdown, fills less"
                                                      : "MORE slowdown",
                ours->slowdown_pct, r.slowdown_pct, ours->filled_pct, r.filled_pct);
  }
}
BENCHMARK(BM_PeersEngineSim)->Iterations(1)->Unit(benchmark::kMillisecond);

// Sensitivity rows: the same comparison at other (beta = beta_f, gamma).
void BM_PeersEngineSensitivitySim(benchmark::State& state) {
  const EngineOptions o = peer_options();
  for (auto _ : state) {
    for (const auto& [beta, gamma] : {std::pair{0.0, 0.0}, std::pair{0.2, 0.1}, std::pair{1.6, 2.2}}) {
      EngineOptions so = o;
      so.interference = so.fill_slowdown = beta;
      so.comm_slowdown = gamma;
      std::vector<PeerRow> srows;
      const Status s = compare_fill_modes(so, kModes, &srows);
      if (!s.ok()) {
        state.SkipWithError(s.message.c_str());
        return;
      }
      std::string line;
      for (const PeerRow& r : srows)
        if (r.mode != FillMode::None)
          line += fmt::format(" | {} {:.3f}% / {:.1f}%", fill_mode_name(r.mode), r.slowdown_pct,
                              r.filled_pct);
      std::printf("[engine-sensitivity] beta=beta_f=%.1f gamma=%.1f: slowdown / filled%s\n",
                  beta, gamma, line.c_str());
    }
  }
}
BENCHMARK(BM_PeersEngineSensitivitySim)->Iterations(1)->Unit(benchmark::kMillisecond);

// The same engine, every mode across its own knob (frontier.hpp default_knob_sweeps), where ours
// stands against each peer point, and the ceiling the model allows at zero slowdown.
void BM_PeersFrontierSim(benchmark::State& state) {
  const EngineOptions o = peer_options();
  Frontier frontier;
  for (auto _ : state) {
    const Status fs = run_frontier(o, default_knob_sweeps(), &frontier);
    if (!fs.ok()) {
      state.SkipWithError(fs.message.c_str());
      return;
    }
  }
  std::printf("%s", format_frontier(o, frontier, "[engine-frontier] ").c_str());
}
BENCHMARK(BM_PeersFrontierSim)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
