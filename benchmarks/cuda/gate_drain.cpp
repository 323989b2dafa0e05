// How fast the main job gets its SMs back when a bubble ends, with fill blocks resident on the
// fill SMs. One experiment per iteration (as in gpu-probes P3): the main stream starts a 2 ms
// "receive wait" kernel (the bubble) and the host confirms it is resident; then fill blocks that
// each own an SM (maximum shared memory, 20 us items) start; the main stream closes the gate
// behind the wait and launches a full-width kernel whose blocks cannot share an SM with a fill
// block. Reported per variant (medians):
//   gate_latency_us      bubble end -> last fill block exit
//   main_start_delay_us  bubble end -> last block of the main kernel started (owns every SM)
//   fill_resident_at_end fill blocks still resident when the main stream passed bubble end
//                        (exited after it); gate_latency_us is how long they took to drain
//   first_fill_start_us  bubble begin -> first fill block started (gated_partition_inline only:
//                        in the other variants the host starts the fill after confirming the
//                        bubble kernel is resident, so the figure would be the host's)
// Variants, all with the same 20 us items:
//   naive_long_kernel      ungated, ~8 ms of work per block on every SM: an opaque fill kernel
//                          longer than the bubble (what a fill without a gate does when the
//                          bubble is shorter than its kernel);
//   naive_sized_to_bubble  ungated, each block sized to the bubble (2 ms of items): a fill
//                          whose duration was predicted exactly, with nothing to stop it early;
//   gated_all_sms          PipeFill's gate, fill on every SM (no reservation);
//   gated_grid_cap         gate + grid capped at SMs - R;
//   gated_partition        gate in the device's fill partition (green context when the driver
//                          has it, else the grid cap again);
//   gated_partition_inline the runtime's inline order: the fill stream waits for a begin event
//                          recorded on the main stream, the slice is enqueued, then the bubble
//                          kernel, gate close and main kernel; needs a green context (fill blocks
//                          confined to the partition leave the bubble kernel its SMs), skipped
//                          in grid-cap mode.
// Why the wait kernel starts first: fill blocks that own every SM, launched before it, leave it
// no SM; the gate write queued behind it then never runs and the gated variants deadlock.
#include "gpu_bench_common.hpp"

namespace pipefill::cuda::bench {
namespace {

constexpr uint64_t kItemNs = 20'000;
constexpr uint64_t kBubbleNs = 2'000'000;
constexpr uint64_t kNaiveLongItemsPerBlock = 400;  // ~8 ms of work per block
constexpr uint64_t kNaiveSizedItemsPerBlock = kBubbleNs / kItemNs;
constexpr size_t kMainSmem = 48 * 1024;

enum Variant { NaiveLongKernel, NaiveSizedToBubble, GatedAllSms, GatedGridCap, GatedPartition, GatedPartitionInline };
const char* kNames[] = {"naive_long_kernel", "naive_sized_to_bubble", "gated_all_sms", "gated_grid_cap",
                        "gated_partition", "gated_partition_inline"};

void BM_Drain(benchmark::State& state) {
  GpuContext& g = gpu();
  const auto variant = static_cast<Variant>(state.range(0));
  const bool gated = variant >= GatedAllSms;
  const int reserved = g.partition.total_sms - g.partition.fill_sms;
  int grid = g.sms;
  cudaStream_t fill_stream = g.plain_fill;
  if (variant == GatedGridCap) grid = g.sms - reserved;
  const bool inline_order = variant == GatedPartitionInline;
  if (inline_order && !g.partition.hardware_confined) {
    state.SkipWithError("needs a green context (grid-cap mode: fill blocks enqueued first take every SM)");
    return;
  }
  if (variant == GatedPartition || inline_order) {
    grid = g.partition.fill_sms;
    fill_stream = static_cast<cudaStream_t>(g.fill);
  }
  const uint64_t naive_items_per_block =
      variant == NaiveLongKernel ? kNaiveLongItemsPerBlock : kNaiveSizedItemsPerBlock;
  uint64_t* bubble_end = g.stamps;
  uint64_t* main_starts = g.stamps + 8;
  uint64_t* fill_exits = g.stamps + 8 + g.sms;
  uint64_t* fill_starts = g.stamps + 8 + 2 * g.sms;
  Event begin = nullptr;
  BENCH_OK(g.device->create_event(&begin));
  std::vector<double> gate_latency, main_delay, resident_at_end, first_fill_start;
  for (auto _ : state) {
    g.reset_words();
    pfSliceDesc_t slice{};
    slice.bubble_id = gated ? 1 : ~uint64_t{0};  // naive: the gate never reads as closed
    slice.total_items = gated ? (uint64_t{1} << 40) : naive_items_per_block * static_cast<uint64_t>(grid);
    slice.max_items = slice.total_items;
    slice.max_blocks = grid;
    slice.gate = g.gate();
    slice.cursor = g.cursor();
    slice.budget_counter = g.budget();
    SpinItemsParams params;
    params.item_ns = kItemNs;
    params.dynamic_smem_bytes = g.fill_smem;
    params.records.block_exit_ns = fill_exits;
    params.records.block_start_ns = fill_starts;
    int launched = 0;
    if (inline_order) {
      BENCH_OK(g.device->record_event(begin, g.main));
      BENCH_OK(g.device->stream_wait_event(fill_stream, begin));
      BENCH_OK(launch_spin_items(slice, fill_stream, params, &launched));
      BENCH_OK(launch_spin_and_stamp(g.main, kBubbleNs, bubble_end));
    } else if (g.start_bubble_kernel(kBubbleNs, bubble_end) != pfSuccess) {
      state.SkipWithError(last_error_message().c_str());
      BENCH_CUDA(cudaDeviceSynchronize());
      break;
    }
    if (!inline_order && launch_spin_items(slice, fill_stream, params, &launched) != pfSuccess) {
      // e.g. the opt-in shared memory not honoured in a green context: report, keep the others
      state.SkipWithError(last_error_message().c_str());
      BENCH_CUDA(cudaDeviceSynchronize());
      break;
    }
    if (gated) BENCH_OK(g.device->write_word(g.main, g.gate(), 1));
    BENCH_OK(launch_stamp_blocks(g.main, g.sms, 256, kMainSmem, 20'000, main_starts, nullptr));
    BENCH_CUDA(cudaDeviceSynchronize());
    const double end = static_cast<double>(g.read(bubble_end, 1)[0]);
    const auto starts = g.read(main_starts, static_cast<size_t>(g.sms));
    const auto exits = g.read(fill_exits, static_cast<size_t>(launched));
    const double last_exit = static_cast<double>(*std::max_element(exits.begin(), exits.end()));
    const double last_start = static_cast<double>(*std::max_element(starts.begin(), starts.end()));
    gate_latency.push_back((last_exit - end) / 1000.0);
    resident_at_end.push_back(static_cast<double>(
        std::count_if(exits.begin(), exits.end(), [&](uint64_t exit) { return static_cast<double>(exit) > end; })));
    if (inline_order) {
      const auto starts_fill = g.read(fill_starts, static_cast<size_t>(launched));
      const double begin_ns = end - static_cast<double>(kBubbleNs);  // the wait kernel spins kBubbleNs
      first_fill_start.push_back((static_cast<double>(*std::min_element(starts_fill.begin(), starts_fill.end())) -
                                  begin_ns) / 1000.0);
    }
    main_delay.push_back((last_start - end) / 1000.0);
    state.SetIterationTime(std::max(0.0, last_start - end) / 1e9);
  }
  (void)g.device->destroy_event(begin);
  if (gate_latency.empty()) return;
  state.counters["fill_resident_at_end"] = median(resident_at_end);
  if (!first_fill_start.empty()) state.counters["first_fill_start_us"] = median(first_fill_start);
  state.counters["gate_latency_us"] = median(gate_latency);
  state.counters["main_start_delay_us"] = median(main_delay);
  state.counters["fill_blocks"] = grid;
  state.SetLabel(variant == GatedPartition ? g.partition.mode : kNames[variant]);
  results()[std::string("gate_latency/") + kNames[variant]] = median(gate_latency);
  results()[std::string("main_start_delay/") + kNames[variant]] = median(main_delay);
}
BENCHMARK(BM_Drain)
    ->ArgName("variant")
    ->DenseRange(NaiveLongKernel, GatedPartitionInline)
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void summary() {
  print_ratio("bubble end -> main owns all SMs (us), long kernel", "main_start_delay/naive_long_kernel",
              "main_start_delay/gated_partition");
  print_ratio("bubble end -> main owns all SMs (us), sized", "main_start_delay/naive_sized_to_bubble",
              "main_start_delay/gated_partition");
  print_ratio("gate close -> last fill exit (us), long kernel", "gate_latency/naive_long_kernel",
              "gate_latency/gated_partition");
  print_ratio("gate close -> last fill exit (us), sized", "gate_latency/naive_sized_to_bubble",
              "gate_latency/gated_partition");
  print_ratio("main start: gate only vs gate+partition (us)", "main_start_delay/gated_all_sms",
              "main_start_delay/gated_partition");
  std::printf("partition: %s, %d fill SMs of %d (target: main owns its SMs <= 50 us after the bubble ends)\n",
              gpu().partition.mode.c_str(), gpu().partition.fill_sms, gpu().partition.total_sms);
}

}  // namespace
}  // namespace pipefill::cuda::bench

PIPEFILL_GPU_BENCHMARK_MAIN(pipefill::cuda::bench::summary)
