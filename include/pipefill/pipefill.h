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
 *
 * The API is split by concern over several headers; this one includes the others at its end, so
 * including it alone declares the whole API (each of them may also be included alone or first):
 *   pipefill.h          versions, results and errors, handles, configuration, runtime, streams,
 *                       bubbles, jobs (C jobs, item costs, streaming), the skip causes' enum
 *   pipefill_graph.h    graph fill jobs, graph capture streams and contexts
 *   pipefill_observe.h  statistics, skip counts, class statistics and margins, fill streams,
 *                       traces, memory info, the fill-slice observer
 *   pipefill_sim.h      the simulated device (pfSim*)
 *   pipefill_host.h     the real-time host device (pfHost*)
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

/* ---- Skip causes ---------------------------------------------------------------------------- */
/* Why a harvested bubble got no fill slice. Each skipped bubble counts under exactly
 * one cause, so the causes sum to pfStats_t.bubbles_skipped; the log at PIPEFILL_DEBUG=trace
 * gives the full sentence for each bubble. Counted by pfRuntimeGetSkipCounts and
 * pfClassStats_t.skips (pipefill_observe.h); the enum is in this header with the other
 * enumerations the Python bindings mirror (their tests read its values from this file). */
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

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The rest of the API (top comment): each of these includes this header first. */
#include "pipefill/pipefill_graph.h"    /* NOLINT(build/include) */
#include "pipefill/pipefill_observe.h"  /* NOLINT(build/include) */
#include "pipefill/pipefill_sim.h"      /* NOLINT(build/include) */
#include "pipefill/pipefill_host.h"     /* NOLINT(build/include) */

#endif /* PIPEFILL_PIPEFILL_H_ */
