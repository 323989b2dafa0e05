#include "fallbacks.hpp"

#include <fmt/format.h>

#include "driver_api.hpp"

namespace pipefill::cuda {

const char* fallback_cause_name(FallbackCause cause) {
  switch (cause) {
    case FallbackCause::None: return "none";
    case FallbackCause::NoDriver: return "no CUDA driver";
    case FallbackCause::DriverTooOld: return "driver older than 12.5";
    case FallbackCause::EntryPointsMissing: return "green-context entry points missing";
    case FallbackCause::DisabledByEnv: return "disabled by PIPEFILL_GREEN_CONTEXT=0";
    case FallbackCause::NoUsefulSplit: return "no SM split leaves the reserved SMs free";
    case FallbackCause::DriverCallFailed: return "a green-context driver call failed";
    case FallbackCause::StreamCreationFailed: return "green-context stream creation failed";
    case FallbackCause::WarmUpFailed: return "fill-kernel warm-up on the green-context stream failed";
    case FallbackCause::EventSelfTestFailed: return "cross-context event self-test failed";
    case FallbackCause::MemoryOpsSelfTestFailed: return "fill-stream memory-operation self-test failed";
  }
  return "unknown";
}

bool fallback_is_explained(int driver_version, const PartitionOutcome& outcome) {
  const bool new_driver = driver_version >= kGreenContextDriverVersion;
  switch (outcome.cause) {
    case FallbackCause::None:
    case FallbackCause::DisabledByEnv:
      return true;
    case FallbackCause::NoDriver:
      return driver_version == 0;
    case FallbackCause::DriverTooOld:
      return driver_version > 0 && !new_driver;
    case FallbackCause::EntryPointsMissing:
      return !new_driver;
    case FallbackCause::NoUsefulSplit:
    case FallbackCause::DriverCallFailed:
    case FallbackCause::StreamCreationFailed:
    case FallbackCause::WarmUpFailed:
    case FallbackCause::EventSelfTestFailed:
    case FallbackCause::MemoryOpsSelfTestFailed:
      return !outcome.detail.empty();
  }
  return false;
}

std::string describe(const PartitionOutcome& outcome) {
  if (outcome.cause == FallbackCause::None)
    return outcome.detail.empty() ? "green context" : "green context (" + outcome.detail + ")";
  return fmt::format("grid cap: {}{}{}", fallback_cause_name(outcome.cause),
                     outcome.detail.empty() ? "" : ": ", outcome.detail);
}

std::string event_self_test_failure(const EventSelfTest& test) {
  for (const std::string* error : {&test.create_error, &test.wait_error, &test.record_error,
                                   &test.sync_error, &test.elapsed_error})
    if (!error->empty()) return *error;
  if (!(test.elapsed_ms >= 0.9 * test.kernel_ms))  // also catches NaN
    return fmt::format(
        "the fill-side event completed {:.3f} ms after the main-side start, before the {:.3f} ms "
        "main kernel it waited for had ended (cross-context wait or timing is wrong)",
        test.elapsed_ms, test.kernel_ms);
  return "";
}

MemoryOpsVerdict judge_memory_ops(const MemoryOpsSelfTest& test) {
  MemoryOpsVerdict verdict;
  if (!test.readback_error.empty() || !test.readback_landed) {
    verdict.detail = fmt::format(
        "the cursor read-back on the fill stream {}",
        test.readback_error.empty() ? "did not land (the host word kept its old value)" : "failed: " + test.readback_error);
    return verdict;
  }
  const std::string stream_write_problem =
      !test.stream_write_error.empty() ? test.stream_write_error
      : !test.stream_write_landed      ? "cuStreamWriteValue64 on the fill stream did not land"
                                       : "";
  if (test.stream_write_tried && stream_write_problem.empty()) {
    verdict.usable = true;
    verdict.stream_write = true;
    return verdict;
  }
  if (test.pinned_copy_error.empty() && test.pinned_copy_landed) {
    verdict.usable = true;
    if (test.stream_write_tried)
      verdict.detail = stream_write_problem + ": word writes copy from pinned slots";
    return verdict;
  }
  verdict.detail = fmt::format(
      "no word write works on the fill stream ({}{}{})",
      test.stream_write_tried ? stream_write_problem : std::string("cuStreamWriteValue64 not in use"), "; ",
      test.pinned_copy_error.empty() ? std::string("the pinned-slot copy did not land") : test.pinned_copy_error);
  return verdict;
}

}  // namespace pipefill::cuda
