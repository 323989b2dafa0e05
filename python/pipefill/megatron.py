"""pipefill.megatron: bubble instructions for Megatron-Core's pipeline schedules.

``handle = instrument(runtime)`` makes every receive wait of Megatron-Core's pipeline-parallel
schedules a bubble, and every call of the forward-backward function an iteration
(``iteration_end``): 1F1B (``forward_backward_pipelining_without_interleaving``, batched and
unbatched p2p) and interleaved (``..._with_interleaving``, also with ``overlap_p2p_comm``).
``handle.remove()`` (or the end of a ``with handle:`` block) restores Megatron-Core exactly.

How it hooks, and why that survives Megatron-Core versions
----------------------------------------------------------
Every pipeline receive of the schedules goes through ``P2PCommunicator._communicate`` (module
function ``_communicate`` before 0.14) in ``megatron/core/pipeline_parallel/
p2p_communication.py``, which posts through one of two module-level helpers it looks up by
global name at each call: ``_batched_p2p_ops(...)`` (``batch_p2p_comm``; returns a list of
requests) or ``_p2p_ops(...)`` (returns a dict ``{"recv_prev": req, "send_next": req, ...}``),
both called with the keywords ``tensor_recv_prev`` / ``tensor_recv_next``. ``_communicate`` then
waits on the requests itself, or (``overlap_p2p_comm``) returns them and the interleaved
schedule waits on each handle later, after popping it from the dict by name. The forward-
backward functions are looked up by global name in ``schedules.py`` by
``get_forward_backward_func()``.

:func:`instrument` replaces those four module globals with pass-through wrappers while the
handle lives:

1. the posting helpers return the same requests, with the receive ones wrapped: a batch
   (list) that carries a receive becomes one bubble, begun at its first ``wait()`` and ended
   after its last (NCCL returns one coalesced request per batch anyway); in a dict, each
   ``recv_prev`` / ``recv_next`` request is its own bubble, opened at its ``wait()`` wherever
   the schedule waits on it (inside ``_communicate``, or later with ``overlap_p2p_comm``); send
   requests are untouched;
2. the forward-backward functions call the original, then ``iteration_end``.

Only names and keyword conventions are relied on, never line numbers or bodies;
:func:`check_hook_points` verifies them (and that ``_communicate`` still refers to both
helpers by name) and :func:`instrument` refuses, naming the Megatron-Core version, when one is
missing. Not hooked, and refused with an error at the forward-backward call:
``use_ring_exchange_p2p`` (posts and waits in one call) and ``variable_seq_lengths`` /
``mtp_standalone`` (an extra shape exchange that waits outside the helpers). Receives made
outside an instrumented forward-backward call (a function obtained before ``instrument``) are
counted in :attr:`MegatronBubbles.outside_receives` and warned about, not made bubbles.

Bubble kinds, from what each post carries (1F1B's warm-up posts only forward receives, its
cool-down only backward ones): a forward (activation) receive posted before any backward
traffic (gradient send or receive) of the call is WARMUP; a gradient receive posted without
forward traffic once the call's forward receives reached the previous call's count (so from
the second call on) is COOLDOWN; the rest (steady state, posts carrying both) OTHER.

Streams as in :mod:`pipefill.deepspeed`: CUDA: the current torch stream at each wait;
simulated and host: a high-priority runtime stream (mirrored wait time on the simulator).
A failed bubble instruction is counted in ``runtime.bubble_failures`` and warned about once
per message; ``strict=True`` raises it.
"""
from __future__ import annotations

import inspect
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional

from ._runtime import Runtime
from ._bubbles import BubbleEmitter, EmitterCounters, wrap_requests
from ._enums import BubbleKind

TESTED_MEGATRON_CORE = ("0.16.1",)
"""megatron-core versions the adapter was run against (tests/python/test_megatron_adapter.py)."""

HOOK_POINTS = (
    "megatron.core.pipeline_parallel.p2p_communication._batched_p2p_ops(*, tensor_send_prev, "
    "tensor_recv_prev, tensor_send_next, tensor_recv_next, group, ...) -> list of requests",
    "megatron.core.pipeline_parallel.p2p_communication._p2p_ops(same keywords) -> dict "
    "(recv_prev / recv_next / send_prev / send_next)",
    "P2PCommunicator._communicate (or module _communicate) calls both by global name",
    "megatron.core.pipeline_parallel.schedules.forward_backward_pipelining_without_interleaving "
    "/ _with_interleaving, returned by get_forward_backward_func by global name",
)

_POSTERS = ("_batched_p2p_ops", "_p2p_ops")
_SCHEDULES = ("forward_backward_pipelining_without_interleaving",
              "forward_backward_pipelining_with_interleaving")
_ACTIVE: List["MegatronBubbles"] = []  # at most one handle per process
_ACTIVE_LOCK = threading.Lock()


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("megatron-core")
    except Exception:  # noqa: BLE001 - only for messages
        return "unknown"


def _modules():
    try:
        from megatron.core.pipeline_parallel import p2p_communication, schedules
    except ImportError as error:
        raise RuntimeError(f"pipefill.megatron needs megatron-core's pipeline_parallel package: "
                           f"{error}") from error
    return p2p_communication, schedules


def check_hook_points() -> None:
    """Raises RuntimeError, naming the megatron-core version, when a hook point is missing."""
    p2p, schedules = _modules()
    problems: List[str] = []
    for name in _POSTERS:
        fn = getattr(p2p, name, None)
        if not callable(fn):
            problems.append(f"p2p_communication.{name} is missing")
            continue
        params = inspect.signature(fn).parameters
        for keyword in ("tensor_recv_prev", "tensor_recv_next"):
            if keyword not in params:
                problems.append(f"p2p_communication.{name} has no keyword {keyword}")
    communicator = getattr(getattr(p2p, "P2PCommunicator", None), "_communicate", None)
    communicate = communicator or getattr(p2p, "_communicate", None)
    if not callable(communicate):
        problems.append("neither P2PCommunicator._communicate nor _communicate exists")
    else:
        names = set(getattr(communicate, "__code__", None).co_names
                    if hasattr(communicate, "__code__") else ())
        for name in _POSTERS:
            if name not in names:
                problems.append(f"_communicate no longer calls {name} by name")
    for name in _SCHEDULES:
        if not callable(getattr(schedules, name, None)):
            problems.append(f"schedules.{name} is missing")
    getter = getattr(schedules, "get_forward_backward_func", None)
    if not callable(getter) or not set(_SCHEDULES) <= set(getter.__code__.co_names):
        problems.append("schedules.get_forward_backward_func does not return the schedules by name")
    if problems:
        raise RuntimeError(f"pipefill.megatron cannot hook megatron-core {_version()}: "
                           + "; ".join(problems)
                           + f" (tested: {', '.join(TESTED_MEGATRON_CORE)})")


class MegatronBubbles(EmitterCounters):
    """The handle :func:`instrument` returns: a context manager with :meth:`remove`.

    Counters: :attr:`bubbles` (receive bubbles begun), :attr:`call_bubbles` (per
    forward-backward call), :attr:`interrupted_waits`, :attr:`errors` (PipeFillErrors
    reported instead of raised), :attr:`outside_receives` (receives posted outside an
    instrumented forward-backward call, not bubbles).
    """

    def __init__(self, runtime: Runtime, *, stream: Any = None,
                 mirror_wait_time: Optional[bool] = None, run_sim_world: bool = True,
                 strict: bool = False) -> None:
        check_hook_points()
        self.emitter = BubbleEmitter(runtime, stream=stream, mirror_wait_time=mirror_wait_time,
                                     run_sim_world=run_sim_world, strict=strict,
                                     where="pipefill.megatron")
        self.runtime = runtime
        self.call_bubbles: List[int] = []
        self.outside_receives = 0
        self._phases = _Phases()
        self._thread = threading.local()  # .depth: instrumented forward-backward calls running
        self._originals: Dict[Any, Dict[str, Callable[..., Any]]] = {}
        self._wrappers: Dict[Any, Dict[str, Callable[..., Any]]] = {}
        with _ACTIVE_LOCK:
            if _ACTIVE:
                raise ValueError("pipefill.megatron is already instrumented in this process; "
                                 "remove() the other handle first")
            p2p, schedules = _modules()
            self._install(p2p, {name: self._poster(getattr(p2p, name)) for name in _POSTERS})
            self._install(schedules, {name: self._schedule(getattr(schedules, name))
                                      for name in _SCHEDULES})
            _ACTIVE.append(self)

    # ---- installation ----
    def _install(self, module: Any, wrappers: Dict[str, Callable[..., Any]]) -> None:
        self._originals[module] = {name: getattr(module, name) for name in wrappers}
        self._wrappers[module] = wrappers
        for name, wrapper in wrappers.items():
            setattr(module, name, wrapper)

    def remove(self) -> None:
        """Restores the four module globals. Idempotent. RuntimeError (nothing touched) when
        one of them was replaced again by someone else since."""
        with _ACTIVE_LOCK:
            if self not in _ACTIVE:
                return
            changed = [f"{module.__name__}.{name}" for module, wrappers in self._wrappers.items()
                       for name, wrapper in wrappers.items() if getattr(module, name) is not wrapper]
            if changed:
                raise RuntimeError(f"pipefill.megatron: {', '.join(changed)} was replaced again "
                                   "after instrument(); remove that change first")
            for module, originals in self._originals.items():
                for name, original in originals.items():
                    setattr(module, name, original)
            _ACTIVE.remove(self)

    def __enter__(self) -> "MegatronBubbles":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # ---- the wrappers ----
    def _stepping(self) -> bool:
        return getattr(self._thread, "depth", 0) > 0

    def _schedule(self, original: Callable[..., Any]) -> Callable[..., Any]:
        adapter = self

        def forward_backward(*args: Any, **kwargs: Any) -> Any:
            adapter._refuse_unsupported(kwargs.get("model"))
            if adapter._stepping():  # a schedule calling another: one iteration
                return original(*args, **kwargs)
            adapter._thread.depth = 1
            adapter._phases.start_call()
            begun = adapter.emitter.bubbles
            try:
                return original(*args, **kwargs)
            finally:
                adapter._thread.depth = 0
                adapter.call_bubbles.append(adapter.emitter.bubbles - begun)
                adapter.emitter.iteration_end()
        forward_backward.__wrapped__ = original  # type: ignore[attr-defined]
        forward_backward.__name__ = getattr(original, "__name__", "forward_backward")
        return forward_backward

    def _refuse_unsupported(self, model: Any) -> None:
        if model is None:
            return
        try:
            from megatron.core.utils import get_model_config
            config = get_model_config(model[0] if isinstance(model, list) else model)
        except Exception:  # noqa: BLE001 - a model without a config: Megatron itself refuses
            return
        for option in ("use_ring_exchange_p2p", "variable_seq_lengths", "mtp_standalone"):
            if getattr(config, option, False):
                raise RuntimeError(f"pipefill.megatron: config.{option} = True is not supported "
                                   "(its receives wait outside the hooked p2p helpers); "
                                   "remove() the handle or turn the option off")

    def _poster(self, original: Callable[..., Any]) -> Callable[..., Any]:
        adapter = self

        def post(*args: Any, **kwargs: Any) -> Any:
            requests = original(*args, **kwargs)
            recv_prev = kwargs.get("tensor_recv_prev") is not None
            recv_next = kwargs.get("tensor_recv_next") is not None
            if not (recv_prev or recv_next):
                return requests
            if not adapter._stepping():
                adapter.outside_receives += 1
                if adapter.outside_receives == 1:
                    warnings.warn("pipefill.megatron: a pipeline receive outside an instrumented "
                                  "forward-backward call is not a bubble (get the function from "
                                  "get_forward_backward_func() after instrument())",
                                  RuntimeWarning, stacklevel=2)
                return requests
            kinds = adapter._phases.kinds(recv_prev=recv_prev, recv_next=recv_next,
                                          send_prev=kwargs.get("tensor_send_prev") is not None,
                                          send_next=kwargs.get("tensor_send_next") is not None)
            return adapter._wrap(requests, kinds)
        post.__wrapped__ = original  # type: ignore[attr-defined]
        post.__name__ = getattr(original, "__name__", "post")
        return post

    def _wrap(self, requests: Any, kinds: Dict[str, BubbleKind]) -> Any:
        if isinstance(requests, dict):  # _p2p_ops: one bubble per receive handle
            wrapped = dict(requests)
            for key, kind in kinds.items():
                if key in wrapped:
                    wrapped[key] = wrap_requests(wrapped[key], self.emitter, kind=kind)
            return wrapped
        if isinstance(requests, list) and requests:  # _batched_p2p_ops: one per batch
            kind = next(iter(kinds.values())) if len(kinds) == 1 else BubbleKind.OTHER
            return wrap_requests(requests, self.emitter, kind=kind)
        return requests


class _Phases:
    """Warm-up / steady / cool-down of one forward-backward call, from its posts."""

    def __init__(self) -> None:
        self.previous: Optional[int] = None  # forward receives of the previous call
        self.forward = 0
        self.backward_traffic = False
        self.calls = 0

    def start_call(self) -> None:
        if self.calls:
            self.previous = self.forward
        self.calls += 1
        self.forward = 0
        self.backward_traffic = False

    def kinds(self, *, recv_prev: bool, recv_next: bool, send_prev: bool,
              send_next: bool) -> Dict[str, BubbleKind]:
        """{"recv_prev": kind, "recv_next": kind} for the receives a post carries."""
        forward_traffic = recv_prev or send_next
        backward_traffic = recv_next or send_prev
        kinds: Dict[str, BubbleKind] = {}
        if recv_prev:
            warm = not (self.backward_traffic or backward_traffic)
            kinds["recv_prev"] = BubbleKind.WARMUP if warm else BubbleKind.OTHER
        if recv_next:
            cool = (not forward_traffic and self.previous is not None
                    and self.forward >= self.previous)
            kinds["recv_next"] = BubbleKind.COOLDOWN if cool else BubbleKind.OTHER
        self.forward += int(recv_prev)
        self.backward_traffic = self.backward_traffic or backward_traffic
        return kinds


def instrument(runtime: Runtime, **options: Any) -> MegatronBubbles:
    """Bubble instructions for Megatron-Core's pipeline schedules in this process (one handle
    at a time). Options: ``stream`` (a stream or a callable returning one; default: the
    current CUDA stream at each wait on the CUDA backend, a high-priority runtime stream
    otherwise), ``mirror_wait_time`` (simulated backend; default on), ``run_sim_world`` (run
    the simulated world after each forward-backward call; default on), ``strict`` (raise
    PipeFillError instead of reporting it)."""
    return MegatronBubbles(runtime, **options)


__all__ = ["HOOK_POINTS", "MegatronBubbles", "TESTED_MEGATRON_CORE", "check_hook_points",
           "instrument"]
