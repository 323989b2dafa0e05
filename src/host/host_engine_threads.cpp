// The host-device engine's threads (see host_engine.hpp for the model): each stream thread takes
// its head operation, runs it (with the engine mutex released while it takes real time) and pops
// it; fill launches hand one task per block to the pool of SM threads and wait until every block
// has exited. The threads that run fill work run at the engine's fill priority.
#include <algorithm>
#include <chrono>
#include <string>


#ifdef __linux__
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

#include "common/callback_scope.hpp"
#include "common/item_call.hpp"
#include "common/log.hpp"
#include "host/host_engine.hpp"
#include "host/host_engine_internal.hpp"
#include "pipefill/item_protocol.hpp"

namespace pipefill::host {
namespace {

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
    case OpType::WriteWord: {
      std::atomic_ref<uint64_t> word(*op.word);
      if (!op.write_max) {
        word.store(op.value);
        return;
      }
      uint64_t seen = word.load();
      while (seen < op.value && !word.compare_exchange_weak(seen, op.value)) {
      }
      return;
    }
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

bool Engine::within_time_budget(Launch& launch) const {
  if (!launch.time_budget || !(launch.slice.time_budget_us > 0)) return true;
  const double now = now_us();
  double started = launch.started_us.load(std::memory_order_relaxed);
  if (started < 0) {
    // The first claim of the launch starts its clock (another block may have just done so).
    if (launch.started_us.compare_exchange_strong(started, now)) return true;
  }
  const uint64_t timed = launch.items_timed.load(std::memory_order_relaxed);
  if (timed == 0) return true;  // nothing to judge an item by yet: the claim decides
  const double mean_us =
      static_cast<double>(launch.item_ns.load(std::memory_order_relaxed)) / 1e3 /
      static_cast<double>(timed);
  // Half an item of slack: the planned time is already up to one (fastest) item short of the
  // bubble's predicted end, and without it the fill lost 16% of its rate
  // (docs/results-host-python.md, "The time budget").
  return now - started + 0.5 * mean_us <= launch.slice.time_budget_us;
}

void Engine::run_block(Launch& launch) {
  CallbackScope scope("item_fn");
  for (;;) {
    if (stopping_flag_.load()) return;  // the device is being destroyed
    uint64_t item = 0;
    if (launch.ticket) {
      if (!within_time_budget(launch)) return;
      item = protocol::claim_item(launch.slice, protocol::HostAtomics{});
      if (item == protocol::kStopItem) return;
    } else {
      const uint64_t index = launch.next.fetch_add(1);
      if (index >= launch.items) return;
      item = launch.first_item + index;
    }
    if (launch.item_fn == nullptr) continue;
    std::string what;
    // Only a launch with a time budget judges by its items' time: the others read no clock.
    const auto t0 = launch.time_budget ? std::chrono::steady_clock::now()
                                       : std::chrono::steady_clock::time_point{};
    if (call_item([&] { launch.item_fn(launch.user, item); }, item, &what)) {
      if (launch.time_budget) {
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::steady_clock::now() - t0).count();
        launch.item_ns.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
        launch.items_timed.fetch_add(1, std::memory_order_relaxed);
      }
      continue;
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

}  // namespace pipefill::host
