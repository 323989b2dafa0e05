// The simulated transport: all stages in one process on one pfSim world, one simulated GPU per
// stage. Per stage: a compute stream and a communication stream, both at the main job's high
// priority (pfStreamCreateHighPriority). Compute ops are kernels sized from the model flags that
// need every SM but the communication ones; a send records the message's event on the compute
// stream; a receive waits for it (+ p2p latency) on the communication stream while holding
// `comm_sms` SMs, as a spinning NCCL kernel does; WaitComm makes the compute stream wait for the
// receive. The engine enqueues the stages in global dependency order, so every event record is
// enqueued before the waits on it.
//
// It also runs the peers' fill mechanisms (FreeRide, Tally, PipeFill-paper style; engine.hpp
// FillMode) and measures every mode's fill the same way: each fill item's completion time (the
// runtime's fill jobs report theirs through fjParams_t::on_item), the bubbles' begin and end
// events, and the first block of the main kernel after each bubble from the device's log.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "analysis/activity.hpp"
#include "core/predictor.hpp"
#include "sender_notice.hpp"
#include "sim/sim_world.hpp"
#include "transport.hpp"

namespace engine {

Status pf_status(pfResult_t code, const char* what) {
  return Status{code, fmt::format("{} failed: {}: {}", what, pfGetErrorString(code),
                                  pfGetLastErrorMessage())};
}

namespace {

// A receive's fixed latency (never slowed by fill); the rest of its p2p time moves the bytes.
double receive_latency_us(const PipelineSpec& spec, const StageCosts& costs) {
  return std::min(spec.model.p2p_latency_us, costs.p2p_us);
}

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
    sim_ = pipefill::sim::world_from_handle(world_);
    ENGINE_TRY(notices_.open(world_, spec.stages, options.notice_lead_us,
                             receive_latency_us(spec, costs)));
    stages_.clear();
    for (int i = 0; i < spec.stages; ++i) {
      stages_.push_back(std::make_unique<StageState>());
      StageState& st = *stages_.back();
      st.index = i;
      st.nominal_sink = ItemSink{this, &st, 1.0};
      st.tally_sink = ItemSink{this, &st, 1.0 / kTallySpeedFactor};
      for (pfSimEvent_t* e : {&st.recv_done, &st.begin, &st.end, &st.arrive, &st.naive_start})
        ENGINE_PF(pfSimEventCreate(world_, e));
    }
    for (size_t st = 0; st < stages_.size(); ++st) {
      const int bubbles = programs.bubbles_per_stage[st];
      for (int b = 0; b < bubbles; ++b) {
        ResumeProbe probe;
        ENGINE_PF(pfSimEventCreate(world_, &probe.bubble_begin));
        ENGINE_PF(pfSimEventCreate(world_, &probe.bubble_end));
        ENGINE_PF(pfSimEventCreate(world_, &probe.kernel_end));
        stages_[st]->probes.push_back(probe);
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
    StageState& st = *stages_[static_cast<size_t>(stage)];
    ENGINE_PF(pfStreamCreateHighPriority(runtime, &st.main));
    ENGINE_PF(pfStreamCreateHighPriority(runtime, &st.comm));
    return notices_.attach(stage, runtime);
  }

  void* main_stream(int stage) override { return stages_[static_cast<size_t>(stage)]->main; }

  Status begin_iteration(int stage) override {
    StageState& st = *stages_[static_cast<size_t>(stage)];
    ENGINE_PF(pfSimEventRecord(st.begin, st.main));
    return {};
  }

  Status arrive(int stage, const Instruction&) override {
    StageState& st = *stages_[static_cast<size_t>(stage)];
    ENGINE_PF(pfSimEventRecord(st.arrive, st.main));
    notices_.on_arrive(stage);
    return {};
  }

  Status execute(int stage, const Instruction& in) override {
    StageState& st = *stages_[static_cast<size_t>(stage)];
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
          if (layer == costs_.layers_per_chunk - 1) ENGINE_TRY(notices_.before_kernel(st.index, st.main, us));
          ENGINE_PF(pfSimLaunchKernel(st.main, us, compute_sms));
          if (layer == 0) ENGINE_TRY(probe_first_kernel(st, us));
        }
        return {};
      }
      case InstrType::SendActivation:
      case InstrType::SendGradient:
        ENGINE_PF(pfSimEventRecord(message(in), st.main));
        notices_.on_send(st.index, key_of(in));
        return {};
      case InstrType::RecvActivation:
      case InstrType::RecvGradient:
      {
        // The fixed latency is not slowed by fill; the bytes moving are (comm_slowdown).
        const double latency = receive_latency_us(spec_, costs_);
        ENGINE_PF(pfSimStreamWaitEventTransfer(st.comm, message(in), latency,
                                               costs_.p2p_us - latency, spec_.comm_sms));
      }
        ENGINE_PF(pfSimEventRecord(st.recv_done, st.comm));
        st.posted_receive = true;
        notices_.on_receive(st.index, key_of(in));
        return {};
      case InstrType::WaitComm:
        ENGINE_PF(pfSimStreamWaitEvent(st.main, st.recv_done, 0.0, 0));
        return {};
      case InstrType::ReduceGradients:
        // Every stage's gradients must be ready (the cross-stage gradient-norm reduction), then
        // the data-parallel all-reduce runs on the communication SMs.
        for (const auto& other : stages_)
          ENGINE_PF(pfSimStreamWaitEvent(st.comm, other->arrive, 0.0, spec_.comm_sms));
        if (spec_.model.allreduce_us > 0.0)
          ENGINE_PF(pfSimLaunchKernel(st.comm, spec_.model.allreduce_us, spec_.comm_sms));
        ENGINE_PF(pfSimEventRecord(st.recv_done, st.comm));
        st.posted_receive = false;
        notices_.on_collective(st.index);
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
    StageState& st = *stages_[static_cast<size_t>(stage)];
    ENGINE_PF(pfSimEventRecord(st.end, st.main));
    return {};
  }

  Status bubble_began(int stage, int bubble_index) override {
    StageState& st = *stages_[static_cast<size_t>(stage)];
    ENGINE_TRY(notices_.after_begin(stage, st.posted_receive));
    if (st.begins_used >= st.probes.size()) return {};
    ResumeProbe& probe = st.probes[st.begins_used++];
    probe.bubble_index = bubble_index;
    probe.ends_in_receive = st.posted_receive;
    ENGINE_PF(pfSimEventRecord(probe.bubble_begin, st.main));
    return {};
  }

  Status bubble_ended(int stage) override {
    StageState& st = *stages_[static_cast<size_t>(stage)];
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
    const bool counted = iteration_++ >= options_.warm_iterations;
    for (auto& stage : stages_) {
      StageState& st = *stage;
      ENGINE_TRY(account(st, counted));
      st.probes_used = 0;
      st.begins_used = 0;
      st.probe_pending = false;
    }
    IterationTiming t{1e300, -1e300};
    for (const auto& stage : stages_) {
      const StageState& st = *stage;
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
    StageState& st = *stages_[static_cast<size_t>(stage)];
    if (st.naive == nullptr)  // same priority as the main streams: the highest there is
      ENGINE_PF(pfSimStreamCreate(world_, stage, kSimHighestPriority, &st.naive));
    if (items == 0) return {};
    ENGINE_PF(pfSimEventRecord(st.naive_start, st.main));
    ENGINE_PF(pfSimStreamWaitEvent(st.naive, st.naive_start, 0.0, 0));
    ENGINE_PF(pfSimLaunchOpaque(st.naive, st.naive_next, items, spec_.sm_count, item_cost_us,
                                &ItemSink::on_item, &st.nominal_sink));
    st.naive_next += items;
    return {};
  }

  uint64_t naive_items_done() const override { return baseline_items_.load(); }

  // The peers, each from its published description (the single-stage version of the same rules,
  // with the same citations, is benchmarks/bench_engine.cpp section 5):
  //  - FreeRide (arXiv 2409.06941; jiashu-z/freeride): side-task steps of their profiled
  //    duration started while k x step + 1.2 x step fits the bubble's predicted duration, low
  //    priority (MPS client priority 1), no gate, no SM reservation; host polling delays taken as
  //    0 (favours it);
  //  - Tally (ASPLOS'25, arXiv 2410.07381; tally-project/tally): a persistent preemptible kernel
  //    on every SM claiming items until a retreat flag set at the bubble end (stream-ordered:
  //    favours it), no prediction, no reservation, items at 1 / 0.9 of their cost;
  //  - PipeFill paper (arXiv 2410.07192): a piece fitted to the predicted bubble (the same
  //    predictor and margins as the runtime) on the SMs the receive leaves free, low priority,
  //    no device gate.
  // FreeRide and paper-style predict with the runtime's own predictor (nearest-rank 0.1 quantile
  // of the last 64 measured bubbles of the class, ready after 2).
  Status peer_fill(int stage, const PeerFill& fill) override {
    StageState& st = *stages_[static_cast<size_t>(stage)];
    if (!(fill.item_cost_us > 0))
      return Status{pfErrorInvalidArgument,
                    fmt::format("peer fill: item cost must be > 0 us, got {}", fill.item_cost_us)};
    if (st.peer == nullptr)
      ENGINE_PF(pfSimStreamCreate(world_, stage, kSimLowestPriority, &st.peer));
    ENGINE_PF(pfSimEventRecord(st.naive_start, st.main));
    ENGINE_PF(pfSimStreamWaitEvent(st.peer, st.naive_start, 0.0, 0));
    // The knob (frontier.hpp) moves each peer along its own curve; < 0 keeps its default.
    const bool knob = fill.knob > 0;
    const double quantile = fill.mode == kModePaper && knob ? fill.knob : kPeerQuantile;
    const pipefill::BubblePrediction p =
        st.predictor.predict(class_key(fill.bubble_index), quantile);
    const double predicted = p.ready ? p.quantile_us : 0.0;
    const double cost = fill.item_cost_us;
    switch (fill.mode) {
      case kModeFreeRide: {
        const uint64_t per_step =
            static_cast<uint64_t>(std::floor(kFreeRideStep / cost)) * static_cast<uint64_t>(spec_.sm_count);
        const double pad = fill.mode == kModeFreeRide && knob ? fill.knob : kFreeRideMargin;
        for (int k = 0; per_step > 0 && k * kFreeRideStep + pad * kFreeRideStep <= predicted; ++k) {
          ENGINE_PF(pfSimLaunchOpaque(st.peer, st.naive_next, per_step, spec_.sm_count, cost,
                                      &ItemSink::on_item, &st.nominal_sink));
          st.naive_next += per_step;
        }
        return {};
      }
      case kModeTally: {
        pfSliceDesc_t slice{};
        slice.bubble_id = ++st.tally_epoch;
        slice.max_items = uint64_t{1} << 40;
        slice.total_items = uint64_t{1} << 40;
        const int blocks = knob ? std::clamp(static_cast<int>(std::lround(fill.knob * spec_.sm_count)), 1,
                                             spec_.sm_count)
                                : spec_.sm_count;
        slice.max_blocks = blocks;
        slice.gate = &st.tally_flag;
        slice.cursor = &st.tally_cursor;
        slice.budget_counter = &st.tally_budget;
        st.tally_budget = 0;  // read in virtual time; the last bubble's kernel has ended
        ENGINE_PF(pfSimLaunchTicketKernel(st.peer, &slice, blocks, cost / kTallySpeedFactor,
                                          &ItemSink::on_item, &st.tally_sink));
        return {};
      }
      case kModePaper: {
        const double budget = predicted * (1.0 - fill.margin_fraction) - fill.margin_us;
        const int blocks = spec_.sm_count - spec_.comm_sms;  // the SMs free during the bubble
        const uint64_t items = budget > 0 ? static_cast<uint64_t>(std::floor(budget / cost)) *
                                                static_cast<uint64_t>(blocks)
                                          : 0;
        if (items > 0)
          ENGINE_PF(pfSimLaunchOpaque(st.peer, st.naive_next, items, blocks, cost,
                                      &ItemSink::on_item, &st.nominal_sink));
        st.naive_next += items;
        return {};
      }
      default:
        return Status{pfErrorInvalidArgument,
                      fmt::format("peer fill: mode {} is not FreeRide, Tally or paper-style", fill.mode)};
    }
  }

  Status peer_bubble_end(int stage) override {
    StageState& st = *stages_[static_cast<size_t>(stage)];
    if (st.tally_epoch == 0) return {};
    // Tally's retreat flag, written in stream order at the bubble's end.
    ENGINE_PF(sim_->write_word(st.main, &st.tally_flag, st.tally_epoch));
    return {};
  }

  bool item_observer(int stage, ItemCallback* fn, void** user) override {
    if (stage < 0 || stage >= static_cast<int>(stages_.size())) return false;
    *fn = &ItemSink::on_item_runtime;
    *user = &stages_[static_cast<size_t>(stage)]->nominal_sink;
    return true;
  }

  void set_fill_item_cost(double item_cost_us) override { item_cost_us_ = item_cost_us; }

  FillAccounting take_fill_accounting() override {
    FillAccounting out;
    std::swap(out, accounting_);
    return out;
  }

  Status detach(int stage, pfRuntime_t runtime) override {
    StageState& st = *stages_[static_cast<size_t>(stage)];
    notices_.detach(stage);
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
    for (auto& stage : stages_) {
      StageState& st = *stage;
      for (void* s : {st.naive, st.peer})
        if (s) pfSimStreamDestroy(s);
      for (pfSimEvent_t e : {st.recv_done, st.begin, st.end, st.arrive, st.naive_start})
        if (e) pfSimEventDestroy(e);
      for (const ResumeProbe& probe : st.probes) {
        for (pfSimEvent_t e : {probe.bubble_begin, probe.bubble_end, probe.kernel_end})
          if (e) pfSimEventDestroy(e);
      }
    }
    for (auto& [key, event] : messages_) pfSimEventDestroy(event);
    messages_.clear();
    notices_.close();
    stages_.clear();
    pfSimWorldDestroy(world_);
    world_ = nullptr;
    sim_ = nullptr;
  }

 private:
  // pipefill's simulated device: priorities -5 (highest) .. 0 (lowest), like CUDA on H100.
  static constexpr int kSimHighestPriority = -5;
  static constexpr int kSimLowestPriority = 0;
  // engine::FillMode values of the peers (engine.hpp; the transport does not include it).
  static constexpr int kModeFreeRide = 3, kModeTally = 4, kModePaper = 5;
  static constexpr double kPeerQuantile = 0.1;  // the runtime's default prediction_quantile
  static constexpr double kFreeRideStep = 100.0, kFreeRideMargin = 1.2, kTallySpeedFactor = 0.9;

  struct ResumeProbe {
    pfSimEvent_t bubble_begin = nullptr;
    pfSimEvent_t bubble_end = nullptr;
    pfSimEvent_t kernel_end = nullptr;
    double kernel_us = 0.0;
    int bubble_index = -1;
    bool ends_in_receive = false;  // the bubble waits for a p2p receive (not the collective)
  };

  struct StageState;
  // Where a completed fill item is reported: its completion time on the stage's device, and how
  // long it ran per unit of nominal cost (Tally's transformed items run 1 / 0.9 as long).
  struct ItemSink {
    SimTransport* transport = nullptr;
    StageState* stage = nullptr;
    double duration_factor = 1.0;
    static void on_item(void* user, uint64_t) {
      auto* self = static_cast<ItemSink*>(user);
      self->record();
      self->transport->baseline_items_.fetch_add(1, std::memory_order_relaxed);
    }
    static void on_item_runtime(void* user, uint64_t) { static_cast<ItemSink*>(user)->record(); }
    void record() {
      double now = 0.0;
      pfSimNow(transport->world_, &now);
      stage->items.emplace_back(now - transport->item_cost_us_ * duration_factor, now);
    }
  };

  struct StageState {
    int index = 0;
    void* main = nullptr;
    void* comm = nullptr;
    void* naive = nullptr;
    void* peer = nullptr;  // the peers' low-priority fill stream
    pfSimEvent_t recv_done = nullptr, begin = nullptr, end = nullptr, arrive = nullptr;
    pfSimEvent_t naive_start = nullptr;
    bool posted_receive = false;  // the last communication posted was a p2p receive
    uint64_t naive_next = 0;
    std::vector<ResumeProbe> probes;  // one per bubble of the iteration
    size_t probes_used = 0;
    size_t begins_used = 0;
    bool probe_pending = false;  // a bubble ended; the next kernel closes the probe
    // Tally's retreat flag and claim words (plain memory the simulated kernel reads).
    uint64_t tally_flag = 0, tally_cursor = 0, tally_budget = 0, tally_epoch = 0;
    pipefill::BubblePredictor predictor;  // the runtime's: min 2 samples, window 64
    std::vector<std::pair<double, double>> items;  // this iteration's fill items: (start, end)
    size_t activity_cursor = 0;  // device log records already read
    ItemSink nominal_sink, tally_sink;
  };

  static std::string class_key(int bubble_index) { return fmt::format("b{}", bubble_index); }

  // After the iteration ran: the resume delays of its bubbles (kernel start = its end - its
  // duration: exact without jitter and interference); feeds the peers' predictor with its
  // measured bubbles and, when counted, adds its fill item work inside bubbles (nominal cost: a
  // slowed item counts as the work it did), all fill work, and bubble end -> first and last
  // block of the next main kernel.
  Status account(StageState& st, bool counted) {
    std::vector<double> bubble_ends(st.probes_used), kernel_ends(st.probes_used);
    for (size_t i = 0; i < st.probes_used; ++i) {
      ENGINE_PF(pfSimEventTime(st.probes[i].bubble_end, &bubble_ends[i]));
      ENGINE_PF(pfSimEventTime(st.probes[i].kernel_end, &kernel_ends[i]));
      resume_delays_.push_back(kernel_ends[i] - st.probes[i].kernel_us - bubble_ends[i]);
    }
    std::vector<std::pair<double, double>> spans(std::min(st.begins_used, st.probes_used));
    for (size_t i = 0; i < spans.size(); ++i) {  // (begin, end) per bubble
      ENGINE_PF(pfSimEventTime(st.probes[i].bubble_begin, &spans[i].first));
      spans[i].second = bubble_ends[i];
      st.predictor.add_sample(class_key(st.probes[i].bubble_index), spans[i].second - spans[i].first);
    }
    std::vector<pipefill::ActivityRecord> log;
    st.activity_cursor = sim_->activities_since(st.index, st.activity_cursor, &log);
    if (counted) {
      // A receive's bytes move during the last (p2p time - latency) of its bubble, and fill
      // beside them stretches that transfer (gamma, for as long as it runs there). What is left
      // is the most a fill can use with no slowdown.
      const double transfer = costs_.p2p_us - receive_latency_us(spec_, costs_);
      for (size_t i = 0; i < spans.size(); ++i) {
        const double length = spans[i].second - spans[i].first;
        accounting_.bubble_us += length;
        accounting_.transfer_free_us +=
            st.probes[i].ends_in_receive ? length - std::min(length, transfer) : length;
      }
      // Bubbles are in order and do not overlap; items, sorted by start, are swept across them.
      std::sort(st.items.begin(), st.items.end());
      size_t first = 0;
      for (const auto& [start, end] : st.items) {
        accounting_.item_work_sm_us += item_cost_us_;
        while (first < spans.size() && spans[first].second <= start) ++first;
        for (size_t b = first; b < spans.size() && spans[b].first < end; ++b) {
          const double overlap = std::min(end, spans[b].second) - std::max(start, spans[b].first);
          if (overlap > 0) accounting_.filled_sm_us += overlap * item_cost_us_ / (end - start);
        }
      }
      // The main kernel after each bubble: the log record that ends when its probe fired.
      for (size_t i = 0; i < st.probes_used; ++i) {
        for (const auto& r : log) {
          if (r.kind == pipefill::ActivityKind::Kernel && r.end_us == kernel_ends[i] &&
              r.start_us >= bubble_ends[i] - 1e-9) {
            accounting_.first_block_delays_us.push_back(r.start_us - bubble_ends[i]);
            accounting_.all_blocks_delays_us.push_back(std::max(r.start_us, r.all_blocks_started_us) -
                                                       bubble_ends[i]);
            break;
          }
        }
      }
    }
    st.items.clear();
    return {};
  }

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
  PipelineSpec spec_;
  StageCosts costs_;
  TransportOptions options_;
  pfSimWorld_t world_ = nullptr;
  pipefill::sim::World* sim_ = nullptr;
  std::vector<std::unique_ptr<StageState>> stages_;  // stable addresses: the item sinks point in
  std::unordered_map<uint64_t, pfSimEvent_t> messages_;
  SenderNotices notices_;  // EngineOptions::notice_lead_us
  std::atomic<uint64_t> baseline_items_{0};  // items of fill the transport launched itself
  std::vector<double> resume_delays_;
  double item_cost_us_ = 0.0;
  int iteration_ = 0;
  FillAccounting accounting_;
};

}  // namespace

std::unique_ptr<Transport> make_sim_transport() { return std::make_unique<SimTransport>(); }

}  // namespace engine
