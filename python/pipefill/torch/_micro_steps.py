"""pipefill.torch._micro_steps: training_job's micro-steps on the simulated and host backends (issue 32
item 6, the PipeFill paper's execution plan: fit the job to the bubble).

A step whose time exceeds the bubbles runs only in one-item probes (a ~20 ms step on 8 ms bubbles
ran at 0.03 of its rate alone). With ``micro_batches=k`` each step's batch is split into ``k``
micro-batches (``torch.tensor_split`` along dim 0, inputs and target alike); each micro-batch's
loss, scaled by its share of the batch's rows, is back-propagated into the accumulated gradients,
and the optimizer steps after the k-th:

    optimizer.zero_grad(set_to_none=True)
    for x, y in zip(inputs.tensor_split(k), target.tensor_split(k)):
        (loss_fn(module(x), y) * (len(x) / len(inputs))).backward()
    optimizer.step()

The job offers one configuration per divisor ``g`` of ``k`` (at most 16): an item of
configuration ``g`` runs the next ``g`` micro-batches (``items_per_item = g``; an item may end one
step and begin the next), and the planner picks per bubble class the ``g`` whose items fill the
bubble best (pfJobConfig_t, several configurations). Since the micro-batches run in the same
order whatever ``g`` the planner picks, the training is bit-identical to the plain loop above.

Claims and micro-batches: the native job counts claims (items), which are not micro-batches once
``g > 1``; its item count is the micro-batches left (an upper bound of the claims), a claim with
nothing left to do returns at once, and ``TrainingJob.wait`` ends the native job at the claims it
completed. Checkpoints stay at step boundaries: micro-batches of a step interrupted mid-way run
again from the checkpoint's data position, with the same result.
"""
from __future__ import annotations

import copy
from typing import Any, List, Optional, Tuple

import torch

from ._job_common import _describe, _measure_us

MAX_CONFIGS = 16
"""Configurations a job offers at most (the runtime learns the costs of the first 16)."""


def item_groups(micro_batches: int) -> List[int]:
    """Micro-batches per item the job offers: the divisors of ``micro_batches``, smallest first
    (at most MAX_CONFIGS: the smallest ones and ``micro_batches`` itself)."""
    divisors = [g for g in range(1, micro_batches + 1) if micro_batches % g == 0]
    if len(divisors) > MAX_CONFIGS:
        divisors = divisors[:MAX_CONFIGS - 1] + [micro_batches]
    return divisors


class MicroSteps:
    """The micro-step state of one TrainingJob (CPU): where in the current step the job is, the
    step's micro-batches and its loss so far. Items run on the device's worker thread, one after
    another (the job has one worker), with the GIL."""

    def __init__(self, job: Any, micro_batches: int) -> None:
        self.job = job
        self.k = micro_batches
        self.groups = item_groups(micro_batches)
        self.in_step = 0     # micro-batches of the current step done
        self._chunks: Optional[Tuple[tuple, tuple, int]] = None
        self._step_loss = 0.0
        self.micro_batches_run = 0  # this attempt

    def configs(self, micro_us: float, optimizer_us: float) -> List[tuple]:
        """(name, item_cost_us, items_per_item) per group: g micro-batches and, at most, one
        optimizer step (an item of g <= k micro-batches ends at most one step)."""
        return [(f"{g}x{self.k}", max(1.0, g * micro_us + optimizer_us), float(g))
                for g in self.groups]

    def claims_bound(self, steps: int) -> int:
        """Claims that run ``steps`` more steps at most (one micro-batch each, the worst case)."""
        return max(0, steps * self.k - self.in_step)

    # -- items (worker thread) --
    def run_item(self, item: int, config: int) -> None:
        job = self.job
        for _ in range(self.groups[config]):
            if job._micro_held():
                return  # all steps done, or held at a checkpoint's step: a claim left over
            loss = job._in_job_rng(self._one)
            if loss is not None:
                job._stepped(loss)  # after the RNG stream is saved: a snapshot may follow

    def _one(self) -> Optional[float]:
        """The next micro-batch; the step's loss when it ended the step, else None."""
        job = self.job
        if self.in_step == 0:
            inputs, target = job._split(job._next_batch(), job.step)
            rows = self.check_rows(inputs, target, job.step)
            self._chunks = (inputs.tensor_split(self.k), target.tensor_split(self.k), rows)
            job.optimizer.zero_grad(set_to_none=True)
            self._step_loss = 0.0
        assert self._chunks is not None
        xs, ys, rows = self._chunks
        x, y = xs[self.in_step], ys[self.in_step]
        loss = job.loss_fn(job.module(x), y) * (x.shape[0] / rows)
        loss.backward()
        self._step_loss += float(loss.detach())
        self.in_step += 1
        self.micro_batches_run += 1
        if self.in_step < self.k:
            return None
        job.optimizer.step()
        self.in_step, self._chunks = 0, None
        return self._step_loss

    def check_rows(self, inputs: Any, target: Any, step: int) -> int:
        """Rows of the step's batch; a batch with fewer rows than micro-batches (an empty
        micro-batch) or with inputs and target of other lengths is refused, naming it."""
        rows = inputs.shape[0] if isinstance(inputs, torch.Tensor) and inputs.dim() > 0 else 0
        trows = target.shape[0] if isinstance(target, torch.Tensor) and target.dim() > 0 else -1
        if rows < self.k or trows != rows:
            raise ValueError(f"training_job '{self.job.name}': micro_batches = {self.k}, but step "
                             f"{step}'s batch has inputs {_describe(inputs)} and target "
                             f"{_describe(target)}: each needs at least {self.k} rows, the same "
                             "number in both")
        return rows


def measure_micro_costs(job: Any, batch: Any, micro_batches: int) -> Tuple[float, float]:
    """(one micro-batch's forward+backward, one optimizer step) in µs, timed at creation
    (outside any bubble) on copies of the module and the optimizer, RNG put back: one micro-batch
    with the optimizer step, then the whole step, the fastest of 5 each after a warm-up."""
    inputs, target = job._split(batch, job.step)
    try:
        module, optimizer = copy.deepcopy((job.module, job.optimizer))
    except Exception as error:
        raise ValueError(f"training_job '{job.name}': micro_batches needs the module and "
                         f"optimizer copied to time a micro-batch ({type(error).__name__}: "
                         f"{error}); pass item_cost_us= (one whole step's cost)") from None
    xs, ys = inputs.tensor_split(micro_batches), target.tensor_split(micro_batches)

    def run(count: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        for x, y in list(zip(xs, ys))[:count]:
            (job.loss_fn(module(x), y) * (x.shape[0] / inputs.shape[0])).backward()
        optimizer.step()

    with torch.random.fork_rng(devices=[]):
        try:
            run(micro_batches)  # warm-up (the optimizer makes its state)
            one = _measure_us(lambda: run(1))
            whole = _measure_us(lambda: run(micro_batches))
        except Exception as error:
            raise ValueError(f"training_job '{job.name}': one step on the first batch (inputs "
                             f"{_describe(inputs)}, target {_describe(target)}) failed: "
                             f"{type(error).__name__}: {error}") from None
    micro = max(1.0, (whole - one) / (micro_batches - 1))
    return micro, max(0.0, one - micro)
