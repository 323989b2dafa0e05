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

import itertools
import json
import os
import pathlib
import threading
import warnings
from typing import Any, Iterable, Iterator, List, Optional

import torch

from .._enums import Backend
from .._runtime import Runtime
from ._job_common import (UNBOUNDED_ITEMS, FillJobError, PathLike, Progress, _StreamingJob,
                          _check_fits_module, _check_writable, _create_item_job, _describe,
                          _input_of, _length_of, _measure_us, _skip_counting,
                          _write_atomically)
from ._sinks import _make_sink

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
                    chunk = list(itertools.islice(iterator, batch_size))
                    if not chunk:
                        return
                    if all(type(c) is torch.Tensor for c in chunk):
                        # Samples that are tensors: one stack (its own shape check), not a
                        # conversion and a comparison per sample (33 of the 86 us a 32-sample
                        # batch took to stage, issue 32).
                        try:
                            stacked = torch.stack(chunk)
                        except RuntimeError:
                            stacked = None  # shapes differ: the message below names the sample
                        if stacked is not None:
                            yield stacked
                            continue
                    chunk = [torch.as_tensor(_input_of(c)) for c in chunk]
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
        """Stages batches into free slots and raises the available bound in batches, not per
        item (each raise takes the runtime's lock): when the ring is full, every quarter ring,
        and whenever the items run have nearly caught up with the bound (the job would go dry)."""
        try:
            k = 0
            published = 0
            publish_every = max(1, self.slots // 4)
            batch: Any = first
            while True:
                if self._limit is not None and k >= self._limit:
                    break
                if k > 0:
                    published = self._await_fill_window(k, published)
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
                if k - self._drained >= self.slots:  # the ring is full: publish, then wait
                    if published < k:
                        self._publish(k)
                        published = k
                    with self._cv:  # the slot is free once the item `slots` earlier was drained
                        while k - self._drained >= self.slots and not self._stopping():
                            self._cv.wait(0.1)
                if self._stopping():
                    return
                self._stage(slot, batch)
                self._rows[slot] = batch.shape[0]
                k += 1
                if k - published >= publish_every or published - self._items_done() < 2:
                    self._publish(k)
                    published = k
            if published < k:
                self._publish(k)
            if self.end is not None and self._limit is not None and k < self._limit:
                raise ValueError(f"items = {self.end - self.start} from start = {self.start}, "
                                 f"but the data ended at item {self.next_item + k}")
            self._input_ended(k)
        except Exception as error:  # the job ends itself, never the trainer
            if not self._stopping():
                self._fail(f"job '{self.name}': feeder: {type(error).__name__}: {error}")

    def _window_backlog(self) -> int:
        """Staged items not yet run below which the feeder stages, and the drainer drains,
        outside the fill window too: half the ring (a quarter left 15,625-16,393 items/s, the
        slices erratic after a bubble that emptied the ring). A slice takes only the items staged
        when it is planned, so a backlog that shrank to a few items made short slices, short
        windows, little staged in them, and shorter slices still: trivial items ran 0-5 per
        20 ms bubble (item_path_ceiling.py: 4,098-9,615 items/s, against 28,571 with the window
        off; 25,641-27,027 with this mark). Above it both wait for the window, as before (a job
        whose bubbles take ~26 items of a 64-item ring, streaming_bench's, keeps its backlog
        above the mark as long as its feeder refills inside the windows)."""
        return max(1, self.slots // 2)

    def _await_fill_window(self, k: int, published: int) -> int:
        """Feeder thread, host backend: waits, GIL released, for the fill window (a fill slice in
        progress: the trainer is in a bubble) before staging item k, while at least half a
        ring of staged items has not run (_window_backlog; a job gone dry stages at once: its
        next slice opens the window). The ring's first fill is staged at once: a slice takes the
        items staged when its bubble begins, so a ring staged only inside windows would start
        every bubble nearly empty. Returns the items published (all staged ones, before it
        waits)."""
        window = self._window
        if window is None or k < self.slots:  # the ring's first fill: at once
            return published
        while (not window.fill_window_open() and k - self._items_done() >= self._window_backlog()
               and not self._stopping()):
            if published < k:
                self._publish(k)
                published = k
            window.wait_fill_window(self._window_wait_s)
        return published

    def _outside_fill_window(self, ran: int) -> bool:
        """Drainer thread, host backend: the window is closed and at least half a ring of
        staged items remains to run (_window_backlog; a window will come): the sink waits for
        it. Below that the drainer drains at once (the feeder needs those slots to stage the
        next slice's items, and with every staged item run no slice would open the window)."""
        window = self._window
        if window is None or window.fill_window_open():
            return False
        with self._cv:
            staged = self._staged
        return staged - ran >= self._window_backlog() and not self._stopping()

    def _input_ended(self, k: int) -> None:
        """Feeder thread: the input ended after ``k`` items of this attempt (all published)."""
        with self._cv:
            self._total = k
            self._cv.notify_all()
        # The job was made with `_limit` items when the count was known: staging them all
        # ends it on its own, and it may have completed already (pfJobEndInput would then be
        # refused). Only an input of unknown length, or one shorter than its len(), ends here.
        if k > 0 and (self._limit is None or k < self._limit):
            self.job._native.end_input()

    def _publish(self, staged: int) -> None:
        """Items [0, staged) of this attempt are staged: the bound goes up to them."""
        with self._cv:
            self._staged = staged
        self.job._native.set_available(staged)

    def _stopping(self) -> bool:
        return self._error is not None or self._closing

    # -- the backend's part (pipefill.torch._cuda_ring.CudaInferenceJob overrides these) --
    _poll_s = 0.05  # the drainer's wait between looks where items are not counted natively
    _drain_wait_s = 0.01  # host/sim: the drainer's longest sleep while fewer items ran
    _drain_batch = 4  # host/sim: items the drainer sleeps for (fewer when the ring is smaller)
    _window = None  # host backend: the runtime's native object, for the fill window
    _window_wait_s = 0.05  # the feeder's and drainer's longest sleep waiting for the window

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
        job = _create_item_job(runtime, self.name, items, self.item_cost_us, self._run_item, 0,
                               priority, fixed_cost=item_cost_us is not None)
        self._hold_gil_interval()
        if runtime.backend == Backend.HOST and os.environ.get("PIPEFILL_FILL_WINDOW", "1") != "0":
            # The feeder and drainer run the user's Python (dataset, sink) only while a fill
            # slice is in progress: outside the bubbles they would hold the GIL that every
            # Python-level op of the trainer needs (issue 32: trainer step 1.41x).
            self._window = runtime._native
        return job

    def _stage(self, slot: int, batch: "torch.Tensor") -> None:
        """Feeder thread: the batch into the slot's input buffer (the slot is free)."""
        self._in[slot][:batch.shape[0]].copy_(batch)

    def _items_done(self) -> int:
        """Items of this attempt whose output is ready, in order (a prefix): on this path the
        item record counts them natively (one atomic load)."""
        return self.job._native.items_run()

    def _wait_items(self, target: int) -> int:
        """Drainer thread: sleeps until ``target`` items are done or a while passed; returns the
        items done. Host/sim: in the item record with the GIL released, woken by the item that
        reaches the target (not by every item); a backend that overrides _items_done polls."""
        if type(self)._items_done is InferenceJob._items_done:
            return self.job._native.wait_items_run(target, self._drain_wait_s)
        with self._cv:
            self._cv.wait(self._poll_s)
        return self._items_done()

    def _take_output(self, k: int, slot: int) -> "torch.Tensor":
        """Drainer thread: item k's output (it is done), which the slot then no longer holds."""
        output, self._out[slot] = self._out[slot], None
        return output

    # -- items (the device's worker thread, with the GIL) --
    def _run_item(self, k: int) -> None:
        """One item: nothing but the module on the slot (the item record counts it and wakes
        the drainer when it waits for this one; no Python lock or notify per item)."""
        slot = k % self.slots
        with torch.no_grad():
            self._out[slot] = self.module(self._in[slot][:self._rows[slot]])

    # -- output --
    def _drain(self) -> None:
        """Hands outputs to the sink in item order, a run of items per wake-up: it sleeps until
        half the ring ran (or the staged items, or _drain_wait_s), then drains all done ones and
        wakes the feeder once."""
        k = 0
        half = max(1, min(self.slots // 2, self._drain_batch))
        try:
            while True:
                self._check_item_error()
                with self._cv:
                    if self._stopping():
                        return
                    if self._total is not None and k >= self._total:
                        break
                    staged = self._staged
                done = self._items_done()
                if done <= k:
                    target = max(k + 1, min(k + half, staged))
                    done = self._wait_items(target)
                    if done <= k:
                        continue
                if self._outside_fill_window(done):
                    self._window.wait_fill_window(self._window_wait_s)
                    continue
                j = k
                while j < done:  # stops early where the window closed (items wait for the next)
                    self._drain_one(j)
                    j += 1
                    if j < done and self._outside_fill_window(done):
                        break
                done = j
                with self._cv:
                    self._drained = done
                    for _ in range(done - k):
                        self._completed_one()
                    self._cv.notify_all()
                k = done
            with self._cv:
                self._finished = True
                self._cv.notify_all()
        except Exception as error:
            self._fail(error.message if isinstance(error, FillJobError)
                       else f"job '{self.name}': drainer: {type(error).__name__}: {error}")

    def _drain_one(self, k: int) -> None:
        output = self._take_output(k, k % self.slots)
        index = self.next_item + k
        try:
            self.sink(index, output)
        except Exception as error:
            raise FillJobError(f"job '{self.name}': the sink raised on item {index}: "
                               f"{type(error).__name__}: {error}") from None
        if self._resume is not None:
            self._write_resume(index + 1)

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
