/*
 * Example fill jobs for PipeFill, callable from C: batch inference of an MLP or of a
 * transformer encoder layer, and a small training job (forward, backward, SGD) whose items
 * are resumable SGD steps.
 *
 * A job is created from fjParams_t and handed to the runtime through the pfJobDesc_t that
 * fjJobGetDesc fills in. On the simulated backend each item's real result is computed on the
 * CPU as the item completes in virtual time (pfSimLaunchTicketKernel / pfSimLaunchOpaque with
 * the item's modelled cost), so outputs are checkable without a GPU; on the host backend an SM
 * thread computes it and then sleeps out the rest of the item's modelled cost in real time
 * (pfHostLaunchTicketKernel / pfHostLaunchOpaque). Inference computes only the items it keeps
 * (keep_every; 0: none, the items then cost no CPU time); training computes every SGD step.
 * On the CUDA backend the job runs cuBLAS work (opaque) or ticket kernels written with
 * pipefill/device.cuh.
 *
 * Lifetime: destroy the pfJob_t (pfJobDestroy) before fjJobDestroy.
 */
#ifndef PIPEFILL_FILL_JOBS_H_
#define PIPEFILL_FILL_JOBS_H_

#include <stddef.h>
#include <stdint.h>

#include "pipefill/pipefill.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fjJob* fjJob_t;

typedef enum fjKind_t {
  fjMlpInference = 0,     /* y = W2 gelu(W1 x + b1) + b2; item = `rows` samples */
  fjEncoderInference = 1, /* pre-LN transformer encoder layer; item = one sequence */
  fjTraining = 2,         /* 2-layer tanh MLP regression; item = one SGD step, in order */
  fjKindCount = 3
} fjKind_t;

typedef enum fjExecution_t {
  fjExecTicket = 0, /* gated persistent blocks, one item per block at a time */
  fjExecOpaque = 1  /* ungated library-style work (cuBLAS), admitted only when it fits */
} fjExecution_t;

typedef struct fjParams_t {
  int kind;        /* fjKind_t */
  int backend;     /* pfBackendSim, pfBackendHost or pfBackendCuda (the runtime's backend) */
  int execution;   /* fjExecution_t */
  uint64_t items;  /* item count (> 0) */
  uint64_t seed;   /* weights and inputs are a pure function of the seed */
  int priority;    /* pfJobDesc_t::priority */
  /* Shapes. MLP: input, hidden, output, rows. Encoder: hidden, heads, ffn, seq.
   * Training: input, hidden, output, rows (= batch), learning_rate. */
  int input, hidden, output, rows;
  int heads, ffn, seq;
  float learning_rate;
  /* Cost model (simulated backend and the planner's initial estimate). */
  double item_cost_us;        /* <= 0: derived from the FLOP count and the rates below */
  double ticket_flops_per_us; /* one SM running a ticket item (fp32 CUDA cores), <= 0: default */
  double opaque_flops_per_us; /* one SM running cuBLAS (TF32 tensor cores), <= 0: default */
  int opaque_blocks;          /* training: SMs one step's kernels spread over (cost model) */
  int parallelism;            /* items in flight at once (0: all fill SMs; training: 1) */
  /* Inference: keep the output of every Nth item for checking (1: all, 0: none). */
  uint64_t keep_every;
  /* Simulated backend, optional: called after every completed item (after the job's own
   * accounting), on the thread that runs the simulated world. The example engine uses it to
   * measure when fill work ran, the same way for its own launches and the runtime's. */
  void (*on_item)(void* user, uint64_t item);
  void* on_item_user;
} fjParams_t;

typedef struct fjProgress_t {
  uint64_t items_done;       /* distinct items whose result was computed (sim) */
  uint64_t duplicate_items;  /* items computed more than once (must stay 0) */
  uint64_t out_of_order;     /* training steps that arrived out of order (must stay 0) */
  uint64_t outputs_kept;     /* inference outputs stored for checking */
  double first_loss;         /* training: loss of step 0's batch (NaN before) */
  double last_loss;          /* training: loss of the latest step's batch (NaN before) */
} fjProgress_t;

/* Defaults for a kind (shapes, cost model, execution) on a backend. */
pfResult_t fjParamsInit(fjParams_t* params, int kind, int backend);
pfResult_t fjJobCreate(const fjParams_t* params, fjJob_t* job);
/* The descriptor to pass to pfJobCreate (user points at the job). */
pfResult_t fjJobGetDesc(fjJob_t job, pfJobDesc_t* desc);
pfResult_t fjJobGetProgress(fjJob_t job, fjProgress_t* progress);
/* Inference: copies item's output (count floats: rows*output or seq*hidden). Sim: the output
 * must have been kept (keep_every). CUDA: read back from device memory (outside bubbles). */
pfResult_t fjJobGetOutput(fjJob_t job, uint64_t item, float* out, size_t count);
/* Training: loss of the current parameters on a fixed held-out batch. */
pfResult_t fjJobEvaluationLoss(fjJob_t job, double* loss);
/* Training: copies the current parameters (count = fjJobParameterCount) in the CPU reference's
 * layout (w1, b1, w2, b2). CUDA: read back from device memory (outside bubbles). */
pfResult_t fjJobGetParameters(fjJob_t job, float* out, size_t count);
pfResult_t fjJobParameterCount(fjJob_t job, size_t* count);
/* Modelled cost of one item (what the job tells the planner). */
pfResult_t fjJobItemCost(fjJob_t job, double* item_cost_us);
pfResult_t fjJobDestroy(fjJob_t job);
const char* fjKindName(int kind);
/* Message of the last failing fj call on this thread ("" when none). */
const char* fjGetLastErrorMessage(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PIPEFILL_FILL_JOBS_H_ */
