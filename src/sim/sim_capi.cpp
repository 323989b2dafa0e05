// The pfSim* C functions: validate handles, pin the world for the call (a racing
// pfSimWorldDestroy waits for it), forward to sim::World, and make sure no exception crosses the
// C boundary. Every call clears this thread's last error first. Called from inside a simulated
// on_item callback (which runs with the world locked) every call but pfSimNow fails with
// pfErrorInvalidState instead of deadlocking; pfSimNow there returns the item's time.

#include "common/c_boundary.hpp"
#include "common/callback_scope.hpp"
#include "common/error.hpp"
#include "pipefill/pipefill.h"
#include "sim/sim_engine.hpp"
#include "sim/sim_handles.hpp"
#include "sim/sim_world.hpp"

using pipefill::fail;
using pipefill::sim::World;
using pipefill::sim::WorldPin;

namespace {

// The common guard (common/c_boundary.hpp), after refusing a call from inside an on_item
// callback (the world is locked there).
template <typename Body>
pfResult_t c_boundary(const char* function, Body&& body) noexcept {
  return pipefill::c_boundary(function, [&]() -> pfResult_t {
    if (pipefill::sim::callback_world() != nullptr) {
      return fail(pfErrorInvalidState,
                  "{}: called from inside a simulated on_item callback, which runs with the "
                  "world locked; the callback must not call pfSim* functions (pfSimNow excepted)",
                  function);
    }
    return body();
  });
}

pfResult_t find_world(pfSimWorld_t handle, WorldPin* pin) {
  *pin = pipefill::sim::pin_world(handle);
  if (!*pin) {
    return fail(pfErrorInvalidArgument, "world {} is not a live simulated world",
                static_cast<const void*>(handle));
  }
  return pfSuccess;
}

pfResult_t find_stream_world(const void* stream, WorldPin* pin) {
  *pin = pipefill::sim::pin_world_of_stream(stream);
  if (!*pin) {
    return fail(pfErrorInvalidArgument, "stream {} is not a live simulated stream", stream);
  }
  return pfSuccess;
}

pfResult_t find_event_world(const void* event, WorldPin* pin) {
  *pin = pipefill::sim::pin_world_of_event(event);
  if (!*pin) {
    return fail(pfErrorInvalidArgument, "event {} is not a live simulated event", event);
  }
  return pfSuccess;
}

// Running the world from inside a job callback (its launch runs in the world's pre-run hook)
// would deadlock on the hooks: refused, naming the callback.
pfResult_t refuse_run_inside_callback(const char* function) {
  if (const char* callback = pipefill::CallbackScope::active()) {
    return fail(pfErrorInvalidState, "{}: called from inside a {} callback; the world cannot be "
                "run from a callback", function, callback);
  }
  return pfSuccess;
}

}  // namespace

extern "C" {

PF_API pfResult_t pfSimWorldCreate(int device_count, const pfSimDeviceDesc_t* desc,
                                   uint64_t seed, pfSimWorld_t* world) {
  return c_boundary("pfSimWorldCreate", [&]() -> pfResult_t {
    if (world == nullptr) return fail(pfErrorInvalidArgument, "world output pointer is NULL");
    std::unique_ptr<World> created;
    PF_TRY(World::create(device_count, desc, seed, &created));
    *world = pipefill::sim::handle_of(created.release());
    return pfSuccess;
  });
}

PF_API pfResult_t pfSimWorldDestroy(pfSimWorld_t handle) {
  return c_boundary("pfSimWorldDestroy", [&]() -> pfResult_t {
    // Refuses a world with devices attached; waits for calls still using the world.
    World* world = nullptr;
    PF_TRY(pipefill::sim::retire_world(handle, &world));
    delete world;
    return pfSuccess;
  });
}

PF_API pfResult_t pfSimStreamCreate(pfSimWorld_t handle, int device, int priority,
                                    void** stream) {
  return c_boundary("pfSimStreamCreate", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_world(handle, &world_pin));
    World* world = world_pin.get();
    return world->create_stream(device, priority, /*fill=*/false, stream);
  });
}

PF_API pfResult_t pfSimStreamDestroy(void* stream) {
  return c_boundary("pfSimStreamDestroy", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_stream_world(stream, &world_pin));
    World* world = world_pin.get();
    return world->destroy_stream(stream);
  });
}

PF_API pfResult_t pfSimLaunchKernel(void* stream, double duration_us, int sm_count) {
  return c_boundary("pfSimLaunchKernel", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_stream_world(stream, &world_pin));
    World* world = world_pin.get();
    return world->launch_kernel(stream, duration_us, sm_count);
  });
}

PF_API pfResult_t pfSimLaunchKernelBlocks(void* stream, int blocks, double block_us) {
  return c_boundary("pfSimLaunchKernelBlocks", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_stream_world(stream, &world_pin));
    World* world = world_pin.get();
    return world->launch_kernel_blocks(stream, blocks, block_us);
  });
}

PF_API pfResult_t pfSimStreamDelay(void* stream, double duration_us) {
  return c_boundary("pfSimStreamDelay", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_stream_world(stream, &world_pin));
    World* world = world_pin.get();
    return world->delay(stream, duration_us);
  });
}

PF_API pfResult_t pfSimEventCreate(pfSimWorld_t handle, pfSimEvent_t* event) {
  return c_boundary("pfSimEventCreate", [&]() -> pfResult_t {
    if (event == nullptr) return fail(pfErrorInvalidArgument, "event output pointer is NULL");
    WorldPin world_pin;
    PF_TRY(find_world(handle, &world_pin));
    World* world = world_pin.get();
    void* created = nullptr;
    PF_TRY(world->create_event(&created));
    *event = static_cast<pfSimEvent_t>(created);
    return pfSuccess;
  });
}

PF_API pfResult_t pfSimEventDestroy(pfSimEvent_t event) {
  return c_boundary("pfSimEventDestroy", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_event_world(event, &world_pin));
    World* world = world_pin.get();
    return world->destroy_event(event);
  });
}

PF_API pfResult_t pfSimEventRecord(pfSimEvent_t event, void* stream) {
  return c_boundary("pfSimEventRecord", [&]() -> pfResult_t {
    WorldPin event_pin, stream_pin;
    PF_TRY(find_event_world(event, &event_pin));
    PF_TRY(find_stream_world(stream, &stream_pin));
    World* event_world = event_pin.get();
    World* stream_world = stream_pin.get();
    if (event_world != stream_world) {
      return fail(pfErrorInvalidArgument, "event {} and stream {} belong to different worlds",
                  static_cast<const void*>(event), stream);
    }
    return event_world->record_event(event, stream);
  });
}

PF_API pfResult_t pfSimStreamWaitEvent(void* stream, pfSimEvent_t event, double latency_us,
                                       int sm_count) {
  return c_boundary("pfSimStreamWaitEvent", [&]() -> pfResult_t {
    WorldPin stream_world_pin, event_world_pin;
    PF_TRY(find_stream_world(stream, &stream_world_pin));
    PF_TRY(find_event_world(event, &event_world_pin));
    World* stream_world = stream_world_pin.get();
    World* event_world = event_world_pin.get();
    if (event_world != stream_world) {
      return fail(pfErrorInvalidArgument, "event {} and stream {} belong to different worlds",
                  static_cast<const void*>(event), stream);
    }
    return stream_world->wait_event(stream, event, latency_us, sm_count);
  });
}

PF_API pfResult_t pfSimStreamWaitEventTransfer(void* stream, pfSimEvent_t event,
                                               double latency_us, double transfer_us,
                                               int sm_count) {
  return c_boundary("pfSimStreamWaitEventTransfer", [&]() -> pfResult_t {
    WorldPin stream_world_pin, event_world_pin;
    PF_TRY(find_stream_world(stream, &stream_world_pin));
    PF_TRY(find_event_world(event, &event_world_pin));
    World* stream_world = stream_world_pin.get();
    if (event_world_pin.get() != stream_world) {
      return fail(pfErrorInvalidArgument, "event {} and stream {} belong to different worlds",
                  static_cast<const void*>(event), stream);
    }
    return stream_world->wait_event_transfer(stream, event, latency_us, transfer_us, sm_count);
  });
}

PF_API pfResult_t pfSimEventTime(pfSimEvent_t event, double* time_us) {
  return c_boundary("pfSimEventTime", [&]() -> pfResult_t {
    if (time_us == nullptr) return fail(pfErrorInvalidArgument, "time_us output pointer is NULL");
    WorldPin world_pin;
    PF_TRY(find_event_world(event, &world_pin));
    World* world = world_pin.get();
    return world->event_state(event, nullptr, nullptr, time_us);
  });
}

PF_API pfResult_t pfSimLaunchTicketKernel(void* stream, const pfSliceDesc_t* slice, int blocks,
                                          double item_cost_us, pfSimItemFn on_item,
                                          void* user) {
  return c_boundary("pfSimLaunchTicketKernel", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_stream_world(stream, &world_pin));
    World* world = world_pin.get();
    return world->launch_ticket(stream, slice, blocks, item_cost_us, on_item, user);
  });
}

PF_API pfResult_t pfSimLaunchOpaque(void* stream, uint64_t first_item, uint64_t items,
                                    int blocks, double item_cost_us, pfSimItemFn on_item,
                                    void* user) {
  return c_boundary("pfSimLaunchOpaque", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_stream_world(stream, &world_pin));
    World* world = world_pin.get();
    return world->launch_opaque(stream, first_item, items, blocks, item_cost_us, on_item, user);
  });
}

PF_API pfResult_t pfSimLaunchTicketKernelEx(void* stream, const pfSliceDesc_t* slice, int blocks,
                                            double item_cost_us, const pfSimFillDesc_t* fill,
                                            pfSimItemFn on_item, void* user) {
  return c_boundary("pfSimLaunchTicketKernelEx", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_stream_world(stream, &world_pin));
    return world_pin.get()->launch_ticket(stream, slice, blocks, item_cost_us, fill, on_item,
                                          user);
  });
}

PF_API pfResult_t pfSimLaunchOpaqueEx(void* stream, uint64_t first_item, uint64_t items,
                                      int blocks, double item_cost_us,
                                      const pfSimFillDesc_t* fill, pfSimItemFn on_item,
                                      void* user) {
  return c_boundary("pfSimLaunchOpaqueEx", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_stream_world(stream, &world_pin));
    return world_pin.get()->launch_opaque(stream, first_item, items, blocks, item_cost_us, fill,
                                          on_item, user);
  });
}

PF_API pfResult_t pfSimRunUntilIdle(pfSimWorld_t handle) {
  return c_boundary("pfSimRunUntilIdle", [&]() -> pfResult_t {
    PF_TRY(refuse_run_inside_callback("pfSimRunUntilIdle"));
    WorldPin world_pin;
    PF_TRY(find_world(handle, &world_pin));
    World* world = world_pin.get();
    return world->run_until_idle();
  });
}

PF_API pfResult_t pfSimRunUntil(pfSimWorld_t handle, double time_us) {
  return c_boundary("pfSimRunUntil", [&]() -> pfResult_t {
    PF_TRY(refuse_run_inside_callback("pfSimRunUntil"));
    WorldPin world_pin;
    PF_TRY(find_world(handle, &world_pin));
    World* world = world_pin.get();
    return world->run_until(time_us);
  });
}

PF_API pfResult_t pfSimNow(pfSimWorld_t handle, double* time_us) {
  if (const pipefill::sim::World::Impl* running = pipefill::sim::callback_world();
      running != nullptr && reinterpret_cast<uintptr_t>(handle) == running->handle) {
    // Inside an on_item callback of this world (its lock is held): the item's time.
    pipefill::clear_last_error();
    if (time_us == nullptr) return fail(pfErrorInvalidArgument, "time_us output pointer is NULL");
    *time_us = World::callback_time_us();
    return pfSuccess;
  }
  return c_boundary("pfSimNow", [&]() -> pfResult_t {
    if (time_us == nullptr) return fail(pfErrorInvalidArgument, "time_us output pointer is NULL");
    WorldPin world_pin;
    PF_TRY(find_world(handle, &world_pin));
    *time_us = world_pin.get()->now();
    return pfSuccess;
  });
}

PF_API pfResult_t pfSimSetMemoryUsed(pfSimWorld_t handle, int device, size_t bytes) {
  return c_boundary("pfSimSetMemoryUsed", [&]() -> pfResult_t {
    WorldPin world_pin;
    PF_TRY(find_world(handle, &world_pin));
    World* world = world_pin.get();
    return world->set_memory_used(device, bytes);
  });
}

}  // extern "C"
