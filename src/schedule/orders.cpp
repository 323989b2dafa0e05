// Op-order generators. Each follows the named reference implementation's order exactly (the
// "None" idle slots PyTorch puts in its pipeline_order are not ops: our timing derives the idle
// time from the dependencies). References, read for this port (not copied):
//  - PyTorch torch/distributed/pipelining/schedules.py (pytorch/pytorch at 00722e64):
//    ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble (_get_1f1b_rank_ops), ScheduleLoopedBFS,
//    ScheduleZBVZeroBubble, ScheduleDualPipeV (_calculate_single_rank_operations).
//  - Megatron-LM megatron/core/pipeline_parallel/schedules.py (NVIDIA/Megatron-LM at 00611e6e):
//    get_schedule_table, get_pp_rank_microbatches (interleaved warm-up count).
//  - Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 (ZB-H1, ZB-V).
#include "schedule/orders.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

namespace pipefill::schedule::detail {
namespace {

Op compute_op(OpType type, int microbatch, int chunk) {
  Op op;
  op.type = type;
  op.microbatch = microbatch;
  op.chunk = chunk;
  return op;
}

}  // namespace

void gpipe_order(int p, int m, Orders* out) {
  for (int s = 0; s < p; ++s) {
    auto& ops = (*out)[s];
    for (int mb = 0; mb < m; ++mb) ops.push_back(compute_op(OpType::Forward, mb, 0));
    for (int mb = 0; mb < m; ++mb) ops.push_back(compute_op(OpType::Backward, mb, 0));
  }
}

void one_f_one_b_order(int p, int m, Orders* out) {
  for (int s = 0; s < p; ++s) {
    auto& ops = (*out)[s];
    const int warmup = std::min(p - 1 - s, m);
    for (int mb = 0; mb < warmup; ++mb) ops.push_back(compute_op(OpType::Forward, mb, 0));
    for (int i = 0; i < m - warmup; ++i) {
      ops.push_back(compute_op(OpType::Forward, warmup + i, 0));
      ops.push_back(compute_op(OpType::Backward, i, 0));
    }
    for (int mb = m - warmup; mb < m; ++mb) ops.push_back(compute_op(OpType::Backward, mb, 0));
  }
}

// ZB-H1: the backward is split into B (input gradient, on the critical path to the previous
// stage) and W (weight gradient, deferrable). F and B follow 1F1B's order; stage s defers its W
// passes by s micro-batches in the steady phase (after B_i comes W_{i-s}), and in the cool-down
// phase runs one pending W after each B, so the W passes fill the gaps where 1F1B waits for the
// next gradient; the remaining W passes end the stage. Peak activations (a micro-batch's inputs
// live until its W): p on every stage, 1F1B's peak on stage 0, as in the paper. Uniform costs
// with t_w <= t_f give the paper's bubble (p-1)(t_f + t_b - t_w), t_b the B part. For m >= p-1
// this is PyTorch's ScheduleInterleavedZeroBubble with one chunk; for m < p-1 PyTorch emits
// fewer cool-down Ws before the tail (a legitimate variant with the same op set).
void zbh1_order(int p, int m, Orders* out) {
  for (int s = 0; s < p; ++s) {
    auto& ops = (*out)[s];
    const int warmup = std::min(p - 1 - s, m);
    const int deferred = s;
    int next_w = 0;
    for (int mb = 0; mb < warmup; ++mb) ops.push_back(compute_op(OpType::Forward, mb, 0));
    for (int i = 0; i < m - warmup; ++i) {
      ops.push_back(compute_op(OpType::Forward, warmup + i, 0));
      ops.push_back(compute_op(OpType::BackwardInput, i, 0));
      if (i >= deferred) ops.push_back(compute_op(OpType::BackwardWeight, next_w++, 0));
    }
    for (int mb = m - warmup; mb < m; ++mb) {
      ops.push_back(compute_op(OpType::BackwardInput, mb, 0));
      ops.push_back(compute_op(OpType::BackwardWeight, next_w++, 0));
    }
    while (next_w < m) ops.push_back(compute_op(OpType::BackwardWeight, next_w++, 0));
  }
}

void schedule_table(int m, int v, int group, std::vector<int>* microbatch, std::vector<int>* chunk) {
  microbatch->clear();
  chunk->clear();
  microbatch->reserve(static_cast<size_t>(m) * static_cast<size_t>(v));
  chunk->reserve(static_cast<size_t>(m) * static_cast<size_t>(v));
  for (int first = 0; first < m; first += group) {
    // Megatron: `if first + group >= m` the group runs to m (the remainder group).
    const int last = (static_cast<long long>(first) + group >= m) ? m : first + group;
    for (int c = 0; c < v; ++c) {
      for (int mb = first; mb < last; ++mb) {
        microbatch->push_back(mb);
        chunk->push_back(c);
      }
    }
    if (last == m) break;
  }
}

// Interleaved 1F1B (Narayanan et al. 2021; Megatron-LM forward_backward_pipelining_with_interleaving
// and PyTorch ScheduleInterleaved1F1B, which coincide for equal groups): virtual micro-batch k
// runs forward on table entry k and backward on entry k with the chunk reversed. Warm-up:
// 2 (p-s-1) + (v-1) g forwards, capped at m v (current Megatron and PyTorch: no special case for
// m == p); then pairs F(warm-up + i), B(i); then the remaining backwards.
void interleaved_1f1b_order(int p, int m, int v, int group, Orders* out) {
  std::vector<int> mb_of, chunk_of;
  schedule_table(m, v, group, &mb_of, &chunk_of);
  const long long total = static_cast<long long>(m) * v;
  auto forward = [&](long long k) { return compute_op(OpType::Forward, mb_of[k], chunk_of[k]); };
  auto backward = [&](long long k) { return compute_op(OpType::Backward, mb_of[k], v - 1 - chunk_of[k]); };
  for (int s = 0; s < p; ++s) {
    auto& ops = (*out)[s];
    ops.reserve(static_cast<size_t>(2 * total));
    const long long warmup = std::min<long long>(2LL * (p - s - 1) + static_cast<long long>(v - 1) * group, total);
    for (long long k = 0; k < warmup; ++k) ops.push_back(forward(k));
    for (long long i = 0; i < total - warmup; ++i) {
      ops.push_back(forward(warmup + i));
      ops.push_back(backward(i));
    }
    for (long long k = total - warmup; k < total; ++k) ops.push_back(backward(k));
  }
}

// Interleaved zero bubble, ZB1P (PyTorch ScheduleInterleavedZeroBubble via _get_1f1b_rank_ops
// with enable_zero_bubble): warm-up (v-1) g + (p-1-s) forwards; then for the j-th backward:
// the next forward (while any are left), B-input(j), and W(j - s) once j >= s (W of the
// backward s places earlier, same chunk and micro-batch); the last s Ws end the stage.
void interleaved_zb_order(int p, int m, int v, int group, Orders* out) {
  std::vector<int> mb_of, chunk_of;
  schedule_table(m, v, group, &mb_of, &chunk_of);
  const long long total = static_cast<long long>(m) * v;
  for (int s = 0; s < p; ++s) {
    auto& ops = (*out)[s];
    ops.reserve(static_cast<size_t>(3 * total));
    const long long warmup = std::min<long long>(static_cast<long long>(v - 1) * group + (p - 1 - s), total);
    for (long long k = 0; k < warmup; ++k) ops.push_back(compute_op(OpType::Forward, mb_of[k], chunk_of[k]));
    long long next_w = 0;
    for (long long j = 0; j < total; ++j) {
      if (warmup + j < total)
        ops.push_back(compute_op(OpType::Forward, mb_of[warmup + j], chunk_of[warmup + j]));
      ops.push_back(compute_op(OpType::BackwardInput, mb_of[j], v - 1 - chunk_of[j]));
      if (j >= s) {
        ops.push_back(compute_op(OpType::BackwardWeight, mb_of[next_w], v - 1 - chunk_of[next_w]));
        ++next_w;
      }
    }
    for (; next_w < total; ++next_w)
      ops.push_back(compute_op(OpType::BackwardWeight, mb_of[next_w], v - 1 - chunk_of[next_w]));
  }
}

// Looped BFS (Lamy-Poirier, "Breadth-First Pipeline Parallelism", 2023; PyTorch
// ScheduleLoopedBFS): every chunk in order runs all micro-batches forward, then the chunks in
// reverse order run all micro-batches backward, the micro-batches in reverse order too.
void looped_bfs_order(int p, int m, int v, Orders* out) {
  for (int s = 0; s < p; ++s) {
    auto& ops = (*out)[s];
    ops.reserve(static_cast<size_t>(2LL * m * v));
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) ops.push_back(compute_op(OpType::Forward, mb, c));
    for (int c = v - 1; c >= 0; --c)
      for (int mb = m - 1; mb >= 0; --mb) ops.push_back(compute_op(OpType::Backward, mb, c));
  }
}

// ZB-V (Qi et al. 2024, section 6; PyTorch ScheduleZBVZeroBubble): chunk 0 of stage s is
// virtual stage s, chunk 1 is 2p-1-s. Phases, with n = max(2p-1, m) micro-batches planned and
// those >= m dropped afterwards (as PyTorch does):
//   2(p-s)-1 x F0;  s x (F1, F0);  p-s x (F1, I1, W1);
//   steady: while F1 lags F0 or F0 < n: [F0 if F0 < n], I0, W0, F1, I1, W1;
//   cool-down: s x (I0, I1); p-s x (I0, W0 of the oldest pending); the rest of the W1s; the
//   rest of the W0s.
void zbv_order(int p, int m, Orders* out) {
  const int n = std::max(2 * p - 1, m);
  for (int s = 0; s < p; ++s) {
    std::vector<Op> ops;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto add = [&](OpType type, int chunk, int mb) { ops.push_back(compute_op(type, mb, chunk)); };
    for (int i = 0; i < 2 * (p - s) - 1; ++i) add(OpType::Forward, 0, f0++);
    for (int i = 0; i < s; ++i) {
      add(OpType::Forward, 1, f1++);
      add(OpType::Forward, 0, f0++);
    }
    for (int i = 0; i < p - s; ++i) {
      add(OpType::Forward, 1, f1++);
      add(OpType::BackwardInput, 1, b1);
      add(OpType::BackwardWeight, 1, b1++);
    }
    while (f1 < f0 || f0 < n) {
      if (f0 < n) add(OpType::Forward, 0, f0++);
      add(OpType::BackwardInput, 0, b0);
      add(OpType::BackwardWeight, 0, b0++);
      add(OpType::Forward, 1, f1++);
      add(OpType::BackwardInput, 1, b1);
      add(OpType::BackwardWeight, 1, b1++);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < s; ++i) {
      add(OpType::BackwardInput, 0, b0++);
      add(OpType::BackwardInput, 1, b1++);
    }
    for (int i = 0; i < p - s; ++i) {
      add(OpType::BackwardInput, 0, b0++);
      add(OpType::BackwardWeight, 0, w0++);
    }
    while (w1 < b1) add(OpType::BackwardWeight, 1, w1++);
    while (w0 < b0) add(OpType::BackwardWeight, 0, w0++);
    auto& dst = (*out)[s];
    for (const Op& op : ops)
      if (op.microbatch < m) dst.push_back(op);
  }
}

// DualPipeV (DeepSeek-V3 report's DualPipe, V variant; PyTorch ScheduleDualPipeV). Chunk 0 of
// stage s is virtual stage s, chunk 1 is 2p-1-s; m >= 2p. Per-(chunk, kind) counters give the
// micro-batches; a full backward counts for both B-input and W; B-input queues its W, which a
// later "W if pending" step runs (oldest first). Steps:
//   1: 2(p-s-1) x F0;  2: s+1 x (F0, F1);  3: p-s-1 x (I1, W?, F1);
//   4: m-2p+s+1 x ((F0;B1) overlapped [not overlapped on the last stage's first], (F1;B0));
//   5: p-s-1 x (B1, (F1;B0));  6: s+1 x (B1|I1, B0|I0), zero bubble (I) from the middle on;
//   7: p-s-1 x (W?, B0|I0);  8: s+1 x W?.
void dualpipev_order(int p, int m, Orders* out) {
  for (int s = 0; s < p; ++s) {
    auto& ops = (*out)[s];
    // counters[chunk][0 = F, 1 = B-input, 2 = W]
    int counters[2][3] = {{0, 0, 0}, {0, 0, 0}};
    std::deque<std::pair<int, int>> weights;  // (chunk, microbatch) of pending W passes
    auto add = [&](int chunk, OpType type) {
      if (type == OpType::Forward) {
        ops.push_back(compute_op(type, counters[chunk][0]++, chunk));
      } else if (type == OpType::Backward) {
        ops.push_back(compute_op(type, counters[chunk][1], chunk));
        ++counters[chunk][1];
        ++counters[chunk][2];
      } else {  // BackwardInput
        const int mb = counters[chunk][1]++;
        ops.push_back(compute_op(type, mb, chunk));
        weights.emplace_back(chunk, mb);
      }
    };
    auto add_overlapped = [&](int forward_chunk, int backward_chunk) {
      add(forward_chunk, OpType::Forward);
      ops.back().overlapped_with_next = true;
      add(backward_chunk, OpType::Backward);
    };
    auto weight_if_pending = [&]() {
      if (weights.empty()) return;
      const auto [chunk, mb] = weights.front();
      weights.pop_front();
      ops.push_back(compute_op(OpType::BackwardWeight, mb, chunk));
      ++counters[chunk][2];
    };
    for (int i = 0; i < 2 * (p - s - 1); ++i) add(0, OpType::Forward);
    for (int i = 0; i < s + 1; ++i) {
      add(0, OpType::Forward);
      add(1, OpType::Forward);
    }
    for (int i = 0; i < p - s - 1; ++i) {
      add(1, OpType::BackwardInput);
      weight_if_pending();
      add(1, OpType::Forward);
    }
    for (int i = 0; i < m - 2 * p + s + 1; ++i) {
      if (i == 0 && s == p - 1) {
        // PyTorch: not overlapped, to further reduce the bubble.
        add(0, OpType::Forward);
        add(1, OpType::Backward);
      } else {
        add_overlapped(0, 1);
      }
      add_overlapped(1, 0);
    }
    for (int i = 0; i < p - s - 1; ++i) {
      add(1, OpType::Backward);
      add_overlapped(1, 0);
    }
    bool zero_bubble = false;
    const int step6 = s + 1;
    for (int i = 0; i < step6; ++i) {
      if (i == step6 / 2 && s % 2 == 1) zero_bubble = true;
      add(1, zero_bubble ? OpType::BackwardInput : OpType::Backward);
      if (i == step6 / 2 && s % 2 == 0) zero_bubble = true;
      add(0, zero_bubble ? OpType::BackwardInput : OpType::Backward);
    }
    for (int i = 0; i < p - s - 1; ++i) {
      weight_if_pending();
      add(0, zero_bubble ? OpType::BackwardInput : OpType::Backward);
    }
    for (int i = 0; i < s + 1; ++i) weight_if_pending();
  }
}

}  // namespace pipefill::schedule::detail
