// The one adapter from an in-process engine to pipefill::Device, shared by the simulated device
// (sim/sim_device.hpp) and the real-time host device (host/host_device.hpp). Both engines offer
// the same operations on one device (a "port", below); this class does once what each adapter
// used to repeat: null-checked queries, every engine call wrapped so that no exception escapes
// (the runtime calls devices from C entry points and its executor thread), the streams and
// events it created remembered so that those the runtime leaves behind can be destroyed.
//
// A port is any type with these members (host::Engine is one; sim::WorldPort binds a device of
// a simulated world to them):
//   static constexpr int kLowestPriority, kHighestPriority;
//   create_stream(int priority, bool fill, void**), destroy_stream(void*),
//   is_main_stream(const void*) const, synchronize_stream(void*),
//   create_event(void**), destroy_event(void*), record_event(void* event, void* stream),
//   wait_event(void* stream, void* event), event_state(void*, bool*, bool*, double*) const,
//   event_item_failures(void*, uint64_t* count, uint64_t* not_run, std::string* first) const,
//   synchronize_event(void*), allocate_words(size_t, uint64_t**), free_words(uint64_t*),
//   write_word(void*, uint64_t*, uint64_t), write_word_max(same), copy_word(void*, const uint64_t*, uint64_t*),
//   memory_info(size_t*, size_t*) const, allocate_arena(size_t, void**), free_arena(void*),
//   configure_partition(int, FillPartition*), sm_count() const, now_us() const
// Derived classes (CRTP) provide `Port& port() const` and `static constexpr const char* kWhat`
// (the device kind, for messages), and add what is theirs (names, graph items, the clock).
#pragma once

#include <exception>
#include <new>
#include <string>
#include <unordered_set>

#include "common/error.hpp"
#include "common/mutex.hpp"
#include "common/thread_annotations.hpp"
#include "device/device.hpp"

namespace pipefill {

template <typename Derived, typename Port>
class EngineDevice : public Device {
 public:
  pfResult_t priority_range(int* lowest, int* highest) override {
    if (lowest == nullptr || highest == nullptr) {
      return fail(pfErrorInvalidArgument, "priority_range output pointer is NULL");
    }
    *lowest = Port::kLowestPriority;
    *highest = Port::kHighestPriority;
    return pfSuccess;
  }
  pfResult_t create_fill_stream(Stream* out) override {
    return make_stream("create_fill_stream", Port::kLowestPriority, /*fill=*/true, out);
  }
  pfResult_t create_stream(int priority, Stream* out) override {
    return make_stream("create_stream", priority, /*fill=*/false, out);
  }
  pfResult_t destroy_stream(Stream stream) override {
    return guarded("destroy_stream", [&] {
      PF_TRY(port().destroy_stream(stream));
      MutexLock lock(created_mutex_);
      streams_.erase(stream);
      return pfSuccess;
    });
  }
  bool is_valid_main_stream(Stream stream) const override {
    return port().is_main_stream(stream);
  }
  pfResult_t synchronize_stream(Stream stream) override {
    return guarded("synchronize_stream", [&] { return port().synchronize_stream(stream); });
  }

  pfResult_t create_event(Event* out) override {
    return guarded("create_event", [&] {
      PF_TRY(port().create_event(out));
      MutexLock lock(created_mutex_);
      events_.insert(*out);
      return pfSuccess;
    });
  }
  pfResult_t destroy_event(Event event) override {
    return guarded("destroy_event", [&] {
      PF_TRY(port().destroy_event(event));
      MutexLock lock(created_mutex_);
      events_.erase(event);
      return pfSuccess;
    });
  }
  pfResult_t record_event(Event event, Stream stream) override {
    return guarded("record_event", [&] { return port().record_event(event, stream); });
  }
  pfResult_t stream_wait_event(Stream stream, Event event) override {
    return guarded("stream_wait_event", [&] { return port().wait_event(stream, event); });
  }
  pfResult_t query_event(Event event, bool* done, double* time_us) override {
    if (done == nullptr || time_us == nullptr) {
      return fail(pfErrorInvalidArgument, "query_event output pointer is NULL");
    }
    bool recorded = false;
    PF_TRY(port().event_state(event, &recorded, done, time_us));
    if (!recorded) {
      return fail(pfErrorInvalidState, "event {} was never recorded, so it has no time", event);
    }
    return pfSuccess;
  }
  // Item functions that threw in the launches after `slice_start` on its stream (the engine
  // stops their block and runs on); 0 for an event it does not know.
  uint64_t item_failures(Event slice_start, uint64_t* not_run, std::string* first) override {
    uint64_t count = 0;
    *not_run = 0;
    if (port().event_item_failures(slice_start, &count, not_run, first) != pfSuccess) return 0;
    return count;
  }
  pfResult_t synchronize_event(Event event) override {
    return guarded("synchronize_event", [&] { return port().synchronize_event(event); });
  }

  pfResult_t allocate_words(size_t count, uint64_t** words) override {
    return guarded("allocate_words", [&] { return port().allocate_words(count, words); });
  }
  pfResult_t free_words(uint64_t* words) override { return port().free_words(words); }
  // Device and host memory are the same plain host memory in both engines.
  pfResult_t allocate_host_words(size_t count, uint64_t** words) override {
    return allocate_words(count, words);
  }
  pfResult_t free_host_words(uint64_t* words) override { return port().free_words(words); }
  pfResult_t write_word(Stream stream, uint64_t* word, uint64_t value) override {
    return guarded("write_word", [&] { return port().write_word(stream, word, value); });
  }
  pfResult_t write_word_max(Stream stream, uint64_t* word, uint64_t value) override {
    return guarded("write_word_max", [&] { return port().write_word_max(stream, word, value); });
  }
  pfResult_t copy_word_to_host(Stream stream, const uint64_t* word, uint64_t* host) override {
    return guarded("copy_word_to_host", [&] { return port().copy_word(stream, word, host); });
  }

  pfResult_t memory_info(size_t* free_bytes, size_t* total_bytes) override {
    if (free_bytes == nullptr || total_bytes == nullptr) {
      return fail(pfErrorInvalidArgument, "memory_info output pointer is NULL");
    }
    return port().memory_info(free_bytes, total_bytes);
  }
  pfResult_t allocate_arena(size_t bytes, void** base) override {
    return guarded("allocate_arena", [&] { return port().allocate_arena(bytes, base); });
  }
  pfResult_t free_arena(void* base) override { return port().free_arena(base); }

  int sm_count() const override { return port().sm_count(); }
  pfResult_t configure_partition(int reserved_sms, FillPartition* partition) override {
    return guarded("configure_partition",
                   [&] { return port().configure_partition(reserved_sms, partition); });
  }
  double now_us() override { return port().now_us(); }

 protected:
  EngineDevice() = default;
  ~EngineDevice() override = default;

  Port& port() const { return static_cast<const Derived*>(this)->port(); }

  // Runs `body` (returning pfResult_t) with every exception turned into a result: the engines
  // throw only on allocation failure, but nothing may cross into the runtime.
  template <typename Body>
  pfResult_t guarded(const char* what, Body&& body) const {
    try {
      return body();
    } catch (const std::bad_alloc&) {
      return fail(pfErrorOutOfMemory, "host memory exhausted in {} {}", Derived::kWhat, what);
    } catch (const std::exception& error) {
      return fail(pfErrorInternal, "{} {} failed: {}", Derived::kWhat, what, error.what());
    }
  }

  // Destroys the streams and events this device created that the runtime did not (a runtime
  // that failed half-way, a forced cleanup); handles that died meanwhile (destroyed behind the
  // runtime's back) are skipped. Work already enqueued still runs in the engine.
  void destroy_leftovers() {
    MutexLock lock(created_mutex_);
    for (void* stream : streams_) {
      if (port().is_live_stream(stream)) port().destroy_stream(stream);
    }
    for (void* event : events_) {
      if (port().is_live_event(event)) port().destroy_event(event);
    }
    streams_.clear();
    events_.clear();
  }

 private:
  pfResult_t make_stream(const char* what, int priority, bool fill, Stream* out) {
    return guarded(what, [&] {
      PF_TRY(port().create_stream(priority, fill, out));
      MutexLock lock(created_mutex_);
      streams_.insert(*out);
      return pfSuccess;
    });
  }

  mutable Mutex created_mutex_;
  std::unordered_set<void*> streams_ GUARDED_BY(created_mutex_);
  std::unordered_set<void*> events_ GUARDED_BY(created_mutex_);
};

}  // namespace pipefill