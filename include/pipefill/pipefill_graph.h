/*
 * PipeFill C API: graph fill jobs (any captured CUDA graph as a gated fill item: pfGraphJobDesc_t,
 * pfJobCreateGraph) and the capture streams and contexts their graphs are captured on.
 *
 * pipefill/pipefill.h includes this header at its end, so `#include <pipefill/pipefill.h>`
 * declares everything here; this header includes pipefill.h first, so it also compiles alone
 * and either may be included first. C99, no CUDA header, like pipefill.h (the conventions of
 * its top comment hold here: pfResult_t results, microseconds, bytes).
 */
#ifndef PIPEFILL_PIPEFILL_GRAPH_H_
#define PIPEFILL_PIPEFILL_GRAPH_H_

#include "pipefill/pipefill.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Graph fill jobs: any captured CUDA graph as a fill item                                     */
/* ------------------------------------------------------------------------------------------ */

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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PIPEFILL_PIPEFILL_GRAPH_H_ */
