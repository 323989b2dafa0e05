"""pipefill.torch: the torch.distributed.pipelining schedule hook (instrument, bubble_on_wait: the
receive waits become bubbles; how and why it survives torch versions is in the package's
docstring) and all_finished, with which the ranks agree on leaving the step loop."""
from __future__ import annotations

import ast
import inspect
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch.distributed.pipelining import schedules as _schedules

from .. import _bubbles
from .._enums import Backend, BubbleKind
from .._errors import PipeFillError
from .._runtime import Runtime, StreamLike
from .._runtime import stream_handle as _generic_stream_handle

TESTED_TORCH = ("2.15",)
"""torch versions (major.minor) whose schedules.py the hook was audited against."""




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
