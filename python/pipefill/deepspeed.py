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

``DualPipeVEngine`` (DeepSpeed 0.19) queues its receives and waits for them in one
``CommitP2P`` instruction (``batch_isend_irecv`` then ``wait()`` on each request); there a
commit that carries receives is one bubble (the waits of one batch end together; NCCL returns
one coalesced request for the batch anyway).

Streams: CUDA: the current torch stream at each receive (DeepSpeed's compute stream); the
simulated and host backends: a high-priority stream of the runtime (no ``torch.cuda`` call is
made without the CUDA backend), and on the simulated backend the wait time is mirrored into it.
A failed bubble instruction never stops training: it is counted in
``runtime.bubble_failures`` and warned about once per message (``strict=True`` raises).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from . import BubbleKind, Runtime
from ._bubbles import BubbleEmitter, EmitterCounters, OpenBubble

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
    if problems:
        raise RuntimeError(f"pipefill.deepspeed cannot instrument {type(engine).__name__} of "
                           f"DeepSpeed {_deepspeed_version()}: " + "; ".join(problems)
                           + f" (tested: {', '.join(TESTED_DEEPSPEED)})")
    return schedule


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
        self._class = self._make_class(schedule)
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
            if not any(_is_receive(op) for op in ops):
                return original(engine, *args, **kwargs)
            return adapter.emitter.around(lambda: original(engine, *args, **kwargs),
                                          BubbleKind.OTHER)
        commit.__wrapped__ = original  # type: ignore[attr-defined]
        return commit

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
