// SimWorld's lifetime rules (a runtime's private world lives as long as its runtime) and its
// binding.
#include "sim_world.hpp"

#include "runtime.hpp"

namespace pfpy {

using namespace nb::literals;

SimWorld::Guard::Guard(SimWorld& w) {
  if (w.core_->owner != nullptr) {
    use_.emplace(w.core_->owner->life, "the runtime owning this SimWorld");
  } else {
    use_.emplace(w.core_->life, "SimWorld");
  }
}

bool SimWorld::closed() {
  Lifetime& life = core_->owner != nullptr ? core_->owner->life : core_->life;
  return without_gil([&] {
    std::shared_lock<std::shared_mutex> lock(life.mutex);
    return !life.alive;
  });
}

uintptr_t SimWorld::handle() {
  return without_gil([&] {
    Guard g(*this);
    return as_handle(core_->world);
  });
}

void bind_sim_world(nb::module_& m) {
  nb::class_<SimWorld>(m, "SimWorld", "pfSimWorld_t: simulated GPUs on one virtual clock.")
      .def(nb::init<int, int, size_t, double, double, uint64_t>(), "devices"_a, "sm_count"_a,
           "memory_bytes"_a, "jitter"_a, "interference"_a, "seed"_a, "pfSimWorldCreate.")
      .def_prop_ro("owned", &SimWorld::owned, "False for a runtime's private world.")
      .def_prop_ro("closed", &SimWorld::closed)
      .def_prop_ro("handle", &SimWorld::handle, "The pfSimWorld_t as an integer.")
      .def("close", &SimWorld::close, "pfSimWorldDestroy (pfErrorBusy while runtimes are attached).")
      .def("stream_create", &SimWorld::stream_create, "device"_a, "priority"_a, "pfSimStreamCreate.")
      .def("stream_destroy", &SimWorld::stream_destroy, "stream"_a, "pfSimStreamDestroy.")
      .def("launch_kernel", &SimWorld::launch_kernel, "stream"_a, "duration_us"_a, "sm_count"_a,
           "pfSimLaunchKernel.")
      .def("stream_delay", &SimWorld::stream_delay, "stream"_a, "duration_us"_a, "pfSimStreamDelay.")
      .def("event_create", &SimWorld::event_create, "pfSimEventCreate.")
      .def("event_destroy", &SimWorld::event_destroy, "event"_a, "pfSimEventDestroy.")
      .def("event_record", &SimWorld::event_record, "event"_a, "stream"_a, "pfSimEventRecord.")
      .def("stream_wait_event", &SimWorld::stream_wait_event, "stream"_a, "event"_a,
           "latency_us"_a, "sm_count"_a, "pfSimStreamWaitEvent.")
      .def("event_time", &SimWorld::event_time, "event"_a,
           "pfSimEventTime (negative while not completed).")
      .def("run_until_idle", &SimWorld::run_until_idle, "pfSimRunUntilIdle (GIL released).")
      .def("run_until", &SimWorld::run_until, "time_us"_a, "pfSimRunUntil (GIL released).")
      .def("now", &SimWorld::now, "pfSimNow.")
      .def("set_memory_used", &SimWorld::set_memory_used, "device"_a, "bytes"_a,
           "pfSimSetMemoryUsed.");
}

}  // namespace pfpy
