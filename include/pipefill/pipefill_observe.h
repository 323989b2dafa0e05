/*
 * PipeFill C API: what a runtime reports - statistics (pfStats_t), skip counts, per-class
 * statistics and margins, the fill streams, Chrome traces, the fill arena's memory and the
 * fill-slice observer. The skip causes' enum (pfSkipCause_t) is in pipefill.h.
 *
 * pipefill/pipefill.h includes this header at its end, so `#include <pipefill/pipefill.h>`
 * declares everything here; this header includes pipefill.h first, so it also compiles alone
 * and either may be included first. C99, no CUDA header, like pipefill.h (the conventions of
 * its top comment hold here: pfResult_t results, microseconds, bytes).
 */
#ifndef PIPEFILL_PIPEFILL_OBSERVE_H_
#define PIPEFILL_PIPEFILL_OBSERVE_H_

#include "pipefill/pipefill.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PIPEFILL_PIPEFILL_OBSERVE_H_ */
