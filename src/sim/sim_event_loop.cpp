// The discrete-event loop of the simulated world: the event heap ordered by (time, sequence),
// stream heads (ops that need no time run at once, the first one that does starts), event
// records and waits, op completion, and the run loops. The SM scheduler is sim_dispatch.cpp,
// the fill kernels sim_fill.cpp.
#include <algorithm>
#include <cmath>

#include "common/error.hpp"
#include "sim/rng.hpp"
#include "sim/sim_engine.hpp"

namespace pipefill::sim {

bool finite_nonnegative(double value) { return std::isfinite(value) && value >= 0.0; }

// ---- Records ----------------------------------------------------------------------------------

Record* World::Impl::new_record() {
  Record* record;
  if (!free_records.empty()) {
    record = free_records.back();
    free_records.pop_back();
  } else {
    record_storage.push_back(std::make_unique<Record>());
    record = record_storage.back().get();
  }
  record->completed = false;
  record->time_us = -1.0;
  record->references = 0;
  record->waiters.clear();
  record->item_failures = 0;
  record->items_not_run = 0;
  record->first_item_failure.clear();
  return record;
}

void World::Impl::retain(Record* record) {
  if (record) ++record->references;
}

void World::Impl::release(Record* record) {
  if (record && --record->references == 0) free_records.push_back(record);
}

void World::Impl::complete_record(Record* record) {
  record->completed = true;
  record->time_us = now;
  for (SimStream* waiter : record->waiters) start_transfer(waiter, waiter->ops.front(), now);
  record->waiters.clear();
}

// A wait that reaches its stream's head after its whole span has passed completes at once; the
// span is taken at the fill load of that moment (the transfer notionally ran before it).
double World::Impl::wait_span(const SimStream& stream, const Op& op) const {
  if (op.transfer_us == 0.0) return op.time_us;
  const DeviceState& device = devices[stream.device];
  return op.time_us +
         op.transfer_us * (1.0 + device.interference.comm_slowdown * fill_load(device));
}

// A started wait: completes at record time + latency + transfer, or that long after the record
// completes.
void World::Impl::start_wait(SimStream* stream, Op& op) {
  if (op.record->completed) {
    start_transfer(stream, op, op.record->time_us);
  } else {
    op.record->waiters.push_back(stream);
  }
}

// ---- Scheduling -------------------------------------------------------------------------------

void World::Impl::schedule(double time_us, EventType type, SimStream* stream, uint64_t item,
                           uint64_t count, double item_us) {
  heap.push_back(HeapEntry{time_us, next_sequence++, stream, item, count, item_us, type});
  std::push_heap(heap.begin(), heap.end(), HeapLater{});
}

// Multiplicative duration jitter for the op identified by (stream key, ordinal, item).
double World::Impl::jitter_factor(const DeviceState& device, uint64_t stream_key,
                                  uint64_t ordinal, uint64_t item) const {
  if (device.jitter == 0.0) return 1.0;
  SplitMix64 mixer(seed ^ (stream_key * 0x9E3779B97F4A7C15ull));
  SplitMix64 draw(mixer.next() ^ (ordinal * 0xC2B2AE3D27D4EB4Full) ^
                  (item * 0x165667B19E3779F9ull));
  return std::max(0.05, 1.0 + device.jitter * draw.normal());
}

void World::Impl::record_activity(int device, ActivityKind kind, const char* name,
                                  const SimStream& stream, double start_us, double end_us,
                                  uint64_t correlation, int blocks, double all_blocks_started_us) {
  if (!record_activities) return;
  ActivityRecord record;
  record.kind = kind;
  record.name = name;
  record.device = device;
  record.stream = stream.id;
  record.start_us = start_us;
  record.end_us = end_us;
  record.correlation = correlation;
  record.grid_blocks = blocks;
  record.all_blocks_started_us = all_blocks_started_us;
  devices[device].activities.push_back(std::move(record));
}

void World::Impl::enqueue(SimStream* stream, Op op) {
  op.sequence = next_sequence++;
  if (op.type == OpType::Kernel) {
    op.ordinal = stream->kernels_enqueued++;
  } else if (op.type == OpType::Ticket || op.type == OpType::Opaque) {
    op.ordinal = stream->launches_enqueued++;
    op.failures_to = stream->last_enqueued_record;
    retain(op.failures_to);
  }
  if (op.type == OpType::Record) {
    retain(op.record);
    release(stream->last_enqueued_record);
    stream->last_enqueued_record = op.record;
  }
  const bool was_idle = stream->ops.empty();
  stream->ops.push_back(op);
  if (was_idle && !stream->advance_scheduled) {
    stream->advance_scheduled = true;
    schedule(now, EventType::Advance, stream);
  }
}

void World::Impl::pop_head(SimStream* stream) {
  Op& op = stream->ops.front();
  release(op.record);
  release(op.failures_to);
  unpin_words(op);
  stream->ops.pop_front();
  stream->head_started = false;
  stream->held_sms = 0;
  stream->blocks_unstarted = 0;
  stream->blocks_active = 0;
  stream->opaque_next = 0;
  stream->items_claimed = 0;
  stream->items_done = 0;
  stream->first_item_start_us = -1.0;
  stream->last_item_end_us = -1.0;
}

// ---- Stream heads -----------------------------------------------------------------------------

// Runs the head ops that need no time, and starts the first one that does.
void World::Impl::advance(SimStream* stream) {
  while (!stream->ops.empty() && !stream->head_started) {
    Op& op = stream->ops.front();
    switch (op.type) {
      case OpType::Record:
        complete_record(op.record);
        pop_head(stream);
        continue;
      case OpType::WriteWord:
        *op.word = op.write_max ? std::max(*op.word, op.value) : op.value;
        pop_head(stream);
        continue;
      case OpType::CopyWord:
        *op.word = *op.source;
        pop_head(stream);
        continue;
      case OpType::Delay:
        stream->head_started = true;
        stream->head_start_us = now;
        schedule(now + op.time_us, EventType::OpComplete, stream);
        return;
      case OpType::Kernel:
        stream->head_started = true;
        stream->blocks_unstarted = op.sms;
        add_pending(stream, op);
        return;
      case OpType::Wait:
        if (op.record == nullptr) {  // the event had no record when the wait was enqueued
          pop_head(stream);
          continue;
        }
        if (op.sms > 0) {
          stream->head_started = true;
          add_pending(stream, op);
          return;
        }
        if (op.record->completed && op.record->time_us + wait_span(*stream, op) <= now) {
          pop_head(stream);
          continue;
        }
        stream->head_started = true;
        stream->head_start_us = now;
        start_wait(stream, op);
        return;
      case OpType::Ticket:
      case OpType::Opaque:
        stream->head_started = true;
        stream->head_start_us = now;
        stream->blocks_unstarted = op.sms;
        add_pending(stream, op);
        return;
    }
  }
  if (stream->ops.empty() && stream->destroyed && !stream->in_graveyard) {
    stream->in_graveyard = true;
    graveyard.push_back(stream);
  }
}

void World::Impl::complete_head(SimStream* stream) {
  Op& op = stream->ops.front();
  DeviceState& device = devices[stream->device];
  switch (op.type) {
    case OpType::Kernel:  // its blocks gave their SMs back as they ended
      record_activity(stream->device, ActivityKind::Kernel, "sim_kernel", *stream,
                      stream->head_start_us, now, op.sequence, op.sms, stream->head_all_started_us);
      break;
    case OpType::Delay:
      record_activity(stream->device, ActivityKind::Memcpy, "sim_delay", *stream,
                      stream->head_start_us, now, op.sequence, 0);
      break;
    case OpType::Wait:
      if (stream->held_sms > 0) {
        device.free_sms += stream->held_sms;
        record_activity(stream->device, ActivityKind::Comm, "ncclKernel_SimRecv", *stream,
                        stream->head_start_us, now, op.sequence, stream->held_sms);
      }
      break;
    case OpType::Ticket:
    case OpType::Opaque:
      if (stream->items_done > 0) {
        record_activity(stream->device, ActivityKind::Fill,
                        op.type == OpType::Ticket ? "fill_ticket" : "fill_opaque", *stream,
                        stream->first_item_start_us, stream->last_item_end_us, op.sequence,
                        op.sms);
      }
      break;
    default:
      break;
  }
  pop_head(stream);
  advance(stream);
}

// ---- The loop ---------------------------------------------------------------------------------

// Processes every event of the earliest time, then hands out the SMs freed at that instant:
// work that becomes pending at the same time as SMs free up competes for them by priority, and
// a block starting at t sees the interference of the blocks still resident after t (not of
// blocks ending at t that happened to be processed later). Dispatch may schedule more events
// at the same time (a fill launch whose blocks exited at once, a zero-length kernel); the next
// call processes them.
bool World::Impl::stale(const HeapEntry& entry) const {
  // The stream is alive: streams are freed only when the heap has run empty.
  const DeviceState& device = devices[entry.stream->device];
  if (entry.type == EventType::TransferDone) {
    return find_current(device.transfers, entry.item, entry.count) == device.transfers.end();
  }
  if (entry.type != EventType::BlocksDone) return false;
  return find_current(device.main_groups, entry.item, entry.count) == device.main_groups.end();
}

// A re-timed group's or transfer's old end events are dropped without moving the clock.
void World::Impl::drop_stale_front() {
  while (!heap.empty() && stale(heap.front())) {
    std::pop_heap(heap.begin(), heap.end(), HeapLater{});
    heap.pop_back();
  }
}

void World::Impl::process_one() {
  drop_stale_front();
  if (heap.empty()) return;
  const double instant = heap.front().time_us;
  while (!heap.empty() && heap.front().time_us == instant) {
    std::pop_heap(heap.begin(), heap.end(), HeapLater{});
    const HeapEntry entry = heap.back();
    heap.pop_back();
    if (stale(entry)) continue;
    ++events_processed;
    now = entry.time_us;
    SimStream* stream = entry.stream;
    switch (entry.type) {
      case EventType::Advance:
        stream->advance_scheduled = false;
        advance(stream);
        break;
      case EventType::OpComplete:
        complete_head(stream);
        break;
      case EventType::ItemDone:
        batch_done(stream, entry.item, entry.count, entry.item_us);
        break;
      case EventType::BlocksDone:
        kernel_group_done(stream->device, entry.item, entry.count);
        break;
      case EventType::TransferDone:
        transfer_done(stream->device, entry.item, entry.count);
        break;
    }
    DeviceState& device = devices[stream->device];
    if (!device.dispatch_due) {
      device.dispatch_due = true;
      dispatch_queue.push_back(stream->device);
    }
  }
  // In device order, so the result does not depend on which device's event came first.
  std::sort(dispatch_queue.begin(), dispatch_queue.end());
  for (int device : dispatch_queue) {
    devices[device].dispatch_due = false;
    dispatch(device);
    // Fill blocks that exited or started at this instant change the main groups' and the
    // transfers' rate.
    if (devices[device].fill_load_changed) {
      retime_main_groups(device);
      retime_transfers(device);
    }
  }
  dispatch_queue.clear();
}

void World::Impl::bury_drained_streams() {
  for (SimStream* stream : graveyard) {
    release(stream->last_enqueued_record);
    stream->last_enqueued_record = nullptr;
    streams.erase(stream->handle);
  }
  graveyard.clear();
}

// Called when the heap ran empty: any stream still holding ops can never make progress.
pfResult_t World::Impl::check_blocked() const {
  const SimStream* first = nullptr;
  size_t blocked = 0;
  for (const auto& [handle, stream] : streams) {
    if (stream->ops.empty()) continue;
    ++blocked;
    if (first == nullptr || stream->id < first->id) first = stream.get();
  }
  if (blocked == 0) return pfSuccess;
  return fail(pfErrorInvalidState,
              "simulated deadlock at t={} us: {} stream(s) still have work but nothing can "
              "run (first: stream id {} on device {}, {} op(s) queued; a wait whose record "
              "never runs, or SMs held by a wait)",
              now, blocked, first->id, first->device, first->ops.size());
}

pfResult_t World::Impl::run_while_not(const std::function<bool()>& done) {
  while (!done()) {
    if (heap.empty()) {
      bury_drained_streams();
      PF_TRY(check_blocked());
      return fail(pfErrorInvalidState, "simulated wait can never complete at t={} us", now);
    }
    process_one();
  }
  bury_drained_streams();
  return pfSuccess;
}

void World::Impl::run_hooks() {
  MutexLock hooks_lock(hooks_mutex);
  for (auto& [owner, hook] : hooks) hook();
}

}  // namespace pipefill::sim
