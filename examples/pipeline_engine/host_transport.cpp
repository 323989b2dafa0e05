// The host transport (host_transport.hpp): the pipeline's stages on real-time host devices.
#include "host_transport.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>

namespace engine {
namespace {

// Bubbles per stage the timeline records (a run of 8 iterations of the default 1F1B has ~10 per
// iteration; later bubbles are simply not broken down).
constexpr size_t kTimelineCapacity = 1 << 14;

// The gated prediction quantile of the host transport's runtimes (configure_runtime).
constexpr double kHostGatedQuantile = 0.9;

// Messages and collective arrivals, shared by the stages' main-stream threads.
class Board {
 public:
  // A send of `key` in `iteration` completed at `time_us`.
  void post(uint64_t key, int iteration, double time_us) {
    std::lock_guard<std::mutex> lock(mu_);
    Post& p = posts_[key];
    p.iteration = iteration;
    p.time_us = time_us;
    cv_.notify_all();
  }
  // Stage arrival at the iteration's collective.
  void arrive(int iteration, double time_us) {
    std::lock_guard<std::mutex> lock(mu_);
    Arrivals& a = arrivals_[iteration];
    ++a.count;
    a.last_us = std::max(a.last_us, time_us);
    cv_.notify_all();
  }
  // Blocks until `key` was posted in `iteration`, then until `after_us` past the post (the
  // transfer); false when aborted.
  bool wait_message(uint64_t key, int iteration, double after_us, const HostTimeline& clock) {
    std::unique_lock<std::mutex> lock(mu_);
    double posted = 0;
    cv_.wait(lock, [&] {
      const auto it = posts_.find(key);
      if (it == posts_.end() || it->second.iteration < iteration) return aborted_;
      posted = it->second.time_us;
      return true;
    });
    if (aborted_) return false;
    return sleep_until(lock, posted + after_us, clock);
  }
  // Blocks until `stages` stages arrived in `iteration`, then `after_us` past the last arrival.
  bool wait_collective(int iteration, int stages, double after_us, const HostTimeline& clock) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return aborted_ || arrivals_[iteration].count >= stages; });
    if (aborted_) return false;
    return sleep_until(lock, arrivals_[iteration].last_us + after_us, clock);
  }
  void abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    posts_.clear();
    arrivals_.clear();
    aborted_ = false;
  }

 private:
  bool sleep_until(std::unique_lock<std::mutex>& lock, double until_us, const HostTimeline& clock) {
    const double left = until_us - clock.now_us();
    if (left > 0) {
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double, std::micro>(left));
      cv_.wait_until(lock, deadline, [&] { return aborted_; });
    }
    return !aborted_;
  }
  struct Post {
    int iteration = -1;
    double time_us = 0;
  };
  struct Arrivals {
    int count = 0;
    double last_us = 0;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  bool aborted_ = false;
  std::unordered_map<uint64_t, Post> posts_;
  std::map<int, Arrivals> arrivals_;
};

class HostTransport;

// What a host function on a main stream does.
struct HostOp {
  enum Kind { Mark, MarkBubble, Post, WaitMessage, Arrive, WaitCollective } kind = Mark;
  HostTransport* transport = nullptr;
  int stage = 0;
  int iteration = 0;
  uint64_t key = 0;
  double after_us = 0;
  std::atomic<double>* mark = nullptr;  // Mark / MarkBubble: where the time goes
  BubbleMoments* bubble = nullptr;      // MarkBubble: the bubble whose iteration is set too
};

struct StageState;

// The fill job's hooks of one stage (item observer, slice observer, wrapped launch).
struct StageHooks {
  HostTransport* transport = nullptr;
  int stage = 0;
  // The job's own callbacks and user data (the wrappers forward to them).
  pfResult_t (*setup)(void*, const pfArenaAllocator_t*, int) = nullptr;
  pfResult_t (*launch)(void*, const pfSliceDesc_t*, void*) = nullptr;
  void (*teardown)(void*) = nullptr;
  void* job_user = nullptr;
};

struct StageState {
  int index = 0;
  void* main = nullptr;
  pfRuntime_t runtime = nullptr;
  int iteration = -1;            // the iteration being enqueued (engine's stage thread)
  uint64_t begun = 0;            // bubbles begun (the runtime's ids are 1..begun)
  uint64_t pending_key = 0;      // the receive WaitComm waits for
  bool pending_collective = false;
  std::deque<HostOp> ops;        // host functions' arguments, cleared once the iteration ran
  std::atomic<double> start_us{-1}, end_us{-1};
  StageHooks hooks;
};

class HostTransport final : public HostTransportBase {
 public:
  ~HostTransport() override { close(); }

  std::string name() const override { return "host"; }
  pfBackend_t backend() const override { return pfBackendHost; }
  bool single_thread() const override { return false; }
  int local_stages() const override { return spec_.stages; }

  const HostTimeline* timeline() const override { return timeline_.get(); }
  uint64_t bubbles_begun(int stage) const override {
    return stages_[static_cast<size_t>(stage)]->begun;
  }

  Status open(const PipelineSpec& spec, const StageCosts& costs, const Programs&,
              const TransportOptions& options) override {
    spec_ = spec;
    costs_ = costs;
    options_ = options;
    board_.reset();
    timeline_ = std::make_unique<HostTimeline>(spec.stages, kTimelineCapacity);
    stages_.clear();
    for (int i = 0; i < spec.stages; ++i) {
      stages_.push_back(std::make_unique<StageState>());
      StageState& st = *stages_.back();
      st.index = i;
      st.hooks.transport = this;
      st.hooks.stage = i;
    }
    return {};
  }

  void configure_runtime(int, pfConfig_t* config) override {
    config->backend = pfBackendHost;
    config->reserved_sms = 0;  // the host device's main-job operations use no SM threads
    // Ticket slices are sized to a high quantile of the class's bubbles: on the host, bubbles
    // vary with the OS's scheduling, a slice's item budget sized to the median stops the blocks
    // early in every longer bubble, and the gate bounds a longer budget to one item of overrun
    // per block. PIPEFILL_GATED_QUANTILE still overrides it.
    if (std::getenv("PIPEFILL_GATED_QUANTILE") == nullptr)
      config->gated_prediction_quantile = kHostGatedQuantile;
  }

  Status attach(int stage, pfRuntime_t runtime) override {
    StageState& st = state(stage);
    st.runtime = runtime;
    ENGINE_PF(pfStreamCreateHighPriority(runtime, &st.main));
    ENGINE_PF(pfRuntimeSetSliceObserver(runtime, &on_slice, &st.hooks));
    return {};
  }

  void* main_stream(int stage) override { return state(stage).main; }

  Status begin_iteration(int stage) override {
    StageState& st = state(stage);
    ++st.iteration;
    return mark(st, &st.start_us);
  }

  Status arrive(int stage, const Instruction&) override {
    StageState& st = state(stage);
    HostOp& op = push(st, HostOp::Arrive);
    return host_func(st, op);
  }

  Status execute(int stage, const Instruction& in) override {
    StageState& st = state(stage);
    switch (in.type) {
      case InstrType::LoadMicrobatch:
        ENGINE_PF(pfHostStreamDelay(st.main, costs_.load_us));
        return {};
      case InstrType::Forward:
      case InstrType::Backward: {
        const double us = in.type == InstrType::Forward ? costs_.forward_layer_us
                                                        : costs_.backward_layer_us;
        ENGINE_PF(pfHostStreamDelay(st.main, us * costs_.layers_per_chunk));
        return {};
      }
      case InstrType::SendActivation:
      case InstrType::SendGradient: {
        HostOp& op = push(st, HostOp::Post);
        op.key = key_of(in);
        return host_func(st, op);
      }
      case InstrType::RecvActivation:
      case InstrType::RecvGradient:
        st.pending_key = key_of(in);
        st.pending_collective = false;
        return {};
      case InstrType::ReduceGradients:
        st.pending_collective = true;
        return {};
      case InstrType::WaitComm: {
        HostOp& op = push(st, st.pending_collective ? HostOp::WaitCollective : HostOp::WaitMessage);
        op.key = st.pending_key;
        op.after_us = st.pending_collective ? spec_.model.allreduce_us : costs_.p2p_us;
        return host_func(st, op);
      }
      case InstrType::OptimizerStep:
        ENGINE_PF(pfHostStreamDelay(st.main, costs_.optimizer_us));
        return {};
      default:
        break;
    }
    return Status{pfErrorNotSupported,
                  fmt::format("the host transport cannot execute {}", instr_name(in.type))};
  }

  Status end_iteration(int stage) override {
    StageState& st = state(stage);
    return mark(st, &st.end_us);
  }

  Status finish_iteration(IterationTiming* timing) override {
    IterationTiming t{1e300, -1e300};
    for (auto& stage : stages_) {
      StageState& st = *stage;
      ENGINE_PF(pfHostStreamSynchronize(st.main));
      st.ops.clear();  // every host function of the iteration has run
      t.start_us = std::min(t.start_us, st.start_us.load());
      t.end_us = std::max(t.end_us, st.end_us.load());
    }
    *timing = t;
    return {};
  }

  bool item_observer(int stage, ItemCallback* fn, void** user) override {
    *fn = &on_item;
    *user = &state(stage).hooks;
    return true;
  }

  void wrap_job_desc(int stage, pfJobDesc_t* desc) override {
    StageHooks& hooks = state(stage).hooks;
    hooks.setup = desc->setup;
    hooks.launch = desc->launch;
    hooks.teardown = desc->teardown;
    hooks.job_user = desc->user;
    desc->user = &hooks;
    desc->launch = &wrapped_launch;
    if (desc->setup != nullptr) desc->setup = &wrapped_setup;
    if (desc->teardown != nullptr) desc->teardown = &wrapped_teardown;
  }

  Status bubble_began(int stage, int bubble_index) override {
    StageState& st = state(stage);
    BubbleMoments* b = timeline_->at(stage, ++st.begun);
    if (b == nullptr) return {};
    b->index.store(bubble_index);
    HostOp& op = push(st, HostOp::MarkBubble);
    op.mark = &b->begin;
    op.bubble = b;
    return host_func(st, op);
  }

  Status bubble_ended(int stage) override {
    StageState& st = state(stage);
    BubbleMoments* b = timeline_->at(stage, st.begun);
    if (b == nullptr) return {};
    return mark(st, &b->end);
  }

  Status detach(int stage, pfRuntime_t runtime) override {
    StageState& st = state(stage);
    board_.abort();  // a failed run leaves no main stream blocked in a wait
    if (st.main != nullptr) {
      ENGINE_PF(pfHostStreamSynchronize(st.main));
      ENGINE_PF(pfStreamDestroy(runtime, st.main));
      st.main = nullptr;
    }
    // The runtime (destroyed next) stops calling the observer; its user data lives on with us.
    st.runtime = nullptr;
    return {};
  }

  void close() override { board_.abort(); }

  // Host functions (main-stream threads) and hooks (executor, fill-stream and SM threads).
  void run(HostOp& op) {
    switch (op.kind) {
      case HostOp::Mark:
        op.mark->store(timeline_->now_us());
        return;
      case HostOp::MarkBubble:
        op.bubble->iteration.store(op.iteration);
        op.mark->store(timeline_->now_us());
        return;
      case HostOp::Post:
        board_.post(op.key, op.iteration, timeline_->now_us());
        return;
      case HostOp::WaitMessage:
        board_.wait_message(op.key, op.iteration, op.after_us, *timeline_);
        return;
      case HostOp::Arrive:
        board_.arrive(op.iteration, timeline_->now_us());
        return;
      case HostOp::WaitCollective:
        board_.wait_collective(op.iteration, spec_.stages, op.after_us, *timeline_);
        return;
    }
  }
  HostTimeline& clock() { return *timeline_; }

 private:
  static void on_host_op(void* user) {
    HostOp& op = *static_cast<HostOp*>(user);
    op.transport->run(op);
  }
  static void on_item(void* user, uint64_t) {
    const StageHooks& hooks = *static_cast<const StageHooks*>(user);
    hooks.transport->clock().item_done(hooks.stage);
  }
  static void on_slice(void* user, const pfSliceEvent_t* event) {
    const StageHooks& hooks = *static_cast<const StageHooks*>(user);
    HostTimeline& clock = hooks.transport->clock();
    BubbleMoments* b = clock.at(hooks.stage, event->bubble_id);
    if (b == nullptr) return;
    if (event->phase == pfSliceStart) {
      clock.set_running(hooks.stage, event->bubble_id);
      b->started.store(clock.now_us());
    } else {
      b->stopped.store(clock.now_us());
    }
  }
  static pfResult_t wrapped_launch(void* user, const pfSliceDesc_t* slice, void* stream) {
    const StageHooks& hooks = *static_cast<const StageHooks*>(user);
    if (slice->max_items > 0) {
      HostTimeline& clock = hooks.transport->clock();
      BubbleMoments* b = clock.at(hooks.stage, slice->bubble_id);
      if (b != nullptr) b->launched.store(clock.now_us());
    }
    return hooks.launch(hooks.job_user, slice, stream);
  }
  static pfResult_t wrapped_setup(void* user, const pfArenaAllocator_t* allocator, int config) {
    const StageHooks& hooks = *static_cast<const StageHooks*>(user);
    return hooks.setup(hooks.job_user, allocator, config);
  }
  static void wrapped_teardown(void* user) {
    const StageHooks& hooks = *static_cast<const StageHooks*>(user);
    hooks.teardown(hooks.job_user);
  }

  StageState& state(int stage) { return *stages_[static_cast<size_t>(stage)]; }

  HostOp& push(StageState& st, HostOp::Kind kind) {
    HostOp& op = st.ops.emplace_back();
    op.kind = kind;
    op.transport = this;
    op.stage = st.index;
    op.iteration = st.iteration;
    return op;
  }
  Status host_func(StageState& st, HostOp& op) {
    ENGINE_PF(pfHostLaunchHostFunc(st.main, &on_host_op, &op));
    return {};
  }
  Status mark(StageState& st, std::atomic<double>* where) {
    HostOp& op = push(st, HostOp::Mark);
    op.mark = where;
    return host_func(st, op);
  }
  static uint64_t key_of(const Instruction& in) {
    const bool gradient = in.type == InstrType::SendGradient || in.type == InstrType::RecvGradient;
    return message_key(gradient, in.microbatch, in.virtual_stage);
  }

  PipelineSpec spec_;
  StageCosts costs_;
  TransportOptions options_;
  Board board_;
  std::unique_ptr<HostTimeline> timeline_;
  std::vector<std::unique_ptr<StageState>> stages_;
};

}  // namespace

std::unique_ptr<HostTransportBase> make_host_transport_concrete() {
  return std::make_unique<HostTransport>();
}

std::unique_ptr<Transport> make_host_transport() { return make_host_transport_concrete(); }

}  // namespace engine
