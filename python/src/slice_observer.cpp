// The slice observer's trampoline (slice_observer.hpp).
#include "slice_observer.hpp"

namespace pfpy {

void PySliceObserver::observe(void* user, const pfSliceEvent_t* event) {
  auto* self = static_cast<PySliceObserver*>(user);
  if (self->failed.load() || interpreter_finalizing()) return;
  std::string why;
  {
    nb::gil_scoped_acquire gil;
    if (!self->fn.is_valid() || self->fn.is_none()) return;
    try {
      self->fn(event->phase, event->job_name != nullptr ? event->job_name : "",
               event->bubble_id, event->fill_stream, event->first_item, event->max_items);
      self->calls.fetch_add(1);
      return;
    } catch (nb::python_error& error) {
      why = error.what();  // message and traceback, for Runtime.slice_observer_error()
    } catch (const std::exception& error) {
      why = error.what();
    }
  }
  std::lock_guard<std::mutex> lock(self->mutex);
  if (self->error.empty()) self->error = why;
  self->failed.store(true);
}

}  // namespace pfpy
