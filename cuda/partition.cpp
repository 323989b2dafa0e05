#include "partition.hpp"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "common/error.hpp"

namespace pipefill::cuda {

EnvLookup process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

namespace {

// Parses a strictly positive decimal integer (whole string, no sign, no spaces).
bool parse_positive_int(const char* text, int* out) {
  if (text == nullptr || *text == '\0') return false;
  const char* end = text + std::strlen(text);
  int value = 0;
  const auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end || value <= 0) return false;
  *out = value;
  return true;
}

}  // namespace

pfResult_t reserved_sms_from_nccl_env(const EnvLookup& env, int* reserved, std::string* source) {
  if (reserved == nullptr) return fail(pfErrorInvalidArgument, "reserved_sms_from_nccl_env: reserved is null");
  for (const char* name : {"NCCL_MAX_CTAS", "NCCL_MAX_NCHANNELS"}) {
    const char* text = env ? env(name) : nullptr;
    if (text == nullptr || *text == '\0') continue;
    int value = 0;
    if (!parse_positive_int(text, &value))
      return fail(pfErrorInvalidArgument, "{}='{}' is not a positive integer", name, text);
    *reserved = value;
    if (source) *source = name;
    return pfSuccess;
  }
  *reserved = kDefaultReservedSms;
  if (source) *source = "default";
  return pfSuccess;
}

std::string nccl_reservation_warning(const EnvLookup& env, int reserved_sms, const std::string& source) {
  const auto value_of = [&](const char* name) {
    const char* text = env ? env(name) : nullptr;
    int value = 0;
    return text != nullptr && parse_positive_int(text, &value) ? value : 0;
  };
  const char* advice = "set NCCL_MAX_CTAS to the CTAs collectives may use (PipeFill then reserves that many "
                       "SMs) or config.reserved_sms (PIPEFILL_RESERVED_SMS) to at least that count";
  for (const char* name : {"NCCL_MIN_CTAS", "NCCL_MIN_NCHANNELS", "NCCL_MAX_CTAS", "NCCL_MAX_NCHANNELS"}) {
    const int ctas = value_of(name);
    if (ctas > reserved_sms)
      return fmt::format("{}={} lets an NCCL collective launch {} CTAs, more than the {} SMs reserved for the "
                         "main job (from {}): collectives that overlap a bubble get fewer SMs than they "
                         "launch CTAs; {}",
                         name, ctas, ctas, reserved_sms, source, advice);
  }
  if (source == "default")
    return fmt::format("{} SMs reserved for the main job by default, with no NCCL_MAX_CTAS/NCCL_MAX_NCHANNELS "
                       "set: NCCL picks up to 32 CTAs per collective at communicator creation (often "
                       "16-32 on NVLink nodes), so collectives that overlap a bubble may launch more CTAs "
                       "than reserved SMs; {}",
                       reserved_sms, advice);
  return "";
}

int plan_fill_sms(int total_sms, int reserved_sms, SmGranularity granularity) {
  const int alignment = granularity.alignment > 0 ? granularity.alignment : 1;
  const int minimum = granularity.min_partition > 0 ? granularity.min_partition : 1;
  const int available = total_sms - reserved_sms;
  if (available <= 0) return 0;
  const int fill = available / alignment * alignment;
  return fill >= minimum ? fill : 0;
}

int max_observed_fill_sms(int fill_sms, int compute_capability_major) {
  return compute_capability_major == 9 ? fill_sms + 2 : fill_sms;
}

pfResult_t check_reserved_sms(int reserved_sms, int total_sms) {
  if (reserved_sms < 0 || reserved_sms >= total_sms)
    return fail(pfErrorInvalidArgument,
                "reserved_sms={} is out of range: the device has {} SMs (need 0 <= R < {})",
                reserved_sms, total_sms, total_sms);
  return pfSuccess;
}

}  // namespace pipefill::cuda
