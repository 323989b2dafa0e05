// The host-device engine's lifetime, streams and the enqueueing of stream operations (see
// host_engine.hpp for the model); the threads that run the operations and the fill blocks are in
// host_engine_threads.cpp.
#include "host/host_engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>

#include "common/callback_scope.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "host/host_engine_internal.hpp"
#include "pipefill/item_protocol.hpp"

namespace pipefill::host {
namespace {

bool aligned_word(const void* word) { return reinterpret_cast<uintptr_t>(word) % 8 == 0; }

}  // namespace

Engine::Engine(const EngineOptions& options)
    : sm_count_(options.sm_count),
      fill_nice_(options.fill_nice),
      time_budget_(options.time_budget),
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
  return enqueue_write(stream, word, value, /*write_max=*/false);
}

pfResult_t Engine::write_word_max(void* stream, uint64_t* word, uint64_t value) {
  return enqueue_write(stream, word, value, /*write_max=*/true);
}

pfResult_t Engine::enqueue_write(void* stream, uint64_t* word, uint64_t value, bool write_max) {
  if (word == nullptr) return fail(pfErrorInvalidArgument, "word pointer is NULL");
  if (!aligned_word(word)) {
    return fail(pfErrorInvalidArgument, "word {} is not 8-byte aligned",
                static_cast<const void*>(word));
  }
  Op op;
  op.type = OpType::WriteWord;
  op.word = word;
  op.value = value;
  op.write_max = write_max;
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
                                 ItemFn item_fn, void* user, bool time_budget) {
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
  op.launch->time_budget = time_budget && time_budget_;
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
