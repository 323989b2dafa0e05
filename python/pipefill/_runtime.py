"""Runtime, bubbles, jobs and statistics: the C API's runtime part in Python's idiom."""
from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import _pipefill
from ._config import Config
from ._enums import Backend, BubbleKind, Result, _KIND_NAMES
from ._errors import PipeFillError
from ._sim import SimStream, SimWorld
from . import _extensions, _profiler
from ._job import Job  # noqa: F401 (created here; imported from here by the torch layer)
from ._stats import (ClassStats, CostInfo, FillProgress, GraphCounts, JobInfo, MemoryInfo, Stats,  # noqa: F401
                     TicketCounts, _kind, _skips)

StreamLike = Union[None, int, SimStream, "Stream", Any]
"""A stream: None (CUDA's legacy default stream), an int handle (cudaStream_t / simulated
stream address), a :class:`SimStream` or :class:`Stream`, or any object with a
``cuda_stream`` attribute (``torch.cuda.Stream``, ``torch.cuda.current_stream()``, CuPy) or the
``__cuda_stream__`` protocol."""


def stream_handle(stream: StreamLike) -> int:
    """The raw stream handle (an int) for anything accepted as a stream."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError("a stream cannot be a bool")
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "handle", None)
    if isinstance(stream, (SimStream, Stream)) and isinstance(handle, int):
        return handle
    cuda_stream = getattr(stream, "cuda_stream", None)
    if isinstance(cuda_stream, int):
        return cuda_stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if callable(protocol):
        value = protocol()
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int):
            return value[1]
    raise TypeError(f"{type(stream).__name__} is not a stream: pass None, an int handle, a "
                    "SimStream, or an object with a cuda_stream attribute")


def host_stream_delay(stream: "StreamLike", duration_us: float) -> None:
    """pfHostStreamDelay: the host-backend stream waits ``duration_us`` (e.g. a stand-in for
    the main job's compute in tests)."""
    _pipefill.host_stream_delay(stream_handle(stream), float(duration_us))


def host_stream_synchronize(stream: "StreamLike") -> None:
    """pfHostStreamSynchronize: blocks until the host-backend stream's work has executed."""
    _pipefill.host_stream_synchronize(stream_handle(stream))


def host_now(stream: "StreamLike") -> float:
    """pfHostNow: the host device's clock (µs; the clock of its events and of the trace)."""
    return _pipefill.host_now(stream_handle(stream))


def error_string(code: int) -> str:
    """pfGetErrorString: the static text naming a result code."""
    return _pipefill.error_string(int(code))


def library_version() -> int:
    """pfGetVersion of the library compiled into the extension (MAJOR*10000+MINOR*100+PATCH)."""
    return _pipefill.version()


def _kind_value(kind: Union[BubbleKind, str, int]) -> int:
    if isinstance(kind, str):
        key = kind.strip().lower()
        if key not in _KIND_NAMES:
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"bubble kind '{kind}' is not one of {'|'.join(_KIND_NAMES)}")
        return int(_KIND_NAMES[key])
    if isinstance(kind, bool) or not isinstance(kind, int):
        raise TypeError(f"bubble kind must be a BubbleKind, str or int, not {type(kind).__name__}")
    return int(kind)


def _bubble_args(kind: Union[BubbleKind, str, int], label: Optional[str],
                 expected_us: Optional[float], lent_bytes: Any,
                 lent_memory: Any) -> Tuple[int, Optional[str], float, int, int]:
    """A bubble's arguments checked, a wrong type named with the argument (never a bare
    ValueError from int()/float())."""
    if label is not None and not isinstance(label, str):
        raise TypeError(f"bubble: label must be a str or None, not {type(label).__name__}")
    if expected_us is None:
        expected = 0.0
    elif isinstance(expected_us, bool) or not isinstance(expected_us, (int, float)):
        raise TypeError(f"bubble: expected_us must be a number of microseconds or None, not "
                        f"{type(expected_us).__name__} ({expected_us!r})")
    else:
        expected = float(expected_us)
    for name, value in (("lent_bytes", lent_bytes), ("lent_memory", lent_memory)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"bubble: {name} must be an int, not {type(value).__name__} "
                            f"({value!r})")
    return _kind_value(kind), label, expected, int(lent_bytes or 0), int(lent_memory or 0)


class Stream:
    """A main-job stream made by :meth:`Runtime.high_priority_stream`."""

    def __init__(self, runtime: "Runtime", handle: int) -> None:
        self.runtime = runtime
        self.handle = handle

    @property
    def cuda_stream(self) -> int:
        """The cudaStream_t (CUDA backend) or simulated stream address, as an int."""
        return self.handle

    def close(self) -> None:
        """pfStreamDestroy."""
        self.runtime._native.destroy_stream(self.handle)

    def __repr__(self) -> str:
        return f"Stream(0x{self.handle:x})"


class CaptureContext:
    """Made by :meth:`Runtime.capture_context`: pushes on entry, pops on exit (also when the
    block raises)."""

    def __init__(self, runtime: "Runtime", handle: int) -> None:
        self._runtime = runtime
        self._handle = handle

    def __enter__(self) -> "CaptureContext":
        self._runtime._native.push_capture_context(self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._runtime._native.pop_capture_context()


class Bubble:
    """A bubble as a context manager: begin on entry, end on exit (also when the body raises,
    so the gate closes in stream order whatever happened to the wait)."""

    def __init__(self, runtime: "Runtime", stream: int, kind: int, label: Optional[str],
                 expected_us: float, lent_bytes: int, lent_memory: int) -> None:
        self._runtime = runtime
        self._stream = stream
        self._args = (kind, label, expected_us, lent_bytes, lent_memory)

    def __enter__(self) -> "Bubble":
        self._runtime._begin(self._stream, *self._args)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self._runtime._end(self._stream)
        except PipeFillError as end_error:
            if exc is None:
                raise
            if hasattr(exc, "add_note"):
                exc.add_note(f"and ending the bubble failed too: {end_error}")


class Runtime:
    """A PipeFill runtime on one device (pfRuntime_t).

    ``Runtime(config)`` or ``Runtime(backend="sim", stage_id=0, ...)`` (keyword arguments are
    :class:`Config` fields, applied over ``config`` when both are given). Use it as a context
    manager, or call :meth:`close`. Closing destroys the jobs still attached first.

    Engine pattern, per receive the stage waits on::

        post_receive()
        with runtime.bubble(main_stream, kind=BubbleKind.WARMUP):
            wait_for_receive()
        compute()
        ...
        runtime.iteration_end()
    """

    def __init__(self, config: Optional[Config] = None, /, **fields: Any) -> None:
        if config is not None and not isinstance(config, Config):
            raise TypeError(f"Runtime: config must be a pipefill.Config, not {type(config).__name__}")
        names = [f.name for f in dataclasses.fields(Config)]
        for name in fields:
            if name not in names:
                nearest = difflib.get_close_matches(name, names, n=1)
                hint = f": did you mean {nearest[0]}?" if nearest else ""
                raise TypeError(f"Runtime: '{name}' is not a Config field{hint}")
        if config is None:
            config = Config(**fields)
        elif fields:
            config = dataclasses.replace(config, **fields)
        world = config.sim_world
        if world is not None and not isinstance(world, SimWorld):
            raise TypeError("Config.sim_world must be a pipefill.SimWorld")
        self._world = world  # kept alive while the runtime lives
        self._native = _pipefill.Runtime(config._to_raw(), world._native if world else None)
        self._job_refs: "List[weakref.ref[Job]]" = []
        self._python_failed_jobs = 0  # jobs that failed on the Python side (Job._fail)
        self._python_failed_completed = 0  # of them, those the library counted as completed
        # The runtime's class key of the next unlabelled bubble ("#k": k-th of the iteration),
        # and the torch.profiler range of the open bubble (_profiler).
        self._bubble_index = 0
        self._profiler_scope: Any = None
        # iteration_end's hooks (a training job's checkpoint: taken while no bubble is open) and
        # how many iteration_end calls there were (0: the trainer does not make them).
        self._iteration_end_hooks: List[Callable[[], None]] = []
        self._iteration_ends = 0
        self._report_backend(config)
        # The layers above the core that act on every runtime (_extensions.py): e.g. the
        # fill-job service's agent when PIPEFILL_SERVICE is set, registered by the package face.
        self._extensions: Dict[str, Any] = _extensions.start(self)

    def _report_backend(self, config: Config) -> None:
        # backend auto (the default) is a choice the user did not make: say which backend it
        # became, and warn when it is the simulator, whose virtual time ignores real waits.
        requested = config.backend
        if requested is None:
            requested = os.environ.get("PIPEFILL_BACKEND", "auto")
        if str(requested).strip().lower() not in ("auto", "0", str(Backend.AUTO)):
            return
        # The fallback to the simulator is warned about once, by the library itself (its log at
        # level warn, which pfRuntimeCreate just wrote): a second warning here said the same
        # twice per rank, and "bubbles measure 0" was untrue where waits are mirrored into
        # virtual time (pipefill.torch does it).
        logging.getLogger("pipefill").info("backend 'auto' chose %s", self.backend)

    # ---- life ----
    def close(self) -> None:
        """Destroys the jobs still attached (cancelling them), then the runtime. Idempotent.
        Result.INVALID_STATE (and nothing changes) while a bubble is open."""
        extensions = getattr(self, "_extensions", None)
        if extensions and not self._native.closed and not self.in_bubble:
            self._extensions = {}
            _extensions.call_each(extensions, "close")  # e.g. leases back to the service
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- properties ----
    @property
    def backend(self) -> Backend:
        """The backend in force."""
        return Backend(self._native.backend())

    @property
    def config(self) -> Config:
        """The configuration in force after defaults and environment were applied."""
        return Config._from_raw(self._native.config(), self._world)

    @property
    def sim_world(self) -> SimWorld:
        """The simulated world this runtime runs in (its private one unless given).
        Result.NOT_SUPPORTED on the CUDA backend."""
        native = self._native.sim_world()
        if self._world is not None and native.handle == self._world.handle:
            return self._world
        return SimWorld._wrap(native)

    @property
    def async_error(self) -> Result:
        """First asynchronous error (executor thread or device), Result.SUCCESS if none."""
        return Result(self._native.async_error())

    # ---- bubbles ----
    def bubble(self, stream: StreamLike, *, kind: Union[BubbleKind, str, int] = BubbleKind.OTHER,
               label: Optional[str] = None, expected_us: Optional[float] = None,
               lent_bytes: int = 0, lent_memory: Optional[int] = None) -> Bubble:
        """A bubble on ``stream`` as a context manager (pfBubbleBegin on entry, pfBubbleEnd on
        exit). Enter it right after posting the communication the stage waits on, and wait
        inside it.

        Args:
            kind: where in the schedule the bubble is (class key part and trace label).
            label: a stable label, used as the bubble class key when given.
            expected_us: expected duration, lets a class fill before it has history.
            lent_bytes, lent_memory: device memory the engine lends for this bubble only.
        """
        return Bubble(self, stream_handle(stream),
                      *_bubble_args(kind, label, expected_us, lent_bytes, lent_memory))

    def bubble_begin(self, stream: StreamLike, *, kind: Union[BubbleKind, str, int] = BubbleKind.OTHER,
                     label: Optional[str] = None, expected_us: Optional[float] = None,
                     lent_bytes: int = 0, lent_memory: Optional[int] = None) -> None:
        """pfBubbleBegin: records the begin on ``stream`` (stream order); never blocks."""
        self._begin(stream_handle(stream), *_bubble_args(kind, label, expected_us, lent_bytes,
                                                          lent_memory))

    def bubble_end(self, stream: StreamLike) -> None:
        """pfBubbleEnd: closes the gate in stream order; ``stream`` must be the begin's."""
        self._end(stream_handle(stream))

    def _begin(self, stream: int, kind: int, label: Optional[str], expected_us: float,
               lent_bytes: int, lent_memory: int) -> None:
        # Before the begin: it (inline launch mode) or the executor right after it launches the
        # bubble's slices, whose profiler ranges need the slice observer in place (_profiler).
        _profiler.before_bubble(self)
        # The range opens first: a slice (and its fill-slice range) starts only after the begin,
        # so it always starts inside its bubble's range. A begin that fails closes it at once.
        key = label if label else f"#{self._bubble_index}"
        scope = _profiler.open_range(key)
        try:
            self._native.bubble_begin(stream, kind, label, expected_us, lent_bytes, lent_memory)
        except BaseException:
            _profiler.close_range(scope)
            raise
        self._bubble_index += 1
        self._profiler_scope = scope

    def _end(self, stream: int) -> None:
        scope, self._profiler_scope = self._profiler_scope, None
        try:
            self._native.bubble_end(stream)
        finally:
            _profiler.close_range(scope)

    def bubble_close_fill(self, stream: StreamLike) -> None:
        """pfBubbleCloseFill: when ``stream`` reaches this point (never before the open bubble's
        begin) the open bubble's fill stops claiming items; the bubble still ends at
        ``bubble_end``. For an engine that learns the end early (a sender's notice on a side
        stream). A class closed this way plans its gated work to the longest bubble of its
        window (``PIPEFILL_NOTICED_QUANTILE``)."""
        self._native.bubble_close_fill(stream_handle(stream))

    @property
    def in_bubble(self) -> bool:
        """True between a bubble begin and its end (through this object)."""
        return self._native.in_bubble()

    def iteration_end(self) -> None:
        """pfIterationEnd: the k-th bubble of an iteration is bubble class k. Then runs the
        hooks of fill jobs that act between iterations (a training job's checkpoint copy), on
        this thread, with no bubble open."""
        self._native.iteration_end()
        self._bubble_index = 0
        self._iteration_ends += 1
        for hook in list(self._iteration_end_hooks):
            try:
                hook()
            except Exception as error:  # a hook must never break the trainer: drop it, say so
                self._remove_iteration_end_hook(hook)
                warnings.warn(f"pipefill: an iteration_end hook raised and was removed "
                              f"({type(error).__name__}: {error})", RuntimeWarning, stacklevel=2)
        if self._extensions:
            _extensions.call_each(self._extensions, "on_iteration_end")

    def _add_iteration_end_hook(self, hook: Callable[[], None]) -> None:
        """Calls ``hook()`` after every :meth:`iteration_end` until removed (it must not raise)."""
        self._iteration_end_hooks.append(hook)

    def _remove_iteration_end_hook(self, hook: Callable[[], None]) -> None:
        """Removes ``hook`` (nothing when it is not there)."""
        self._iteration_end_hooks = [h for h in self._iteration_end_hooks if h != hook]

    # ---- jobs ----
    def create_job(self, spec: Any) -> Job:
        """Registers a fill job (pfJobCreate) from a description of :mod:`pipefill.jobs`.
        Result.OUT_OF_MEMORY when its resident memory cannot fit the arena."""
        create = getattr(spec, "_create", None)
        if create is None:
            raise TypeError(f"{type(spec).__name__} is not a fill job description "
                            "(see pipefill.jobs)")
        job = Job(self, spec, create(self._native))
        self._job_refs = [r for r in self._job_refs if r() is not None and not r().closed]
        self._job_refs.append(weakref.ref(job))
        return job

    @property
    def jobs(self) -> List[Job]:
        """The jobs created through this object that are still open, in creation order."""
        jobs = [r() for r in self._job_refs]
        return [j for j in jobs if j is not None and not j.closed]

    # ---- device ----
    def synchronize(self) -> None:
        """Waits for every enqueued fill slice and harvests all bubble timings. Never call it
        inside a bubble."""
        self._native.synchronize()

    def capture_stream(self) -> Stream:
        """A stream to capture a :class:`pipefill.jobs.GraphJob`'s graph on
        (pfGraphCaptureStreamCreate): on CUDA it belongs to the fill partition's context (the
        green context when there is one), so the graph's kernels do too. Capture only."""
        return Stream(self, self._native.create_capture_stream())

    def capture_context(self, stream: "Stream") -> "CaptureContext":
        """``with runtime.capture_context(capture):`` - the capture stream's CUDA context current on
        this thread for the block (pfGraphCaptureContextPush/Pop): capture a GraphJob's graph
        inside it, so kernels torch and cuBLAS launch into the capture belong to the fill
        partition's context (the green context). Nothing is pushed where that context is current
        already; the simulated and host backends only pair the calls."""
        return CaptureContext(self, stream.handle if isinstance(stream, Stream) else int(stream))

    def fill_stream_handles(self) -> List[int]:
        """The runtime's fill streams as raw handles (pfRuntimeGetFillStreams): cudaStream_t on
        CUDA, simulated/host stream addresses otherwise. To observe fill work only: never
        enqueue main-job work on them nor destroy them. ``pipefill.torch.fill_streams`` wraps
        them as ``torch.cuda.ExternalStream``."""
        return list(self._native.fill_streams())

    def high_priority_stream(self) -> Stream:
        """A main-job stream at the device's highest priority (pfStreamCreateHighPriority)."""
        return Stream(self, self._native.create_high_priority_stream())

    def set_class_margin(self, class_key: str, margin_us: float) -> None:
        """pfRuntimeSetClassMargin: the safety margin of one bubble class (its key as in
        ``stats().classes``: the label, or ``"#k"``), in place of ``safety_margin_us`` for its
        bubbles from the next one planned; ``margin_us < 0`` removes it. For a bubble that ends in
        a wait moving no bytes (a collective of the other stages) 0 fills up to its predicted
        end; the gate still stops the fill there."""
        self._native.set_class_margin(class_key, float(margin_us))

    # ---- results ----
    def stats(self) -> Stats:
        """pfRuntimeGetStatsV2 (every field, SM x us included), the skipped bubbles by cause
        (pfRuntimeGetSkipCounts) and every bubble class (pfRuntimeGetClassStats). ``print()``
        it for a summary and a table per class."""
        classes = tuple(ClassStats._from_native(c) for c in self._native.class_stats())
        native = self._native.stats()
        # A job that failed on the Python side is cancelled natively: counted as the failure.
        native["jobs_failed"] += self._python_failed_jobs
        native["jobs_completed"] -= self._python_failed_completed
        return Stats(**native, skips=_skips(self._native.skip_counts()),
                     classes=classes, bubble_failures=self.bubble_failures)

    def memory_info(self) -> MemoryInfo:
        """pfRuntimeGetMemoryInfo: arena bytes, arena bytes in use, device free/total, measured
        now. Result.INVALID_STATE inside a bubble (on CUDA it queries the device)."""
        return MemoryInfo(**self._native.memory_info())

    def write_trace(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes a Chrome trace (Perfetto / chrome://tracing) of the bubbles and fill slices
        harvested so far (pfTraceWrite)."""
        self._native.write_trace(os.fspath(path))

    # ---- bubble-instruction failures inside adapters (never swallowed) ----
    def _report_bubble_failure(self, error: PipeFillError, where: str = "pipefill") -> None:
        """Counts a bubble instruction that failed inside an adapter (pipefill.torch,
        pipefill.deepspeed, pipefill.megatron), which goes on without it, and warns the first
        time each distinct C message is seen on this runtime."""
        counts = self.__dict__.setdefault("_bubble_failures", {})
        message = str(error)
        counts[message] = counts.get(message, 0) + 1
        if counts[message] == 1:
            warnings.warn(f"{where}: a bubble instruction failed; training goes on without it "
                          f"(counted in Runtime.bubble_failures): {message}", RuntimeWarning,
                          stacklevel=4)

    @property
    def bubble_failures(self) -> int:
        """Bubble instructions that failed inside adapters, in total (each also warned about,
        once per message)."""
        return sum(self.__dict__.get("_bubble_failures", {}).values())

    @property
    def bubble_failures_by_message(self) -> Dict[str, int]:
        """The failures of :attr:`bubble_failures` by their PipeFillError message."""
        return dict(self.__dict__.get("_bubble_failures", {}))

    def __repr__(self) -> str:
        if self.closed:
            return "Runtime(closed)"
        return f"Runtime(backend={self.backend.name.lower()})"


def _main_thread_after_fork_in_a_fill_thread() -> None:
    """os.register_at_fork(after_in_child=...): a process forked by a Python item - a DataLoader
    with num_workers > 0 starting its workers inside a training_job's item - is forked from the
    host device's fill thread, which Python did not start. When something had called
    threading.current_thread() there (torch's DataLoader does), the child's main thread is that
    _DummyThread, which has no thread-state lock, and CPython 3.11's threading._shutdown() then
    fails an assertion when the child exits: the worker exits with code 1 and the parent's
    DataLoader raises "worker exited unexpectedly" (tests/python/test_fill_window.py). The
    child's main thread gets the lock a main thread has."""
    main = threading.main_thread()
    if (isinstance(main, threading._DummyThread) and main.ident == threading.get_ident()
            and getattr(main, "_tstate_lock", False) is None):
        main._set_tstate_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_main_thread_after_fork_in_a_fill_thread)
