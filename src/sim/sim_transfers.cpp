// Comm transfers under fill load: a wait made by pfSimStreamWaitEventTransfer completes at
// record time + latency + transfer, where the transfer progresses at 1 / (1 + gamma x L_fill) of
// each moment (docs/simulated-device.md, "Interference").
//
// Why each moment and not the load at the transfer's start: a pipeline receive moves its bytes
// for tens of microseconds (84 µs after its latency in the example engine, 24 of its fill
// items), and the HBM bandwidth a fill block takes from it is taken only while that block runs
// (NVIDIA/nccl#1433:
// "You may not compete for SMs but still compete for memory bandwidth"). Taking the load at the
// start charged a fill that stops a microsecond into the transfer for the whole of it, and
// charged nothing for fill that starts beside a transfer already under way. Main kernels were
// already timed this way (MainGroup); fill items stay timed at their start (they are short).
#include <algorithm>

#include "sim/sim_engine.hpp"

namespace pipefill::sim {

void World::Impl::start_transfer(SimStream* stream, const Op& op, double record_us) {
  DeviceState& device = devices[stream->device];
  const double gamma = device.interference.comm_slowdown;
  if (op.transfer_us == 0.0 || gamma == 0.0) {
    // Nothing to slow: the fixed latency (and the unslowed transfer) from the record on.
    schedule(std::max(now, record_us + op.time_us + op.transfer_us), EventType::OpComplete,
             stream);
    return;
  }
  Transfer transfer;
  transfer.stream = stream;
  transfer.id = next_transfer_id++;
  transfer.remaining_us = op.transfer_us;
  // It starts once the latency has passed; a wait that reaches the head later than that finds
  // it under way, run at the load of now (its past loads are not known here).
  transfer.since_us = record_us + op.time_us;
  transfer.factor = 1.0 + gamma * fill_load(device);
  device.transfers.push_back(transfer);
  schedule(std::max(now, transfer.since_us + transfer.remaining_us * transfer.factor),
           EventType::TransferDone, stream, transfer.id, transfer.version);
}

void World::Impl::retime_transfers(int device_index) {
  DeviceState& device = devices[device_index];
  if (device.transfers.empty()) return;
  const double factor = 1.0 + device.interference.comm_slowdown * fill_load(device);
  for (Transfer& transfer : device.transfers) {
    if (factor == transfer.factor) continue;
    if (now > transfer.since_us) {  // bank what moved at the old rate (none before its start)
      transfer.remaining_us =
          std::max(0.0, transfer.remaining_us - (now - transfer.since_us) / transfer.factor);
      transfer.since_us = now;
    }
    transfer.factor = factor;
    ++transfer.version;
    schedule(std::max(now, transfer.since_us + transfer.remaining_us * transfer.factor),
             EventType::TransferDone, transfer.stream, transfer.id, transfer.version);
  }
}

void World::Impl::transfer_done(int device_index, uint64_t id, uint64_t version) {
  DeviceState& device = devices[device_index];
  const auto it = find_current(device.transfers, id, version);
  if (it == device.transfers.end()) return;  // stale
  SimStream* stream = it->stream;
  device.transfers.erase(it);
  complete_head(stream);
}

}  // namespace pipefill::sim
