// The simulated world as a Python object (SimWorld): pfSimWorld_t's streams, events, kernels
// and virtual clock. A world is either owned by Python or a view of a runtime's private world,
// whose lifetime is the runtime's (python/src/runtime.hpp).
#pragma once

#include "common.hpp"

namespace pfpy {

struct RuntimeCore;

struct WorldCore {
  Lifetime life;
  pfSimWorld_t world = nullptr;
  // A runtime's private world belongs to that runtime: its lifetime is the runtime's.
  std::shared_ptr<RuntimeCore> owner;
  // An owned world nobody closed is destroyed with its last reference (runtimes attached to it
  // hold one, so it outlives them).
  ~WorldCore() {
    if (owner == nullptr && life.alive && world != nullptr) pfSimWorldDestroy(world);
  }
};

class SimWorld {
 public:
  SimWorld(int devices, int sm_count, size_t memory_bytes, double jitter, double interference,
           uint64_t seed)
      : core_(std::make_shared<WorldCore>()) {
    pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
    desc.sm_count = sm_count;
    desc.memory_bytes = memory_bytes;
    desc.jitter_fraction = jitter;
    desc.interference = interference;
    without_gil([&] { check(pfSimWorldCreate(devices, &desc, seed, &core_->world)); });
  }
  // A non-owning view of a runtime's private world.
  explicit SimWorld(std::shared_ptr<WorldCore> core) : core_(std::move(core)) {}

  bool owned() const { return core_->owner == nullptr; }
  bool closed();
  uintptr_t handle();

  void close() {
    if (!owned()) {
      throw CallError{static_cast<int>(pfErrorInvalidState),
                      "SimWorld.close: this is a runtime's private world; it closes with the runtime"};
    }
    nb::gil_scoped_release release;
    std::unique_lock<std::shared_mutex> lock(core_->life.mutex);
    if (!core_->life.alive) return;
    check(pfSimWorldDestroy(core_->world));  // pfErrorBusy while runtimes are attached
    core_->life.alive = false;
    core_->world = nullptr;
  }

  uintptr_t stream_create(int device, int priority) {
    return without_gil([&] {
      Guard g(*this);
      void* stream = nullptr;
      check(pfSimStreamCreate(core_->world, device, priority, &stream));
      return as_handle(stream);
    });
  }
  void stream_destroy(uintptr_t stream) {
    without_gil([&] {
      Guard g(*this);
      check(pfSimStreamDestroy(as_pointer(stream)));
    });
  }
  void launch_kernel(uintptr_t stream, double duration_us, int sm_count) {
    without_gil([&] {
      Guard g(*this);
      check(pfSimLaunchKernel(as_pointer(stream), duration_us, sm_count));
    });
  }
  void stream_delay(uintptr_t stream, double duration_us) {
    without_gil([&] {
      Guard g(*this);
      check(pfSimStreamDelay(as_pointer(stream), duration_us));
    });
  }
  uintptr_t event_create() {
    return without_gil([&] {
      Guard g(*this);
      pfSimEvent_t event = nullptr;
      check(pfSimEventCreate(core_->world, &event));
      return as_handle(event);
    });
  }
  void event_destroy(uintptr_t event) {
    without_gil([&] {
      Guard g(*this);
      check(pfSimEventDestroy(reinterpret_cast<pfSimEvent_t>(event)));
    });
  }
  void event_record(uintptr_t event, uintptr_t stream) {
    without_gil([&] {
      Guard g(*this);
      check(pfSimEventRecord(reinterpret_cast<pfSimEvent_t>(event), as_pointer(stream)));
    });
  }
  void stream_wait_event(uintptr_t stream, uintptr_t event, double latency_us, int sm_count) {
    without_gil([&] {
      Guard g(*this);
      check(pfSimStreamWaitEvent(as_pointer(stream), reinterpret_cast<pfSimEvent_t>(event),
                                 latency_us, sm_count));
    });
  }
  double event_time(uintptr_t event) {
    return without_gil([&] {
      Guard g(*this);
      double t = 0.0;
      check(pfSimEventTime(reinterpret_cast<pfSimEvent_t>(event), &t));
      return t;
    });
  }
  void run_until_idle() {
    nb::gil_scoped_release release;  // the run loop calls Python items and observers
    Guard g(*this);
    check(pfSimRunUntilIdle(core_->world));
  }
  void run_until(double time_us) {
    nb::gil_scoped_release release;
    Guard g(*this);
    check(pfSimRunUntil(core_->world, time_us));
  }
  double now() {
    return without_gil([&] {
      Guard g(*this);
      double t = 0.0;
      check(pfSimNow(core_->world, &t));
      return t;
    });
  }
  void set_memory_used(int device, size_t bytes) {
    without_gil([&] {
      Guard g(*this);
      check(pfSimSetMemoryUsed(core_->world, device, bytes));
    });
  }

  const std::shared_ptr<WorldCore>& core() const { return core_; }

 private:
  // Holds the lifetime that governs this world: its own, or its owning runtime's.
  class Guard {
   public:
    explicit Guard(SimWorld& w);

   private:
    std::optional<Use> use_;
  };

  std::shared_ptr<WorldCore> core_;
};

void bind_sim_world(nb::module_& m);

}  // namespace pfpy
