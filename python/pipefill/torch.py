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

import ast
import dataclasses
import inspect
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch.distributed.pipelining import schedules as _schedules

from . import Backend, BubbleKind, Config, PipeFillError, Result, Runtime, StreamLike
from . import _bubbles
from . import stream_handle as _generic_stream_handle

TESTED_TORCH = ("2.15",)
"""torch versions (major.minor) whose schedules.py the hook was audited against."""
__doc__ = __doc__.replace("|TESTED_TORCH|", ", ".join(TESTED_TORCH))


# ---- streams ------------------------------------------------------------------------------

def stream_handle(stream: Optional["torch.cuda.Stream"] = None) -> int:
    """The ``cudaStream_t`` (an int) of a ``torch.cuda.Stream``; None: the current stream."""
    if stream is None:
        return current_stream_handle()
    return _generic_stream_handle(stream)


def current_stream_handle(device: Optional[Union[int, "torch.device"]] = None) -> int:
    """The ``cudaStream_t`` of ``torch.cuda.current_stream(device)``."""
    return int(torch.cuda.current_stream(device).cuda_stream)


def fill_streams(runtime: Runtime) -> List["torch.cuda.ExternalStream"]:
    """The runtime's fill streams as ``torch.cuda.ExternalStream`` (CUDA backend): to record
    events on them or see them in a profiler. Never enqueue main-job work on them. Other
    backends: PipeFillError NOT_SUPPORTED naming the backend (their handles are not CUDA
    streams; ``runtime.fill_stream_handles()`` gives them as ints)."""
    if not isinstance(runtime, Runtime):
        raise TypeError(f"fill_streams: runtime must be a pipefill.Runtime, not "
                        f"{type(runtime).__name__}")
    if runtime.backend != Backend.CUDA:
        raise PipeFillError(Result.NOT_SUPPORTED,
                            f"fill_streams: the runtime's backend is {runtime.backend}, whose "
                            "fill streams are not CUDA streams (runtime.fill_stream_handles() "
                            "gives the raw handles)")
    device = runtime.config.device or 0
    return [torch.cuda.ExternalStream(handle, device=device)
            for handle in runtime.fill_stream_handles()]


# ---- torch green contexts -----------------------------------------------------------------

def main_job_sms(main: Any) -> int:
    """The SM count a user keeps for the main job: an int, a ``torch.cuda.green_contexts``
    ``GreenContext`` or ``SMPartition`` (anything with an int ``sm_count``). A bad value is a
    TypeError / PipeFillError naming it."""
    if isinstance(main, bool):
        raise TypeError("main_sms: a bool is not an SM count")
    if isinstance(main, int):
        count = main
    else:
        count = getattr(main, "sm_count", None)
        if count is None:
            raise TypeError(f"main_sms must be an int, a torch.cuda.green_contexts.GreenContext "
                            f"or SMPartition, not {type(main).__name__}")
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"main_sms: {type(main).__name__}.sm_count is "
                            f"{type(count).__name__} {count!r}, not an int")
    if count < 1:
        raise PipeFillError(Result.INVALID_ARGUMENT,
                            f"main_sms {count}: the main job must keep at least 1 SM")
    return count


def complement_config(main_sms: Any, config: Optional[Config] = None, /,
                      **fields: Any) -> Config:
    """A :class:`pipefill.Config` whose fill partition is the complement of the SMs the user
    keeps for the main job (``main_sms``: an int, a torch ``GreenContext`` or ``SMPartition``):
    ``reserved_sms`` = that count, ``device`` = the partition's device. A ``reserved_sms`` or
    ``device`` given as well must agree (ValueError naming both), so the two partitions never
    overlap in SM count. See docs/pytorch.md ("Torch green contexts") for what the CUDA backend
    does with it."""
    count = main_job_sms(main_sms)
    base = config if config is not None else Config()
    if not isinstance(base, Config):
        raise TypeError(f"complement_config: config must be a pipefill.Config, not "
                        f"{type(base).__name__}")
    reserved = fields.get("reserved_sms", base.reserved_sms)
    if reserved is not None and reserved != count:
        raise ValueError(f"complement_config: reserved_sms={reserved!r} disagrees with the "
                         f"main job's {count} SMs ({type(main_sms).__name__}); the fill "
                         "partition would overlap it or leave SMs idle")
    fields["reserved_sms"] = count
    device_id = getattr(main_sms, "device_id", None)
    if isinstance(device_id, int) and not isinstance(device_id, bool):
        device = fields.get("device", base.device)
        if device is not None and device != device_id:
            raise ValueError(f"complement_config: device={device!r} but the main job's "
                             f"partition is on device {device_id}")
        fields["device"] = device_id
    return dataclasses.replace(base, **fields)


def complement_runtime(main_sms: Any, config: Optional[Config] = None, /,
                       **fields: Any) -> Runtime:
    """``Runtime(complement_config(main_sms, config, **fields))``."""
    return Runtime(complement_config(main_sms, config, **fields))


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
        """Waits for the job (:meth:`pipefill.Job.wait`), then for the fill stream's writes to
        the outputs to be visible (``torch.cuda.synchronize``); returns the outputs."""
        self.job.wait(timeout)
        torch.cuda.synchronize()
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
    ``raw_cuda_graph()``. The capture stream waits for the current stream's queued work on the
    device (the item's inputs); the host waits only for the capture stream. ``item_cost_us``
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
    from .jobs import GraphJob
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
        job = runtime.create_job(GraphJob(items=items, item_cost_us=float(item_cost_us),
                                          graph=graph.raw_cuda_graph(), index_word=index,
                                          name=name, priority=priority, available=available))
    finally:
        capture.close()  # one capture stream per job, never kept (issue 24 item 10)
    return GraphFillJob(job, graph, index, outputs, float(item_cost_us),
                        keep_alive=(step,) + tuple(keep_alive))


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


# ---- hook points --------------------------------------------------------------------------

HOOK_POINTS = (
    "torch.distributed.pipelining.schedules._batch_p2p(p2p_ops, desc=None) -> list[Work]",
    "torch.distributed.pipelining.schedules._wait_batch_p2p(work: list[Work])",
    "torch.distributed.P2POp.op (dist.irecv for receives)",
    "_PipelineStageBase.get_fwd_recv_ops(chunk) / get_bwd_recv_ops(chunk) (labels only)",
)


def check_hook_points() -> None:
    """Raises RuntimeError (naming the torch version) when a hook point is missing."""
    problems = []
    for name, first in (("_batch_p2p", "p2p_ops"), ("_wait_batch_p2p", "work")):
        fn = _ORIGINALS.get(name) or getattr(_schedules, name, None)
        if not callable(fn):
            problems.append(f"schedules.{name} is missing")
            continue
        params = list(inspect.signature(fn).parameters)
        if not params or params[0] != first:
            problems.append(f"schedules.{name}{inspect.signature(fn)} changed its signature")
    if not hasattr(dist, "P2POp") or not callable(getattr(dist, "irecv", None)):
        problems.append("torch.distributed.P2POp / irecv are missing")
    if problems:
        raise RuntimeError(
            f"pipefill.torch cannot hook torch {torch.__version__}'s pipelining schedules: "
            + "; ".join(problems) + f" (audited versions: {', '.join(TESTED_TORCH)})")


def audit_schedules_source() -> Dict[str, List[str]]:
    """Where schedules.py posts and waits on communication, from its source (AST).

    Returns {"posts": functions calling batch_isend_irecv / isend / irecv / P2POp.op,
    "direct_waits": "function: expression" of every ``.wait()`` call outside
    ``_wait_batch_p2p``}. The hook is complete when only ``_batch_p2p`` posts and every
    direct wait is on something other than point-to-point works (the test suite checks it).
    """
    tree = ast.parse(inspect.getsource(_schedules))
    posts: List[str] = []
    waits: List[str] = []

    class Visitor(ast.NodeVisitor):
        def __init__(self) -> None:
            self.stack: List[str] = []

        def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
            self.stack.append(node.name)
            self.generic_visit(node)
            self.stack.pop()

        visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

        def visit_Call(self, node: ast.Call) -> None:
            where = ".".join(self.stack) or "<module>"
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("batch_isend_irecv", "isend", "irecv") or (
                    isinstance(func, ast.Attribute) and name == "op"):
                posts.append(where)
            if name == "wait" and isinstance(func, ast.Attribute) and "_wait_batch_p2p" not in self.stack:
                waits.append(f"{where}: {ast.unparse(func.value)}.wait()")
            self.generic_visit(node)

    Visitor().visit(tree)
    return {"posts": sorted(set(posts)), "direct_waits": waits}


# ---- the hook -----------------------------------------------------------------------------

_ORIGINALS: Dict[str, Callable[..., Any]] = {}
_INSTALL_LOCK = threading.Lock()
_THREAD = threading.local()  # .active: the ScheduleBubbles stepping on this thread


class _ReceiveWorks(list):
    """The works of a batch that contains receives, and which receives they are."""

    receives: List[Tuple[str, Optional[int], Optional[int]]]


def _is_receive(op: Any) -> bool:
    fn = getattr(op, "op", None)
    return fn is dist.irecv or getattr(fn, "__name__", "") == "irecv"


def _batch_p2p_hook(p2p_ops: Any, *args: Any, **kwargs: Any) -> Any:
    works = _ORIGINALS["_batch_p2p"](p2p_ops, *args, **kwargs)
    active: Optional[ScheduleBubbles] = getattr(_THREAD, "active", None)
    if active is None or isinstance(works, _ReceiveWorks):
        return works
    receives = [active._describe(op) for op in p2p_ops if _is_receive(op)]
    if not receives:
        return works
    tagged = _ReceiveWorks(works)
    tagged.receives = receives
    return tagged


def _wait_batch_p2p_hook(work: Any, *args: Any, **kwargs: Any) -> Any:
    active: Optional[ScheduleBubbles] = getattr(_THREAD, "active", None)
    if active is None or not isinstance(work, _ReceiveWorks):
        return _ORIGINALS["_wait_batch_p2p"](work, *args, **kwargs)
    return active._bubble_around(work, lambda: _ORIGINALS["_wait_batch_p2p"](work, *args, **kwargs))


def _install() -> None:
    with _INSTALL_LOCK:
        if _ORIGINALS:
            return
        check_hook_points()
        _ORIGINALS["_batch_p2p"] = _schedules._batch_p2p
        _ORIGINALS["_wait_batch_p2p"] = _schedules._wait_batch_p2p
        _schedules._batch_p2p = _batch_p2p_hook
        _schedules._wait_batch_p2p = _wait_batch_p2p_hook


# ---- the wrapper --------------------------------------------------------------------------

StreamChoice = Union[StreamLike, Callable[[], StreamLike]]


class ScheduleBubbles:
    """Bubble instructions for one ``torch.distributed.pipelining`` schedule.

    Made by :func:`instrument`; ``schedule.step(...)`` (and ``eval``) then emit them. Counters:
    :attr:`bubbles` (bubbles begun, in total), :attr:`step_bubbles` (per step),
    :attr:`interrupted_waits` (waits that raised; their bubbles were ended all the same),
    :attr:`errors` (PipeFillErrors recorded instead of raised).
    """

    def __init__(self, schedule: Any, runtime: Runtime, *, stream: StreamChoice = None,
                 mirror_wait_time: Optional[bool] = None, run_sim_world: bool = True,
                 labels: bool = True, strict: bool = False, install: bool = True) -> None:
        if not isinstance(runtime, Runtime):
            raise TypeError(f"instrument: runtime must be a pipefill.Runtime, not "
                            f"{type(runtime).__name__} ({runtime!r})")
        _install()
        if not hasattr(schedule, "step"):
            raise TypeError(f"{type(schedule).__name__} is not a pipelining schedule")
        if "step" in vars(schedule):
            raise ValueError("this schedule is already instrumented (or its step was replaced); "
                             "remove() the other wrapper first")
        self.schedule = schedule
        self.runtime = runtime
        self.strict = strict
        self.labels = labels
        self.bubbles = 0
        self.interrupted_waits = 0  # receive waits that raised (a peer failed or timed out)
        self.step_bubbles: List[int] = []
        self.errors: List[PipeFillError] = []
        backend = runtime.backend
        self._owned_stream = None
        if stream is None:
            if backend == Backend.CUDA:
                stream = lambda: torch.cuda.current_stream()  # noqa: E731 - the wait's stream
            else:
                self._owned_stream = runtime.high_priority_stream()
                stream = self._owned_stream
        self._stream = stream
        self._sim_world = runtime.sim_world if backend == Backend.SIM else None
        self._mirror = (backend == Backend.SIM) if mirror_wait_time is None else mirror_wait_time
        if self._mirror and self._sim_world is None:
            raise ValueError("mirror_wait_time needs the simulated backend")
        self._run_sim_world = run_sim_world and self._sim_world is not None
        self._stages = list(getattr(schedule, "_stages", None) or [schedule._stage])
        self._op_info: Dict[int, Tuple[str, Optional[int], Optional[int]]] = {}
        self._wrapped_stage_methods: List[Tuple[Any, str]] = []
        for stage in self._stages:
            for method, direction in (("get_fwd_recv_ops", "fwd"), ("get_bwd_recv_ops", "bwd")):
                original = getattr(stage, method, None)
                if callable(original):
                    setattr(stage, method, self._labelled(original, direction, stage.stage_index))
                    self._wrapped_stage_methods.append((stage, method))
        self._fwd_receives = 0
        self._fwd_receives_last_step = 0
        self._bwd_seen = False
        self._installed = False
        if install:
            self.install()

    # ---- installation on the schedule instance ----
    def install(self) -> None:
        """Makes ``schedule.step`` go through this wrapper (instance attribute)."""
        if not self._installed:
            self.schedule.step = self.step
            self._installed = True

    def remove(self) -> None:
        """Restores the schedule and its stages; closes the stream this wrapper made."""
        if self._installed:
            try:
                del self.schedule.step
            except AttributeError:
                pass
            self._installed = False
        for stage, method in self._wrapped_stage_methods:
            try:
                delattr(stage, method)
            except AttributeError:
                pass
        self._wrapped_stage_methods.clear()
        if self._owned_stream is not None and not self.runtime.closed:
            self._owned_stream.close()
        self._owned_stream = None

    def __enter__(self) -> "ScheduleBubbles":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # ---- stepping ----
    def step(self, *args: Any, **kwargs: Any) -> Any:
        """The schedule's step with bubble instructions; ends an iteration afterwards."""
        previous = getattr(_THREAD, "active", None)
        _THREAD.active = self
        self._fwd_receives = 0
        self._bwd_seen = False
        begun = self.bubbles
        step = type(self.schedule).step  # the class's step, bound below (not this wrapper)
        try:
            return step(self.schedule, *args, **kwargs)
        finally:
            _THREAD.active = previous
            self._op_info.clear()
            self.step_bubbles.append(self.bubbles - begun)
            self._fwd_receives_last_step = self._fwd_receives
            self._guarded(self.runtime.iteration_end)
            if self._run_sim_world:
                self._guarded(self._sim_world.run_until_idle)

    # ---- hook callbacks ----
    def _labelled(self, original: Callable[..., Any], direction: str, stage_index: int):
        def get_recv_ops(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            ops = original(chunk_id, *args, **kwargs)
            for op in ops:
                self._op_info[id(op)] = (direction, stage_index, chunk_id)
            return ops
        get_recv_ops.__wrapped__ = original  # type: ignore[attr-defined]
        return get_recv_ops

    def _describe(self, op: Any) -> Tuple[str, Optional[int], Optional[int]]:
        return self._op_info.pop(id(op), ("recv", None, None))

    def _classify(self, receives: List[Tuple[str, Optional[int], Optional[int]]]):
        direction, stage, microbatch = receives[0]
        if any(r[0] == "bwd" for r in receives):
            self._bwd_seen = True
        if direction == "fwd":
            self._fwd_receives += 1
            kind = BubbleKind.OTHER if self._bwd_seen else BubbleKind.WARMUP
        elif direction == "bwd":
            done = self._fwd_receives_last_step > 0 and self._fwd_receives >= self._fwd_receives_last_step
            kind = BubbleKind.COOLDOWN if done else BubbleKind.OTHER
        else:
            kind = BubbleKind.OTHER
        label = f"{direction}:s{stage}:mb{microbatch}" if self.labels and stage is not None else None
        return kind, label

    def _resolve_stream(self) -> Any:
        stream = self._stream
        return stream() if callable(stream) else stream

    def _bubble_around(self, works: _ReceiveWorks, wait: Callable[[], Any]) -> Any:
        kind, label = self._classify(works.receives)
        stream = self._resolve_stream()
        begun = self._guarded(self.runtime.bubble_begin, stream, kind=kind, label=label)
        if begun:
            self.bubbles += 1
        start = time.perf_counter()
        try:
            return wait()
        except BaseException:
            self.interrupted_waits += 1
            raise
        finally:
            if begun:
                if self._mirror:
                    elapsed_us = (time.perf_counter() - start) * 1e6
                    self._guarded(self._sim_world._native.stream_delay,
                                  _generic_stream_handle(stream), elapsed_us)
                self._guarded(self.runtime.bubble_end, stream)

    def _guarded(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        return _bubbles.report_failure(self.runtime, self.errors, self.strict, "pipefill.torch",
                                       call, *args, **kwargs)


def instrument(schedule: Any, runtime: Runtime, **options: Any) -> ScheduleBubbles:
    """Adds bubble instructions to a ``torch.distributed.pipelining`` schedule.

    After ``bubbles = instrument(schedule, runtime)``, every ``schedule.step(...)`` marks each
    receive wait as a bubble of ``runtime`` and ends an iteration; ``bubbles.remove()`` undoes
    it. Options: ``stream`` (a stream or a callable returning one; default: the current CUDA
    stream at each wait on the CUDA backend, a high-priority runtime stream otherwise),
    ``mirror_wait_time`` (simulated backend: the measured wait time becomes the simulated
    bubble's duration; default on), ``run_sim_world`` (run the simulated world after each step;
    default on), ``labels`` (label bubbles ``fwd:s<stage>:mb<micro-batch>``), ``strict``
    (raise PipeFillError instead of recording it).
    """
    return ScheduleBubbles(schedule, runtime, **options)


def bubble_on_wait(requests: Any, runtime: Runtime, *, stream: StreamChoice = None,
                   kind: Union[BubbleKind, str, int] = BubbleKind.OTHER,
                   label: Optional[str] = None, strict: bool = False,
                   mirror_wait_time: Optional[bool] = None) -> Any:
    """Wraps posted receive requests (a list or dict of ``dist.Work``, or one) so that waiting
    on them is one bubble: it begins right before the first ``wait()`` and ends right after
    the last one (or when a wait raises). For engines that post and wait themselves
    (:mod:`pipefill.megatron` does this for Megatron-Core). ``stream`` defaults to the current
    CUDA stream at the first wait on the CUDA backend and to a high-priority stream of the
    runtime on the simulated and host backends (:func:`pipefill._bubbles.default_stream`); on
    the simulated backend the wait time is mirrored into it (``mirror_wait_time``). A failed
    bubble instruction is counted (``runtime.bubble_failures``) and warned about once per
    message; ``strict=True`` raises it instead."""
    emitter = _bubbles.BubbleEmitter(runtime, stream=stream, mirror_wait_time=mirror_wait_time,
                                     run_sim_world=False, strict=strict,
                                     where="pipefill.torch.bubble_on_wait")
    return _bubbles.wrap_requests(requests, emitter, kind=kind, label=label)


def expected_receive_waits(schedule: Any, rank: int, local_stages: List[int],
                           num_stages: int) -> int:
    """Receive waits of ``rank`` in one step, from the schedule's own action list
    (``pipeline_order``): a forward of stage s > 0 waits for an activation unless stage s-1 is
    on the same rank, a (full or input) backward of stage s < last waits for a gradient unless
    stage s+1 is on the same rank. (Used by the tests as the independent count.)"""
    local = set(local_stages)
    count = 0

    def compute_actions(actions: Any) -> Any:
        for action in actions:
            if action is None:
                continue
            if getattr(action, "sub_actions", None):  # OVERLAP_F_B (DualPipeV)
                yield from compute_actions(action.sub_actions)
            else:
                yield action

    for action in compute_actions(schedule.pipeline_order[rank]):
        kind = str(getattr(action.computation_type, "value", action.computation_type))
        s = action.stage_index
        if kind == "F" and s > 0 and (s - 1) not in local:
            count += 1
        elif kind in ("B", "I") and s < num_stages - 1 and (s + 1) not in local:
            count += 1
    return count


# ---- streaming fill jobs: datasets through a model, training with checkpoints (torch_jobs.py) --
# ---- ranks agreeing on stopping -----------------------------------------------------------

def _ended(job: Any) -> bool:
    """A streaming job (progress()) finished or ended itself; a native Job finished."""
    if hasattr(job, "progress"):
        return bool(job.progress().finished or getattr(job, "error", None) is not None)
    if hasattr(job, "status"):
        return bool(job.status().finished)
    raise TypeError(f"all_finished: {job!r} is neither a pipefill.torch streaming job nor a "
                    "pipefill Job")


def all_finished(jobs: Any, group: Any = None) -> bool:
    """True when every rank's jobs have ended: finished, or ended themselves (``job.error``;
    ``wait()`` then raises with the reason). ``jobs``: this rank's jobs (one, or a list; an empty
    list counts as finished), streaming jobs or native ``pipefill.Job`` objects. Every rank of
    ``group`` (default: the whole world) must call it at the same point of each step: it is an
    all-reduce (MIN) of the ranks' flags, on the CPU for gloo and on the current CUDA device
    for NCCL. Without torch.distributed initialised it is this rank's flag.

    Why: each rank's fill jobs finish at their own step, and a rank whose loop ends while the
    others still call ``schedule.step()`` leaves them waiting for its sends forever. Loop with
    ``while not pipefill.torch.all_finished([infer, train]): schedule.step(...)``."""
    if not isinstance(jobs, (list, tuple)):
        jobs = [jobs]
    local = all(_ended(job) for job in jobs)
    if not (dist.is_available() and dist.is_initialized()):
        return local
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


from .torch_jobs import (FillJobError, InferenceJob, Progress, TrainingJob,  # noqa: E402,F401
                         inference_job, training_job)
