// The SM scheduler of a simulated device and the loads its interference model reads.
//
// Ops that need SMs (main kernels, SM-holding waits, fill launches) queue per device in a small
// vector sorted by (stream priority, main work before fill launches, enqueue order): the order
// in which the hardware serves pending blocks (CUDA: "Priorities provide a hint to
// preferentially run work with higher priority when possible, but do not preempt
// already-running work"). Whenever SMs free up or a
// new head arrives, dispatch() hands the free SMs out in that order, one block per SM:
//  - a main kernel takes as many SMs as it has pending blocks (it starts partially when only
//    some are free; the rest follow as SMs free, in waves when it has more blocks than SMs).
//    The blocks that start together are one group and one event: they share the kernel's
//    jitter and progress at 1 / (1 + beta x fill load), re-timed whenever the load changes
//    (retime_main_groups, once per instant), so they end together;
//  - an SM-holding wait (an NCCL kernel) starts only with all its SMs at once, because NCCL
//    needs every channel resident to make progress; until then nothing behind it starts;
//  - a fill launch's blocks start one by one inside the fill partition; a launch whose
//    partition is full does not hold up the work behind it (the partition is a limit on fill
//    work, not on the device).
// Running blocks are never preempted.
#include <algorithm>

#include "sim/sim_engine.hpp"

namespace pipefill::sim {

void World::Impl::add_pending(SimStream* stream, const Op& op) {
  const bool fill_launch = op.type == OpType::Ticket || op.type == OpType::Opaque;
  PendingEntry entry{stream, stream->priority, fill_launch, op.sequence};
  auto& pending = devices[stream->device].pending;
  pending.insert(std::upper_bound(pending.begin(), pending.end(), entry), entry);
}

double World::Impl::fill_load(const DeviceState& device) const {
  double weighted_blocks = 0.0;
  for (const SimStream* stream : device.active_fill) {
    weighted_blocks += stream->blocks_active * stream->ops.front().mem_intensity;
  }
  return weighted_blocks / static_cast<double>(device.sm_count);
}

double World::Impl::main_load(const DeviceState& device) {
  return device.main_blocks_active * device.interference.main_mem_intensity /
         static_cast<double>(device.sm_count);
}

void World::Impl::fill_block_started(SimStream* stream) {
  DeviceState& device = devices[stream->device];
  --device.free_sms;
  ++device.fill_in_use;
  if (stream->blocks_active++ == 0) device.active_fill.push_back(stream);
  device.fill_load_changed = true;
}

void World::Impl::fill_block_exited(SimStream* stream) {
  DeviceState& device = devices[stream->device];
  ++device.free_sms;
  --device.fill_in_use;
  if (--stream->blocks_active == 0) std::erase(device.active_fill, stream);
  device.fill_load_changed = true;
}

void World::Impl::start_kernel_blocks(SimStream* stream, Op& op, int count) {
  DeviceState& device = devices[stream->device];
  if (stream->blocks_unstarted == op.sms) stream->head_start_us = now;  // the first group
  stream->blocks_unstarted -= count;
  if (stream->blocks_unstarted == 0) stream->head_all_started_us = now;
  stream->blocks_active += count;
  device.free_sms -= count;
  device.main_blocks_active += count;
  MainGroup group;
  group.stream = stream;
  group.id = next_group_id++;
  group.blocks = count;
  group.remaining_us = op.time_us * jitter_factor(device, stream->jitter_key, op.ordinal);
  group.since_us = now;
  group.factor = 1.0 + device.interference.main_slowdown * fill_load(device);
  device.main_groups.push_back(group);
  schedule(now + group.remaining_us * group.factor, EventType::BlocksDone, stream, group.id,
           group.version);
}

void World::Impl::retime_main_groups(int device_index) {
  DeviceState& device = devices[device_index];
  device.fill_load_changed = false;
  if (device.main_groups.empty() || device.interference.main_slowdown == 0.0) return;
  const double factor = 1.0 + device.interference.main_slowdown * fill_load(device);
  for (MainGroup& group : device.main_groups) {
    if (factor == group.factor) continue;
    group.remaining_us =
        std::max(0.0, group.remaining_us - (now - group.since_us) / group.factor);
    group.since_us = now;
    group.factor = factor;
    ++group.version;
    schedule(now + group.remaining_us * group.factor, EventType::BlocksDone, group.stream,
             group.id, group.version);
  }
}

void World::Impl::kernel_group_done(int device_index, uint64_t group_id, uint64_t version) {
  DeviceState& device = devices[device_index];
  const auto it = find_current(device.main_groups, group_id, version);
  if (it == device.main_groups.end()) return;  // stale
  SimStream* stream = it->stream;
  const int count = it->blocks;
  device.main_groups.erase(it);
  device.free_sms += count;
  device.main_blocks_active -= count;
  stream->blocks_active -= count;
  if (stream->blocks_active == 0 && stream->blocks_unstarted == 0) complete_head(stream);
}

// Never completes an op itself (that would re-enter advance() while `pending` is being
// walked): a fill launch whose blocks all exited at once gets an OpComplete event at the
// current time instead.
void World::Impl::dispatch(int device_index) {
  DeviceState& device = devices[device_index];
  auto& pending = device.pending;
  size_t i = 0;
  while (i < pending.size() && device.free_sms > 0) {
    SimStream* stream = pending[i].stream;
    Op& op = stream->ops.front();
    if (op.type == OpType::Kernel) {
      start_kernel_blocks(stream, op, std::min(stream->blocks_unstarted, device.free_sms));
      if (stream->blocks_unstarted > 0) return;  // it took every free SM
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (op.type == OpType::Wait) {
      if (op.sms > device.free_sms) return;  // all channels at once; nothing behind it starts
      device.free_sms -= op.sms;
      stream->held_sms = op.sms;
      stream->head_start_us = now;
      start_wait(stream, op);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    // A fill launch: blocks start one SM at a time inside the fill partition. A block whose
    // first claim fails exits at once and gives its SM straight back.
    while (stream->blocks_unstarted > 0 && device.free_sms > 0 &&
           device.fill_in_use < device.fill_sms) {
      --stream->blocks_unstarted;
      if (start_batch(stream, op)) fill_block_started(stream);
    }
    if (stream->blocks_unstarted > 0) {
      ++i;  // the partition is full (or no SM is left: the loop ends)
      continue;
    }
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    if (stream->blocks_active == 0) schedule(now, EventType::OpComplete, stream);
  }
}

}  // namespace pipefill::sim
