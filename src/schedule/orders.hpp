// Op-order generators of the built-in schedule kinds (internal to src/schedule). Each fills one
// op list per stage with type, microbatch and chunk; schedule.cpp validates the spec before and
// sets the virtual stages after. Sources and formulas: docs/simulator.md section 1.1.
#pragma once

#include <vector>

#include "schedule/schedule.hpp"

namespace pipefill::schedule::detail {

using Orders = std::vector<std::vector<Op>>;

void gpipe_order(int p, int m, Orders* out);
void one_f_one_b_order(int p, int m, Orders* out);
void zbh1_order(int p, int m, Orders* out);
// Megatron's schedule table (get_schedule_table): virtual micro-batch k of a stage ->
// (microbatch, chunk) with micro-batch groups of `group` (the last group takes the rest).
void schedule_table(int m, int v, int group, std::vector<int>* microbatch, std::vector<int>* chunk);
void interleaved_1f1b_order(int p, int m, int v, int group, Orders* out);
void interleaved_zb_order(int p, int m, int v, int group, Orders* out);
void looped_bfs_order(int p, int m, int v, Orders* out);
void zbv_order(int p, int m, Orders* out);
void dualpipev_order(int p, int m, Orders* out);

}  // namespace pipefill::schedule::detail
