#include "core/config.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <strings.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "core/scheduler.hpp"

namespace pipefill {
namespace {

// The size of each version's layout (index = version). Versions 1 and 2 have the same fields;
// version 2 changed the "unset" values. A later version appends fields: a caller built against
// an older header passes its smaller size, and the fields it lacks take their defaults.
// Version 3 appended fill_streams and launch_mode; version 4 gated_prediction_quantile and
// fill_optimizer_bubbles.
constexpr size_t kConfigSizeOfVersion2 = offsetof(pfConfig_t, fill_streams);
constexpr size_t kConfigSizeOfVersion3 = offsetof(pfConfig_t, gated_prediction_quantile);
constexpr size_t kConfigSizeOfVersion[] = {0, kConfigSizeOfVersion2, kConfigSizeOfVersion2,
                                           kConfigSizeOfVersion3, sizeof(pfConfig_t)};
static_assert(kConfigSizeOfVersion2 == PF_CONFIG_V2_SIZE && kConfigSizeOfVersion3 == PF_CONFIG_V3_SIZE);
static_assert(sizeof(kConfigSizeOfVersion) / sizeof(kConfigSizeOfVersion[0]) ==
              PF_CONFIG_VERSION + 1);
// Enough of any layout to read its size and version.
constexpr size_t kConfigHeaderBytes = offsetof(pfConfig_t, version) + sizeof(int);

// Version 1 marked unset fields with -1 / -1.0; map them to the current "unset" values.
void upgrade_version_1(pfConfig_t* c) {
  for (int* field : {&c->backend, &c->device, &c->stage_id, &c->stage_count, &c->reserved_sms,
                     &c->min_samples, &c->policy, &c->log_level, &c->enable_cupti,
                     &c->sim_sm_count}) {
    if (*field == -1) *field = PF_UNSET_INT;
  }
  for (double* field :
       {&c->safety_margin_us, &c->safety_margin_fraction, &c->prediction_quantile}) {
    if (*field == -1.0) *field = PF_UNSET_DOUBLE;
  }
}

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

bool parse_int(const char* text, long long* out) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_double(const char* text, double* out) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace

const char* backend_name(pfBackend_t backend) {
  switch (backend) {
    case pfBackendAuto: return "auto";
    case pfBackendCuda: return "cuda";
    case pfBackendSim: return "sim";
    case pfBackendHost: return "host";
  }
  return "unknown";
}

const char* launch_mode_name(pfLaunchMode_t mode) {
  switch (mode) {
    case pfLaunchAuto: return "auto";
    case pfLaunchExecutor: return "executor";
    case pfLaunchInline: return "inline";
  }
  return "unknown";
}

namespace {

bool parse_launch_mode(const char* text, pfLaunchMode_t* out) {
  if (strcasecmp(text, "auto") == 0) *out = pfLaunchAuto;
  else if (strcasecmp(text, "executor") == 0) *out = pfLaunchExecutor;
  else if (strcasecmp(text, "inline") == 0) *out = pfLaunchInline;
  else return false;
  return true;
}

bool parse_backend(const char* text, pfBackend_t* out) {
  if (strcasecmp(text, "auto") == 0) *out = pfBackendAuto;
  else if (strcasecmp(text, "cuda") == 0) *out = pfBackendCuda;
  else if (strcasecmp(text, "sim") == 0 || strcasecmp(text, "simulated") == 0) *out = pfBackendSim;
  else if (strcasecmp(text, "host") == 0) *out = pfBackendHost;
  else return false;
  return true;
}

// Integer field: config value when set, else the environment variable, else keep the default.
pfResult_t resolve_int(int config_value, const char* field, const char* var, int* target) {
  if (config_value != PF_UNSET_INT) {
    *target = config_value;
    return pfSuccess;
  }
  if (const char* text = env(var)) {
    long long v = 0;
    if (!parse_int(text, &v) || v < std::numeric_limits<int>::min() ||
        v > std::numeric_limits<int>::max()) {
      return fail(pfErrorInvalidArgument, "environment variable {}='{}' is not an integer (for {})",
                  var, text, field);
    }
    *target = static_cast<int>(v);
  }
  return pfSuccess;
}

pfResult_t resolve_double(double config_value, const char* field, const char* var,
                          double* target) {
  if (config_value != PF_UNSET_DOUBLE) {
    if (!std::isfinite(config_value)) {
      return fail(pfErrorInvalidArgument, "config.{} = {} is not a finite number", field,
                  config_value);
    }
    *target = config_value;
    return pfSuccess;
  }
  if (const char* text = env(var)) {
    double v = 0;
    if (!parse_double(text, &v)) {
      return fail(pfErrorInvalidArgument, "environment variable {}='{}' is not a number (for {})",
                  var, text, field);
    }
    *target = v;
  }
  return pfSuccess;
}

pfResult_t resolve_size(size_t config_value, const char* field, const char* var, size_t* target) {
  if (config_value != PF_UNSET_SIZE) {
    *target = config_value;
    return pfSuccess;
  }
  if (const char* text = env(var)) {
    size_t v = 0;
    if (!parse_size(text, &v)) {
      return fail(pfErrorInvalidArgument,
                  "environment variable {}='{}' is not a size (bytes, K/M/G suffix) (for {})", var,
                  text, field);
    }
    *target = v;
  }
  return pfSuccess;
}

// Names the source of a bad value: the config field when the caller set it, else the variable.
std::string source_of(bool from_config, const char* field, const char* var) {
  return from_config ? fmt::format("config.{}", field) : fmt::format("{} (or default)", var);
}

}  // namespace

int config_version_for_size(size_t bytes) {
  if (bytes >= sizeof(pfConfig_t)) return PF_CONFIG_VERSION;
  if (bytes >= kConfigSizeOfVersion3) return 3;
  return 2;
}

bool parse_size(const char* text, size_t* out) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (errno != 0 || end == text || !std::isfinite(v) || v < 0) return false;
  double scale = 1.0;
  if (*end != '\0') {
    switch (*end) {
      case 'k': case 'K': scale = 1024.0; break;
      case 'm': case 'M': scale = 1024.0 * 1024.0; break;
      case 'g': case 'G': scale = 1024.0 * 1024.0 * 1024.0; break;
      case 't': case 'T': scale = 1024.0 * 1024.0 * 1024.0 * 1024.0; break;
      default: return false;
    }
    ++end;
    // Accept "64KB"/"64KiB" too.
    if (*end == 'i' || *end == 'I') ++end;
    if (*end == 'b' || *end == 'B') ++end;
    if (*end != '\0') return false;
  }
  const double bytes = v * scale;
  if (bytes >= 18446744073709551615.0) return false;
  // A fractional byte count ("1.5" bytes) is malformed; fractional K/M/G are fine.
  if (scale == 1.0 && std::floor(v) != v) return false;
  *out = static_cast<size_t>(bytes);
  return true;
}

pfResult_t resolve_config(const pfConfig_t* config, RuntimeOptions* out) {
  if (out == nullptr) return fail(pfErrorInvalidArgument, "resolve_config: out is NULL");
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  if (config != nullptr) {
    if (config->size < kConfigHeaderBytes) {
      return fail(pfErrorInvalidArgument,
                  "config.size = {} cannot even hold size and version; start from "
                  "PF_CONFIG_INITIALIZER",
                  config->size);
    }
    if (config->version < 1) {
      return fail(pfErrorInvalidArgument, "config.version = {} is unknown (versions 1..{})",
                  config->version, PF_CONFIG_VERSION);
    }
    if (config->version > PF_CONFIG_VERSION) {
      return fail(pfErrorInvalidArgument,
                  "config.version = {} is newer than this library (it knows versions 1..{})",
                  config->version, PF_CONFIG_VERSION);
    }
    const size_t layout = kConfigSizeOfVersion[config->version];
    if (config->size > PF_MAX_STRUCT_SIZE) {
      return fail(pfErrorInvalidArgument,
                  "config.size = {} is implausible (this library's pfConfig_t has {} bytes; a "
                  "later header's may be larger, but not above PF_MAX_STRUCT_SIZE = {}): start "
                  "from PF_CONFIG_INITIALIZER",
                  config->size, sizeof(pfConfig_t), PF_MAX_STRUCT_SIZE);
    }
    if (config->size < layout) {
      return fail(pfErrorInvalidArgument,
                  "config.size = {} is smaller than sizeof(pfConfig_t) version {} ({}); start "
                  "from PF_CONFIG_INITIALIZER",
                  config->size, config->version, layout);
    }
    // What the caller's layout holds; the rest keeps the defaults.
    std::memcpy(&c, config, std::min(config->size, sizeof(pfConfig_t)));
    if (c.version == 1) upgrade_version_1(&c);
  }

  RuntimeOptions o;

  // Backend.
  if (c.backend != PF_UNSET_INT) {
    if (c.backend < pfBackendAuto || c.backend > pfBackendHost) {
      return fail(pfErrorInvalidArgument, "config.backend = {} is not a pfBackend_t (0..3)",
                  c.backend);
    }
    o.backend = static_cast<pfBackend_t>(c.backend);
  } else if (const char* text = env("PIPEFILL_BACKEND")) {
    if (!parse_backend(text, &o.backend)) {
      return fail(pfErrorInvalidArgument,
                  "environment variable PIPEFILL_BACKEND='{}' is not auto|cuda|sim|host", text);
    }
  }

  PF_TRY(resolve_int(c.device, "device", "PIPEFILL_DEVICE", &o.device));
  o.device_given = c.device != PF_UNSET_INT || env("PIPEFILL_DEVICE") != nullptr;
  o.device_from_config = c.device != PF_UNSET_INT;
  if (o.device < 0) {
    return fail(pfErrorInvalidArgument, "{} = {} is negative",
                source_of(c.device != PF_UNSET_INT, "device", "PIPEFILL_DEVICE"), o.device);
  }
  PF_TRY(resolve_int(c.stage_count, "stage_count", "PIPEFILL_STAGE_COUNT", &o.stage_count));
  if (o.stage_count < 1) {
    return fail(pfErrorInvalidArgument, "{} = {} must be >= 1",
                source_of(c.stage_count != PF_UNSET_INT, "stage_count", "PIPEFILL_STAGE_COUNT"),
                o.stage_count);
  }
  PF_TRY(resolve_int(c.stage_id, "stage_id", "PIPEFILL_STAGE_ID", &o.stage_id));
  if (o.stage_id < 0 || o.stage_id >= o.stage_count) {
    return fail(pfErrorInvalidArgument, "{} = {} is outside [0, stage_count={})",
                source_of(c.stage_id != PF_UNSET_INT, "stage_id", "PIPEFILL_STAGE_ID"),
                o.stage_id, o.stage_count);
  }
  PF_TRY(resolve_int(c.reserved_sms, "reserved_sms", "PIPEFILL_RESERVED_SMS", &o.reserved_sms));
  const bool reserved_set = c.reserved_sms != PF_UNSET_INT || env("PIPEFILL_RESERVED_SMS");
  if (c.reserved_sms != PF_UNSET_INT) {
    o.reserved_sms_source = fmt::format("config.reserved_sms = {}", c.reserved_sms);
  } else if (const char* text = env("PIPEFILL_RESERVED_SMS")) {
    o.reserved_sms_source = fmt::format("PIPEFILL_RESERVED_SMS={}", text);
  }
  if (reserved_set && o.reserved_sms < 0) {
    return fail(pfErrorInvalidArgument, "{} = {} is negative",
                source_of(c.reserved_sms != PF_UNSET_INT, "reserved_sms", "PIPEFILL_RESERVED_SMS"),
                o.reserved_sms);
  }
  PF_TRY(resolve_double(c.safety_margin_us, "safety_margin_us", "PIPEFILL_SAFETY_MARGIN_US",
                        &o.safety_margin_us));
  if (o.safety_margin_us < 0) {
    return fail(pfErrorInvalidArgument, "{} = {} is negative",
                source_of(c.safety_margin_us != PF_UNSET_DOUBLE, "safety_margin_us",
                          "PIPEFILL_SAFETY_MARGIN_US"),
                o.safety_margin_us);
  }
  PF_TRY(resolve_double(c.safety_margin_fraction, "safety_margin_fraction",
                        "PIPEFILL_SAFETY_MARGIN_FRACTION", &o.safety_margin_fraction));
  if (o.safety_margin_fraction < 0 || o.safety_margin_fraction >= 1) {
    return fail(pfErrorInvalidArgument, "{} = {} is outside [0, 1)",
                source_of(c.safety_margin_fraction != PF_UNSET_DOUBLE, "safety_margin_fraction",
                          "PIPEFILL_SAFETY_MARGIN_FRACTION"),
                o.safety_margin_fraction);
  }
  PF_TRY(resolve_size(c.arena_bytes, "arena_bytes", "PIPEFILL_ARENA_BYTES", &o.arena_bytes));
  if (c.arena_bytes != PF_UNSET_SIZE) {
    o.arena_bytes_source = fmt::format("config.arena_bytes = {}", c.arena_bytes);
  } else if (const char* text = env("PIPEFILL_ARENA_BYTES")) {
    o.arena_bytes_source = fmt::format("PIPEFILL_ARENA_BYTES={}", text);
  }
  PF_TRY(resolve_double(c.prediction_quantile, "prediction_quantile", "PIPEFILL_QUANTILE",
                        &o.prediction_quantile));
  if (!(o.prediction_quantile > 0 && o.prediction_quantile <= 1)) {
    return fail(pfErrorInvalidArgument, "{} = {} is outside (0, 1]",
                source_of(c.prediction_quantile != PF_UNSET_DOUBLE, "prediction_quantile",
                          "PIPEFILL_QUANTILE"),
                o.prediction_quantile);
  }
  PF_TRY(resolve_double(c.gated_prediction_quantile, "gated_prediction_quantile",
                        "PIPEFILL_GATED_QUANTILE", &o.gated_prediction_quantile));
  if (!(o.gated_prediction_quantile > 0 && o.gated_prediction_quantile <= 1)) {
    return fail(pfErrorInvalidArgument, "{} = {} is outside (0, 1]",
                source_of(c.gated_prediction_quantile != PF_UNSET_DOUBLE,
                          "gated_prediction_quantile", "PIPEFILL_GATED_QUANTILE"),
                o.gated_prediction_quantile);
  }
  PF_TRY(resolve_int(c.min_samples, "min_samples", "PIPEFILL_MIN_SAMPLES", &o.min_samples));
  if (o.min_samples < 0) {
    return fail(pfErrorInvalidArgument, "{} = {} is negative",
                source_of(c.min_samples != PF_UNSET_INT, "min_samples", "PIPEFILL_MIN_SAMPLES"),
                o.min_samples);
  }

  // Environment only: the bubble event pairs (bubbles begun and not yet harvested that are timed).
  {
    int pairs = static_cast<int>(o.bubble_event_slots);
    PF_TRY(resolve_int(PF_UNSET_INT, "bubble_event_pairs", "PIPEFILL_BUBBLE_EVENT_PAIRS", &pairs));
    if (pairs < 1 || pairs > (1 << 20)) {
      return fail(pfErrorInvalidArgument,
                  "environment variable PIPEFILL_BUBBLE_EVENT_PAIRS = {} is outside [1, 1048576]",
                  pairs);
    }
    o.bubble_event_slots = static_cast<size_t>(pairs);
  }

  // Environment only (no pfConfig_t field): the gated quantile of classes closed early.
  PF_TRY(resolve_double(PF_UNSET_DOUBLE, "noticed_prediction_quantile", "PIPEFILL_NOTICED_QUANTILE",
                        &o.noticed_prediction_quantile));
  if (!(o.noticed_prediction_quantile > 0 && o.noticed_prediction_quantile <= 1)) {
    return fail(pfErrorInvalidArgument,
                "environment variable PIPEFILL_NOTICED_QUANTILE = {} must be in (0, 1]",
                o.noticed_prediction_quantile);
  }

  // Environment only (no pfConfig_t field): when a job skipped as too short is warned about.
  PF_TRY(resolve_int(PF_UNSET_INT, "too_short_warn_bubbles", "PIPEFILL_TOO_SHORT_WARN_BUBBLES",
                     &o.too_short_warn_bubbles));
  if (o.too_short_warn_bubbles < 1) {
    return fail(pfErrorInvalidArgument,
                "environment variable PIPEFILL_TOO_SHORT_WARN_BUBBLES = {} must be >= 1",
                o.too_short_warn_bubbles);
  }

  if (c.policy != PF_UNSET_INT) {
    if (c.policy < pfPolicyFifo || c.policy > pfPolicyFairShare) {
      return fail(pfErrorInvalidArgument, "config.policy = {} is not a pfSchedulePolicy_t (0..3)",
                  c.policy);
    }
    o.policy = static_cast<pfSchedulePolicy_t>(c.policy);
  } else if (const char* text = env("PIPEFILL_POLICY")) {
    if (!parse_policy(text, &o.policy)) {
      return fail(pfErrorInvalidArgument,
                  "environment variable PIPEFILL_POLICY='{}' is not fifo|priority|srpt|fair", text);
    }
  }

  if (c.log_level != PF_UNSET_INT) {
    if (c.log_level < pfLogOff || c.log_level > pfLogTrace) {
      return fail(pfErrorInvalidArgument, "config.log_level = {} is not a pfLogLevel_t (0..5)",
                  c.log_level);
    }
    o.log_level = c.log_level;
  } else if (const char* text = env("PIPEFILL_DEBUG")) {
    const int level = log::parse_level(text);
    if (level < 0) {
      return fail(pfErrorInvalidArgument,
                  "environment variable PIPEFILL_DEBUG='{}' is not off|error|warn|info|debug|trace",
                  text);
    }
    o.log_level = level;
  }

  int cupti = o.enable_cupti ? 1 : 0;
  PF_TRY(resolve_int(c.enable_cupti, "enable_cupti", "PIPEFILL_CUPTI", &cupti));
  if (cupti != 0 && cupti != 1) {
    return fail(pfErrorInvalidArgument, "{} = {} is not 0 or 1",
                source_of(c.enable_cupti != PF_UNSET_INT, "enable_cupti", "PIPEFILL_CUPTI"), cupti);
  }
  o.enable_cupti = cupti == 1;

  int optimizer = o.fill_optimizer_bubbles ? 1 : 0;
  PF_TRY(resolve_int(c.fill_optimizer_bubbles, "fill_optimizer_bubbles",
                     "PIPEFILL_FILL_OPTIMIZER_BUBBLES", &optimizer));
  if (optimizer != 0 && optimizer != 1) {
    return fail(pfErrorInvalidArgument, "{} = {} is not 0 or 1",
                source_of(c.fill_optimizer_bubbles != PF_UNSET_INT, "fill_optimizer_bubbles",
                          "PIPEFILL_FILL_OPTIMIZER_BUBBLES"),
                optimizer);
  }
  o.fill_optimizer_bubbles = optimizer == 1;

  o.sim_world = c.sim_world;
  if (c.sim_seed != 0) {
    o.sim_seed = c.sim_seed;
    o.sim_seed_from_config = true;
    o.sim_seed_source = fmt::format("config.sim_seed = {}", c.sim_seed);
  } else if (const char* text = env("PIPEFILL_SIM_SEED")) {
    o.sim_seed_source = fmt::format("PIPEFILL_SIM_SEED={}", text);
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-') {
      return fail(pfErrorInvalidArgument,
                  "environment variable PIPEFILL_SIM_SEED='{}' is not an unsigned integer", text);
    }
    o.sim_seed = v;
  }
  PF_TRY(resolve_int(c.sim_sm_count, "sim_sm_count", "PIPEFILL_SIM_SMS", &o.sim_sm_count));
  if (o.sim_sm_count < 1) {
    return fail(pfErrorInvalidArgument, "{} = {} must be >= 1",
                source_of(c.sim_sm_count != PF_UNSET_INT, "sim_sm_count", "PIPEFILL_SIM_SMS"),
                o.sim_sm_count);
  }
  PF_TRY(resolve_size(c.sim_memory_bytes, "sim_memory_bytes", "PIPEFILL_SIM_MEMORY_BYTES",
                      &o.sim_memory_bytes));
  if (o.sim_memory_bytes == 0) {
    return fail(pfErrorInvalidArgument, "{} = 0 must be > 0",
                source_of(c.sim_memory_bytes != PF_UNSET_SIZE, "sim_memory_bytes",
                          "PIPEFILL_SIM_MEMORY_BYTES"));
  }
  PF_TRY(resolve_int(c.fill_streams, "fill_streams", "PIPEFILL_FILL_STREAMS", &o.fill_streams));
  if (o.fill_streams < 1 || o.fill_streams > kMaxFillStreams) {
    return fail(pfErrorInvalidArgument, "{} = {} is outside [1, {}]",
                source_of(c.fill_streams != PF_UNSET_INT, "fill_streams", "PIPEFILL_FILL_STREAMS"),
                o.fill_streams, kMaxFillStreams);
  }
  if (c.launch_mode != PF_UNSET_INT) {
    if (c.launch_mode < pfLaunchAuto || c.launch_mode > pfLaunchInline) {
      return fail(pfErrorInvalidArgument,
                  "config.launch_mode = {} is not a pfLaunchMode_t (0 auto, 1 executor, 2 inline)",
                  c.launch_mode);
    }
    o.launch_mode = static_cast<pfLaunchMode_t>(c.launch_mode);
  } else if (const char* text = env("PIPEFILL_LAUNCH")) {
    if (!parse_launch_mode(text, &o.launch_mode)) {
      return fail(pfErrorInvalidArgument,
                  "environment variable PIPEFILL_LAUNCH='{}' is not auto|executor|inline", text);
    }
  }

  // A private simulated world's SM count is known now; a shared world's or a GPU's is checked
  // when the device is configured.
  if (o.backend == pfBackendSim && o.sim_world == nullptr && o.reserved_sms >= o.sim_sm_count) {
    return fail(pfErrorInvalidArgument,
                "reserved_sms = {} leaves no SM for fill work (sim_sm_count = {})", o.reserved_sms,
                o.sim_sm_count);
  }

  *out = o;
  return pfSuccess;
}

pfResult_t check_backend_options(const RuntimeOptions& o, bool backend_was_auto) {
  const std::string device_source =
      o.device_given ? (env("PIPEFILL_DEVICE") != nullptr && !o.device_from_config
                            ? fmt::format("PIPEFILL_DEVICE={}", env("PIPEFILL_DEVICE"))
                            : fmt::format("config.device = {}", o.device))
                     : std::string();
  if (o.device_given && o.device != 0) {
    if (o.backend == pfBackendHost) {
      return fail(pfErrorInvalidArgument,
                  "{}: the host backend has one device, index 0 (PIPEFILL_HOST_SMS sizes it)",
                  device_source);
    }
    if (o.backend == pfBackendSim && o.sim_world == nullptr) {
      return fail(pfErrorInvalidArgument,
                  "{}: a private simulated world has one device, index 0; pass config.sim_world "
                  "(pfSimWorldCreate) for a world of several devices",
                  device_source);
    }
  }
  if (o.sim_world != nullptr && o.backend != pfBackendSim) {
    return fail(pfErrorInvalidArgument,
                "config.sim_world = {} is set but the backend is {}: only the sim backend uses a "
                "simulated world (set backend sim, or leave sim_world NULL)",
                static_cast<const void*>(o.sim_world), backend_name(o.backend));
  }
  // The seed of a private simulated world only: a shared world got its seed at pfSimWorldCreate,
  // and the other backends have no jitter to seed.
  const char* ignored_by = nullptr;
  if (!o.sim_seed_source.empty()) {
    if (o.backend != pfBackendSim) {
      ignored_by = o.backend == pfBackendHost ? "the host backend" : "the cuda backend";
    } else if (o.sim_world != nullptr) {
      ignored_by = "a shared simulated world (config.sim_world: its seed is pfSimWorldCreate's)";
    }
  }
  if (ignored_by != nullptr) {
    // A caller's field, on a backend it chose, is an error; a variable set for every rank (or a
    // backend that auto resolved) is only warned about.
    if (o.sim_seed_from_config && !(backend_was_auto && o.backend != pfBackendSim)) {
      return fail(pfErrorInvalidArgument,
                  "{} seeds a private simulated world only and would be ignored by {}; leave "
                  "config.sim_seed 0",
                  o.sim_seed_source, ignored_by);
    }
    log::warn("{} is ignored: it seeds a private simulated world only, and this runtime uses {}",
              o.sim_seed_source, ignored_by);
  }
  return pfSuccess;
}

pfResult_t export_config(const RuntimeOptions& o, pfConfig_t* out) {
  if (out->size < kConfigHeaderBytes) {
    return fail(pfErrorInvalidArgument,
                "pfRuntimeGetConfig: config->size = {} cannot even hold size and version; set it "
                "to sizeof(pfConfig_t) (start from PF_CONFIG_INITIALIZER)",
                out->size);
  }
  const size_t bytes = std::min(out->size, sizeof(pfConfig_t));
  pfConfig_t c = PF_CONFIG_INITIALIZER;
  c.size = bytes;
  // The newest version whose layout the caller's bytes hold, so the struct is valid input again.
  c.version = config_version_for_size(bytes);
  c.backend = o.backend;
  c.device = o.device;
  c.stage_id = o.stage_id;
  c.stage_count = o.stage_count;
  c.reserved_sms = o.reserved_sms < 0 ? PF_UNSET_INT : o.reserved_sms;  // -1: backend default
  c.safety_margin_us = o.safety_margin_us;
  c.safety_margin_fraction = o.safety_margin_fraction;
  c.arena_bytes = o.arena_bytes;
  c.prediction_quantile = o.prediction_quantile;
  c.min_samples = o.min_samples;
  c.policy = o.policy;
  c.log_level = o.log_level;
  c.enable_cupti = o.enable_cupti ? 1 : 0;
  c.sim_world = o.sim_world;
  // The seed applies to a private simulated world only; elsewhere it reads unset (0), so the
  // struct is valid input again (a seed there is refused, check_backend_options).
  c.sim_seed = (o.backend == pfBackendSim && o.sim_world == nullptr) ? o.sim_seed : 0;
  c.sim_sm_count = o.sim_sm_count;
  c.sim_memory_bytes = o.sim_memory_bytes;
  c.fill_streams = o.fill_streams;
  c.launch_mode = o.launch_mode;
  c.gated_prediction_quantile = o.gated_prediction_quantile;
  c.fill_optimizer_bubbles = o.fill_optimizer_bubbles ? 1 : 0;
  std::memcpy(out, &c, bytes);  // never beyond the caller's layout
  return pfSuccess;
}

}  // namespace pipefill
