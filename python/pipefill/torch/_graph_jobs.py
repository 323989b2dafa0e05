"""pipefill.torch: graph fill jobs - one item of a module's work captured with
torch.cuda.CUDAGraph(keep_graph=True) and registered as a gated graph fill job
(pfJobCreateGraph), results in preallocated outputs."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Tuple

import torch

from .._enums import Backend, Result
from .._errors import PipeFillError
from .._runtime import Runtime
from ..jobs import GraphJob
from ._fill_capture import fill_capture_settings, wait_for_fill_streams
from ._graph_contexts import DriverGraphReader, check_capture_contexts

log = logging.getLogger("pipefill.torch")


# ---- graph fill jobs ----------------------------------------------------------------------

class GraphFillJob:
    """A :class:`pipefill.jobs.GraphJob` made by :func:`graph_fill_job`, with what it needs kept
    alive for the job's whole lifetime: the captured ``torch.cuda.CUDAGraph`` (its graph is
    cloned by the runtime, but the memory its kernels use belongs to torch's graph pool), the
    index tensor, the outputs, and the ``step`` function with every tensor it closes over (a
    captured graph reads tensors by address: one freed after capture goes back to torch's caching
    allocator, which hands the block to the next allocation on that stream, and every later item
    reads whatever lives there then - issue 16)."""

    def __init__(self, job: Any, graph: "torch.cuda.CUDAGraph", index: "torch.Tensor",
                 outputs: Any, item_cost_us: float, keep_alive: Tuple[Any, ...] = ()) -> None:
        self.job = job
        self.graph = graph
        self.index = index
        self.outputs = outputs
        self.item_cost_us = item_cost_us
        self.keep_alive = keep_alive

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Waits for the job (:meth:`pipefill.Job.wait`), then for the work queued on the
        runtime's fill streams, so the outputs' writes are visible; returns the outputs. Only the
        fill streams: ``torch.cuda.synchronize()`` would also wait for the trainer's streams and
        every green context's (issue 33 item 3)."""
        self.job.wait(timeout)
        wait_for_fill_streams(self.job.runtime)
        return self.outputs

    def close(self) -> None:
        self.job.close()


def graph_fill_job(runtime: Runtime, step: Callable[["torch.Tensor"], Any], items: int, *,
                   outputs: Any = None, item_cost_us: Optional[float] = None,
                   name: str = "graph-job", priority: int = 0, warmup: int = 2,
                   measure_runs: int = 5, keep_alive: Tuple[Any, ...] = (),
                   available: Optional[int] = None,
                   before_register: Optional[Callable[[], None]] = None) -> GraphFillJob:
    """Captures one item of work and registers it as a graph fill job (pfJobCreateGraph).

    ``step(index)`` does the work of one item: ``index`` is an int64 CUDA tensor of shape ()
    that holds the item number when the item runs (the job's device index word); ``step`` must
    select its inputs with it on the device (``inputs.index_select(0, index.view(1))``) and write
    its results into preallocated tensors (``outputs.index_copy_(0, index.view(1), y)``), never
    allocate outside torch's graph pool, never synchronise with the host and never read the
    index on the host. It is run ``warmup`` times (index 0), then captured once with
    ``torch.cuda.CUDAGraph(keep_graph=True)`` (``capture_begin/capture_end``: no device-wide
    synchronize, no ``empty_cache``), both on a capture stream of the runtime
    (:meth:`pipefill.Runtime.capture_stream`, destroyed once the job is registered) with that
    stream's context current (:meth:`pipefill.Runtime.capture_context`: the fill partition's green
    context, so every kernel torch and cuBLAS launch belongs to it), and passed to the runtime as
    ``raw_cuda_graph()``. Warm-up and capture run with torch's matmul SM carve-out sized to the
    fill partition (process-global, restored afterwards) and autograd's backward on this thread
    (pipefill.torch._fill_capture); a captured kernel node outside the fill partition's context
    is refused with its name and context (pipefill.torch._graph_contexts). The capture stream
    waits for the current stream's queued work on the device (the item's inputs); the host waits
    only for the capture stream. ``item_cost_us``
    defaults to the median of ``measure_runs`` replays timed on the host (replay + stream
    synchronize: an upper bound by a few µs). Results are valid after :meth:`GraphFillJob.wait`.
    CUDA backend only (the simulated and host backends take a :class:`pipefill.jobs.GraphJob`
    without a graph). Needs torch >= 2.8 (``CUDAGraph(keep_graph=True)``).

    Lifetimes: the returned job holds ``step`` (and so every tensor and module its closure
    reads), ``outputs`` and anything given in ``keep_alive`` until it is closed; a tensor the
    graph reads that ``step`` reaches only through a global must be passed in ``keep_alive``.
    Capture uses ``capture_error_mode="thread_local"``, so the runtime's executor thread
    querying events during the capture cannot invalidate it. RNG: torch makes random numbers in
    a graph differ per replay by advancing the generator's philox offset in ``graph.replay()``;
    the runtime launches the graph itself, never through ``replay()``, so every item draws the
    *same* random numbers as the capture (dropout masks, ``torch.rand``). Run inference modules
    in ``eval()`` mode, and do not draw random numbers in ``step``.

    ``available``: the streaming bound the job starts with (pfGraphJobDesc_t.available; None:
    every item): items at or above it are not claimed until ``job._native.set_available``
    raises it - how :func:`pipefill.torch.inference_job` stages inputs while the job runs.
    ``before_register``: called after the warm-up, the capture and the timing replays, before
    the job is registered, on the capture stream with its context current (a training step
    undoes what those runs changed; the work it queues has run before the job is registered).
    """
    if runtime.backend != Backend.CUDA:
        raise PipeFillError(Result.NOT_SUPPORTED,
                            f"graph_fill_job captures a CUDA graph: the runtime's backend is "
                            f"{runtime.backend.name.lower()}, not cuda (use pipefill.jobs.GraphJob "
                            "without a graph on the simulated and host backends)")
    _require_keep_graph()
    device = torch.cuda.current_device()
    index = torch.zeros((), dtype=torch.int64, device=device)
    capture = runtime.capture_stream()
    try:
        stream = torch.cuda.ExternalStream(capture.handle, device=device)
        # The item's inputs were made on the current stream: the capture stream waits for them on
        # the device, never the host (and never for the rest of the device: no
        # torch.cuda.synchronize anywhere in job creation - issue 24 item 5).
        stream.wait_stream(torch.cuda.current_stream(device))
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        # Warm-up, capture, timing and the caller's undo with the capture stream's context current
        # (the fill partition's green context): the CUDA runtime launches a kernel in the context
        # current at the launch, so this is what makes torch's and cuBLAS's kernels belong to the
        # fill context, and their modules load into it during the warm-up, not the capture
        # (issue 24 item 6).
        with runtime.capture_context(capture), torch.cuda.stream(stream):
            # Matmuls sized to the fill partition and the backward on this thread (where the fill
            # context is current), for the warm-up and the capture only (issue 33 items 1-2).
            with fill_capture_settings(runtime, capture.handle, device, name):
                for _ in range(max(0, warmup)):
                    step(index)
                _capture(graph, step, index)
            if item_cost_us is None:
                item_cost_us = _time_replays(graph, stream, measure_runs)
            if before_register is not None:
                before_register()
            # Everything queued on the capture stream (warm-up, timing, the undo) has run before
            # the job can be launched on the fill streams and before the stream is destroyed.
            stream.synchronize()
        # After the undo ran: a refusal leaves the caller's model as it was.
        _check_contexts(graph, capture.handle, device, name)
        job = runtime.create_job(GraphJob(items=items, item_cost_us=float(item_cost_us),
                                          graph=graph.raw_cuda_graph(), index_word=index,
                                          name=name, priority=priority, available=available))
    finally:
        capture.close()  # one capture stream per job, never kept (issue 24 item 10)
    return GraphFillJob(job, graph, index, outputs, float(item_cost_us),
                        keep_alive=(step,) + tuple(keep_alive))


def _check_contexts(graph: "torch.cuda.CUDAGraph", capture_handle: int, device: int,
                    name: str) -> None:
    """Every kernel node of the capture must belong to the capture stream's context (the fill
    partition's): refused here, naming each node and its context, when one does not (issue 33
    item 2). Nothing is read where the driver cannot be (the runtime checks at registration)."""
    reader = DriverGraphReader.open()
    if reader is None:
        return
    try:
        fill = reader.stream_context(capture_handle)
        primary = reader.primary_context(device)
        nodes = check_capture_contexts(reader, graph.raw_cuda_graph(), fill, primary, name)
    except (OSError, ValueError) as error:  # unreadable here: the runtime's check decides
        log.info("graph job '%s': kernel contexts not read after the capture (%s)", name, error)
        return
    log.info("graph job '%s': %d kernel nodes, all in the fill context", name, len(nodes))


def _capture(graph: "torch.cuda.CUDAGraph", step: Callable[["torch.Tensor"], Any],
             index: "torch.Tensor") -> None:
    """One ``step(index)`` captured on the current stream with ``capture_begin/capture_end``:
    ``torch.cuda.graph(...)`` would synchronize the whole device and empty the caching allocator
    on entry, draining the trainer's queued work for a job made between its iterations (issue 24
    item 5). ``thread_local``: only this thread's unsafe CUDA calls (a synchronize, say) break the
    capture; the executor thread's event queries during it do not (issue 16, item 9)."""
    graph.capture_begin(capture_error_mode="thread_local")
    try:
        step(index)
    except BaseException:
        try:
            graph.capture_end()  # ends the (now invalid) capture; the step's error is the one raised
        except Exception:
            pass
        raise
    graph.capture_end()


def _time_replays(graph: "torch.cuda.CUDAGraph", stream: Any, runs: int) -> float:
    """The median of ``runs`` replays on ``stream`` (µs), each timed on the host around one replay
    and a synchronize of that stream alone. Not with CUDA events: torch's events belong to the
    primary context, and the capture stream is the green context's, while cudaEventRecord needs
    event and stream of one context (issue 24 item 4). An upper bound of the item's device time
    (it includes a launch and the synchronize's wake-up, a few µs); the runtime learns the real
    cost from measured items. One untimed replay first uploads the graph and waits for the
    warm-up."""
    graph.instantiate()
    graph.replay()
    stream.synchronize()
    samples = []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        graph.replay()
        stream.synchronize()
        samples.append((time.perf_counter() - start) * 1e6)
    return sorted(samples)[len(samples) // 2]


def _require_keep_graph() -> None:
    """graph_fill_job hands torch's captured graph to the runtime (``raw_cuda_graph()``), which
    torch keeps only with ``CUDAGraph(keep_graph=True)``: torch 2.8 and later."""
    try:
        major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    except ValueError:
        return  # a development build: let CUDAGraph(keep_graph=True) decide
    if (major, minor) < (2, 8):
        raise PipeFillError(Result.NOT_SUPPORTED,
                            f"graph fill jobs need torch >= 2.8 (CUDAGraph(keep_graph=True)); "
                            f"this is torch {torch.__version__}")


def module_inference_job(runtime: Runtime, module: "torch.nn.Module", inputs: "torch.Tensor", *,
                         batch: int = 1, **options: Any) -> GraphFillJob:
    """Inference of ``module`` over ``inputs`` (first dimension: samples) as a graph fill job:
    item ``i`` computes ``module(inputs[i*batch:(i+1)*batch])`` into a preallocated output
    tensor (``GraphFillJob.outputs``, same first dimension as ``inputs``). ``inputs`` must be
    a CUDA tensor whose first dimension is a multiple of ``batch``; options go to
    :func:`graph_fill_job`."""
    if inputs.shape[0] % batch != 0:
        raise PipeFillError(Result.INVALID_ARGUMENT,
                            f"module_inference_job: {inputs.shape[0]} samples are not a multiple "
                            f"of batch {batch}")
    items = inputs.shape[0] // batch
    offsets = torch.arange(batch, device=inputs.device, dtype=torch.int64)
    with torch.no_grad():
        probe = module(inputs[:batch])
    outputs = torch.empty((inputs.shape[0],) + tuple(probe.shape[1:]), dtype=probe.dtype,
                          device=inputs.device)

    def step(index: "torch.Tensor") -> None:
        with torch.no_grad():
            rows = index * batch + offsets
            outputs.index_copy_(0, rows, module(inputs.index_select(0, rows)))

    # step's closure holds offsets, inputs and module; keep_alive names them again so the
    # lifetime does not hang on how Python builds closures.
    keep = (offsets, inputs, module) + tuple(options.pop("keep_alive", ()))
    return graph_fill_job(runtime, step, items, outputs=outputs, keep_alive=keep, **options)


def graph_job(*args: Any, **kwargs: Any) -> Any:
    """The round-1 name of :func:`graph_fill_job` (same arguments)."""
    return graph_fill_job(*args, **kwargs)
