// The device interface: everything the core runtime needs from a GPU, and nothing more.
// Two implementations: the CUDA device (cuda/, built when the toolkit is present) and the
// simulated device (src/sim/), a deterministic discrete-event model used on machines without
// a GPU and in every core test. The core never includes a CUDA header; it sees streams and
// events as opaque pointers owned by the device.
//
// Threading: the API caller thread (bubble instructions) and the executor thread call into the
// device concurrently; implementations must be thread-safe. No method may block on the main
// job's streams except synchronize_event/synchronize_stream, which are only called outside
// bubbles (pfRuntimeSynchronize, pfJobWait, shutdown).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "analysis/activity.hpp"
#include "common/error.hpp"
#include "pipefill/pipefill.h"

namespace pipefill {

using Stream = void*;  // cudaStream_t / simulated stream
using Event = void*;   // cudaEvent_t wrapper / simulated event

struct RuntimeOptions;  // resolved configuration (core/config.hpp)

// Which SMs fill work may use, as decided when the device is set up.
struct FillPartition {
  int total_sms = 0;     // SMs of the device
  int fill_sms = 0;      // SMs fill work may occupy (total - reserved, rounded to granularity)
  int reserved_sms = 0;  // SMs kept for the main job
  bool hardware_confined = false;  // true: green context / simulated partition; false: grid cap
  std::string mode;      // "green-context", "grid-cap", "simulated-partition"
};

// Capability of devices whose clock advances only when a caller drives it (the simulated
// device: virtual time advances inside pfSimRunUntilIdle). The runtime registers a hook that
// runs before every drive, so the fill work of bubbles already begun is enqueued before the
// device executes anything; it also hands the world out (pfRuntimeGetSimWorld). The core sees
// only this interface, never a simulator type.
class DrivenClock {
 public:
  virtual ~DrivenClock() = default;
  // The C handle of the simulated world this device belongs to.
  virtual pfSimWorld_t world_handle() const = 0;
  // `hook` runs on the driving thread before each run of the device's clock, until removed.
  virtual void add_pre_run_hook(const void* owner, std::function<void()> hook) = 0;
  virtual void remove_pre_run_hook(const void* owner) = 0;
  // Whether the calling thread drives the clock (it last ran the world, or created it and nobody
  // ran it since): while it blocks, no time passes, so a wait for fill progress never returns.
  virtual bool driven_by_calling_thread() const = 0;
};

// ---- Graph fill jobs ---------------------------------------------------------------------------
// What a device prepares, once at pfJobCreateGraph (never inside a bubble), to run the items of a
// graph fill job: on CUDA the instantiated gated graph (cuda/gated_graph.hpp), on the simulated and
// host devices the item cost, the index word and the per-item callback. The job owns it; it is
// released when the job's teardown runs, once no slice of the job is in flight.
class GraphItems {
 public:
  virtual ~GraphItems() = default;
  // SMs one run of the item may occupy at once (CUDA: the largest grid among the graph's kernels,
  // capped by the partition); 0: unknown. The runtime charges a graph job's slice that many SMs
  // in its SM x us packing, the whole fill partition when unknown.
  virtual int sms_used() const { return 0; }
};

// Everything a device needs to prepare a graph job. The words are the job's for its whole life
// (its slot's cursor and budget counter, the runtime's gate).
struct GraphJobSpec {
  std::string name;
  void* graph = nullptr;                   // cudaGraph_t of one item (CUDA); unused elsewhere
  uint64_t* index_word = nullptr;          // the word the graph reads the item index from
  uint64_t item_count = 0;
  double item_cost_us = 0.0;
  pfGraphItemFn on_item = nullptr;         // simulated/host devices: called per item
  bool on_item_is_work = false;            // host: on_item is the item (no item_cost_us pad)
  void* user = nullptr;
  const volatile uint64_t* gate = nullptr;
  uint64_t* cursor = nullptr;
  uint64_t* budget_counter = nullptr;
  uint64_t* scratch_words = nullptr;       // kGraphScratchWords words of the job's arena share
  Stream fill_stream = nullptr;            // its context is the one the graph is built in
};
inline constexpr size_t kGraphScratchWords = 2;  // CUDA: the current slice's bubble id, budget

class Device {
 public:
  virtual ~Device() = default;

  virtual pfBackend_t backend() const = 0;
  virtual std::string name() const = 0;
  // The device's ordinal when the device chose it (CUDA: config.device or the caller's current
  // device); -1 when options.device is used as given. The runtime reports it in its config.
  virtual int ordinal() const { return -1; }

  // ---- Streams ---------------------------------------------------------------------------
  // Priority numbers follow CUDA: lower = higher priority; `lowest` is usually 0.
  virtual pfResult_t priority_range(int* lowest, int* highest) = 0;
  // A stream for fill work: lowest priority, inside the fill partition when there is one.
  virtual pfResult_t create_fill_stream(Stream* out) = 0;
  // A stream for the main job at the given priority (pfStreamCreateHighPriority).
  virtual pfResult_t create_stream(int priority, Stream* out) = 0;
  virtual pfResult_t destroy_stream(Stream stream) = 0;
  // Whether `stream` is a valid stream the main job may mark bubbles on. The simulated device
  // checks it belongs to this device; CUDA accepts any non-fill stream (incl. legacy default).
  virtual bool is_valid_main_stream(Stream stream) const = 0;
  virtual pfResult_t synchronize_stream(Stream stream) = 0;

  // ---- Events (always timing-capable) ----------------------------------------------------
  virtual pfResult_t create_event(Event* out) = 0;
  virtual pfResult_t destroy_event(Event event) = 0;
  virtual pfResult_t record_event(Event event, Stream stream) = 0;
  virtual pfResult_t stream_wait_event(Stream stream, Event event) = 0;
  // Non-blocking. When the latest record has completed: *done = true and *time_us = its
  // completion time on the device clock (µs, monotonic, same origin for all events of the
  // device). Otherwise *done = false.
  virtual pfResult_t query_event(Event event, bool* done, double* time_us) = 0;
  virtual pfResult_t synchronize_event(Event event) = 0;

  // ---- Device words (gate, cursors, counters) ---------------------------------------------
  // `count` zero-initialised 64-bit words in device memory, 256-byte aligned; made only at
  // setup time, never inside a bubble.
  virtual pfResult_t allocate_words(size_t count, uint64_t** words) = 0;
  virtual pfResult_t free_words(uint64_t* words) = 0;
  // Host memory the device can write asynchronously (pinned on CUDA).
  virtual pfResult_t allocate_host_words(size_t count, uint64_t** words) = 0;
  virtual pfResult_t free_host_words(uint64_t* words) = 0;
  // Stream-ordered write of `value` to a device word (the gate close). Never a wait-value op.
  virtual pfResult_t write_word(Stream stream, uint64_t* word, uint64_t value) = 0;
  // Stream-ordered atomic max of `value` into a device word: the early gate close of
  // pfBubbleCloseFill, issued on another stream than the bubble's, must never move the gate
  // back below a later bubble's close.
  virtual pfResult_t write_word_max(Stream stream, uint64_t* word, uint64_t value) = 0;
  // Stream-ordered copy of a device word to a host word (cursor read-back).
  virtual pfResult_t copy_word_to_host(Stream stream, const uint64_t* word, uint64_t* host) = 0;

  // ---- Memory -----------------------------------------------------------------------------
  virtual pfResult_t memory_info(size_t* free_bytes, size_t* total_bytes) = 0;
  // The fill arena: one allocation made at runtime creation.
  virtual pfResult_t allocate_arena(size_t bytes, void** base) = 0;
  virtual pfResult_t free_arena(void* base) = 0;

  // ---- SMs --------------------------------------------------------------------------------
  virtual int sm_count() const = 0;
  // Sets up the fill partition keeping `reserved_sms` for the main job. Called once before
  // create_fill_stream.
  virtual pfResult_t configure_partition(int reserved_sms, FillPartition* partition) = 0;

  // Several Device objects may drive one physical device whose fill partition they share (two
  // runtimes on one simulated device). Such a device names it with a key unique while it lives
  // and reports the SMs reserved now; the runtime then keeps the partition the first runtime set:
  // a later runtime must reserve as many (or leave reserved_sms unset), and a failing or
  // destroyed one leaves it unchanged. false (the default): this object's partition is its own
  // (CUDA: a green context per runtime).
  virtual bool shared_partition(std::string* key, int* reserved_now) const {
    (void)key;
    (void)reserved_now;
    return false;
  }

  // ---- Clock ------------------------------------------------------------------------------
  // Device clock of the event timings, µs (CUDA: host steady clock aligned at creation;
  // simulated: virtual time).
  virtual double now_us() = 0;

  // ---- Graph capture (optional) ----------------------------------------------------------
  // Whether `stream` is being captured into a CUDA graph (cudaStreamIsCapturing). The runtime
  // refuses bubble instructions on such a stream: a captured gate write would replay with the
  // bubble id of the capture. Devices without graphs: never.
  virtual bool is_capturing(Stream stream) const {
    (void)stream;
    return false;
  }

  // ---- Main streams at bubble instructions (optional) -------------------------------------
  // pfBubbleBegin, after is_valid_main_stream and is_capturing and before anything is enqueued on
  // `stream`: the device may refuse a main stream it cannot serve, with a message naming it (CUDA:
  // a stream of another device's context, or of a context whose streams fail the event self-test
  // once run for it); *identity gets a token of the stream (0: none) for main_stream_unchanged.
  virtual pfResult_t admit_main_stream(Stream stream, uint64_t* identity) {
    (void)stream;
    *identity = 0;
    return pfSuccess;
  }
  // pfBubbleEnd: whether `stream` is still the stream admitted with `identity` (false: it was
  // destroyed with the bubble open, or its handle names another stream now).
  virtual bool main_stream_unchanged(Stream stream, uint64_t identity) const {
    (void)stream;
    (void)identity;
    return true;
  }

  // ---- The calling thread's context (optional) --------------------------------------------
  // Around every job launch and setup callback (on the executor or on the caller's thread): makes
  // the device current for the callback, which launches kernels or allocates on it (CUDA: pushes
  // the device's primary context unless it is current). true: leave_launch_context must follow on
  // this thread (LaunchContextScope below).
  virtual bool enter_launch_context() { return false; }
  virtual void leave_launch_context() {}
  // pfGraphCaptureContextPush/Pop: makes the context of `stream` (a capture stream of this device)
  // current on the calling thread until the matching pop on that thread (CUDA: the fill
  // partition's green context, so captured kernels belong to it). Devices without contexts keep a
  // count only, so that a pop without a push is refused everywhere.
  virtual pfResult_t push_capture_context(Stream stream);
  virtual pfResult_t pop_capture_context();

  // ---- Hardware queues (optional) ---------------------------------------------------------
  // Whether the main streams and the fill streams feed one in-order hardware queue, so an
  // operation starts only after everything enqueued before it on any stream was dispatched (CUDA
  // with CUDA_DEVICE_MAX_CONNECTIONS=1 in grid-cap mode). Then fill slices must be enqueued
  // before the main stream's wait in a bubble: the runtime's auto launch mode goes inline.
  virtual bool single_hardware_queue() const { return false; }

  // ---- Graph fill jobs (optional) --------------------------------------------------------
  // Prepares a graph job (see GraphItems). pfErrorNotSupported (the default) names the device.
  virtual pfResult_t prepare_graph_items(const GraphJobSpec& spec,
                                         std::unique_ptr<GraphItems>* out) {
    (void)spec;
    (void)out;
    return fail(pfErrorNotSupported, "the {} has no graph fill jobs", name());
  }
  // Enqueues the gated items of one slice on `stream` (a fill stream): at most slice.max_items
  // items while *slice.gate < slice.bubble_id, claimed from slice.cursor. Called on the executor
  // side with the runtime's state lock held: no allocation, no synchronisation.
  virtual pfResult_t launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice,
                                        Stream stream) {
    (void)items;
    (void)slice;
    (void)stream;
    return fail(pfErrorNotSupported, "the {} has no graph fill jobs", name());
  }
  // A stream to capture a graph job's graph on: on the fill partition's context (CUDA: the
  // green context when there is one), never a fill stream; destroyed with destroy_stream. The
  // default is an ordinary stream at the lowest priority.
  virtual pfResult_t create_capture_stream(Stream* out) {
    int lowest = 0, highest = 0;
    const pfResult_t range = priority_range(&lowest, &highest);
    if (range != pfSuccess) return range;
    return create_stream(lowest, out);
  }

  // ---- Host functions (optional) ---------------------------------------------------------
  // Enqueues fn(user) on `stream`: it runs on the thread that executes the stream when the stream
  // reaches it, and what follows on the stream waits for it to return (the host device;
  // pfRuntimeSetSliceObserver's calls). pfErrorNotSupported (the default) names the device.
  virtual pfResult_t host_func(Stream stream, void (*fn)(void*), void* user) {
    (void)stream;
    (void)fn;
    (void)user;
    return fail(pfErrorNotSupported, "the {} runs no host functions on its streams", name());
  }

  // ---- Capabilities (optional) -----------------------------------------------------------
  // Non-null for a device whose clock is driven by the caller (the simulator).
  virtual DrivenClock* driven_clock() { return nullptr; }

  // Fill items that failed (an item function threw) in the launches that followed `slice_start`
  // - a slice's start event, recorded on its fill stream right before the slice's launch - up to
  // that stream's next record; *not_run: items of opaque launches left unrun because every block
  // had stopped at a failure; *first gets the first failure's message. Read at harvest, after the
  // slice's end event completed. Devices whose items cannot fail on the host (CUDA: a fault is a
  // sticky context error, reported as such) report none.
  virtual uint64_t item_failures(Event slice_start, uint64_t* not_run, std::string* first) {
    (void)slice_start;
    (void)first;
    *not_run = 0;
    return 0;
  }

  // ---- Calibration (optional) ---------------------------------------------------------------
  // Activity records (kernels, copies, memsets, memory) completed since the last call, appended
  // to *out; meant to be called once per iteration, outside bubbles. CUDA: from the CUPTI
  // collector in calibration mode (PIPEFILL_CUPTI=1 / enable_cupti). pfErrorNotSupported when
  // the device collects none.
  virtual pfResult_t collect_activity(std::vector<ActivityRecord>* out) {
    (void)out;
    return pfErrorNotSupported;
  }
};

// Device::enter_launch_context / leave_launch_context for one scope: around a job's callbacks
// that launch kernels or allocate on the device (launch, setup).
class LaunchContextScope {
 public:
  explicit LaunchContextScope(Device& device) : device_(device), entered_(device.enter_launch_context()) {}
  ~LaunchContextScope() {
    if (entered_) device_.leave_launch_context();
  }
  LaunchContextScope(const LaunchContextScope&) = delete;
  LaunchContextScope& operator=(const LaunchContextScope&) = delete;

 private:
  Device& device_;
  bool entered_;
};

// Factories. make_cuda_device returns pfErrorNotSupported when built without CUDA and
// pfErrorNoDevice when no GPU is usable; the message says why. make_host_device builds the
// real-time host device (src/host/): CPU threads as streams, for the asynchronous path.
pfResult_t make_cuda_device(const RuntimeOptions& options, std::unique_ptr<Device>* out);
pfResult_t make_sim_device(const RuntimeOptions& options, std::unique_ptr<Device>* out);
pfResult_t make_host_device(const RuntimeOptions& options, std::unique_ptr<Device>* out);
// The device for options.backend (pfBackendAuto must already be resolved).
pfResult_t make_device(const RuntimeOptions& options, std::unique_ptr<Device>* out);
// Number of usable CUDA devices (0 when built without CUDA or without a driver).
int cuda_device_count();

}  // namespace pipefill
