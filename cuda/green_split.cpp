// The fill partition's green context by SM count, with refused sizes retried smaller (green_split.hpp).
#include "green_split.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "common/log.hpp"
#include "cuda_check.hpp"
#include "partition.hpp"

namespace pipefill::cuda {
namespace {

// Hopper's documented green-context granularity (cuda.h, CUdevSmResource: groups of 8 SMs on 9.0+).
constexpr int kRetryStep = 8;

enum class Attempt { Created, Refused, Failed };

// A descriptor and green context for `group`; Refused on INVALID_RESOURCE_CONFIGURATION, Failed
// (with the error recorded) on any other error.
Attempt make_green_context(const DriverApi& api, CUdevice device, CUdevResource* group, CUgreenCtx* out,
                           CUdevResourceDesc* desc) {
  CUresult result = api.dev_resource_generate_desc(desc, group, 1);
  if (result == CUDA_SUCCESS) result = api.green_ctx_create(out, *desc, device, CU_GREEN_CTX_DEFAULT_STREAM);
  if (result == CUDA_SUCCESS) return Attempt::Created;
  if (result == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION) return Attempt::Refused;
  driver_failure(result, "cuDevResourceGenerateDesc/cuGreenCtxCreate(fill group)", __FILE__, __LINE__);
  return Attempt::Failed;
}

void accept(GreenSplit* out, CUgreenCtx context, CUdevResourceDesc desc, int fill_sms) {
  out->context = context;
  out->desc = desc;
  out->fill_sms = fill_sms;
  out->reserved_sms = out->total_sms - fill_sms;
}

}  // namespace

int next_green_size_after_refusal(int refused, int min_partition, int alignment) {
  const int step = std::max(kRetryStep, alignment);
  const int next = ((refused - 1) / step) * step;
  return next >= std::max(kRetryStep, min_partition) ? next : 0;
}

pfResult_t create_green_split(const DriverApi& api, CUdevice device, int reserved_sms, GreenSplit* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "create_green_split: out is null");
  if (!api.has_green_contexts())
    return fail(pfErrorNotSupported, "create_green_split: the driver lacks {}",
                api.missing_entry_points(EntryPointGroup::GreenContext));
  *out = GreenSplit{};
  CUdevResource sms{};
  PF_DRIVER_CHECK(api.device_get_dev_resource(device, &sms, CU_DEV_RESOURCE_TYPE_SM));
  const SmGranularity granularity{static_cast<int>(sms.sm.minSmPartitionSize),
                                  static_cast<int>(sms.sm.smCoscheduledAlignment)};
  const int total = static_cast<int>(sms.sm.smCount);
  out->total_sms = total;
  int want = plan_fill_sms(total, reserved_sms, granularity);
  log::debug("SM resource: {} SMs, min partition {}, alignment {}; want {} fill SMs", total,
             granularity.min_partition, granularity.alignment, want);
  // A split call may itself refuse a size: Refused like a refused context.
  const auto split = [&](unsigned min_count, CUdevResource* group, CUdevResource* rest, unsigned* groups) {
    const CUresult result = api.dev_sm_resource_split_by_count(group, groups, &sms, rest, 0, min_count);
    if (result == CUDA_SUCCESS) return Attempt::Created;
    if (result == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION) return Attempt::Refused;
    driver_failure(result, "cuDevSmResourceSplitByCount", __FILE__, __LINE__);
    return Attempt::Failed;
  };
  if (reserved_sms > 0 && want > 0) {
    // The main job's SMs first, fill work on the remainder: the same split by count that
    // torch's GreenContext.create(num_sms=R) makes (docs/pytorch-graph-jobs.md, "Torch green
    // contexts"),
    // so a main job confined to such a context and the fill partition never share an SM.
    CUdevResource main_group{}, rest{};
    unsigned groups = 1;
    Attempt attempt = split(static_cast<unsigned>(reserved_sms), &main_group, &rest, &groups);
    if (attempt == Attempt::Failed) return pfErrorCudaFailure;
    const int got = static_cast<int>(rest.sm.smCount);
    if (attempt == Attempt::Created && groups == 1 && got >= granularity.min_partition && total - got >= reserved_sms) {
      CUgreenCtx green = nullptr;
      CUdevResourceDesc desc = nullptr;
      attempt = make_green_context(api, device, &rest, &green, &desc);
      if (attempt == Attempt::Failed) return pfErrorCudaFailure;
      if (attempt == Attempt::Created) {
        accept(out, green, desc, got);
        return pfSuccess;
      }
      out->refused_sizes.push_back(got);
      want = std::min(want, next_green_size_after_refusal(got, granularity.min_partition, granularity.alignment));
    } else {
      log::debug("the remainder of a {}-SM main group has {} SMs: splitting the fill group off instead",
                 reserved_sms, got);
    }
  }
  // The split rounds its minimum count up; step down until the group leaves R SMs free.
  while (want > 0) {
    CUdevResource group{}, rest{};
    unsigned groups = 1;
    Attempt attempt = split(static_cast<unsigned>(want), &group, &rest, &groups);
    if (attempt == Attempt::Failed) return pfErrorCudaFailure;
    const int got = attempt == Attempt::Created && groups == 1 ? static_cast<int>(group.sm.smCount) : 0;
    int refused = attempt == Attempt::Refused ? want : 0;
    if (got > 0 && total - got >= reserved_sms) {
      CUgreenCtx green = nullptr;
      CUdevResourceDesc desc = nullptr;
      attempt = make_green_context(api, device, &group, &green, &desc);
      if (attempt == Attempt::Failed) return pfErrorCudaFailure;
      if (attempt == Attempt::Created) {
        accept(out, green, desc, got);
        return pfSuccess;
      }
      refused = got;
    }
    if (refused > 0) {
      out->refused_sizes.push_back(refused);
      want = std::min(want - 1, next_green_size_after_refusal(refused, granularity.min_partition,
                                                              granularity.alignment));
      continue;
    }
    want -= granularity.alignment > 0 ? granularity.alignment : 1;
    if (want < granularity.min_partition) break;
  }
  std::string refused;
  for (int size : out->refused_sizes) refused += (refused.empty() ? "" : ", ") + std::to_string(size);
  out->why_not = fmt::format("no SM split of {} SMs (min partition {}, alignment {}) leaves {} SMs reserved{}",
                             total, granularity.min_partition, granularity.alignment, reserved_sms,
                             refused.empty() ? "" : "; sizes refused with CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION: " + refused);
  return pfSuccess;
}

}  // namespace pipefill::cuda
