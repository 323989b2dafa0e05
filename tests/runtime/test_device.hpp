// A Device for tests: the simulated device of a world, wrapped so a test can inject what a real
// GPU does to the runtime - a device call failing, a stream being captured into a CUDA graph, an
// executor that is late (a latch in the executor's path), a device whose clock is not driven by
// the caller (the executor thread then runs truly asynchronously against the world).
#pragma once

#include <algorithm>
#include <atomic>
#include <map>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "core/config.hpp"
#include "core/runtime.hpp"
#include "core/handles.hpp"
#include "device/device.hpp"
#include "runtime/fixtures.hpp"

namespace pipefill::testing {

// Blocks a thread at a chosen point until the test opens it.
class Latch {
 public:
  void arm() {
    std::lock_guard lock(mutex_);
    armed_ = true;
    open_ = false;
    reached_ = false;
  }
  // Called on the instrumented path: blocks while armed and not opened (once).
  void pass() {
    std::unique_lock lock(mutex_);
    if (!armed_) return;
    armed_ = false;
    reached_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void wait_reached() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return reached_; });
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool armed_ = false, open_ = true, reached_ = false;
};

// Graph items of the inner device, reporting the SMs a test chose (TestDevice::graph_sms_used).
class TestGraphItems final : public GraphItems {
 public:
  TestGraphItems(std::unique_ptr<GraphItems> inner, int sms) : inner(std::move(inner)), sms(sms) {}
  int sms_used() const override { return sms; }
  std::unique_ptr<GraphItems> inner;
  int sms;
};

class TestDevice final : public Device {
 public:
  explicit TestDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}

  // ---- knobs ------------------------------------------------------------------------------
  bool hide_driven_clock = false;       // the runtime then uses the executor thread
  bool single_queue = false;            // reports one hardware queue (auto launch -> inline)
  std::atomic<int> fail_copy_word{0};   // the next N copy_word_to_host calls fail
  std::atomic<int> fail_slice_end_record{0};  // the next N records on the fill stream after a copy
  std::atomic<int> copies{0};           // copy_word_to_host calls so far
  // > 0: every wait the runtime enqueues on a fill stream is followed by a delay of this many µs
  // on that stream, so a slice starts that much after its bubble began - what one hardware queue
  // shared with the main stream does to a slice enqueued behind the main stream's wait.
  std::atomic<double> fill_wait_delay_us{0.0};
  Latch query_latch;                    // armed: the next query_event blocks until opened
  mutable std::mutex capture_mutex;
  std::set<Stream> capturing;           // streams "being captured into a CUDA graph"
  int graph_sms_used = -1;              // >= 0: graph items report this many SMs (0: unknown)
  // Stream identities as CUDA's cuStreamGetId reports them: a test changes one between a bubble's
  // begin and end to model the stream destroyed with its bubble open and its handle reused (no
  // entry: identity 0, not tracked). Streams in refused_main_streams are refused at begin.
  mutable std::mutex identity_mutex;
  std::map<Stream, uint64_t> stream_identity;
  std::set<Stream> refused_main_streams;
  // Launch-callback contexts entered and left, and the calling thread's depth of them.
  std::atomic<int> launch_contexts_entered{0};
  std::atomic<int> launch_contexts_left{0};
  static int& launch_context_depth() {
    thread_local int depth = 0;
    return depth;
  }
  Stream fill_stream = nullptr;         // the first fill stream
  std::vector<Stream> fill_streams;     // every fill stream, in creation order (set at creation)
  bool is_fill(Stream stream) const {
    return std::find(fill_streams.begin(), fill_streams.end(), stream) != fill_streams.end();
  }

  // Stream operations the runtime enqueued (event records and waits, word writes and copies),
  // per stream: the simulator's activity log has no record for those.
  size_t operations_on(Stream stream) {
    std::lock_guard lock(count_mutex_);
    const auto it = operations_.find(stream);
    return it == operations_.end() ? 0 : it->second;
  }
  // Summed over every fill stream.
  size_t operations_on_fill_streams() {
    size_t total = 0;
    for (Stream s : fill_streams) total += operations_on(s);
    return total;
  }

  // ---- Device -----------------------------------------------------------------------------
  pfBackend_t backend() const override { return inner_->backend(); }
  std::string name() const override { return "test(" + inner_->name() + ")"; }
  pfResult_t priority_range(int* lowest, int* highest) override {
    return inner_->priority_range(lowest, highest);
  }
  pfResult_t create_fill_stream(Stream* out) override {
    const pfResult_t r = inner_->create_fill_stream(out);
    if (r == pfSuccess) {
      if (fill_stream == nullptr) fill_stream = *out;
      fill_streams.push_back(*out);
    }
    return r;
  }
  pfResult_t create_stream(int priority, Stream* out) override {
    return inner_->create_stream(priority, out);
  }
  pfResult_t destroy_stream(Stream stream) override { return inner_->destroy_stream(stream); }
  bool is_valid_main_stream(Stream stream) const override {
    return inner_->is_valid_main_stream(stream);
  }
  pfResult_t synchronize_stream(Stream stream) override {
    return inner_->synchronize_stream(stream);
  }
  pfResult_t create_event(Event* out) override { return inner_->create_event(out); }
  pfResult_t destroy_event(Event event) override { return inner_->destroy_event(event); }
  pfResult_t record_event(Event event, Stream stream) override {
    count(stream);
    if (is_fill(stream)) {
      const bool slice_end = after_copy_.exchange(false);
      if (slice_end && fail_slice_end_record.load() > 0) {
        fail_slice_end_record.fetch_sub(1);
        return fail(pfErrorCudaFailure, "injected: recording the slice end failed");
      }
    }
    return inner_->record_event(event, stream);
  }
  pfResult_t stream_wait_event(Stream stream, Event event) override {
    count(stream);
    const pfResult_t r = inner_->stream_wait_event(stream, event);
    const double delay = fill_wait_delay_us.load();
    if (r == pfSuccess && delay > 0 && is_fill(stream)) return pfSimStreamDelay(stream, delay);
    return r;
  }
  pfResult_t query_event(Event event, bool* done, double* time_us) override {
    query_latch.pass();
    return inner_->query_event(event, done, time_us);
  }
  pfResult_t synchronize_event(Event event) override { return inner_->synchronize_event(event); }
  pfResult_t allocate_words(size_t count, uint64_t** words) override {
    return inner_->allocate_words(count, words);
  }
  pfResult_t free_words(uint64_t* words) override { return inner_->free_words(words); }
  pfResult_t allocate_host_words(size_t count, uint64_t** words) override {
    return inner_->allocate_host_words(count, words);
  }
  pfResult_t free_host_words(uint64_t* words) override { return inner_->free_host_words(words); }
  pfResult_t write_word(Stream stream, uint64_t* word, uint64_t value) override {
    count(stream);
    return inner_->write_word(stream, word, value);
  }
  pfResult_t write_word_max(Stream stream, uint64_t* word, uint64_t value) override {
    count(stream);
    return inner_->write_word_max(stream, word, value);
  }
  pfResult_t copy_word_to_host(Stream stream, const uint64_t* word, uint64_t* host) override {
    copies.fetch_add(1);
    count(stream);
    if (fail_copy_word.load() > 0) {
      fail_copy_word.fetch_sub(1);
      return fail(pfErrorCudaFailure, "injected: copying the cursor to the host failed");
    }
    const pfResult_t r = inner_->copy_word_to_host(stream, word, host);
    if (is_fill(stream)) after_copy_ = r == pfSuccess;
    return r;
  }
  pfResult_t memory_info(size_t* free_bytes, size_t* total_bytes) override {
    return inner_->memory_info(free_bytes, total_bytes);
  }
  pfResult_t allocate_arena(size_t bytes, void** base) override {
    return inner_->allocate_arena(bytes, base);
  }
  pfResult_t free_arena(void* base) override { return inner_->free_arena(base); }
  int sm_count() const override { return inner_->sm_count(); }
  pfResult_t configure_partition(int reserved_sms, FillPartition* partition) override {
    return inner_->configure_partition(reserved_sms, partition);
  }
  double now_us() override { return inner_->now_us(); }
  bool is_capturing(Stream stream) const override {
    std::lock_guard lock(capture_mutex);
    return capturing.count(stream) > 0;
  }
  bool single_hardware_queue() const override { return single_queue; }
  pfResult_t admit_main_stream(Stream stream, uint64_t* identity) override {
    std::lock_guard lock(identity_mutex);
    if (refused_main_streams.count(stream) > 0)
      return fail(pfErrorNotSupported, "injected: the device cannot serve main stream {}", stream);
    const auto it = stream_identity.find(stream);
    *identity = it == stream_identity.end() ? 0 : it->second;
    return pfSuccess;
  }
  bool main_stream_unchanged(Stream stream, uint64_t identity) const override {
    std::lock_guard lock(identity_mutex);
    const auto it = stream_identity.find(stream);
    return identity == (it == stream_identity.end() ? 0 : it->second);
  }
  bool enter_launch_context() override {
    ++launch_context_depth();
    launch_contexts_entered.fetch_add(1);
    return true;
  }
  void leave_launch_context() override {
    --launch_context_depth();
    launch_contexts_left.fetch_add(1);
  }
  pfResult_t prepare_graph_items(const GraphJobSpec& spec,
                                 std::unique_ptr<GraphItems>* out) override {
    std::unique_ptr<GraphItems> inner;
    const pfResult_t r = inner_->prepare_graph_items(spec, &inner);
    if (r != pfSuccess) return r;
    const int sms = graph_sms_used >= 0 ? graph_sms_used : inner->sms_used();
    *out = std::make_unique<TestGraphItems>(std::move(inner), sms);
    return pfSuccess;
  }
  pfResult_t launch_graph_items(GraphItems& items, const pfSliceDesc_t& slice,
                                Stream stream) override {
    return inner_->launch_graph_items(*static_cast<TestGraphItems&>(items).inner, slice, stream);
  }
  DrivenClock* driven_clock() override {
    return hide_driven_clock ? nullptr : inner_->driven_clock();
  }
  pfResult_t collect_activity(std::vector<ActivityRecord>* out) override {
    return inner_->collect_activity(out);
  }

 private:
  void count(Stream stream) {
    std::lock_guard lock(count_mutex_);
    ++operations_[stream];
  }

  std::unique_ptr<Device> inner_;
  std::mutex count_mutex_;
  std::map<Stream, size_t> operations_;
  // The last fill-stream operation was a successful copy: the next record is a slice end.
  std::atomic<bool> after_copy_{false};
};

// A runtime on device `device` of `world` through a TestDevice the test keeps a pointer to.
// `executor_thread`: bubble messages handled by the executor thread (the CUDA path).
// `core_runtime` (optional) receives the C++ object, e.g. to wait for the executor.
inline pfRuntime_t make_test_runtime(pfSimWorld_t world, pfConfig_t config, TestDevice** device,
                                     bool hide_driven_clock, bool executor_thread,
                                     core::Runtime** core_runtime = nullptr,
                                     bool single_hardware_queue = false) {
  config.sim_world = world;
  RuntimeOptions options;
  EXPECT_EQ(resolve_config(&config, &options), pfSuccess) << pfGetLastErrorMessage();
  options.sim_messages_in_hook = !executor_thread;
  std::unique_ptr<Device> sim;
  EXPECT_EQ(make_sim_device(options, &sim), pfSuccess) << pfGetLastErrorMessage();
  auto test = std::make_unique<TestDevice>(std::move(sim));
  test->hide_driven_clock = hide_driven_clock;
  test->single_queue = single_hardware_queue;
  *device = test.get();
  std::unique_ptr<core::Runtime> rt;
  EXPECT_EQ(core::Runtime::create(options, std::move(test), &rt), pfSuccess)
      << pfGetLastErrorMessage();
  if (core_runtime != nullptr) *core_runtime = rt.get();
  return rt ? core::publish_runtime(std::move(rt)) : nullptr;
}

// A runtime on `stage`'s world through a TestDevice, with the stage's default config (one stage,
// 4 reserved SMs); `executor_thread` picks the message path (executor thread or pre-run hook),
// the parameter of the tests instantiated with message_path_name.
inline pfRuntime_t make_stage_test_runtime(ManualStage& stage, bool executor_thread,
                                           TestDevice** device = nullptr,
                                           core::Runtime** core_runtime = nullptr) {
  TestDevice* unused = nullptr;
  return make_test_runtime(stage.world.get(), sim_config(stage.world.get(), 0, 1, 4),
                           device != nullptr ? device : &unused, false, executor_thread,
                           core_runtime);
}

// A fixture parameterised on the message path (true: executor thread; instantiated with
// message_path_name) with a hand-driven stage and a make_stage_test_runtime runtime on it. A test
// destroys the runtime itself, checking the result.
class MessagePathStageTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(stage.init());
    rt = make_stage_test_runtime(stage, GetParam(), &device, &core_runtime);
    ASSERT_NE(rt, nullptr);
  }

  ManualStage stage;
  TestDevice* device = nullptr;
  core::Runtime* core_runtime = nullptr;
  pfRuntime_t rt = nullptr;
};

}  // namespace pipefill::testing
