#include "sim/sim_device.hpp"

#include <atomic>
#include <exception>
#include <new>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "core/config.hpp"
#include "sim/sim_handles.hpp"

namespace pipefill::sim {
namespace {

// Device methods must not throw (the runtime calls them from C entry points and its executor
// thread); the only throwing operations here are allocations in the bookkeeping sets.
template <typename Body>
pfResult_t guarded(const char* what, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(pfErrorOutOfMemory, "host memory exhausted in simulated {}", what);
  } catch (const std::exception& error) {
    return fail(pfErrorInternal, "simulated {} failed: {}", what, error.what());
  }
}

}  // namespace

SimDevice::SimDevice(World* world, std::unique_ptr<World> owned, int device_index)
    : world_(world), owned_world_(std::move(owned)), device_(device_index) {
  world_->attach();
}

SimDevice::~SimDevice() {
  // Streams and events the runtime left behind: enqueued work still runs in the world (a shared
  // world outlives us), but the handles go.
  {
    MutexLock lock(created_mutex_);
    for (void* stream : streams_) world_->destroy_stream(stream);
    for (void* event : events_) world_->destroy_event(event);
    streams_.clear();
    events_.clear();
  }
  world_->detach();
  // owned_world_ (a private world) is destroyed after this, with everything in it.
}

pfSimWorld_t SimDevice::world_handle() const { return handle_of(world_); }

std::string SimDevice::name() const {
  return fmt::format("simulated device {} ({} SMs)", device_, world_->sm_count(device_));
}

pfResult_t SimDevice::priority_range(int* lowest, int* highest) {
  if (lowest == nullptr || highest == nullptr) {
    return fail(pfErrorInvalidArgument, "priority_range output pointer is NULL");
  }
  *lowest = kLowestPriority;
  *highest = kHighestPriority;
  return pfSuccess;
}

pfResult_t SimDevice::create_fill_stream(Stream* out) {
  return guarded("create_fill_stream", [&] {
    PF_TRY(world_->create_stream(device_, kLowestPriority, /*fill=*/true, out));
    MutexLock lock(created_mutex_);
    streams_.insert(*out);
    return pfSuccess;
  });
}

pfResult_t SimDevice::create_stream(int priority, Stream* out) {
  return guarded("create_stream", [&] {
    PF_TRY(world_->create_stream(device_, priority, /*fill=*/false, out));
    MutexLock lock(created_mutex_);
    streams_.insert(*out);
    return pfSuccess;
  });
}

pfResult_t SimDevice::destroy_stream(Stream stream) {
  return guarded("destroy_stream", [&] {
    PF_TRY(world_->destroy_stream(stream));
    MutexLock lock(created_mutex_);
    streams_.erase(stream);
    return pfSuccess;
  });
}

bool SimDevice::is_valid_main_stream(Stream stream) const {
  return world_->is_main_stream_of(stream, device_);
}

pfResult_t SimDevice::synchronize_stream(Stream stream) {
  return guarded("synchronize_stream", [&] { return world_->synchronize_stream(stream); });
}

pfResult_t SimDevice::create_event(Event* out) {
  return guarded("create_event", [&] {
    PF_TRY(world_->create_event(out));
    MutexLock lock(created_mutex_);
    events_.insert(*out);
    return pfSuccess;
  });
}

pfResult_t SimDevice::destroy_event(Event event) {
  return guarded("destroy_event", [&] {
    PF_TRY(world_->destroy_event(event));
    MutexLock lock(created_mutex_);
    events_.erase(event);
    return pfSuccess;
  });
}

pfResult_t SimDevice::record_event(Event event, Stream stream) {
  return guarded("record_event", [&] { return world_->record_event(event, stream); });
}

pfResult_t SimDevice::stream_wait_event(Stream stream, Event event) {
  return guarded("stream_wait_event", [&] { return world_->wait_event(stream, event, 0.0, 0); });
}

pfResult_t SimDevice::query_event(Event event, bool* done, double* time_us) {
  if (done == nullptr || time_us == nullptr) {
    return fail(pfErrorInvalidArgument, "query_event output pointer is NULL");
  }
  bool recorded = false;
  PF_TRY(world_->event_state(event, &recorded, done, time_us));
  if (!recorded) {
    return fail(pfErrorInvalidState, "event {} was never recorded, so it has no time", event);
  }
  return pfSuccess;
}

pfResult_t SimDevice::synchronize_event(Event event) {
  return guarded("synchronize_event", [&] { return world_->synchronize_event(event); });
}

pfResult_t SimDevice::allocate_words(size_t count, uint64_t** words) {
  return guarded("allocate_words", [&] { return world_->allocate_words(count, words); });
}

pfResult_t SimDevice::free_words(uint64_t* words) { return world_->free_words(words); }

// In the simulation device and host memory are the same plain host memory.
pfResult_t SimDevice::allocate_host_words(size_t count, uint64_t** words) {
  return allocate_words(count, words);
}

pfResult_t SimDevice::free_host_words(uint64_t* words) { return world_->free_words(words); }

pfResult_t SimDevice::write_word(Stream stream, uint64_t* word, uint64_t value) {
  return guarded("write_word", [&] { return world_->write_word(stream, word, value); });
}

pfResult_t SimDevice::copy_word_to_host(Stream stream, const uint64_t* word, uint64_t* host) {
  return guarded("copy_word_to_host", [&] { return world_->copy_word(stream, word, host); });
}

pfResult_t SimDevice::memory_info(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return fail(pfErrorInvalidArgument, "memory_info output pointer is NULL");
  }
  return world_->memory_info(device_, free_bytes, total_bytes);
}

pfResult_t SimDevice::allocate_arena(size_t bytes, void** base) {
  return guarded("allocate_arena", [&] { return world_->allocate_arena(device_, bytes, base); });
}

pfResult_t SimDevice::free_arena(void* base) { return world_->free_arena(device_, base); }

int SimDevice::sm_count() const { return world_->sm_count(device_); }

pfResult_t SimDevice::configure_partition(int reserved_sms, FillPartition* partition) {
  return guarded("configure_partition",
                 [&] { return world_->configure_partition(device_, reserved_sms, partition); });
}

double SimDevice::now_us() { return world_->now(); }

pfResult_t SimDevice::collect_activity(std::vector<ActivityRecord>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "collect_activity: out is NULL");
  activity_collected_ = world_->activities_since(device_, activity_collected_, out);
  return pfSuccess;
}

// ---- Graph fill jobs -----------------------------------------------------------------------
namespace {

// A graph job on the simulator: the graph is not run (there is no GPU); each item is a ticket
// item of the job's cost that writes its index where the graph would read it, then reports it.
class SimGraphItems final : public GraphItems {
 public:
  explicit SimGraphItems(const GraphJobSpec& spec)
      : index_word_(spec.index_word), on_item_(spec.on_item), user_(spec.user),
        item_cost_us_(spec.item_cost_us) {}
  double item_cost_us() const { return item_cost_us_; }
  int sms_used() const override { return 1; }  // launch_graph_items runs items on one worker

  static void run_item(void* self, uint64_t item) {
    auto* items = static_cast<SimGraphItems*>(self);
    std::atomic_ref<uint64_t>(*items->index_word_).store(item);
    if (items->on_item_ != nullptr) items->on_item_(items->user_, item);
  }

 private:
  uint64_t* index_word_;
  pfGraphItemFn on_item_;
  void* user_;
  double item_cost_us_;
};

}  // namespace

pfResult_t SimDevice::prepare_graph_items(const GraphJobSpec& spec,
                                          std::unique_ptr<GraphItems>* out) {
  return guarded("prepare_graph_items", [&] {
    *out = std::make_unique<SimGraphItems>(spec);
    return pfSuccess;
  });
}

pfResult_t SimDevice::launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice,
                                         Stream stream) {
  auto* graph = dynamic_cast<SimGraphItems*>(&items);
  if (graph == nullptr) {
    return fail(pfErrorInternal, "launch_graph_items: the items were not prepared by {}", name());
  }
  return guarded("launch_graph_items", [&] {
    return world_->launch_ticket(stream, &slice, 1, graph->item_cost_us(),
                                 &SimGraphItems::run_item, graph);
  });
}

}  // namespace pipefill::sim

namespace pipefill {

pfResult_t make_sim_device(const RuntimeOptions& options, std::unique_ptr<Device>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "device output pointer is NULL");
  try {
    if (options.sim_world != nullptr) {
      // Pinned while the device attaches, so a racing pfSimWorldDestroy cannot free it.
      const sim::WorldPin pin = sim::pin_world(options.sim_world);
      sim::World* world = pin.get();
      if (world == nullptr) {
        return fail(pfErrorInvalidArgument, "sim_world {} is not a live simulated world",
                    static_cast<const void*>(options.sim_world));
      }
      if (options.device < 0 || options.device >= world->device_count()) {
        return fail(pfErrorInvalidArgument,
                    "device {} is out of range [0, {}) for the simulated world", options.device,
                    world->device_count());
      }
      *out = std::make_unique<sim::SimDevice>(world, nullptr, options.device);
      return pfSuccess;
    }
    pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
    desc.sm_count = options.sim_sm_count;
    desc.memory_bytes = options.sim_memory_bytes;
    std::unique_ptr<sim::World> world;
    PF_TRY(sim::World::create(1, &desc, options.sim_seed, &world));
    if (options.device != 0) {
      log::debug("private simulated world has one device; using it for device {}",
                 options.device);
    }
    sim::World* raw = world.get();
    *out = std::make_unique<sim::SimDevice>(raw, std::move(world), 0);
    return pfSuccess;
  } catch (const std::bad_alloc&) {
    return fail(pfErrorOutOfMemory, "host memory exhausted creating the simulated device");
  } catch (const std::exception& error) {
    return fail(pfErrorInternal, "creating the simulated device failed: {}", error.what());
  }
}

}  // namespace pipefill
