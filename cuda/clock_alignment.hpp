// Aligning one CUDA context's event clock to another's (per-context event mode, cuda_device_events.cpp):
// cudaEventElapsedTime pairs events of one context only, so fill-context events are timed against
// a fill-context reference event whose time on the primary clock must be found. Aligning each
// reference to the host clock separately (record, synchronize, read the host clock) adds each
// alignment's own host wake-up latency, so the two clocks differed by an unknown offset of tens of
// microseconds, biasing every late/overrun/filled figure that compares a fill time with a primary
// one (issue 24 item 8). A two-way exchange bounds it instead:
//
//   primary:  B1 -------------------------------------------> (waits for F2) B2
//   fill:         (waits for B1) F1 -- f1_to_f2 -- F2
//
// F1 cannot complete before B1, and B2 not before F2, so F1's primary time lies in
// [B1, B2 - f1_to_f2]; the middle is exact when the two cross-context waits take equally long and
// off by at most half the interval otherwise. No CUDA header: tested on CPU.
#pragma once

namespace pipefill::cuda {

struct ClockAlignment {
  double time_us = 0.0;         // F1 on the primary clock
  double uncertainty_us = 0.0;  // half the interval the exchange allows
};

// b1_us, b2_us: B1's and B2's primary-clock times; f1_to_f2_us: F2 - F1 on the second clock.
inline ClockAlignment align_second_clock(double b1_us, double b2_us, double f1_to_f2_us) {
  const double earliest = b1_us;
  const double latest = b2_us - f1_to_f2_us;
  // Float milliseconds of cudaEventElapsedTime round to ~0.5 us: a slightly inverted interval is
  // rounding, and B1 (the bound taken directly from a wait) is the one to trust.
  if (latest <= earliest) return {earliest, 0.0};
  return {0.5 * (earliest + latest), 0.5 * (latest - earliest)};
}

}  // namespace pipefill::cuda
