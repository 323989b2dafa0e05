// Streaming item jobs (streaming.hpp): the Python item trampoline, Runtime.create_item_job (one
// configuration, a graph job) and Runtime.create_config_item_job (several, a ticket job), the
// Job calls of the streaming bound (pfJobSetAvailable, pfJobEndInput), the item error and the
// items-run wait the drainer sleeps in.
#include "streaming.hpp"

#include <chrono>
#include <stdexcept>

#include "runtime.hpp"

namespace pfpy {

using namespace nb::literals;

namespace {

// The GIL for an item on a device thread. nanobind's gil_scoped_acquire is PyGILState_Ensure,
// which on a thread Python did not create builds a thread state and destroys it again at every
// release: a few microseconds per item (issue 32). Here the thread keeps the state it got on its
// first item and later items only take and drop the GIL with it. The state of a device thread
// is left to the interpreter when the thread ends (it clears them at exit): one small record per
// fill thread, never freed while the thread may still run items. A thread that holds the GIL
// already (a simulated world run with the GIL held) calls straight through.
class ItemGil {
 public:
  ItemGil() {
    if (PyGILState_Check() != 0) return;  // this thread holds it already
    thread_local PyThreadState* kept = nullptr;
    if (kept == nullptr) {
      PyGILState_Ensure();  // makes (or finds) this thread's state, takes the GIL; never released
      kept = PyThreadState_Get();
    } else {
      PyEval_RestoreThread(kept);
    }
    taken_ = true;
  }
  ~ItemGil() {
    if (taken_) PyEval_SaveThread();
  }
  ItemGil(const ItemGil&) = delete;
  ItemGil& operator=(const ItemGil&) = delete;

 private:
  bool taken_ = false;
};

}  // namespace

void PyItemRecord::run(uint64_t item, int config) {
  if (stopped.load() || interpreter_finalizing()) return;
  if (failed.load()) {
    // On the host backend an item that did not run must not count as completed: the device
    // counts an item whose function returned (pipefill.h: a throwing item fails its job).
    if (backend == pfBackendHost)
      throw std::runtime_error("item " + std::to_string(item) + " not run: an earlier item failed");
    return;
  }
  std::string why;
  {
    ItemGil gil;
    if (!fn.is_valid() || fn.is_none()) return;
    try {
      if (config < 0) {
        fn(item);
      } else {
        fn(item, config);
      }
      item_ran();
      return;
    } catch (nb::python_error& error) {
      why = error.what();  // the message and traceback; reported through item_error()
    } catch (const std::exception& error) {
      why = error.what();
    }
  }
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (error.empty()) error = "item " + std::to_string(item) + ": " + why;
    message = error;
    failed.store(true);
  }
  {
    std::lock_guard<std::mutex> lock(wait_mutex);  // a drainer waiting for items wakes up
    ran.notify_all();
  }
  // The host device fails the job with this message at harvest (status Failed, pfJobWait and
  // the runtime's jobs_failed say so, as for a C++ item that throws); the simulator runs items
  // inside pfSimRunUntilIdle, where an exception would end the world's run, so there the Python
  // side ends the job (Job._fail).
  if (backend == pfBackendHost) throw std::runtime_error(message);
}

void PyItemRecord::item_ran() {
  const uint64_t now = items_run.fetch_add(1) + 1;
  if (now >= wake_at.load()) {
    std::lock_guard<std::mutex> lock(wait_mutex);
    ran.notify_all();
  }
}

uint64_t PyItemRecord::wait_items_run(uint64_t target, double timeout_s) {
  const auto deadline = deadline_after(timeout_s);
  std::unique_lock<std::mutex> lock(wait_mutex);
  wake_at.store(target);  // under wait_mutex: an item reaching it notifies after we wait
  ran.wait_until(lock, deadline, [&] {
    return items_run.load() >= target || failed.load() || stopped.load();
  });
  wake_at.store(~uint64_t{0});
  return items_run.load();
}

void PyItemRecord::on_item(void* user, uint64_t item) {
  static_cast<PyItemRecord*>(user)->run(item, -1);
}

void PyItemRecord::on_config_item(void* user, uint64_t item) {
  auto* config_user = static_cast<ConfigUser*>(user);
  config_user->record->run(item, config_user->config);
}

pfResult_t PyItemRecord::launch(void* user, const pfSliceDesc_t* slice, void* stream) {
  auto* record = static_cast<PyItemRecord*>(user);
  if (slice->max_items == 0) return pfSuccess;  // pfJobCreate's warm-up: nothing to load
  if (slice->config_index < 0 ||
      static_cast<size_t>(slice->config_index) >= record->config_users.size()) {
    return pfErrorInternal;  // the planner picks one of the job's configurations
  }
  ConfigUser* config_user = &record->config_users[static_cast<size_t>(slice->config_index)];
  if (record->backend == pfBackendHost) {
    return pfHostLaunchTicketKernel(stream, slice, 1, &PyItemRecord::on_config_item, config_user);
  }
  return pfSimLaunchTicketKernel(stream, slice, 1, config_user->cost_us,
                                 &PyItemRecord::on_config_item, config_user);
}

namespace {

void refuse_off_host(int backend, const std::string& who, const std::string& name) {
  if (backend == pfBackendCuda) {
    throw CallError{static_cast<int>(pfErrorNotSupported),
                    who + ": job '" + name +
                        "': Python items run on the simulated and host backends only; on CUDA "
                        "an item is a captured graph (pipefill.torch.module_inference_job)"};
  }
}

void require_callable(const nb::object& fn, const std::string& who, const std::string& name) {
  if (!PyCallable_Check(fn.ptr())) {
    throw CallError{static_cast<int>(pfErrorInvalidArgument),
                    who + ": job '" + name + "': fn is not callable"};
  }
}

}  // namespace

Job Runtime::create_item_job(const std::string& name, int priority, uint64_t items,
                             double item_cost_us, nb::object fn, uint64_t available,
                             bool fixed_cost) {
  refuse_off_host(core_->backend, "Runtime.create_item_job", name);
  require_callable(fn, "Runtime.create_item_job", name);
  auto record = std::make_shared<PyItemRecord>();
  record->name = name;
  record->fn = std::move(fn);
  record->backend = core_->backend;
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
  desc.on_item_is_work = fixed_cost ? 2 : 1;
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

// configs: (name, item_cost_us, items_per_item) per configuration. A ticket job (pfJobCreate)
// with one worker: its items run one after another in claim order, like a graph job's.
Job Runtime::create_config_item_job(const std::string& name, int priority, uint64_t items,
                                    const std::vector<nb::tuple>& configs, nb::object fn,
                                    uint64_t available, bool fixed_cost) {
  const std::string who = "Runtime.create_config_item_job";
  refuse_off_host(core_->backend, who, name);
  require_callable(fn, who, name);
  if (configs.empty()) {
    throw CallError{static_cast<int>(pfErrorInvalidArgument),
                    who + ": job '" + name + "': configs is empty (at least one)"};
  }
  auto record = std::make_shared<PyItemRecord>();
  record->name = name;
  record->backend = core_->backend;
  for (size_t i = 0; i < configs.size(); ++i) {
    const nb::tuple& t = configs[i];
    if (t.size() != 3) {
      throw CallError{static_cast<int>(pfErrorInvalidArgument),
                      who + ": job '" + name + "': configs[" + std::to_string(i) +
                          "] is not (name, item_cost_us, items_per_item)"};
    }
    record->config_names.push_back(nb::cast<std::string>(t[0]));
    pfJobConfig_t c{};
    c.item_cost_us = nb::cast<double>(t[1]);
    c.parallelism = 1;
    c.items_per_item = nb::cast<double>(t[2]);
    record->configs.push_back(c);
  }
  record->config_users.resize(record->configs.size());
  for (size_t i = 0; i < record->configs.size(); ++i) {
    record->configs[i].name = record->config_names[i].c_str();
    record->config_users[i] = {record.get(), static_cast<int>(i), record->configs[i].item_cost_us};
  }
  record->fn = std::move(fn);
  pfJobDesc_t desc = PF_JOB_DESC_INITIALIZER;
  desc.name = record->name.c_str();
  desc.kind = pfJobTicket;
  desc.priority = priority;
  desc.item_count = items;
  desc.item_cost_hint_us = record->configs[0].item_cost_us;
  desc.configs = record->configs.data();
  desc.config_count = static_cast<int>(record->configs.size());
  desc.user = record.get();
  desc.launch = &PyItemRecord::launch;
  auto job = std::make_shared<JobCore>();
  job->name = name;
  job->py_items = record;
  std::vector<std::shared_ptr<JobCore>> dropped;
  return without_gil([&] {
    Use use(core_->life, "Runtime");
    check(pfJobCreate(core_->runtime, &desc, &job->job));
    // The Python function is the item's work, slower inside bubbles than alone (thread hops,
    // the GIL): the planner takes each configuration's fastest sample (1), or keeps the costs
    // the caller stated (2), as create_item_job's on_item_is_work does (issue 32).
    const pfResult_t costed = pfJobSetCostPolicy(job->job, fixed_cost ? 2 : 1);
    // Ticket jobs start unbounded: the bound applies before the first bubble can run an item.
    const pfResult_t bounded =
        costed != pfSuccess ? costed : pfJobSetAvailable(job->job, available);
    if (bounded != pfSuccess) {
      const std::string message = pfGetLastErrorMessage();
      pfJobDestroy(job->job);
      raise_error(bounded, message.c_str());
    }
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
  if (!r.failed.load()) return std::nullopt;  // the common case: no lock
  // Held with the GIL: on_item takes this mutex only after it released the GIL, and never
  // waits for the GIL while holding it.
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.error;
}

uint64_t Job::items_run() {
  if (!core_->py_items) raise_state(job_label() + " is not an item job");
  return core_->py_items->items_run.load();
}

uint64_t Job::wait_items_run(uint64_t target, double timeout_s) {
  if (!core_->py_items) raise_state(job_label() + " is not an item job");
  if (!(timeout_s >= 0) || !std::isfinite(timeout_s)) {
    throw CallError{static_cast<int>(pfErrorInvalidArgument),
                    job_label() + ": wait_items_run timeout_s = " + std::to_string(timeout_s) +
                        " (must be finite and >= 0)"};
  }
  std::shared_ptr<PyItemRecord> record = core_->py_items;  // kept alive across the wait
  return waiting_without_gil([&] { return record->wait_items_run(target, timeout_s); });
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
