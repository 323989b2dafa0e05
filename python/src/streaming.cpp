// Streaming item jobs (streaming.hpp): the Python item trampoline, Runtime.create_item_job and
// the Job calls of the streaming bound (pfJobSetAvailable, pfJobEndInput) and the item error.
#include "streaming.hpp"

#include "runtime.hpp"

namespace pfpy {

using namespace nb::literals;

void PyItemRecord::on_item(void* user, uint64_t item) {
  auto* self = static_cast<PyItemRecord*>(user);
  if (self->failed.load() || self->stopped.load() || interpreter_finalizing()) return;
  std::string why;
  {
    nb::gil_scoped_acquire gil;
    if (!self->fn.is_valid() || self->fn.is_none()) return;
    try {
      self->fn(item);
      self->items_run.fetch_add(1);
      return;
    } catch (nb::python_error& error) {
      why = error.what();  // the message and traceback; reported through item_error()
    } catch (const std::exception& error) {
      why = error.what();
    }
  }
  std::lock_guard<std::mutex> lock(self->mutex);
  if (self->error.empty()) self->error = "item " + std::to_string(item) + ": " + why;
  self->failed.store(true);
}

Job Runtime::create_item_job(const std::string& name, int priority, uint64_t items,
                             double item_cost_us, nb::object fn, uint64_t available) {
  if (core_->backend == pfBackendCuda) {
    throw CallError{static_cast<int>(pfErrorNotSupported),
                    "Runtime.create_item_job: job '" + name +
                        "': Python items run on the simulated and host backends only; on CUDA "
                        "an item is a captured graph (pipefill.torch.module_inference_job)"};
  }
  if (!PyCallable_Check(fn.ptr())) {
    throw CallError{static_cast<int>(pfErrorInvalidArgument),
                    "Runtime.create_item_job: job '" + name + "': fn is not callable"};
  }
  auto record = std::make_shared<PyItemRecord>();
  record->name = name;
  record->fn = std::move(fn);
  pfGraphJobDesc_t desc = PF_GRAPH_JOB_DESC_INITIALIZER;
  desc.name = record->name.c_str();
  desc.priority = priority;
  desc.item_count = items;
  desc.item_cost_us = item_cost_us;
  desc.index_word = &record->index_word;
  desc.on_item = &PyItemRecord::on_item;
  desc.user = record.get();
  desc.available = available;
  // The Python function is the item's work: the host device does not stretch items to
  // item_cost_us, which is only the planner's first estimate (learned from measured slices).
  desc.on_item_is_work = 1;
  auto job = std::make_shared<JobCore>();
  job->name = name;
  job->py_items = record;
  // pfJobCreateGraph synchronizes the fill streams after its warm-up: no Python item runs in it,
  // but an item of another item job may, and it needs the GIL. `job` and `record` (it holds fn)
  // are dropped on this side, with the GIL.
  std::vector<std::shared_ptr<JobCore>> dropped;
  return without_gil([&] {
    Use use(core_->life, "Runtime");
    check(pfJobCreateGraph(core_->runtime, &desc, &job->job));
    return attach(job, dropped);
  });
}

// Both release the GIL: they take the runtime's state lock, which a thread running items (the
// simulated world's) may hold while its item waits for the GIL.
void Job::set_available(uint64_t available) {
  const std::string label = job_label();
  nb::gil_scoped_release release;
  Use use(core_->life, label.c_str());
  check(pfJobSetAvailable(core_->job, available));
}

void Job::end_input() {
  const std::string label = job_label();
  nb::gil_scoped_release release;
  Use use(core_->life, label.c_str());
  check(pfJobEndInput(core_->job));
}

std::optional<std::string> Job::item_error() {
  if (!core_->py_items) raise_state(job_label() + " is not an item job");
  PyItemRecord& r = *core_->py_items;
  // Held with the GIL: on_item takes this mutex only after it released the GIL, and never
  // waits for the GIL while holding it.
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.failed.load()) return std::nullopt;
  return r.error;
}

uint64_t Job::items_run() {
  if (!core_->py_items) raise_state(job_label() + " is not an item job");
  return core_->py_items->items_run.load();
}

void Job::release_item_fn() {
  if (!core_->py_items) return;
  const bool alive = without_gil([&] {
    std::shared_lock<std::shared_mutex> lock(core_->life.mutex);
    return core_->life.alive;
  });
  if (alive) raise_state(job_label() + ": close it before releasing its item function");
  core_->py_items->fn = nb::none();  // closed stays closed: no item can call fn any more
}

}  // namespace pfpy
