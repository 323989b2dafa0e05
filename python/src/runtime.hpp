// The runtime as a Python object (Runtime): pfRuntime_t with its bubble instructions, stats,
// trace and streams, and the handle rules that Python cannot get wrong (a job keeps its runtime
// alive, closing a runtime destroys its jobs first, a closed handle raises).
#pragma once

#include <array>
#include <vector>

#include "common.hpp"
#include "jobs.hpp"
#include "slice_observer.hpp"
#include "sim_world.hpp"

namespace pfpy {

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
  // Host backend: the native slice observer, always set (the fill window; it forwards to the
  // Python observer of set_slice_observer). Shared with the bubble-end markers in flight.
  std::shared_ptr<SliceEvents> slice_events = std::make_shared<SliceEvents>();
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
    if (backend == pfBackendHost) {
      nb::gil_scoped_release release;
      check(pfRuntimeSetSliceObserver(core_->runtime, &SliceEvents::observe,
                                      core_->slice_events.get()));
    }
  }
  ~Runtime() {
    // Garbage-collected without close(): destroy quietly (nothing can be raised here).
    std::vector<std::shared_ptr<JobCore>> dropped;  // freed below, with the GIL
    without_gil([&] { close_core(/*raise_errors=*/false, dropped); });
  }

  void close() {
    {
      // The jobs' records may hold Python callables: their last references go with the GIL.
      std::vector<std::shared_ptr<JobCore>> dropped;
      without_gil([&] { close_core(/*raise_errors=*/true, dropped); });
    }
    // The runtime is gone, so no observer call is left: drop the callables (and their cycles).
    current_observer_.reset();
    observers_.clear();
  }
  bool closed() {
    return without_gil([&] {
      std::shared_lock<std::shared_mutex> lock(core_->life.mutex);
      return !core_->life.alive;
    });
  }

  int backend() {
    return without_gil([&] {
      Use use(core_->life, "Runtime");
      return core_->backend;
    });
  }
  RawConfig config() {
    return without_gil([&] {
      Use use(core_->life, "Runtime");
      RawConfig raw;
      check(pfRuntimeGetConfig(core_->runtime, &raw.c));
      raw.c.sim_world = nullptr;  // worlds are objects on the Python side
      return raw;
    });
  }
  std::shared_ptr<SimWorld> sim_world() {
    return without_gil([&] {
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
    });
  }
  int async_error() {
    return without_gil([&] {
      Use use(core_->life, "Runtime");
      pfResult_t error = pfSuccess;
      check(pfRuntimeGetAsyncError(core_->runtime, &error));
      return static_cast<int>(error);
    });
  }
  void synchronize() {
    nb::gil_scoped_release release;
    Use use(core_->life, "Runtime");
    check(pfRuntimeSynchronize(core_->runtime));
  }
  uintptr_t create_high_priority_stream() {
    return without_gil([&] {
      Use use(core_->life, "Runtime");
      void* stream = nullptr;
      check(pfStreamCreateHighPriority(core_->runtime, &stream));
      return as_handle(stream);
    });
  }
  void destroy_stream(uintptr_t stream) {
    without_gil([&] {
      Use use(core_->life, "Runtime");
      check(pfStreamDestroy(core_->runtime, as_pointer(stream)));
    });
  }
  // pfGraphCaptureContextPush may wait for the executor's graph launch to leave the green context
  // (stream_context.hpp's mutex): without the GIL, like every blocking native call.
  void push_capture_context(uintptr_t stream) {
    nb::gil_scoped_release release;
    Use use(core_->life, "Runtime");
    check(pfGraphCaptureContextPush(core_->runtime, as_pointer(stream)));
  }
  void pop_capture_context() {
    without_gil([&] {
      Use use(core_->life, "Runtime");
      check(pfGraphCaptureContextPop(core_->runtime));
    });
  }

  void bubble_begin(uintptr_t stream, int kind, const std::optional<std::string>& label,
                    double expected_us, size_t lent_bytes, uintptr_t lent_memory) {
    // The state lock pfBubbleBegin/End take is the one a fill thread may hold while its item
    // waits for the GIL: released here too (a few hundred ns per bubble instruction).
    without_gil([&] {
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
    });
  }
  void bubble_end(uintptr_t stream) {
    without_gil([&] {
      Use use(core_->life, "Runtime");
      check(pfBubbleEnd(core_->runtime, as_pointer(stream)));
      core_->in_bubble = false;
      mark_fill_window_closed(stream);
    });
  }
  void bubble_close_fill(uintptr_t stream) {
    without_gil([&] {
      Use use(core_->life, "Runtime");
      check(pfBubbleCloseFill(core_->runtime, as_pointer(stream)));
      mark_fill_window_closed(stream);
    });
  }
  // Host backend: the fill window closes when the bubble's end (or the close of its fill) runs
  // on the stream, in stream order behind it (SliceEvents). A marker that cannot be queued
  // leaves the window to the slice's end, as before: the instruction itself succeeded.
  void mark_fill_window_closed(uintptr_t stream) {
    if (core_->backend != pfBackendHost) return;
    auto* owner = new std::shared_ptr<SliceEvents>(core_->slice_events);
    if (pfHostLaunchHostFunc(as_pointer(stream), &SliceEvents::bubble_ended, owner) != pfSuccess)
      delete owner;
  }
  bool in_bubble() {
    return without_gil([&] {
      Use use(core_->life, "Runtime");
      return core_->in_bubble.load();
    });
  }
  void iteration_end() {
    without_gil([&] {
      Use use(core_->life, "Runtime");
      check(pfIterationEnd(core_->runtime));
    });
  }

  nb::dict stats() {
    pfStats_t s{};
    without_gil([&] {
      Use use(core_->life, "Runtime");
      check(pfRuntimeGetStatsV2(core_->runtime, &s, sizeof s));
    });
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
    d["bubbles_fill_started"] = s.bubbles_fill_started;
    d["fill_start_delay_us"] = s.fill_start_delay_us;
    d["max_fill_start_delay_us"] = s.max_fill_start_delay_us;
    d["slices_past_end"] = s.slices_past_end;
    return d;
  }
  // pfRuntimeGetFillStreams: the fill stream handles as ints.
  nb::list fill_streams() {
    std::vector<void*> streams;
    without_gil([&] {
      Use use(core_->life, "Runtime");
      size_t count = 0;
      check(pfRuntimeGetFillStreams(core_->runtime, nullptr, 0, &count));
      streams.resize(count);
      check(pfRuntimeGetFillStreams(core_->runtime, streams.data(), streams.size(), &count));
    });
    nb::list out;
    for (void* s : streams) out.append(reinterpret_cast<uintptr_t>(s));
    return out;
  }
  // pfRuntimeGetSkipCounts: skipped bubbles by pfSkipCause_t (a list indexed by cause).
  nb::list skip_counts() {
    std::array<uint64_t, PF_SKIP_CAUSE_COUNT> counts{};
    without_gil([&] {
      Use use(core_->life, "Runtime");
      check(pfRuntimeGetSkipCounts(core_->runtime, counts.data(), counts.size()));
    });
    nb::list out;
    for (uint64_t c : counts) out.append(c);
    return out;
  }
  // pfRuntimeGetClassCount + pfRuntimeGetClassStats: one dict per bubble class, in the order
  // the classes were first harvested.
  void set_class_margin(const std::string& class_key, double margin_us) {
    without_gil([&] {
      Use use(core_->life, "Runtime");
      check(pfRuntimeSetClassMargin(core_->runtime, class_key.c_str(), margin_us));
    });
  }
  nb::list class_stats() {
    std::vector<pfClassStats_t> classes;
    without_gil([&] {
      Use use(core_->life, "Runtime");
      size_t count = 0;
      check(pfRuntimeGetClassCount(core_->runtime, &count));
      classes.resize(count);
      for (size_t i = 0; i < count; ++i) {
        classes[i].size = sizeof(pfClassStats_t);
        check(pfRuntimeGetClassStats(core_->runtime, i, &classes[i]));
      }
    });
    nb::list out;
    for (const pfClassStats_t& c : classes) {
      nb::dict d;
      d["key"] = std::string(c.key);
      d["kind"] = c.kind;
      d["bubbles"] = c.bubbles;
      d["bubbles_filled"] = c.bubbles_filled;
      d["bubbles_timed"] = c.bubbles_timed;
      d["bubble_time_us"] = c.bubble_time_us;
      d["p10_us"] = c.p10_us;
      d["filled_time_us"] = c.filled_time_us;
      d["items_completed"] = c.items_completed;
      d["p50_us"] = c.p50_us;
      d["gated_predicted_us"] = c.gated_predicted_us;
      d["ungated_predicted_us"] = c.ungated_predicted_us;
      d["samples"] = c.samples;
      d["late_backoffs"] = c.late_backoffs;
      nb::list skips;
      for (int i = 0; i < PF_SKIP_CAUSE_COUNT; ++i) skips.append(c.skips[i]);
      d["skips"] = skips;
      out.append(d);
    }
    return out;
  }
  // pfRuntimeGetMemoryInfo as a dict (GIL released: on CUDA it queries the device).
  nb::dict memory_info() {
    pfMemoryInfo_t info{};
    info.size = sizeof info;
    {
      nb::gil_scoped_release release;
      Use use(core_->life, "Runtime");
      check(pfRuntimeGetMemoryInfo(core_->runtime, &info));
    }
    nb::dict d;
    d["arena_bytes"] = info.arena_bytes;
    d["arena_used_bytes"] = info.arena_used_bytes;
    d["arena_largest_free_bytes"] = info.arena_largest_free_bytes;
    d["device_free_bytes"] = info.device_free_bytes;
    d["device_total_bytes"] = info.device_total_bytes;
    return d;
  }
  void write_trace(const std::string& path) {
    nb::gil_scoped_release release;
    Use use(core_->life, "Runtime");
    check(pfTraceWrite(core_->runtime, path.c_str()));
  }
  // pfRuntimeSetSliceObserver with a Python callable (None removes it). Every observer set is
  // kept until the runtime object goes (a call may be running on a fill stream). On the host
  // backend the native observer stays set and forwards to the current one.
  void set_slice_observer(nb::object fn) {
    if (!fn.is_none() && !PyCallable_Check(fn.ptr())) {
      throw CallError{static_cast<int>(pfErrorInvalidArgument),
                      "Runtime.set_slice_observer: fn is not callable (a " +
                          std::string(nb::type_name(fn.type()).c_str()) + ")"};
    }
    std::shared_ptr<PySliceObserver> observer;
    if (!fn.is_none()) {
      observer = std::make_shared<PySliceObserver>();
      observer->fn = std::move(fn);
    }
    PySliceObserver* raw = observer.get();  // the shared_ptr (it holds fn) stays on the GIL side
    without_gil([&] {
      Use use(core_->life, "Runtime");
      if (core_->backend == pfBackendHost) {
        core_->slice_events->forward.store(raw, std::memory_order_release);
      } else {  // refused, naming the backend
        check(pfRuntimeSetSliceObserver(core_->runtime,
                                        raw != nullptr ? &PySliceObserver::observe : nullptr, raw));
      }
    });
    if (observer != nullptr) observers_.push_back(observer);
    current_observer_ = std::move(observer);
  }
  // Host backend: whether the fill window is open now (a fill slice of a bubble that has not
  // ended is in progress), and a wait for a window to open, GIL released (True also when one
  // opened and closed again during the wait; False when timeout_s passed first). Other backends:
  // always False at once (no window: their fill work is not on the trainer's CPU).
  bool fill_window_open() {
    return core_->backend == pfBackendHost && core_->slice_events->is_open();
  }
  bool wait_fill_window(double timeout_s) {
    if (!std::isfinite(timeout_s) || timeout_s < 0.0) {
      throw CallError{static_cast<int>(pfErrorInvalidArgument),
                      "Runtime.wait_fill_window: timeout_s = " + std::to_string(timeout_s) +
                          " (must be finite and >= 0)"};
    }
    if (core_->backend != pfBackendHost) return false;
    without_gil([&] { Use use(core_->life, "Runtime"); });  // a closed runtime raises
    // The wait holds no lock (a close is not held up by it); a daemon thread's wait (the
    // feeder's, the drainer's) may end at interpreter exit: waiting_without_gil parks it then.
    std::shared_ptr<RuntimeCore> core = core_;
    return waiting_without_gil([&] { return core->slice_events->wait_open(timeout_s); });
  }
  uint64_t fill_windows() { return core_->slice_events->windows.load(); }
  // The first exception of the current observer (its later calls were skipped), or None.
  std::optional<std::string> slice_observer_error() {
    if (current_observer_ == nullptr || !current_observer_->failed.load()) return std::nullopt;
    std::lock_guard<std::mutex> lock(current_observer_->mutex);
    return current_observer_->error;
  }
  uint64_t slice_observer_calls() {
    return current_observer_ != nullptr ? current_observer_->calls.load() : 0;
  }

  // Job factories (defined in jobs.cpp).
  // configs: (name, item_cost_us, parallelism, resident_bytes, workspace_bytes_per_item,
  // items_per_item) tuples; empty: one configuration from the job-level fields.
  Job create_sim_ticket_job(const std::string& name, int priority, uint64_t items,
                            double item_cost_us, int parallelism, size_t resident_bytes,
                            size_t workspace_bytes_per_item, const std::vector<nb::tuple>& configs,
                            int kind, uint64_t fail_at_slice);
  // graph: a cudaGraph_t as an int (0: none; required on CUDA); index_word: the device word the
  // graph reads (0 on the simulated/host backends: the record's own word); available: the
  // streaming bound the job starts with (pfGraphJobDesc_t.available; UINT64_MAX: every item).
  Job create_graph_job(const std::string& name, int priority, uint64_t items, double item_cost_us,
                       uintptr_t graph, uintptr_t index_word, uintptr_t clock_stream,
                       uint64_t available);
  uintptr_t create_capture_stream();
  // An item job (streaming.cpp): a graph job whose items call fn(item) (sim/host backends).
  // fixed_cost: item_cost_us is the item's known cost (on_item_is_work = 2: not learned).
  Job create_item_job(const std::string& name, int priority, uint64_t items, double item_cost_us,
                      nb::object fn, uint64_t available, bool fixed_cost);
  // An item job with several configurations (streaming.cpp): a ticket job whose items call
  // fn(item, config) with the configuration the planner chose for their slice. fixed_cost: the
  // configurations' item_cost_us are their known costs (pfJobSetCostPolicy 2: not learned);
  // otherwise each is learned as its fastest measured sample (policy 1).
  Job create_config_item_job(const std::string& name, int priority, uint64_t items,
                             const std::vector<nb::tuple>& configs, nb::object fn,
                             uint64_t available, bool fixed_cost);
  Job create_fill_job(const fjParams_t& given);

  std::vector<Job> jobs() {
    return without_gil([&] {
      std::lock_guard<std::mutex> lock(core_->jobs_mutex);
      std::vector<Job> out;
      for (const auto& j : core_->jobs) {
        std::shared_lock<std::shared_mutex> alive(j->life.mutex);
        if (j->life.alive) out.emplace_back(core_, j);
      }
      return out;
    });
  }

 private:
  // create_fill_job's body, run with the GIL released (jobs.cpp).
  Job create_fill_job_native(const fjParams_t& given, std::vector<std::shared_ptr<JobCore>>& dropped);
  std::vector<std::shared_ptr<PySliceObserver>> observers_;  // every one set (see above)
  std::shared_ptr<PySliceObserver> current_observer_;
  // Called with the GIL released (it takes the jobs' lifetime locks). The closed jobs it drops
  // from the list go to `dropped`, which the caller frees with the GIL held (an item job's record
  // holds its Python function).
  Job attach(std::shared_ptr<JobCore> job, std::vector<std::shared_ptr<JobCore>>& dropped) {
    std::lock_guard<std::mutex> lock(core_->jobs_mutex);
    std::vector<std::shared_ptr<JobCore>> kept;
    kept.reserve(core_->jobs.size() + 1);
    for (auto& j : core_->jobs) {
      bool alive = false;
      {
        std::shared_lock<std::shared_mutex> l(j->life.mutex);
        alive = j->life.alive;
      }
      (alive ? kept : dropped).push_back(std::move(j));
    }
    core_->jobs = std::move(kept);
    core_->jobs.push_back(job);
    return Job(core_, std::move(job));
  }

  // Destroys the jobs still attached (cancelling them first), then the runtime.
  // Called with the GIL released; the jobs' references end up in `dropped` (see attach).
  void close_core(bool raise_errors, std::vector<std::shared_ptr<JobCore>>& dropped) {
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
    {
      std::lock_guard<std::mutex> jl(core_->jobs_mutex);
      dropped = core_->jobs;
    }
    for (const auto& job : dropped) {
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

void bind_config(nb::module_& m);
void bind_runtime(nb::module_& m);

}  // namespace pfpy
