"""pipefill.deepspeed: bubble instructions for DeepSpeed's pipeline engine.

``handle = instrument(engine, runtime)`` (``engine`` as returned by ``deepspeed.initialize``
for a ``PipelineModule``) makes every ``RecvActivation`` / ``RecvGrad`` instruction the engine
executes a bubble (begun before the receive, ended after it, also when it raises), and every
``train_batch`` / ``eval_batch`` an iteration (``iteration_end``). ``handle.remove()`` (or the
end of a ``with handle:`` block) restores the engine exactly.

How it hooks, and why that survives DeepSpeed versions
-------------------------------------------------------
``PipelineEngine._exec_schedule`` runs each instruction of the schedule by looking its type
up in the class attribute ``_INSTRUCTION_MAP`` (``{RecvActivation: _exec_recv_activations,
...}``), on ``self``. :func:`instrument` sets the engine's class (``engine.__class__``) to a
subclass made for it whose ``_INSTRUCTION_MAP`` is the original with the receive entries
wrapped, and whose ``train_batch`` / ``eval_batch`` end an iteration afterwards. Nothing of
DeepSpeed is modified (the original class, its map and every other engine keep running
unchanged), and only three names are relied on: ``_INSTRUCTION_MAP``, the instruction classes
of ``deepspeed.runtime.pipe.schedule`` and ``train_batch``. :func:`check_engine` refuses,
naming what it found, an engine that lacks them.

Bubble kinds, from the instruction's position in the batch's schedule: a ``RecvActivation``
before the batch's first ``BackwardPass`` is WARMUP, a ``RecvGrad`` after the batch's last
``ForwardPass`` (all micro-batches forwarded) is COOLDOWN, the rest (steady 1F1B) OTHER. With
``optimizer_bubbles=True`` the gradient reduction and optimizer step (``ReduceTiedGrads``,
``ReduceGrads``, ``OptimizerStep``) are one bubble of kind OPTIMIZER (the runtime leaves those
unfilled unless its ``fill_optimizer_bubbles`` is set).

``DualPipeVEngine`` (DeepSpeed 0.19) only queues its receives in ``RecvActivation`` /
``RecvGrad`` and posts them in one ``CommitP2P`` instruction (``_exec_commit_p2p``:
``dist.batch_isend_irecv(self._p2p_ops)``, then ``req.wait()`` on each returned request in
turn). There each receive handle's wait is its own bubble: while the handle lives, the
``dist`` global of ``deepspeed.runtime.pipe.dualpipev`` (the ``deepspeed.comm`` module) is a
pass-through proxy whose ``batch_isend_irecv`` calls ``deepspeed.comm.batch_isend_irecv``
and, only inside an instrumented engine's ``CommitP2P``, returns the receive requests wrapped
so that each ``wait()`` is a bubble (send requests untouched). When the requests cannot be
matched to the queued ops (a backend that coalesces the batch into fewer requests, as NCCL
does), every wait of the batch is one bubble, begun at the first and ended after the last:
one coalesced handle waited is one bubble. :func:`check_engine` verifies that
``_exec_commit_p2p`` still calls ``batch_isend_irecv`` and ``wait`` by name and that the
module has its ``dist`` global.

Streams: CUDA: the current torch stream at each receive (DeepSpeed's compute stream); the
simulated and host backends: a high-priority stream of the runtime (no ``torch.cuda`` call is
made without the CUDA backend), and on the simulated backend the wait time is mirrored into it.
A failed bubble instruction never stops training: it is counted in
``runtime.bubble_failures`` and warned about once per message (``strict=True`` raises).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional

from ._enums import BubbleKind
from ._runtime import Runtime
from ._bubbles import (BubbleEmitter, BubbleRequest, EmitterCounters, OpenBubble, _RequestGroup,
                       wrap_requests)

TESTED_DEEPSPEED = ("0.19.8",)
"""DeepSpeed versions the adapter was run against (tests/python/test_deepspeed_adapter.py)."""

_RECEIVES = ("RecvActivation", "RecvGrad")
_OPTIMIZER = ("ReduceTiedGrads", "ReduceGrads", "OptimizerStep")


def _deepspeed_version() -> str:
    try:
        import deepspeed
        return str(getattr(deepspeed, "__version__", "unknown"))
    except Exception as error:  # noqa: BLE001 - only for messages
        return f"not importable ({error})"


def _is_receive(op: Any) -> bool:
    """A queued deepspeed.comm.P2POp (``op`` is the string 'irecv') or torch P2POp receive."""
    fn = getattr(op, "op", None)
    return fn == "irecv" if isinstance(fn, str) else getattr(fn, "__name__", "") == "irecv"


def check_engine(engine: Any) -> Any:
    """The DeepSpeed schedule module of ``engine``'s instructions; raises TypeError (an object
    that is not a pipeline engine) or RuntimeError (an engine whose instruction map lacks what
    the adapter wraps), naming the type and the DeepSpeed version found."""
    try:
        from deepspeed.runtime.pipe import schedule
        from deepspeed.runtime.pipe.engine import PipelineEngine
    except ImportError as error:
        raise RuntimeError(f"pipefill.deepspeed needs DeepSpeed's pipeline engine: {error}") from error
    if not isinstance(engine, PipelineEngine):
        raise TypeError(f"pipefill.deepspeed.instrument: {type(engine).__module__}."
                        f"{type(engine).__name__} is not a deepspeed PipelineEngine (pass what "
                        "deepspeed.initialize returns for a PipelineModule)")
    if getattr(type(engine), "_pipefill_bubbles", None) is not None:
        raise ValueError("pipefill.deepspeed.instrument: this engine is already instrumented; "
                         "remove() the other handle first")
    table = getattr(type(engine), "_INSTRUCTION_MAP", None)
    problems: List[str] = []
    if not isinstance(table, dict):
        problems.append(f"_INSTRUCTION_MAP is {type(table).__name__}, not a dict")
    else:
        for name in _RECEIVES + ("ForwardPass", "BackwardPass"):
            cls = getattr(schedule, name, None)
            if cls is None:
                problems.append(f"deepspeed.runtime.pipe.schedule.{name} is missing")
            elif cls not in table:
                problems.append(f"_INSTRUCTION_MAP has no entry for {name}")
    for name in ("train_batch", "_exec_schedule"):
        if not callable(getattr(engine, name, None)):
            problems.append(f"{name} is missing")
    commit = getattr(schedule, "CommitP2P", None)
    if not problems and commit is not None and commit in table:
        problems.extend(_dualpipev_problems(type(engine)))
    if problems:
        raise RuntimeError(f"pipefill.deepspeed cannot instrument {type(engine).__name__} of "
                           f"DeepSpeed {_deepspeed_version()}: " + "; ".join(problems)
                           + f" (tested: {', '.join(TESTED_DEEPSPEED)})")
    return schedule


def _dualpipev_problems(engine_class: type) -> List[str]:
    """What DualPipeVEngine's per-handle bubbles rely on and the engine class lacks."""
    import importlib
    problems: List[str] = []
    commit = getattr(engine_class, "_exec_commit_p2p", None)
    if not callable(commit):
        return ["_exec_commit_p2p is missing"]
    names = getattr(getattr(commit, "__code__", None), "co_names", ())
    for name in ("batch_isend_irecv", "wait", "_p2p_ops"):
        if name not in names:
            problems.append(f"_exec_commit_p2p does not refer to {name}")
    module = importlib.import_module(_commit_module(engine_class))
    if not callable(getattr(getattr(module, "dist", None), "batch_isend_irecv", None)):
        problems.append(f"{module.__name__}.dist.batch_isend_irecv is missing")
    return problems


def _commit_module(engine_class: type) -> str:
    """The module whose code runs the engine's CommitP2P (its ``dist`` global is used)."""
    commit = getattr(engine_class, "_exec_commit_p2p")
    return commit.__module__


class _CommProxy:
    """Stands for ``deepspeed.comm`` as the ``dist`` global of DualPipeV's module while a handle
    lives: every attribute is the real module's; ``batch_isend_irecv`` calls the real one
    (looked up at each call) and, inside an instrumented commit on this thread, wraps the
    receive requests (:meth:`EngineBubbles._wrap_commit_requests`)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self._current = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def batch_isend_irecv(self, p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
        requests = self._real.batch_isend_irecv(p2p_op_list, *args, **kwargs)
        adapter = getattr(self._current, "adapter", None)
        if adapter is None:
            return requests
        return adapter._wrap_commit_requests(list(p2p_op_list), requests)


_PROXIES: Dict[str, List[Any]] = {}  # module name -> [proxy, real dist, handles using it]
_PROXY_LOCK = threading.Lock()


def _install_proxy(module_name: str) -> _CommProxy:
    import importlib
    with _PROXY_LOCK:
        entry = _PROXIES.get(module_name)
        if entry is None:
            module = importlib.import_module(module_name)
            proxy = _CommProxy(module.dist)
            entry = _PROXIES[module_name] = [proxy, module.dist, 0]
            module.dist = proxy
        entry[2] += 1
        return entry[0]


def _release_proxy(module_name: str) -> None:
    import importlib
    with _PROXY_LOCK:
        entry = _PROXIES[module_name]
        module = importlib.import_module(module_name)
        if entry[2] == 1 and module.dist is not entry[0]:
            raise RuntimeError(f"pipefill.deepspeed: {module_name}.dist is now "
                               f"{module.dist!r}, not the proxy instrument() set; remove the "
                               "later change first")
        entry[2] -= 1
        if entry[2] == 0:
            module.dist = entry[1]
            del _PROXIES[module_name]


class EngineBubbles(EmitterCounters):
    """The handle :func:`instrument` returns: a context manager with :meth:`remove`.

    Counters: :attr:`bubbles` (receive bubbles begun), :attr:`batch_bubbles` (per
    ``train_batch``/``eval_batch``), :attr:`optimizer_bubbles_begun`,
    :attr:`interrupted_waits` (receives that raised; their bubbles were ended), :attr:`errors`
    (PipeFillErrors reported instead of raised).
    """

    def __init__(self, engine: Any, runtime: Runtime, *, stream: Any = None,
                 optimizer_bubbles: bool = False, mirror_wait_time: Optional[bool] = None,
                 run_sim_world: bool = True, strict: bool = False) -> None:
        schedule = check_engine(engine)
        self.emitter = BubbleEmitter(runtime, stream=stream, mirror_wait_time=mirror_wait_time,
                                     run_sim_world=run_sim_world, strict=strict,
                                     where="pipefill.deepspeed")
        self.engine = engine
        self.runtime = runtime
        self.optimizer_bubbles = bool(optimizer_bubbles)
        self.batch_bubbles: List[int] = []
        self.optimizer_bubbles_begun = 0
        self._forwards = 0
        self._backwards = 0
        self._micro_batches = 0
        self._optimizer_bubble: Optional[OpenBubble] = None
        self._original_class = type(engine)
        self._proxy: Optional[_CommProxy] = None
        self._proxy_module = ""
        self.commit_receive_handles = 0
        """DualPipeVEngine: receive requests returned to an instrumented CommitP2P (each one's
        wait a bubble; with a coalescing backend, the batch's requests)."""
        self._uses_commit = False
        self._class = self._make_class(schedule)
        if self._uses_commit:
            self._proxy_module = _commit_module(self._original_class)
            self._proxy = _install_proxy(self._proxy_module)
        engine.__class__ = self._class
        self._installed = True

    # ---- the engine's subclass ----
    def _make_class(self, schedule: Any) -> type:
        base = self._original_class
        table: Dict[type, Callable[..., Any]] = dict(base._INSTRUCTION_MAP)
        commit = getattr(schedule, "CommitP2P", None)
        if commit is not None and commit in table:
            # DualPipeVEngine: RecvActivation / RecvGrad only queue; CommitP2P waits.
            table[commit] = self._commit(table[commit])
            self._uses_commit = True
        else:
            for name in ("RecvActivation", "RecvGrad"):
                cls = getattr(schedule, name)
                table[cls] = self._receive(table[cls], forward=(name == "RecvActivation"))
        table[schedule.ForwardPass] = self._counting(table[schedule.ForwardPass], "_forwards")
        table[schedule.BackwardPass] = self._counting(table[schedule.BackwardPass], "_backwards")
        if self.optimizer_bubbles:
            for name in _OPTIMIZER:
                cls = getattr(schedule, name, None)
                if cls is not None and cls in table:
                    table[cls] = self._optimizer(table[cls], last=(name == "OptimizerStep"))
        adapter = self

        def train_batch(engine: Any, *args: Any, **kwargs: Any) -> Any:
            return adapter._batch(lambda: base.train_batch(engine, *args, **kwargs), engine)

        def eval_batch(engine: Any, *args: Any, **kwargs: Any) -> Any:
            return adapter._batch(lambda: base.eval_batch(engine, *args, **kwargs), engine)

        return type(base.__name__, (base,), {
            "_INSTRUCTION_MAP": table, "train_batch": train_batch, "eval_batch": eval_batch,
            "_pipefill_bubbles": self, "__module__": base.__module__,
            "__qualname__": base.__qualname__,
        })

    def _receive(self, original: Callable[..., Any], *, forward: bool) -> Callable[..., Any]:
        adapter = self

        def receive(engine: Any, *args: Any, **kwargs: Any) -> Any:
            return adapter.emitter.around(lambda: original(engine, *args, **kwargs),
                                          adapter._kind(forward))
        receive.__wrapped__ = original  # type: ignore[attr-defined]
        return receive

    def _counting(self, original: Callable[..., Any], counter: str) -> Callable[..., Any]:
        adapter = self

        def counted(engine: Any, *args: Any, **kwargs: Any) -> Any:
            setattr(adapter, counter, getattr(adapter, counter) + 1)
            return original(engine, *args, **kwargs)
        counted.__wrapped__ = original  # type: ignore[attr-defined]
        return counted

    def _commit(self, original: Callable[..., Any]) -> Callable[..., Any]:
        adapter = self

        def commit(engine: Any, *args: Any, **kwargs: Any) -> Any:
            ops = getattr(engine, "_p2p_ops", None) or []
            proxy = adapter._proxy
            if proxy is None or not any(_is_receive(op) for op in ops):
                return original(engine, *args, **kwargs)
            # The requests this commit posts come back through the proxy, which wraps the
            # receive ones for this thread only.
            outer = getattr(proxy._current, "adapter", None)
            proxy._current.adapter = adapter
            try:
                return original(engine, *args, **kwargs)
            finally:
                proxy._current.adapter = outer
        commit.__wrapped__ = original  # type: ignore[attr-defined]
        return commit

    def _wrap_commit_requests(self, ops: List[Any], requests: Any) -> Any:
        """The requests of a CommitP2P's batch, each receive request's wait a bubble of its own
        (matched to the queued ops in order); when the backend returned fewer requests than
        ops (coalesced), all the batch's waits are one bubble."""
        listed = list(requests) if isinstance(requests, (list, tuple)) else None
        if listed is None or len(listed) != len(ops):
            self.commit_receive_handles += len(listed) if listed is not None else 1
            return wrap_requests(requests, self.emitter, kind=BubbleKind.OTHER)
        wrapped = []
        for op, request in zip(ops, listed):
            if _is_receive(op):
                self.commit_receive_handles += 1
                request = BubbleRequest(request, _RequestGroup(self.emitter, 1, BubbleKind.OTHER,
                                                               None))
            wrapped.append(request)
        return type(requests)(wrapped)

    def _optimizer(self, original: Callable[..., Any], *, last: bool) -> Callable[..., Any]:
        adapter = self

        def optimizer(engine: Any, *args: Any, **kwargs: Any) -> Any:
            if adapter._optimizer_bubble is None:
                adapter._optimizer_bubble = adapter.emitter.begin(BubbleKind.OPTIMIZER)
                if adapter._optimizer_bubble is not None:
                    adapter.optimizer_bubbles_begun += 1
            try:
                return original(engine, *args, **kwargs)
            finally:
                if last:
                    adapter._end_optimizer_bubble()
        optimizer.__wrapped__ = original  # type: ignore[attr-defined]
        return optimizer

    def _end_optimizer_bubble(self) -> None:
        bubble, self._optimizer_bubble = self._optimizer_bubble, None
        if bubble is not None:
            bubble.end()

    def _kind(self, forward: bool) -> BubbleKind:
        if forward:
            return BubbleKind.WARMUP if self._backwards == 0 else BubbleKind.OTHER
        if self._micro_batches > 0 and self._forwards >= self._micro_batches:
            return BubbleKind.COOLDOWN
        return BubbleKind.OTHER

    def _batch(self, run: Callable[[], Any], engine: Any) -> Any:
        self._forwards = self._backwards = 0
        self._micro_batches = int(getattr(engine, "micro_batches", 0) or 0)
        begun = self.emitter.bubbles
        try:
            return run()
        finally:
            self._end_optimizer_bubble()  # a batch that raised in the reduction
            self.batch_bubbles.append(self.emitter.bubbles - begun)
            self.emitter.iteration_end()

    # ---- removal ----
    def remove(self) -> None:
        """Restores the engine's class (its only change). Idempotent. RuntimeError when the
        engine's class was changed again by someone else since (nothing is touched then)."""
        if not self._installed:
            return
        if type(self.engine) is not self._class:
            raise RuntimeError(f"pipefill.deepspeed: the engine's class is now "
                               f"{type(self.engine).__qualname__}, not the one instrument() set; "
                               "remove the later change first")
        if self._proxy is not None:
            _release_proxy(self._proxy_module)  # raises (nothing touched) if replaced since
            self._proxy = None
        self.engine.__class__ = self._original_class
        self._installed = False

    def __enter__(self) -> "EngineBubbles":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def instrument(engine: Any, runtime: Runtime, **options: Any) -> EngineBubbles:
    """Bubble instructions for a DeepSpeed ``PipelineEngine`` (or ``DualPipeVEngine``).

    Options: ``stream`` (a stream or a callable returning one; default: the current CUDA
    stream at each receive on the CUDA backend, a high-priority runtime stream otherwise),
    ``optimizer_bubbles`` (mark gradient reduction + optimizer step as a bubble of kind
    OPTIMIZER; default off), ``mirror_wait_time`` (simulated backend: a bubble lasts as long
    as the real wait; default on), ``run_sim_world`` (run the simulated world after each
    batch; default on), ``strict`` (raise PipeFillError instead of reporting it).
    """
    return EngineBubbles(engine, runtime, **options)
