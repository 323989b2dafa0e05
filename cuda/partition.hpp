// CPU-side logic of the SM reservation (no CUDA headers; unit-tested on machines without a GPU):
// how many SMs the main job keeps (R, following the NCCL settings) and how many a hardware
// partition (green context) can give fill work once R is rounded to the partition granularity.
#pragma once

#include <functional>
#include <string>

#include "pipefill/pipefill.h"

namespace pipefill::cuda {

// Reserved SMs when neither the config nor NCCL's environment says otherwise: NCCL's usual
// channel count for intra-node point-to-point on H100/H200 class GPUs is at most 16 CTAs.
inline constexpr int kDefaultReservedSms = 16;

using EnvLookup = std::function<const char*(const char*)>;
// The process environment (std::getenv).
EnvLookup process_env();

// R from NCCL's settings: NCCL_MAX_CTAS when set (NCCL >= 2.17), else NCCL_MAX_NCHANNELS (older
// name of the same cap), else kDefaultReservedSms. `source` says which one was used.
// A malformed or non-positive value is pfErrorInvalidArgument naming the variable and value.
pfResult_t reserved_sms_from_nccl_env(const EnvLookup& env, int* reserved, std::string* source);

// Partition granularity reported by the driver for the device's SM resource.
struct SmGranularity {
  int min_partition = 1;  // smallest group the split can create (minSmPartitionSize)
  int alignment = 1;      // groups are multiples of this (smCoscheduledAlignment)
};

// Why R SMs may be fewer than the CTAs of an NCCL collective that overlaps a bubble ("" when
// nothing suggests so; issue 33 item 6). NCCL picks its channel count - one CTA per channel - at
// communicator creation from the topology, up to 32 per collective (often 16-32 on an 8-GPU
// NVLink H100 node), bounded only by NCCL_MIN_CTAS/NCCL_MAX_CTAS (NCCL_MIN_NCHANNELS/
// NCCL_MAX_NCHANNELS). PipeFill cannot read the count a communicator chose, so it warns: when R
// is the default (16) with no NCCL bound set, or when NCCL is told to use more CTAs than R.
// CTAs beyond R then wait for SMs the fill partition holds (up to one fill item) - or, with the
// green context, run beside fill blocks on no SM of their own.
std::string nccl_reservation_warning(const EnvLookup& env, int reserved_sms, const std::string& source);

// SMs a hardware partition can give fill work while keeping at least `reserved` SMs for the main
// job: total - reserved rounded DOWN to the alignment (i.e. R rounded up). 0 when that leaves
// fewer SMs than the minimum partition (no useful partition). Inputs are validated by callers.
int plan_fill_sms(int total_sms, int reserved_sms, SmGranularity granularity);

// Most distinct SMs fill blocks of a green context with `fill_sms` SMs may be seen on: the CUDA
// driver documents (cuda.h, "Green Contexts") that on compute capability 9.x, once a module with
// dynamic parallelism is loaded, kernels in green contexts may also use a shared set of 2 extra
// SMs; elsewhere the partition is exact.
int max_observed_fill_sms(int fill_sms, int compute_capability_major);

// Validates a requested reservation against the device: 0 <= reserved < total_sms.
pfResult_t check_reserved_sms(int reserved_sms, int total_sms);

}  // namespace pipefill::cuda
