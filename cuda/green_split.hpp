// The green context of the fill partition: the device's SMs split so that at least R stay free of
// fill work, through the driver table (so a CPU test can drive it with a fake driver).
//
// Sizes come from the driver's SM granularity (cuDeviceGetDevResource: minimum partition,
// co-scheduling alignment). A driver may still refuse a split, descriptor or green context of a
// size it reported as valid with CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION (a GPC layout that
// cannot host that group, say): that size is recorded and the next smaller valid size is tried
// (multiples of 8 SMs, at least 8 - Hopper's documented granularity - or the driver's own, when
// coarser) instead of abandoning green contexts for grid-cap mode (issue 33 item 6). Any other
// driver error ends the attempt with that error.
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

#include "driver_api.hpp"
#include "pipefill/pipefill.h"

namespace pipefill::cuda {

struct GreenSplit {
  CUgreenCtx context = nullptr;  // null: no size leaves R SMs (why_not says why)
  CUdevResourceDesc desc = nullptr;  // its resources: more green contexts on the same SMs (captures)
  int total_sms = 0;
  int fill_sms = 0;              // SMs of the green context
  int reserved_sms = 0;          // total - fill_sms (>= the R asked for)
  std::vector<int> refused_sizes;  // fill sizes refused with INVALID_RESOURCE_CONFIGURATION, in order
  std::string why_not;
};

// The first size the driver accepts, trying the main group first (R split off, fill work on the
// remainder, as torch's GreenContext.create(num_sms=R) splits), then fill groups from the largest
// that leaves R SMs downwards. A failed call leaves *out without a context (nothing to destroy).
pfResult_t create_green_split(const DriverApi& api, CUdevice device, int reserved_sms, GreenSplit* out);

// The next fill size to try after `refused` SMs were refused: the largest multiple of
// max(8, alignment) below it; 0 when that is below max(8, min_partition).
int next_green_size_after_refusal(int refused, int min_partition, int alignment);

}  // namespace pipefill::cuda
