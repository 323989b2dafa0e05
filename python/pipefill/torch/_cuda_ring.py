"""pipefill.torch._cuda_ring: the CUDA path of ``inference_job`` / ``training_job`` (issue 18).

On the CUDA backend each item is one replay of a captured CUDA graph, gated by the runtime like
every graph fill job (:func:`pipefill.torch.graph_fill_job`): the graph reads the item number
from the job's device index word and works on slot ``index % slots`` of a ring:

- ``slots`` device input slots (one batch each; a training job's ``(inputs, target)`` pair) and
  as many pinned host staging buffers, and ``slots`` device output slots (an inference job's
  output batch, a training step's loss) with their pinned host copies;
- the feeder (a host thread, never in a bubble) copies batch k into pinned slot ``k % slots``,
  then to the device slot on a copy stream of its own, waits for that copy's event on its own
  thread, and only then raises the job's available bound to k + 1 (pfJobSetAvailable);
- the drainer (a host thread) waits until the runtime reports item k complete
  (``pfJobInfo_t.items_completed``: the item's slice ran to its end on the fill stream), copies
  output slot ``k % slots`` to the host, hands it on in order and frees the slot.

The bound that makes the slots safe: the feeder stages item k only once item k - slots was
drained, so ``available <= drained + slots`` always - a slot is never overwritten (input) nor
rewritten by the graph (output) before the item that used it reached the sink. Inside a bubble
nothing is allocated, loaded or synchronised: the ring, the graph and the pinned buffers are made
when the job is created, and the copies and event waits run on the feeder/drainer threads.

A partial last batch runs on the whole slot (its unused rows hold zeros) and only its rows reach
the sink: the module must treat rows independently (inference in ``eval()`` mode).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .._enums import JobStatus, Result
from .._errors import PipeFillError
from .._runtime import Runtime
from ._graph_jobs import graph_fill_job
from ._streaming import InferenceJob


def _device() -> "torch.device":
    """The CUDA device the ring lives on (the current one, as graph_fill_job captures on it)."""
    return torch.device("cuda", torch.cuda.current_device())


def _pinned(shape: Tuple[int, ...], dtype: "torch.dtype") -> "torch.Tensor":
    """Page-locked host memory: host<->device copies of it are true DMA, never staged."""
    return torch.zeros(shape, dtype=dtype, pin_memory=True)


def slot_of(index: "torch.Tensor", slots: int) -> "torch.Tensor":
    """The ring slot of item ``index`` (a device int64 of shape ()), as a 1-element index."""
    return torch.remainder(index, slots).view(1)


class DeviceRing:
    """``slots`` device buffers shaped like ``example`` (one per slot, stacked on a leading
    dimension), their pinned host twins, and the copy stream and event the host thread that owns
    the copies waits on (one ring per direction: the feeder's and the drainer's)."""

    def __init__(self, examples: Sequence["torch.Tensor"], slots: int,
                 device: "torch.device") -> None:
        self.slots = slots
        self.device = [torch.zeros((slots,) + tuple(e.shape), dtype=e.dtype, device=device)
                       for e in examples]
        self.host = [_pinned((slots,) + tuple(e.shape), e.dtype) for e in examples]
        self.stream = torch.cuda.Stream(device=device)
        # The zero-fill above runs on the current stream, the copies on this one: without this
        # device-side wait a slot's first copy could land before its zeros (issue 24 item 10).
        self.stream.wait_stream(torch.cuda.current_stream(device))
        self.event = torch.cuda.Event()

    def to_device(self, slot: int, values: Sequence["torch.Tensor"]) -> None:
        """Stages ``values`` (host tensors, fewer rows allowed: the rest become zeros) into
        ``slot`` and returns once the device slot holds them."""
        for host, value in zip(self.host, values):
            rows = value.shape[0]
            host[slot][:rows].copy_(value)
            host[slot][rows:].zero_()
        with torch.cuda.stream(self.stream):
            for device, host in zip(self.device, self.host):
                device[slot].copy_(host[slot], non_blocking=True)
            self.event.record(self.stream)
        self.event.synchronize()

    def to_host(self, slot: int) -> List["torch.Tensor"]:
        """The device slot's values, copied to the host (new tensors the caller owns)."""
        with torch.cuda.stream(self.stream):
            for device, host in zip(self.device, self.host):
                host[slot].copy_(device[slot], non_blocking=True)
            self.event.record(self.stream)
        self.event.synchronize()
        return [host[slot].clone() for host in self.host]


def ring_step(inputs: DeviceRing, outputs: DeviceRing,
              compute: Callable[..., "torch.Tensor"]) -> Callable[["torch.Tensor"], None]:
    """The captured work of one item: ``compute`` on input slot ``index % slots``, its result
    into output slot ``index % slots`` (all on the device: the host never reads the index)."""
    slots = inputs.slots

    def step(index: "torch.Tensor") -> None:
        slot = slot_of(index, slots)
        values = [buffer.index_select(0, slot).squeeze(0) for buffer in inputs.device]
        result = compute(*values)
        ring = outputs.device[0]
        ring.index_copy_(0, slot, result.reshape(ring.shape[1:]).unsqueeze(0))

    return step


def job_failure(job: Any) -> Optional[str]:
    """Why the runtime ended a graph job (None while it did not fail)."""
    info = job.info()
    if info.status == JobStatus.FAILED:
        return f"the runtime failed the job's graph: {info.error.name}"
    return None


class CudaInferenceJob(InferenceJob):
    """:class:`pipefill.torch.InferenceJob` on the CUDA backend: the module captured once as a
    graph over the slot ring (see the module docstring). ``.graph_job``: the
    :class:`pipefill.torch.GraphFillJob` (graph, index word, rings kept alive)."""

    _poll_s = 0.002  # the runtime does not notify the drainer: it looks at items_completed

    def _make_job(self, runtime: Runtime, first: "torch.Tensor", items: int,
                  item_cost_us: Optional[float], priority: int) -> Any:
        device = _device()
        example = torch.zeros((self.batch_size,) + self.sample_shape, dtype=self.dtype)
        with torch.no_grad():
            probe = self.module(example.to(device))
        if (not isinstance(probe, torch.Tensor) or probe.dim() == 0
                or probe.shape[0] != self.batch_size):
            raise ValueError(f"inference_job: on CUDA the module must return one tensor with a "
                             f"row per input row; for a batch of {self.batch_size} it returned "
                             f"{type(probe).__name__} {tuple(getattr(probe, 'shape', ()))}")
        self._inputs = DeviceRing([example], self.slots, device)
        self._outputs = DeviceRing([probe], self.slots, device)
        module = self.module

        def compute(x: "torch.Tensor") -> "torch.Tensor":
            with torch.no_grad():
                return module(x)

        self.graph_job = graph_fill_job(runtime, ring_step(self._inputs, self._outputs, compute),
                                        items, item_cost_us=item_cost_us, name=self.name,
                                        priority=priority, available=0,
                                        keep_alive=(self._inputs, self._outputs, module))
        self.item_cost_us = self.graph_job.item_cost_us
        return self.graph_job.job

    def _stage(self, slot: int, batch: "torch.Tensor") -> None:
        self._inputs.to_device(slot, [batch])

    def _items_done(self) -> int:
        return self.job.info().items_completed

    def _take_output(self, k: int, slot: int) -> "torch.Tensor":
        return self._outputs.to_host(slot)[0][:self._rows[slot]]

    def _check_item_error(self) -> None:
        if self.job is None or self._error is not None:
            return
        why = job_failure(self.job)
        if why is not None:
            self._fail(f"job '{self.job.name}': {why}")


# ---- training: one whole step per item ---------------------------------------------------

ZERO_STATE_OPTIMIZERS = ("Adam", "AdamW", "Adamax", "RAdam", "SGD")
"""Optimizers whose per-parameter state starts at zeros: the warm-up steps before the capture
create it, and it is reset to zeros afterwards, so the first captured step equals an eager
first step (SGD only with dampening 0: its eager first step sets the momentum to the gradient)."""


def check_capturable(optimizer: Any) -> None:
    """Refuses an optimizer whose ``step()`` cannot be captured whole in a CUDA graph, naming it
    and the fix."""
    name = type(optimizer).__name__
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or not groups:
        raise TypeError(f"training_job: optimizer {optimizer!r} is not a torch.optim.Optimizer")
    # An LR scheduler: torch.optim.lr_scheduler wraps optimizer.step and records each group's
    # initial_lr. A captured step replays the learning rate of its capture (a Python float baked
    # into the kernels), so the scheduler's changes would be silently ignored (issue 24 item 10).
    scheduled = [i for i, group in enumerate(groups) if "initial_lr" in group]
    if scheduled or hasattr(getattr(optimizer, "step", None), "_wrapped_by_lr_sched"):
        where = f"param group {scheduled[0]} has 'initial_lr'" if scheduled else \
            "its step() is wrapped by torch.optim.lr_scheduler"
        raise PipeFillError(Result.NOT_SUPPORTED,
                            f"training_job on CUDA: optimizer {name} has a learning-rate scheduler "
                            f"attached ({where}); the captured step replays the learning rate of "
                            "its capture, so the scheduler's updates would be silently ignored: "
                            "train with a constant learning rate on CUDA, or use the simulated or "
                            "host backend")
    if name not in ZERO_STATE_OPTIMIZERS:
        raise PipeFillError(Result.NOT_SUPPORTED,
                            f"training_job on CUDA: optimizer {name} is not supported (its first "
                            f"step's state is not zeros); use one of "
                            f"{', '.join(ZERO_STATE_OPTIMIZERS)} (with capturable=True where it "
                            "has the flag)")
    for i, group in enumerate(groups):
        if name == "SGD":
            if group.get("momentum", 0) and group.get("dampening", 0):
                raise PipeFillError(Result.NOT_SUPPORTED,
                                    f"training_job on CUDA: SGD param group {i} has momentum and "
                                    f"dampening={group['dampening']}; a captured first step "
                                    "differs from an eager one: use dampening=0")
        elif not group.get("capturable", False):
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"training_job on CUDA: optimizer {name} (param group {i}) is "
                                f"not capturable: its step() keeps its step count on the host "
                                f"and cannot be captured in a CUDA graph; create it with "
                                f"{name}(..., capturable=True)")
        for p in group["params"]:
            if p.device.type != _device().type:
                raise PipeFillError(Result.INVALID_ARGUMENT,
                                    f"training_job on CUDA: optimizer {name} has a parameter of "
                                    f"shape {tuple(p.shape)} on {p.device}; move the module to "
                                    "the GPU before creating the optimizer")


def check_full_batches(data: Any) -> None:
    """Refuses, at creation, training data whose batches would not all have the first batch's
    shape (a captured step works on fixed shapes; the feeder would fail the job at the first such
    batch, possibly hours in - issue 24 item 10): a ``torch.utils.data.DataLoader`` with
    ``drop_last=False`` whose dataset length is not a multiple of its batch size, or a list/tuple
    of ``(inputs, target)`` batches whose shapes differ. A DataLoader whose length is unknown (an
    iterable dataset) with ``drop_last=False`` is warned about."""
    import warnings
    from torch.utils.data import DataLoader
    if isinstance(data, DataLoader):
        size = data.batch_size
        if size is None or data.drop_last:
            return
        try:
            samples = len(data.dataset)  # type: ignore[arg-type]
        except TypeError:
            warnings.warn("training_job on CUDA: the DataLoader has drop_last=False and a dataset of "
                          "unknown length; a last partial batch would fail the job when it comes "
                          "(a captured step needs the first batch's shape every step): pass "
                          "drop_last=True", RuntimeWarning, stacklevel=3)
            return
        if samples % size != 0:
            raise ValueError(f"training_job on CUDA: the DataLoader's last batch would hold "
                             f"{samples % size} of {size} samples ({samples} samples, "
                             "drop_last=False), and a captured step needs the first batch's shape "
                             "every step: pass drop_last=True to the DataLoader")
        return
    if isinstance(data, (list, tuple)) and data:
        def shapes(batch: Any) -> Any:
            if isinstance(batch, (list, tuple)):
                return tuple(tuple(getattr(v, "shape", ())) for v in batch)
            return tuple(getattr(batch, "shape", ()))
        first = shapes(data[0])
        for k, batch in enumerate(data[1:], start=1):
            if shapes(batch) != first:
                raise ValueError(f"training_job on CUDA: batch {k} has shapes {shapes(batch)}, the "
                                 f"first batch {first}; a captured step needs the first batch's "
                                 "shape every step (drop or pad the odd batch)")


def _state_tensors(optimizer: Any) -> Dict[Tuple[int, str], "torch.Tensor"]:
    out = {}
    for p, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[(id(p), key)] = value
    return out


class TrainingCapture:
    """The training step captured whole (forward, loss, backward, ``optimizer.step()``) over a
    ring of ``(inputs, target)`` slots; output slot k holds step k's loss. The warm-up steps the
    capture needs (on a side stream: they create the optimizer's state and the gradients) are
    undone: parameters and the state that existed get their values back, state the warm-up
    created is reset to zeros (ZERO_STATE_OPTIMIZERS), so item 0 is the job's first step. The
    module's buffers get their values back too."""

    def __init__(self, runtime: Runtime, module: "torch.nn.Module", optimizer: Any,
                 loss_fn: Callable[..., "torch.Tensor"],
                 first: Tuple["torch.Tensor", "torch.Tensor"],
                 slots: int, items: int, name: str, priority: int,
                 item_cost_us: Optional[float]) -> None:
        check_capturable(optimizer)
        device = _device()
        inputs, target = (torch.as_tensor(v) for v in first)
        self.inputs = DeviceRing([inputs, target], slots, device)
        self.outputs = DeviceRing([torch.zeros((), dtype=torch.float32)], slots, device)
        self.inputs.to_device(0, [inputs, target])  # warm-up steps see real data
        # Parameters and buffers (a BatchNorm's running statistics move in training steps too),
        # and the optimizer state, saved until the warm-up is undone - then dropped: kept for the
        # job's life they were 1x-3x the model in extra GPU memory (issue 24 item 2).
        undo = WarmUpUndo(module, optimizer)

        def compute(x: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
            loss = loss_fn(module(x), y)
            loss.backward()
            optimizer.step()
            return loss.detach().float()

        step = ring_step(self.inputs, self.outputs, compute)

        def step_from_no_grads(index: "torch.Tensor") -> None:
            # Gradients are set to None before each warm-up and before the capture, so the
            # captured backward writes them (from torch's graph pool) instead of accumulating.
            optimizer.zero_grad(set_to_none=True)
            step(index)

        try:
            self.graph_job = graph_fill_job(runtime, step_from_no_grads, items,
                                            item_cost_us=item_cost_us, name=name,
                                            priority=priority, available=0,
                                            measure_runs=0 if item_cost_us else 3,
                                            keep_alive=(self.inputs, self.outputs, module,
                                                        optimizer, loss_fn),
                                            before_register=undo.restore)
        finally:
            undo.drop()  # also when the capture failed: nothing of the clones outlives creation


class WarmUpUndo:
    """Clones of a module's parameters and buffers and of an optimizer's state tensors, taken
    before the warm-up steps; :meth:`restore` gives them back (state the warm-up created becomes
    zeros, ZERO_STATE_OPTIMIZERS); :meth:`drop` lets the clones go. The copies go on the current
    stream (the capture stream, in graph_fill_job's before_register), which the caller
    synchronizes: no device-wide synchronize (issue 24 item 5)."""

    def __init__(self, module: "torch.nn.Module", optimizer: Any) -> None:
        self.optimizer = optimizer
        params = [p for group in optimizer.param_groups for p in group["params"]]
        params += [b for b in module.buffers() if all(b is not p for p in params)]
        self.params: List["torch.Tensor"] = params
        self.saved_params: List["torch.Tensor"] = [p.detach().clone() for p in params]
        self.saved_state: Dict[Tuple[int, str], "torch.Tensor"] = {
            key: t.clone() for key, t in _state_tensors(optimizer).items()}

    def restore(self) -> None:
        with torch.no_grad():
            for p, value in zip(self.params, self.saved_params):
                p.copy_(value)
            for key, tensor in _state_tensors(self.optimizer).items():
                if key in self.saved_state:
                    tensor.copy_(self.saved_state[key])
                else:
                    tensor.zero_()

    def drop(self) -> None:
        """Lets the clones go. Call it once the copies :meth:`restore` queued have run (the
        caching allocator hands a freed block to the next allocation on the stream the clone was
        made on, which does not wait for the capture stream): graph_fill_job has synchronized the
        capture stream when it returns."""
        self.saved_params = []
        self.saved_state = {}
        self.params = []
