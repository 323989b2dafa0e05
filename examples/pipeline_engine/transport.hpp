// How the engine's instructions reach a device. One interface, four implementations:
//  - SimTransport: every stage on one simulated world (one process, one thread), work enqueued
//    in global dependency order and executed in virtual time;
//  - emulated peers on one GPU (CUDA): this GPU runs one stage for real, the other stages are
//    a host timeline that releases the stage's receives through device flags;
//  - NCCL send/recv across GPUs, one host thread per GPU;
//  - HostTransport (host_transport.hpp): every stage on its own real-time host device
//    (pfBackendHost), one host thread per stage, fill items on the devices' SM threads.
// The engine (engine.cpp) drives all of them through the same code path.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "instructions.hpp"
#include "pipefill/pipefill.h"

namespace engine {

// A failed call: its result code and a message naming the call and the library's explanation.
struct Status {
  pfResult_t code = pfSuccess;
  std::string message;
  bool ok() const { return code == pfSuccess; }
};

Status pf_status(pfResult_t code, const char* what);  // reads pfGetLastErrorMessage()

#define ENGINE_PF(call)                                                  \
  do {                                                                   \
    const pfResult_t engine_result_ = (call);                            \
    if (engine_result_ != pfSuccess) return ::engine::pf_status(engine_result_, #call); \
  } while (0)
#define ENGINE_TRY(expr)                          \
  do {                                            \
    ::engine::Status engine_status_ = (expr);     \
    if (!engine_status_.ok()) return engine_status_; \
  } while (0)

struct IterationTiming {
  double start_us = 0.0;  // earliest stage start
  double end_us = 0.0;    // latest stage end
};

struct TransportOptions {
  uint64_t seed = 1;
  double jitter = 0.0;        // simulated kernel-duration jitter (relative std-dev)
  // Simulated interference (pfSimDeviceDesc_t): beta, main kernels slowed by co-running fill
  // blocks; beta_f, fill items slowed by main blocks; gamma, comm transfers slowed by fill. The
  // engine passes the calibrated defaults (docs/simulated-device.md); 0 turns each off.
  double interference = 0.0;
  double fill_slowdown = 0.0;
  double comm_slowdown = 0.0;
  bool reserve_sms = true;    // false: fill may use every SM (the naive baseline)
  // Fill accounting (take_fill_accounting): iterations before this one are not counted.
  int warm_iterations = 0;
  // The sending stage's notice a lead before each send (sender_notice.hpp); < 0: none. The
  // simulated transport only.
  double notice_lead_us = -1.0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  virtual pfBackend_t backend() const = 0;
  // true: the engine drives every stage from one thread in global dependency order (the
  // simulated device runs enqueued work only when asked to). false: one host thread per stage.
  virtual bool single_thread() const = 0;
  // Stages this process drives with a real runtime (the emulated transport drives one).
  virtual int local_stages() const = 0;
  virtual int first_local_stage() const { return 0; }

  virtual Status open(const PipelineSpec& spec, const StageCosts& costs, const Programs& programs,
                      const TransportOptions& options) = 0;
  virtual void configure_runtime(int stage, pfConfig_t* config) = 0;
  // After the stage's runtime exists: main-job streams at high priority, events.
  virtual Status attach(int stage, pfRuntime_t runtime) = 0;
  virtual void* main_stream(int stage) = 0;

  virtual Status begin_iteration(int stage) = 0;
  // A collective's arrival: called for every stage before any stage's execute() of it when
  // single_thread(); right before execute() otherwise.
  virtual Status arrive(int stage, const Instruction& instruction) = 0;
  virtual Status execute(int stage, const Instruction& instruction) = 0;
  virtual Status end_iteration(int stage) = 0;
  // Runs (sim) or waits for (GPU) the iteration's work; returns its span.
  virtual Status finish_iteration(IterationTiming* timing) = 0;

  // The naive baseline: ungated work of `items` items at `item_cost_us` on all SMs at the main
  // job's priority, starting when the stage goes idle. The simulated and the emulated (one GPU)
  // transports have it; NCCL does not yet.
  virtual Status naive_fill(int /*stage*/, uint64_t /*items*/, double /*item_cost_us*/) {
    return Status{pfErrorNotSupported, name() + " transport has no naive fill baseline"};
  }
  virtual uint64_t naive_items_done() const { return 0; }

  // Right before pfJobCreate of a stage's fill job: a transport may wrap the job's callbacks
  // (the host transport times the executor's launch of every slice).
  virtual void wrap_job_desc(int /*stage*/, pfJobDesc_t* /*desc*/) {}

  // The peers' fill (engine.hpp FillMode FreeRide / Tally / PaperStyle), started right after the
  // engine's pfBubbleBegin for the stage's `bubble_index`-th bubble of the iteration, and the
  // stream-ordered end of the bubble (Tally's retreat flag) right after its pfBubbleEnd. Only
  // the simulated transport has them.
  struct PeerFill {
    int mode = 0;            // engine::FillMode, as int (transport.hpp does not see engine.hpp)
    int bubble_index = -1;
    double item_cost_us = 0.0;
    double margin_us = 0.0;        // the runtime's safety margins (paper-style fits with them)
    double margin_fraction = 0.0;
    double knob = -1.0;  // EngineOptions::mode_knob (< 0: the mode's default)
  };
  virtual Status peer_fill(int /*stage*/, const PeerFill& /*fill*/) {
    return Status{pfErrorNotSupported, name() + " transport has no FreeRide/Tally/paper-style baselines"};
  }
  virtual Status peer_bubble_end(int /*stage*/) { return {}; }

  // Fill accounting, every mode alike (simulated transport): an item callback for fill jobs the
  // runtime launches (fjParams_t::on_item), the bubbles' begin marks, and the totals.
  using ItemCallback = void (*)(void* user, uint64_t item);
  virtual bool item_observer(int /*stage*/, ItemCallback* /*fn*/, void** /*user*/) { return false; }
  // The nominal cost of one fill item on one SM (known once the engine made its fill jobs).
  virtual void set_fill_item_cost(double /*item_cost_us*/) {}
  virtual Status bubble_began(int /*stage*/, int /*bubble_index*/) { return {}; }
  struct FillAccounting {
    double filled_sm_us = 0.0, bubble_us = 0.0, item_work_sm_us = 0.0;
    // Bubble time before the message of the receive that ends it is sent (all of a bubble that
    // waits for the collective): the zero-slowdown ceiling of the filled share.
    double transfer_free_us = 0.0;
    std::vector<double> first_block_delays_us;  // bubble end -> next main kernel's first block
    std::vector<double> all_blocks_delays_us;   // ... -> its last block (it holds all its SMs)
  };
  virtual FillAccounting take_fill_accounting() { return {}; }

  // Called right after the engine's pfBubbleEnd. Transports that can measure it then report the
  // delay from the bubble's end (the wait completing) to the start of the stage's next compute
  // kernel: the time fill work kept the main job's SMs (resume_delays_us, drained each call).
  virtual Status bubble_ended(int /*stage*/) { return {}; }
  virtual std::vector<double> take_resume_delays_us() { return {}; }

  // Before the stage's runtime is destroyed (streams it created), then after all of them.
  virtual Status detach(int stage, pfRuntime_t runtime) = 0;
  virtual void close() = 0;
};

std::unique_ptr<Transport> make_sim_transport();
std::unique_ptr<Transport> make_host_transport();  // host_transport.cpp
// CUDA transports; nullptr (and *why set) when built without CUDA or without enough GPUs.
std::unique_ptr<Transport> make_emulated_transport(std::string* why);
std::unique_ptr<Transport> make_nccl_transport(int stages, std::string* why);
int cuda_gpu_count();  // 0 without CUDA

}  // namespace engine
