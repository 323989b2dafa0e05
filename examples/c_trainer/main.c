/*
 * c_trainer: a custom trainer written in plain C99 against the PipeFill C API only.
 *
 * It runs a simulated 4-stage 1F1B pipeline (8 micro-batches per iteration) twice - once
 * without filling and once with one inference fill job per stage - and prints a table:
 * bubbles, bubble time, filled time, fill items done and the main job's slowdown.
 *
 * The engine pattern it shows: for every receive a stage waits on, call pfBubbleBegin right
 * before the wait and pfBubbleEnd right after it (stream-ordered; the CPU never waits), and
 * pfIterationEnd after each iteration. Bubbles that turn out to be empty are learned and skipped.
 *
 * Usage: c_trainer [--iterations N] [--items N] [--item-us X]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipefill/pipefill.h"

#define STAGES 4
#define MICROBATCHES 8
#define SMS 132
#define COMM_SMS 8
#define FORWARD_US 100.0
#define BACKWARD_US 200.0
#define LINK_US 5.0

#define CHECK(call)                                                                    \
  do {                                                                                 \
    pfResult_t check_result_ = (call);                                                 \
    if (check_result_ != pfSuccess) {                                                  \
      fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,        \
              pfGetErrorString(check_result_), pfGetLastErrorMessage());               \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

/* ---- the fill job: batch inference items of item_us each, claimed by gated blocks ------- */

typedef struct {
  double item_us;
  unsigned long long items_run;
} FillJob;

static void on_item(void* user, uint64_t item) {
  (void)item;
  ((FillJob*)user)->items_run++;
}

static pfResult_t launch_slice(void* user, const pfSliceDesc_t* slice, void* stream) {
  FillJob* job = (FillJob*)user;
  /* On a GPU this would launch the job's ticket kernel (include/pipefill/device.cuh). */
  return pfSimLaunchTicketKernel(stream, slice, slice->max_blocks, job->item_us, on_item, job);
}

/* ---- the pipeline ------------------------------------------------------------------- */

typedef struct {
  int is_forward;
  int microbatch;
} Op;

/* 1F1B order of one stage: warm-up forwards, then one forward / one backward, then drain. */
static int one_f_one_b(int stage, Op* ops) {
  int warmup = STAGES - stage - 1, n = 0, i;
  if (warmup > MICROBATCHES) warmup = MICROBATCHES;
  for (i = 0; i < warmup; ++i) { ops[n].is_forward = 1; ops[n].microbatch = i; ++n; }
  for (i = 0; i < MICROBATCHES - warmup; ++i) {
    ops[n].is_forward = 1; ops[n].microbatch = warmup + i; ++n;
    ops[n].is_forward = 0; ops[n].microbatch = i; ++n;
  }
  for (i = MICROBATCHES - warmup; i < MICROBATCHES; ++i) {
    ops[n].is_forward = 0; ops[n].microbatch = i; ++n;
  }
  return n;
}

typedef struct {
  pfSimWorld_t world;
  void* stream[STAGES];
  pfSimEvent_t forward_done[STAGES][MICROBATCHES];
  pfSimEvent_t backward_done[STAGES][MICROBATCHES];
  pfSimEvent_t stage_done[STAGES];
  pfRuntime_t runtime[STAGES]; /* NULL: no filling */
} Pipeline;

static void recv_wait(Pipeline* p, int stage, pfSimEvent_t dependency) {
  void* s = p->stream[stage];
  if (p->runtime[stage] != NULL) {
    pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
    CHECK(pfBubbleBegin(p->runtime[stage], s, &hint));
  }
  /* A spinning NCCL recv: holds COMM_SMS SMs until the peer's data arrives. */
  CHECK(pfSimStreamWaitEvent(s, dependency, LINK_US, COMM_SMS));
  if (p->runtime[stage] != NULL) CHECK(pfBubbleEnd(p->runtime[stage], s));
}

/* Enqueues one iteration: ops of every stage whose dependency is already enqueued, round robin
 * (so each event record is enqueued before the wait that needs it), then the end-of-iteration
 * barrier (the drain bubble); runs the world and returns the iteration's end time. */
static double run_iteration(Pipeline* p) {
  Op ops[STAGES][2 * MICROBATCHES];
  int count[STAGES], next[STAGES], s, other, progressed;
  int forward_enqueued[STAGES][MICROBATCHES], backward_enqueued[STAGES][MICROBATCHES];
  double end = 0.0;
  memset(forward_enqueued, 0, sizeof forward_enqueued);
  memset(backward_enqueued, 0, sizeof backward_enqueued);
  for (s = 0; s < STAGES; ++s) { count[s] = one_f_one_b(s, ops[s]); next[s] = 0; }
  do {
    progressed = 0;
    for (s = 0; s < STAGES; ++s) {
      while (next[s] < count[s]) {
        const Op* op = &ops[s][next[s]];
        const int mb = op->microbatch;
        if (op->is_forward) {
          if (s > 0 && !forward_enqueued[s - 1][mb]) break;
          if (s > 0) recv_wait(p, s, p->forward_done[s - 1][mb]);
          CHECK(pfSimLaunchKernel(p->stream[s], FORWARD_US, SMS));
          CHECK(pfSimEventRecord(p->forward_done[s][mb], p->stream[s]));
          forward_enqueued[s][mb] = 1;
        } else {
          if (s < STAGES - 1 && !backward_enqueued[s + 1][mb]) break;
          if (s < STAGES - 1) recv_wait(p, s, p->backward_done[s + 1][mb]);
          CHECK(pfSimLaunchKernel(p->stream[s], BACKWARD_US, SMS));
          CHECK(pfSimEventRecord(p->backward_done[s][mb], p->stream[s]));
          backward_enqueued[s][mb] = 1;
        }
        ++next[s];
        progressed = 1;
      }
    }
  } while (progressed);
  for (s = 0; s < STAGES; ++s) CHECK(pfSimEventRecord(p->stage_done[s], p->stream[s]));
  for (s = 0; s < STAGES; ++s) {
    if (p->runtime[s] != NULL) {
      pfBubbleHint_t hint = PF_BUBBLE_HINT_INITIALIZER;
      hint.kind = pfBubbleDrain;
      CHECK(pfBubbleBegin(p->runtime[s], p->stream[s], &hint));
    }
    for (other = 0; other < STAGES; ++other) {
      if (other != s) CHECK(pfSimStreamWaitEvent(p->stream[s], p->stage_done[other], LINK_US, COMM_SMS));
    }
    if (p->runtime[s] != NULL) {
      CHECK(pfBubbleEnd(p->runtime[s], p->stream[s]));
      CHECK(pfIterationEnd(p->runtime[s]));
    }
    CHECK(pfSimEventRecord(p->stage_done[s], p->stream[s]));
  }
  CHECK(pfSimRunUntilIdle(p->world));
  for (s = 0; s < STAGES; ++s) {
    double t = 0.0;
    CHECK(pfSimEventTime(p->stage_done[s], &t));
    if (t > end) end = t;
  }
  return end;
}

typedef struct {
  double seconds;
  pfStats_t total; /* summed over stages */
  unsigned long long items_run;
} RunResult;

static RunResult run(int fill, int iterations, uint64_t items, double item_us) {
  Pipeline p;
  FillJob jobs[STAGES];
  pfJob_t handles[STAGES];
  pfSimDeviceDesc_t desc = PF_SIM_DEVICE_DESC_INITIALIZER;
  RunResult result;
  int s, mb, it;
  double end = 0.0;
  memset(&p, 0, sizeof p);
  memset(&result, 0, sizeof result);
  desc.sm_count = SMS;
  CHECK(pfSimWorldCreate(STAGES, &desc, 42, &p.world));
  for (s = 0; s < STAGES; ++s) {
    CHECK(pfSimStreamCreate(p.world, s, -1, &p.stream[s]));
    for (mb = 0; mb < MICROBATCHES; ++mb) {
      CHECK(pfSimEventCreate(p.world, &p.forward_done[s][mb]));
      CHECK(pfSimEventCreate(p.world, &p.backward_done[s][mb]));
    }
    CHECK(pfSimEventCreate(p.world, &p.stage_done[s]));
    if (fill) {
      pfConfig_t config = PF_CONFIG_INITIALIZER;
      pfJobDesc_t job = PF_JOB_DESC_INITIALIZER;
      config.backend = pfBackendSim;
      config.sim_world = p.world;
      config.device = s;
      config.stage_id = s;
      config.stage_count = STAGES;
      config.reserved_sms = COMM_SMS; /* the recv kernels keep their SMs */
      CHECK(pfRuntimeCreate(&config, &p.runtime[s]));
      jobs[s].item_us = item_us;
      jobs[s].items_run = 0;
      job.name = "batch-inference";
      job.kind = pfJobTicket;
      job.item_count = items;
      job.item_cost_hint_us = item_us;
      job.user = &jobs[s];
      job.launch = launch_slice;
      CHECK(pfJobCreate(p.runtime[s], &job, &handles[s]));
    }
  }
  for (it = 0; it < iterations; ++it) end = run_iteration(&p);
  result.seconds = end * 1e-6;
  for (s = 0; s < STAGES; ++s) {
    if (!fill) continue;
    {
      pfStats_t st;
      CHECK(pfRuntimeSynchronize(p.runtime[s]));
      CHECK(pfRuntimeGetStats(p.runtime[s], &st));
      result.total.bubbles += st.bubbles;
      result.total.bubbles_filled += st.bubbles_filled;
      result.total.bubble_time_us += st.bubble_time_us;
      result.total.filled_time_us += st.filled_time_us;
      result.total.items_completed += st.items_completed;
      if (st.max_overrun_us > result.total.max_overrun_us) result.total.max_overrun_us = st.max_overrun_us;
      result.items_run += jobs[s].items_run;
      CHECK(pfJobDestroy(handles[s]));
      CHECK(pfRuntimeDestroy(p.runtime[s]));
    }
  }
  CHECK(pfSimWorldDestroy(p.world));
  return result;
}

int main(int argc, char** argv) {
  int iterations = 10, i;
  uint64_t items = 100000000ull;
  double item_us = 10.0;
  RunResult base, filled;
  for (i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--iterations") == 0) iterations = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--items") == 0) items = strtoull(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--item-us") == 0) item_us = atof(argv[i + 1]);
    else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
  }
  if (iterations < 1 || items == 0 || !(item_us > 0)) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  base = run(0, iterations, items, item_us);
  filled = run(1, iterations, items, item_us);
  printf("simulated %d-stage 1F1B pipeline, %d micro-batches, %d iterations, fill items of %.1f us\n",
         STAGES, MICROBATCHES, iterations, item_us);
  printf("%-12s %10s %10s %16s %16s %14s %12s %10s\n", "run", "time (ms)", "bubbles", "bubble time (ms)",
         "filled time (ms)", "filled share", "fill items", "slowdown");
  printf("%-12s %10.3f %10s %16s %16s %14s %12s %10s\n", "no filling", base.seconds * 1e3, "-", "-", "-",
         "-", "-", "-");
  printf("%-12s %10.3f %10llu %16.3f %16.3f %13.1f%% %12llu %9.3f%%\n", "filling", filled.seconds * 1e3,
         (unsigned long long)filled.total.bubbles, filled.total.bubble_time_us * 1e-3,
         filled.total.filled_time_us * 1e-3,
         filled.total.bubble_time_us > 0 ? 100.0 * filled.total.filled_time_us / filled.total.bubble_time_us : 0.0,
         (unsigned long long)filled.total.items_completed,
         100.0 * (filled.seconds - base.seconds) / base.seconds);
  printf("bubbles filled: %llu of %llu (empty recv waits are learned and skipped); max overrun %.3f us\n",
         (unsigned long long)filled.total.bubbles_filled, (unsigned long long)filled.total.bubbles,
         filled.total.max_overrun_us);
  if (filled.items_run != filled.total.items_completed) {
    fprintf(stderr, "item accounting mismatch: %llu run, %llu reported\n", filled.items_run,
            (unsigned long long)filled.total.items_completed);
    return 1;
  }
  return 0;
}
