"""pipefill.torch._streaming: fill jobs that carry real work, streamed through a model in the bubbles.

- :func:`inference_job`: a dataset (any iterable, a ``torch.utils.data.DataLoader``) through a
  module, one batch per item. A feeder thread stages batches into a ring of ``slots`` input
  buffers ahead of the claims and raises the job's available bound (``pfJobSetAvailable``) as
  it goes; each item runs the module on one slot; a drainer thread hands each output, in item
  order, to a sink (a callable, a folder of ``.npy`` files, or a numpy memmap) and frees the slot.
  Memory is bounded by the ring whatever the dataset's size. ``resume=`` keeps a progress file
  (the durable point) so that a restarted trainer goes on where the last attempt stopped.
- :func:`training_job` (pipefill/torch/_training.py): one optimizer step per item, with atomic
  checkpoints (model, optimizer, data position, RNG) every ``every`` steps, copied at the
  trainer's ``iteration_end`` (outside bubbles) and written by a background thread; ``resume=``
  from the last one.

On the simulated and the real-time host backend the items are Python calls
(``Runtime.create_item_job``: a graph fill job whose item calls the module eagerly on the host
device's fill worker thread, the trainer thread being blocked in its receive; on the simulated
backend at the item's virtual completion). On CUDA (pipefill/torch/_cuda_ring.py) each item is
one replay of a captured CUDA graph over a ring of device slots (slot ``index % slots``), gated
by the runtime like every graph fill job; the feeder copies batches into the ring on a stream of
its own and raises the available bound only once a copy is done, and never beyond the items
drained plus ``slots``. The CUDA path has not been run on a GPU yet (no GPU where it was
written): its slot and bound logic is tested on CPU with torch's capture mocked
(tests/python/test_cuda_streaming_jobs.py), the GPU test is python/examples/cuda_streaming_check.py
in scripts/gpu-check.sh.

A job's failure (a batch of another shape, a sink that raises, a module that raises) ends the
job - cancelled, with the reason kept and raised by ``wait()`` - never the trainer.
"""
from __future__ import annotations

import collections
import itertools
import json
import os
import pathlib
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, List, Optional, Union

import torch

from .._enums import Backend, Result
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


# ---- sinks --------------------------------------------------------------------------------

_FOLDERS_IN_USE: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
"""Resolved sink folder -> the live job writing it (in this process)."""
_FOLDERS_LOCK = threading.Lock()


class _FolderSink:
    """One ``<index>.npy`` per item (12 digits, so that a sorted listing is item order), each
    written atomically: rewriting an item after a resume replaces it, so the folder holds each
    item exactly once. A module that returns a dict, tuple or list: ``<index>.npz`` with one
    array per key (``"0"``, ``"1"``, ... for a tuple). The folder belongs to one job: while
    another job of this process that has not finished writes it, it is refused (the folder holds
    nothing but the items' files, so other processes' jobs are not seen)."""

    def __init__(self, folder: PathLike, job: Any) -> None:
        self.folder = pathlib.Path(folder)
        _check_writable(self.folder / "sink", "sink folder")
        key = os.path.realpath(self.folder)
        with _FOLDERS_LOCK:
            other = _FOLDERS_IN_USE.get(key)
            if other is not None and other is not job and not other._finished_or_closed():
                raise ValueError(f"inference_job: sink folder {os.fspath(folder)!r} is already "
                                 f"written by job {other.name!r} (live in this process): give "
                                 "each job a folder of its own")
            _FOLDERS_IN_USE[key] = job

    def __call__(self, index: int, output: Any) -> None:
        import numpy as np
        if isinstance(output, torch.Tensor):
            array = output.detach().cpu().numpy()
            _write_atomically(self.folder / f"{index:012d}.npy", lambda f: np.save(f, array),
                              True)
            return
        arrays = _named_arrays(index, output)
        _write_atomically(self.folder / f"{index:012d}.npz", lambda f: np.savez(f, **arrays),
                          True)


def _named_arrays(index: int, output: Any) -> dict:
    items = output.items() if isinstance(output, dict) else enumerate(output) \
        if isinstance(output, (tuple, list)) else None
    if items is None:
        raise TypeError(f"item {index}: the module returned {_describe(output)}; a folder sink "
                        "writes a tensor, or a dict / tuple / list of tensors")
    return {str(k): torch.as_tensor(v).detach().cpu().numpy() for k, v in items}


class _MemmapSink:
    """Rows of a numpy memmap: item i's output goes to rows [i*batch_size, i*batch_size + n)."""

    def __init__(self, memmap: Any, batch_size: int) -> None:
        self.memmap = memmap
        self.batch_size = batch_size

    def __call__(self, index: int, output: "torch.Tensor") -> None:
        array = output.detach().cpu().numpy()
        first = index * self.batch_size
        if first + array.shape[0] > self.memmap.shape[0] or array.shape[1:] != self.memmap.shape[1:]:
            raise ValueError(f"item {index}: output of shape {tuple(array.shape)} does not fit the "
                             f"memmap of shape {tuple(self.memmap.shape)} at row {first}")
        self.memmap[first:first + array.shape[0]] = array
        self.memmap.flush()  # durable before the progress file says so


def _make_sink(sink: Any, batch_size: int, job: Any,
               output: Any = None) -> Callable[[int, "torch.Tensor"], None]:
    """The sink; ``output``: what the module returned for the first batch (checked against it)."""
    try:
        import numpy as np
        if isinstance(sink, np.memmap):
            if output is not None and not isinstance(output, torch.Tensor):
                raise TypeError(f"inference_job: sink is a numpy memmap, which holds one tensor "
                                f"per item, but the module returns {_describe(output)}: use a "
                                "folder or a callable sink")
            return _MemmapSink(sink, batch_size)
    except ImportError:  # pragma: no cover - numpy comes with torch
        pass
    if isinstance(sink, (str, os.PathLike)):
        return _FolderSink(sink, job)
    if callable(sink):
        return sink
    raise TypeError(f"sink {sink!r} is neither a callable, a folder path nor a numpy memmap")


# ---- the item job both helpers run on -----------------------------------------------------

def _create_item_job(runtime: Runtime, name: str, items: int, item_cost_us: float,
                     fn: Callable[[int], None], available: int, priority: int) -> Any:
    native = runtime._native.create_item_job(name, priority, items, max(1.0, item_cost_us), fn,
                                             available)
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
        for thread in (getattr(self, "_feeder", None), getattr(self, "_drainer", None)):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=10.0)

    def __enter__(self) -> "_StreamingJob":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- inference ----------------------------------------------------------------------------

class InferenceJob(_StreamingJob):
    """Made by :func:`inference_job`: the native job (``.job``), progress, wait, close."""

    def __init__(self, runtime: Runtime, module: "torch.nn.Module", data: Iterable[Any], *,
                 batch_size: Optional[int], sink: Any, slots: int, resume: Optional[PathLike],
                 start: int, items: Optional[int], name: str, priority: int,
                 item_cost_us: Optional[float]) -> None:
        super().__init__()
        if slots < 2:
            raise ValueError(f"inference_job: slots = {slots} (at least 2: one item runs while "
                             "the next is staged)")
        if start < 0:
            raise ValueError(f"inference_job: start = {start} (must be >= 0)")
        if items is not None and items <= 0:
            raise ValueError(f"inference_job: items = {items} (must be > 0 or None)")
        if getattr(module, "training", False):
            warnings.warn(f"inference_job '{name}': the module is in training mode "
                          "(module.training is True), so dropout and batch norm run as in "
                          "training; call module.eval() first", RuntimeWarning, stacklevel=3)
        self.module = module
        self.name = name
        self.slots = slots
        self._batches = self._batched(data, batch_size)
        self.start = start
        self.end = None if items is None else start + items
        length = _length_of(self._batches)
        if length is not None:  # the range must lie in the data: never silently truncated
            if start >= length:
                raise ValueError(f"inference_job: start = {start} is past the end of data "
                                 f"({length} batches: start must be < {length})")
            if self.end is not None and self.end > length:
                raise ValueError(f"inference_job: items = {items} from start = {start} goes "
                                 f"past the end of data ({length} batches: at most "
                                 f"{length - start} items from start {start})")
        self._resume = pathlib.Path(resume) if resume is not None else None
        self.next_item = self._read_resume() if self._resume is not None else start
        self.resumed_from = self.next_item
        if self._resume is not None:
            _check_writable(self._resume, "resume file")

        iterator = iter(self._batches)
        skipped = _skip_counting(iterator, self.next_item)
        first = next(iterator, None) if skipped == self.next_item else None
        remaining = None if self.end is None else self.end - self.next_item
        if first is None and self.next_item == self.start:  # data of unknown length
            raise ValueError(f"inference_job: start = {start} is past the end of data (it "
                             f"yields {skipped} batches)")
        if first is None and remaining is not None and remaining > 0:
            raise ValueError(f"inference_job: items = {items} from start = {start}, but data "
                             f"yields {skipped} batches (the job is at item {self.next_item})")
        if first is None or (remaining is not None and remaining <= 0):
            # Nothing left (a resumed job that had finished, or an empty range): no native job.
            self._finished = True
            self.sample_shape = None
            self._total, self._drained = 0, 0
            return
        first = self._as_batch(first, 0)
        self.sample_shape = tuple(first.shape[1:])
        self.dtype = first.dtype
        self.batch_size = batch_size if batch_size is not None else first.shape[0]
        host = runtime.backend != Backend.CUDA
        _check_fits_module(f"inference_job '{name}': data", "batches", module, first,
                           device=host)
        output = self._probe(first) if host else None
        self.sink = _make_sink(sink, self.batch_size, self, output)
        self._rows = [0] * slots
        self._staged = 0   # items staged (the available bound), this attempt
        self._ran = 0      # items run
        self._drained = 0  # items handed to the sink
        length = None
        if hasattr(self._batches, "__len__"):
            try:
                length = len(self._batches) - self.next_item  # type: ignore[arg-type]
            except TypeError:
                length = None
        count = remaining if remaining is not None else length
        if count is not None and remaining is not None and length is not None:
            count = min(remaining, length)
        self._limit = count if count else None  # items this attempt stages at most
        self._total: Optional[int] = self._limit  # the feeder sets it when the input ends
        self.job = self._make_job(runtime, first, count if count else UNBOUNDED_ITEMS,
                                  item_cost_us, priority)
        self._feeder = threading.Thread(target=self._feed, args=(first, iterator),
                                        name=f"pipefill-feed-{name}", daemon=True)
        self._drainer = threading.Thread(target=self._drain, name=f"pipefill-drain-{name}",
                                         daemon=True)
        self._feeder.start()
        self._drainer.start()

    def _probe(self, first: "torch.Tensor") -> Any:
        """The module on the first batch at creation (outside any bubble): a module that does
        not take the data fails here, naming the batch, not in every item."""
        try:
            with torch.no_grad():
                return self.module(first)
        except Exception as error:
            raise ValueError(f"inference_job '{self.name}': the module failed on the first batch "
                             f"of data ({_describe(first)}): {type(error).__name__}: "
                             f"{error}") from None

    # -- input --
    @staticmethod
    def _batched(data: Iterable[Any], batch_size: Optional[int]) -> Iterable[Any]:
        loader = getattr(torch.utils.data, "DataLoader", None)
        if loader is not None and isinstance(data, loader):
            if batch_size is not None and data.batch_size not in (None, batch_size):
                raise ValueError(f"inference_job: batch_size = {batch_size} but the DataLoader's "
                                 f"batch_size is {data.batch_size}")
            return data
        if batch_size is None:
            return data  # batches already
        if batch_size <= 0:
            raise ValueError(f"inference_job: batch_size = {batch_size} (must be > 0)")

        class _Batches:
            def __iter__(self_inner) -> Iterator[Any]:
                iterator = iter(data)
                for item in itertools.count():
                    chunk = [torch.as_tensor(_input_of(c))
                             for c in itertools.islice(iterator, batch_size)]
                    if not chunk:
                        return
                    for j, sample in enumerate(chunk):
                        if sample.shape != chunk[0].shape:
                            raise ValueError(
                                f"item {item}: sample {item * batch_size + j} of the dataset has "
                                f"shape {tuple(sample.shape)}; sample {item * batch_size} has "
                                f"shape {tuple(chunk[0].shape)}")
                    yield torch.stack(chunk)

            def __len__(self_inner) -> int:
                return -(-len(data) // batch_size)  # type: ignore[arg-type]

        return _Batches()

    def _as_batch(self, batch: Any, item: int) -> "torch.Tensor":
        tensor = torch.as_tensor(_input_of(batch))  # (inputs, labels): the inputs
        if tensor.dim() == 0:
            raise ValueError(f"item {self.next_item + item}: a batch must have a batch dimension, "
                             f"got a scalar")
        return tensor

    def _feed(self, first: "torch.Tensor", iterator: Iterator[Any]) -> None:
        try:
            k = 0
            batch: Any = first
            while True:
                if self._limit is not None and k >= self._limit:
                    break
                if k > 0:
                    batch = next(iterator, None)
                    if batch is None:
                        break
                    batch = self._as_batch(batch, k)
                index = self.next_item + k
                if tuple(batch.shape[1:]) != self.sample_shape or batch.dtype != self.dtype:
                    raise ValueError(f"item {index}: the dataset yielded a batch of shape "
                                     f"{tuple(batch.shape)} and dtype {batch.dtype}; the first "
                                     f"batch had samples of shape {self.sample_shape} and dtype "
                                     f"{self.dtype}")
                if batch.shape[0] > self.batch_size or batch.shape[0] == 0:
                    raise ValueError(f"item {index}: a batch of {batch.shape[0]} rows (batch_size "
                                     f"is {self.batch_size})")
                slot = k % self.slots
                with self._cv:  # the slot is free once the item `slots` earlier was drained
                    while k - self._drained >= self.slots and not self._stopping():
                        self._cv.wait(0.1)
                    if self._stopping():
                        return
                self._stage(slot, batch)
                self._rows[slot] = batch.shape[0]
                with self._cv:
                    self._staged = k + 1
                self.job._native.set_available(k + 1)
                k += 1
            if self.end is not None and self._limit is not None and k < self._limit:
                raise ValueError(f"items = {self.end - self.start} from start = {self.start}, "
                                 f"but the data ended at item {self.next_item + k}")
            with self._cv:
                self._total = k
                self._cv.notify_all()
            # The job was made with `_limit` items when the count was known: staging them all
            # ends it on its own, and it may have completed already (pfJobEndInput would then be
            # refused). Only an input of unknown length, or one shorter than its len(), ends here.
            if k > 0 and (self._limit is None or k < self._limit):
                self.job._native.end_input()
        except Exception as error:  # the job ends itself, never the trainer
            if not self._stopping():
                self._fail(f"job '{self.name}': feeder: {type(error).__name__}: {error}")

    def _stopping(self) -> bool:
        return self._error is not None or self._closing

    # -- the backend's part (pipefill.torch._cuda_ring.CudaInferenceJob overrides these) --
    _poll_s = 0.05  # the drainer's wait between looks (run items notify it on this path)

    def _make_job(self, runtime: Runtime, first: "torch.Tensor", items: int,
                  item_cost_us: Optional[float], priority: int) -> Any:
        """The slots and the native job: an item job whose items run the module eagerly."""
        self._in = [torch.empty((self.batch_size,) + self.sample_shape, dtype=self.dtype)
                    for _ in range(self.slots)]
        self._out: List[Optional[torch.Tensor]] = [None] * self.slots
        with torch.no_grad():
            cost = item_cost_us if item_cost_us is not None else _measure_us(
                lambda: self.module(first))
        self.item_cost_us = float(cost)
        return _create_item_job(runtime, self.name, items, self.item_cost_us, self._run_item, 0,
                                priority)

    def _stage(self, slot: int, batch: "torch.Tensor") -> None:
        """Feeder thread: the batch into the slot's input buffer (the slot is free)."""
        self._in[slot][:batch.shape[0]].copy_(batch)

    def _items_done(self) -> int:
        """Items of this attempt whose output is ready, in order (a prefix)."""
        with self._cv:
            return self._ran

    def _take_output(self, k: int, slot: int) -> "torch.Tensor":
        """Drainer thread: item k's output (it is done), which the slot then no longer holds."""
        with self._cv:
            output, self._out[slot] = self._out[slot], None
        return output

    # -- items (the device's worker thread, with the GIL) --
    def _run_item(self, k: int) -> None:
        slot = k % self.slots
        with torch.no_grad():
            output = self.module(self._in[slot][:self._rows[slot]])
        with self._cv:
            self._out[slot] = output
            self._ran = k + 1
            self._cv.notify_all()

    # -- output --
    def _drain(self) -> None:
        k = 0
        try:
            while True:
                while True:  # an item that raised reports it natively: look every _poll_s
                    self._check_item_error()
                    done = self._items_done()
                    with self._cv:
                        if done > k or self._stopping() or (
                                self._total is not None and k >= self._total):
                            break
                        self._cv.wait(self._poll_s)
                with self._cv:
                    if self._stopping():
                        return
                    if self._total is not None and k >= self._total:
                        break
                slot = k % self.slots
                output = self._take_output(k, slot)
                index = self.next_item + k
                try:
                    self.sink(index, output)
                except Exception as error:
                    raise FillJobError(f"job '{self.name}': the sink raised on item {index}: "
                                       f"{type(error).__name__}: {error}") from None
                if self._resume is not None:
                    self._write_resume(index + 1)
                with self._cv:
                    self._drained = k + 1
                    self._completed_one()
                    self._cv.notify_all()
                k += 1
            with self._cv:
                self._finished = True
                self._cv.notify_all()
        except Exception as error:
            self._fail(error.message if isinstance(error, FillJobError)
                       else f"job '{self.name}': drainer: {type(error).__name__}: {error}")

    # -- resume --
    def _identity(self) -> dict:
        return {"kind": "pipefill.inference_job", "name": self.name, "start": self.start,
                "end": self.end}

    def _read_resume(self) -> int:
        assert self._resume is not None
        if not self._resume.exists():
            return self.start
        try:
            state = json.loads(self._resume.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"resume file {os.fspath(self._resume)!r} is not a progress file of "
                             f"inference_job: {error}") from None
        for key, value in self._identity().items():
            if state.get(key) != value:
                raise ValueError(f"resume file {os.fspath(self._resume)!r} belongs to another job: "
                                 f"its {key} is {state.get(key)!r}, this job's is {value!r}")
        return int(state["next"])

    def _write_resume(self, next_item: int) -> None:
        assert self._resume is not None
        state = dict(self._identity(), next=next_item)
        _write_atomically(self._resume, lambda f: json.dump(state, f), False)

    # -- public --
    def progress(self) -> Progress:
        with self._cv:
            done = self._drained if self.job is not None else 0
            total = self._total
            finished = self._finished
        rate = self._recent_rate()
        eta = None if total is None or rate <= 0 else (total - done) / rate
        all_total = None if total is None else self.resumed_from - self.start + total
        return Progress(self.resumed_from - self.start + done, all_total, rate, eta, finished)

    def wait(self, timeout: Optional[float] = None) -> Progress:
        """Waits until every item reached the sink (then for the runtime's completion of the
        job); raises FillJobError with the reason when the job ended itself and
        PipeFillError(TIMEOUT) when ``timeout`` seconds passed. The job only advances while
        the trainer runs bubbles."""
        return self._wait(timeout)
