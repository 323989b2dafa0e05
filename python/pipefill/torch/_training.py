"""pipefill.torch._training: ``training_job``, one optimizer step per fill item, with checkpoints
taken at the trainer's ``iteration_end`` (issue 18).

Checkpoints. A checkpoint is due every ``every`` steps and after the last one. The job's
available bound (pfJobSetAvailable) is held at the due step, so the job runs dry exactly there:
no item touches the model or the optimizer until the checkpoint's state has been copied. The
copy is taken at the trainer's next :meth:`pipefill.Runtime.iteration_end` (a hook of the
runtime: no bubble is open then, and since the job is dry no item is running, so the trainer
thread is held only for the copy - on CPU a clone of the state, on CUDA copies enqueued on a
stream of the job's own, never a device synchronisation). A background thread then writes the
file atomically (temporary file, fsync, rename) while the job runs on; on CUDA it first waits
for the copies and only then raises the bound again.

A trainer that never calls ``iteration_end`` still gets its checkpoints: when the runtime has seen
no ``iteration_end`` at all and FALLBACK_BUBBLES bubbles began since the job ran dry at a due
step, the background thread takes the copy itself (the job is dry, so the state is a step
boundary; a bubble may be open then), with a one-time RuntimeWarning saying why. ``wait()`` takes
a last checkpoint that is still due (it is never called inside a bubble).

Backends: on the simulated and host backends each step runs eagerly as a Python item on the
device's worker thread; on CUDA (pipefill.torch._cuda_ring.TrainingCapture) the whole step -
forward, loss, backward, ``optimizer.step()`` of a capturable optimizer - is one captured graph
over a ring of ``(inputs, target)`` slots, fed and drained by host threads like an inference
job's.
"""
from __future__ import annotations

import copy
import pathlib
import threading
import warnings
from typing import Any, Callable, Iterable, List, Optional

import torch

from .._enums import Backend, JobStatus
from .._errors import PipeFillError
from .._runtime import Job, Runtime
from ._job_common import (UNBOUNDED_ITEMS, FillJobError, PathLike, Progress, _StreamingJob,
                          _check_fits_module, _check_writable, _create_item_job, _describe,
                          _in_fill_thread, _measure_us)
from ._cuda_ring import TrainingCapture, check_capturable, check_full_batches, job_failure
from ._training_state import Snapshot, _Batches
from ._checkpoints import _Checkpoints
from ._micro_steps import MicroSteps, measure_micro_costs

DEFAULT_STEP_COST_US = 1000.0
"""The item cost assumed only when a step cannot be timed at creation (module not copyable)."""

def _check_host_optimizer(optimizer: Any, backend: Any) -> None:
    """Off CUDA: refuses an optimizer made with ``capturable=True`` over parameters off the GPU
    (torch's step would fail on every item), naming the group and the fix."""
    for i, group in enumerate(getattr(optimizer, "param_groups", None) or []):
        if group.get("capturable") and any(p.device.type != "cuda" for p in group["params"]):
            name = type(optimizer).__name__
            raise ValueError(f"training_job: optimizer {name} (param group {i}) has "
                             f"capturable=True, which torch supports only for GPU parameters, and "
                             f"the runtime's backend is {backend}: create it with capturable="
                             "(runtime.backend == pf.Backend.CUDA)")



class TrainingJob(_Checkpoints, _StreamingJob):
    """Made by :func:`training_job`: ``losses`` (resumed ones, then this attempt's),
    ``snapshots`` (a :class:`Snapshot` per checkpoint taken), progress, wait, close."""

    def __init__(self, runtime: Runtime, module: "torch.nn.Module", optimizer: Any,
                 loss_fn: Callable[..., "torch.Tensor"], data: Iterable[Any], *, steps: int,
                 checkpoint: Optional[PathLike], every: int, resume: Optional[PathLike],
                 name: str, priority: int, item_cost_us: Optional[float], slots: int,
                 micro_batches: int = 1) -> None:
        super().__init__()
        if steps <= 0:
            raise ValueError(f"training_job: steps = {steps} (must be > 0)")
        if every <= 0:
            raise ValueError(f"training_job: every = {every} (must be > 0)")
        if slots < 2:
            raise ValueError(f"training_job: slots = {slots} (at least 2: one step runs while "
                             "the next batch is staged)")
        if not isinstance(micro_batches, int) or micro_batches < 1:
            raise ValueError(f"training_job: micro_batches = {micro_batches!r} (an int >= 1)")
        self.runtime = runtime
        self.cuda = runtime.backend == Backend.CUDA
        if self.cuda and micro_batches > 1:
            raise ValueError(f"training_job: micro_batches = {micro_batches} runs on the simulated "
                             "and host backends only (on CUDA one item is one captured step)")
        self._micro = MicroSteps(self, micro_batches) if micro_batches > 1 else None
        if self.cuda:
            check_capturable(optimizer)  # before anything else: a refusal changes nothing
            check_full_batches(data)     # a partial batch would fail the captured step later
        else:
            _check_host_optimizer(optimizer, runtime.backend)
        self.module, self.optimizer, self.loss_fn = module, optimizer, loss_fn
        self.data, self.steps, self.every, self.name, self.slots = data, steps, every, name, slots
        self.checkpoint = pathlib.Path(checkpoint) if checkpoint is not None else None
        if self.checkpoint is not None:
            _check_writable(self.checkpoint, "checkpoint path")
        self.losses: List[float] = []
        self.snapshots: List[Snapshot] = []
        self.step = 0
        # CPU: the steps draw from an RNG stream of the job's own (torch's CPU RNG swapped in
        # around each step), so that the trainer's draws and the job's never interleave and a
        # checkpoint holds exactly the job's state at its step.
        self._rng = torch.get_rng_state()
        self._batches = _Batches(data, name)
        self._positions: dict = {}  # CUDA: due step -> data position before its batch was drawn
        if resume is not None:
            self._load(pathlib.Path(resume))
        self.resumed_from = self.step
        self._due = self._next_due(self.step)  # the step the available bound is held at
        self._snapped = self.step               # the last step whose state was copied
        self._pending: Optional[tuple] = None   # (step, state, event) for the writer
        self._dry_at_bubble = 0                 # runtime._bubble_index when the job ran dry
        self._warned_fallback = False
        self._drained = 0                       # CUDA: items whose loss was read
        if self.step >= steps:
            self._finished = True
            return
        items = steps - self.step
        bound = self._due - self.step if self.checkpoint is not None else UNBOUNDED_ITEMS
        if self.cuda:
            self._start_cuda(items, priority, item_cost_us)
        elif self._micro is not None:
            self._first = self._in_job_rng(lambda: next(self._batches))
            self._start_micro(items, priority, item_cost_us)
        else:
            self._first = self._in_job_rng(lambda: next(self._batches))
            self.item_cost_us = float(item_cost_us if item_cost_us is not None
                                      else self._measure_step(self._first))
            self.job = _create_item_job(runtime, name, items, self.item_cost_us,
                                        self._run_item, bound, priority,
                                        fixed_cost=item_cost_us is not None)
            self._hold_gil_interval()
        if self.checkpoint is not None:
            runtime._add_iteration_end_hook(self._on_iteration_end)
            self._writer = threading.Thread(target=self._write_loop, name=f"pipefill-ckpt-{name}",
                                            daemon=True)
            self._writer.start()

    # -- data and RNG --
    def _in_job_rng(self, fn: Callable[[], Any]) -> Any:
        """fn() with the job's RNG stream as torch's CPU RNG (CPU; on CUDA the global one)."""
        if self.cuda:
            return fn()
        outer = torch.get_rng_state()
        torch.set_rng_state(self._rng)
        try:
            return fn()
        finally:
            self._rng = torch.get_rng_state()
            torch.set_rng_state(outer)

    def _split(self, batch: Any, step: int) -> tuple:
        """(inputs, target) of a batch, or a ValueError naming what the batch is."""
        if isinstance(batch, (tuple, list)) and len(batch) == 2:
            return batch[0], batch[1]
        raise ValueError(f"training_job '{self.name}': data: step {step}'s batch is "
                         f"{_describe(batch)}; each batch must be an (inputs, target) pair "
                         "(loss_fn(module(inputs), target)): a dataset of (x, y) samples, or a "
                         "DataLoader over one")

    def _measure_step(self, batch: Any) -> float:
        """One step's time at creation (outside any bubble), on copies of the module and the
        optimizer and with the RNG put back, so the job's steps are unchanged: the fastest of 5
        steps after one warm-up (the optimizer's state is made at its first step). A batch that
        does not fit the module is refused here, naming it."""
        inputs, target = self._split(batch, self.step)
        for what, value in (("inputs", inputs),):
            _check_fits_module(f"training_job '{self.name}': data", what, self.module, value)
        try:
            module, optimizer = copy.deepcopy((self.module, self.optimizer))
        except Exception as error:  # a module that cannot be copied: the default, named
            warnings.warn(f"training_job '{self.name}': the module and optimizer cannot be "
                          f"copied to time a step ({type(error).__name__}: {error}); item_cost_us "
                          f"= {DEFAULT_STEP_COST_US:g} assumed: pass item_cost_us=",
                          RuntimeWarning, stacklevel=3)
            return DEFAULT_STEP_COST_US

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            loss = self.loss_fn(module(inputs), target)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ValueError(f"loss_fn returned {_describe(loss)}, not a one-element tensor")
            loss.backward()
            optimizer.step()

        with torch.random.fork_rng(devices=[]):
            try:
                step()  # warm-up
                return _measure_us(step)
            except Exception as error:
                raise ValueError(f"training_job '{self.name}': one step on the first batch "
                                 f"(inputs {_describe(inputs)}, target {_describe(target)}) "
                                 f"failed: {type(error).__name__}: {error}") from None

    # -- a step done (CPU: the worker thread; CUDA: the drainer) --
    def _stepped(self, loss: float) -> None:
        with self._cv:
            self.losses.append(loss)
            self.step += 1
            self._completed_one()
            if self.step == self._due:
                self._dry_at_bubble = self.runtime._bubble_index
            if self.step == self.steps and self.checkpoint is None:
                self._finished = True
            self._cv.notify_all()

    def _run_item(self, k: int) -> None:
        loss = self._in_job_rng(lambda: self._step(k))
        self._stepped(loss)  # after the RNG stream is saved: a snapshot may follow at once

    def _next_batch(self) -> Any:
        """The next step's batch (the first one was drawn at creation)."""
        if self._first is not None:
            batch, self._first = self._first, None
            return batch
        return next(self._batches)

    def _step(self, k: int) -> float:
        inputs, target = self._split(self._next_batch(), self.resumed_from + k)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.module(inputs), target)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    # -- micro-steps (CPU; pipefill/torch/_micro_steps.py) --
    def _start_micro(self, items: int, priority: int, item_cost_us: Optional[float]) -> None:
        """The native job with one configuration per micro-batches-per-item choice."""
        micro = self._micro
        assert micro is not None
        inputs, target = self._split(self._first, self.step)
        micro.check_rows(inputs, target, self.step)
        if item_cost_us is not None:  # one whole step's cost, given
            micro_us, optimizer_us = item_cost_us / micro.k, 0.0
        else:
            micro_us, optimizer_us = measure_micro_costs(self, self._first, micro.k)
        self.micro_cost_us = micro_us
        self.item_cost_us = float(micro.k * micro_us + optimizer_us)  # one whole step
        claims = micro.claims_bound(items)
        bound = claims if self.checkpoint is None else micro.claims_bound(self._due - self.step)
        native = self.runtime._native.create_config_item_job(
            self.name, priority, claims, micro.configs(micro_us, optimizer_us),
            _in_fill_thread(micro.run_item),
            bound, item_cost_us is not None)  # a given cost is kept, a timed one learned
        self.job = Job(self.runtime, None, native)
        self._hold_gil_interval()

    def _micro_held(self) -> bool:
        """Worker thread: no micro-batch may run now (all steps done, or the job is held at a
        checkpoint's step until its state was copied)."""
        micro = self._micro
        return self.step >= self.steps or (micro is not None and micro.in_step == 0
                                           and self.checkpoint is not None
                                           and self.step >= self._due)

    def _claims_bound(self, due: int) -> int:
        """The available bound (claims of this attempt) that lets the job run up to step
        ``due``: one claim per step, or with micro-steps, the claims run so far plus one per
        micro-batch left (an upper bound: an item may run several)."""
        if self._micro is None:
            return due - self.resumed_from
        return self.job._native.items_run() + self._micro.claims_bound(due - self.step)

    def _end_micro_job(self) -> None:
        """Ends the native job of a micro-step job whose steps are done at the claims it
        completed (its item count was an upper bound); outside bubbles, no slice in flight."""
        if self._micro is None or self.job is None or self.step < self.steps:
            return
        info = self.job.info()
        if info.status not in (JobStatus.PENDING, JobStatus.RUNNING):
            return  # ended already
        done = info.items_completed
        try:
            self.job._native.set_available(done)
            self.job._native.end_input()
        except PipeFillError:
            pass  # it completed meanwhile (its last claims were the bound), or a slice still runs

    # -- CUDA: the captured step over a ring of slots --
    def _start_cuda(self, items: int, priority: int, item_cost_us: Optional[float]) -> None:
        self._note_position(self.step)
        first = next(self._batches)
        self._capture = TrainingCapture(self.runtime, self.module, self.optimizer, self.loss_fn,
                                        first, self.slots, items, self.name, priority,
                                        item_cost_us)
        self._snapshot_stream = torch.cuda.Stream()
        self.job = self._capture.graph_job.job
        self._feeder = threading.Thread(target=self._feed, args=(first, items),
                                        name=f"pipefill-feed-{self.name}", daemon=True)
        self._drainer = threading.Thread(target=self._drain, args=(items,),
                                         name=f"pipefill-drain-{self.name}", daemon=True)
        self._feeder.start()
        self._drainer.start()

    def _feed(self, first: Any, items: int) -> None:
        """Stages step k's batch once its slot is free (item k - slots drained) and k is below
        the due checkpoint step, then raises the bound to k + 1."""
        try:
            batch = first
            for k in range(items):
                if k > 0:
                    self._note_position(self.resumed_from + k)
                    batch = next(self._batches)
                with self._cv:
                    while not self._stopping() and (
                            k - self._drained >= self.slots
                            or self.resumed_from + k >= self._due):
                        self._cv.wait(0.05)
                    if self._stopping():
                        return
                inputs, target = (torch.as_tensor(v) for v in batch)
                self._check_batch(k, inputs, target)
                self._capture.inputs.to_device(k % self.slots, [inputs, target])
                self.job._native.set_available(k + 1)
        except Exception as error:
            if not self._stopping():
                self._fail(f"training_job '{self.name}': feeder: {type(error).__name__}: {error}")

    def _note_position(self, step: int) -> None:
        """CUDA feeder: the data position before step's batch is drawn, kept for a checkpoint
        due at that step (the feeder draws ahead of the steps taken)."""
        if self.checkpoint is not None and (step % self.every == 0 or step == self.steps):
            with self._cv:
                self._positions[step] = self._batches.state()

    def _check_batch(self, k: int, inputs: "torch.Tensor", target: "torch.Tensor") -> None:
        for what, value, slot in (("inputs", inputs, self._capture.inputs.host[0]),
                                  ("target", target, self._capture.inputs.host[1])):
            if tuple(value.shape) != tuple(slot.shape[1:]) or value.dtype != slot.dtype:
                raise ValueError(f"step {self.resumed_from + k}: {what} of shape "
                                 f"{tuple(value.shape)} and dtype {value.dtype}; the first "
                                 f"batch's were {tuple(slot.shape[1:])} and {slot.dtype} (a "
                                 "captured step needs the same shapes every step)")

    def _drain(self, items: int) -> None:
        try:
            for k in range(items):
                while True:
                    why = job_failure(self.job)
                    if why is not None:
                        raise FillJobError(f"training_job '{self.name}': {why}")
                    done = self.job.info().items_completed
                    with self._cv:
                        if done > k or self._stopping():
                            break
                        self._cv.wait(0.002)
                if self._stopping():
                    return
                loss = float(self._capture.outputs.to_host(k % self.slots)[0])
                with self._cv:
                    self._drained = k + 1
                self._stepped(loss)
        except Exception as error:
            self._fail(error.message if isinstance(error, FillJobError)
                       else f"training_job '{self.name}': drainer: {type(error).__name__}: {error}")

    # -- public --
    def progress(self) -> Progress:
        with self._cv:
            done, finished = self.step, self._finished
        rate = self._recent_rate()
        eta = None if rate <= 0 else (self.steps - done) / rate
        return Progress(done, self.steps, rate, eta, finished)

    def wait(self, timeout: Optional[float] = None) -> Progress:
        """Waits until the last step ran and its checkpoint was written (a last checkpoint
        still due is taken here: never call it inside a bubble); FillJobError when the job
        ended itself, PipeFillError(TIMEOUT) when ``timeout`` seconds passed."""
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.checkpoint is not None and not self.runtime.in_bubble:
            while True:  # the last step may still be running: wait for it, then copy
                self._check_item_error()
                with self._cv:
                    if self.step == self.steps or self._stopping() or self._finished:
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._cv.wait(0.05 if left is None else min(0.05, left))
            self._take_snapshot("wait")
        if self._micro is not None and not self.runtime.in_bubble:
            self.runtime.synchronize()  # the last slice harvested: no claim in flight
            self._end_micro_job()
        return self._wait(None if deadline is None else max(0.0, deadline - time.monotonic()),
                          asked=timeout)

    def _check_item_error(self) -> None:
        if self.cuda:
            return  # the drainer watches the graph job
        super()._check_item_error()

    def close(self) -> None:
        """Destroys the job (cancels it first); a checkpoint being written is finished first.
        Idempotent."""
        writer = getattr(self, "_writer", None)
        with self._cv:
            pending = self._pending is not None
        if pending and writer is not None:
            with self._cv:
                while self._pending is not None and self._error is None:
                    self._cv.wait(0.05)
        self.runtime._remove_iteration_end_hook(self._on_iteration_end)
        super().close()
        if writer is not None and writer is not threading.current_thread():
            writer.join(timeout=10.0)


def training_job(runtime: Runtime, module: "torch.nn.Module", optimizer: Any,
                 loss_fn: Callable[..., "torch.Tensor"], data: Iterable[Any], *, steps: int,
                 checkpoint: Optional[PathLike] = None, every: int = 100,
                 resume: Optional[PathLike] = None, name: str = "training", priority: int = 0,
                 item_cost_us: Optional[float] = None, slots: int = 4,
                 micro_batches: int = 1) -> TrainingJob:
    """``steps`` optimizer steps of ``module`` in the bubbles, one step per item:
    ``loss_fn(module(inputs), target).backward(); optimizer.step()`` for the next
    ``(inputs, target)`` batch of ``data`` (iterated again when it ends). Every ``every`` steps
    and after the last, ``checkpoint`` gets model, optimizer, data position (the step) and the
    CPU RNG state: the job runs dry at that step, the state is copied at the trainer's next
    ``runtime.iteration_end()`` (outside bubbles) and written atomically (a temporary file,
    fsync, rename) by a background thread. ``resume``: such a checkpoint (usually the same
    path); when it exists the job goes on from its step, and the parameters after the remaining
    steps equal those of a run never interrupted (bit-identical on CPU, given the same data
    order). A checkpoint of another job (name or steps differ) is refused naming the field.

    On CUDA the whole step is one captured graph: the optimizer must be capturable (Adam,
    AdamW, Adamax, RAdam with ``capturable=True``; SGD with ``dampening=0``) and have no
    learning-rate scheduler (the capture fixes the learning rate: refused), the module and
    optimizer on the GPU, every batch of the first batch's shapes (a DataLoader whose last batch
    would be partial, ``drop_last=False``, is refused at creation); ``slots`` batches are staged
    ahead (pinned host + device ring).

    ``micro_batches=k`` (host and simulated backends): each step's batch is split into ``k``
    micro-batches with gradient accumulation (each micro-batch's loss scaled by its share of the
    rows; the optimizer steps after the k-th), and the planner runs 1, 2, ... or ``k`` of them
    per item, per bubble class (pipefill/torch/_micro_steps.py): a step longer than the bubbles
    runs in pieces that fit them. A bubble holds whole micro-batches only, so choose ``k`` so that
    one is at most about a quarter of the bubbles to fill (a ~20 ms step on 8 ms bubbles: k = 8
    fits 1-3 micro-batches a bubble, k = 16 fits 4-5; python/examples/micro_steps_bench.py).
    ``item_cost_us``: one step's cost; without micro-steps a given cost is kept by the planner
    (not learned from the slices)."""
    return TrainingJob(runtime, module, optimizer, loss_fn, data, steps=steps,
                       checkpoint=checkpoint, every=every, resume=resume, name=name,
                       priority=priority, item_cost_us=item_cost_us, slots=slots,
                       micro_batches=micro_batches)
