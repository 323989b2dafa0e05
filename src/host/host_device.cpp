// HostDevice: the Device interface forwarded to the host engine, with every exception caught
// (the runtime calls these from C entry points and from its executor thread).
#include "host/host_device.hpp"

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>
#include <new>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "core/config.hpp"

namespace pipefill::host {
namespace {

template <typename Body>
pfResult_t guarded(const char* what, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(pfErrorOutOfMemory, "host memory exhausted in host-device {}", what);
  } catch (const std::exception& error) {
    return fail(pfErrorInternal, "host-device {} failed: {}", what, error.what());
  }
}

}  // namespace

HostDevice::HostDevice(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}

HostDevice::~HostDevice() { engine_->shutdown(); }

std::string HostDevice::name() const {
  return fmt::format("host device ({} SM threads, real time)", engine_->sm_count());
}

pfResult_t HostDevice::priority_range(int* lowest, int* highest) {
  if (lowest == nullptr || highest == nullptr) {
    return fail(pfErrorInvalidArgument, "priority_range output pointer is NULL");
  }
  *lowest = kLowestPriority;
  *highest = kHighestPriority;
  return pfSuccess;
}

pfResult_t HostDevice::create_fill_stream(Stream* out) {
  return guarded("create_fill_stream",
                 [&] { return engine_->create_stream(kLowestPriority, /*fill=*/true, out); });
}

pfResult_t HostDevice::create_stream(int priority, Stream* out) {
  return guarded("create_stream",
                 [&] { return engine_->create_stream(priority, /*fill=*/false, out); });
}

pfResult_t HostDevice::destroy_stream(Stream stream) {
  return guarded("destroy_stream", [&] { return engine_->destroy_stream(stream); });
}

bool HostDevice::is_valid_main_stream(Stream stream) const {
  return engine_->is_main_stream(stream);
}

pfResult_t HostDevice::synchronize_stream(Stream stream) {
  return guarded("synchronize_stream", [&] { return engine_->synchronize_stream(stream); });
}

pfResult_t HostDevice::create_event(Event* out) {
  return guarded("create_event", [&] { return engine_->create_event(out); });
}

pfResult_t HostDevice::destroy_event(Event event) {
  return guarded("destroy_event", [&] { return engine_->destroy_event(event); });
}

pfResult_t HostDevice::record_event(Event event, Stream stream) {
  return guarded("record_event", [&] { return engine_->record_event(event, stream); });
}

pfResult_t HostDevice::stream_wait_event(Stream stream, Event event) {
  return guarded("stream_wait_event", [&] { return engine_->wait_event(stream, event); });
}

pfResult_t HostDevice::query_event(Event event, bool* done, double* time_us) {
  if (done == nullptr || time_us == nullptr) {
    return fail(pfErrorInvalidArgument, "query_event output pointer is NULL");
  }
  bool recorded = false;
  PF_TRY(engine_->event_state(event, &recorded, done, time_us));
  if (!recorded) {
    return fail(pfErrorInvalidState, "event {} was never recorded, so it has no time", event);
  }
  return pfSuccess;
}

pfResult_t HostDevice::synchronize_event(Event event) {
  return guarded("synchronize_event", [&] { return engine_->synchronize_event(event); });
}

pfResult_t HostDevice::allocate_words(size_t count, uint64_t** words) {
  return guarded("allocate_words", [&] { return engine_->allocate_words(count, words); });
}

pfResult_t HostDevice::free_words(uint64_t* words) { return engine_->free_words(words); }

// Device and host memory are the same host memory here.
pfResult_t HostDevice::allocate_host_words(size_t count, uint64_t** words) {
  return allocate_words(count, words);
}

pfResult_t HostDevice::free_host_words(uint64_t* words) { return engine_->free_words(words); }

pfResult_t HostDevice::write_word(Stream stream, uint64_t* word, uint64_t value) {
  return guarded("write_word", [&] { return engine_->write_word(stream, word, value); });
}

pfResult_t HostDevice::copy_word_to_host(Stream stream, const uint64_t* word, uint64_t* host) {
  return guarded("copy_word_to_host", [&] { return engine_->copy_word(stream, word, host); });
}

pfResult_t HostDevice::memory_info(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return fail(pfErrorInvalidArgument, "memory_info output pointer is NULL");
  }
  return engine_->memory_info(free_bytes, total_bytes);
}

pfResult_t HostDevice::allocate_arena(size_t bytes, void** base) {
  return guarded("allocate_arena", [&] { return engine_->allocate_arena(bytes, base); });
}

pfResult_t HostDevice::free_arena(void* base) { return engine_->free_arena(base); }

pfResult_t HostDevice::configure_partition(int reserved_sms, FillPartition* partition) {
  return guarded("configure_partition",
                 [&] { return engine_->configure_partition(reserved_sms, partition); });
}

// ---- Graph fill jobs -----------------------------------------------------------------------
namespace {

// A graph job on the host device: each item is a ticket item (claimed by the protocol a GPU
// block runs) that writes its index where the graph would read it, reports it, and then takes
// the job's item cost of real time (sleeping, so idle cores stay idle).
class HostGraphItems final : public GraphItems {
 public:
  explicit HostGraphItems(const GraphJobSpec& spec)
      : index_word_(spec.index_word), on_item_(spec.on_item), user_(spec.user),
        item_cost_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double, std::micro>(spec.item_cost_us))) {}
  int sms_used() const override { return 1; }  // launch_graph_items runs items on one worker

  static void run_item(void* self, uint64_t item) {
    auto* items = static_cast<HostGraphItems*>(self);
    const auto start = std::chrono::steady_clock::now();
    std::atomic_ref<uint64_t>(*items->index_word_).store(item);
    if (items->on_item_ != nullptr) items->on_item_(items->user_, item);
    std::this_thread::sleep_until(start + items->item_cost_);
  }

 private:
  uint64_t* index_word_;
  pfGraphItemFn on_item_;
  void* user_;
  std::chrono::steady_clock::duration item_cost_;
};

}  // namespace

pfResult_t HostDevice::prepare_graph_items(const GraphJobSpec& spec,
                                           std::unique_ptr<GraphItems>* out) {
  return guarded("prepare_graph_items", [&] {
    *out = std::make_unique<HostGraphItems>(spec);
    return pfSuccess;
  });
}

pfResult_t HostDevice::launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice,
                                          Stream stream) {
  auto* graph = dynamic_cast<HostGraphItems*>(&items);
  if (graph == nullptr) {
    return fail(pfErrorInternal, "launch_graph_items: the items were not prepared by {}", name());
  }
  return guarded("launch_graph_items", [&] {
    return engine_->launch_ticket(stream, &slice, 1, &HostGraphItems::run_item, graph);
  });
}

}  // namespace pipefill::host

namespace pipefill {

pfResult_t make_host_device(const RuntimeOptions& options, std::unique_ptr<Device>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "device output pointer is NULL");
  try {
    host::EngineOptions engine_options;
    PF_TRY(host::engine_options_from_env(&engine_options));
    std::shared_ptr<host::Engine> engine;
    PF_TRY(host::Engine::create(engine_options, &engine));
    if (options.device != 0) {
      log::debug("the host device is private to its runtime; device {} is ignored",
                 options.device);
    }
    *out = std::make_unique<host::HostDevice>(std::move(engine));
    return pfSuccess;
  } catch (const std::bad_alloc&) {
    return fail(pfErrorOutOfMemory, "host memory exhausted creating the host device");
  } catch (const std::exception& error) {
    return fail(pfErrorInternal, "creating the host device failed: {}", error.what());
  }
}

}  // namespace pipefill
