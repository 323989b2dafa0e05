"""pipefill.torch._job_common: what the streaming jobs (inference_job, training_job) share on the
simulated and host backends: the progress record and the job's own error, value descriptions for
error messages, atomic files, iteration helpers, and ``_StreamingJob`` - the native item job, the
failure path, the rate and the wait. The jobs themselves are in _streaming.py (inference) and
_training.py (training); the sinks in _sinks.py; the item path's tuning in _item_path.py.
"""
from __future__ import annotations

import collections
import itertools
import os
import pathlib
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Union

import torch

from .._enums import Result
from .._errors import FillJobError, PipeFillError
from .._runtime import Job, Runtime

UNBOUNDED_ITEMS = 1 << 62
"""Item count of a job whose input length is unknown: pfJobEndInput sets the real one."""

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Progress:
    """Progress of a streaming job, readable at any time."""
    items_done: int            # items whose output reached the sink (or steps taken), this attempt + resumed
    items_total: Optional[int]  # None while the input's length is unknown
    rate_per_s: float          # items per second over the last RATE_WINDOW_S seconds (0: none then)
    eta_s: Optional[float]     # None when unknown
    finished: bool


RATE_WINDOW_S = 10.0
"""Progress.rate_per_s counts the items completed in the last this many seconds."""
RATE_WINDOW_ITEMS = 4096
"""Completion times kept for the rate at most (bounded memory; faster jobs: the newest ones)."""


def _describe(value: Any) -> str:
    """A short description of a value for an error message (shape and dtype of a tensor)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}, dtype {value.dtype} on {value.device}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))[:8]}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _check_fits_module(who: str, what: str, module: "torch.nn.Module", value: Any,
                       device: bool = True) -> None:
    """Refuses a batch whose device or floating dtype differs from the module's parameters',
    naming both and the fix (before anything runs: an item would fail on every batch)."""
    if not isinstance(module, torch.nn.Module):
        return  # any callable: the first batch through it (the probe) checks it
    param = next(itertools.chain(module.parameters(), module.buffers()), None)
    if param is None or not isinstance(value, torch.Tensor):
        return
    if device and value.device != param.device:
        raise ValueError(f"{who}: {what} are on {value.device}, the module's parameters on "
                         f"{param.device}: move one of them (module.to({str(value.device)!r}) or "
                         f"the data to {str(param.device)!r})")
    if value.is_floating_point() and param.is_floating_point() and value.dtype != param.dtype:
        raise TypeError(f"{who}: {what} have dtype {value.dtype}, the module's parameters "
                        f"{param.dtype}: convert the data (.to({param.dtype})) or the module "
                        f"(module.to({value.dtype}))")


def _write_atomically(path: pathlib.Path, write: Callable[[Any], None], binary: bool) -> None:
    """write(file) into path.tmp, fsync, then rename over path: a reader never sees a partial
    file, and a kill -9 leaves either the old or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb" if binary else "w") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check_writable(path: pathlib.Path, what: str) -> None:
    folder = path.parent if path.parent != pathlib.Path("") else pathlib.Path(".")
    probe = path.with_name(path.name + ".probe")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"0")
        os.remove(probe)
    except OSError as error:
        raise PipeFillError(Result.IO, f"{what} {os.fspath(path)!r} cannot be written: {error}") from None


def _skip_counting(iterator: Iterator[Any], count: int) -> int:
    """Skips up to count elements; returns how many there were."""
    for skipped in range(count):
        if next(iterator, _END) is _END:
            return skipped
    return count


_END = object()


def _length_of(batches: Any) -> Optional[int]:
    """len(batches), or None when it has none."""
    if not hasattr(batches, "__len__"):
        return None
    try:
        return len(batches)
    except TypeError:
        return None


def _skip(iterator: Iterator[Any], count: int) -> Iterator[Any]:
    for _ in range(count):
        try:
            next(iterator)
        except StopIteration:
            break
    return iterator


def _input_of(sample: Any) -> Any:
    """x of an ``(x, y, ...)`` sample or batch (a tuple or list whose first element is a tensor
    or an array); anything else as it is."""
    if isinstance(sample, (tuple, list)) and sample and (
            isinstance(sample[0], torch.Tensor) or hasattr(sample[0], "__array__")):
        return sample[0]
    return sample


# ---- the item job both helpers run on -----------------------------------------------------

GIL_SWITCH_INTERVAL_S = 0.0002
"""Python's GIL switch interval while a streaming job of the host or simulated backend lives
(issue 32). With the default 5 ms, a thread that asks for the GIL while the fill threads (the
item, the feeder, the drainer) pass it among themselves waits up to 5 ms: the trainer's thread,
back from each bubble instruction, lost up to 5 ms per step (a 4 ms bubble measured 8.9 ms). At
0.2 ms it waits at most that. A lower interval the process set itself is kept."""

_SWITCH_LOCK = threading.Lock()
_SWITCH_HOLDERS = 0
_SWITCH_SAVED: Optional[float] = None


def _hold_switch_interval() -> None:
    """A host/sim streaming job starts: the switch interval goes down to GIL_SWITCH_INTERVAL_S
    (once for all such jobs; the process's own value is put back when the last one closes)."""
    global _SWITCH_HOLDERS, _SWITCH_SAVED
    with _SWITCH_LOCK:
        if _SWITCH_HOLDERS == 0:
            _SWITCH_SAVED = sys.getswitchinterval()
            if _SWITCH_SAVED > GIL_SWITCH_INTERVAL_S:
                sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        _SWITCH_HOLDERS += 1


def _release_switch_interval() -> None:
    global _SWITCH_HOLDERS, _SWITCH_SAVED
    with _SWITCH_LOCK:
        _SWITCH_HOLDERS -= 1
        if _SWITCH_HOLDERS == 0 and _SWITCH_SAVED is not None:
            if sys.getswitchinterval() == GIL_SWITCH_INTERVAL_S:  # nobody changed it since
                sys.setswitchinterval(_SWITCH_SAVED)
            _SWITCH_SAVED = None


_FILL_THREAD = threading.local()


def _in_fill_thread(fn: Callable[..., None]) -> Callable[..., None]:
    """An item function that first gives the thread running it (the host device's fill and SM
    threads, the simulated world's thread) the process's torch intra-op thread count, once per
    thread: OpenMP keeps that count per thread, and a thread the process did not start has
    OpenMP's default (the core count) until torch initialises it, so a fill thread's matmul ran
    a team of every core whose idle member spun at the barrier against the trainer: trainer step
    1.2-1.4x, single 67 us matmuls taking 20-30 ms, 6-11 ms of them on the CPU (issue 32).
    ``torch.set_num_threads(torch.get_num_threads())`` changes nothing for any other thread."""
    def item(*args: Any) -> None:
        if not getattr(_FILL_THREAD, "torch_threads_set", False):
            torch.set_num_threads(torch.get_num_threads())
            _FILL_THREAD.torch_threads_set = True
        fn(*args)
    return item


def _create_item_job(runtime: Runtime, name: str, items: int, item_cost_us: float,
                     fn: Callable[[int], None], available: int, priority: int,
                     fixed_cost: bool = False) -> Any:
    """The native item job. ``fixed_cost``: the caller gave ``item_cost_us`` explicitly, so the
    planner keeps it instead of learning it from the slices (items inside bubbles run slower
    than alone on a shared CPU; a learned cost above the bubbles starved such jobs, issue 32)."""
    native = runtime._native.create_item_job(name, priority, items, max(1.0, item_cost_us),
                                             _in_fill_thread(fn), available, fixed_cost)
    return Job(runtime, None, native)


def _measure_us(call: Callable[[], Any], runs: int = 5) -> float:
    """The fastest of ``runs`` calls: a loaded machine only adds time to a call (preemption), so
    the minimum is the closest to the item's own cost (a median of 3 came out 40 ms for a 1.5 ms
    item on a busy rank, and the job never fitted a bubble, issue 25)."""
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e6)
    return min(samples)


class _StreamingJob:
    """What both helpers share: the native item job, the failure path and the wait."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._error: Optional[str] = None
        self._finished = False
        self._started = time.monotonic()
        self._closing = False
        self._holds_interval = False
        self.job: Any = None
        self._completions: "collections.deque[float]" = collections.deque(
            maxlen=RATE_WINDOW_ITEMS)  # monotonic times of the latest item completions

    def _completed_one(self) -> None:
        """An item completed (call with self._cv held)."""
        self._completions.append(time.monotonic())

    def _recent_rate(self) -> float:
        """Items per second over the last RATE_WINDOW_S seconds (since the start when it is
        younger; over the kept completions when RATE_WINDOW_ITEMS came faster)."""
        now = time.monotonic()
        with self._cv:
            times = self._completions
            while times and times[0] < now - RATE_WINDOW_S:
                times.popleft()
            if not times:
                return 0.0
            span = now - max(self._started, now - RATE_WINDOW_S)
            if len(times) == times.maxlen:
                span = now - times[0]
            return len(times) / max(span, 1e-9)

    def _hold_gil_interval(self) -> None:
        """Called once the job's native item job (host/sim) exists: see GIL_SWITCH_INTERVAL_S."""
        if not self._holds_interval:
            self._holds_interval = True
            _hold_switch_interval()

    def _finished_or_closed(self) -> bool:
        return self._finished or self._closing or self._error is not None

    def _fail(self, message: str) -> None:
        with self._cv:
            if self._error is None:
                self._error = message
            self._cv.notify_all()
        if self.job is not None:
            self.job._fail(message)  # the job reads FAILED everywhere (info, stats, wait)

    def _check_item_error(self) -> None:
        if self.job is None or self._error is not None:
            return
        error = self.job._native.item_error()
        if error is not None:
            self._fail(f"job '{self.job.name}': {error}")

    @property
    def error(self) -> Optional[str]:
        """Why the job ended itself (None: it did not)."""
        self._check_item_error()
        return self._error

    def _wait_finished(self, timeout: Optional[float], asked: Optional[float] = None) -> None:
        # asked: the caller's whole timeout, for the message (timeout may be what is left of it)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._check_item_error()
            with self._cv:
                if self._finished or self._error is not None:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise PipeFillError(Result.TIMEOUT, f"job '{self.job.name}' did not finish "
                                        f"within {timeout if asked is None else asked} s")
                self._cv.wait(0.05 if left is None else min(0.05, left))
        if self._error is not None:
            raise FillJobError(self._error)

    def _wait(self, timeout: Optional[float], asked: Optional[float] = None) -> Progress:
        started = time.monotonic()
        self._wait_finished(timeout, asked)
        if self.job is not None:
            # The last slice's completion reaches the job when its bubble is harvested.
            self.job.runtime.synchronize()
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
            self.job.wait(left)
        return self.progress()  # type: ignore[attr-defined]

    def close(self) -> None:
        """Destroys the job (cancels it first); the feeder and drainer stop. Idempotent."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self.job is not None:
            self.job.close()
            self.job._native.release_item_fn()
        if self._holds_interval:
            self._holds_interval = False
            _release_switch_interval()
        for thread in (getattr(self, "_feeder", None), getattr(self, "_drainer", None)):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=10.0)

    def __enter__(self) -> "_StreamingJob":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
