// SimDevice: the simulated world's clock, calibration records and graph items; the Device
// operations come from the shared engine adapter (device/engine_device.hpp).
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

SimDevice::SimDevice(World* world, std::unique_ptr<World> owned, int device_index)
    : owned_world_(std::move(owned)), port_(world, device_index) {
  world->attach();
}

SimDevice::~SimDevice() {
  // Streams and events the runtime left behind: enqueued work still runs in the world (a shared
  // world outlives us), but the handles go.
  destroy_leftovers();
  world().detach();
  // owned_world_ (a private world) is destroyed after this, with everything in it.
}

pfSimWorld_t SimDevice::world_handle() const { return handle_of(&world()); }

std::string SimDevice::name() const {
  return fmt::format("simulated device {} ({} SMs)", device_index(), sm_count());
}

pfResult_t SimDevice::collect_activity(std::vector<ActivityRecord>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "collect_activity: out is NULL");
  activity_collected_ = world().activities_since(device_index(), activity_collected_, out);
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
    return world().launch_ticket(stream, &slice, 1, graph->item_cost_us(),
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
