// The message pump: who takes the bubble messages off the ring and when. Two implementations:
//
//  - the executor thread (CUDA, the host device, and the simulator with
//    RuntimeOptions::sim_messages_in_hook = false): a std::thread handles messages as they come;
//    when idle it polls completions every 200 µs, and after activity it spins 50 µs before
//    sleeping so back-to-back bubble instructions never pay a wake-up;
//  - the pre-run hook (the simulator's default): messages are handled by drain(), which the
//    simulated world's pre-run hook calls on the thread that runs the world, so the fill work of
//    every bubble begun so far is enqueued at a fixed point and same-seed runs are identical. A
//    poller thread still harvests completions every 200 µs so pfJobWait sees progress.
//
// Either way the handler (executor.hpp) is called with messages in ring order, one batch at a
// time.
#pragma once

#include <memory>
#include <span>

#include "core/message_ring.hpp"

namespace pipefill::core {

class MessageHandler {
 public:
  virtual ~MessageHandler() = default;
  virtual void handle_messages(std::span<const BubbleMessage> batch) = 0;
  // Harvests what completed (the executor's idle work).
  virtual void poll_completions() = 0;
  // Whether poll_completions has anything to wait for: a bubble whose End was handled and whose
  // device work may still be running. Without one, an idle pump sleeps until the next message.
  virtual bool awaits_completions() = 0;
};

class MessagePump {
 public:
  virtual ~MessagePump() = default;
  virtual void start() = 0;
  // Returns once every message pushed before the call has been handled.
  virtual void drain() = 0;
  // The ring is full and the user thread must push: make room (never blocks forever).
  virtual void make_room() = 0;
  // Handles what is left and joins the pump's thread. Idempotent.
  virtual void stop() = 0;
};

std::unique_ptr<MessagePump> make_executor_thread_pump(MessageRing& ring, MessageHandler& handler);
std::unique_ptr<MessagePump> make_pre_run_hook_pump(MessageRing& ring, MessageHandler& handler);

}  // namespace pipefill::core
