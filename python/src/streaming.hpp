// Streaming item jobs for Python: a graph fill job (pfJobCreateGraph) whose items call a Python
// callable on the simulated and host backends, plus the streaming bound (pfJobSetAvailable /
// pfJobEndInput); and the same with several configurations (pfJobCreate, a ticket job whose
// launch runs the items through pfHostLaunchTicketKernel / pfSimLaunchTicketKernel), whose items
// are told the configuration the planner chose for their slice. pipefill.torch (_streaming.py,
// _training.py, _micro_steps.py) builds inference_job / training_job on them.
#pragma once

#include <condition_variable>

#include "common.hpp"

namespace pfpy {

// The host side of an item job. The runtime calls on_item on the device's thread that runs the
// item (host backend: a fill worker thread; simulated backend: the thread running the world, at
// the item's virtual completion); it takes the GIL and calls fn(item) (fn(item, config) for a job
// with configurations). The first exception ends the job's work: later items do nothing, and the
// error is kept for the Python side, which cancels the job (on_item must not call into PipeFill).
//
// Items-run waits (wait_items_run): the Python side's drainer sleeps here, GIL released, until a
// given count of items has run, instead of being woken by every item through a Python condition
// (issue 32: a wake-up and a GIL hand-off per item were a large share of an item's time).
struct PyItemRecord {
  std::string name;
  alignas(8) uint64_t index_word = ~uint64_t{0};
  nb::object fn;  // None once released (close): breaks the cycle job -> fn -> job
  std::atomic<bool> failed{false};
  std::atomic<bool> stopped{false};  // the job is being destroyed: items no longer call fn
  std::atomic<uint64_t> items_run{0};
  std::mutex mutex;
  std::string error;  // guarded by mutex

  // wait_items_run: a waiter's target (UINT64_MAX: none waits). An item that brings items_run to
  // the target (or fails) notifies; others touch neither the mutex nor the condition.
  std::atomic<uint64_t> wake_at{~uint64_t{0}};
  std::mutex wait_mutex;
  std::condition_variable ran;

  // A job with configurations: item k of a slice of configuration c calls fn(k, c). One
  // (record, index) pair per configuration, made at creation: the launch callback allocates
  // nothing and the item function learns its slice's configuration from its user pointer.
  struct ConfigUser {
    PyItemRecord* record = nullptr;
    int config = 0;
    double cost_us = 0.0;  // the simulator's item time for this configuration
  };
  std::vector<ConfigUser> config_users;
  std::vector<std::string> config_names;
  std::vector<pfJobConfig_t> configs;
  int backend = pfBackendSim;

  static void on_item(void* user, uint64_t item);
  static void on_config_item(void* user, uint64_t item);
  static pfResult_t launch(void* user, const pfSliceDesc_t* slice, void* stream);

  // Runs fn(item) or fn(item, config) with the GIL (config < 0: the former).
  void run(uint64_t item, int config);
  void item_ran();  // counts the item and wakes a waiter whose target it reached
  // Blocks (the caller released the GIL) until items_run >= target, the job failed or stopped,
  // or timeout_s passed; returns items_run.
  uint64_t wait_items_run(uint64_t target, double timeout_s);
};

}  // namespace pfpy
