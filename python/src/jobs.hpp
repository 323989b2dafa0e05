// Fill jobs as Python objects (Job): the native launch records behind them (a simulated ticket
// job, the host side of a graph job, an example fill job) and the handle's lifetime. The
// factories that create jobs are Runtime methods, defined in jobs.cpp.
#pragma once

#include "common.hpp"
#include "streaming.hpp"

namespace pfpy {

struct RuntimeCore;

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
  std::shared_ptr<PyItemRecord> py_items;  // item job (streaming.cpp)
  fjParams_t fill_params{};

  // Cancels (so waits on other threads return), then destroys under the exclusive lock.
  // Called with the GIL released.
  pfResult_t destroy_now() {
    if (py_items) {
      py_items->stopped.store(true);  // no item calls into Python from here on
      std::lock_guard<std::mutex> lock(py_items->wait_mutex);
      py_items->ran.notify_all();  // nor does a drainer wait for one
    }
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

nb::dict info_dict(const pfJobInfo_t& info);

class Job {
 public:
  Job(std::shared_ptr<RuntimeCore> runtime, std::shared_ptr<JobCore> core)
      : runtime_(std::move(runtime)), core_(std::move(core)) {}

  std::string name() const { return core_->name; }
  bool closed() {
    return without_gil([&] {
      std::shared_lock<std::shared_mutex> lock(core_->life.mutex);
      return !core_->life.alive;
    });
  }

  // info and cancel release the GIL: they take the runtime's state lock, which a thread may hold
  // while it waits for an item job's item, and that item needs the GIL (streaming.hpp).
  nb::dict info() {
    pfJobInfo_t info{};
    {
      const std::string label = job_label();
      nb::gil_scoped_release release;
      Use use(core_->life, label.c_str());
      check(pfJobGetStatus(core_->job, &info));
    }
    return info_dict(info);
  }
  void cancel() {
    const std::string label = job_label();
    nb::gil_scoped_release release;
    Use use(core_->life, label.c_str());
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

  // pfJobGetCostInfo as a dict (cost_info.cpp).
  nb::dict cost_info();

  // ---- streaming (streaming.cpp) ----
  void set_available(uint64_t available);
  void end_input();
  std::optional<std::string> item_error();
  uint64_t items_run();
  uint64_t wait_items_run(uint64_t target, double timeout_s);
  void release_item_fn();

  // ---- simulated ticket job ----
  nb::dict ticket_counts() {
    if (!core_->ticket) raise_state("job '" + core_->name + "' is not a SimTicketJob");
    SimTicketJob& t = *core_->ticket;
    // The record's mutex is taken by the simulated world's run loop for every item.
    uint64_t items_run = 0, duplicates = 0, out_of_range = 0;
    bool tracked = false;
    without_gil([&] {
      std::lock_guard<std::mutex> lock(t.mutex);
      items_run = t.items_run;
      duplicates = t.duplicates;
      out_of_range = t.out_of_range;
      tracked = !t.seen.empty();
    });
    nb::dict d;
    d["items_run"] = items_run;
    d["duplicates"] = duplicates;
    d["out_of_range"] = out_of_range;
    d["tracked"] = tracked;
    d["slices"] = t.slices.load();
    return d;
  }

  // ---- graph fill job ----
  nb::dict graph_counts() {
    if (!core_->graph) raise_state("job '" + core_->name + "' is not a graph job");
    GraphJobRecord& g = *core_->graph;
    uint64_t items_run = 0, duplicates = 0, out_of_order = 0, index_mismatches = 0;
    without_gil([&] {
      std::lock_guard<std::mutex> lock(g.mutex);  // taken by the fill thread for every item
      items_run = g.items_run;
      duplicates = g.duplicates;
      out_of_order = g.out_of_order;
      index_mismatches = g.index_mismatches;
    });
    nb::dict d;
    d["items_run"] = items_run;
    d["duplicates"] = duplicates;
    d["out_of_order"] = out_of_order;
    d["index_mismatches"] = index_mismatches;
    return d;
  }
  std::vector<double> graph_item_times() {
    if (!core_->graph) raise_state("job '" + core_->name + "' is not a graph job");
    return without_gil([&] {
      std::lock_guard<std::mutex> lock(core_->graph->mutex);
      return core_->graph->item_start_us;
    });
  }

  // ---- example fill jobs ----
  nb::dict fill_progress() {
    fjProgress_t p{};
    without_gil([&] {
      Use use(core_->life, job_label().c_str());
      check_fill(fjJobGetProgress(require_fill(), &p));
    });
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
    return without_gil([&] {
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
    });
  }
  std::vector<float> fill_parameters() {
    return without_gil([&] {
      Use use(core_->life, job_label().c_str());
      fjJob_t fill = require_fill();
      size_t count = 0;
      check_fill(fjJobParameterCount(fill, &count));
      std::vector<float> out(count);
      check_fill(fjJobGetParameters(fill, out.data(), count));
      return out;
    });
  }
  double fill_evaluation_loss() {
    return without_gil([&] {
      Use use(core_->life, job_label().c_str());
      double loss = 0.0;
      check_fill(fjJobEvaluationLoss(require_fill(), &loss));
      return loss;
    });
  }
  double fill_item_cost_us() {
    return without_gil([&] {
      Use use(core_->life, job_label().c_str());
      double cost = 0.0;
      check_fill(fjJobItemCost(require_fill(), &cost));
      return cost;
    });
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

void bind_jobs(nb::module_& m);
void bind_fill_params(nb::module_& m);

}  // namespace pfpy
