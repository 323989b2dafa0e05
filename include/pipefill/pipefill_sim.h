/*
 * PipeFill C API: the simulated device (pfSim*): worlds of simulated GPUs in virtual time, their
 * streams, main-job kernels, events and transfers, and the simulated fill launches
 * (docs/simulated-device.md). pfSimWorld_t is declared in pipefill.h (pfConfig_t holds one).
 *
 * pipefill/pipefill.h includes this header at its end, so `#include <pipefill/pipefill.h>`
 * declares everything here; this header includes pipefill.h first, so it also compiles alone
 * and either may be included first. C99, no CUDA header, like pipefill.h (the conventions of
 * its top comment hold here: pfResult_t results, microseconds, bytes).
 */
#ifndef PIPEFILL_PIPEFILL_SIM_H_
#define PIPEFILL_PIPEFILL_SIM_H_

#include "pipefill/pipefill.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PIPEFILL_PIPEFILL_SIM_H_ */
