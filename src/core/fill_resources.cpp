#include "core/fill_resources.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "common/log.hpp"

namespace pipefill::core {
namespace {

// Fixed host-side cost of starting one slice on the fill stream, used by the planner.
constexpr double kCudaLaunchOverheadUs = 5.0;
constexpr double kSimLaunchOverheadUs = 0.0;
constexpr size_t kSimDefaultArenaBytes = size_t{1} << 30;

pfResult_t make_events(Device& device, std::vector<Event>* events, size_t count) {
  events->reserve(count);
  for (size_t i = 0; i < count; ++i) {
    Event e = nullptr;
    PF_TRY(device.create_event(&e));
    events->push_back(e);
  }
  return pfSuccess;
}

}  // namespace

size_t default_arena_bytes(pfBackend_t backend, size_t free_bytes, size_t total_bytes) {
  if (backend == pfBackendCuda) {
    // Leave the main job room to grow: 10% of the device or 1 GiB, whichever is larger.
    const size_t keep = std::max(total_bytes / 10, size_t{1} << 30);
    return free_bytes > keep ? free_bytes - keep : 0;
  }
  return std::min(kSimDefaultArenaBytes, free_bytes);
}

pfResult_t create_fill_resources(Device& device, RuntimeOptions* options, FillResources* out) {
  out->launch_overhead_us =
      options->backend == pfBackendSim ? kSimLaunchOverheadUs : kCudaLaunchOverheadUs;
  const int sms = device.sm_count();
  // Unset on CUDA: the device derives R from the main job's NCCL settings (NCCL_MAX_CTAS /
  // NCCL_MAX_NCHANNELS) rounded to the partition granularity (docs/cuda-backend.md). Unset on
  // the other devices: nothing reserved unless asked.
  int reserved = options->reserved_sms;
  if (reserved < 0 && options->backend != pfBackendCuda) reserved = 0;
  if (reserved >= sms) {
    return fail(pfErrorInvalidArgument,
                "reserved_sms = {} leaves no SM for fill work (the device has {} SMs)", reserved,
                sms);
  }
  PF_TRY(device.configure_partition(reserved, &out->partition));
  options->reserved_sms = out->partition.reserved_sms;
  PF_TRY(device.create_fill_stream(&out->fill_stream));

  PF_TRY(make_events(device, &out->bubble_begin_events, kBubbleEventSlots));
  PF_TRY(make_events(device, &out->bubble_end_events, kBubbleEventSlots));
  PF_TRY(make_events(device, &out->slice_start_events, kSliceEventSlots));
  PF_TRY(make_events(device, &out->slice_end_events, kSliceEventSlots));
  PF_TRY(device.allocate_words(1 + 2 * kMaxJobs, &out->words));
  PF_TRY(device.allocate_host_words(kSliceEventSlots, &out->host_words));

  size_t arena_bytes = options->arena_bytes;
  if (arena_bytes == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    PF_TRY(device.memory_info(&free_bytes, &total_bytes));
    arena_bytes = default_arena_bytes(options->backend, free_bytes, total_bytes);
  }
  if (arena_bytes > 0) PF_TRY(device.allocate_arena(arena_bytes, &out->arena_base));
  options->arena_bytes = arena_bytes;
  out->arena_bytes = arena_bytes;
  return pfSuccess;
}

void release_fill_resources(Device& device, FillResources* r) {
  const std::string saved = last_error_message();
  auto check = [](pfResult_t result, const char* what) {
    if (result != pfSuccess) {
      log::warn("runtime teardown: {} failed: {}", what, last_error_message());
    }
  };
  // Fill work still queued may reference the words and the arena: drain it first.
  if (r->fill_stream != nullptr) check(device.synchronize_stream(r->fill_stream), "fill sync");
  for (auto* events : {&r->bubble_begin_events, &r->bubble_end_events, &r->slice_start_events,
                       &r->slice_end_events}) {
    for (Event e : *events) check(device.destroy_event(e), "destroy_event");
    events->clear();
  }
  if (r->words != nullptr) check(device.free_words(r->words), "free_words");
  if (r->host_words != nullptr) check(device.free_host_words(r->host_words), "free_host_words");
  if (r->arena_base != nullptr) check(device.free_arena(r->arena_base), "free_arena");
  if (r->fill_stream != nullptr) {
    check(device.destroy_stream(r->fill_stream), "destroy fill stream");
  }
  r->words = nullptr;
  r->host_words = nullptr;
  r->arena_base = nullptr;
  r->fill_stream = nullptr;
  if (!saved.empty()) set_error(pfErrorInternal, saved);  // keep the caller's message
}

}  // namespace pipefill::core
