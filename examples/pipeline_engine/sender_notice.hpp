// The sending stage's notice (EngineOptions::notice_lead_us; the simulated transport): a stage
// that will send a message tells the receiving stage a fixed lead before the send, and the
// receiver closes the fill of the bubble that waits for that message (pfBubbleCloseFill) when
// the notice arrives, so its fill stops just before the transfer it would slow.
//
// Why: a receive bubble's end is the sender's send plus the transfer, and the send's time
// varies with the sender's kernels (5% jitter upstream: 40-120 us of spread per class), which
// nothing the receiver sees at the bubble's begin predicts (docs/results-peers.md, the frontier
// notes). The sender knows it a kernel ahead.
//
// How, per stage:
//  - sender: right before the last kernel ahead of each send, a notice stream waits for that
//    kernel's start, waits (its nominal duration - lead) and records the notice event; the send
//    binds the message to the latest notice;
//  - receiver: the receive looks the message's notice up; right after the pfBubbleBegin of the
//    bubble that waits for it, the stage's notice stream waits for the notice (+ the p2p
//    latency, the flag's trip) and calls pfBubbleCloseFill on it;
//  - the end-of-iteration collective (a wait for every stage's arrival, moving no bytes): each
//    stage's arrival is noticed the same way from its last kernel before it, and the bubble that
//    waits for the collective is closed once every other stage's notice has arrived.
// The sender's own timing error (the kernel's jitter) is in the lead: a notice can be early or
// late by it. A late one costs what no notice would (the gate still closes at the bubble's end).
// On GPUs the same protocol is a flag the sender's kernel writes over NVLink and a
// cuStreamWaitValue on the receiver's side stream; not built here (the CUDA transports emulate
// their peers or use NCCL).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "pipefill/pipefill.h"
#include "transport.hpp"

namespace engine {

class SenderNotices {
 public:
  // lead_us < 0: notices off (every call is a no-op). latency_us: the notice's trip.
  Status open(pfSimWorld_t world, int stages, double lead_us, double latency_us);
  bool enabled() const { return lead_us_ >= 0; }
  // After the stage's runtime exists: the stage's notice streams (the receiving one is a
  // main-job stream of the runtime: pfBubbleCloseFill is called on it).
  Status attach(int stage, pfRuntime_t runtime);
  // Sender: right before enqueuing a kernel of `kernel_us` on `main` that may be the last one
  // ahead of a send.
  Status before_kernel(int stage, void* main, double kernel_us);
  // Sender: the send of message `key` (after its last kernel).
  void on_send(int stage, uint64_t key);
  // Receiver: the receive of message `key` (the bubble that waits for it begins next).
  void on_receive(int stage, uint64_t key);
  // The stage arrives at the collective (after its last kernel before it) / posts its wait.
  void on_arrive(int stage);
  void on_collective(int stage);
  // Receiver: right after pfBubbleBegin; `ends_in_receive` whether the bubble waits for the
  // last receive posted (else for the collective, when one was posted).
  Status after_begin(int stage, bool ends_in_receive);
  // Before the stage's runtime is destroyed: its notice stream.
  void detach(int stage);
  void close();

 private:
  static constexpr size_t kRing = 256;  // a stage's kernels between a send and its receive, at most
  struct Stage {
    pfRuntime_t runtime = nullptr;
    void* tx = nullptr;  // sender's notice stream (a plain simulated stream)
    void* rx = nullptr;  // receiver's notice stream (a main-job stream of the runtime)
    std::vector<pfSimEvent_t> kernel_start, notice;  // rings
    size_t next = 0;
    pfSimEvent_t latest = nullptr;   // the notice of the last kernel enqueued
    pfSimEvent_t pending = nullptr;  // the notice of the last receive posted
    pfSimEvent_t arrival = nullptr;  // the notice of this stage's arrival at the collective
    bool collective_posted = false;  // the last communication posted was the collective
  };
  double lead_us_ = -1.0;
  double latency_us_ = 0.0;
  std::vector<Stage> stages_;
  std::unordered_map<uint64_t, pfSimEvent_t> by_message_;
};

}  // namespace engine
