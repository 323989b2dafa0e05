// The sending stage's notice on the simulated transport (sender_notice.hpp).
#include "sender_notice.hpp"

#include <utility>

#include "sim/sim_world.hpp"

namespace engine {

Status SenderNotices::open(pfSimWorld_t world, int stages, double lead_us, double latency_us) {
  close();
  lead_us_ = lead_us;
  latency_us_ = latency_us;
  if (!enabled()) return {};
  stages_.resize(static_cast<size_t>(stages));
  for (size_t s = 0; s < stages_.size(); ++s) {
    Stage& st = stages_[s];
    ENGINE_PF(pfSimStreamCreate(world, static_cast<int>(s), pipefill::sim::kHighestPriority, &st.tx));
    st.kernel_start.assign(kRing, nullptr);
    st.notice.assign(kRing, nullptr);
    for (size_t k = 0; k < kRing; ++k) {
      ENGINE_PF(pfSimEventCreate(world, &st.kernel_start[k]));
      ENGINE_PF(pfSimEventCreate(world, &st.notice[k]));
    }
  }
  return {};
}

Status SenderNotices::attach(int stage, pfRuntime_t runtime) {
  if (!enabled()) return {};
  Stage& st = stages_[static_cast<size_t>(stage)];
  st.runtime = runtime;
  ENGINE_PF(pfStreamCreateHighPriority(runtime, &st.rx));
  return {};
}

Status SenderNotices::before_kernel(int stage, void* main, double kernel_us) {
  if (!enabled()) return {};
  Stage& st = stages_[static_cast<size_t>(stage)];
  const size_t slot = st.next++ % kRing;
  ENGINE_PF(pfSimEventRecord(st.kernel_start[slot], main));
  ENGINE_PF(pfSimStreamWaitEvent(st.tx, st.kernel_start[slot], 0.0, 0));
  // The kernel's nominal end minus the lead (at its start when the kernel is shorter).
  if (kernel_us > lead_us_) ENGINE_PF(pfSimStreamDelay(st.tx, kernel_us - lead_us_));
  ENGINE_PF(pfSimEventRecord(st.notice[slot], st.tx));
  st.latest = st.notice[slot];
  return {};
}

void SenderNotices::on_send(int stage, uint64_t key) {
  if (!enabled()) return;
  const Stage& st = stages_[static_cast<size_t>(stage)];
  if (st.latest != nullptr) by_message_[key] = st.latest;
}

void SenderNotices::on_receive(int stage, uint64_t key) {
  if (!enabled()) return;
  const auto it = by_message_.find(key);
  stages_[static_cast<size_t>(stage)].pending = it != by_message_.end() ? it->second : nullptr;
}

void SenderNotices::on_arrive(int stage) {
  if (!enabled()) return;
  Stage& st = stages_[static_cast<size_t>(stage)];
  st.arrival = st.latest;
}

void SenderNotices::on_collective(int stage) {
  if (!enabled()) return;
  stages_[static_cast<size_t>(stage)].collective_posted = true;
}

Status SenderNotices::after_begin(int stage, bool ends_in_receive) {
  if (!enabled()) return {};
  Stage& st = stages_[static_cast<size_t>(stage)];
  const bool collective = std::exchange(st.collective_posted, false);
  if (st.rx == nullptr) return {};
  if (ends_in_receive) {
    if (st.pending == nullptr) return {};
    ENGINE_PF(pfSimStreamWaitEvent(st.rx, st.pending, latency_us_, 0));
  } else {
    // The collective ends with the last stage's arrival (this stage arrived before its begin):
    // every other stage's notice, or no close at all.
    if (!collective) return {};
    for (size_t other = 0; other < stages_.size(); ++other)
      if (other != static_cast<size_t>(stage) && stages_[other].arrival == nullptr) return {};
    for (size_t other = 0; other < stages_.size(); ++other)
      if (other != static_cast<size_t>(stage))
        ENGINE_PF(pfSimStreamWaitEvent(st.rx, stages_[other].arrival, latency_us_, 0));
  }
  ENGINE_PF(pfBubbleCloseFill(st.runtime, st.rx));
  st.pending = nullptr;
  return {};
}

void SenderNotices::detach(int stage) {
  if (!enabled()) return;
  Stage& st = stages_[static_cast<size_t>(stage)];
  if (st.rx != nullptr && st.runtime != nullptr) pfStreamDestroy(st.runtime, st.rx);
  st.rx = nullptr;
  st.runtime = nullptr;
}

void SenderNotices::close() {
  for (size_t s = 0; s < stages_.size(); ++s) {
    detach(static_cast<int>(s));
    Stage& st = stages_[s];
    if (st.tx != nullptr) pfSimStreamDestroy(st.tx);
    for (pfSimEvent_t e : st.kernel_start)
      if (e != nullptr) pfSimEventDestroy(e);
    for (pfSimEvent_t e : st.notice)
      if (e != nullptr) pfSimEventDestroy(e);
  }
  stages_.clear();
  by_message_.clear();
  lead_us_ = -1.0;
}

}  // namespace engine
