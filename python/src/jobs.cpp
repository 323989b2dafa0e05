// Job's binding, the example fill jobs' parameters (FillParams), and the Runtime methods that
// create jobs: simulated ticket jobs, graph jobs (pfJobCreateGraph) and example fill jobs.
#include "jobs.hpp"

#include "runtime.hpp"

namespace pfpy {

using namespace nb::literals;

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

// configs: (name, item_cost_us, parallelism, resident_bytes, workspace_bytes_per_item,
// items_per_item) tuples; empty: one configuration from the job-level fields (desc.configs
// NULL, as a C caller that leaves it NULL).
Job Runtime::create_sim_ticket_job(const std::string& name, int priority, uint64_t items,
                          double item_cost_us, int parallelism, size_t resident_bytes,
                          size_t workspace_bytes_per_item, const std::vector<nb::tuple>& configs,
                          int kind, uint64_t fail_at_slice) {
  const bool opaque = kind == pfJobOpaque;
  if (core_->backend != pfBackendSim) {  // set once at construction
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
  std::vector<std::shared_ptr<JobCore>> dropped;  // freed with the GIL (runtime.hpp, attach)
  return without_gil([&] {
    Use use(core_->life, "Runtime");
    check(pfJobCreate(core_->runtime, &desc, &job->job));
    return attach(job, dropped);
  });
}

// pfJobCreateGraph. graph: a cudaGraph_t as an int (0: none; required on CUDA); index_word: the
// device word the graph reads (0 on the simulated/host backends: the record's own word).
Job Runtime::create_graph_job(const std::string& name, int priority, uint64_t items, double item_cost_us,
                     uintptr_t graph, uintptr_t index_word, uintptr_t clock_stream,
                     uint64_t available) {
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
  desc.available = available;
  auto job = std::make_shared<JobCore>();
  job->name = name;
  job->graph = std::move(record);
  // pfJobCreateGraph runs the warm-up and synchronizes the fill streams (on CUDA, a stream
  // synchronize of the fill stream): a fill thread's item or slice observer may need the GIL
  // meanwhile (issue 24 item 7).
  std::vector<std::shared_ptr<JobCore>> dropped;
  return without_gil([&] {
    Use use(core_->life, "Runtime");
    check(pfJobCreateGraph(core_->runtime, &desc, &job->job));
    return attach(job, dropped);
  });
}

uintptr_t Runtime::create_capture_stream() {
  return without_gil([&] {
    Use use(core_->life, "Runtime");
    void* stream = nullptr;
    check(pfGraphCaptureStreamCreate(core_->runtime, &stream));
    return as_handle(stream);
  });
}

Job Runtime::create_fill_job(const fjParams_t& given) {
  std::vector<std::shared_ptr<JobCore>> dropped;
  return without_gil([&] { return create_fill_job_native(given, dropped); });
}

// create_fill_job without the GIL: fjJobCreate allocates and initialises the job's model, and
// pfJobCreate warms it up and synchronizes the fill streams (the deadlock of issue 25: a torch
// job's item waiting for the GIL on a fill thread while this waited for that fill stream).
Job Runtime::create_fill_job_native(const fjParams_t& given,
                                    std::vector<std::shared_ptr<JobCore>>& dropped) {
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
  return attach(std::move(job), dropped);
}

void bind_fill_params(nb::module_& m) {
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
}

void bind_jobs(nb::module_& m) {
  nb::class_<Job>(m, "Job", "pfJob_t: a fill job attached to a runtime.")
      .def_prop_ro("name", &Job::name)
      .def_prop_ro("closed", &Job::closed)
      .def("info", &Job::info, "pfJobGetStatus as a dict.")
      .def("cost_info", &Job::cost_info, "pfJobGetCostInfo as a dict (GIL released).")
      .def("cancel", &Job::cancel, "pfJobCancel.")
      .def("wait", &Job::wait, "timeout_us"_a, "pfJobWait (GIL released; < 0 waits forever).")
      .def("close", &Job::close, "pfJobDestroy (cancels first; idempotent).")
      .def("ticket_counts", &Job::ticket_counts, "SimTicketJob: items run, duplicates, slices.")
      .def("graph_counts", &Job::graph_counts, "Graph job (sim/host): items run, duplicates, order, index word.")
      .def("graph_item_times", &Job::graph_item_times, "Graph job with a clock stream: item start times (µs).")
      .def("set_available", &Job::set_available, "available"_a, "pfJobSetAvailable.")
      .def("end_input", &Job::end_input, "pfJobEndInput.")
      .def("item_error", &Job::item_error, "Item job: the first item's exception (None: none).")
      .def("items_run", &Job::items_run, "Item job: items whose function returned.")
      .def("wait_items_run", &Job::wait_items_run, "target"_a, "timeout_s"_a,
           "Item job: waits (GIL released) until target items ran, the job failed or closed, "
           "or timeout_s passed; returns the items run.")
      .def("release_item_fn", &Job::release_item_fn, "Item job, once closed: drops its function.")
      .def("fill_progress", &Job::fill_progress, "fjJobGetProgress as a dict.")
      .def("fill_output", &Job::fill_output, "item"_a, "fjJobGetOutput.")
      .def("fill_parameters", &Job::fill_parameters, "fjJobGetParameters.")
      .def("fill_evaluation_loss", &Job::fill_evaluation_loss, "fjJobEvaluationLoss.")
      .def("fill_item_cost_us", &Job::fill_item_cost_us, "fjJobItemCost.");
}

}  // namespace pfpy
