// The simulated world's memory (sim_world.hpp): device words (plain host memory, with frees
// deferred while queued ops still use them), the main job's memory use, arenas (simulated
// address ranges, never backed) and the fill partition.
#include <algorithm>
#include <new>

#include "common/error.hpp"
#include "sim/sim_engine.hpp"

namespace pipefill::sim {

#define PF_SIM_REFUSE_IN_OWN_CALLBACK(what) \
  if (callback_world() == impl_.get()) return refuse_in_callback(what)

#define PF_SIM_CHECK_DEVICE(device)                                                        \
  if (!impl_->valid_device(device)) {                                                     \
    return fail(pfErrorInvalidArgument, "device {} is out of range [0, {})", device,       \
                device_count());                                                           \
  }

// ---- Words ------------------------------------------------------------------------------------

pfResult_t World::Impl::pin_word(const void* word, Op* op) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(word);
  auto it = words.upper_bound(address);
  if (it == words.begin()) return pfSuccess;  // not the world's words: the caller's memory
  --it;
  if (address >= it->first + it->second.count * sizeof(uint64_t)) return pfSuccess;
  if (it->second.freed) {
    return fail(pfErrorInvalidArgument,
                "word {} belongs to words this simulated world has freed (free_words)", word);
  }
  ++it->second.pins;
  op->pinned[op->pin_count++] = it->first;
  return pfSuccess;
}

void World::Impl::unpin_words(Op& op) {
  for (int i = 0; i < op.pin_count; ++i) {
    auto it = words.find(op.pinned[i]);
    if (it == words.end()) continue;
    if (--it->second.pins == 0 && it->second.freed) {
      ::operator delete[](reinterpret_cast<uint64_t*>(it->first), std::align_val_t{kWordAlignment});
      words.erase(it);
    }
  }
  op.pin_count = 0;
}

pfResult_t World::allocate_words(size_t count, uint64_t** words) {
  if (words == nullptr) return fail(pfErrorInvalidArgument, "words output pointer is NULL");
  if (count == 0 || count > (size_t{1} << 32)) {
    return fail(pfErrorInvalidArgument, "word count {} is out of range [1, 2^32]", count);
  }
  PF_SIM_REFUSE_IN_OWN_CALLBACK("allocate_words");
  auto* memory = static_cast<uint64_t*>(
      ::operator new[](count * sizeof(uint64_t), std::align_val_t{kWordAlignment}));
  std::fill(memory, memory + count, uint64_t{0});
  MutexLock lock(impl_->mutex);
  WordBlock block;
  block.count = count;
  impl_->words.emplace(reinterpret_cast<uintptr_t>(memory), block);
  *words = memory;
  return pfSuccess;
}

pfResult_t World::free_words(uint64_t* words) {
  PF_SIM_REFUSE_IN_OWN_CALLBACK("free_words");
  MutexLock lock(impl_->mutex);
  auto it = impl_->words.find(reinterpret_cast<uintptr_t>(words));
  if (it == impl_->words.end() || it->second.freed) {
    return fail(pfErrorInvalidArgument, "words {} were not allocated by this simulated world",
                static_cast<const void*>(words));
  }
  if (it->second.pins > 0) {
    it->second.freed = true;  // deleted once the queued ops using them have run
    return pfSuccess;
  }
  impl_->words.erase(it);
  ::operator delete[](words, std::align_val_t{kWordAlignment});
  return pfSuccess;
}

// ---- Memory -----------------------------------------------------------------------------------

pfResult_t World::set_memory_used(int device, size_t bytes) {
  PF_SIM_CHECK_DEVICE(device);
  PF_SIM_REFUSE_IN_OWN_CALLBACK("set_memory_used");
  MutexLock lock(impl_->mutex);
  DeviceState& state = impl_->devices[static_cast<size_t>(device)];
  if (bytes > state.memory_total) {
    return fail(pfErrorInvalidArgument, "memory used {} bytes exceeds the device's {} bytes",
                bytes, state.memory_total);
  }
  state.memory_used = bytes;
  return pfSuccess;
}

pfResult_t World::memory_info(int device, size_t* free_bytes, size_t* total_bytes) const {
  PF_SIM_CHECK_DEVICE(device);
  PF_SIM_REFUSE_IN_OWN_CALLBACK("memory_info");
  MutexLock lock(impl_->mutex);
  const DeviceState& state = impl_->devices[static_cast<size_t>(device)];
  const size_t taken = state.memory_used + state.arena_used;
  if (free_bytes) *free_bytes = taken >= state.memory_total ? 0 : state.memory_total - taken;
  if (total_bytes) *total_bytes = state.memory_total;
  return pfSuccess;
}

pfResult_t World::allocate_arena(int device, size_t bytes, void** base) {
  PF_SIM_CHECK_DEVICE(device);
  if (base == nullptr) return fail(pfErrorInvalidArgument, "arena output pointer is NULL");
  if (bytes == 0) return fail(pfErrorInvalidArgument, "arena bytes 0 must be > 0");
  PF_SIM_REFUSE_IN_OWN_CALLBACK("allocate_arena");
  MutexLock lock(impl_->mutex);
  DeviceState& state = impl_->devices[static_cast<size_t>(device)];
  const size_t taken = state.memory_used + state.arena_used;
  const size_t free_bytes = taken >= state.memory_total ? 0 : state.memory_total - taken;
  if (bytes > free_bytes) {
    return fail(pfErrorOutOfMemory,
                "arena of {} bytes does not fit the {} bytes free on simulated device {}", bytes,
                free_bytes, device);
  }
  const uintptr_t address = state.next_arena_address;
  const size_t rounded = (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  state.next_arena_address += rounded + kArenaAlignment;  // a gap keeps arenas distinct
  state.arena_used += bytes;
  state.arenas.emplace(address, bytes);
  *base = reinterpret_cast<void*>(address);
  return pfSuccess;
}

pfResult_t World::free_arena(int device, void* base) {
  PF_SIM_CHECK_DEVICE(device);
  PF_SIM_REFUSE_IN_OWN_CALLBACK("free_arena");
  MutexLock lock(impl_->mutex);
  DeviceState& state = impl_->devices[static_cast<size_t>(device)];
  auto it = state.arenas.find(reinterpret_cast<uintptr_t>(base));
  if (it == state.arenas.end()) {
    return fail(pfErrorInvalidArgument, "{} is not an arena of simulated device {}", base, device);
  }
  state.arena_used -= it->second;
  state.arenas.erase(it);
  return pfSuccess;
}

// ---- Partition --------------------------------------------------------------------------------

pfResult_t World::configure_partition(int device, int reserved_sms, FillPartition* partition) {
  PF_SIM_CHECK_DEVICE(device);
  PF_SIM_REFUSE_IN_OWN_CALLBACK("configure_partition");
  MutexLock lock(impl_->mutex);
  DeviceState& state = impl_->devices[static_cast<size_t>(device)];
  if (reserved_sms < 0 || reserved_sms >= state.sm_count) {
    return fail(pfErrorInvalidArgument, "reserved_sms {} is out of range [0, {}) for {} SMs",
                reserved_sms, state.sm_count, state.sm_count);
  }
  state.reserved_sms = reserved_sms;
  state.fill_sms = state.sm_count - reserved_sms;
  if (partition) {
    partition->total_sms = state.sm_count;
    partition->fill_sms = state.fill_sms;
    partition->reserved_sms = reserved_sms;
    partition->hardware_confined = true;
    partition->mode = "simulated-partition";
  }
  return pfSuccess;
}

int World::fill_sms(int device) const {
  if (callback_world() == impl_.get()) return 0;
  MutexLock lock(impl_->mutex);
  if (!impl_->valid_device(device)) return 0;
  return impl_->devices[static_cast<size_t>(device)].fill_sms;
}

#undef PF_SIM_CHECK_DEVICE
#undef PF_SIM_REFUSE_IN_OWN_CALLBACK

}  // namespace pipefill::sim
