// An independent timeline oracle and dependency checker for schedule tests. It does not share
// code with src/schedule: it times a per-stage op order by relaxation to a fixed point (every
// op's start = max(previous op's end on its stage, its dependency's end + link)), with its own
// placement function and its own durations, then checks the result:
//  - every op is on the stage that holds its virtual stage,
//  - every (virtual stage, micro-batch) is forwarded exactly once and backwarded exactly once
//    (a full B, or an I and a W),
//  - no stage runs two ops at once,
//  - every forward starts after the previous virtual stage's forward of the micro-batch has
//    ended and its activation has arrived (send + link <= receive), every backward after the
//    next virtual stage's backward + link (the last virtual stage's after its own forward), every
//    backward after its own forward, every W after its I.
#pragma once

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "schedule/schedule.hpp"

namespace pipefill::schedule::oracle {

struct Timed {
  double start = std::numeric_limits<double>::quiet_NaN();
  double end = std::numeric_limits<double>::quiet_NaN();
};

struct Result {
  bool ok = false;
  std::string error;
  std::vector<std::vector<Timed>> times;  // [stage][op]
  double pipeline_us = 0.0;
};

// Placement written out independently of the library.
inline int looped_stage(int p, int vs) { return vs % p; }
inline int v_stage(int p, int vs) { return vs < p ? vs : 2 * p - 1 - vs; }

inline double duration(const ScheduleSpec& spec, int stage, OpType type) {
  StageCosts c;
  if (!spec.costs.empty()) c = spec.costs[static_cast<size_t>(stage)];
  const double v = spec.chunks;
  switch (type) {
    case OpType::Forward: return c.forward_us / v;
    case OpType::Backward: return c.backward_us / v;
    case OpType::BackwardInput: return (c.backward_us - c.weight_us) / v;
    case OpType::BackwardWeight: return c.weight_us / v;
    default: return 0.0;
  }
}

inline Result run(const ScheduleSpec& spec, const std::vector<std::vector<Op>>& order,
                  const std::function<int(int)>& stage_of) {
  Result r;
  const int p = spec.stages, m = spec.microbatches;
  const int vsn = p * spec.chunks;
  const double link = spec.p2p_latency_us +
                      (spec.p2p_bytes_per_us > 0 ? static_cast<double>(spec.p2p_message_bytes) / spec.p2p_bytes_per_us : 0.0);
  if (static_cast<int>(order.size()) != p) {
    r.error = fmt::format("{} op lists for {} stages", order.size(), p);
    return r;
  }
  // (letter, vs, mb) -> (stage, index); letters: 'F', 'B' (full or input part), 'W', 'X' (full B).
  std::map<std::tuple<char, int, int>, std::pair<int, size_t>> where;
  for (int s = 0; s < p; ++s) {
    for (size_t i = 0; i < order[s].size(); ++i) {
      const Op& op = order[s][i];
      if (op.virtual_stage < 0 || op.virtual_stage >= vsn || op.microbatch < 0 || op.microbatch >= m) {
        r.error = fmt::format("stage {} op {}: virtual stage {} / micro-batch {} out of range", s, i, op.virtual_stage,
                              op.microbatch);
        return r;
      }
      if (stage_of(op.virtual_stage) != s) {
        r.error = fmt::format("stage {} op {} runs virtual stage {}, which lives on stage {}", s, i, op.virtual_stage,
                              stage_of(op.virtual_stage));
        return r;
      }
      char letter = '?';
      if (op.type == OpType::Forward) letter = 'F';
      else if (op.type == OpType::Backward || op.type == OpType::BackwardInput) letter = 'B';
      else if (op.type == OpType::BackwardWeight) letter = 'W';
      if (letter == '?') {
        r.error = fmt::format("stage {} op {} is not a compute op", s, i);
        return r;
      }
      if (!where.emplace(std::make_tuple(letter, op.virtual_stage, op.microbatch), std::make_pair(s, i)).second) {
        r.error = fmt::format("stage {} op {}: {} of virtual stage {} micro-batch {} runs twice", s, i, letter,
                              op.virtual_stage, op.microbatch);
        return r;
      }
      if (op.type == OpType::Backward) where.emplace(std::make_tuple('X', op.virtual_stage, op.microbatch), std::make_pair(s, i));
    }
  }
  for (int vs = 0; vs < vsn; ++vs) {
    for (int mb = 0; mb < m; ++mb) {
      const bool f = where.count({'F', vs, mb}), b = where.count({'B', vs, mb}), full = where.count({'X', vs, mb}),
                 w = where.count({'W', vs, mb});
      if (!f || !b || (full == w)) {
        r.error = fmt::format("virtual stage {} micro-batch {}: F {} B/I {} full-B {} W {}", vs, mb, f, b, full, w);
        return r;
      }
    }
  }
  r.times.resize(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) r.times[s].resize(order[s].size());
  auto end_of = [&](char letter, int vs, int mb) {
    const auto& [s, i] = where.at({letter, vs, mb});
    return r.times[s][i].end;
  };
  size_t total = 0;
  for (const auto& ops : order) total += ops.size();
  bool changed = true;
  for (size_t pass = 0; changed && pass <= total + 1; ++pass) {
    changed = false;
    for (int s = 0; s < p; ++s) {
      double t = 0.0;
      for (size_t i = 0; i < order[s].size(); ++i) {
        const Op& op = order[s][i];
        double dep = 0.0;
        if (op.type == OpType::Forward && op.virtual_stage > 0) {
          dep = end_of('F', op.virtual_stage - 1, op.microbatch) + (stage_of(op.virtual_stage - 1) != s ? link : 0.0);
        } else if (op.type == OpType::Backward || op.type == OpType::BackwardInput) {
          dep = op.virtual_stage + 1 < vsn
                    ? end_of('B', op.virtual_stage + 1, op.microbatch) + (stage_of(op.virtual_stage + 1) != s ? link : 0.0)
                    : end_of('F', op.virtual_stage, op.microbatch);
        } else if (op.type == OpType::BackwardWeight) {
          dep = end_of('B', op.virtual_stage, op.microbatch);
        }
        const double start = std::max(t, dep);  // NaN propagates while a dependency is unknown
        if (std::isnan(dep)) break;
        const double end = start + duration(spec, s, op.type);
        Timed& slot = r.times[s][i];
        if (!(slot.end == end)) changed = true;
        slot.start = start;
        slot.end = end;
        t = end;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    for (size_t i = 0; i < order[s].size(); ++i) {
      if (std::isnan(r.times[s][i].end)) {
        r.error = fmt::format("deadlock: stage {} never runs op {}", s, i);
        return r;
      }
      r.pipeline_us = std::max(r.pipeline_us, r.times[s][i].end);
    }
  }
  // Checks on the times.
  constexpr double eps = 1e-9;
  for (int s = 0; s < p; ++s) {
    for (size_t i = 0; i < order[s].size(); ++i) {
      const Op& op = order[s][i];
      const Timed& t = r.times[s][i];
      if (i > 0 && t.start < r.times[s][i - 1].end - eps) {
        r.error = fmt::format("stage {} runs ops {} and {} at once", s, i - 1, i);
        return r;
      }
      const int vs = op.virtual_stage;
      if (op.type == OpType::Forward && vs > 0 &&
          t.start < end_of('F', vs - 1, op.microbatch) + (stage_of(vs - 1) != s ? link : 0.0) - eps) {
        r.error = fmt::format("stage {} op {}: forward before its activation arrives", s, i);
        return r;
      }
      if (op.type == OpType::Backward || op.type == OpType::BackwardInput) {
        if (t.start < end_of('F', vs, op.microbatch) - eps) {
          r.error = fmt::format("stage {} op {}: backward before its forward", s, i);
          return r;
        }
        if (vs + 1 < vsn && t.start < end_of('B', vs + 1, op.microbatch) + (stage_of(vs + 1) != s ? link : 0.0) - eps) {
          r.error = fmt::format("stage {} op {}: backward before its gradient arrives", s, i);
          return r;
        }
      }
      if (op.type == OpType::BackwardWeight && t.start < end_of('B', vs, op.microbatch) - eps) {
        r.error = fmt::format("stage {} op {}: W before its I", s, i);
        return r;
      }
    }
  }
  r.ok = true;
  return r;
}

}  // namespace pipefill::schedule::oracle
