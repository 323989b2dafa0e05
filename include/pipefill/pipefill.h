/*
 * PipeFill: fill the bubbles of pipeline-parallel training with other jobs' work.
 *
 * This header is the library's ABI. It is C99 and needs no CUDA header: streams are passed
 * as `void*` (a cudaStream_t on the CUDA backend, a simulated stream handle on the simulated
 * backend). Every call returns a pfResult_t; on failure a message naming the bad value is
 * available from pfGetLastErrorMessage() on the calling thread. No call ever throws, aborts or
 * blocks the training job's streams.
 *
 * Time is in microseconds (double) and memory in bytes (size_t) throughout.
 */
#ifndef PIPEFILL_PIPEFILL_H_
#define PIPEFILL_PIPEFILL_H_

#include <float.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* The version rule (docs/api.md, "Versions"): one version, CMake's project(VERSION) = these
 * macros = pyproject.toml's (tests/headers/check_version.sh). Every release that appends a field
 * or adds a function bumps MINOR (0.x: additions only; older binaries keep working through the
 * size-versioned layouts); comments say "added in 0.N" for what came with release 0.N, so
 * `PIPEFILL_VERSION_CODE >= N * 100` tests for it. */
#define PIPEFILL_VERSION_MAJOR 0
#define PIPEFILL_VERSION_MINOR 4
#define PIPEFILL_VERSION_PATCH 0
/* Encoded as MAJOR*10000 + MINOR*100 + PATCH, like NCCL_VERSION_CODE. */
#define PIPEFILL_VERSION_CODE \
  (PIPEFILL_VERSION_MAJOR * 10000 + PIPEFILL_VERSION_MINOR * 100 + PIPEFILL_VERSION_PATCH)

#if defined(_WIN32)
#define PF_API __declspec(dllexport)
#elif defined(PIPEFILL_BUILDING_LIBRARY)
#define PF_API __attribute__((visibility("default")))
#else
#define PF_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Results and errors                                                                          */
/* ------------------------------------------------------------------------------------------ */

typedef enum pfResult_t {
  pfSuccess = 0,
  pfErrorInvalidArgument = 1,  /* a null handle/pointer or an out-of-range value */
  pfErrorInvalidState = 2,     /* a call out of order: end without begin, nested begin, ... */
  pfErrorOutOfMemory = 3,      /* the request does not fit the fill arena / bubble memory */
  pfErrorNotSupported = 4,     /* backend or feature not available in this build or device */
  pfErrorNoDevice = 5,         /* CUDA backend requested but no usable GPU */
  pfErrorCudaFailure = 6,      /* a CUDA runtime/driver call failed; message names it */
  pfErrorCuptiFailure = 7,     /* a CUPTI call failed; message names it */
  pfErrorNcclFailure = 8,      /* an NCCL call failed; message names it */
  pfErrorJobFailed = 9,        /* a fill job's callback or item failed; the job is ended */
  pfErrorCancelled = 10,       /* the job was cancelled */
  pfErrorTimeout = 11,         /* a wait ran out of time */
  pfErrorBusy = 12,            /* resource in use (e.g. destroying a runtime with live jobs) */
  pfErrorIo = 13,              /* a file could not be written/read */
  pfErrorInternal = 14,        /* a bug in PipeFill; please report with PIPEFILL_DEBUG=trace */
  pfResultCount = 15
} pfResult_t;

/* Static string naming the result ("pfErrorInvalidArgument: ..."). Never NULL. */
PF_API const char* pfGetErrorString(pfResult_t result);

/* Message of the last failing call on this thread (empty string when none). The pointer stays
 * valid until the next PipeFill call on the same thread. */
PF_API const char* pfGetLastErrorMessage(void);

/* Version as PIPEFILL_VERSION_CODE of the library actually loaded. */
PF_API pfResult_t pfGetVersion(int* version);

/* ------------------------------------------------------------------------------------------ */
/* Opaque handles                                                                              */
/* ------------------------------------------------------------------------------------------ */

typedef struct pfRuntime* pfRuntime_t;
typedef struct pfJob* pfJob_t;
typedef struct pfSimWorld* pfSimWorld_t;

/* ------------------------------------------------------------------------------------------ */
/* Configuration                                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef enum pfBackend_t {
  pfBackendAuto = 0, /* CUDA when built with it and a GPU is present, else simulated */
  pfBackendCuda = 1,
  pfBackendSim = 2,
  pfBackendHost = 3  /* real-time host device: CPU threads as streams (tests of async paths) */
} pfBackend_t;

typedef enum pfSchedulePolicy_t {
  pfPolicyFifo = 0,              /* job creation order */
  pfPolicyPriority = 1,          /* highest pfJobDesc_t::priority first, FIFO among equals */
  pfPolicyShortestRemaining = 2, /* least remaining work (items x cost) first */
  pfPolicyFairShare = 3          /* least bubble time received so far first */
} pfSchedulePolicy_t;

typedef enum pfLogLevel_t {
  pfLogOff = 0,
  pfLogError = 1,
  pfLogWarn = 2,
  pfLogInfo = 3,
  pfLogDebug = 4,
  pfLogTrace = 5
} pfLogLevel_t;

/* Versioned configuration. Always start from PF_CONFIG_INITIALIZER (or pfConfigInit) so that
 * fields added later get their defaults. A field left at its "unset" value takes the value of
 * the matching environment variable, else the default. Environment variables:
 *   PIPEFILL_BACKEND=auto|cuda|sim|host PIPEFILL_DEVICE=<int>
 *   PIPEFILL_STAGE_ID=<int>             PIPEFILL_STAGE_COUNT=<int>
 *   PIPEFILL_RESERVED_SMS=<int>         PIPEFILL_SAFETY_MARGIN_US=<double>
 *   PIPEFILL_SAFETY_MARGIN_FRACTION=<double>
 *   PIPEFILL_ARENA_BYTES=<size, K/M/G suffix allowed>
 *   PIPEFILL_QUANTILE=<0..1>            PIPEFILL_MIN_SAMPLES=<int>
 *   PIPEFILL_POLICY=fifo|priority|srpt|fair
 *   PIPEFILL_DEBUG=off|error|warn|info|debug|trace   (log level)
 *   PIPEFILL_CUPTI=0|1                  PIPEFILL_SIM_SEED=<uint64>
 *   PIPEFILL_SIM_SMS=<int>              PIPEFILL_SIM_MEMORY_BYTES=<size>
 *   PIPEFILL_FILL_STREAMS=<1..64>       PIPEFILL_LAUNCH=auto|executor|inline   (version 3)
 *   PIPEFILL_GATED_QUANTILE=<0..1>      PIPEFILL_FILL_OPTIMIZER_BUBBLES=0|1   (version 4)
 *   PIPEFILL_TOO_SHORT_WARN_BUBBLES=<int >= 1>   (no config field; pfJobGetCostInfo)
 *   PIPEFILL_BUBBLE_EVENT_PAIRS=<1..1048576>     (no config field; default 512: bubbles begun
 *                                                and not yet harvested that can be timed)
 */
/* Version 2 (0.2): the "unset" values below are ones no caller passes on purpose (in version 1
 * they were -1 / -1.0, so a margin of -1.0 silently meant "default"). A version 1 config (built
 * by a caller against the 0.1 header) is still accepted, -1 / -1.0 meaning "unset". `size` is
 * honoured both ways: a smaller (older) layout gets defaults for the fields it lacks, and
 * pfRuntimeGetConfig writes only the bytes the caller's `size` holds. */
/* Version 3 (0.3) appends fill_streams and launch_mode; a version 2 layout (size and version of
 * the 0.2 header) gets their defaults. Version 4 (0.4) appends gated_prediction_quantile
 * and fill_optimizer_bubbles; a version 3 layout (PF_CONFIG_V3_SIZE bytes, version 3) gets their
 * defaults. */
#define PF_CONFIG_VERSION 4
/* The largest `size` (config, stats, info structs) or byte count any call accepts: a later
 * header's structs may grow, but not beyond this; a larger value is an uninitialised or corrupt
 * size and is refused with pfErrorInvalidArgument naming it. */
#define PF_MAX_STRUCT_SIZE 4096
#define PF_UNSET_INT INT_MIN
#define PF_UNSET_DOUBLE (-DBL_MAX)
#define PF_UNSET_SIZE SIZE_MAX

/* Who enqueues a bubble's fill slices (pfConfig_t::launch_mode, PIPEFILL_LAUNCH). */
typedef enum pfLaunchMode_t {
  pfLaunchAuto = 0,     /* inline when the device feeds every stream through one hardware queue
                           (CUDA_DEVICE_MAX_CONNECTIONS=1 in grid-cap mode), else executor */
  pfLaunchExecutor = 1, /* the executor thread, after pfBubbleBegin returned (asynchronous) */
  pfLaunchInline = 2    /* pfBubbleBegin itself, on the caller's thread, before it returns; the
                           slices' read-backs are enqueued by pfBubbleEnd after the gate write */
} pfLaunchMode_t;

typedef struct pfConfig_t {
  size_t size;     /* sizeof(pfConfig_t): lets the library accept older layouts */
  int version;     /* PF_CONFIG_VERSION */
  int backend;     /* pfBackend_t, or PF_UNSET_INT */
  int device;      /* CUDA device ordinal / simulated device index in sim_world */
  int stage_id;    /* this rank's pipeline stage (for logs, traces) */
  int stage_count; /* number of pipeline stages */
  int reserved_sms;              /* SMs kept free of fill work for the main job (NCCL CTAs) */
  double safety_margin_us;       /* subtracted from every predicted bubble */
  double safety_margin_fraction; /* and this fraction of the prediction */
  size_t arena_bytes;            /* device memory reserved up front for fill jobs */
  double prediction_quantile;    /* quantile of the bubble-class history that sizes ungated
                                    (opaque) work, (0,1]; default 0.1 (conservative) */
  int min_samples;               /* samples a bubble class needs before it is filled */
  int policy;                    /* pfSchedulePolicy_t */
  int log_level;                 /* pfLogLevel_t */
  int enable_cupti;              /* 1: calibration mode with the CUPTI collector */
  /* Simulated backend only. */
  pfSimWorld_t sim_world; /* NULL: the runtime creates a private one-device world */
  uint64_t sim_seed;      /* jitter seed for a private world (0 = unset) */
  int sim_sm_count;       /* SMs of a private world's device */
  size_t sim_memory_bytes; /* memory of a private world's device */
  /* Version 3. */
  int fill_streams; /* fill streams (slices of one bubble run side by side, one per stream) */
  int launch_mode;  /* pfLaunchMode_t */
  /* Version 4. */
  double gated_prediction_quantile; /* quantile of the bubble-class history that sizes gated work
                                       (ticket kernels, gated graphs), (0,1]; default 0.5 (the
                                       median): the gate stopped at the bubble end bounds a too
                                       long prediction to one item of overrun, so gated work
                                       need not plan to an early bubble's length */
  int fill_optimizer_bubbles; /* 1: also fill bubbles of kind pfBubbleOptimizer (the data-parallel
                                 all-reduce window); default 0: fill beside the collective
                                 competes with it for memory bandwidth and stretches it on the
                                 main job's critical path (NVIDIA/nccl#1433: send/recv up to 2x
                                 slower beside a GEMM; docs/architecture.md) */
} pfConfig_t;

#define PF_CONFIG_INITIALIZER                                                              \
  {                                                                                        \
    sizeof(pfConfig_t), PF_CONFIG_VERSION, PF_UNSET_INT, PF_UNSET_INT, PF_UNSET_INT,        \
        PF_UNSET_INT, PF_UNSET_INT, PF_UNSET_DOUBLE, PF_UNSET_DOUBLE, PF_UNSET_SIZE,        \
        PF_UNSET_DOUBLE, PF_UNSET_INT, PF_UNSET_INT, PF_UNSET_INT, PF_UNSET_INT, NULL, 0,   \
        PF_UNSET_INT, PF_UNSET_SIZE, PF_UNSET_INT, PF_UNSET_INT, PF_UNSET_DOUBLE,           \
        PF_UNSET_INT                                                                        \
  }

/* Bytes of the version-2 layout (0.2 headers: pfConfig_t ended at sim_memory_bytes). */
#define PF_CONFIG_V2_SIZE (offsetof(pfConfig_t, fill_streams))
/* Bytes of the version-3 layout (pfConfig_t ended at launch_mode). */
#define PF_CONFIG_V3_SIZE (offsetof(pfConfig_t, gated_prediction_quantile))

/* Same as assigning PF_CONFIG_INITIALIZER to a caller's struct of config_size bytes (pass
 * sizeof(pfConfig_t)): writes min(config_size, sizeof(pfConfig_t)) bytes, with `size` and
 * `version` those of the layout that fits, and nothing past config_size. config_size below
 * PF_CONFIG_V2_SIZE: pfErrorInvalidArgument. */
PF_API pfResult_t pfConfigInitSized(pfConfig_t* config, size_t config_size);
/* The exported symbol writes the version-2 layout only (PF_CONFIG_V2_SIZE bytes), so a binary
 * built against an older header is never written past its struct; code compiled against this
 * header calls pfConfigInitSized(config, sizeof(pfConfig_t)) through the macro below. */
PF_API pfResult_t pfConfigInit(pfConfig_t* config);
#define pfConfigInit(config) pfConfigInitSized((config), sizeof(pfConfig_t))

/* ------------------------------------------------------------------------------------------ */
/* Runtime                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Creates a runtime on one device. Reserves the fill arena, creates fill streams and events,
 * loads fill modules eagerly and starts the executor thread. config may be NULL (defaults +
 * environment). */
PF_API pfResult_t pfRuntimeCreate(const pfConfig_t* config, pfRuntime_t* runtime);

/* Fails with pfErrorBusy while jobs are still attached (cancel/destroy them first). */
PF_API pfResult_t pfRuntimeDestroy(pfRuntime_t runtime);

/* The configuration actually in force after defaults and environment were applied. Set
 * config->size first (start from PF_CONFIG_INITIALIZER): only that many bytes are written. */
PF_API pfResult_t pfRuntimeGetConfig(pfRuntime_t runtime, pfConfig_t* config);

/* Backend in force after auto was resolved: pfBackendCuda, pfBackendSim or pfBackendHost. */
PF_API pfResult_t pfRuntimeGetBackend(pfRuntime_t runtime, pfBackend_t* backend);

/* A stream for the main job at the highest priority the device offers, so that fill work at
 * the lowest priority only uses SMs the main job leaves. Destroy with pfStreamDestroy. */
PF_API pfResult_t pfStreamCreateHighPriority(pfRuntime_t runtime, void** stream);
PF_API pfResult_t pfStreamDestroy(pfRuntime_t runtime, void* stream);

/* First error that happened asynchronously (in the executor thread or on the device) and is
 * not tied to a call, e.g. a fill job's launch failing or a sticky CUDA error. Does not clear. */
PF_API pfResult_t pfRuntimeGetAsyncError(pfRuntime_t runtime, pfResult_t* async_error);

/* Blocks until every enqueued fill slice has completed and all bubble timings are harvested.
 * Never call it inside a bubble (it synchronises the fill stream). */
PF_API pfResult_t pfRuntimeSynchronize(pfRuntime_t runtime);

/* ------------------------------------------------------------------------------------------ */
/* Bubble instructions (stream-ordered)                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef enum pfBubbleKind_t {
  pfBubbleOther = 0,
  pfBubbleWarmup = 1,    /* before a stage's first forward */
  pfBubbleCooldown = 2,  /* waits during the backward drain */
  pfBubbleDrain = 3,     /* end of iteration before the gradient reduction */
  pfBubbleOptimizer = 4, /* data-parallel all-reduce / optimizer step */
  pfBubbleKindCount = 5
} pfBubbleKind_t;

typedef struct pfBubbleHint_t {
  int kind;                    /* pfBubbleKind_t */
  const char* label;           /* optional stable label: the bubble class key if given */
  double expected_duration_us; /* optional (<= 0: unknown); lets a class fill before history */
  /* Reserved: memory the engine would lend for this bubble only. Ignored since 0.1 (fill work
   * could still write it after pfBubbleEnd: there is no stream-ordered release); validated. */
  size_t lent_bytes;
  void* lent_memory;
} pfBubbleHint_t;

#define PF_BUBBLE_HINT_INITIALIZER {pfBubbleOther, NULL, 0.0, 0, NULL}

/* Call right after enqueuing the communication the stage will wait on. Records the begin event
 * on `stream` (stream order) and hands the bubble to the executor; never blocks on the device.
 * hint may be NULL.
 * Threads: a runtime has at most one open bubble. pfBubbleBegin, pfBubbleEnd and pfIterationEnd
 * may be called from any thread (they are serialised inside the runtime), but a begin while a
 * bubble is open - nested on the same thread, or from another thread or stream - is refused with
 * pfErrorInvalidState naming the stream that holds the open bubble, and enqueues nothing. An
 * engine that drives several streams (interleaved virtual stages) marks one of them at a time,
 * or gives each its own runtime. */
PF_API pfResult_t pfBubbleBegin(pfRuntime_t runtime, void* stream, const pfBubbleHint_t* hint);

/* Call right after the wait. Closes the bubble's gate with a stream-ordered write on `stream`
 * and records the end event. `stream` must be the stream given to pfBubbleBegin. */
PF_API pfResult_t pfBubbleEnd(pfRuntime_t runtime, void* stream);

/* Stream-ordered early end of the open bubble's fill, for an engine that learns the bubble's end
 * before its wait completes (the sending stage's notice that its send is near, a schedule that
 * knows the next kernel's start). When `stream` reaches this point - and not before the bubble's
 * begin on its own stream - the gate of the bubble open now closes: its ticket blocks and gated
 * items claim no more (the item running finishes). The bubble itself still ends at pfBubbleEnd,
 * which records its duration. The close is an atomic max of the gate: landing after the
 * bubble's end, or after a later bubble's, changes nothing. `stream`: any main-job stream of the
 * runtime's device (typically a side stream that waits for the sender's event); a call with no
 * bubble open is refused with pfErrorInvalidState. A class whose last bubble was closed this way
 * plans its gated work to the class's noticed quantile (PIPEFILL_NOTICED_QUANTILE, default 1:
 * the longest bubble of its window) rather than the median: the close, not the prediction,
 * bounds it. Ungated (opaque) work is not stopped by it. Several calls per bubble are allowed. */
PF_API pfResult_t pfBubbleCloseFill(pfRuntime_t runtime, void* stream);

/* Marks an iteration boundary: the k-th bubble of an iteration is bubble class k. */
PF_API pfResult_t pfIterationEnd(pfRuntime_t runtime);

/* ------------------------------------------------------------------------------------------ */
/* Fill jobs                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef enum pfJobKind_t {
  pfJobTicket = 0, /* items claimed by persistent gated blocks; overrun <= one item */
  pfJobOpaque = 1, /* ungated work (library calls): admitted only when it fits the time left */
  pfJobGraph = 2   /* one captured CUDA graph per item, gated by the runtime before every item
                      (pfJobCreateGraph; not accepted by pfJobCreate) */
} pfJobKind_t;

typedef enum pfJobStatus_t {
  pfJobPending = 0,   /* created, not yet given bubble time */
  pfJobRunning = 1,   /* has completed some items */
  pfJobCompleted = 2, /* every item done exactly once */
  pfJobFailed = 3,    /* a callback or an item failed (pfJobWait returns the message); a failed
                         item never counts as completed. Late slices (the trainer's bubbles
                         too short for them) never fail a job: it backs off (docs/api.md) */
  pfJobCancelled = 4
} pfJobStatus_t;

/* One way to run the job: the planner picks, per bubble class, the configuration that gives
 * the most items per second within the memory the bubble has. */
typedef struct pfJobConfig_t {
  const char* name;                /* e.g. "bs32", "bs8+ckpt" (may be NULL) */
  double item_cost_us;             /* time one worker (block) needs for one item; > 0 */
  int parallelism;                 /* items in flight at once (ticket: blocks); 0 = fill SMs */
  size_t resident_bytes;           /* weights/state that stay in the arena while the job lives */
  size_t workspace_bytes_per_item; /* scratch per in-flight item, from the bubble's memory */
  double items_per_item;           /* useful work of one item in job units (e.g. samples); 0=1 */
} pfJobConfig_t;

/* Allocator handed to setup: sub-allocates the job's arena share. Never call it in a bubble. */
typedef struct pfArenaAllocator_t {
  void* context;
  pfResult_t (*allocate)(void* context, size_t bytes, size_t alignment, void** device_ptr);
} pfArenaAllocator_t;

/* Everything a launch callback needs to enqueue one slice of items. */
typedef struct pfSliceDesc_t {
  pfJob_t job;
  int config_index;            /* which pfJobConfig_t the planner chose */
  uint64_t bubble_id;          /* sequence number of the bubble (gate epoch) */
  uint64_t first_item_hint;    /* host's view of the next item (exact for opaque jobs) */
  uint64_t max_items;          /* item budget for this slice */
  uint64_t total_items;        /* the job's item count */
  int max_blocks;              /* grid cap: fill SMs available */
  double time_budget_us;       /* predicted bubble time granted to the slice */
  /* Device words (CUDA: device pointers; sim: simulated addresses). A ticket kernel stops
   * claiming items once *gate >= bubble_id (the gate holds the last closed bubble's id). */
  const volatile uint64_t* gate;
  uint64_t* cursor;            /* next unclaimed item, persistent across slices */
  uint64_t* budget_counter;    /* per-slice claim counter, zeroed before the slice runs */
  void* workspace;             /* bubble memory for this slice (may be NULL) */
  size_t workspace_bytes;
} pfSliceDesc_t;

typedef struct pfJobDesc_t {
  const char* name;
  int kind;                   /* pfJobKind_t */
  int priority;               /* larger runs first under pfPolicyPriority */
  uint64_t item_count;        /* > 0 */
  size_t resident_bytes;      /* default for configs that leave it 0 */
  size_t workspace_bytes_per_item;
  double item_cost_hint_us;   /* default for configs that leave it 0 */
  const pfJobConfig_t* configs; /* may be NULL: one config from the fields above */
  int config_count;
  void* user;
  /* Called once, outside any bubble, from pfJobCreate: allocate resident memory. Optional. */
  pfResult_t (*setup)(void* user, const pfArenaAllocator_t* allocator, int config_index);
  /* Called from the executor thread (inline launch mode: from pfBubbleBegin's thread) to
   * enqueue one slice on `stream` (one of the fill streams). Must not allocate, synchronise or
   * load modules. Required. pfJobCreate also calls it once per fill stream with an empty slice
   * (max_items == 0, bubble_id 0, outside any bubble) to warm up: load kernels and library
   * handles into the fill stream's context, enqueue nothing that claims items or writes output.
   * A bubble's slice always has max_items >= 1. */
  pfResult_t (*launch)(void* user, const pfSliceDesc_t* slice, void* stream);
  /* Called once when the job ends (completed, failed, cancelled, destroyed). Optional. */
  void (*teardown)(void* user);
} pfJobDesc_t;

#define PF_JOB_DESC_INITIALIZER \
  {NULL, pfJobTicket, 0, 0, 0, 0, 0.0, NULL, 0, NULL, NULL, NULL, NULL}

typedef struct pfJobInfo_t {
  int status;               /* pfJobStatus_t */
  uint64_t items_completed;
  uint64_t item_count;
  uint64_t slices_launched;
  double bubble_time_us;    /* bubble time granted to this job */
  double busy_time_us;      /* measured fill execution time */
  int config_index;         /* configuration in use (last chosen) */
  pfResult_t error;         /* why it failed (pfSuccess otherwise) */
} pfJobInfo_t;

/* Registers a job; runs setup (arena allocations), then the warm-up launches (one empty slice
 * per fill stream) and synchronizes the fill streams. A job whose resident memory cannot fit the
 * arena is refused with pfErrorOutOfMemory; a failing warm-up with pfErrorJobFailed (teardown
 * runs, nothing else changes); running jobs are unaffected. */
PF_API pfResult_t pfJobCreate(pfRuntime_t runtime, const pfJobDesc_t* desc, pfJob_t* job);
PF_API pfResult_t pfJobGetStatus(pfJob_t job, pfJobInfo_t* info);
/* Stops scheduling the job; slices in flight finish (ticket slices at the next gate check).
 * Never blocks. The job's own launch callback may call it (the job ends cancelled after the
 * slice being launched); from its own teardown it is a no-op. */
PF_API pfResult_t pfJobCancel(pfJob_t job);
/* Waits until the job completed/failed/cancelled or timeout_us passes (< 0, INFINITY or above
 * 1e15 µs: forever). pfErrorTimeout when it ran out; pfErrorJobFailed with the failure's message
 * for a failed job. Refused at once (pfErrorInvalidState) with any timeout but 0 on the thread
 * that has a bubble open, and without a limit on the thread that drives a simulated world (no
 * virtual time passes while it waits): see docs/api.md. */
PF_API pfResult_t pfJobWait(pfJob_t job, double timeout_us);
/* Detaches and frees the job (cancels it first if still running; waits for its slices).
 * Refused (pfErrorInvalidState) on the thread that has a bubble open and from the job's own
 * callbacks (cancel it there, destroy it after). */
PF_API pfResult_t pfJobDestroy(pfJob_t job);

/* ---- Item costs learned from measured slices ------------------------------------------------ */
/* The item cost a job is created with (pfJobConfig_t.item_cost_us or item_cost_hint_us) is only
 * a prior: each configuration learns its cost from its timed slices (busy time / rounds of one
 * item per worker, over a small window of recent slices; gated jobs use the window's median,
 * opaque jobs its 90th percentile, since nothing bounds their overrun), and the planner uses
 * that estimate from the first sample on. A job whose estimated item fits no bubble gets a
 * one-item probe now and then (after 2, 4, 8 ... consecutive such bubbles, at most every 64;
 * opaque jobs from 4, at most every 256), so a too-large prior is measured and corrected; it is
 * warned about once (the runtime's log, level warn) after PIPEFILL_TOO_SHORT_WARN_BUBBLES (32)
 * such bubbles in a row. */
typedef struct pfJobCostInfo_t {
  size_t size;                /* sizeof(pfJobCostInfo_t): set it before the call */
  double prior_cost_us;       /* the configuration's item cost given at creation */
  double learned_cost_us;     /* the cost the planner uses now (the prior until measured) */
  uint64_t samples;           /* timed slices of the configuration measured so far */
  uint64_t probes;            /* one-item probes the job ran */
  uint64_t too_short_streak;  /* bubbles in a row its estimated item did not fit, now */
  uint64_t too_short_bubbles; /* all such bubbles of the job's life */
  int config_index;           /* the configuration described: the one in use (last chosen) */
  int warned;                 /* 1 once the too-short warning was logged */
} pfJobCostInfo_t;

/* Fills `info` (set info->size first: a size below this layout's sizeof(pfJobCostInfo_t) is
 * pfErrorInvalidArgument, nothing written; a larger one gets this layout's bytes and zeroes after
 * them). Safe from any thread, also inside a bubble; it takes the runtime's state lock. */
PF_API pfResult_t pfJobGetCostInfo(pfJob_t job, pfJobCostInfo_t* info);

/* Added in 0.4. How the planner estimates the item cost of each of the job's configurations
 * (a call, not a pfJobDesc_t field: pfJobDesc_t carries no size, so an appended field would be
 * read past an older caller's struct). The values are pfGraphJobDesc_t.on_item_is_work's:
 * 0 (every job's default): learned, the window's median (opaque jobs: its 90th percentile);
 * 1: learned, the window's fastest sample (gated jobs), for items that are a host thread's own
 *    work (e.g. Python functions), which run slower whenever the thread waits for the CPU or a
 *    lock (the GIL) and would otherwise raise the estimate past the bubbles;
 * 2: stated: each configuration keeps the item cost it was created with (pfJobConfig_t.item_cost_us
 *    or item_cost_hint_us), whatever its slices measure.
 * It applies from the next slice planned, to samples measured before too. Any other value is
 * pfErrorInvalidArgument naming it, nothing changed. Safe from any thread outside the job's own
 * callbacks; it takes the runtime's state lock. */
PF_API pfResult_t pfJobSetCostPolicy(pfJob_t job, int policy);

/* ---- Streaming jobs: input staged while the job runs ---------------------------------------- */
/* A job may grow while it runs: only items < available may be claimed (the gate and budget rules
 * are unchanged). The bound is kept by the host and applied when a slice is planned: a slice's
 * item budget never lets the cursor pass it (pipefill/item_protocol.hpp, "Streaming bound"), so
 * a raise takes effect from the next slice planned (the next bubble, or the next packing round of
 * this one); ticket kernels and gated graphs need no change. A job whose claims reached the bound
 * is dry, not failed: it gets no slice until the bound is raised, and pfJobWait waits on.
 *
 * pfJobSetAvailable sets the bound (it may go down, but never below the items already claimed or
 * granted to slices in flight: pfErrorInvalidArgument naming both values; above item_count reads
 * as item_count). Graph jobs start with pfGraphJobDesc_t.available; other kinds with no bound,
 * so set it before their first bubble. pfJobEndInput declares that no item beyond the bound will
 * come: item_count becomes the bound and the job completes once those items are done (at once
 * when they are). Both: pfErrorInvalidState for a job that ended. The completed-items report a
 * producer recycles its buffers by is pfJobInfo_t.items_completed (pfJobGetStatus). */
PF_API pfResult_t pfJobSetAvailable(pfJob_t job, uint64_t available);
PF_API pfResult_t pfJobEndInput(pfJob_t job);

/* ---- Graph fill jobs: any captured CUDA graph as a fill item ------------------------------ */
/* One item is one run of a captured CUDA graph (e.g. the inference of one micro-batch) whose
 * kernels read the item's index from `index_word`. At pfJobCreateGraph the runtime builds and
 * instantiates, once and outside any bubble, a graph of its own around it on the fill stream's
 * context:
 *
 *   claim -> WHILE (claimed) { the user's graph (a child graph node) -> claim }
 *
 * where "claim" is a one-thread kernel that checks the bubble's gate, the slice's item budget and
 * the job's item count (the claim of ticket kernels, pipefill/item_protocol.hpp), writes the item
 * to *index_word and sets the WHILE node's condition. Per slice the runtime launches that graph on
 * the fill stream (no launch callback): opaque work becomes gated work whose overrun past the
 * bubble's end is at most one item, and every item runs exactly once across bubbles.
 *
 * What the graph may do (docs/api.md, "Graph fill jobs"): kernel, memcpy, memset, empty and child
 * graph nodes only (no host, event, memory allocation/free or conditional nodes: CUDA refuses them
 * inside a conditional body); no allocation, no host synchronisation; read the item index from
 * index_word (a uint64, i.e. an int64 index tensor); write results only into memory allocated
 * before the job was created (the runtime never copies outputs); take a bounded time close to
 * item_cost_us. All its kernels must belong to the fill stream's CUDA context: capture it on a
 * stream from pfGraphCaptureStreamCreate. A fault in the graph is a sticky CUDA error of the whole
 * context (the training job's included): the runtime reports it as the async error.
 * On the simulated and the host device the same job runs as gated items of item_cost_us each on
 * one worker: the runtime writes the item to *index_word (host memory there) and calls on_item. */
typedef void (*pfGraphItemFn)(void* user, uint64_t item);

typedef struct pfGraphJobDesc_t {
  size_t size;             /* sizeof(pfGraphJobDesc_t): lets the library accept later layouts */
  const char* name;
  int priority;            /* larger runs first under pfPolicyPriority */
  uint64_t item_count;     /* > 0; the index word takes the values 0 .. item_count-1, once each */
  double item_cost_us;     /* measured duration of one item (one run of the graph); > 0 */
  int parallelism;         /* 0 or 1: one instance of the graph runs its items one after another */
  void* graph;             /* cudaGraph_t of one item (CUDA backend: required; cloned, so the
                              caller may destroy it after the call). Other backends: unused */
  uint64_t* index_word;    /* 8-byte aligned word the graph reads the item index from: device
                              memory (CUDA), host memory (sim, host); written by the runtime */
  pfGraphItemFn on_item;   /* simulated/host backends only (NULL on CUDA): called for every item,
                              after *index_word was written; must not call into PipeFill */
  void* user;              /* passed to on_item and teardown */
  void (*teardown)(void* user); /* optional: once, after the job ended and its last slice ran */
  /* Added in 0.4 (streaming); a caller whose desc->size ends before it gets UINT64_MAX. */
  uint64_t available;      /* items claimable from the start (pfJobSetAvailable): 0 for a job
                              whose input is staged while it runs; UINT64_MAX: all item_count */
  /* Added in 0.4; a caller whose desc->size ends before it gets 0. Host backend only: 1 when
   * on_item does the item's work (e.g. a Python function), so an item takes as long as on_item
   * does and item_cost_us is only the planner's first estimate (learned from measured slices,
   * pfJobGetCostInfo). 0: each item also lasts at least item_cost_us (a stand-in for the graph's
   * kernels). With 1 the learned cost is the fastest measured sample of the window, not its
   * median: such items run slower whenever their thread waits for the CPU or a lock (the GIL),
   * and the gate bounds an estimate too small to one item. 2: as 1, and item_cost_us is the
   * item's known cost: the planner keeps it and does not learn it from measured slices (items
   * that run slower inside bubbles than alone, e.g. sharing the CPU with the trainer, would
   * otherwise raise the estimate past the bubbles).
   * The simulator always takes item_cost_us of virtual time. */
  int on_item_is_work;
} pfGraphJobDesc_t;

#define PF_GRAPH_JOB_DESC_INITIALIZER \
  {sizeof(pfGraphJobDesc_t), NULL, 0, 0, 0.0, 0, NULL, NULL, NULL, NULL, NULL, UINT64_MAX, 0}

/* Registers a graph fill job (kind pfJobGraph). Bad descriptions are pfErrorInvalidArgument
 * naming the field; pfErrorNotSupported names the CUDA driver/runtime version when conditional
 * graph nodes are unavailable (they need CUDA 12.4). The graph may be destroyed after the call;
 * the memory its kernels use must stay allocated until pfJobDestroy returned. */
PF_API pfResult_t pfJobCreateGraph(pfRuntime_t runtime, const pfGraphJobDesc_t* desc, pfJob_t* job);

/* A stream on the fill partition's CUDA context (the green context when there is one, else an
 * ordinary stream), lowest priority, for capturing the graph of a graph fill job so that its
 * kernels belong to that context. Never a fill or main stream: capture only (destroy with
 * pfStreamDestroy). The simulated and host backends return one of their ordinary streams. */
PF_API pfResult_t pfGraphCaptureStreamCreate(pfRuntime_t runtime, void** stream);

/* Makes the CUDA context of `stream` (a capture stream of pfGraphCaptureStreamCreate) current on
 * the calling thread until the matching pfGraphCaptureContextPop on the same thread (pairs nest).
 * Capture a graph fill job's item between the two: the CUDA runtime launches a kernel in the
 * context current at the launch, so kernels that torch or cuBLAS launch into a capture on a
 * green-context stream while the primary context is current belong to the primary context, and
 * pfJobCreateGraph refuses the graph (naming each kernel node's context). Nothing is pushed when
 * that context is current already (grid-cap mode: the primary one). A green context may be
 * current on one thread at a time: while pushed, the runtime's own uses of it on other threads
 * (graph and GEMM launches on the executor) wait, so keep the pair around warm-up and capture.
 * pfErrorInvalidArgument for a stream that is not a capture stream of `runtime`;
 * pfErrorInvalidState for a pop without a push on this thread. The simulated and host backends
 * have no contexts: the pair only counts. */
PF_API pfResult_t pfGraphCaptureContextPush(pfRuntime_t runtime, void* stream);
PF_API pfResult_t pfGraphCaptureContextPop(pfRuntime_t runtime);

/* ------------------------------------------------------------------------------------------ */
/* Statistics and traces                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct pfStats_t {
  uint64_t iterations;
  uint64_t bubbles;            /* bubbles harvested, timed or not (bubbles_skipped <= bubbles;
                                  those not timed count as skipped, cause pfSkipUntimed) */
  uint64_t bubbles_filled;     /* bubbles that got at least one slice */
  uint64_t bubbles_skipped;    /* not filled: no history, too short, no job, no memory, untimed */
  double bubble_time_us;       /* sum of measured bubble durations */
  double filled_time_us;       /* fill execution time inside bubbles */
  double overrun_time_us;      /* fill execution time after bubble ends (sum) */
  double max_overrun_us;       /* largest single overrun */
  uint64_t slices_launched;
  uint64_t items_completed;
  uint64_t jobs_completed;
  uint64_t jobs_failed;
  double host_begin_end_ns;    /* mean host cost of pfBubbleBegin+pfBubbleEnd */
  /* ---- Appended in 0.3: only pfRuntimeGetStatsV2 writes the fields below ---- */
  double filled_sm_us;         /* sum over slices of (overlap with the bubble) x (SMs granted) */
  double capacity_sm_us;       /* sum over timed bubbles of duration x fill SMs of the partition */
  /* ---- Added in 0.4 (bubble edges, from the slice and bubble events) ---- */
  uint64_t bubbles_fill_started;  /* timed bubbles in which a slice ran fill work */
  double fill_start_delay_us;  /* sum over them of (first working slice's start - bubble begin) */
  double max_fill_start_delay_us; /* the largest of those delays */
  uint64_t slices_past_end;    /* working slices that ended after their bubble's end (still
                                  resident when the main stream passed it; how long they took to
                                  drain is overrun_time_us / max_overrun_us) */
} pfStats_t;

/* The bytes of the 0.1 layout (what pfRuntimeGetStats writes). */
#define PF_STATS_V1_SIZE (offsetof(pfStats_t, host_begin_end_ns) + sizeof(double))

/* Writes the 0.1 fields only (PF_STATS_V1_SIZE bytes), so a caller built against the 0.1 header,
 * whose pfStats_t ends at host_begin_end_ns, is never written past its struct. */
PF_API pfResult_t pfRuntimeGetStats(pfRuntime_t runtime, pfStats_t* stats);
/* Size-checked form: writes min(stats_size, sizeof(pfStats_t)) bytes and zeroes the rest of the
 * caller's stats_size bytes (fields a newer header has and this library does not know read 0).
 * Pass sizeof(pfStats_t). stats_size < PF_STATS_V1_SIZE: pfErrorInvalidArgument. */
PF_API pfResult_t pfRuntimeGetStatsV2(pfRuntime_t runtime, pfStats_t* stats, size_t stats_size);

/* Why a harvested bubble got no fill slice. Each skipped bubble counts under exactly
 * one cause, so the causes sum to pfStats_t.bubbles_skipped; the log at PIPEFILL_DEBUG=trace
 * gives the full sentence for each bubble. */
typedef enum pfSkipCause_t {
  pfSkipNoHistory = 0,    /* its class has fewer than min_samples samples and no expected_us */
  pfSkipTooShort = 1,     /* prediction minus the safety margins fits no item of any job */
  pfSkipNoMemory = 2,     /* a job's workspace (or resident set) does not fit the arena */
  pfSkipNoJob = 3,        /* no runnable fill job (none created, or all finished) */
  pfSkipOptimizer = 4,    /* an optimizer bubble while fill_optimizer_bubbles is 0 */
  pfSkipLate = 5,         /* the bubble ended before its (opaque) slice could be launched */
  pfSkipNoResources = 6,  /* event pools exhausted, or every fill stream/SM already taken */
  pfSkipLaunchFailed = 7, /* every launch attempted failed (the job's callback or the device) */
  pfSkipUntimed = 8,      /* its timings could not be measured (no event pair, stream died) */
  pfSkipOther = 9,        /* anything else (see the trace log) */
  PF_SKIP_CAUSE_COUNT = 10
} pfSkipCause_t;

/* The count of skipped bubbles per pfSkipCause_t: writes min(count, PF_SKIP_CAUSE_COUNT) entries
 * (counts[cause]) and zeroes the rest of the caller's `count` entries (causes a newer header has
 * and this library does not know read 0). count 0 or counts NULL: pfErrorInvalidArgument. */
PF_API pfResult_t pfRuntimeGetSkipCounts(pfRuntime_t runtime, uint64_t* counts, size_t count);

/* A bubble class's counters. Classes are numbered 0.. in the order their first
 * bubble was harvested; the numbering never changes while the runtime lives. */
#define PF_CLASS_KEY_CAPACITY 64
#define PF_CLASS_SKIP_CAPACITY 16
typedef struct pfClassStats_t {
  size_t size;                          /* sizeof(pfClassStats_t): set it before the call */
  char key[PF_CLASS_KEY_CAPACITY];      /* class key: "#<index in iteration>" or the label
                                           (truncated to fit, always NUL-terminated) */
  int kind;                             /* pfBubbleKind_t of the class's last bubble */
  uint64_t bubbles;                     /* harvested bubbles of the class (timed or not) */
  uint64_t bubbles_filled;              /* of them, those that got at least one slice */
  uint64_t bubbles_timed;               /* of them, those whose duration was measured */
  double bubble_time_us;                /* sum of the measured durations */
  double p10_us;                        /* 10th percentile of the predictor's kept window */
  double filled_time_us;                /* fill execution time inside the class's bubbles */
  uint64_t items_completed;             /* fill items completed by its bubbles' slices */
  uint64_t skips[PF_CLASS_SKIP_CAPACITY]; /* skipped bubbles by pfSkipCause_t (the entries from
                                           PF_SKIP_CAUSE_COUNT on are spare, 0) */
  /* Added in 0.4, after the first layout (PF_CLASS_STATS_V1_SIZE bytes): a caller whose size
   * ends before them is written the first layout only. The planner's view of the class now: */
  double p50_us;                /* median of the predictor's kept window */
  double gated_predicted_us;    /* the prediction gated work (ticket, graph) is planned to: the
                                   gated_prediction_quantile of the window (default the median);
                                   0 while the class has fewer than min_samples samples */
  double ungated_predicted_us;  /* the prediction opaque work is planned to (prediction_quantile);
                                   0 likewise */
  uint64_t samples;             /* timed bubbles the predictor has seen for the class */
  uint64_t late_backoffs;       /* times a job's slices kept starting after this class's bubbles
                                   ended and the job was held out of the class until a measured
                                   bubble fitted again (docs/api.md, "Late slices") */
} pfClassStats_t;

/* Bytes of the first pfClassStats_t layout (it ended at skips). */
#define PF_CLASS_STATS_V1_SIZE (offsetof(pfClassStats_t, skips) + sizeof(uint64_t) * PF_CLASS_SKIP_CAPACITY)

/* The number of bubble classes harvested so far. */
PF_API pfResult_t pfRuntimeGetClassCount(pfRuntime_t runtime, size_t* count);
/* Class `index` (0 .. count-1). Set stats->size first: a size below PF_CLASS_STATS_V1_SIZE is
 * pfErrorInvalidArgument; a size between it and sizeof(pfClassStats_t) gets the fields it holds;
 * a larger one (a later header) gets this layout's bytes and zeroes after them, up to
 * PF_MAX_STRUCT_SIZE (above it: pfErrorInvalidArgument, an uninitialised size).
 * index out of range: pfErrorInvalidArgument. */
PF_API pfResult_t pfRuntimeGetClassStats(pfRuntime_t runtime, size_t index, pfClassStats_t* stats);

/* The safety margin of one bubble class, in place of safety_margin_us for its bubbles: the tail
 * of the bubble that fill must leave free, i.e. the time the communication that ends it moves
 * bytes (a p2p receive's transfer, slowed by fill beside it). A bubble that ends in a collective
 * that moves no bytes (a wait for the other stages) needs none: 0 fills it up to its predicted
 * end, and the gate still stops the fill there. class_key is the class's key as
 * pfRuntimeGetClassStats prints it: the hint's label, or "#<index in iteration>" for unlabeled
 * bubbles; the class need not exist yet. margin_us < 0 removes the class's margin (the
 * runtime's safety_margin_us applies again); NaN or infinite: pfErrorInvalidArgument. The
 * margin fraction still applies. Takes effect from the next bubble planned. */
PF_API pfResult_t pfRuntimeSetClassMargin(pfRuntime_t runtime, const char* class_key,
                                          double margin_us);

/* The runtime's fill streams: cudaStream_t on CUDA (lowest priority, in the fill partition's green
 * context when there is one), the simulated / host stream handles otherwise. For observing fill
 * work from a framework (e.g. torch.cuda.ExternalStream, events, profilers): never enqueue
 * main-job work on them and never destroy them; they live as long as the runtime. Writes
 * min(capacity, *count) handles into streams (streams may be NULL when capacity is 0) and the
 * number of fill streams into *count. count NULL: pfErrorInvalidArgument. */
PF_API pfResult_t pfRuntimeGetFillStreams(pfRuntime_t runtime, void** streams, size_t capacity,
                                          size_t* count);

/* Writes a Chrome trace (JSON, opens in Perfetto / chrome://tracing) of the bubbles and fill
 * slices harvested so far. Byte-identical for identical simulated runs. */
PF_API pfResult_t pfTraceWrite(pfRuntime_t runtime, const char* path);

/* ---- Memory: what fill jobs can still get ------------------------------------------------- */
/* The fill arena's use and the device's memory, measured at the call (for capacity reports,
 * e.g. the fill-job service's agent). Versioned like pfClassStats_t. */
typedef struct pfMemoryInfo_t {
  size_t size;                /* sizeof(pfMemoryInfo_t): set it before the call */
  size_t arena_bytes;         /* the fill arena (resolved pfConfig_t.arena_bytes; 0: none) */
  size_t arena_used_bytes;    /* of it, held now by jobs' resident sets and slice workspaces */
  size_t arena_largest_free_bytes; /* the largest block a new job's resident set could get */
  size_t device_free_bytes;   /* device memory free at the call (cudaMemGetInfo on CUDA) */
  size_t device_total_bytes;  /* the device's memory */
} pfMemoryInfo_t;

/* Fills `info` (set info->size first: a size below this layout's sizeof(pfMemoryInfo_t) is
 * pfErrorInvalidArgument; a larger one gets this layout's bytes and zeroes after them). May
 * synchronise with the device, so it is refused (pfErrorInvalidState, nothing written) on a
 * thread that has a bubble open. */
PF_API pfResult_t pfRuntimeGetMemoryInfo(pfRuntime_t runtime, pfMemoryInfo_t* info);

/* ---- Fill-slice observer (a framework profiler's view of the fill slices) ----------------- */
/* So that fill slices appear in a framework's own profiler (torch.profiler: a record_function
 * range on the thread that runs them, python/pipefill/_profiler.py), the real-time host backend
 * calls an observer on the fill stream's thread when each slice starts (after its bubble's
 * begin, before its work) and when it ends (after its work, before the runtime's end record,
 * so the slice is harvested only once the end call returned). */
typedef enum pfSlicePhase_t {
  pfSliceStart = 0,
  pfSliceEnd = 1
} pfSlicePhase_t;

typedef struct pfSliceEvent_t {
  size_t size;          /* sizeof(pfSliceEvent_t) of the library: read no field beyond it */
  int phase;            /* pfSlicePhase_t */
  int fill_stream;      /* index of the fill stream (pfRuntimeGetFillStreams order) */
  uint64_t bubble_id;   /* the bubble the slice fills (ids as in pfTraceWrite's trace) */
  uint64_t first_item;  /* the job's next item when the slice was launched (a hint) */
  uint64_t max_items;   /* the slice's item budget */
  const char* job_name; /* valid during the call only */
} pfSliceEvent_t;

typedef void (*pfSliceObserverFn)(void* user, const pfSliceEvent_t* event);

/* Sets (fn != NULL) or removes (fn NULL) the slice observer; slices launched afterwards call it
 * twice each (also a slice whose launch callback failed: it ran nothing; a device error that
 * drops a slice's tail drops its end call). The observer runs on a fill stream's thread and the
 * fill stream waits for it: it must return soon and call nothing of the runtime. `user` must
 * stay valid until the runtime was synchronized (pfRuntimeSynchronize) after a removal, or
 * destroyed. Host backend only: pfErrorNotSupported
 * on the others, naming the backend (CUDA: fill kernels are in the profiler's GPU trace through
 * CUPTI already; simulated: slices run in virtual time, inside pfSimRunUntilIdle). */
PF_API pfResult_t pfRuntimeSetSliceObserver(pfRuntime_t runtime, pfSliceObserverFn fn,
                                            void* user);

/* ------------------------------------------------------------------------------------------ */
/* Simulated backend: drive a whole simulated pipeline from C                                  */
/* ------------------------------------------------------------------------------------------ */
/* A world is a set of simulated GPUs sharing one virtual clock. Work is enqueued on streams and
 * executed by pfSimRunUntilIdle in virtual time (deterministic for a seed). */

typedef struct pfSimEvent* pfSimEvent_t;

/* The simulated device (docs/simulated-device.md). Kernels are blocks dispatched to SMs as SMs
 * free up, higher-priority streams' pending blocks first, at equal priority main work before
 * fill launches, then launch order; running blocks are never preempted. Co-running kernels interfere through memory bandwidth:
 *   fill load  L_fill = sum over resident fill blocks of mem_intensity / sm_count
 *   main load  L_main = resident main-kernel blocks * main_mem_intensity / sm_count
 *   a main-kernel block group runs    block_us * jitter of work at rate 1 / (1 + interference *
 *                                     L_fill(t)), re-timed whenever the fill load changes
 *   a fill item (batch) takes         item_us  * jitter * (1 + fill_slowdown * L_main * sensitivity)
 *   a wait's transfer takes           transfer_us * (1 + comm_slowdown * L_fill)
 * (items and transfers evaluated when they start). The defaults are calibrated from
 * published measurements (see the doc for each source and its sensitivity range).
 *
 * Version 2 appended `size` and the fields after it. Always start from
 * PF_SIM_DEVICE_DESC_INITIALIZER. A description whose size is 0 (a version-1 aggregate that
 * lists only the first four fields) keeps version 1's coefficients: `interference` with every
 * intensity 1, no fill or comm slowdown (dispatch and re-timing are this version's). */
typedef struct pfSimDeviceDesc_t {
  int sm_count;           /* default 132 (H100/H200) */
  size_t memory_bytes;    /* default 141 GiB */
  double jitter_fraction; /* relative std-dev of kernel and item durations (default 0) */
  double interference;    /* beta: main kernels slowed per unit of fill load (default 0.6) */
  /* Version 2. */
  size_t size;               /* sizeof(pfSimDeviceDesc_t); 0 = a version-1 description */
  double fill_mem_intensity; /* memory intensity of fill launches that give none (default 0.5) */
  double fill_slowdown;      /* beta_f: fill items slowed per unit of main load (default 0.6) */
  double comm_slowdown;      /* gamma: wait transfers slowed per unit of fill load (default 0.5) */
  double main_mem_intensity; /* memory intensity of main-kernel blocks (default 1.0) */
} pfSimDeviceDesc_t;

#define PF_SIM_DEVICE_DESC_INITIALIZER \
  {132, 141ULL << 30, 0.0, 0.6, sizeof(pfSimDeviceDesc_t), 0.5, 0.6, 0.5, 1.0}
/* The same device with every interference coefficient 0 (beta, beta_f, gamma): co-running
 * kernels do not slow each other. For tests whose expected times assume no interference, and
 * for the "interference off" sensitivity row; not a model of a real GPU. */
#define PF_SIM_DEVICE_DESC_NO_INTERFERENCE_INITIALIZER \
  {132, 141ULL << 30, 0.0, 0.0, sizeof(pfSimDeviceDesc_t), 0.5, 0.0, 0.0, 1.0}

PF_API pfResult_t pfSimWorldCreate(int device_count, const pfSimDeviceDesc_t* desc,
                                   uint64_t seed, pfSimWorld_t* world);
PF_API pfResult_t pfSimWorldDestroy(pfSimWorld_t world);
/* The world a simulated runtime runs in (its private one when config.sim_world was NULL). */
PF_API pfResult_t pfRuntimeGetSimWorld(pfRuntime_t runtime, pfSimWorld_t* world);

/* Streams: priority follows CUDA (lower number = higher priority; 0 is the lowest). */
PF_API pfResult_t pfSimStreamCreate(pfSimWorld_t world, int device, int priority, void** stream);

/* A main-job kernel of min(sm_count, SMs of the device) blocks of `duration_us` each: one wave
 * when that many SMs are free. Its blocks start as SMs free up (a kernel starts partially when
 * only some are free: resident fill blocks delay its other blocks). */
PF_API pfResult_t pfSimLaunchKernel(void* stream, double duration_us, int sm_count);
/* A main-job kernel of `blocks` blocks of `block_us` each, one block per SM, run in waves when
 * blocks > SMs (not clamped to the device). */
PF_API pfResult_t pfSimLaunchKernelBlocks(void* stream, int blocks, double block_us);

/* Occupies the stream for `duration_us` without using SMs (host-side delay, a copy). */
PF_API pfResult_t pfSimStreamDelay(void* stream, double duration_us);

/* Events across the world's streams (also across devices): a communication edge. */
PF_API pfResult_t pfSimEventCreate(pfSimWorld_t world, pfSimEvent_t* event);
PF_API pfResult_t pfSimEventRecord(pfSimEvent_t event, void* stream);
/* The stream waits for the event's latest record plus `latency_us`; while waiting it keeps a
 * communication kernel of `sm_count` SMs resident (0: none), like a spinning NCCL recv. With
 * sm_count > 0 the latency is the kernel's transfer (the time it moves the data after the
 * peer's record), slowed by comm_slowdown: the same as
 * pfSimStreamWaitEventTransfer(stream, event, 0, latency_us, sm_count). With sm_count == 0 it
 * is a plain dependency delay: pfSimStreamWaitEventTransfer(stream, event, latency_us, 0, 0). */
PF_API pfResult_t pfSimStreamWaitEvent(void* stream, pfSimEvent_t event, double latency_us,
                                       int sm_count);
/* The wait completes at max(start, record time + latency_us + transfer_us * (1 + comm_slowdown *
 * fill load when the transfer starts)): the spin before the record is not slowed, the fixed
 * latency is not slowed, only the transfer is. */
PF_API pfResult_t pfSimStreamWaitEventTransfer(void* stream, pfSimEvent_t event,
                                               double latency_us, double transfer_us,
                                               int sm_count);
/* Completion time of the event's latest record (negative while not completed). */
PF_API pfResult_t pfSimEventTime(pfSimEvent_t event, double* time_us);

/* Per-item callback for simulated fill work: called in virtual time as each item completes. */
typedef void (*pfSimItemFn)(void* user, uint64_t item);

/* A ticket fill kernel for the slice (use from a job's launch callback on the sim backend):
 * min(slice->max_blocks, blocks) persistent blocks claim items from slice->cursor while the
 * gate is open and the slice budget lasts; each item takes item_cost_us (with jitter). */
PF_API pfResult_t pfSimLaunchTicketKernel(void* stream, const pfSliceDesc_t* slice, int blocks,
                                          double item_cost_us, pfSimItemFn on_item, void* user);
/* Ungated work: `items` items back to back on `blocks` SMs, each item_cost_us. */
PF_API pfResult_t pfSimLaunchOpaque(void* stream, uint64_t first_item, uint64_t items,
                                    int blocks, double item_cost_us, pfSimItemFn on_item,
                                    void* user);

/* How a fill job's blocks contend for memory bandwidth (per launch: the intensity belongs to
 * the job). Start from PF_SIM_FILL_DESC_INITIALIZER; a negative value takes the default. */
typedef struct pfSimFillDesc_t {
  size_t size;            /* sizeof(pfSimFillDesc_t) */
  double mem_intensity;   /* share of HBM bandwidth per unit of SM share, >= 0 (default: the
                             device's fill_mem_intensity; decode ~1.0, inference ~0.5,
                             training ~0.4) */
  double mem_sensitivity; /* how strongly main work slows this job's items, >= 0 (default 1) */
} pfSimFillDesc_t;

#define PF_SIM_FILL_DESC_INITIALIZER {sizeof(pfSimFillDesc_t), -1.0, -1.0}

/* pfSimLaunchTicketKernel / pfSimLaunchOpaque with the job's memory behaviour (fill may be NULL:
 * the defaults, which is what the shorter calls use). */
PF_API pfResult_t pfSimLaunchTicketKernelEx(void* stream, const pfSliceDesc_t* slice, int blocks,
                                            double item_cost_us, const pfSimFillDesc_t* fill,
                                            pfSimItemFn on_item, void* user);
PF_API pfResult_t pfSimLaunchOpaqueEx(void* stream, uint64_t first_item, uint64_t items,
                                      int blocks, double item_cost_us,
                                      const pfSimFillDesc_t* fill, pfSimItemFn on_item,
                                      void* user);

/* Runs every enqueued operation of the world (and the runtimes attached to it) to completion. */
PF_API pfResult_t pfSimRunUntilIdle(pfSimWorld_t world);
/* Runs until virtual time `time_us` (or idle, whichever is first). */
PF_API pfResult_t pfSimRunUntil(pfSimWorld_t world, double time_us);
PF_API pfResult_t pfSimNow(pfSimWorld_t world, double* time_us);
/* Device memory the simulated main job uses on `device` (<= the device's memory): the free
 * memory a runtime sees is memory_bytes - this - its arena. */
PF_API pfResult_t pfSimSetMemoryUsed(pfSimWorld_t world, int device, size_t bytes);
/* Work already enqueued on the stream still runs; the handle is invalid afterwards. */
PF_API pfResult_t pfSimStreamDestroy(void* stream);
/* Waits already enqueued on the event keep their record; the handle is invalid afterwards. */
PF_API pfResult_t pfSimEventDestroy(pfSimEvent_t event);

/* ------------------------------------------------------------------------------------------ */
/* Host (real-time) backend                                                                    */
/* ------------------------------------------------------------------------------------------ */
/* pfBackendHost runs the device on CPU threads in real time, to test the asynchronous paths
 * (the executor thread reacting late, gates closing while fill work runs) without a GPU; see
 * docs/host-device.md. Each stream is a thread executing its operations in order; events carry
 * steady-clock times (µs since the device was made); device words are atomics; ticket kernels
 * are blocks run by a pool of SM threads that claim items with the protocol of device.cuh
 * (pipefill/item_protocol.hpp). Every runtime gets its own host device. Tunables, read when the
 * runtime is created (not in pfConfig_t):
 *   PIPEFILL_HOST_SMS=<1..1024>          SM threads of the device (default 8)
 *   PIPEFILL_HOST_MEMORY_BYTES=<size>    memory the device reports, arenas are real host memory
 *                                        (default 64M)
 * Main-job streams come from pfStreamCreateHighPriority, the fill stream is the `stream` of a
 * job's launch callback. A stream handle is refused (pfErrorInvalidArgument) once destroyed,
 * also after its runtime was destroyed. */

/* The work of one fill item, run on an SM thread. It may enqueue host-backend operations but
 * must not synchronise (pfHostStreamSynchronize, pfRuntimeSynchronize, pfJobWait). */
typedef void (*pfHostItemFn)(void* user, uint64_t item);
/* A host function run on a stream's thread. */
typedef void (*pfHostFn)(void* user);

/* A ticket fill kernel for the slice (use from a job's launch callback): when it reaches the
 * stream head, min(blocks, slice->max_blocks, fill SMs) blocks claim items from slice->cursor
 * while the gate is open and the slice budget lasts, each running item_fn(user, item) (NULL: an
 * empty item); the stream moves on once every block has stopped. Overrun past the gate close is
 * one item per block. The slice's words must be 8-byte aligned and stay valid until it ran. */
PF_API pfResult_t pfHostLaunchTicketKernel(void* stream, const pfSliceDesc_t* slice, int blocks,
                                           pfHostItemFn item_fn, void* user);
/* Ungated work: items first_item .. first_item + items - 1 handed out to min(blocks, fill SMs)
 * blocks, ignoring the gate (like a library call that cannot be interrupted). */
PF_API pfResult_t pfHostLaunchOpaque(void* stream, uint64_t first_item, uint64_t items,
                                     int blocks, pfHostItemFn item_fn, void* user);
/* A main-job operation: occupies the stream for duration_us (finite, >= 0) of real time. */
PF_API pfResult_t pfHostStreamDelay(void* stream, double duration_us);
/* Runs fn(user) on the stream's thread when it reaches the stream head; later operations of the
 * stream wait until it returns (like cudaLaunchHostFunc). A test can make a main stream wait on
 * a latch it controls this way. fn must not synchronise its own stream. */
PF_API pfResult_t pfHostLaunchHostFunc(void* stream, pfHostFn fn, void* user);
/* Blocks until every operation enqueued on the stream before the call has executed. Refused
 * (pfErrorInvalidState) from inside a callback (launch, item_fn, host function). */
PF_API pfResult_t pfHostStreamSynchronize(void* stream);
/* The host device's clock (µs since the device was made: the clock of its event times and of the
 * runtime's trace) of the device owning `stream`. Callable from item functions. */
PF_API pfResult_t pfHostNow(void* stream, double* time_us);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PIPEFILL_PIPEFILL_H_ */
