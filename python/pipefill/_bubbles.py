"""Bubble instructions for framework adapters: what pipefill.deepspeed, pipefill.megatron and
pipefill.torch's ``bubble_on_wait`` share.

- :func:`default_stream`: the stream a bubble goes on when the caller gives none, on every
  backend (CUDA: the current torch stream at the wait; simulated and host: one high-priority
  stream of the runtime, made once per runtime, so that no bubble call passes NULL, which only
  CUDA accepts).
- :class:`BubbleEmitter`: begin / end / iteration end with every PipeFillError reported
  through :meth:`pipefill.Runtime._report_bubble_failure` (counted, warned once per message)
  instead of swallowed, and on the simulated backend the measured wait mirrored into the
  simulated stream so that a bubble lasts as long as the real wait.
- :func:`wrap_requests`: one bubble around waiting on posted requests (``bubble_on_wait``).
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Union

from ._enums import Backend, BubbleKind
from ._errors import PipeFillError
from ._runtime import Runtime, Stream, stream_handle

StreamChoice = Any  # a StreamLike, or a callable returning one

_DEFAULT_STREAMS: "weakref.WeakKeyDictionary[Runtime, Stream]" = weakref.WeakKeyDictionary()
_DEFAULT_LOCK = threading.Lock()


def default_stream(runtime: Runtime) -> Any:
    """The stream bubbles go on when none is given. CUDA: ``torch.cuda.current_stream()`` (the
    stream a NCCL wait is ordered on); the simulated and host backends have no default stream,
    so it is one high-priority stream of the runtime, shared by every adapter on it (made at
    the first call, outside any bubble)."""
    if runtime.backend == Backend.CUDA:
        import torch
        return torch.cuda.current_stream()
    with _DEFAULT_LOCK:
        stream = _DEFAULT_STREAMS.get(runtime)
        if stream is None:
            stream = runtime.high_priority_stream()
            _DEFAULT_STREAMS[runtime] = stream
        return stream


class BubbleEmitter:
    """Begins and ends bubbles of one runtime for an adapter.

    ``stream``: a stream, a callable returning one, or None (:func:`default_stream`; on CUDA
    resolved at every bubble). ``mirror_wait_time`` (default: on for the simulated backend):
    the wall time between begin and end delays the simulated stream, so the bubble has the
    real wait's length. ``run_sim_world`` (default on): :meth:`iteration_end` runs the
    simulated world until idle, so the fill work of the iteration's bubbles executes.
    ``strict``: raise PipeFillError instead of reporting it. ``where``: the adapter's name, in
    warnings.
    """

    def __init__(self, runtime: Runtime, *, stream: StreamChoice = None,
                 mirror_wait_time: Optional[bool] = None, run_sim_world: bool = True,
                 strict: bool = False, where: str = "pipefill") -> None:
        if not isinstance(runtime, Runtime):
            raise TypeError(f"{where}: runtime must be a pipefill.Runtime, not "
                            f"{type(runtime).__name__}")
        self.runtime = runtime
        self.strict = strict
        self.where = where
        backend = runtime.backend
        if stream is None and backend != Backend.CUDA:
            stream = default_stream(runtime)
        self._stream = stream
        self._cuda_default = stream is None
        self._sim_world = runtime.sim_world if backend == Backend.SIM else None
        self._mirror = (backend == Backend.SIM) if mirror_wait_time is None else bool(mirror_wait_time)
        if self._mirror and self._sim_world is None:
            raise ValueError(f"{where}: mirror_wait_time needs the simulated backend "
                             f"(the runtime's is {backend.name.lower()})")
        self._run_sim_world = bool(run_sim_world) and self._sim_world is not None
        self.bubbles = 0
        """Bubbles begun."""
        self.errors: List[PipeFillError] = []
        """PipeFillErrors of bubble instructions (reported, not raised)."""
        self.interrupted_waits = 0
        """Waits that raised inside a bubble (the bubble was ended all the same)."""

    def resolve_stream(self) -> Any:
        if self._cuda_default:
            return default_stream(self.runtime)
        stream = self._stream
        return stream() if callable(stream) else stream

    def guarded(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """``call(*args)``; a PipeFillError is raised when strict, else reported (counted by
        the runtime, warned once per message) and False returned."""
        return report_failure(self.runtime, self.errors, self.strict, self.where, call, *args,
                              **kwargs)

    def begin(self, kind: Union[BubbleKind, str, int] = BubbleKind.OTHER,
              label: Optional[str] = None) -> Optional["OpenBubble"]:
        """Begins a bubble; returns it (to end), or None when the begin failed (reported)."""
        stream = self.resolve_stream()
        if not self.guarded(self.runtime.bubble_begin, stream, kind=kind, label=label):
            return None
        self.bubbles += 1
        return OpenBubble(self, stream)

    def around(self, wait: Callable[[], Any], kind: Union[BubbleKind, str, int] = BubbleKind.OTHER,
               label: Optional[str] = None) -> Any:
        """``wait()`` inside a bubble, ended also when the wait raises."""
        bubble = self.begin(kind, label)
        failed = True
        try:
            result = wait()
            failed = False
            return result
        finally:
            if failed:
                self.interrupted_waits += 1
            if bubble is not None:
                bubble.end()

    def iteration_end(self) -> None:
        """pfIterationEnd (reported on failure), then the simulated world runs until idle."""
        self.guarded(self.runtime.iteration_end)
        if self._run_sim_world:
            self.guarded(self._sim_world.run_until_idle)


class EmitterCounters:
    """The counters an adapter handle shows, read from its ``emitter`` (a BubbleEmitter)."""

    emitter: "BubbleEmitter"

    @property
    def bubbles(self) -> int:
        """Bubbles begun through this handle."""
        return self.emitter.bubbles

    @property
    def errors(self) -> List[Any]:
        """The PipeFillErrors of bubble instructions that failed (each also counted by the
        runtime and warned once per message)."""
        return self.emitter.errors

    @property
    def interrupted_waits(self) -> int:
        """Receive waits that raised inside their bubble (the bubble was still ended)."""
        return self.emitter.interrupted_waits


def report_failure(runtime: Any, errors: List[Any], strict: bool, where: str,
                   call: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """``call(*args)``; a PipeFillError is raised when ``strict``, else appended to ``errors``,
    reported to the runtime (counted, warned once per message) and False returned."""
    try:
        call(*args, **kwargs)
        return True
    except PipeFillError as error:
        if strict:
            raise
        errors.append(error)
        runtime._report_bubble_failure(error, where)
        return False


class OpenBubble:
    """A begun bubble: :meth:`end` mirrors the wait time (simulated backend) and ends it."""

    def __init__(self, emitter: BubbleEmitter, stream: Any) -> None:
        self.emitter = emitter
        self.stream = stream
        self.started = time.perf_counter()
        self.open = True

    def end(self) -> None:
        if not self.open:
            return
        self.open = False
        emitter = self.emitter
        if emitter._mirror:
            elapsed_us = (time.perf_counter() - self.started) * 1e6
            emitter.guarded(emitter._sim_world._native.stream_delay, stream_handle(self.stream),
                            elapsed_us)
        emitter.guarded(emitter.runtime.bubble_end, self.stream)


class _RequestGroup:
    """One bubble over a group of requests: begins before the first wait, ends after the last
    (or as soon as a wait raises)."""

    def __init__(self, emitter: BubbleEmitter, count: int, kind: Any,
                 label: Optional[str]) -> None:
        self.emitter, self.remaining = emitter, count
        self.kind, self.label = kind, label
        self.bubble: Optional[OpenBubble] = None
        self.done = False

    def before(self) -> None:
        if self.done or self.bubble is not None:
            return
        self.bubble = self.emitter.begin(self.kind, self.label)
        if self.bubble is None:
            self.done = True  # the begin failed (reported): the group's waits are not a bubble

    def after(self, failed: bool) -> None:
        self.remaining -= 1
        if failed:
            self.emitter.interrupted_waits += 1
        if self.bubble is not None and (failed or self.remaining <= 0):
            bubble, self.bubble = self.bubble, None
            self.done = True
            bubble.end()


class BubbleRequest:
    """A communication request whose ``wait()`` is inside its group's bubble; every other
    attribute is the request's."""

    def __init__(self, request: Any, group: _RequestGroup) -> None:
        self._request = request
        self._group = group

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._group.before()
        failed = True
        try:
            result = self._request.wait(*args, **kwargs)
            failed = False
            return result
        finally:
            self._group.after(failed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


def wrap_requests(requests: Any, emitter: BubbleEmitter, *, kind: Any = BubbleKind.OTHER,
                  label: Optional[str] = None) -> Any:
    """A list / tuple / dict of requests (or one) whose waits make one bubble (same container
    type, so callers that test ``isinstance(reqs, list)`` see no difference)."""
    if isinstance(requests, dict):
        group = _RequestGroup(emitter, len(requests), kind, label)
        return {key: BubbleRequest(r, group) for key, r in requests.items()}
    if isinstance(requests, (list, tuple)):
        group = _RequestGroup(emitter, len(requests), kind, label)
        return type(requests)(BubbleRequest(r, group) for r in requests)
    return BubbleRequest(requests, _RequestGroup(emitter, 1, kind, label))
