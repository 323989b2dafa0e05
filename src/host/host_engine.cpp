// The host-device engine's threads, streams and stream operations (see host_engine.hpp for the
// model). Each stream thread takes its head operation, runs it (with the engine mutex released
// while it takes real time) and pops it; fill launches hand one task per block to the pool of SM
// threads and wait until every block has exited.
#include "host/host_engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>

#ifdef __linux__
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

#include "common/callback_scope.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "host/host_engine_internal.hpp"
#include "pipefill/item_protocol.hpp"

namespace pipefill::host {
namespace {

bool aligned_word(const void* word) { return reinterpret_cast<uintptr_t>(word) % 8 == 0; }

// Every thread of the device (streams, SM threads) asks for a 1 ns timer slack (Linux's default
// is 50 µs): a stream's delay, and a sleep inside an item, then end when asked - as a kernel's
// duration would - instead of up to 50 µs later. The name shows in profilers (perf, top -H). A
// thread that runs fill work adds `nice_increment` to its nice value (Linux keeps it per thread;
// raising it needs no privilege), so the main job's threads win a contended core.
void configure_device_thread(const char* name, int nice_increment) {
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  pthread_setname_np(pthread_self(), name);
  if (nice_increment > 0) {
    const auto tid = static_cast<id_t>(syscall(SYS_gettid));
    errno = 0;
    const int current = getpriority(PRIO_PROCESS, tid);
    if (errno != 0 || setpriority(PRIO_PROCESS, tid, std::min(19, current + nice_increment)) != 0) {
      log::debug("host device: thread {} kept its priority (setpriority failed, errno {})", name,
                 errno);
    }
  }
#else
  (void)name;
  (void)nice_increment;
#endif
}

}  // namespace

Engine::Engine(const EngineOptions& options)
    : sm_count_(options.sm_count),
      fill_nice_(options.fill_nice),
      memory_bytes_(options.memory_bytes),
      origin_(std::chrono::steady_clock::now()),
      fill_sms_(options.sm_count) {}

pfResult_t Engine::create(const EngineOptions& options, std::shared_ptr<Engine>* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "host engine output pointer is NULL");
  if (options.sm_count < 1 || options.sm_count > kMaxSmCount) {
    return fail(pfErrorInvalidArgument, "host device sm_count {} is out of range [1, {}]",
                options.sm_count, kMaxSmCount);
  }
  if (options.memory_bytes == 0) {
    return fail(pfErrorInvalidArgument, "host device memory_bytes 0 must be > 0");
  }
  std::shared_ptr<Engine> engine(new Engine(options));
  engine->self_ = engine;
  PF_TRY(engine->start());
  *out = std::move(engine);
  return pfSuccess;
}

pfResult_t Engine::start() {
  // The SM threads are made here, at device creation, never inside a bubble.
  try {
    for (int i = 0; i < sm_count_; ++i) block_threads_.emplace_back([this] { block_main(); });
  } catch (const std::exception& error) {
    shutdown();
    return fail(pfErrorOutOfMemory, "host device: starting {} SM threads failed: {}", sm_count_,
                error.what());
  }
  MutexLock lock(mutex_);
  started_ = true;
  return pfSuccess;
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(mutex_);
    if (stopping_ && block_threads_.empty()) return;
    stopping_ = true;
    stopping_flag_.store(true);
    for (auto& [handle, stream] : streams_) {
      unregister_stream(handle);
      if (stream->thread.joinable()) threads.push_back(std::move(stream->thread));
      stream->wake.notify_all();
    }
    for (auto& stream : retired_streams_) {
      if (stream->thread.joinable()) threads.push_back(std::move(stream->thread));
      stream->wake.notify_all();
    }
    progress_.notify_all();
    block_cv_.notify_all();
    stop_cv_.notify_all();
  }
  for (std::thread& t : threads) t.join();
  for (std::thread& t : block_threads_) t.join();
  block_threads_.clear();
  MutexLock lock(mutex_);
  for (auto& [handle, stream] : streams_) {
    for (Op& op : stream->ops) unpin_words(op);
    stream->ops.clear();
  }
  for (auto& stream : retired_streams_) {
    for (Op& op : stream->ops) unpin_words(op);
    stream->ops.clear();
  }
  for (auto& [base, block] : words_) {
    ::operator delete[](reinterpret_cast<uint64_t*>(base), std::align_val_t{256});
  }
  words_.clear();
  for (auto& [base, bytes] : arenas_) {
    ::operator delete[](reinterpret_cast<unsigned char*>(base), std::align_val_t{256});
  }
  arenas_.clear();
  arena_used_ = 0;
}

double Engine::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_)
      .count();
}

pfResult_t Engine::check_open() const {
  if (stopping_) return fail(pfErrorInvalidState, "the host device has been destroyed");
  return pfSuccess;
}

Engine::Stream* Engine::live_stream(const void* handle) const {
  const auto it = streams_.find(as_handle(handle));
  return it == streams_.end() ? nullptr : it->second.get();
}

#define PF_HOST_LOOKUP_STREAM(var, handle)                                                    \
  PF_TRY(check_open());                                                                       \
  Stream* var = live_stream(handle);                                                          \
  if (var == nullptr) {                                                                       \
    return fail(pfErrorInvalidArgument, "stream {} is not a live stream of this host device", \
                static_cast<const void*>(handle));                                            \
  }

// ---- Streams --------------------------------------------------------------------------------

pfResult_t Engine::create_stream(int priority, bool fill, void** out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "stream output pointer is NULL");
  if (priority < kHighestPriority || priority > kLowestPriority) {
    return fail(pfErrorInvalidArgument,
                "stream priority {} is out of range [{}, {}] (lower number = higher priority)",
                priority, kHighestPriority, kLowestPriority);
  }
  auto stream = std::make_unique<Stream>();
  stream->handle = make_handle(kStreamTag);
  stream->priority = priority;
  stream->fill = fill;
  Stream* raw = stream.get();
  {
    MutexLock lock(mutex_);
    PF_TRY(check_open());
    streams_.emplace(raw->handle, std::move(stream));
    try {
      raw->thread = std::thread([this, raw] { stream_main(raw); });
    } catch (const std::exception& error) {
      streams_.erase(raw->handle);
      return fail(pfErrorOutOfMemory, "host device: starting a stream thread failed: {}",
                  error.what());
    }
  }
  register_stream(raw->handle, self_);
  *out = as_pointer(raw->handle);
  return pfSuccess;
}

pfResult_t Engine::destroy_stream(void* handle) {
  {
    MutexLock lock(mutex_);
    PF_HOST_LOOKUP_STREAM(stream, handle);
    stream->destroyed = true;
    stream->wake.notify_all();
    auto it = streams_.find(stream->handle);
    retired_streams_.push_back(std::move(it->second));  // joined at shutdown
    streams_.erase(it);
  }
  unregister_stream(as_handle(handle));
  return pfSuccess;
}

bool Engine::is_main_stream(const void* handle) const {
  MutexLock lock(mutex_);
  const Stream* stream = live_stream(handle);
  return stream != nullptr && !stream->fill;
}

pfResult_t Engine::synchronize_stream(void* handle) {
  MutexLock lock(mutex_);
  PF_HOST_LOOKUP_STREAM(stream, handle);
  if (ThreadRole::stream == stream) {
    return fail(pfErrorInvalidState,
                "synchronizing stream {} from its own thread (a host function on it) would "
                "wait forever", handle);
  }
  if (ThreadRole::block) {
    return fail(pfErrorInvalidState,
                "synchronizing stream {} from a fill block (an item function) would wait for "
                "the block itself", handle);
  }
  const uint64_t target = stream->enqueued;
  progress_.wait(mutex_, [&] {
    mutex_.assert_held();
    return stream->executed >= target || stopping_;
  });
  return check_open();
}

// ---- Stream threads -------------------------------------------------------------------------

void Engine::stream_main(Stream* stream) {
  configure_device_thread(stream->fill ? "pf-host-fill" : "pf-host-stream",
                          stream->fill ? fill_nice_ : 0);
  ThreadRole::stream = stream;
  MutexLock lock(mutex_);
  for (;;) {
    stream->wake.wait(mutex_, [&] {
      mutex_.assert_held();
      return stopping_ || !stream->ops.empty() || stream->destroyed;
    });
    if (stopping_ || stream->ops.empty()) break;  // stopping, or destroyed and drained
    Op& op = stream->ops.front();  // references survive push_back on a deque
    execute(stream, op);
    unpin_words(op);
    stream->ops.pop_front();
    ++stream->executed;
    progress_.notify_all();
  }
}

void Engine::execute(Stream* stream, Op& op) {
  switch (op.type) {
    case OpType::Delay: {
      const auto duration = std::chrono::duration<double, std::micro>(op.duration_us);
      stop_cv_.wait_for(mutex_, duration, [&] {
        mutex_.assert_held();
        return stopping_;
      });
      return;
    }
    case OpType::HostFunc: {
      mutex_.unlock();
      {
        CallbackScope scope("host_fn");
        try {
          op.host_fn(op.user);
        } catch (...) {
          log::warn("host device: a host function on stream {} threw; ignored",
                    as_pointer(stream->handle));
        }
      }
      mutex_.lock();
      return;
    }
    case OpType::Record:
      op.record->done = true;
      op.record->time_us = now_us();
      stream->last_record = op.record;
      progress_.notify_all();
      return;
    case OpType::Wait:
      if (op.record == nullptr) return;
      progress_.wait(mutex_, [&] {
        mutex_.assert_held();
        return op.record->done || stopping_;
      });
      return;
    case OpType::WriteWord:
      std::atomic_ref<uint64_t>(*op.word).store(op.value);
      return;
    case OpType::CopyWord:
      std::atomic_ref<uint64_t>(*op.word).store(
          std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(op.source)).load());
      return;
    case OpType::Fill: {
      if (stopping_) return;
      Launch& launch = *op.launch;
      // The stream's own thread runs one of the blocks when a fill slot is free and no other
      // launch's blocks wait for one: the slice's first items start without waking an SM thread
      // (a hop the GPU's block scheduler does not have), and when that block stops last the
      // stream moves on without being woken either.
      launch.failures_to = stream->last_record;
      const bool run_one = block_queue_.empty() && fill_running_ < fill_sms_;
      const int queued = launch.blocks - (run_one ? 1 : 0);
      for (int i = 0; i < queued; ++i) block_queue_.push_back(op.launch);
      if (queued > 0) block_cv_.notify_all();
      if (run_one) run_block_here(launch);
      progress_.wait(mutex_, [&] {
        mutex_.assert_held();
        return launch.exited == launch.blocks;
      });
      return;
    }
  }
}

// ---- SM threads (fill blocks) ----------------------------------------------------------------

void Engine::block_main() {
  configure_device_thread("pf-host-sm", fill_nice_);
  ThreadRole::block = true;
  MutexLock lock(mutex_);
  for (;;) {
    block_cv_.wait(mutex_, [&] {
      mutex_.assert_held();
      return stopping_ || (!block_queue_.empty() && fill_running_ < fill_sms_);
    });
    if (stopping_) {
      // Blocks that never started count as exited, so their launch's stream can finish.
      while (!block_queue_.empty()) {
        ++block_queue_.front()->exited;
        block_queue_.pop_front();
      }
      progress_.notify_all();
      return;
    }
    std::shared_ptr<Launch> launch = std::move(block_queue_.front());
    block_queue_.pop_front();
    run_block_here(*launch);
  }
}

void Engine::run_block_here(Launch& launch) {
  ++fill_running_;
  max_fill_running_ = std::max(max_fill_running_, fill_running_);
  const bool was_block = ThreadRole::block;
  ThreadRole::block = true;  // a stream thread running a block is refused waits like an SM thread
  mutex_.unlock();
  run_block(launch);
  mutex_.lock();
  ThreadRole::block = was_block;
  --fill_running_;
  ++launch.exited;
  // An opaque launch whose blocks all stopped at failed items leaves the rest of its items
  // unrun: they are not completed either (the runtime counts opaque items as planned).
  if (launch.exited == launch.blocks && !launch.ticket && launch.failures_to != nullptr &&
      launch.failures_to->item_failures > 0) {
    launch.failures_to->items_not_run += launch.items - std::min(launch.next.load(), launch.items);
  }
  // Only the launch's stream waits for its blocks, and only for the last one; a freed fill slot
  // is for one queued block. (Broadcasting both woke every idle SM thread and the stream at
  // every block's exit.)
  if (launch.exited == launch.blocks) progress_.notify_all();
  if (!block_queue_.empty()) block_cv_.notify_one();
}

void Engine::run_block(Launch& launch) {
  CallbackScope scope("item_fn");
  for (;;) {
    if (stopping_flag_.load()) return;  // the device is being destroyed
    uint64_t item = 0;
    if (launch.ticket) {
      item = protocol::claim_item(launch.slice, protocol::HostAtomics{});
      if (item == protocol::kStopItem) return;
    } else {
      const uint64_t index = launch.next.fetch_add(1);
      if (index >= launch.items) return;
      item = launch.first_item + index;
    }
    if (launch.item_fn == nullptr) continue;
    std::string what;
    try {
      launch.item_fn(launch.user, item);
      continue;
    } catch (const std::exception& error) {
      what = fmt::format("item {} threw: {}", item, error.what());
    } catch (...) {
      what = fmt::format("item {} threw an exception that is not a std::exception", item);
    }
    // The item failed: the block stops, and the failure is kept with the stream's last record
    // (the slice's start event), where the runtime's harvest reads it (item_failures): it ends the
    // job Failed, and the item does not count as completed.
    log::warn("host device: {}; the block stops", what);
    MutexLock lock(mutex_);
    if (launch.failures_to != nullptr) {
      if (launch.failures_to->item_failures++ == 0) launch.failures_to->first_item_failure = what;
    }
    return;
  }
}

// ---- Enqueueing -----------------------------------------------------------------------------

pfResult_t Engine::enqueue(void* handle, Op op) {
  MutexLock lock(mutex_);
  PF_HOST_LOOKUP_STREAM(stream, handle);
  return enqueue_locked(stream, std::move(op));
}

pfResult_t Engine::enqueue_locked(Stream* stream, Op op) {
  // The words an operation uses stay allocated until it has run (a free is deferred).
  const void* words[3] = {};
  int count = 0;
  if (op.type == OpType::WriteWord || op.type == OpType::CopyWord) {
    words[count++] = op.word;
    if (op.source != nullptr) words[count++] = op.source;
  }
  if (op.type == OpType::Fill && op.launch->ticket) {
    const pfSliceDesc_t& slice = op.launch->slice;
    words[count++] = const_cast<const uint64_t*>(slice.gate);
    words[count++] = slice.cursor;
    words[count++] = slice.budget_counter;
  }
  for (int i = 0; i < count; ++i) {
    const pfResult_t pinned = pin_word(words[i], &op);
    if (pinned != pfSuccess) {
      unpin_words(op);  // a failing call changes nothing
      return pinned;
    }
  }
  if (op.type == OpType::Fill) {
    Launch& launch = *op.launch;
    launch.blocks = std::min(launch.blocks, fill_sms_);
    if (launch.ticket) launch.blocks = std::min(launch.blocks, launch.slice.max_blocks);
  }
  stream->ops.push_back(std::move(op));
  ++stream->enqueued;
  stream->wake.notify_one();
  return pfSuccess;
}

pfResult_t Engine::delay(void* stream, double duration_us) {
  if (!std::isfinite(duration_us) || duration_us < 0.0) {
    return fail(pfErrorInvalidArgument, "delay duration_us {} must be finite and >= 0",
                duration_us);
  }
  Op op;
  op.type = OpType::Delay;
  op.duration_us = duration_us;
  return enqueue(stream, std::move(op));
}

pfResult_t Engine::host_func(void* stream, HostFn fn, void* user) {
  if (fn == nullptr) return fail(pfErrorInvalidArgument, "host function fn is NULL");
  Op op;
  op.type = OpType::HostFunc;
  op.host_fn = fn;
  op.user = user;
  return enqueue(stream, std::move(op));
}

pfResult_t Engine::write_word(void* stream, uint64_t* word, uint64_t value) {
  if (word == nullptr) return fail(pfErrorInvalidArgument, "word pointer is NULL");
  if (!aligned_word(word)) {
    return fail(pfErrorInvalidArgument, "word {} is not 8-byte aligned",
                static_cast<const void*>(word));
  }
  Op op;
  op.type = OpType::WriteWord;
  op.word = word;
  op.value = value;
  return enqueue(stream, std::move(op));
}

pfResult_t Engine::copy_word(void* stream, const uint64_t* source, uint64_t* destination) {
  if (source == nullptr) return fail(pfErrorInvalidArgument, "source word pointer is NULL");
  if (destination == nullptr) {
    return fail(pfErrorInvalidArgument, "destination word pointer is NULL");
  }
  for (const void* word : {static_cast<const void*>(source), static_cast<const void*>(destination)}) {
    if (!aligned_word(word)) return fail(pfErrorInvalidArgument, "word {} is not 8-byte aligned", word);
  }
  Op op;
  op.type = OpType::CopyWord;
  op.source = source;
  op.word = destination;
  return enqueue(stream, std::move(op));
}

pfResult_t Engine::launch_ticket(void* stream, const pfSliceDesc_t* slice, int blocks,
                                 ItemFn item_fn, void* user) {
  if (slice == nullptr) return fail(pfErrorInvalidArgument, "slice pointer is NULL");
  if (slice->gate == nullptr) return fail(pfErrorInvalidArgument, "slice->gate is NULL");
  if (slice->cursor == nullptr) return fail(pfErrorInvalidArgument, "slice->cursor is NULL");
  if (slice->budget_counter == nullptr) {
    return fail(pfErrorInvalidArgument, "slice->budget_counter is NULL");
  }
  const void* words[] = {const_cast<const uint64_t*>(slice->gate), slice->cursor,
                         slice->budget_counter};
  const char* names[] = {"gate", "cursor", "budget_counter"};
  for (int i = 0; i < 3; ++i) {
    if (!aligned_word(words[i])) {
      return fail(pfErrorInvalidArgument, "slice->{} {} is not 8-byte aligned", names[i],
                  words[i]);
    }
  }
  if (slice->max_blocks < 1) {
    return fail(pfErrorInvalidArgument, "slice->max_blocks {} must be >= 1", slice->max_blocks);
  }
  if (blocks < 1) return fail(pfErrorInvalidArgument, "ticket blocks {} must be >= 1", blocks);
  Op op;
  op.type = OpType::Fill;
  op.launch = std::make_shared<Launch>();
  op.launch->ticket = true;
  op.launch->slice = *slice;
  op.launch->blocks = blocks;
  op.launch->item_fn = item_fn;
  op.launch->user = user;
  return enqueue(stream, std::move(op));
}

pfResult_t Engine::launch_opaque(void* stream, uint64_t first_item, uint64_t items, int blocks,
                                 ItemFn item_fn, void* user) {
  if (blocks < 1) return fail(pfErrorInvalidArgument, "opaque blocks {} must be >= 1", blocks);
  if (items > std::numeric_limits<uint64_t>::max() - first_item) {
    return fail(pfErrorInvalidArgument, "opaque first_item {} + items {} overflows", first_item,
                items);
  }
  Op op;
  op.type = OpType::Fill;
  op.launch = std::make_shared<Launch>();
  op.launch->ticket = false;
  op.launch->first_item = first_item;
  op.launch->items = items;
  op.launch->blocks = blocks;
  op.launch->item_fn = item_fn;
  op.launch->user = user;
  return enqueue(stream, std::move(op));
}

#undef PF_HOST_LOOKUP_STREAM

}  // namespace pipefill::host
