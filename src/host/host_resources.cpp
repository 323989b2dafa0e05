// The host-device engine's resources: handles and their registry, events, device words (with
// deferred frees while queued operations use them), arena memory, the fill partition, and the
// PIPEFILL_HOST_* tunables.
#include <algorithm>
#include <cstdlib>
#include <new>
#include <unordered_map>

#include "common/error.hpp"
#include "core/config.hpp"
#include "host/host_engine.hpp"
#include "host/host_engine_internal.hpp"

namespace pipefill::host {
namespace {

// Leaked on purpose: it must outlive every static object that might still hold a handle.
struct Registry {
  Mutex mutex;
  std::unordered_map<uintptr_t, std::weak_ptr<Engine>> streams GUARDED_BY(mutex);
};

Registry& registry() {
  static Registry* instance = new Registry;
  return *instance;
}

std::atomic<uint64_t> g_next_serial{1};

constexpr size_t kWordAlignment = 256;
constexpr size_t kMaxWords = size_t{1} << 32;

}  // namespace

uintptr_t make_handle(uint64_t tag) {
  const uint64_t serial = g_next_serial.fetch_add(1) & ((uint64_t{1} << 48) - 1);
  return static_cast<uintptr_t>((tag << 48) | serial);
}

void register_stream(uintptr_t handle, const std::weak_ptr<Engine>& engine) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  reg.streams[handle] = engine;
}

void unregister_stream(uintptr_t handle) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  reg.streams.erase(handle);
}

std::shared_ptr<Engine> Engine::engine_of_stream(const void* stream) {
  Registry& reg = registry();
  MutexLock lock(reg.mutex);
  const auto it = reg.streams.find(as_handle(stream));
  return it == reg.streams.end() ? nullptr : it->second.lock();
}

namespace {

// An integer environment variable in [lowest, highest] into *out (unset: *out stays); anything
// else is pfErrorInvalidArgument naming the variable, the value and the range.
pfResult_t int_from_env(const char* name, long lowest, long highest, int* out) {
  const char* text = std::getenv(name);
  if (text == nullptr) return pfSuccess;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < lowest || value > highest) {
    return fail(pfErrorInvalidArgument,
                "environment variable {}='{}' is not an integer in [{}, {}]", name, text, lowest,
                highest);
  }
  *out = static_cast<int>(value);
  return pfSuccess;
}

}  // namespace

pfResult_t engine_options_from_env(EngineOptions* out) {
  PF_TRY(int_from_env("PIPEFILL_HOST_SMS", 1, kMaxSmCount, &out->sm_count));
  if (const char* text = std::getenv("PIPEFILL_HOST_MEMORY_BYTES")) {
    size_t bytes = 0;
    if (!parse_size(text, &bytes) || bytes == 0) {
      return fail(pfErrorInvalidArgument,
                  "environment variable PIPEFILL_HOST_MEMORY_BYTES='{}' is not a size > 0 "
                  "(bytes, K/M/G suffix)", text);
    }
    out->memory_bytes = bytes;
  }
  PF_TRY(int_from_env("PIPEFILL_HOST_FILL_NICE", 0, 19, &out->fill_nice));
  int time_budget = out->time_budget ? 1 : 0;
  PF_TRY(int_from_env("PIPEFILL_HOST_TIME_BUDGET", 0, 1, &time_budget));
  out->time_budget = time_budget != 0;
  return pfSuccess;
}

// ---- Events ---------------------------------------------------------------------------------

Engine::Event* Engine::live_event(const void* handle) const {
  const auto it = events_.find(as_handle(handle));
  return it == events_.end() ? nullptr : it->second.get();
}

#define PF_HOST_LOOKUP_EVENT(var, handle)                                                    \
  PF_TRY(check_open());                                                                      \
  Event* var = live_event(handle);                                                           \
  if (var == nullptr) {                                                                      \
    return fail(pfErrorInvalidArgument, "event {} is not a live event of this host device",  \
                static_cast<const void*>(handle));                                           \
  }

pfResult_t Engine::create_event(void** out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "event output pointer is NULL");
  auto event = std::make_unique<Event>();
  const uintptr_t handle = make_handle(kEventTag);
  MutexLock lock(mutex_);
  PF_TRY(check_open());
  events_.emplace(handle, std::move(event));
  *out = as_pointer(handle);
  return pfSuccess;
}

pfResult_t Engine::destroy_event(void* handle) {
  MutexLock lock(mutex_);
  PF_HOST_LOOKUP_EVENT(event, handle);
  (void)event;  // records already captured by queued operations stay alive (shared)
  events_.erase(as_handle(handle));
  return pfSuccess;
}

pfResult_t Engine::record_event(void* event_handle, void* stream_handle) {
  Op op;
  op.type = OpType::Record;
  op.record = std::make_shared<Record>();
  MutexLock lock(mutex_);
  PF_HOST_LOOKUP_EVENT(event, event_handle);
  Stream* stream = live_stream(stream_handle);
  if (stream == nullptr) {
    return fail(pfErrorInvalidArgument, "stream {} is not a live stream of this host device",
                stream_handle);
  }
  std::shared_ptr<Record> record = op.record;
  PF_TRY(enqueue_locked(stream, std::move(op)));
  event->latest = std::move(record);  // only once the record is queued: a failure changes nothing
  return pfSuccess;
}

pfResult_t Engine::wait_event(void* stream_handle, void* event_handle) {
  MutexLock lock(mutex_);
  PF_HOST_LOOKUP_EVENT(event, event_handle);
  Stream* stream = live_stream(stream_handle);
  if (stream == nullptr) {
    return fail(pfErrorInvalidArgument, "stream {} is not a live stream of this host device",
                stream_handle);
  }
  Op op;
  op.type = OpType::Wait;
  op.record = event->latest;  // CUDA semantics: the record that is latest now
  return enqueue_locked(stream, std::move(op));
}

pfResult_t Engine::event_state(void* handle, bool* recorded, bool* done, double* time_us) const {
  MutexLock lock(mutex_);
  PF_HOST_LOOKUP_EVENT(event, handle);
  const Record* record = event->latest.get();
  if (recorded) *recorded = record != nullptr;
  if (done) *done = record != nullptr && record->done;
  if (time_us) *time_us = (record != nullptr && record->done) ? record->time_us : -1.0;
  return pfSuccess;
}

pfResult_t Engine::event_item_failures(void* handle, uint64_t* count, uint64_t* not_run,
                                       std::string* first) const {
  MutexLock lock(mutex_);
  PF_HOST_LOOKUP_EVENT(event, handle);
  const Record* record = event->latest.get();
  *count = record != nullptr ? record->item_failures : 0;
  *not_run = record != nullptr ? record->items_not_run : 0;
  if (first != nullptr) *first = record != nullptr ? record->first_item_failure : std::string();
  return pfSuccess;
}

pfResult_t Engine::synchronize_event(void* handle) {
  MutexLock lock(mutex_);
  PF_HOST_LOOKUP_EVENT(event, handle);
  if (ThreadRole::stream != nullptr || ThreadRole::block) {
    return fail(pfErrorInvalidState,
                "synchronizing event {} from a stream thread or fill block of the host device "
                "could wait for the calling thread itself", handle);
  }
  std::shared_ptr<Record> record = event->latest;
  if (record == nullptr) return pfSuccess;  // never recorded: nothing to wait for (CUDA)
  progress_.wait(mutex_, [&] {
    mutex_.assert_held();
    return record->done || stopping_;
  });
  return check_open();
}

#undef PF_HOST_LOOKUP_EVENT

// ---- Words ----------------------------------------------------------------------------------

pfResult_t Engine::allocate_words(size_t count, uint64_t** words) {
  if (words == nullptr) return fail(pfErrorInvalidArgument, "words output pointer is NULL");
  if (count == 0 || count > kMaxWords) {
    return fail(pfErrorInvalidArgument, "word count {} is out of range [1, 2^32]", count);
  }
  auto* memory = static_cast<uint64_t*>(
      ::operator new[](count * sizeof(uint64_t), std::align_val_t{kWordAlignment}));
  std::fill(memory, memory + count, uint64_t{0});
  MutexLock lock(mutex_);
  if (stopping_) {
    ::operator delete[](memory, std::align_val_t{kWordAlignment});
    return check_open();
  }
  WordBlock block;
  block.count = count;
  words_.emplace(reinterpret_cast<uintptr_t>(memory), block);
  *words = memory;
  return pfSuccess;
}

pfResult_t Engine::free_words(uint64_t* words) {
  MutexLock lock(mutex_);
  PF_TRY(check_open());
  auto it = words_.find(reinterpret_cast<uintptr_t>(words));
  if (it == words_.end() || it->second.freed) {
    return fail(pfErrorInvalidArgument, "words {} were not allocated by this host device (or "
                "were freed already)", static_cast<const void*>(words));
  }
  if (it->second.pins > 0) {
    it->second.freed = true;  // deleted once the queued operations using them have run
    return pfSuccess;
  }
  ::operator delete[](words, std::align_val_t{kWordAlignment});
  words_.erase(it);
  return pfSuccess;
}

pfResult_t Engine::pin_word(const void* word, Op* op) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(word);
  auto it = words_.upper_bound(address);
  if (it == words_.begin()) return pfSuccess;  // not the engine's words: the caller's memory
  --it;
  if (address >= it->first + it->second.count * sizeof(uint64_t)) return pfSuccess;
  if (it->second.freed) {
    return fail(pfErrorInvalidArgument, "word {} belongs to words this host device has freed",
                word);
  }
  ++it->second.pins;
  op->pinned[op->pin_count++] = it->first;
  return pfSuccess;
}

void Engine::unpin_words(Op& op) {
  for (int i = 0; i < op.pin_count; ++i) {
    auto it = words_.find(op.pinned[i]);
    if (it == words_.end()) continue;
    if (--it->second.pins == 0 && it->second.freed) {
      ::operator delete[](reinterpret_cast<uint64_t*>(it->first), std::align_val_t{kWordAlignment});
      words_.erase(it);
    }
  }
  op.pin_count = 0;
}

// ---- Memory and partition -------------------------------------------------------------------

pfResult_t Engine::memory_info(size_t* free_bytes, size_t* total_bytes) const {
  MutexLock lock(mutex_);
  if (free_bytes) *free_bytes = arena_used_ >= memory_bytes_ ? 0 : memory_bytes_ - arena_used_;
  if (total_bytes) *total_bytes = memory_bytes_;
  return pfSuccess;
}

pfResult_t Engine::allocate_arena(size_t bytes, void** base) {
  if (base == nullptr) return fail(pfErrorInvalidArgument, "arena output pointer is NULL");
  if (bytes == 0) return fail(pfErrorInvalidArgument, "arena bytes 0 must be > 0");
  MutexLock lock(mutex_);
  PF_TRY(check_open());
  const size_t free_bytes = arena_used_ >= memory_bytes_ ? 0 : memory_bytes_ - arena_used_;
  if (bytes > free_bytes) {
    return fail(pfErrorOutOfMemory,
                "arena of {} bytes does not fit the {} bytes free on the host device "
                "(PIPEFILL_HOST_MEMORY_BYTES)", bytes, free_bytes);
  }
  auto* memory = static_cast<unsigned char*>(
      ::operator new[](bytes, std::align_val_t{kWordAlignment}, std::nothrow));
  if (memory == nullptr) {
    return fail(pfErrorOutOfMemory, "host memory exhausted allocating an arena of {} bytes", bytes);
  }
  arenas_.emplace(reinterpret_cast<uintptr_t>(memory), bytes);
  arena_used_ += bytes;
  *base = memory;
  return pfSuccess;
}

pfResult_t Engine::free_arena(void* base) {
  MutexLock lock(mutex_);
  PF_TRY(check_open());
  auto it = arenas_.find(reinterpret_cast<uintptr_t>(base));
  if (it == arenas_.end()) {
    return fail(pfErrorInvalidArgument, "{} is not an arena of this host device", base);
  }
  arena_used_ -= it->second;
  ::operator delete[](static_cast<unsigned char*>(base), std::align_val_t{kWordAlignment});
  arenas_.erase(it);
  return pfSuccess;
}

pfResult_t Engine::configure_partition(int reserved_sms, FillPartition* partition) {
  MutexLock lock(mutex_);
  PF_TRY(check_open());
  if (reserved_sms < 0 || reserved_sms >= sm_count_) {
    return fail(pfErrorInvalidArgument, "reserved_sms {} is out of range [0, {}) for {} SMs",
                reserved_sms, sm_count_, sm_count_);
  }
  reserved_sms_ = reserved_sms;
  fill_sms_ = sm_count_ - reserved_sms;
  block_cv_.notify_all();
  if (partition) {
    partition->total_sms = sm_count_;
    partition->fill_sms = fill_sms_;
    partition->reserved_sms = reserved_sms;
    partition->hardware_confined = true;  // at most fill_sms blocks run at once, enforced here
    partition->mode = "host-threads";
  }
  return pfSuccess;
}

int Engine::fill_sms() const {
  MutexLock lock(mutex_);
  return fill_sms_;
}

int Engine::max_concurrent_blocks() const {
  MutexLock lock(mutex_);
  return max_fill_running_;
}

}  // namespace pipefill::host
