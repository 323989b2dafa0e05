#include "core/fill_resources.hpp"

#include <algorithm>
#include <map>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/mutex.hpp"

namespace pipefill::core {
namespace {

// Fixed host-side cost of starting one slice on the fill stream, used by the planner.
constexpr double kCudaLaunchOverheadUs = 5.0;
constexpr double kSimLaunchOverheadUs = 0.0;
constexpr size_t kOtherDefaultArenaBytes = size_t{1} << 30;
constexpr size_t kCudaDefaultArenaBytes = size_t{2} << 30;

// The fill partitions of devices shared by several runtimes (Device::shared_partition), so a
// second runtime keeps the first one's partition and the last one to go restores what was there.
struct SharedPartitions {
  struct Entry {
    int reserved = 0;           // in force, set by the first holder
    int original_reserved = 0;  // before the first holder
    int holders = 0;
  };
  Mutex mu;
  std::map<std::string, Entry> entries GUARDED_BY(mu);
};

SharedPartitions& shared_partitions() {
  static SharedPartitions* instance = new SharedPartitions();
  return *instance;
}

// Configures the partition; on a shared device, agrees with the runtimes already on it.
pfResult_t configure_partition(Device& device, int reserved, bool reserved_unset,
                               FillResources* out) {
  std::string key;
  int reserved_now = 0;
  if (!device.shared_partition(&key, &reserved_now)) {
    return device.configure_partition(reserved, &out->partition);
  }
  SharedPartitions& shared = shared_partitions();
  MutexLock lock(shared.mu);
  auto it = shared.entries.find(key);
  if (it != shared.entries.end()) {
    if (reserved_unset) {
      reserved = it->second.reserved;
    } else if (reserved != it->second.reserved) {
      return fail(pfErrorInvalidArgument,
                  "reserved_sms = {} differs from the {} SMs another runtime on {} reserves; the "
                  "runtimes of one device share its fill partition (leave reserved_sms unset to "
                  "take it)",
                  reserved, it->second.reserved, device.name());
    }
  }
  PF_TRY(device.configure_partition(reserved, &out->partition));
  if (it == shared.entries.end()) {
    it = shared.entries.emplace(key, SharedPartitions::Entry{}).first;
    it->second.original_reserved = reserved_now;
  }
  it->second.reserved = out->partition.reserved_sms;
  ++it->second.holders;
  out->shared_partition_key = key;
  return pfSuccess;
}

void release_partition(Device& device, FillResources* r) {
  if (r->shared_partition_key.empty()) return;
  SharedPartitions& shared = shared_partitions();
  MutexLock lock(shared.mu);
  const auto it = shared.entries.find(r->shared_partition_key);
  r->shared_partition_key.clear();
  if (it == shared.entries.end() || --it->second.holders > 0) return;
  // The last runtime on the device: leave it as it was before the first one came.
  FillPartition ignored;
  if (device.configure_partition(it->second.original_reserved, &ignored) != pfSuccess) {
    log::warn("runtime teardown: restoring the fill partition failed: {}", last_error_message());
  }
  shared.entries.erase(it);
}

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
  (void)total_bytes;
  if (backend == pfBackendCuda) return std::min(kCudaDefaultArenaBytes, free_bytes / 8);
  return std::min(kOtherDefaultArenaBytes, free_bytes);
}

pfResult_t create_fill_resources(Device& device, RuntimeOptions* options, FillResources* out) {
  out->launch_overhead_us =
      options->backend == pfBackendSim ? kSimLaunchOverheadUs : kCudaLaunchOverheadUs;
  const int sms = device.sm_count();
  // Unset on CUDA: the device derives R from the main job's NCCL settings (NCCL_MAX_CTAS /
  // NCCL_MAX_NCHANNELS) rounded to the partition granularity (docs/cuda-backend-fill.md). Unset
  // on the other devices: nothing reserved unless asked.
  const bool reserved_unset = options->reserved_sms < 0;
  int reserved = options->reserved_sms;
  if (reserved < 0 && options->backend != pfBackendCuda) reserved = 0;
  if (reserved >= sms) {
    // Named as the caller gave it (the variable or the field), not as the resolved number.
    return fail(pfErrorInvalidArgument, "{} leaves no SM for fill work (the {} has {} SMs)",
                options->reserved_sms_source.empty()
                    ? fmt::format("reserved_sms = {}", reserved)
                    : options->reserved_sms_source,
                device.name(), sms);
  }
  if (options->bubble_event_slots == 0 || options->slice_slots == 0) {
    return fail(pfErrorInvalidArgument, "event pools of {} bubble and {} slice slots are empty",
                options->bubble_event_slots, options->slice_slots);
  }
  PF_TRY(configure_partition(device, reserved, reserved_unset, out));
  options->reserved_sms = out->partition.reserved_sms;
  if (options->fill_streams < 1 || options->fill_streams > kMaxFillStreams) {
    return fail(pfErrorInvalidArgument, "fill_streams = {} is outside [1, {}]",
                options->fill_streams, kMaxFillStreams);
  }
  out->fill_streams.reserve(static_cast<size_t>(options->fill_streams));
  for (int i = 0; i < options->fill_streams; ++i) {
    Stream stream = nullptr;
    PF_TRY(device.create_fill_stream(&stream));
    out->fill_streams.push_back(stream);
  }

  PF_TRY(make_events(device, &out->bubble_begin_events, options->bubble_event_slots));
  PF_TRY(make_events(device, &out->bubble_end_events, options->bubble_event_slots));
  PF_TRY(make_events(device, &out->slice_start_events, options->slice_slots));
  PF_TRY(make_events(device, &out->slice_end_events, options->slice_slots));
  PF_TRY(device.allocate_words(1 + 2 * kMaxJobs, &out->words));
  PF_TRY(device.allocate_host_words(options->slice_slots, &out->host_words));

  size_t arena_bytes = options->arena_bytes;
  if (arena_bytes == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    PF_TRY(device.memory_info(&free_bytes, &total_bytes));
    arena_bytes = default_arena_bytes(options->backend, free_bytes, total_bytes);
  }
  if (arena_bytes > 0) {
    if (const pfResult_t r = device.allocate_arena(arena_bytes, &out->arena_base);
        r != pfSuccess) {
      const std::string source = options->arena_bytes_source.empty()
                                     ? fmt::format("the default fill arena ({} bytes)", arena_bytes)
                                     : fmt::format("{} ({} bytes)", options->arena_bytes_source,
                                                   arena_bytes);
      return fail(r, "{}: the fill arena cannot be reserved on the {}: {}", source, device.name(),
                  last_error_message());
    }
  }
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
  for (Stream stream : r->fill_streams) check(device.synchronize_stream(stream), "fill sync");
  for (auto* events : {&r->bubble_begin_events, &r->bubble_end_events, &r->slice_start_events,
                       &r->slice_end_events}) {
    for (Event e : *events) check(device.destroy_event(e), "destroy_event");
    events->clear();
  }
  if (r->words != nullptr) check(device.free_words(r->words), "free_words");
  if (r->host_words != nullptr) check(device.free_host_words(r->host_words), "free_host_words");
  if (r->arena_base != nullptr) check(device.free_arena(r->arena_base), "free_arena");
  for (Stream stream : r->fill_streams) {
    check(device.destroy_stream(stream), "destroy fill stream");
  }
  r->words = nullptr;
  r->host_words = nullptr;
  r->arena_base = nullptr;
  r->fill_streams.clear();
  release_partition(device, r);
  if (!saved.empty()) set_error(pfErrorInternal, saved);  // keep the caller's message
}

}  // namespace pipefill::core
