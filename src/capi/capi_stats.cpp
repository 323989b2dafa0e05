// The C boundary's statistics, traces and observers: pfRuntimeGetStats(V2), skip counts, class
// statistics and margins, memory information, fill streams, pfTraceWrite and the slice observer.
// Same rules as capi.cpp: every call guarded, handles looked up, nothing thrown across.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "capi/capi_guard.hpp"
#include "common/error.hpp"
#include "core/handles.hpp"
#include "core/runtime.hpp"

using pipefill::fail;
using pipefill::capi::check_plausible_size;
using pipefill::capi::guarded;
using pipefill::core::RuntimeRef;

extern "C" {

PF_API pfResult_t pfRuntimeGetStats(pfRuntime_t runtime, pfStats_t* stats) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetStats", &rt));
    if (stats == nullptr) return fail(pfErrorInvalidArgument, "pfRuntimeGetStats: stats is NULL");
    pfStats_t all{};
    PF_TRY(rt->get_stats(&all));
    std::memcpy(stats, &all, PF_STATS_V1_SIZE);  // a 0.1 caller's struct ends there
    return pfSuccess;
  });
}

PF_API pfResult_t pfRuntimeGetStatsV2(pfRuntime_t runtime, pfStats_t* stats, size_t stats_size) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetStatsV2", &rt));
    if (stats == nullptr) {
      return fail(pfErrorInvalidArgument, "pfRuntimeGetStatsV2: stats is NULL");
    }
    if (stats_size < PF_STATS_V1_SIZE) {
      return fail(pfErrorInvalidArgument,
                  "pfRuntimeGetStatsV2: stats_size = {} is below the smallest layout ({} bytes)",
                  stats_size, PF_STATS_V1_SIZE);
    }
    PF_TRY(check_plausible_size("pfRuntimeGetStatsV2: stats_size", stats_size));
    pfStats_t all{};
    PF_TRY(rt->get_stats(&all));
    const size_t known = std::min(stats_size, sizeof(pfStats_t));
    std::memcpy(stats, &all, known);
    // Fields of a newer header this library does not know read 0.
    if (stats_size > known) std::memset(reinterpret_cast<char*>(stats) + known, 0, stats_size - known);
    return pfSuccess;
  });
}

PF_API pfResult_t pfRuntimeGetSkipCounts(pfRuntime_t runtime, uint64_t* counts, size_t count) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetSkipCounts", &rt));
    if (counts == nullptr || count == 0) {
      return fail(pfErrorInvalidArgument, "pfRuntimeGetSkipCounts: counts is NULL or count is 0");
    }
    if (count > PF_MAX_STRUCT_SIZE / sizeof(uint64_t)) {
      return fail(pfErrorInvalidArgument,
                  "pfRuntimeGetSkipCounts: count = {} is implausible (the library knows {} causes; "
                  "at most {} entries are accepted)",
                  count, PF_SKIP_CAUSE_COUNT, PF_MAX_STRUCT_SIZE / sizeof(uint64_t));
    }
    const auto all = rt->skip_counts();
    const size_t known = std::min(count, all.size());
    std::copy_n(all.begin(), known, counts);
    std::fill(counts + known, counts + count, uint64_t{0});  // causes of a newer header read 0
    return pfSuccess;
  });
}

PF_API pfResult_t pfRuntimeGetClassCount(pfRuntime_t runtime, size_t* count) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetClassCount", &rt));
    if (count == nullptr) return fail(pfErrorInvalidArgument, "pfRuntimeGetClassCount: count is NULL");
    *count = rt->class_count();
    return pfSuccess;
  });
}

PF_API pfResult_t pfRuntimeGetClassStats(pfRuntime_t runtime, size_t index, pfClassStats_t* stats) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetClassStats", &rt));
    if (stats == nullptr) return fail(pfErrorInvalidArgument, "pfRuntimeGetClassStats: stats is NULL");
    const size_t size = stats->size;
    if (size < PF_CLASS_STATS_V1_SIZE) {
      return fail(pfErrorInvalidArgument,
                  "pfRuntimeGetClassStats: stats->size = {} is below the first layout ({} bytes); "
                  "set it to sizeof(pfClassStats_t)",
                  size, PF_CLASS_STATS_V1_SIZE);
    }
    PF_TRY(check_plausible_size("pfRuntimeGetClassStats: stats->size", size));
    pfClassStats_t one{};
    if (!rt->class_stats(index, &one)) {
      return fail(pfErrorInvalidArgument,
                  "pfRuntimeGetClassStats: index {} is not below the class count {}", index,
                  rt->class_count());
    }
    // A caller of the first layout gets that layout's bytes (and its size) only.
    const size_t known = std::min(size, sizeof one);
    one.size = known;
    std::memcpy(stats, &one, known);
    // Fields of a newer header this library does not know read 0.
    if (size > known) std::memset(reinterpret_cast<char*>(stats) + known, 0, size - known);
    return pfSuccess;
  });
}

PF_API pfResult_t pfRuntimeSetClassMargin(pfRuntime_t runtime, const char* class_key,
                                          double margin_us) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeSetClassMargin", &rt));
    if (class_key == nullptr || *class_key == '\0')
      return fail(pfErrorInvalidArgument, "pfRuntimeSetClassMargin: class_key is NULL or empty");
    if (!std::isfinite(margin_us))
      return fail(pfErrorInvalidArgument, "pfRuntimeSetClassMargin: margin_us = {} is not finite",
                  margin_us);
    rt->set_class_margin(class_key, margin_us);
    return pfSuccess;
  });
}

PF_API pfResult_t pfRuntimeGetMemoryInfo(pfRuntime_t runtime, pfMemoryInfo_t* info) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetMemoryInfo", &rt));
    if (info == nullptr) return fail(pfErrorInvalidArgument, "pfRuntimeGetMemoryInfo: info is NULL");
    const size_t size = info->size;
    if (size < sizeof(pfMemoryInfo_t)) {
      return fail(pfErrorInvalidArgument,
                  "pfRuntimeGetMemoryInfo: info->size = {} is below the first layout ({} bytes); "
                  "set it to sizeof(pfMemoryInfo_t)",
                  size, sizeof(pfMemoryInfo_t));
    }
    PF_TRY(check_plausible_size("pfRuntimeGetMemoryInfo: info->size", size));
    pfMemoryInfo_t one{};
    PF_TRY(rt->memory_info(&one));
    std::memcpy(info, &one, sizeof one);
    // Fields of a newer header this library does not know read 0.
    if (size > sizeof one) std::memset(reinterpret_cast<char*>(info) + sizeof one, 0, size - sizeof one);
    return pfSuccess;
  });
}

PF_API pfResult_t pfRuntimeGetFillStreams(pfRuntime_t runtime, void** streams, size_t capacity,
                                          size_t* count) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeGetFillStreams", &rt));
    if (count == nullptr) return fail(pfErrorInvalidArgument, "pfRuntimeGetFillStreams: count is NULL");
    if (streams == nullptr && capacity > 0) {
      return fail(pfErrorInvalidArgument,
                  "pfRuntimeGetFillStreams: streams is NULL with capacity {}", capacity);
    }
    const auto& fill = rt->fill_streams();
    std::copy_n(fill.begin(), std::min(capacity, fill.size()), streams);
    *count = fill.size();
    return pfSuccess;
  });
}

PF_API pfResult_t pfTraceWrite(pfRuntime_t runtime, const char* path) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfTraceWrite", &rt));
    if (path == nullptr || *path == '\0') {
      return fail(pfErrorInvalidArgument, "pfTraceWrite: path is NULL or empty");
    }
    return rt->write_trace(path);
  });
}

PF_API pfResult_t pfRuntimeSetSliceObserver(pfRuntime_t runtime, pfSliceObserverFn fn,
                                            void* user) {
  return guarded(__func__, [&] {
    RuntimeRef rt;
    PF_TRY(pipefill::core::acquire_runtime(runtime, "pfRuntimeSetSliceObserver", &rt));
    return rt->set_slice_observer(fn, user);
  });
}

}  // extern "C"
