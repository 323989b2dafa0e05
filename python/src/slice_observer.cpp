// The slice observer's trampoline and the host backend's fill window (slice_observer.hpp).
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

void SliceEvents::observe(void* user, const pfSliceEvent_t* event) {
  auto* self = static_cast<SliceEvents*>(user);
  if (event->phase == pfSliceStart) {
    const bool was_open = self->is_open();
    self->open_slices.fetch_add(1, std::memory_order_acq_rel);
    self->starts.fetch_add(1, std::memory_order_acq_rel);
    if (!was_open) {
      self->windows.fetch_add(1, std::memory_order_relaxed);
      // Under the mutex: a waiter that saw the window closed is then inside wait, not between
      // its check and its wait (no lost wake-up). Only an opening wakes anyone.
      { std::lock_guard<std::mutex> lock(self->mutex); }
      self->opened.notify_all();
    }
  } else if (event->phase == pfSliceEnd) {
    // A slice's end without its start cannot happen (both are queued with the slice), but a
    // count never goes below 0 whatever the order.
    int open = self->open_slices.load(std::memory_order_acquire);
    while (open > 0 && !self->open_slices.compare_exchange_weak(open, open - 1,
                                                                 std::memory_order_acq_rel)) {
    }
  }
  if (PySliceObserver* forward = self->forward.load(std::memory_order_acquire)) {
    PySliceObserver::observe(forward, event);
  }
}

void SliceEvents::bubble_ended(void* user) {
  auto* owner = static_cast<std::shared_ptr<SliceEvents>*>(user);
  SliceEvents& self = **owner;
  // The slices started so far belong to this bubble or an earlier one (a later bubble's begin
  // is behind this marker on the same stream, and its slices wait for that begin).
  const uint64_t started = self.starts.load(std::memory_order_acquire);
  uint64_t closed = self.closed_at.load(std::memory_order_acquire);
  while (closed < started &&
         !self.closed_at.compare_exchange_weak(closed, started, std::memory_order_acq_rel)) {
  }
  delete owner;
}

bool SliceEvents::wait_open(double timeout_s) {
  // A window that opened during the wait ends it even when it closed again before this thread
  // ran: a slice of trivial items can open and close its window within the waiter's wake-up
  // latency, and a wait that looked only at is_open() then slept out its whole timeout while
  // the job's ring ran dry (a loaded machine: 0 items in 3 bubbles of 4).
  const uint64_t seen = windows.load(std::memory_order_acquire);
  if (is_open()) return true;
  const auto deadline = deadline_after(timeout_s);
  const auto opened_since = [&] {
    return is_open() || windows.load(std::memory_order_acquire) != seen;
  };
  std::unique_lock<std::mutex> lock(mutex);
  opened.wait_until(lock, deadline, opened_since);
  return opened_since();
}

}  // namespace pfpy
