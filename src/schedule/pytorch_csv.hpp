// PyTorch's CSV schedule format (torch.distributed.pipelining: PipelineScheduleMulti._dump_csv /
// _load_csv, _Action.__repr__ / from_str): one row per pipeline rank, one action per field.
// Grammar (PyTorch's _action_regex, matched here against the whole field):
//   action  := stage kind [microbatch] | "(" action (";" action)* ")OVERLAP_F_B"
//   stage, microbatch := decimal digits; stage is the global (virtual) stage index
//   kind    := F | I | B | W | UNSHARD | RESHARD | REDUCE_GRAD | SEND_F | RECV_F | SEND_B | RECV_B
// F forward, I backward-input, W backward-weight, B full backward; an empty field is an idle
// step. Compute kinds need a micro-batch. Communication and FSDP kinds are accepted and
// skipped: the timing model derives the transfers from the dependencies. The sub-actions of
// an OVERLAP_F_B run back to back, as PyTorch's _PipelineScheduleRuntime runs them.
// The rank -> virtual stage placement is read from the actions (each virtual stage on one rank,
// every rank the same number of chunks, ordered by virtual stage index).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "schedule/schedule.hpp"

namespace pipefill::schedule {

struct CsvStats {
  size_t compute_actions = 0;
  size_t skipped_actions = 0;  // communication / FSDP actions
  size_t idle_slots = 0;       // empty fields
};

// Parses and validates (every forward and backward exactly once, W after its I, backwards
// after their forwards, no deadlock under uniform costs). Errors name the line, field and
// action. `source` names the input in messages.
bool parse_pytorch_csv(const std::string& text, const std::string& source, CustomSchedule* out,
                       std::string* error, CsvStats* stats = nullptr);
// Reads the file (at most 256 MiB) and parses it.
bool load_pytorch_csv(const std::string& path, CustomSchedule* out, std::string* error,
                      CsvStats* stats = nullptr);

// The compute actions of an op order as PyTorch's CSV (no idle steps): what _dump_csv writes
// for a compute-only schedule. Overlapped pairs are written as "(a;b)OVERLAP_F_B".
std::string format_pytorch_csv(const std::vector<std::vector<Op>>& order);
// One op in PyTorch's notation, e.g. "3F0" (virtual stage, kind, micro-batch).
std::string pytorch_action(const Op& op);

// Points `spec` at the custom schedule (kind Custom, stages, chunks and micro-batches from it).
void use_custom_schedule(ScheduleSpec* spec, std::shared_ptr<const CustomSchedule> schedule);

}  // namespace pipefill::schedule
