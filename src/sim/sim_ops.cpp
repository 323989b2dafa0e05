// Enqueueing the simulated stream operations (sim_world.hpp): main kernels, delays, event
// records and waits, word writes and copies. Fill launches are in sim_fill.cpp. Every call
// validates its arguments first and changes nothing when it fails.
#include <algorithm>
#include <cmath>

#include "common/error.hpp"
#include "sim/sim_engine.hpp"

namespace pipefill::sim {

#define PF_SIM_REFUSE_IN_OWN_CALLBACK(what) \
  if (callback_world() == impl_.get()) return refuse_in_callback(what)

#define PF_SIM_LOOKUP_STREAM(var, handle)                                                     \
  SimStream* var = impl_->live_stream(handle);                                               \
  if (var == nullptr) {                                                                      \
    return fail(pfErrorInvalidArgument, "stream {} is not a live simulated stream of this world", \
                static_cast<const void*>(handle));                                           \
  }

#define PF_SIM_LOOKUP_EVENT(var, handle)                                                      \
  SimEvent* var = impl_->live_event(handle);                                                 \
  if (var == nullptr) {                                                                      \
    return fail(pfErrorInvalidArgument, "event {} is not a live simulated event of this world", \
                static_cast<const void*>(handle));                                           \
  }

pfResult_t World::launch_kernel(void* handle, double duration_us, int sm_count) {
  if (!finite_nonnegative(duration_us)) {
    return fail(pfErrorInvalidArgument, "kernel duration_us {} must be finite and >= 0",
                duration_us);
  }
  if (sm_count < 1) return fail(pfErrorInvalidArgument, "kernel sm_count {} must be >= 1", sm_count);
  PF_SIM_REFUSE_IN_OWN_CALLBACK("launch_kernel");
  MutexLock lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  Op op;
  op.type = OpType::Kernel;
  op.sms = std::min(sm_count, impl_->sm_count_of(stream->device));
  op.time_us = duration_us;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::launch_kernel_blocks(void* handle, int blocks, double block_us) {
  if (!finite_nonnegative(block_us)) {
    return fail(pfErrorInvalidArgument, "kernel block_us {} must be finite and >= 0", block_us);
  }
  if (blocks < 1) return fail(pfErrorInvalidArgument, "kernel blocks {} must be >= 1", blocks);
  PF_SIM_REFUSE_IN_OWN_CALLBACK("launch_kernel_blocks");
  MutexLock lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  Op op;
  op.type = OpType::Kernel;
  op.sms = blocks;
  op.time_us = block_us;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::delay(void* handle, double duration_us) {
  if (!finite_nonnegative(duration_us)) {
    return fail(pfErrorInvalidArgument, "delay duration_us {} must be finite and >= 0",
                duration_us);
  }
  PF_SIM_REFUSE_IN_OWN_CALLBACK("delay");
  MutexLock lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  Op op;
  op.type = OpType::Delay;
  op.time_us = duration_us;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::record_event(void* event_handle, void* stream_handle) {
  PF_SIM_REFUSE_IN_OWN_CALLBACK("record_event");
  MutexLock lock(impl_->mutex);
  PF_SIM_LOOKUP_EVENT(event, event_handle);
  PF_SIM_LOOKUP_STREAM(stream, stream_handle);
  Record* record = impl_->new_record();
  Impl::retain(record);  // the op's reference
  Impl::retain(record);  // the event's reference (latest record)
  impl_->release(event->latest);
  event->latest = record;
  Op op;
  op.type = OpType::Record;
  op.record = record;
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::wait_event(void* stream_handle, void* event_handle, double latency_us,
                             int sm_count) {
  if (!finite_nonnegative(latency_us)) {
    return fail(pfErrorInvalidArgument, "wait latency_us {} must be finite and >= 0", latency_us);
  }
  // A comm kernel's latency is the time it moves the data after its peer's record.
  if (sm_count > 0) return wait_event_transfer(stream_handle, event_handle, 0.0, latency_us, sm_count);
  return wait_event_transfer(stream_handle, event_handle, latency_us, 0.0, sm_count);
}

pfResult_t World::wait_event_transfer(void* stream_handle, void* event_handle, double latency_us,
                                      double transfer_us, int sm_count) {
  if (!finite_nonnegative(latency_us)) {
    return fail(pfErrorInvalidArgument, "wait latency_us {} must be finite and >= 0", latency_us);
  }
  if (!finite_nonnegative(transfer_us)) {
    return fail(pfErrorInvalidArgument, "wait transfer_us {} must be finite and >= 0",
                transfer_us);
  }
  if (sm_count < 0) return fail(pfErrorInvalidArgument, "wait sm_count {} must be >= 0", sm_count);
  PF_SIM_REFUSE_IN_OWN_CALLBACK("wait_event");
  MutexLock lock(impl_->mutex);
  PF_SIM_LOOKUP_EVENT(event, event_handle);
  PF_SIM_LOOKUP_STREAM(stream, stream_handle);
  Op op;
  op.type = OpType::Wait;
  op.record = event->latest;  // CUDA semantics: the record that is latest now
  Impl::retain(op.record);
  op.time_us = latency_us;
  op.transfer_us = transfer_us;
  op.sms = std::min(sm_count, impl_->sm_count_of(stream->device));
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::write_word(void* handle, uint64_t* word, uint64_t value) {
  return enqueue_write(handle, word, value, /*write_max=*/false);
}

pfResult_t World::write_word_max(void* handle, uint64_t* word, uint64_t value) {
  return enqueue_write(handle, word, value, /*write_max=*/true);
}

pfResult_t World::enqueue_write(void* handle, uint64_t* word, uint64_t value, bool write_max) {
  if (word == nullptr) return fail(pfErrorInvalidArgument, "word pointer is NULL");
  PF_SIM_REFUSE_IN_OWN_CALLBACK(write_max ? "write_word_max" : "write_word");
  MutexLock lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  Op op;
  op.type = OpType::WriteWord;
  op.word = word;
  op.value = value;
  op.write_max = write_max;
  PF_TRY(impl_->pin_word(word, &op));
  impl_->enqueue(stream, op);
  return pfSuccess;
}

pfResult_t World::copy_word(void* handle, const uint64_t* source, uint64_t* destination) {
  if (source == nullptr) return fail(pfErrorInvalidArgument, "source word pointer is NULL");
  if (destination == nullptr) {
    return fail(pfErrorInvalidArgument, "destination word pointer is NULL");
  }
  PF_SIM_REFUSE_IN_OWN_CALLBACK("copy_word");
  MutexLock lock(impl_->mutex);
  PF_SIM_LOOKUP_STREAM(stream, handle);
  Op op;
  op.type = OpType::CopyWord;
  op.source = source;
  op.word = destination;
  for (const void* word : {static_cast<const void*>(source), static_cast<const void*>(destination)}) {
    const pfResult_t pinned = impl_->pin_word(word, &op);
    if (pinned != pfSuccess) {
      impl_->unpin_words(op);
      return pinned;
    }
  }
  impl_->enqueue(stream, op);
  return pfSuccess;
}

#undef PF_SIM_LOOKUP_EVENT
#undef PF_SIM_LOOKUP_STREAM
#undef PF_SIM_REFUSE_IN_OWN_CALLBACK

}  // namespace pipefill::sim
