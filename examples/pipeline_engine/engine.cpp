#include "engine.hpp"
#include "stage_stats.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace engine {

// fill_jobs calls report through fjGetLastErrorMessage, not pfGetLastErrorMessage.
#define ENGINE_PF_FJ(call)                                                                  \
do {                                                                                      \
  const pfResult_t fj_result_ = (call);                                                   \
  if (fj_result_ != pfSuccess)                                                            \
    return Status{fj_result_, fmt::format("{} failed: {}: {}", #call,                     \
                                          pfGetErrorString(fj_result_),                   \
                                          fjGetLastErrorMessage())};                      \
} while (0)

const char* fill_mode_name(FillMode mode) {
  switch (mode) {
    case FillMode::None: return "no fill";
    case FillMode::PipeFill: return "PipeFill";
    case FillMode::Naive: return "naive";
    case FillMode::FreeRide: return "FreeRide-style";
    case FillMode::Tally: return "Tally-style";
    case FillMode::PaperStyle: return "PipeFill-paper";
  }
  return "?";
}

bool parse_fill_mode(const std::string& name, FillMode* out) {
  static const std::pair<const char*, FillMode> kModes[] = {
      {"none", FillMode::None},         {"pipefill", FillMode::PipeFill},
      {"naive", FillMode::Naive},       {"freeride", FillMode::FreeRide},
      {"tally", FillMode::Tally},       {"paper", FillMode::PaperStyle}};
  for (const auto& [text, mode] : kModes) {
    if (name == text) {
      *out = mode;
      return true;
    }
  }
  return false;
}

namespace {
bool is_peer(FillMode mode) {
  return mode == FillMode::FreeRide || mode == FillMode::Tally || mode == FillMode::PaperStyle;
}
// The transport sees modes as ints (transport.hpp); keep the numbering it relies on.
static_assert(static_cast<int>(FillMode::FreeRide) == 3 && static_cast<int>(FillMode::Tally) == 4 &&
              static_cast<int>(FillMode::PaperStyle) == 5);
}  // namespace

double engine_margin_us(const EngineOptions& options, const StageCosts& costs) {
  if (options.margin_us >= 0) return options.margin_us;
  // On the host transport a receive is a wait that fill items do not slow (no bytes move on the
  // SMs): the runtime's own default margin (-1: left unset, PIPEFILL_SAFETY_MARGIN_US applies).
  if (options.transport == "host") return -1.0;
  // The receive's p2p time (latency + bytes / bandwidth) ends the bubble. The transfer's speed
  // is set by the fill load when the peer sends (the simulated device, docs/simulated-device.md:
  // when its record completes, before the latency), so fill stops before the message is sent.
  return std::max(20.0, costs.p2p_us);
}

std::vector<double> engine_class_margins_us(const EngineOptions& options, const StageCosts& costs,
                                            const std::vector<Instruction>& program) {
  const std::vector<bool> collective = bubbles_ending_in_collective(program);
  std::vector<double> out(collective.size(), -1.0);
  if (!options.class_margins || options.margin_us >= 0 || options.transport == "host" ||
      options.pipeline.model.allreduce_us > 0 || engine_margin_us(options, costs) < 0)
    return out;
  for (size_t b = 0; b < collective.size(); ++b)
    if (collective[b]) out[b] = 0.0;
  return out;
}

int parse_fill_kind(const std::string& name) {
  if (name == "none") return -1;
  if (name == "mlp") return fjMlpInference;
  if (name == "encoder") return fjEncoderInference;
  if (name == "train") return fjTraining;
  return -2;
}

Status choose_transport(const EngineOptions& options, std::unique_ptr<Transport>* out) {
  const std::string& t = options.transport;
  std::string why;
  if (t == "sim") {
    *out = make_sim_transport();
    return {};
  }
  if (t == "emulated") {
    *out = make_emulated_transport(&why);
    if (!*out) return Status{pfErrorNoDevice, "--transport emulated: " + why};
    return {};
  }
  if (t == "host") {
    *out = make_host_transport();
    return {};
  }
  if (t == "nccl") {
    *out = make_nccl_transport(options.pipeline.stages, &why);
    if (!*out) return Status{pfErrorNoDevice, "--transport nccl: " + why};
    return {};
  }
  if (t == "auto") {
    if (needs_sim_transport(options.pipeline)) {  // see Engine::setup
      *out = make_sim_transport();
      return {};
    }
    const int gpus = cuda_gpu_count();
    if (gpus >= options.pipeline.stages && options.pipeline.stages > 1) {
      *out = make_nccl_transport(options.pipeline.stages, &why);
      if (*out) return {};
    }
    if (gpus >= 1) {
      *out = make_emulated_transport(&why);
      if (*out) return {};
    }
    *out = make_sim_transport();
    return {};
  }
  return Status{pfErrorInvalidArgument,
                fmt::format("--transport must be sim, emulated, nccl, host or auto, got '{}'", t)};
}

namespace {

struct Stage {
  int index = 0;
  pfRuntime_t runtime = nullptr;
  fjJob_t fill = nullptr;
  pfJob_t job = nullptr;
  double item_cost_us = 0.0;
  double margin_us = 0.0, margin_fraction = 0.0;  // the runtime's resolved safety margins
  std::vector<double> class_margins_us;  // per bubble index (engine_class_margins_us)
  pfStats_t stats_before{};
  StageSnapshot counted_from;  // at the start of the first counted iteration
};

class Engine {
 public:
  Engine(const EngineOptions& options, FillMode mode, Transport& transport)
      : options_(options), mode_(mode), transport_(transport) {}

  ~Engine() { teardown(); }

  Status setup() {
    std::string error;
    if (!build_programs(options_.pipeline, &programs_, &error))
      return Status{pfErrorInvalidArgument, error};
    costs_ = derive_costs(options_.pipeline);
    if (needs_sim_transport(options_.pipeline) && transport_.backend() != pfBackendSim)
      return Status{pfErrorNotSupported,
                    fmt::format("the {} transport runs gpipe, 1f1b, interleaved and looped-bfs; {} needs "
                                "--transport sim (its BackwardInput/BackwardWeight instructions or its "
                                "non-looped chunk placement are not executed by the CUDA transports yet)",
                                transport_.name(), pipefill::schedule::schedule_kind_name(options_.pipeline.kind))};
    TransportOptions topts;
    topts.seed = options_.seed;
    topts.jitter = options_.jitter;
    topts.interference = options_.interference;
    topts.fill_slowdown = options_.fill_slowdown;
    topts.comm_slowdown = options_.comm_slowdown;
    // Only PipeFill keeps SMs for the main job; the baselines reserve none (their papers don't).
    topts.reserve_sms = mode_ == FillMode::None || mode_ == FillMode::PipeFill;
    topts.warm_iterations = options_.warm_iterations;
    if (options_.notice_lead_us >= 0 && mode_ == FillMode::PipeFill) {
      if (transport_.backend() != pfBackendSim)
        return Status{pfErrorNotSupported,
                      fmt::format("--notice-lead runs on --transport sim only (the {} transport "
                                  "has no sender notice)",
                                  transport_.name())};
      topts.notice_lead_us = options_.notice_lead_us;
    }
    if (is_peer(mode_) && transport_.backend() != pfBackendSim)
      return Status{pfErrorNotSupported,
                    fmt::format("the {} baseline runs on --transport sim only (the {} transport has "
                                "no FreeRide/Tally/paper-style fill)",
                                fill_mode_name(mode_), transport_.name())};
    ENGINE_TRY(transport_.open(options_.pipeline, costs_, programs_, topts));
    opened_ = true;

    const int kind = parse_fill_kind(options_.fill);
    if (kind == -2)
      return Status{pfErrorInvalidArgument,
                    fmt::format("--fill must be none, mlp, encoder or train, got '{}'",
                                options_.fill)};
    const int first = transport_.first_local_stage();
    for (int s = first; s < first + transport_.local_stages(); ++s) {
      Stage st;
      st.index = s;
      pfConfig_t config = PF_CONFIG_INITIALIZER;
      config.stage_id = s;
      config.stage_count = options_.pipeline.stages;
      const double margin = engine_margin_us(options_, costs_);
      if (margin >= 0) config.safety_margin_us = margin;
      config.safety_margin_fraction = options_.margin_fraction;
      if (mode_ == FillMode::PipeFill && options_.mode_knob > 0)
        config.gated_prediction_quantile = options_.mode_knob;
      transport_.configure_runtime(s, &config);
      ENGINE_PF(pfRuntimeCreate(&config, &st.runtime));
      pfConfig_t resolved = PF_CONFIG_INITIALIZER;
      const pfResult_t got = pfRuntimeGetConfig(st.runtime, &resolved);
      if (got == pfSuccess) {
        st.margin_us = resolved.safety_margin_us;
        st.margin_fraction = resolved.safety_margin_fraction;
      }
      st.class_margins_us =
          engine_class_margins_us(options_, costs_, programs_.stages[static_cast<size_t>(s)]);
      stages_.push_back(st);
      if (got != pfSuccess) return pf_status(got, "pfRuntimeGetConfig");
      for (size_t b = 0; b < st.class_margins_us.size(); ++b)
        if (st.class_margins_us[b] >= 0)
          ENGINE_PF(pfRuntimeSetClassMargin(st.runtime, fmt::format("#{}", b).c_str(),
                                            st.class_margins_us[b]));
      ENGINE_TRY(transport_.attach(s, stages_.back().runtime));
      if (kind >= 0 && mode_ != FillMode::None) ENGINE_TRY(create_fill_job(stages_.back(), kind));
    }
    return {};
  }

  Status run(RunResult* result) {
    result->transport = transport_.name();
    result->mode = mode_;
    for (Stage& st : stages_) {
      if (st.fill && options_.fill == "train")
        fjJobEvaluationLoss(st.fill, &eval_before_[st.index]);
    }
    // Per-stage statistics count the iterations from warm_iterations on (all when there are
    // not that many).
    const int counted = options_.warm_iterations < options_.iterations ? options_.warm_iterations : 0;
    for (int it = 0; it < options_.iterations; ++it) {
      for (Stage& st : stages_) ENGINE_PF(pfRuntimeGetStats(st.runtime, &st.stats_before));
      if (it == counted)
        for (Stage& st : stages_) ENGINE_TRY(take_stage_snapshot(st.runtime, &st.counted_from));
      const uint64_t naive_before = transport_.naive_items_done();
      for (Stage& st : stages_) ENGINE_TRY(transport_.begin_iteration(st.index));
      if (transport_.single_thread()) {
        ENGINE_TRY(run_global_order());
      } else {
        ENGINE_TRY(run_threads());
      }
      for (Stage& st : stages_) {
        ENGINE_TRY(transport_.end_iteration(st.index));
        ENGINE_PF(pfIterationEnd(st.runtime));
      }
      IterationTiming timing;
      ENGINE_TRY(transport_.finish_iteration(&timing));
      IterationResult r;
      r.time_us = timing.end_us - timing.start_us;
      for (Stage& st : stages_) {
        // Outside any bubble: harvests every bubble and slice of the iteration.
        ENGINE_PF(pfRuntimeSynchronize(st.runtime));
        pfStats_t now{};
        ENGINE_PF(pfRuntimeGetStats(st.runtime, &now));
        pfResult_t async_error = pfSuccess;
        ENGINE_PF(pfRuntimeGetAsyncError(st.runtime, &async_error));
        if (async_error != pfSuccess)
          return Status{async_error, fmt::format("stage {}: asynchronous runtime error: {}",
                                                 st.index, pfGetErrorString(async_error))};
        r.bubble_us += now.bubble_time_us - st.stats_before.bubble_time_us;
        r.filled_us += now.filled_time_us - st.stats_before.filled_time_us;
        r.overrun_us += now.overrun_time_us - st.stats_before.overrun_time_us;
        r.items += now.items_completed - st.stats_before.items_completed;
        r.bubbles += now.bubbles - st.stats_before.bubbles;
        r.bubbles_filled += now.bubbles_filled - st.stats_before.bubbles_filled;
        result->max_overrun_us = std::max(result->max_overrun_us, now.max_overrun_us);
        result->host_begin_end_ns = now.host_begin_end_ns;
      }
      if (mode_ != FillMode::PipeFill && mode_ != FillMode::None)
        r.items = transport_.naive_items_done() - naive_before;
      for (double d : transport_.take_resume_delays_us()) result->resume_delays_us.push_back(d);
      result->iterations.push_back(r);
    }
    result->naive_items = transport_.naive_items_done();
    Transport::FillAccounting accounting = transport_.take_fill_accounting();
    result->filled_sm_us = accounting.filled_sm_us;
    result->bubble_us = accounting.bubble_us;
    result->item_work_sm_us = accounting.item_work_sm_us;
    result->transfer_free_us = accounting.transfer_free_us;
    result->first_block_delays_us = std::move(accounting.first_block_delays_us);
    result->all_blocks_delays_us = std::move(accounting.all_blocks_delays_us);
    if (!stages_.empty()) result->item_cost_us = stages_.front().item_cost_us;
    for (Stage& st : stages_) {
      StageFillSummary summary;
      StageSnapshot now;
      ENGINE_TRY(take_stage_snapshot(st.runtime, &now));
      summarize_stage(st.counted_from, now, &summary);
      if (st.job) {
        pfJobInfo_t info{};
        ENGINE_PF(pfJobGetStatus(st.job, &info));
        summary.items_completed = info.items_completed;
        summary.job_status = info.status;
        pfJobCostInfo_t cost{};
        cost.size = sizeof(cost);
        ENGINE_PF(pfJobGetCostInfo(st.job, &cost));
        summary.learned_cost_us = cost.learned_cost_us;
      }
      if (st.fill) {
        ENGINE_PF_FJ(fjJobGetProgress(st.fill, &summary.progress));
        if (options_.fill == "train") {
          summary.eval_loss_before = eval_before_[st.index];
          ENGINE_PF_FJ(fjJobEvaluationLoss(st.fill, &summary.eval_loss_after));
        }
      }
      result->stages.push_back(summary);
    }
    if (!options_.trace_prefix.empty()) {
      for (Stage& st : stages_) {
        const std::string path = fmt::format("{}.stage{}.json", options_.trace_prefix, st.index);
        ENGINE_PF(pfTraceWrite(st.runtime, path.c_str()));
      }
    }
    return {};
  }

  Status teardown() {
    Status first;
    auto keep = [&](Status s) {
      if (first.ok() && !s.ok()) first = std::move(s);
    };
    for (Stage& st : stages_) {
      if (st.job) {
        const pfResult_t r = pfJobDestroy(st.job);
        if (r != pfSuccess) keep(pf_status(r, "pfJobDestroy"));
        st.job = nullptr;
      }
      if (st.fill) {
        fjJobDestroy(st.fill);
        st.fill = nullptr;
      }
      if (st.runtime) {
        keep(transport_.detach(st.index, st.runtime));
        const pfResult_t r = pfRuntimeDestroy(st.runtime);
        if (r != pfSuccess) keep(pf_status(r, "pfRuntimeDestroy"));
        st.runtime = nullptr;
      }
    }
    stages_.clear();
    if (opened_) {
      transport_.close();
      opened_ = false;
    }
    return first;
  }

 private:
  Status create_fill_job(Stage& st, int kind) {
    fjParams_t p;
    ENGINE_PF_FJ(fjParamsInit(&p, kind, transport_.backend()));
    if (options_.fill_items > 0) p.items = options_.fill_items;
    if (options_.fill_execution >= 0) p.execution = options_.fill_execution;
    if (options_.fill_item_cost_us > 0) p.item_cost_us = options_.fill_item_cost_us;
    p.seed = options_.seed * 1000 + static_cast<uint64_t>(st.index);  // a job per GPU
    p.keep_every = options_.keep_every;
    Transport::ItemCallback observe = nullptr;
    void* observe_user = nullptr;
    if (transport_.item_observer(st.index, &observe, &observe_user)) {
      p.on_item = observe;
      p.on_item_user = observe_user;
    }
    ENGINE_PF_FJ(fjJobCreate(&p, &st.fill));
    ENGINE_PF_FJ(fjJobItemCost(st.fill, &st.item_cost_us));
    transport_.set_fill_item_cost(st.item_cost_us);
    if (mode_ == FillMode::PipeFill) {
      pfJobDesc_t desc;
      ENGINE_PF_FJ(fjJobGetDesc(st.fill, &desc));
      transport_.wrap_job_desc(st.index, &desc);
      ENGINE_PF(pfJobCreate(st.runtime, &desc, &st.job));
    }
    return {};
  }

  Stage* stage(int index) {
    for (Stage& st : stages_)
      if (st.index == index) return &st;
    return nullptr;
  }

  // The one code path every transport shares: bubble instructions go to PipeFill, the rest to
  // the transport.
  Status step(Stage& st, const Instruction& in) {
    void* stream = transport_.main_stream(st.index);
    switch (in.type) {
      case InstrType::BubbleBegin: {
        pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
        hint.kind = in.bubble_kind;
        if (options_.hint_durations) hint.expected_duration_us = in.expected_us;
        ENGINE_PF(pfBubbleBegin(st.runtime, stream, &hint));
        ENGINE_TRY(transport_.bubble_began(st.index, in.bubble_index));
        if (is_peer(mode_) && st.fill) {
          Transport::PeerFill fill;
          fill.mode = static_cast<int>(mode_);
          fill.bubble_index = in.bubble_index;
          fill.item_cost_us = st.item_cost_us;
          const size_t b = static_cast<size_t>(std::max(0, in.bubble_index));
          fill.margin_us = b < st.class_margins_us.size() && st.class_margins_us[b] >= 0
                               ? st.class_margins_us[b]
                               : st.margin_us;
          fill.margin_fraction = st.margin_fraction;
          fill.knob = options_.mode_knob;
          ENGINE_TRY(transport_.peer_fill(st.index, fill));
        }
        if (mode_ == FillMode::Naive && st.fill) {
          // Naive: as many items as the schedule's expected bubble holds on every SM, ungated.
          const double share = options_.mode_knob > 0 ? options_.mode_knob : 1.0;
          const uint64_t items = static_cast<uint64_t>(
              std::floor(share * in.expected_us / st.item_cost_us) * options_.pipeline.sm_count);
          ENGINE_TRY(transport_.naive_fill(st.index, items, st.item_cost_us));
        }
        return {};
      }
      case InstrType::BubbleEnd:
        ENGINE_PF(pfBubbleEnd(st.runtime, stream));
        if (mode_ == FillMode::Tally) ENGINE_TRY(transport_.peer_bubble_end(st.index));
        return transport_.bubble_ended(st.index);
      default:
        return transport_.execute(st.index, in);
    }
  }

  // Single-thread transports: advance every stage as far as its dependencies allow, so every
  // message's send is enqueued before its receive and every stage arrives at a collective
  // before any stage enqueues its wait on it.
  Status run_global_order() {
    const size_t n = stages_.size();
    std::vector<size_t> pc(n, 0);
    std::vector<bool> arrived(n, false);
    std::unordered_set<uint64_t> sent;
    size_t arrivals = 0;
    for (;;) {
      bool progress = false, done = true;
      for (size_t i = 0; i < n; ++i) {
        Stage& st = stages_[i];
        const auto& prog = programs_.stages[static_cast<size_t>(st.index)];
        while (pc[i] < prog.size()) {
          const Instruction& in = prog[pc[i]];
          if (in.type == InstrType::RecvActivation || in.type == InstrType::RecvGradient) {
            const bool gradient = in.type == InstrType::RecvGradient;
            if (!sent.count(message_key(gradient, in.microbatch, in.virtual_stage))) break;
          } else if (in.type == InstrType::ReduceGradients) {
            if (!arrived[i]) {
              ENGINE_TRY(transport_.arrive(st.index, in));
              arrived[i] = true;
              ++arrivals;
              progress = true;
            }
            if (arrivals < n) break;
          }
          ENGINE_TRY(step(st, in));
          if (in.type == InstrType::SendActivation || in.type == InstrType::SendGradient)
            sent.insert(message_key(in.type == InstrType::SendGradient, in.microbatch,
                                    in.virtual_stage));
          ++pc[i];
          progress = true;
        }
        if (pc[i] < prog.size()) done = false;
      }
      if (done) return {};
      if (!progress)
        return Status{pfErrorInternal, "the instruction lists deadlock (a receive without send)"};
    }
  }

  // Multi-thread transports: each local stage runs its own list on its own host thread.
  Status run_threads() {
    std::vector<Status> results(stages_.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < stages_.size(); ++i) {
      threads.emplace_back([this, i, &results] {
        Stage& st = stages_[i];
        for (const Instruction& in : programs_.stages[static_cast<size_t>(st.index)]) {
          if (in.type == InstrType::ReduceGradients) {
            Status a = transport_.arrive(st.index, in);
            if (!a.ok()) {
              results[i] = std::move(a);
              return;
            }
          }
          Status s = step(st, in);
          if (!s.ok()) {
            results[i] = std::move(s);
            return;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (Status& s : results)
      if (!s.ok()) return s;
    return {};
  }

  EngineOptions options_;
  FillMode mode_;
  Transport& transport_;
  Programs programs_;
  StageCosts costs_;
  bool opened_ = false;
  std::vector<Stage> stages_;
  std::unordered_map<int, double> eval_before_;
};

}  // namespace

Status run_engine(const EngineOptions& options, FillMode mode, RunResult* result) {
  std::unique_ptr<Transport> transport;
  ENGINE_TRY(choose_transport(options, &transport));
  return run_engine_on(*transport, options, mode, result);
}

Status run_engine_on(Transport& transport, const EngineOptions& options, FillMode mode,
                     RunResult* result) {
  Status status;
  {
    Engine engine(options, mode, transport);
    status = engine.setup();
    if (status.ok()) status = engine.run(result);
    Status down = engine.teardown();
    if (status.ok()) status = std::move(down);
  }
  return status;
}

}  // namespace engine
