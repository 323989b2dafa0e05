// The simulated transport: all stages in one process on one pfSim world, one simulated GPU per
// stage. Per stage: a compute stream and a communication stream, both at the main job's high
// priority (pfStreamCreateHighPriority). Compute ops are kernels sized from the model flags that
// need every SM but the communication ones; a send records the message's event on the compute
// stream; a receive waits for it (+ p2p latency) on the communication stream while holding
// `comm_sms` SMs, as a spinning NCCL kernel does; WaitComm makes the compute stream wait for the
// receive. The engine enqueues the stages in global dependency order, so every event record is
// enqueued before the waits on it.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <vector>

#include "transport.hpp"

namespace engine {

Status pf_status(pfResult_t code, const char* what) {
  return Status{code, fmt::format("{} failed: {}: {}", what, pfGetErrorString(code),
                                  pfGetLastErrorMessage())};
}

namespace {

class SimTransport final : public Transport {
 public:
  ~SimTransport() override { close(); }

  std::string name() const override { return "sim"; }
  pfBackend_t backend() const override { return pfBackendSim; }
  bool single_thread() const override { return true; }
  int local_stages() const override { return spec_.stages; }

  Status open(const PipelineSpec& spec, const StageCosts& costs, const Programs& programs,
              const TransportOptions& options) override {
    spec_ = spec;
    costs_ = costs;
    options_ = options;
    // Exactly the interference the options ask for (the engine passes the calibrated one).
    pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER;
    desc.sm_count = spec.sm_count;
    desc.jitter_fraction = options.jitter;
    desc.interference = options.interference;
    desc.fill_slowdown = options.fill_slowdown;
    desc.comm_slowdown = options.comm_slowdown;
    ENGINE_PF(pfSimWorldCreate(spec.stages, &desc, options.seed, &world_));
    stages_.assign(static_cast<size_t>(spec.stages), StageState{});
    for (StageState& st : stages_) {
      for (pfSimEvent_t* e : {&st.recv_done, &st.begin, &st.end, &st.arrive, &st.naive_start})
        ENGINE_PF(pfSimEventCreate(world_, e));
    }
    for (size_t st = 0; st < stages_.size(); ++st) {
      const int bubbles = programs.bubbles_per_stage[st];
      for (int b = 0; b < bubbles; ++b) {
        ResumeProbe probe;
        ENGINE_PF(pfSimEventCreate(world_, &probe.bubble_end));
        ENGINE_PF(pfSimEventCreate(world_, &probe.kernel_end));
        stages_[st].probes.push_back(probe);
      }
    }
    // One event per message of an iteration, created up front (reused every iteration: all of
    // an iteration's waits are enqueued before the next iteration's records).
    for (const auto& prog : programs.stages) {
      for (const Instruction& in : prog) {
        if (in.type != InstrType::SendActivation && in.type != InstrType::SendGradient) continue;
        pfSimEvent_t event = nullptr;
        ENGINE_PF(pfSimEventCreate(world_, &event));
        messages_[key_of(in)] = event;
      }
    }
    return {};
  }

  void configure_runtime(int stage, pfConfig_t* config) override {
    config->backend = pfBackendSim;
    config->sim_world = world_;
    config->device = stage;
    config->reserved_sms = options_.reserve_sms ? spec_.comm_sms : 0;
  }

  Status attach(int stage, pfRuntime_t runtime) override {
    StageState& st = stages_[static_cast<size_t>(stage)];
    ENGINE_PF(pfStreamCreateHighPriority(runtime, &st.main));
    ENGINE_PF(pfStreamCreateHighPriority(runtime, &st.comm));
    return {};
  }

  void* main_stream(int stage) override { return stages_[static_cast<size_t>(stage)].main; }

  Status begin_iteration(int stage) override {
    StageState& st = stages_[static_cast<size_t>(stage)];
    ENGINE_PF(pfSimEventRecord(st.begin, st.main));
    return {};
  }

  Status arrive(int stage, const Instruction&) override {
    StageState& st = stages_[static_cast<size_t>(stage)];
    ENGINE_PF(pfSimEventRecord(st.arrive, st.main));
    return {};
  }

  Status execute(int stage, const Instruction& in) override {
    StageState& st = stages_[static_cast<size_t>(stage)];
    const int compute_sms = spec_.sm_count - spec_.comm_sms;
    switch (in.type) {
      case InstrType::LoadMicrobatch:
        ENGINE_PF(pfSimStreamDelay(st.main, costs_.load_us));
        return {};
      case InstrType::Forward:
      case InstrType::Backward:
      case InstrType::BackwardInput:
      case InstrType::BackwardWeight: {
        const double us = in.type == InstrType::Forward          ? costs_.forward_layer_us
                          : in.type == InstrType::Backward       ? costs_.backward_layer_us
                          : in.type == InstrType::BackwardInput  ? costs_.backward_input_layer_us
                                                                 : costs_.backward_weight_layer_us;
        for (int layer = 0; layer < costs_.layers_per_chunk; ++layer) {
          ENGINE_PF(pfSimLaunchKernel(st.main, us, compute_sms));
          if (layer == 0) ENGINE_TRY(probe_first_kernel(st, us));
        }
        return {};
      }
      case InstrType::SendActivation:
      case InstrType::SendGradient:
        ENGINE_PF(pfSimEventRecord(message(in), st.main));
        return {};
      case InstrType::RecvActivation:
      case InstrType::RecvGradient:
      {
        // The fixed latency is not slowed by fill; the bytes moving are (comm_slowdown).
        const double latency = std::min(spec_.model.p2p_latency_us, costs_.p2p_us);
        ENGINE_PF(pfSimStreamWaitEventTransfer(st.comm, message(in), latency,
                                               costs_.p2p_us - latency, spec_.comm_sms));
      }
        ENGINE_PF(pfSimEventRecord(st.recv_done, st.comm));
        return {};
      case InstrType::WaitComm:
        ENGINE_PF(pfSimStreamWaitEvent(st.main, st.recv_done, 0.0, 0));
        return {};
      case InstrType::ReduceGradients:
        // Every stage's gradients must be ready (the cross-stage gradient-norm reduction), then
        // the data-parallel all-reduce runs on the communication SMs.
        for (const StageState& other : stages_)
          ENGINE_PF(pfSimStreamWaitEvent(st.comm, other.arrive, 0.0, spec_.comm_sms));
        if (spec_.model.allreduce_us > 0.0)
          ENGINE_PF(pfSimLaunchKernel(st.comm, spec_.model.allreduce_us, spec_.comm_sms));
        ENGINE_PF(pfSimEventRecord(st.recv_done, st.comm));
        return {};
      case InstrType::OptimizerStep:
        ENGINE_PF(pfSimLaunchKernel(st.main, costs_.optimizer_us, compute_sms));
        ENGINE_TRY(probe_first_kernel(st, costs_.optimizer_us));
        return {};
      case InstrType::BubbleBegin:
      case InstrType::BubbleEnd:
        break;
    }
    return Status{pfErrorInternal,
                  fmt::format("sim transport cannot execute {}", instr_name(in.type))};
  }

  Status end_iteration(int stage) override {
    StageState& st = stages_[static_cast<size_t>(stage)];
    ENGINE_PF(pfSimEventRecord(st.end, st.main));
    return {};
  }

  Status bubble_ended(int stage) override {
    StageState& st = stages_[static_cast<size_t>(stage)];
    if (st.probes_used >= st.probes.size()) return {};
    st.probe_pending = true;
    ENGINE_PF(pfSimEventRecord(st.probes[st.probes_used].bubble_end, st.main));
    return {};
  }

  std::vector<double> take_resume_delays_us() override {
    std::vector<double> out;
    out.swap(resume_delays_);
    return out;
  }

  Status finish_iteration(IterationTiming* timing) override {
    ENGINE_PF(pfSimRunUntilIdle(world_));
    for (StageState& st : stages_) {
      // Kernel start = its end - its duration: exact without jitter and interference.
      for (size_t i = 0; i < st.probes_used; ++i) {
        double end = 0, kernel_end = 0;
        ENGINE_PF(pfSimEventTime(st.probes[i].bubble_end, &end));
        ENGINE_PF(pfSimEventTime(st.probes[i].kernel_end, &kernel_end));
        resume_delays_.push_back(kernel_end - st.probes[i].kernel_us - end);
      }
      st.probes_used = 0;
      st.probe_pending = false;
    }
    IterationTiming t{1e300, -1e300};
    for (const StageState& st : stages_) {
      double begin = 0, end = 0;
      ENGINE_PF(pfSimEventTime(st.begin, &begin));
      ENGINE_PF(pfSimEventTime(st.end, &end));
      if (begin < 0 || end < 0)
        return Status{pfErrorInternal, "an iteration event did not complete in the simulation"};
      t.start_us = std::min(t.start_us, begin);
      t.end_us = std::max(t.end_us, end);
    }
    *timing = t;
    return {};
  }

  Status naive_fill(int stage, uint64_t items, double item_cost_us) override {
    StageState& st = stages_[static_cast<size_t>(stage)];
    if (st.naive == nullptr)  // same priority as the main streams: the highest there is
      ENGINE_PF(pfSimStreamCreate(world_, stage, kSimHighestPriority, &st.naive));
    if (items == 0) return {};
    ENGINE_PF(pfSimEventRecord(st.naive_start, st.main));
    ENGINE_PF(pfSimStreamWaitEvent(st.naive, st.naive_start, 0.0, 0));
    ENGINE_PF(pfSimLaunchOpaque(st.naive, st.naive_next, items, spec_.sm_count, item_cost_us,
                                &count_naive_item, this));
    st.naive_next += items;
    return {};
  }

  uint64_t naive_items_done() const override { return naive_items_.load(); }

  Status detach(int stage, pfRuntime_t runtime) override {
    StageState& st = stages_[static_cast<size_t>(stage)];
    Status status;
    for (void** s : {&st.main, &st.comm}) {
      if (*s == nullptr) continue;
      const pfResult_t r = pfStreamDestroy(runtime, *s);
      if (r != pfSuccess && status.ok()) status = pf_status(r, "pfStreamDestroy");
      *s = nullptr;
    }
    return status;
  }

  void close() override {
    if (world_ == nullptr) return;
    for (StageState& st : stages_) {
      if (st.naive) pfSimStreamDestroy(st.naive);
      for (pfSimEvent_t e : {st.recv_done, st.begin, st.end, st.arrive, st.naive_start})
        if (e) pfSimEventDestroy(e);
      for (const ResumeProbe& probe : st.probes) {
        if (probe.bubble_end) pfSimEventDestroy(probe.bubble_end);
        if (probe.kernel_end) pfSimEventDestroy(probe.kernel_end);
      }
    }
    for (auto& [key, event] : messages_) pfSimEventDestroy(event);
    messages_.clear();
    stages_.clear();
    pfSimWorldDestroy(world_);
    world_ = nullptr;
  }

 private:
  // pipefill's simulated device: priorities -5 (highest) .. 0 (lowest), like CUDA on H100.
  static constexpr int kSimHighestPriority = -5;

  struct ResumeProbe {
    pfSimEvent_t bubble_end = nullptr;
    pfSimEvent_t kernel_end = nullptr;
    double kernel_us = 0.0;
  };

  struct StageState {
    void* main = nullptr;
    void* comm = nullptr;
    void* naive = nullptr;
    pfSimEvent_t recv_done = nullptr, begin = nullptr, end = nullptr, arrive = nullptr;
    pfSimEvent_t naive_start = nullptr;
    uint64_t naive_next = 0;
    std::vector<ResumeProbe> probes;  // one per bubble of the iteration
    size_t probes_used = 0;
    bool probe_pending = false;  // a bubble ended; the next kernel closes the probe
  };

  // After the first kernel following a bubble end: record its completion.
  Status probe_first_kernel(StageState& st, double kernel_us) {
    if (!st.probe_pending) return {};
    st.probe_pending = false;
    ResumeProbe& probe = st.probes[st.probes_used++];
    probe.kernel_us = kernel_us;
    ENGINE_PF(pfSimEventRecord(probe.kernel_end, st.main));
    return {};
  }

  static uint64_t key_of(const Instruction& in) {
    const bool gradient = in.type == InstrType::SendGradient || in.type == InstrType::RecvGradient;
    return message_key(gradient, in.microbatch, in.virtual_stage);
  }
  pfSimEvent_t message(const Instruction& in) {
    const auto it = messages_.find(key_of(in));
    return it == messages_.end() ? nullptr : it->second;
  }
  static void count_naive_item(void* user, uint64_t) {
    static_cast<SimTransport*>(user)->naive_items_.fetch_add(1, std::memory_order_relaxed);
  }

  PipelineSpec spec_;
  StageCosts costs_;
  TransportOptions options_;
  pfSimWorld_t world_ = nullptr;
  std::vector<StageState> stages_;
  std::unordered_map<uint64_t, pfSimEvent_t> messages_;
  std::atomic<uint64_t> naive_items_{0};
  std::vector<double> resume_delays_;
};

}  // namespace

std::unique_ptr<Transport> make_sim_transport() { return std::make_unique<SimTransport>(); }

}  // namespace engine
