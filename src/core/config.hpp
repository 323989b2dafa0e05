// The runtime's configuration after defaults and PIPEFILL_* environment variables are applied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "pipefill/pipefill.h"

namespace pipefill {

struct RuntimeOptions {
  pfBackend_t backend = pfBackendAuto;
  // config.device / PIPEFILL_DEVICE. Unset (device_given false): the CUDA backend takes the
  // calling thread's current device (never 0 by default: every rank of a multi-GPU node would
  // sit on GPU 0); the simulated and host backends take 0.
  int device = 0;
  bool device_given = false;
  bool device_from_config = false;  // config.device set (else PIPEFILL_DEVICE, when given)
  int stage_id = 0;
  int stage_count = 1;
  int reserved_sms = -1;                 // -1: backend default (NCCL CTA count, rounded)
  double safety_margin_us = 20.0;
  double safety_margin_fraction = 0.05;
  size_t arena_bytes = 0;                // 0: free memory minus a margin (CUDA) / 1 GiB (sim)
  double prediction_quantile = 0.1;      // ungated (opaque) work: a low quantile, conservative
  // Gated work (ticket kernels, gated graphs): the median. The gate closed at the bubble end
  // bounds a too-long prediction to one item of overrun, so an occasional early bubble need not
  // shrink every bubble's fill to its length; nothing bounds ungated work, hence the low one.
  double gated_prediction_quantile = 0.5;
  // Gated work of a class whose last bubble was closed early by pfBubbleCloseFill: the early
  // close bounds it, so it is sized to a high quantile (1: the window's longest bubble).
  // PIPEFILL_NOTICED_QUANTILE; not in pfConfig_t.
  double noticed_prediction_quantile = 1.0;
  // Bubbles of kind pfBubbleOptimizer (the DP all-reduce window) are left unfilled unless set:
  // fill there competes with the collective for memory bandwidth on the critical path.
  bool fill_optimizer_bubbles = false;
  int min_samples = 2;
  pfSchedulePolicy_t policy = pfPolicyFifo;
  int log_level = pfLogWarn;
  bool enable_cupti = false;
  pfSimWorld_t sim_world = nullptr;
  uint64_t sim_seed = 1;
  int sim_sm_count = 132;
  size_t sim_memory_bytes = size_t{141} << 30;
  // Fill streams made at creation; a bubble's slices run side by side, one per stream.
  int fill_streams = 4;
  // Who enqueues a bubble's slices; auto resolves when the device is known (Runtime::init).
  pfLaunchMode_t launch_mode = pfLaunchAuto;
  // Simulated backend: handle bubble messages in the world's pre-run hook on the thread that
  // runs the world (deterministic; the default) instead of on the executor thread. Not in
  // pfConfig_t: only tests of the threaded executor turn it off.
  bool sim_messages_in_hook = true;
  // A job skipped as too short (its estimated item fits no bubble's budget) in this many
  // bubbles in a row is warned about, once (PIPEFILL_TOO_SHORT_WARN_BUBBLES; not in pfConfig_t;
  // core/cost_model.hpp).
  int too_short_warn_bubbles = 32;
  // Where a value came from, for messages that find it wrong later (creating the device):
  // "config.reserved_sms = 8" or "PIPEFILL_RESERVED_SMS=8"; empty: the default.
  std::string reserved_sms_source;
  std::string arena_bytes_source;
  std::string sim_seed_source;  // empty unless the caller or PIPEFILL_SIM_SEED gave a seed
  bool sim_seed_from_config = false;
  // Pool sizes (not in pfConfig_t: tests shrink them to reach exhaustion quickly). The bubble
  // event pairs bound the bubbles begun but not yet harvested that can be timed
  // (PIPEFILL_BUBBLE_EVENT_PAIRS; a bubble beyond them is untimed and unfilled, warned once).
  size_t bubble_event_slots = 512;  // begin/end event pairs
  size_t slice_slots = 1024;        // slice start/end event pairs and read-back words
};

// Resolves a (possibly NULL) pfConfig_t: unset fields from PIPEFILL_* env vars, then defaults.
// Validates every value; on a bad value returns pfErrorInvalidArgument with a message naming
// the field (or variable) and the value.
pfResult_t resolve_config(const pfConfig_t* config, RuntimeOptions* out);
// The checks that need the backend resolved (Runtime::init, after auto): a device index the
// backend does not have, simulator-only fields given to a backend or world that ignores them.
// pfErrorInvalidArgument naming the field or variable; warns where the value came from the
// environment only (a variable set for every rank of a mixed job is not an error).
pfResult_t check_backend_options(const RuntimeOptions& options, bool backend_was_auto);
// Writes the resolved options back as a pfConfig_t (pfRuntimeGetConfig).
pfResult_t export_config(const RuntimeOptions& options, pfConfig_t* out);
// The newest config version whose whole layout fits `bytes` (2 below the version-3 layout):
// what pfConfigInitSized and pfRuntimeGetConfig write into a caller's `version`.
int config_version_for_size(size_t bytes);
// Parses sizes like "512", "64K", "1.5G" (binary units). false when malformed.
bool parse_size(const char* text, size_t* out);
// "auto", "cuda", "sim" or "host" (logs and messages).
const char* backend_name(pfBackend_t backend);
// "auto", "executor" or "inline".
const char* launch_mode_name(pfLaunchMode_t mode);
// Fill streams a runtime may make (pfConfig_t::fill_streams, PIPEFILL_FILL_STREAMS).
inline constexpr int kMaxFillStreams = 64;

}  // namespace pipefill
