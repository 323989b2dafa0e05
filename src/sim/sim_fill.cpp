// The fill kernel kinds of the simulated device. A ticket block claims through the protocol a
// GPU block runs (pipefill/item_protocol.hpp), at the virtual time of each claim; an opaque block
// takes the next item of its launch. Items shorter than kItemQuantumUs are claimed and simulated
// in batches, one event per batch, so the event count is bounded by virtual time; a ticket
// launch of such items stops claiming after kMaxTicketItemsPerLaunch items. Per-item callbacks still see every
// item, with its own completion time.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/callback_scope.hpp"
#include "common/item_call.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "pipefill/item_protocol.hpp"
#include "sim/sim_engine.hpp"

namespace pipefill::sim {
namespace {

thread_local double t_callback_time_us = std::numeric_limits<double>::quiet_NaN();
thread_local const World::Impl* t_callback_impl = nullptr;

// Claims a batch makes at once: 1 for items of at least the quantum.
uint64_t batch_size(double item_cost_us) {
  if (item_cost_us >= kItemQuantumUs) return 1;
  return std::max<uint64_t>(1, static_cast<uint64_t>(kItemQuantumUs / item_cost_us));
}

// Resolves a launch's pfSimFillDesc_t (NULL: the defaults) into the op; the device's default
// intensity is filled in by the caller (it needs the stream's device).
pfResult_t resolve_fill_desc(const pfSimFillDesc_t* fill, double* intensity, double* sensitivity) {
  *intensity = -1.0;
  *sensitivity = 1.0;
  if (fill == nullptr) return pfSuccess;
  if (fill->size < sizeof(pfSimFillDesc_t)) {
    return fail(pfErrorInvalidArgument,
                "fill desc size {} is smaller than sizeof(pfSimFillDesc_t) ({}); start from "
                "PF_SIM_FILL_DESC_INITIALIZER",
                fill->size, sizeof(pfSimFillDesc_t));
  }
  if (!std::isfinite(fill->mem_intensity)) {
    return fail(pfErrorInvalidArgument, "fill mem_intensity {} must be finite (negative: the "
                "device's fill_mem_intensity)", fill->mem_intensity);
  }
  if (!std::isfinite(fill->mem_sensitivity)) {
    return fail(pfErrorInvalidArgument, "fill mem_sensitivity {} must be finite (negative: 1)",
                fill->mem_sensitivity);
  }
  *intensity = fill->mem_intensity;
  if (fill->mem_sensitivity >= 0.0) *sensitivity = fill->mem_sensitivity;
  return pfSuccess;
}

}  // namespace

double World::callback_time_us() { return t_callback_time_us; }

const World::Impl* callback_world() { return t_callback_impl; }

pfResult_t refuse_in_callback(const char* what) {
  return fail(pfErrorInvalidState,
              "{}: called from inside a simulated on_item callback, which runs with the world "
              "locked; the callback must not call into the simulator (World::callback_time_us() "
              "gives the item's time)",
              what);
}

bool World::Impl::claim(SimStream* stream, Op& op, uint64_t* item) {
  if (op.type == OpType::Ticket) {
    // The per-launch cap only bounds launches of tiny items (batched); longer items cost one
    // event each and are simulated exactly.
    if (op.time_us < kItemQuantumUs && stream->items_claimed >= kMaxTicketItemsPerLaunch) {
      return false;
    }
    const uint64_t claimed = protocol::claim_item(op.slice, protocol::HostAtomics{});
    if (claimed == protocol::kStopItem) return false;
    ++stream->items_claimed;
    *item = claimed;
    return true;
  }
  if (stream->opaque_next >= op.total_items) return false;
  *item = op.value + stream->opaque_next++;
  return true;
}

bool World::Impl::start_batch(SimStream* stream, Op& op) {
  uint64_t first = 0;
  if (!claim(stream, op, &first)) return false;
  // The claims of one batch happen at the same virtual time with nothing in between, so they
  // return consecutive items (the cursor moves by one per claim).
  const uint64_t wanted = batch_size(op.time_us);
  uint64_t count = 1;
  bool exit_after = false;
  if (op.type == OpType::Opaque) {
    // Opaque blocks take the next items of their launch: the whole batch at once.
    const uint64_t more = std::min(wanted - 1, op.total_items - stream->opaque_next);
    stream->opaque_next += more;
    count += more;
    exit_after = count < wanted;
  } else {
    for (uint64_t next = 0; count < wanted; ++count) {
      if (!claim(stream, op, &next)) {
        exit_after = true;  // the block made its failing claim: it exits after the batch
        break;
      }
    }
  }
  if (stream->first_item_start_us < 0.0) stream->first_item_start_us = now;
  const DeviceState& device = devices[stream->device];
  // Main-kernel blocks resident now slow the batch through memory bandwidth (beta_f).
  const double slowdown =
      1.0 + device.interference.fill_slowdown * main_load(device) * op.mem_sensitivity;
  const double item_us =
      op.time_us * jitter_factor(device, stream->jitter_key, op.ordinal, first + 1) * slowdown;
  const double duration = static_cast<double>(count) * item_us;
  // The heap entry's count carries the exit flag in its top bit.
  schedule(now + duration, EventType::ItemDone, stream, first,
           count | (exit_after ? (uint64_t{1} << 63) : 0), item_us);
  return true;
}

void World::Impl::batch_done(SimStream* stream, uint64_t first_item, uint64_t count_and_flag,
                             double item_us) {
  const bool exit_after = (count_and_flag >> 63) != 0;
  const uint64_t count = count_and_flag & ~(uint64_t{1} << 63);
  Op& op = stream->ops.front();
  stream->items_done += count;
  stream->last_item_end_us = now;
  bool failed = false;
  if (op.on_item) {
    CallbackScope scope("on_item");
    t_callback_impl = this;
    for (uint64_t i = 0; i < count && !failed; ++i) {
      t_callback_time_us = now - static_cast<double>(count - 1 - i) * item_us;
      std::string what;
      if (call_item([&] { op.on_item(op.user, first_item + i); }, first_item + i, &what)) continue;
      // As on the host device: the block stops, the failure (and the batch's items left
      // uncalled) go to the record before the launch - the runtime's slice start event, read
      // at harvest - which fails the job; the world runs on.
      failed = true;
      log::warn("simulated device: {}; the block stops", what);
      if (Record* record = op.failures_to) {
        if (record->item_failures++ == 0) record->first_item_failure = what;
        record->items_not_run += count - 1 - i;
      }
    }
    t_callback_impl = nullptr;
    t_callback_time_us = std::numeric_limits<double>::quiet_NaN();
  }
  if (!exit_after && !failed && start_batch(stream, op)) return;
  fill_block_exited(stream);
  if (stream->blocks_active == 0 && stream->blocks_unstarted == 0) {
    // An opaque launch whose blocks all stopped at failed items leaves the rest of its items
    // unrun: not completed either (the runtime counts opaque items as planned), as on the host.
    Record* record = op.failures_to;
    if (op.type == OpType::Opaque && record != nullptr && record->item_failures > 0) {
      record->items_not_run += op.total_items - std::min(stream->opaque_next, op.total_items);
    }
    complete_head(stream);
  }
}

// ---- Launches (World API) ---------------------------------------------------------------------

pfResult_t World::launch_ticket(void* handle, const pfSliceDesc_t* slice, int blocks,
                                double item_cost_us, pfSimItemFn on_item, void* user) {
  return launch_ticket(handle, slice, blocks, item_cost_us, nullptr, on_item, user);
}

pfResult_t World::launch_opaque(void* handle, uint64_t first_item, uint64_t items, int blocks,
                                double item_cost_us, pfSimItemFn on_item, void* user) {
  return launch_opaque(handle, first_item, items, blocks, item_cost_us, nullptr, on_item, user);
}

pfResult_t World::launch_ticket(void* handle, const pfSliceDesc_t* slice, int blocks,
                                double item_cost_us, const pfSimFillDesc_t* fill,
                                pfSimItemFn on_item, void* user) {
  if (slice == nullptr) return fail(pfErrorInvalidArgument, "slice pointer is NULL");
  if (slice->gate == nullptr) return fail(pfErrorInvalidArgument, "slice->gate is NULL");
  if (slice->cursor == nullptr) return fail(pfErrorInvalidArgument, "slice->cursor is NULL");
  if (slice->budget_counter == nullptr) {
    return fail(pfErrorInvalidArgument, "slice->budget_counter is NULL");
  }
  const void* words[] = {const_cast<const uint64_t*>(slice->gate), slice->cursor,
                         slice->budget_counter};
  const char* names[] = {"gate", "cursor", "budget_counter"};
  for (int i = 0; i < 3; ++i) {
    if (reinterpret_cast<uintptr_t>(words[i]) % alignof(uint64_t) != 0) {
      return fail(pfErrorInvalidArgument, "slice->{} {} is not 8-byte aligned", names[i],
                  words[i]);
    }
  }
  if (slice->max_blocks < 1) {
    return fail(pfErrorInvalidArgument, "slice->max_blocks {} must be >= 1", slice->max_blocks);
  }
  if (blocks < 1) return fail(pfErrorInvalidArgument, "ticket blocks {} must be >= 1", blocks);
  if (!std::isfinite(item_cost_us) || item_cost_us <= 0.0) {
    return fail(pfErrorInvalidArgument, "ticket item_cost_us {} must be finite and > 0",
                item_cost_us);
  }
  double intensity = 0.0;
  double sensitivity = 1.0;
  PF_TRY(resolve_fill_desc(fill, &intensity, &sensitivity));
  if (callback_world() == impl_.get()) return refuse_in_callback("launch_ticket");
  MutexLock lock(impl_->mutex);
  SimStream* stream = impl_->live_stream(handle);
  if (stream == nullptr) {
    return fail(pfErrorInvalidArgument, "stream {} is not a live simulated stream of this world",
                handle);
  }
  Op op;
  op.type = OpType::Ticket;
  const DeviceState& device = impl_->devices[static_cast<size_t>(stream->device)];
  op.sms = std::min({blocks, slice->max_blocks, device.fill_sms});
  op.time_us = item_cost_us;
  op.mem_intensity = intensity >= 0.0 ? intensity : device.interference.fill_mem_intensity;
  op.mem_sensitivity = sensitivity;
  op.slice = *slice;
  op.on_item = on_item;
  op.user = user;
  // The words stay allocated until the launch ran, even if the runtime that owns them is
  // destroyed meanwhile (a ticket kernel on a main stream outlives the fill stream's drain).
  for (const void* word : words) {
    const pfResult_t pinned = impl_->pin_word(word, &op);
    if (pinned != pfSuccess) {
      impl_->unpin_words(op);
      return pinned;
    }
  }
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::launch_opaque(void* handle, uint64_t first_item, uint64_t items, int blocks,
                                double item_cost_us, const pfSimFillDesc_t* fill,
                                pfSimItemFn on_item, void* user) {
  if (blocks < 1) return fail(pfErrorInvalidArgument, "opaque blocks {} must be >= 1", blocks);
  if (!std::isfinite(item_cost_us) || item_cost_us <= 0.0) {
    return fail(pfErrorInvalidArgument, "opaque item_cost_us {} must be finite and > 0",
                item_cost_us);
  }
  if (items > std::numeric_limits<uint64_t>::max() - first_item) {
    return fail(pfErrorInvalidArgument, "opaque first_item {} + items {} overflows", first_item,
                items);
  }
  double intensity = 0.0;
  double sensitivity = 1.0;
  PF_TRY(resolve_fill_desc(fill, &intensity, &sensitivity));
  if (callback_world() == impl_.get()) return refuse_in_callback("launch_opaque");
  MutexLock lock(impl_->mutex);
  SimStream* stream = impl_->live_stream(handle);
  if (stream == nullptr) {
    return fail(pfErrorInvalidArgument, "stream {} is not a live simulated stream of this world",
                handle);
  }
  Op op;
  op.type = OpType::Opaque;
  op.sms = blocks;
  op.time_us = item_cost_us;
  op.mem_intensity = intensity >= 0.0
                         ? intensity
                         : impl_->devices[static_cast<size_t>(stream->device)]
                               .interference.fill_mem_intensity;
  op.mem_sensitivity = sensitivity;
  op.value = first_item;
  op.total_items = items;
  op.on_item = on_item;
  op.user = user;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

}  // namespace pipefill::sim
