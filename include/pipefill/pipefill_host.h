/*
 * PipeFill C API: the real-time host device (pfHost*): CPU threads as streams and SMs, to test
 * the asynchronous paths without a GPU (docs/host-device.md).
 *
 * pipefill/pipefill.h includes this header at its end, so `#include <pipefill/pipefill.h>`
 * declares everything here; this header includes pipefill.h first, so it also compiles alone
 * and either may be included first. C99, no CUDA header, like pipefill.h (the conventions of
 * its top comment hold here: pfResult_t results, microseconds, bytes).
 */
#ifndef PIPEFILL_PIPEFILL_HOST_H_
#define PIPEFILL_PIPEFILL_HOST_H_

#include "pipefill/pipefill.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#endif /* PIPEFILL_PIPEFILL_HOST_H_ */
