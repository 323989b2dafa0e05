// The SM scheduler of a simulated device. Ops that need SMs (main kernels, SM-holding waits,
// fill launches) queue per device in a small vector sorted by (fill class, priority, enqueue
// order); dispatch() serves it strictly in that order whenever SMs free up or a new head
// arrives: the first entry that cannot start blocks everything behind it.
#include <algorithm>

#include "sim/sim_engine.hpp"

namespace pipefill::sim {

void World::Impl::add_pending(SimStream* stream, const Op& op, bool fill_class) {
  PendingEntry entry{stream, fill_class, stream->priority, op.sequence};
  auto& pending = devices[stream->device].pending;
  pending.insert(std::upper_bound(pending.begin(), pending.end(), entry), entry);
}

// Never completes an op itself (that would re-enter advance() while `pending` is being
// walked): a fill launch whose blocks all exited at once gets an OpComplete event at the
// current time instead.
void World::Impl::dispatch(int device_index) {
  DeviceState& device = devices[device_index];
  auto& pending = device.pending;
  size_t i = 0;
  while (i < pending.size()) {
    SimStream* stream = pending[i].stream;
    Op& op = stream->ops.front();
    if (!pending[i].fill_class) {
      const int need = std::min(op.sms, device.sm_count);
      if (need > device.free_sms) break;
      device.free_sms -= need;
      stream->held_sms = need;
      stream->head_start_us = now;
      if (op.type == OpType::Kernel) {
        const double slowdown =
            1.0 + device.interference * device.fill_in_use / static_cast<double>(device.sm_count);
        const double duration =
            op.time_us * jitter_factor(device, stream->jitter_key, op.ordinal) * slowdown;
        schedule(now + duration, EventType::OpComplete, stream);
      } else {
        start_wait(stream, op);
      }
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    // A fill launch: blocks start one SM at a time inside the fill partition. A block whose
    // first claim fails exits at once and gives its SM straight back.
    while (stream->blocks_unstarted > 0 && device.free_sms > 0 &&
           device.fill_in_use < device.fill_sms) {
      --stream->blocks_unstarted;
      if (start_batch(stream, op)) {
        --device.free_sms;
        ++device.fill_in_use;
        ++stream->blocks_active;
      }
    }
    if (stream->blocks_unstarted > 0) break;
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    if (stream->blocks_active == 0) schedule(now, EventType::OpComplete, stream);
  }
}

}  // namespace pipefill::sim
