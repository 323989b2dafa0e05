// pipefill._pipefill: the nanobind extension under the `pipefill` Python package.
//
// It binds the C API (include/pipefill/pipefill.h) and the example fill jobs
// (examples/fill_jobs/fill_jobs.h) only - never the C++ core's classes - so the core can be
// rewritten behind the stable C signatures. The Python package (python/pipefill/) builds the
// user-facing API (Config, Runtime, bubble context managers, jobs, dataclasses) on top.
//
// What this layer adds over the raw C calls:
//  - every failing call raises pipefill.PipeFillError(code, message) with the C message read
//    on the calling thread right after the call;
//  - handle lifetimes that Python cannot get wrong: a job keeps its runtime alive, a runtime
//    keeps its simulated world alive, closing a runtime destroys its jobs first, and a closed
//    handle raises instead of reaching C with a dangling pointer;
//  - calls that can block (waits, synchronisation, running the simulated world, destroying)
//    release the GIL, and a close racing with a call on another thread waits for that call;
//  - native launch callbacks for fill jobs (no Python runs in the fill loop): the example fill
//    jobs and a simulated ticket job with a given item cost.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "fill_jobs.h"
#include "pipefill/pipefill.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// ---- errors -----------------------------------------------------------------------------

// A failed call: the result code and the message the C layer gave for it.
struct CallError {
  int code;
  std::string message;
};

// pipefill.PipeFillError, registered by the package's __init__ (set_error_type). Until then
// (e.g. when stubgen imports the bare extension) errors are raised as RuntimeError.
PyObject* g_error_type = nullptr;

[[noreturn]] void raise_error(pfResult_t code, const char* message) {
  std::string text = (message != nullptr && *message != '\0') ? message : pfGetErrorString(code);
  throw CallError{static_cast<int>(code), std::move(text)};
}

// Checks a pf* result; the message is this thread's last error, read at once.
void check(pfResult_t result) {
  if (result != pfSuccess) raise_error(result, pfGetLastErrorMessage());
}

// Checks an fj* (example fill jobs) result: they keep their own last-error message.
void check_fill(pfResult_t result) {
  if (result != pfSuccess) raise_error(result, fjGetLastErrorMessage());
}

[[noreturn]] void raise_state(const std::string& message) {
  throw CallError{static_cast<int>(pfErrorInvalidState), message};
}

void translate_error(const std::exception_ptr& pointer, void*) {
  try {
    std::rethrow_exception(pointer);
  } catch (const CallError& error) {
    if (g_error_type == nullptr) {
      PyErr_SetString(PyExc_RuntimeError, error.message.c_str());
      return;
    }
    PyObject* instance = PyObject_CallFunction(g_error_type, "is", error.code, error.message.c_str());
    if (instance == nullptr) return;  // constructing the exception raised; that error stands
    PyErr_SetObject(g_error_type, instance);
    Py_DECREF(instance);
  }
}

// ---- lifetimes ----------------------------------------------------------------------------

// Guards one C handle against use after its destruction. Calls hold the lock shared for their
// duration (with or without the GIL); destruction holds it exclusively, taken with the GIL
// released, and nothing that holds it exclusively needs the GIL, so the two cannot deadlock.
struct Lifetime {
  std::shared_mutex mutex;
  bool alive = true;
};

class Use {
 public:
  Use(Lifetime& life, const char* what) : lock_(life.mutex) {
    if (!life.alive) raise_state(std::string(what) + " is closed");
  }

 private:
  std::shared_lock<std::shared_mutex> lock_;
};

std::string to_hex(uintptr_t value) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "%llx", static_cast<unsigned long long>(value));
  return buffer;
}

void* as_pointer(uintptr_t handle) { return reinterpret_cast<void*>(handle); }
uintptr_t as_handle(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer); }

// ---- configuration ------------------------------------------------------------------------

// pfConfig_t as a plain record; starts from PF_CONFIG_INITIALIZER (every field unset).
struct RawConfig {
  pfConfig_t c;
  RawConfig() { pfConfigInit(&c); }
};

// ---- simulated world ----------------------------------------------------------------------

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
    check(pfSimWorldCreate(devices, &desc, seed, &core_->world));
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
    Guard g(*this);
    void* stream = nullptr;
    check(pfSimStreamCreate(core_->world, device, priority, &stream));
    return as_handle(stream);
  }
  void stream_destroy(uintptr_t stream) {
    Guard g(*this);
    check(pfSimStreamDestroy(as_pointer(stream)));
  }
  void launch_kernel(uintptr_t stream, double duration_us, int sm_count) {
    Guard g(*this);
    check(pfSimLaunchKernel(as_pointer(stream), duration_us, sm_count));
  }
  void stream_delay(uintptr_t stream, double duration_us) {
    Guard g(*this);
    check(pfSimStreamDelay(as_pointer(stream), duration_us));
  }
  uintptr_t event_create() {
    Guard g(*this);
    pfSimEvent_t event = nullptr;
    check(pfSimEventCreate(core_->world, &event));
    return as_handle(event);
  }
  void event_destroy(uintptr_t event) {
    Guard g(*this);
    check(pfSimEventDestroy(reinterpret_cast<pfSimEvent_t>(event)));
  }
  void event_record(uintptr_t event, uintptr_t stream) {
    Guard g(*this);
    check(pfSimEventRecord(reinterpret_cast<pfSimEvent_t>(event), as_pointer(stream)));
  }
  void stream_wait_event(uintptr_t stream, uintptr_t event, double latency_us, int sm_count) {
    Guard g(*this);
    check(pfSimStreamWaitEvent(as_pointer(stream), reinterpret_cast<pfSimEvent_t>(event),
                               latency_us, sm_count));
  }
  double event_time(uintptr_t event) {
    Guard g(*this);
    double t = 0.0;
    check(pfSimEventTime(reinterpret_cast<pfSimEvent_t>(event), &t));
    return t;
  }
  void run_until_idle() {
    nb::gil_scoped_release release;
    Guard g(*this);
    check(pfSimRunUntilIdle(core_->world));
  }
  void run_until(double time_us) {
    nb::gil_scoped_release release;
    Guard g(*this);
    check(pfSimRunUntil(core_->world, time_us));
  }
  double now() {
    Guard g(*this);
    double t = 0.0;
    check(pfSimNow(core_->world, &t));
    return t;
  }
  void set_memory_used(int device, size_t bytes) {
    Guard g(*this);
    check(pfSimSetMemoryUsed(core_->world, device, bytes));
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

// ---- jobs ---------------------------------------------------------------------------------

// A simulated ticket job: items of a given cost (per configuration), claimed by gated blocks
// through pfSimLaunchTicketKernel (or ungated through pfSimLaunchOpaque). Counts every item it
// runs and, up to kMaxTrackedItems, checks that each ran exactly once.
struct SimTicketJob {
  static constexpr uint64_t kMaxTrackedItems = uint64_t{1} << 28;

  std::string name;
  std::vector<std::string> config_names;
  std::vector<pfJobConfig_t> configs;
  bool opaque = false;
  uint64_t items = 0;
  uint64_t fail_at_slice = 0;  // > 0: that slice's launch fails (tests of job failure)

  std::mutex mutex;
  std::vector<uint64_t> seen;  // one bit per item when tracked
  uint64_t items_run = 0;
  uint64_t duplicates = 0;
  uint64_t out_of_range = 0;
  std::atomic<uint64_t> slices{0};

  static void on_item(void* user, uint64_t item) {
    auto* job = static_cast<SimTicketJob*>(user);
    std::lock_guard<std::mutex> lock(job->mutex);
    ++job->items_run;
    if (item >= job->items) {
      ++job->out_of_range;
      return;
    }
    if (job->seen.empty()) return;
    uint64_t& word = job->seen[item / 64];
    const uint64_t bit = uint64_t{1} << (item % 64);
    if (word & bit) ++job->duplicates;
    word |= bit;
  }

  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    auto* job = static_cast<SimTicketJob*>(user);
    // pfJobCreate's warm-up (an empty slice outside any bubble): nothing to load on the
    // simulator, and not one of the job's slices.
    if (slice->max_items == 0) return pfSuccess;
    const uint64_t n = job->slices.fetch_add(1) + 1;
    if (job->fail_at_slice != 0 && n == job->fail_at_slice) return pfErrorInvalidState;
    const size_t index = static_cast<size_t>(
        std::clamp(slice->config_index, 0, static_cast<int>(job->configs.size()) - 1));
    const double cost = job->configs[index].item_cost_us;
    const int config_parallelism = job->configs[index].parallelism;
    int blocks = slice->max_blocks;
    if (config_parallelism > 0) blocks = std::min(blocks, config_parallelism);
    if (job->opaque) {
      return pfSimLaunchOpaque(stream, slice->first_item_hint, slice->max_items,
                               std::max(1, blocks), cost, &on_item, job);
    }
    return pfSimLaunchTicketKernel(stream, slice, blocks, cost, &on_item, job);
  }
};

// The host side of a graph fill job (pfJobCreateGraph). On the simulated and host backends the
// runtime calls on_item per item after writing the index word: this record owns that word (when
// the caller gave none) and counts the items, duplicates, items out of index order and items whose
// index word did not hold the item. On CUDA the user's graph is the work; nothing is counted here.
struct GraphJobRecord {
  std::string name;
  uint64_t items = 0;
  alignas(8) uint64_t own_index_word = ~uint64_t{0};
  uint64_t* index_word = nullptr;
  std::mutex mutex;
  std::vector<uint64_t> seen;
  uint64_t items_run = 0;
  uint64_t duplicates = 0;
  uint64_t out_of_order = 0;
  uint64_t index_mismatches = 0;
  uint64_t next_expected = 0;
  // Host backend: a stream of the device whose clock (pfHostNow, the trace's clock) stamps the
  // start of every item, for checks against the trace's bubbles. Capped at kMaxItemTimes.
  void* clock_stream = nullptr;
  static constexpr size_t kMaxItemTimes = size_t{1} << 20;
  std::vector<double> item_start_us;

  static void on_item(void* user, uint64_t item) {
    auto* job = static_cast<GraphJobRecord*>(user);
    const uint64_t word = std::atomic_ref<uint64_t>(*job->index_word).load();
    double now = -1.0;
    if (job->clock_stream != nullptr && pfHostNow(job->clock_stream, &now) != pfSuccess) now = -1.0;
    std::lock_guard<std::mutex> lock(job->mutex);
    if (job->clock_stream != nullptr && job->item_start_us.size() < kMaxItemTimes) job->item_start_us.push_back(now);
    ++job->items_run;
    if (word != item) ++job->index_mismatches;
    if (item != job->next_expected) ++job->out_of_order;
    job->next_expected = item + 1;
    if (item >= job->items || job->seen.empty()) return;
    uint64_t& bits = job->seen[item / 64];
    const uint64_t bit = uint64_t{1} << (item % 64);
    if (bits & bit) ++job->duplicates;
    bits |= bit;
  }
};

struct JobCore {
  Lifetime life;
  pfJob_t job = nullptr;
  std::string name;
  fjJob_t fill = nullptr;  // example fill job: destroyed after pfJobDestroy
  std::unique_ptr<SimTicketJob> ticket;
  std::unique_ptr<GraphJobRecord> graph;
  fjParams_t fill_params{};

  // Cancels (so waits on other threads return), then destroys under the exclusive lock.
  // Called with the GIL released.
  pfResult_t destroy_now() {
    {
      std::shared_lock<std::shared_mutex> shared(life.mutex);
      if (!life.alive) return pfSuccess;
      pfJobCancel(job);
    }
    std::unique_lock<std::shared_mutex> lock(life.mutex);
    if (!life.alive) return pfSuccess;
    const pfResult_t result = pfJobDestroy(job);
    if (result != pfSuccess) return result;
    life.alive = false;
    job = nullptr;
    if (fill != nullptr) fjJobDestroy(fill);
    fill = nullptr;
    return pfSuccess;
  }
};

// ---- runtime ------------------------------------------------------------------------------

struct RuntimeCore {
  Lifetime life;
  pfRuntime_t runtime = nullptr;
  int backend = pfBackendAuto;
  std::shared_ptr<WorldCore> world;  // the world given in the config (kept alive)
  std::mutex jobs_mutex;
  std::vector<std::shared_ptr<JobCore>> jobs;
  // The bubble this wrapper began and has not ended (pfRuntimeDestroy refuses while one is
  // open; close() checks first so that a refused close changes nothing).
  std::atomic<bool> in_bubble{false};
  std::atomic<uintptr_t> bubble_stream{0};
};

SimWorld::Guard::Guard(SimWorld& w) {
  if (w.core_->owner != nullptr) {
    use_.emplace(w.core_->owner->life, "the runtime owning this SimWorld");
  } else {
    use_.emplace(w.core_->life, "SimWorld");
  }
}

bool SimWorld::closed() {
  Lifetime& life = core_->owner != nullptr ? core_->owner->life : core_->life;
  std::shared_lock<std::shared_mutex> lock(life.mutex);
  return !life.alive;
}

uintptr_t SimWorld::handle() {
  Guard g(*this);
  return as_handle(core_->world);
}

nb::dict info_dict(const pfJobInfo_t& info) {
  nb::dict d;
  d["status"] = info.status;
  d["items_completed"] = info.items_completed;
  d["item_count"] = info.item_count;
  d["slices_launched"] = info.slices_launched;
  d["bubble_time_us"] = info.bubble_time_us;
  d["busy_time_us"] = info.busy_time_us;
  d["config_index"] = info.config_index;
  d["error"] = static_cast<int>(info.error);
  return d;
}

class Job {
 public:
  Job(std::shared_ptr<RuntimeCore> runtime, std::shared_ptr<JobCore> core)
      : runtime_(std::move(runtime)), core_(std::move(core)) {}

  std::string name() const { return core_->name; }
  bool closed() {
    std::shared_lock<std::shared_mutex> lock(core_->life.mutex);
    return !core_->life.alive;
  }

  nb::dict info() {
    pfJobInfo_t info{};
    {
      Use use(core_->life, job_label().c_str());
      check(pfJobGetStatus(core_->job, &info));
    }
    return info_dict(info);
  }
  void cancel() {
    Use use(core_->life, job_label().c_str());
    check(pfJobCancel(core_->job));
  }
  // timeout_us < 0: forever. Raises on timeout, failure or cancellation (the C result).
  void wait(double timeout_us) {
    const std::string label = job_label();
    nb::gil_scoped_release release;
    Use use(core_->life, label.c_str());
    check(pfJobWait(core_->job, timeout_us));
  }
  void close() {
    nb::gil_scoped_release release;
    check(core_->destroy_now());
  }

  // ---- simulated ticket job ----
  nb::dict ticket_counts() {
    if (!core_->ticket) raise_state("job '" + core_->name + "' is not a SimTicketJob");
    SimTicketJob& t = *core_->ticket;
    std::lock_guard<std::mutex> lock(t.mutex);
    nb::dict d;
    d["items_run"] = t.items_run;
    d["duplicates"] = t.duplicates;
    d["out_of_range"] = t.out_of_range;
    d["tracked"] = !t.seen.empty();
    d["slices"] = t.slices.load();
    return d;
  }

  // ---- graph fill job ----
  nb::dict graph_counts() {
    if (!core_->graph) raise_state("job '" + core_->name + "' is not a graph job");
    GraphJobRecord& g = *core_->graph;
    std::lock_guard<std::mutex> lock(g.mutex);
    nb::dict d;
    d["items_run"] = g.items_run;
    d["duplicates"] = g.duplicates;
    d["out_of_order"] = g.out_of_order;
    d["index_mismatches"] = g.index_mismatches;
    return d;
  }
  std::vector<double> graph_item_times() {
    if (!core_->graph) raise_state("job '" + core_->name + "' is not a graph job");
    std::lock_guard<std::mutex> lock(core_->graph->mutex);
    return core_->graph->item_start_us;
  }

  // ---- example fill jobs ----
  nb::dict fill_progress() {
    Use use(core_->life, job_label().c_str());
    fjJob_t fill = require_fill();
    fjProgress_t p{};
    check_fill(fjJobGetProgress(fill, &p));
    nb::dict d;
    d["items_done"] = p.items_done;
    d["duplicate_items"] = p.duplicate_items;
    d["out_of_order"] = p.out_of_order;
    d["outputs_kept"] = p.outputs_kept;
    d["first_loss"] = p.first_loss;
    d["last_loss"] = p.last_loss;
    return d;
  }
  std::vector<float> fill_output(uint64_t item) {
    Use use(core_->life, job_label().c_str());
    fjJob_t fill = require_fill();
    const fjParams_t& p = core_->fill_params;
    size_t count = 0;
    if (p.kind == fjMlpInference) count = static_cast<size_t>(p.rows) * p.output;
    if (p.kind == fjEncoderInference) count = static_cast<size_t>(p.seq) * p.hidden;
    std::vector<float> out(std::max<size_t>(count, 1));
    check_fill(fjJobGetOutput(fill, item, out.data(), count));
    out.resize(count);
    return out;
  }
  std::vector<float> fill_parameters() {
    Use use(core_->life, job_label().c_str());
    fjJob_t fill = require_fill();
    size_t count = 0;
    check_fill(fjJobParameterCount(fill, &count));
    std::vector<float> out(count);
    check_fill(fjJobGetParameters(fill, out.data(), count));
    return out;
  }
  double fill_evaluation_loss() {
    Use use(core_->life, job_label().c_str());
    fjJob_t fill = require_fill();
    double loss = 0.0;
    check_fill(fjJobEvaluationLoss(fill, &loss));
    return loss;
  }
  double fill_item_cost_us() {
    Use use(core_->life, job_label().c_str());
    double cost = 0.0;
    check_fill(fjJobItemCost(require_fill(), &cost));
    return cost;
  }

 private:
  std::string job_label() const { return "job '" + core_->name + "'"; }
  fjJob_t require_fill() {
    if (core_->fill == nullptr) raise_state("job '" + core_->name + "' is not an example fill job");
    return core_->fill;
  }

  std::shared_ptr<RuntimeCore> runtime_;  // the runtime outlives its jobs
  std::shared_ptr<JobCore> core_;
};

class Runtime {
 public:
  Runtime(const RawConfig& raw, SimWorld* world) : core_(std::make_shared<RuntimeCore>()) {
    pfConfig_t config = raw.c;
    if (world != nullptr) {
      if (world->closed()) raise_state("Runtime: the SimWorld given in the config is closed");
      core_->world = world->core();
      config.sim_world = reinterpret_cast<pfSimWorld_t>(world->handle());
    } else {
      config.sim_world = nullptr;
    }
    {
      nb::gil_scoped_release release;
      check(pfRuntimeCreate(&config, &core_->runtime));
    }
    pfBackend_t backend = pfBackendAuto;
    check(pfRuntimeGetBackend(core_->runtime, &backend));
    core_->backend = backend;
  }
  ~Runtime() {
    // Garbage-collected without close(): destroy quietly (nothing can be raised here).
    nb::gil_scoped_release release;
    close_core(/*raise_errors=*/false);
  }

  void close() {
    nb::gil_scoped_release release;
    close_core(/*raise_errors=*/true);
  }
  bool closed() {
    std::shared_lock<std::shared_mutex> lock(core_->life.mutex);
    return !core_->life.alive;
  }

  int backend() {
    Use use(core_->life, "Runtime");
    return core_->backend;
  }
  RawConfig config() {
    Use use(core_->life, "Runtime");
    RawConfig raw;
    check(pfRuntimeGetConfig(core_->runtime, &raw.c));
    raw.c.sim_world = nullptr;  // worlds are objects on the Python side
    return raw;
  }
  std::shared_ptr<SimWorld> sim_world() {
    Use use(core_->life, "Runtime");
    pfSimWorld_t world = nullptr;
    check(pfRuntimeGetSimWorld(core_->runtime, &world));
    if (core_->world != nullptr && core_->world->world == world) {
      return std::make_shared<SimWorld>(core_->world);
    }
    auto view = std::make_shared<WorldCore>();
    view->world = world;
    view->owner = core_;
    return std::make_shared<SimWorld>(view);
  }
  int async_error() {
    Use use(core_->life, "Runtime");
    pfResult_t error = pfSuccess;
    check(pfRuntimeGetAsyncError(core_->runtime, &error));
    return error;
  }
  void synchronize() {
    nb::gil_scoped_release release;
    Use use(core_->life, "Runtime");
    check(pfRuntimeSynchronize(core_->runtime));
  }
  uintptr_t create_high_priority_stream() {
    Use use(core_->life, "Runtime");
    void* stream = nullptr;
    check(pfStreamCreateHighPriority(core_->runtime, &stream));
    return as_handle(stream);
  }
  void destroy_stream(uintptr_t stream) {
    Use use(core_->life, "Runtime");
    check(pfStreamDestroy(core_->runtime, as_pointer(stream)));
  }

  void bubble_begin(uintptr_t stream, int kind, const std::optional<std::string>& label,
                    double expected_us, size_t lent_bytes, uintptr_t lent_memory) {
    Use use(core_->life, "Runtime");
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    hint.kind = kind;
    hint.label = label ? label->c_str() : nullptr;  // copied by pfBubbleBegin
    hint.expected_duration_us = expected_us;
    hint.lent_bytes = lent_bytes;
    hint.lent_memory = as_pointer(lent_memory);
    check(pfBubbleBegin(core_->runtime, as_pointer(stream), &hint));
    core_->bubble_stream = stream;
    core_->in_bubble = true;
  }
  void bubble_end(uintptr_t stream) {
    Use use(core_->life, "Runtime");
    check(pfBubbleEnd(core_->runtime, as_pointer(stream)));
    core_->in_bubble = false;
  }
  bool in_bubble() {
    Use use(core_->life, "Runtime");
    return core_->in_bubble;
  }
  void iteration_end() {
    Use use(core_->life, "Runtime");
    check(pfIterationEnd(core_->runtime));
  }

  nb::dict stats() {
    pfStats_t s{};
    {
      Use use(core_->life, "Runtime");
      check(pfRuntimeGetStatsV2(core_->runtime, &s, sizeof s));
    }
    nb::dict d;
    d["iterations"] = s.iterations;
    d["bubbles"] = s.bubbles;
    d["bubbles_filled"] = s.bubbles_filled;
    d["bubbles_skipped"] = s.bubbles_skipped;
    d["bubble_time_us"] = s.bubble_time_us;
    d["filled_time_us"] = s.filled_time_us;
    d["overrun_time_us"] = s.overrun_time_us;
    d["max_overrun_us"] = s.max_overrun_us;
    d["slices_launched"] = s.slices_launched;
    d["items_completed"] = s.items_completed;
    d["jobs_completed"] = s.jobs_completed;
    d["jobs_failed"] = s.jobs_failed;
    d["host_begin_end_ns"] = s.host_begin_end_ns;
    d["filled_sm_us"] = s.filled_sm_us;
    d["capacity_sm_us"] = s.capacity_sm_us;
    return d;
  }
  void write_trace(const std::string& path) {
    nb::gil_scoped_release release;
    Use use(core_->life, "Runtime");
    check(pfTraceWrite(core_->runtime, path.c_str()));
  }

  // configs: (name, item_cost_us, parallelism, resident_bytes, workspace_bytes_per_item,
  // items_per_item) tuples; empty: one configuration from the job-level fields (desc.configs
  // NULL, as a C caller that leaves it NULL).
  Job create_sim_ticket_job(const std::string& name, int priority, uint64_t items,
                            double item_cost_us, int parallelism, size_t resident_bytes,
                            size_t workspace_bytes_per_item, const std::vector<nb::tuple>& configs,
                            int kind, uint64_t fail_at_slice) {
    const bool opaque = kind == pfJobOpaque;
    Use use(core_->life, "Runtime");
    if (core_->backend != pfBackendSim) {
      throw CallError{static_cast<int>(pfErrorNotSupported),
                      "SimTicketJob runs on the simulated backend only (this runtime's backend is " +
                          std::to_string(core_->backend) +
                          "); on the host device it waits for the host device's launch API"};
    }
    auto ticket = std::make_unique<SimTicketJob>();
    ticket->name = name;
    ticket->opaque = opaque;
    ticket->items = items;
    ticket->fail_at_slice = fail_at_slice;
    ticket->config_names.reserve(configs.size());
    for (const nb::tuple& t : configs) {
      if (t.size() != 6) {
        throw CallError{static_cast<int>(pfErrorInvalidArgument),
                        "SimTicketJob: a config is (name, item_cost_us, parallelism, "
                        "resident_bytes, workspace_bytes_per_item, items_per_item)"};
      }
      ticket->config_names.push_back(nb::cast<std::string>(t[0]));
      pfJobConfig_t c{};
      c.item_cost_us = nb::cast<double>(t[1]);
      c.parallelism = nb::cast<int>(t[2]);
      c.resident_bytes = nb::cast<size_t>(t[3]);
      c.workspace_bytes_per_item = nb::cast<size_t>(t[4]);
      c.items_per_item = nb::cast<double>(t[5]);
      ticket->configs.push_back(c);
    }
    for (size_t i = 0; i < ticket->configs.size(); ++i) {
      ticket->configs[i].name = ticket->config_names[i].c_str();
    }
    const bool explicit_configs = !ticket->configs.empty();
    if (!explicit_configs) {
      // What the launch callback uses when the runtime derived the one configuration itself.
      pfJobConfig_t c{};
      c.item_cost_us = item_cost_us;
      c.parallelism = parallelism;
      ticket->configs.push_back(c);
    }
    if (items > 0 && items <= SimTicketJob::kMaxTrackedItems) {
      ticket->seen.assign((items + 63) / 64, 0);
    }
    pfJobDesc_t desc = PF_JOB_DESC_INITIALIZER;
    desc.name = ticket->name.c_str();
    desc.kind = kind;  // pfJobCreate rejects a value that is not a pfJobKind_t
    desc.priority = priority;
    desc.item_count = items;
    desc.item_cost_hint_us = item_cost_us;
    desc.resident_bytes = resident_bytes;
    desc.workspace_bytes_per_item = workspace_bytes_per_item;
    desc.configs = explicit_configs ? ticket->configs.data() : nullptr;
    desc.config_count = explicit_configs ? static_cast<int>(ticket->configs.size()) : 0;
    desc.user = ticket.get();
    desc.launch = &SimTicketJob::launch;
    auto job = std::make_shared<JobCore>();
    job->name = name;
    job->ticket = std::move(ticket);
    check(pfJobCreate(core_->runtime, &desc, &job->job));
    return attach(std::move(job));
  }

  // pfJobCreateGraph. graph: a cudaGraph_t as an int (0: none; required on CUDA); index_word: the
  // device word the graph reads (0 on the simulated/host backends: the record's own word).
  Job create_graph_job(const std::string& name, int priority, uint64_t items, double item_cost_us,
                       uintptr_t graph, uintptr_t index_word, uintptr_t clock_stream) {
    Use use(core_->life, "Runtime");
    auto record = std::make_unique<GraphJobRecord>();
    record->name = name;
    record->items = items;
    const bool counted = core_->backend != pfBackendCuda;
    if (clock_stream != 0 && core_->backend != pfBackendHost) {
      throw CallError{static_cast<int>(pfErrorInvalidArgument),
                      "GraphJob.clock_stream is for the host backend only (it stamps items with "
                      "pfHostNow)"};
    }
    record->clock_stream = as_pointer(clock_stream);
    record->index_word = index_word != 0 ? reinterpret_cast<uint64_t*>(index_word) : &record->own_index_word;
    if (counted && items > 0 && items <= SimTicketJob::kMaxTrackedItems) record->seen.assign((items + 63) / 64, 0);
    pfGraphJobDesc_t desc = PF_GRAPH_JOB_DESC_INITIALIZER;
    desc.name = record->name.c_str();
    desc.priority = priority;
    desc.item_count = items;
    desc.item_cost_us = item_cost_us;
    desc.graph = reinterpret_cast<void*>(graph);
    desc.index_word = record->index_word;
    desc.on_item = counted ? &GraphJobRecord::on_item : nullptr;
    desc.user = record.get();
    auto job = std::make_shared<JobCore>();
    job->name = name;
    job->graph = std::move(record);
    check(pfJobCreateGraph(core_->runtime, &desc, &job->job));
    return attach(std::move(job));
  }

  uintptr_t create_capture_stream() {
    Use use(core_->life, "Runtime");
    void* stream = nullptr;
    check(pfGraphCaptureStreamCreate(core_->runtime, &stream));
    return as_handle(stream);
  }

  Job create_fill_job(const fjParams_t& given) {
    Use use(core_->life, "Runtime");
    fjParams_t params = given;
    params.backend = core_->backend;  // the job runs on this runtime's device
    auto job = std::make_shared<JobCore>();
    check_fill(fjJobCreate(&params, &job->fill));
    job->fill_params = params;
    pfJobDesc_t desc = PF_JOB_DESC_INITIALIZER;
    const pfResult_t got = fjJobGetDesc(job->fill, &desc);
    if (got != pfSuccess) {
      const std::string message = fjGetLastErrorMessage();
      fjJobDestroy(job->fill);
      raise_error(got, message.c_str());
    }
    job->name = desc.name != nullptr ? desc.name : fjKindName(params.kind);
    const pfResult_t created = pfJobCreate(core_->runtime, &desc, &job->job);
    if (created != pfSuccess) {
      const std::string message = pfGetLastErrorMessage();
      fjJobDestroy(job->fill);
      raise_error(created, message.c_str());
    }
    return attach(std::move(job));
  }

  std::vector<Job> jobs() {
    std::lock_guard<std::mutex> lock(core_->jobs_mutex);
    std::vector<Job> out;
    for (const auto& j : core_->jobs) {
      std::shared_lock<std::shared_mutex> alive(j->life.mutex);
      if (j->life.alive) out.emplace_back(core_, j);
    }
    return out;
  }

 private:
  Job attach(std::shared_ptr<JobCore> job) {
    std::lock_guard<std::mutex> lock(core_->jobs_mutex);
    core_->jobs.erase(std::remove_if(core_->jobs.begin(), core_->jobs.end(),
                                     [](const std::shared_ptr<JobCore>& j) {
                                       std::shared_lock<std::shared_mutex> l(j->life.mutex);
                                       return !j->life.alive;
                                     }),
                      core_->jobs.end());
    core_->jobs.push_back(job);
    return Job(core_, std::move(job));
  }

  // Destroys the jobs still attached (cancelling them first), then the runtime.
  void close_core(bool raise_errors) {
    std::unique_lock<std::shared_mutex> lock(core_->life.mutex);
    if (!core_->life.alive) return;
    if (core_->in_bubble) {
      if (raise_errors) {
        raise_state("Runtime.close: a bubble is still open on stream 0x" +
                    to_hex(core_->bubble_stream) + " (end it first)");
      }
      // Garbage-collected inside a bubble: close the gate so the runtime can go.
      if (pfBubbleEnd(core_->runtime, as_pointer(core_->bubble_stream)) == pfSuccess) {
        core_->in_bubble = false;
      }
    }
    std::vector<std::shared_ptr<JobCore>> jobs;
    {
      std::lock_guard<std::mutex> jl(core_->jobs_mutex);
      jobs = core_->jobs;
    }
    for (const auto& job : jobs) {
      const pfResult_t r = job->destroy_now();
      if (r != pfSuccess && raise_errors) check(r);
    }
    const pfResult_t r = pfRuntimeDestroy(core_->runtime);
    if (r != pfSuccess) {
      if (raise_errors) check(r);
      return;
    }
    core_->life.alive = false;
    core_->runtime = nullptr;
    core_->world.reset();
    std::lock_guard<std::mutex> jl(core_->jobs_mutex);
    core_->jobs.clear();
  }

  std::shared_ptr<RuntimeCore> core_;
};

}  // namespace

NB_MODULE(_pipefill, m) {
  m.doc() =
      "Native layer of the pipefill package: the PipeFill C API and the example fill jobs.\n"
      "Use the `pipefill` package; this module's names are its building blocks.";
  nb::register_exception_translator(&translate_error);

  m.def(
      "set_error_type",
      [](nb::handle type) {
        Py_XINCREF(type.ptr());
        Py_XDECREF(g_error_type);
        g_error_type = type.ptr();
      },
      "type"_a, "Registers the exception class raised for failed calls (done by pipefill).");
  m.def(
      "error_string", [](int code) { return std::string(pfGetErrorString(static_cast<pfResult_t>(code))); },
      "code"_a, "pfGetErrorString: the static text naming a result code.");
  m.def(
      "version",
      [] {
        int v = 0;
        check(pfGetVersion(&v));
        return v;
      },
      "pfGetVersion: MAJOR*10000 + MINOR*100 + PATCH of the library linked in.");
  m.def(
      "fill_kind_name", [](int kind) { return std::string(fjKindName(kind)); }, "kind"_a,
      "fjKindName: name of an example fill job kind.");
  m.attr("HEADER_VERSION") = PIPEFILL_VERSION_CODE;
  m.attr("CONFIG_VERSION") = PF_CONFIG_VERSION;
  m.attr("UNSET_INT") = PF_UNSET_INT;
  m.attr("UNSET_DOUBLE") = PF_UNSET_DOUBLE;
  m.attr("UNSET_SIZE") = static_cast<size_t>(PF_UNSET_SIZE);
  m.attr("CONFIG_SIZE") = sizeof(pfConfig_t);
  m.attr("MAX_TRACKED_ITEMS") = SimTicketJob::kMaxTrackedItems;

  // The host device's stream API (pfHost*) that needs no callback: delays, synchronisation and
  // the device clock. Streams are ints (Runtime.create_high_priority_stream, capture streams).
  m.def(
      "host_stream_delay",
      [](uintptr_t stream, double duration_us) { check(pfHostStreamDelay(as_pointer(stream), duration_us)); },
      "stream"_a, "duration_us"_a, "pfHostStreamDelay.");
  m.def(
      "host_stream_synchronize",
      [](uintptr_t stream) {
        nb::gil_scoped_release release;
        check(pfHostStreamSynchronize(as_pointer(stream)));
      },
      "stream"_a, "pfHostStreamSynchronize (GIL released).");
  m.def(
      "host_now",
      [](uintptr_t stream) {
        double t = 0.0;
        check(pfHostNow(as_pointer(stream), &t));
        return t;
      },
      "stream"_a, "pfHostNow: the host device's clock in microseconds.");

  nb::class_<RawConfig>(m, "RawConfig", "pfConfig_t as a record; starts with every field unset.")
      .def(nb::init<>())
      .def_prop_ro("size", [](const RawConfig& r) { return r.c.size; })
      .def_prop_ro("version", [](const RawConfig& r) { return r.c.version; })
#define PF_FIELD(name) .def_prop_rw(#name, [](const RawConfig& r) { return r.c.name; }, \
                                    [](RawConfig& r, decltype(pfConfig_t::name) v) { r.c.name = v; })
      PF_FIELD(backend) PF_FIELD(device) PF_FIELD(stage_id) PF_FIELD(stage_count)
      PF_FIELD(reserved_sms) PF_FIELD(safety_margin_us) PF_FIELD(safety_margin_fraction)
      PF_FIELD(arena_bytes) PF_FIELD(prediction_quantile) PF_FIELD(min_samples) PF_FIELD(policy)
      PF_FIELD(log_level) PF_FIELD(enable_cupti) PF_FIELD(sim_seed) PF_FIELD(sim_sm_count)
      PF_FIELD(sim_memory_bytes) PF_FIELD(gated_prediction_quantile)
      PF_FIELD(fill_optimizer_bubbles)
#undef PF_FIELD
      ;

  nb::class_<fjParams_t>(m, "FillParams", "fjParams_t: parameters of an example fill job.")
      .def(
          "__init__",
          [](fjParams_t* p, int kind) {
            new (p) fjParams_t{};
            check_fill(fjParamsInit(p, kind, pfBackendSim));
          },
          "kind"_a, "fjParamsInit: the defaults of a kind (0 MLP, 1 encoder, 2 training).")
      .def_rw("kind", &fjParams_t::kind)
      .def_rw("execution", &fjParams_t::execution)
      .def_rw("items", &fjParams_t::items)
      .def_rw("seed", &fjParams_t::seed)
      .def_rw("priority", &fjParams_t::priority)
      .def_rw("input", &fjParams_t::input)
      .def_rw("hidden", &fjParams_t::hidden)
      .def_rw("output", &fjParams_t::output)
      .def_rw("rows", &fjParams_t::rows)
      .def_rw("heads", &fjParams_t::heads)
      .def_rw("ffn", &fjParams_t::ffn)
      .def_rw("seq", &fjParams_t::seq)
      .def_rw("learning_rate", &fjParams_t::learning_rate)
      .def_rw("item_cost_us", &fjParams_t::item_cost_us)
      .def_rw("ticket_flops_per_us", &fjParams_t::ticket_flops_per_us)
      .def_rw("opaque_flops_per_us", &fjParams_t::opaque_flops_per_us)
      .def_rw("opaque_blocks", &fjParams_t::opaque_blocks)
      .def_rw("parallelism", &fjParams_t::parallelism)
      .def_rw("keep_every", &fjParams_t::keep_every);

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

  nb::class_<Job>(m, "Job", "pfJob_t: a fill job attached to a runtime.")
      .def_prop_ro("name", &Job::name)
      .def_prop_ro("closed", &Job::closed)
      .def("info", &Job::info, "pfJobGetStatus as a dict.")
      .def("cancel", &Job::cancel, "pfJobCancel.")
      .def("wait", &Job::wait, "timeout_us"_a, "pfJobWait (GIL released; < 0 waits forever).")
      .def("close", &Job::close, "pfJobDestroy (cancels first; idempotent).")
      .def("ticket_counts", &Job::ticket_counts, "SimTicketJob: items run, duplicates, slices.")
      .def("graph_counts", &Job::graph_counts, "Graph job (sim/host): items run, duplicates, order, index word.")
      .def("graph_item_times", &Job::graph_item_times, "Graph job with a clock stream: item start times (µs).")
      .def("fill_progress", &Job::fill_progress, "fjJobGetProgress as a dict.")
      .def("fill_output", &Job::fill_output, "item"_a, "fjJobGetOutput.")
      .def("fill_parameters", &Job::fill_parameters, "fjJobGetParameters.")
      .def("fill_evaluation_loss", &Job::fill_evaluation_loss, "fjJobEvaluationLoss.")
      .def("fill_item_cost_us", &Job::fill_item_cost_us, "fjJobItemCost.");

  nb::class_<Runtime>(m, "Runtime", "pfRuntime_t: a PipeFill runtime on one device.")
      .def(nb::init<const RawConfig&, SimWorld*>(), "config"_a, "world"_a.none(),
           "pfRuntimeCreate (GIL released).")
      .def("close", &Runtime::close, "Destroys the jobs still attached, then pfRuntimeDestroy.")
      .def_prop_ro("closed", &Runtime::closed)
      .def("backend", &Runtime::backend, "pfRuntimeGetBackend.")
      .def("config", &Runtime::config, "pfRuntimeGetConfig.")
      .def("sim_world", &Runtime::sim_world, "pfRuntimeGetSimWorld.")
      .def("async_error", &Runtime::async_error, "pfRuntimeGetAsyncError.")
      .def("synchronize", &Runtime::synchronize, "pfRuntimeSynchronize (GIL released).")
      .def("create_high_priority_stream", &Runtime::create_high_priority_stream,
           "pfStreamCreateHighPriority.")
      .def("destroy_stream", &Runtime::destroy_stream, "stream"_a, "pfStreamDestroy.")
      .def("bubble_begin", &Runtime::bubble_begin, "stream"_a, "kind"_a, "label"_a.none(),
           "expected_us"_a, "lent_bytes"_a, "lent_memory"_a, "pfBubbleBegin.")
      .def("bubble_end", &Runtime::bubble_end, "stream"_a, "pfBubbleEnd.")
      .def("in_bubble", &Runtime::in_bubble, "True between a bubble_begin and its bubble_end.")
      .def("iteration_end", &Runtime::iteration_end, "pfIterationEnd.")
      .def("stats", &Runtime::stats, "pfRuntimeGetStatsV2 as a dict.")
      .def("write_trace", &Runtime::write_trace, "path"_a, "pfTraceWrite (GIL released).")
      .def("create_sim_ticket_job", &Runtime::create_sim_ticket_job, "name"_a, "priority"_a,
           "items"_a, "item_cost_us"_a, "parallelism"_a, "resident_bytes"_a,
           "workspace_bytes_per_item"_a, "configs"_a, "kind"_a, "fail_at_slice"_a,
           "pfJobCreate of a simulated ticket job (native launch callback).")
      .def("create_graph_job", &Runtime::create_graph_job, "name"_a, "priority"_a, "items"_a,
           "item_cost_us"_a, "graph"_a, "index_word"_a, "clock_stream"_a,
           "pfJobCreateGraph (graph, index_word, clock_stream as ints).")
      .def("create_capture_stream", &Runtime::create_capture_stream, "pfGraphCaptureStreamCreate.")
      .def("create_fill_job", &Runtime::create_fill_job, "params"_a,
           "fjJobCreate + pfJobCreate of an example fill job.")
      .def("jobs", &Runtime::jobs, "The jobs still attached.");
}
