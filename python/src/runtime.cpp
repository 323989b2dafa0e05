// The bindings of Runtime and of pfConfig_t (RawConfig), and the host device's stream calls
// that need no callback.
#include "runtime.hpp"

namespace pfpy {

using namespace nb::literals;

void bind_config(nb::module_& m) {
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
}

void bind_runtime(nb::module_& m) {
  // The host device's stream API (pfHost*) that needs no callback: delays, synchronisation and
  // the device clock. Streams are ints (Runtime.create_high_priority_stream, capture streams).
  m.def(
      "host_stream_delay",
      [](uintptr_t stream, double duration_us) {
        without_gil([&] { check(pfHostStreamDelay(as_pointer(stream), duration_us)); });
      },
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
        return without_gil([&] {
          double t = 0.0;
          check(pfHostNow(as_pointer(stream), &t));
          return t;
        });
      },
      "stream"_a, "pfHostNow: the host device's clock in microseconds.");

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
      .def("bubble_close_fill", &Runtime::bubble_close_fill, "stream"_a, "pfBubbleCloseFill.")
      .def("in_bubble", &Runtime::in_bubble, "True between a bubble_begin and its bubble_end.")
      .def("iteration_end", &Runtime::iteration_end, "pfIterationEnd.")
      .def("stats", &Runtime::stats, "pfRuntimeGetStatsV2 as a dict.")
      .def("fill_streams", &Runtime::fill_streams, "pfRuntimeGetFillStreams: handles as ints.")
      .def("skip_counts", &Runtime::skip_counts, "pfRuntimeGetSkipCounts: a list by pfSkipCause_t.")
      .def("set_class_margin", &Runtime::set_class_margin, "class_key"_a, "margin_us"_a,
           "pfRuntimeSetClassMargin")
      .def("class_stats", &Runtime::class_stats,
           "pfRuntimeGetClassStats of every class: a list of dicts.")
      .def("memory_info", &Runtime::memory_info,
           "pfRuntimeGetMemoryInfo as a dict (arena and device bytes, measured now).")
      .def("write_trace", &Runtime::write_trace, "path"_a, "pfTraceWrite (GIL released).")
      .def("set_slice_observer", &Runtime::set_slice_observer, "fn"_a.none(),
           "pfRuntimeSetSliceObserver: fn(phase, job_name, bubble_id, fill_stream, first_item, "
           "max_items) on the fill stream's thread (host backend); None removes it.")
      .def("fill_window_open", &Runtime::fill_window_open,
           "host backend: the fill window is open now: a fill slice of a bubble that has not "
           "ended is in progress (False on other backends)")
      .def("wait_fill_window", &Runtime::wait_fill_window, "timeout_s"_a,
           "host backend: waits (GIL released) until a fill window is open or has opened "
           "since the call, or timeout_s passed; returns whether one is open or opened "
           "(False at once on other backends)")
      .def("fill_windows", &Runtime::fill_windows,
           "host backend: times the fill window opened (no slice -> a slice in progress)")
      .def("slice_observer_error", &Runtime::slice_observer_error,
           "The current slice observer's first exception (later calls skipped), or None.")
      .def("slice_observer_calls", &Runtime::slice_observer_calls,
           "Calls of the current slice observer that returned normally.")
      .def("create_sim_ticket_job", &Runtime::create_sim_ticket_job, "name"_a, "priority"_a,
           "items"_a, "item_cost_us"_a, "parallelism"_a, "resident_bytes"_a,
           "workspace_bytes_per_item"_a, "configs"_a, "kind"_a, "fail_at_slice"_a,
           "pfJobCreate of a simulated ticket job (native launch callback).")
      .def("create_graph_job", &Runtime::create_graph_job, "name"_a, "priority"_a, "items"_a,
           "item_cost_us"_a, "graph"_a, "index_word"_a, "clock_stream"_a,
           "available"_a = UINT64_MAX,
           "pfJobCreateGraph (graph, index_word, clock_stream as ints; available: the streaming "
           "bound, pfGraphJobDesc_t.available).")
      .def("create_capture_stream", &Runtime::create_capture_stream, "pfGraphCaptureStreamCreate.")
      .def("push_capture_context", &Runtime::push_capture_context, "stream"_a,
           "pfGraphCaptureContextPush (the capture stream's context current on this thread).")
      .def("pop_capture_context", &Runtime::pop_capture_context, "pfGraphCaptureContextPop.")
      .def("create_item_job", &Runtime::create_item_job, "name"_a, "priority"_a, "items"_a,
           "item_cost_us"_a, "fn"_a, "available"_a, "fixed_cost"_a = false,
           "pfJobCreateGraph with Python items fn(item) (sim/host backends); fixed_cost: "
           "item_cost_us is kept, not learned.")
      .def("create_config_item_job", &Runtime::create_config_item_job, "name"_a, "priority"_a,
           "items"_a, "configs"_a, "fn"_a, "available"_a, "fixed_cost"_a = false,
           "pfJobCreate (ticket, one worker) with configurations (name, item_cost_us, "
           "items_per_item) and Python items fn(item, config) (sim/host backends); fixed_cost: "
           "the item_cost_us are kept, not learned (else the fastest measured sample).")
      .def("create_fill_job", &Runtime::create_fill_job, "params"_a,
           "fjJobCreate + pfJobCreate of an example fill job.")
      .def("jobs", &Runtime::jobs, "The jobs still attached.");
}

}  // namespace pfpy
