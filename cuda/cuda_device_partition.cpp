// The CUDA device's SM partition: a green context holding all SMs but R (R from config or NCCL's
// environment, rounded to the driver's granularity) with its first fill stream tested, or, when
// any step fails, grid-cap mode with the cause (fallbacks.hpp).
#include "cuda_device_impl.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "fill_kernels.hpp"
#include "green_split.hpp"
#include "partition.hpp"

namespace pipefill::cuda {

pfResult_t CudaDevice::configure_partition(int reserved_sms, FillPartition* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "configure_partition: partition is null");
  std::string source = "config";
  if (reserved_sms < 0) PF_TRY(reserved_sms_from_nccl_env(process_env(), &reserved_sms, &source));
  if (reserved_sms >= sm_count_ && source != "config") {
    log::warn("reserved SMs from {} ({}) leave no SM of {} for fill work; capping at {}", source,
              reserved_sms, sm_count_, sm_count_ - 1);
    reserved_sms = sm_count_ - 1;
  }
  PF_TRY(check_reserved_sms(reserved_sms, sm_count_));
  std::lock_guard lock(mutex_);
  if (partition_configured_) {
    if (partition_.reserved_sms >= reserved_sms || !fill_streams_.empty()) {
      *out = partition_;
      if (partition_.reserved_sms < reserved_sms)
        return fail(pfErrorInvalidState,
                    "configure_partition: fill streams already exist with {} reserved SMs; cannot raise to {}",
                    partition_.reserved_sms, reserved_sms);
      return pfSuccess;
    }
  }
  // Once per partition made (not on the calls that return the existing one).
  if (const std::string warning = nccl_reservation_warning(process_env(), reserved_sms, source); !warning.empty())
    log::warn("{}", warning);
  PF_DEVICE_CONTEXT(ContextNeed::Primary);
  destroy_green_context();  // re-partitioning before any fill stream exists
  FillPartition partition;
  partition.total_sms = sm_count_;
  PartitionOutcome outcome;
  try_green_context(reserved_sms, &partition, &outcome);
  if (outcome.cause != FallbackCause::None) {
    partition = FillPartition{};
    partition.total_sms = sm_count_;
    partition.mode = "grid-cap";
    partition.reserved_sms = reserved_sms;
    partition.fill_sms = sm_count_ - reserved_sms;
    log::info("fill partition: grid-cap mode, fill grids capped at {} of {} SMs (R={} from {}); {}",
              partition.fill_sms, sm_count_, reserved_sms, source, describe(outcome));
    if (!fallback_is_explained(driver_api().driver_version, outcome))
      log::warn("grid-cap mode on driver {} without an explained fallback ({}): this is a bug",
                driver_api().driver_version, describe(outcome));
  } else {
    log::info("fill partition: green-context mode, fill work confined to {} of {} SMs (R={} from {}, "
              "rounded to {}); events: {}",
              partition.fill_sms, sm_count_, reserved_sms, source, partition.reserved_sms, outcome.detail);
  }
  if (single_connection_)
    log::warn("CUDA_DEVICE_MAX_CONNECTIONS=1 in {} mode: fill and main work may share one hardware "
              "queue, so a fill slice enqueued after the main stream's wait would start only once "
              "the gate is closed; the auto launch mode enqueues slices inline in pfBubbleBegin "
              "(see docs/cuda-backend-fill.md, \"One device connection\")",
              partition.mode);
  partition_ = partition;
  outcome_ = outcome;
  clusters_ = measure_cluster_occupancy(spare_fill_stream_ != nullptr ? spare_fill_stream_ : control_stream_);
  partition_configured_ = true;
  *out = partition;
  return pfSuccess;
}

bool CudaDevice::partition_configured() const {
  std::lock_guard lock(mutex_);
  return partition_configured_;
}

// Sets up the green-context partition: a green context holding all SMs but R (R rounded up to
// the partition granularity), its first fill stream with the fill kernels warmed up on it, and
// the cross-context event self-test. On any failure it destroys what it made and *outcome says
// why; the caller then uses grid-cap mode. The tested stream is kept for create_fill_stream.
void CudaDevice::try_green_context(int reserved_sms, FillPartition* partition, PartitionOutcome* outcome) {
  const auto& api = driver_api();
  if (env_off("PIPEFILL_GREEN_CONTEXT")) {
    *outcome = {FallbackCause::DisabledByEnv, ""};
    return;
  }
  if (api.driver_version == 0) {
    *outcome = {FallbackCause::NoDriver, ""};
    return;
  }
  if (api.driver_version < kGreenContextDriverVersion) {
    *outcome = {FallbackCause::DriverTooOld, fmt::format("driver {}", api.driver_version)};
    return;
  }
  if (!api.has_green_contexts()) {
    *outcome = {FallbackCause::EntryPointsMissing,
                fmt::format("driver {} lacks {}", api.driver_version,
                            api.missing_entry_points(EntryPointGroup::GreenContext))};
    return;
  }
  std::string why_no_split;
  if (create_green_context(reserved_sms, partition, &why_no_split) != pfSuccess) {
    *outcome = {FallbackCause::DriverCallFailed, last_error_message()};
    clear_last_error();
    destroy_green_context();
    return;
  }
  if (green_context_ == nullptr) {
    *outcome = {FallbackCause::NoUsefulSplit, why_no_split};
    return;
  }
  CUstream raw = nullptr;
  const CUresult created =
      api.green_ctx_stream_create(&raw, green_context_, CU_STREAM_NON_BLOCKING, lowest_priority_);
  if (created != CUDA_SUCCESS) {
    *outcome = {FallbackCause::StreamCreationFailed,
                fmt::format("cuGreenCtxStreamCreate: {}", driver_result_name(created))};
    destroy_green_context();
    return;
  }
  spare_fill_stream_ = reinterpret_cast<cudaStream_t>(raw);
  if (warm_up_fill_kernels(spare_fill_stream_) != pfSuccess) {
    *outcome = {FallbackCause::WarmUpFailed, last_error_message()};
    clear_last_error();
    destroy_green_context();
    return;
  }
  const MemoryOpsVerdict memory = judge_memory_ops(run_memory_ops_self_test(spare_fill_stream_));
  if (!memory.usable) {
    *outcome = {FallbackCause::MemoryOpsSelfTestFailed, memory.detail};
    destroy_green_context();
    return;
  }
  // Applied once the green context is accepted (grid-cap mode keeps the control stream's test):
  // one write mode for every stream, the pinned copy working on the main streams as well.
  const auto accept_word_writes = [&] {
    if (gate_mode_ != GateWriteMode::StreamWriteValue || memory.stream_write) return;
    gate_mode_ = GateWriteMode::PinnedCopy;
    log::info("word writes on every stream copy from pinned slots: {}", memory.detail);
  };
  const EventSelfTest test = run_event_self_test(spare_fill_stream_);
  if (std::string failure = event_self_test_failure(test); !failure.empty()) {
    // Primary-context events on green streams fail: per-context event pools, if they work.
    const EventSelfTest own = run_per_context_event_self_test(spare_fill_stream_);
    std::string own_failure = event_self_test_failure(own);
    if (own_failure.empty() && enable_per_context_events() != pfSuccess) {
      own_failure = last_error_message();
      clear_last_error();
    }
    if (!own_failure.empty()) {
      *outcome = {FallbackCause::EventSelfTestFailed,
                  fmt::format("primary-context events on the green-context stream: {}; per-context "
                              "events: {}",
                              failure, own_failure)};
      destroy_green_context();
      return;
    }
    *outcome = {FallbackCause::None,
                fmt::format("per-context event pools: fill-stream records use events of the green "
                            "context, timed against a green-context reference (primary-context events "
                            "on the green-context stream failed: {}; per-context self-test: fill-side "
                            "event {:.3f} ms after its start, main kernel {:.3f} ms)",
                            failure, own.elapsed_ms, own.kernel_ms)};
    accept_word_writes();
    return;
  }
  accept_word_writes();
  *outcome = {FallbackCause::None,
              fmt::format("primary-context events on green-context streams (self-test: fill-side event "
                          "{:.3f} ms after the main-side start, main kernel {:.3f} ms)",
                          test.elapsed_ms, test.kernel_ms)};
}

// The green context itself. Leaves green_context_ null (and explains in *why_not) when no
// split leaves R SMs; a failing driver call returns its error.
pfResult_t CudaDevice::create_green_context(int reserved_sms, FillPartition* partition, std::string* why_not) {
  GreenSplit split;
  PF_TRY(create_green_split(driver_api(), cu_device_, reserved_sms, &split));
  if (!split.refused_sizes.empty()) {
    std::string refused;
    for (int size : split.refused_sizes) refused += (refused.empty() ? "" : ", ") + std::to_string(size);
    log::warn("the driver refused green contexts of {} SMs (CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION); {}",
              refused,
              split.context != nullptr ? fmt::format("the fill partition has {} SMs", split.fill_sms)
                                       : std::string("no smaller size was accepted"));
  }
  if (split.context == nullptr) {
    *why_not = split.why_not;
    return pfSuccess;
  }
  green_context_ = split.context;
  green_desc_ = split.desc;
  partition->hardware_confined = true;
  partition->mode = "green-context";
  partition->fill_sms = split.fill_sms;
  partition->reserved_sms = split.reserved_sms;
  return pfSuccess;
}

// Destroys the spare fill stream and the green context (no fill stream may exist). Caller
// holds mutex_ or is the only thread using the device.
void CudaDevice::destroy_green_context() {
  disable_per_context_events();
  if (spare_fill_stream_ != nullptr) {
    if (cudaStreamDestroy(spare_fill_stream_) != cudaSuccess) (void)cudaGetLastError();
    spare_fill_stream_ = nullptr;
  }
  if (green_context_ != nullptr) {
    const CUresult result = driver_api().green_ctx_destroy(green_context_);
    if (result != CUDA_SUCCESS) log::warn("cuGreenCtxDestroy failed: {}", driver_result_name(result));
    green_context_ = nullptr;
  }
}

// Clusters of 2 blocks (the smallest cluster: a GPC split by a green context shows first there)
// on the fill partition's stream and on the control stream (the whole device). Failures are
// logged, never fatal: the figure is a report.
ClusterOccupancy CudaDevice::measure_cluster_occupancy(cudaStream_t fill) const {
  ClusterOccupancy occupancy;
  occupancy.cluster_size = 2;
  if (max_active_clusters(fill, occupancy.cluster_size, &occupancy.fill_partition) != pfSuccess ||
      max_active_clusters(control_stream_, occupancy.cluster_size, &occupancy.device) != pfSuccess) {
    log::warn("cluster occupancy unavailable: {}", last_error_message());
    clear_last_error();
    return occupancy;
  }
  log::info("cluster occupancy: {} clusters of {} blocks on the fill partition, {} on the whole device",
            occupancy.fill_partition, occupancy.cluster_size, occupancy.device);
  return occupancy;
}

}  // namespace pipefill::cuda
