"""pipefill.torch: PipeFill for PyTorch trainers.

- :func:`stream_handle` / :func:`current_stream_handle`: the ``cudaStream_t`` of a
  ``torch.cuda.Stream`` or of the current stream, for ``runtime.bubble(...)``.
- :func:`instrument`: bubble instructions for any ``torch.distributed.pipelining`` schedule
  (``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``, ``ScheduleLoopedBFS``,
  ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``): every
  receive wait of the schedule becomes a bubble (begin right before the wait, end right after
  it, on the stream the wait is ordered on) and every ``step()`` ends an iteration. Nothing the
  schedule computes changes: the hook only observes which communication is waited on.
- :func:`bubble_on_wait`: the same for engines that post and wait on requests themselves
  (Megatron-Core's ``p2p_communication``): one bubble around waiting on a group of requests.
- :func:`graph_fill_job` / :func:`module_inference_job`: capture one item of a module's work
  with ``torch.cuda.CUDAGraph(keep_graph=True)`` and register ``raw_cuda_graph()`` as a gated
  graph fill job (pfJobCreateGraph), results in preallocated outputs.
- :func:`inference_job` / :func:`training_job`: fill jobs that carry real work (a dataset through
  a model; training with checkpoints, resumable), and :func:`all_finished`, with which the ranks
  agree on leaving the step loop.

The subpackage's modules, each importing only the ones before it (tests/python/
test_package_layers.py): ``_streams`` (stream handles, green-context SM partition),
``_schedule`` (the schedule hook, all_finished), ``_graph_jobs``, ``_streaming`` (the host/sim
streaming jobs), ``_batch_sizes`` (inference with several batch sizes), ``_cuda_ring`` (their
CUDA path: a ring of device slots, one captured graph), ``_training`` (training_job); this face
chooses the backend's class in :func:`inference_job`.

How the schedule hook works, and why it survives torch versions
----------------------------------------------------------------
Every schedule in ``torch/distributed/pipelining/schedules.py`` issues its point-to-point
communication through the module-level helper ``_batch_p2p(p2p_ops, desc=None)`` (directly, or
through ``_sorted_batch_p2p``, which calls it by its global name) and waits for it through the
module-level helper ``_wait_batch_p2p(work)``. Receives are ``dist.P2POp`` objects whose ``op``
is ``dist.irecv``; the stage builds them in ``get_fwd_recv_ops`` / ``get_bwd_recv_ops``.

:func:`instrument` replaces the two module globals once per process with pass-through wrappers:

1. ``_batch_p2p``: calls the original; when the ops contain an ``irecv`` and an instrumented
   schedule is stepping on this thread, it returns the same works in a ``list`` subclass that
   remembers which receives (direction, stage, micro-batch) they carry.
2. ``_wait_batch_p2p``: for such a list it calls ``runtime.bubble_begin`` on the wait's stream,
   the original wait, then ``runtime.bubble_end`` (also when the wait raises); for anything else
   (send waits, other callers, other threads, schedules not instrumented) it is the original.

The stages' ``get_fwd_recv_ops`` / ``get_bwd_recv_ops`` are wrapped on the instances only to
label bubbles (``fwd:s1:mb3``) and to tell warm-up from cool-down; counting does not need them.
Only names and calling conventions are relied on, not line numbers or bodies:
:func:`check_hook_points` verifies them and :func:`instrument` refuses (RuntimeError naming the
torch version) when they are missing. The test suite also audits ``schedules.py``'s source so
that a new torch version which waits on receives some other way fails loudly, and counts, for
every schedule, bubbles against the receive waits derived from the schedule's own
``pipeline_order``. Tested with torch |TESTED_TORCH|.

Streams: with NCCL, ``Work.wait()`` makes the *current* CUDA stream wait for the receive, so
on the CUDA backend the bubble goes on ``torch.cuda.current_stream()`` at each wait (the stream
the wait is ordered on); pass ``stream=`` to override. With gloo (CPU) the wait blocks the host
thread; on the simulated and host backends the bubble goes on a stream of the runtime
(``runtime.high_priority_stream()``), and on the simulated backend the measured wait time is
mirrored into that stream (``mirror_wait_time``) so that simulated bubbles last as long as
the real waits and the fill work runs in them when the world runs after each step.

PipeFill never breaks the trainer: a PipeFillError from a bubble call is recorded in
:attr:`ScheduleBubbles.errors` and warned about once, and the schedule goes on
(``strict=True`` raises instead, for tests).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch

from .._enums import Backend
from .._runtime import Runtime
from ._streams import (complement_config, complement_runtime, current_stream_handle,
                       fill_streams, main_job_sms, stream_handle)
from ._schedule import (all_finished, audit_schedules_source, bubble_on_wait, check_hook_points,
                        expected_receive_waits, HOOK_POINTS, instrument, ScheduleBubbles,
                        StreamChoice, TESTED_TORCH)
from ._graph_jobs import graph_fill_job, graph_job, GraphFillJob, module_inference_job
from ._streaming import FillJobError, InferenceJob, Progress
from ._batch_sizes import SizedInferenceJob
from ._cuda_ring import CudaInferenceJob
from ._training import training_job, TrainingJob
from ._streaming import PathLike

__all__ = [
    "all_finished",
    "audit_schedules_source",
    "bubble_on_wait",
    "check_hook_points",
    "complement_config",
    "complement_runtime",
    "CudaInferenceJob",
    "current_stream_handle",
    "expected_receive_waits",
    "fill_streams",
    "FillJobError",
    "graph_fill_job",
    "graph_job",
    "GraphFillJob",
    "HOOK_POINTS",
    "inference_job",
    "InferenceJob",
    "instrument",
    "main_job_sms",
    "module_inference_job",
    "Progress",
    "ScheduleBubbles",
    "stream_handle",
    "StreamChoice",
    "TESTED_TORCH",
    "training_job",
    "TrainingJob",
]

__doc__ = __doc__.replace("|TESTED_TORCH|", ", ".join(TESTED_TORCH))


def inference_job(runtime: Runtime, module: "torch.nn.Module", data: Iterable[Any], *,
                  batch_size: Optional[int], sink: Any, slots: int = 4,
                  resume: Optional[PathLike] = None, start: int = 0, items: Optional[int] = None,
                  name: str = "inference", priority: int = 0,
                  item_cost_us: Any = None,
                  batch_sizes: Optional[Sequence[int]] = None) -> InferenceJob:
    """Streams ``data`` through ``module`` in the bubbles, one batch per item.

    ``data``: any iterable of samples (grouped into batches of ``batch_size`` with
    ``torch.stack``), of batches (``batch_size=None``), or a DataLoader (its batches; a
    ``(inputs, labels)`` batch uses ``inputs``). Items are numbered from the start of ``data``:
    the job covers items ``[start, start + items)`` (``items=None``: to the end), which is how
    a shard of a dataset maps onto one job. ``sink``: ``sink(index, output)``, a folder path
    (``<index>.npy`` per item) or a numpy memmap (rows ``index * batch_size ...``); outputs come
    in item order, once each per attempt. ``slots``: the ring of staged batches (memory does not
    grow with the dataset). ``resume``: a progress file, rewritten atomically after each item
    reached the sink; when it exists the job starts at its next item (it must come from a job of
    the same name and range). Items between the last durable point and a crash are handed to a
    callable sink again on resume; the folder and memmap sinks rewrite them in place, so they
    hold each item exactly once. ``item_cost_us``: default, the module timed on the first batch
    (then learned from the measured slices); given, the planner keeps it (host/simulated
    backends; see docs/pytorch-streaming.md).

    ``batch_sizes=[b, 2b, ...]`` (host and simulated backends; each a multiple of the smallest,
    ``b``): the job offers one configuration per size and the planner picks per bubble class the
    size that fits (pipefill/torch/_batch_sizes.py). Indices, sink calls, ``start``/``items``,
    the memmap's rows and the progress file all count batches of ``b`` samples, as with
    ``batch_size=b``, whatever sizes ran; ``slots`` then counts batches of the largest size.
    ``item_cost_us``: one cost per size, or the smallest size's (the others scaled by size).
    """
    if batch_sizes is not None:
        if runtime.backend == Backend.CUDA:
            raise ValueError(f"inference_job: batch_sizes = {batch_sizes!r} runs on the simulated "
                             "and host backends only (on CUDA one item is one captured batch)")
        return SizedInferenceJob(runtime, module, data, batch_sizes=batch_sizes,
                                 batch_size=batch_size, sink=sink, slots=slots, resume=resume,
                                 start=start, items=items, name=name, priority=priority,
                                 item_cost_us=item_cost_us)
    kind = CudaInferenceJob if runtime.backend == Backend.CUDA else InferenceJob
    return kind(runtime, module, data, batch_size=batch_size, sink=sink, slots=slots,
                resume=resume, start=start, items=items, name=name, priority=priority,
                item_cost_us=item_cost_us)
