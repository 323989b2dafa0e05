"""pipefill.torch._batch_sizes: inference_job with several batch sizes on the simulated and host
backends (issue 32 item 6, the PipeFill paper's execution plan: fit the job to the bubble).

``batch_sizes=[b, 2b, 4b, ...]``: every size a multiple of the smallest, ``b``. The data is
grouped into *units* of ``b`` samples (as ``batch_size=b`` would group it), and the job offers one
configuration per size (pfJobConfig_t: its cost measured at creation on a batch of that size,
``items_per_item`` = its units); the planner picks per bubble class the size whose items fill
the bubble best. An item of size ``g*b`` runs the module once on the next ``g`` staged units
(``torch.cat``; fewer at the end of the data) and splits the output back into units.

What the sink sees does not depend on the sizes the planner picked: one call per unit, in order,
``sink(index, output_of_those_b_rows)``, exactly as a run with ``batch_size=b`` - indices, the
memmap's rows, the folder's files and ``start``/``items`` all count units. The rows are those of
``module(batch)`` for the item's batch: a module whose rows do not depend on the other rows of the
batch in floating point (elementwise layers; most CPU kernels are, but a batch-size-dependent
GEMM blocking may not be) gives the same values as any single-size run. The progress file
(``resume=``) counts units too, a fixed number of samples each (``rows`` in the file), so a
resumed job starts at the first unit not durably handed to the sink, whatever sizes ran before.

Claims and units: the native job counts claims (items), which take 1 to ``g`` units each. Its
available bound is kept at ``claims started + floor(units staged but not taken / G)`` (``G``: the
largest size's units), so every claim the runtime may grant finds its whole batch staged; once
the input ended, ``ceil(...)`` instead, so the last units are claimable and no claim finds nothing
(the first n-1 of n claims take fewer than the units left). ``slots`` counts largest batches: the
ring holds ``slots * G`` units. The drainer raises the bound as claims take units, and ends the
native job (pfJobEndInput) once every unit reached the sink.
"""
from __future__ import annotations

import json
import threading
from typing import Any, List, Optional, Sequence

import torch

from .._errors import PipeFillError
from .._runtime import Job, Runtime
from ._job_common import _describe, _in_fill_thread, _measure_us, _write_atomically
from ._streaming import InferenceJob

MAX_SIZES = 16
"""Configurations a job offers at most (the runtime learns the costs of the first 16)."""


def check_batch_sizes(batch_sizes: Any, batch_size: Optional[int],
                      item_cost_us: Any) -> List[int]:
    """The sizes, smallest first, or a ValueError naming the bad value (before anything is
    made: a refused job changes nothing)."""
    if isinstance(batch_sizes, (str, bytes)) or not hasattr(batch_sizes, "__iter__"):
        raise ValueError(f"inference_job: batch_sizes = {batch_sizes!r} (a list of ints >= 1)")
    sizes = list(batch_sizes)
    if not sizes or len(sizes) > MAX_SIZES:
        raise ValueError(f"inference_job: batch_sizes = {batch_sizes!r} (1 to {MAX_SIZES} sizes)")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"inference_job: batch_sizes = {batch_sizes!r}: {size!r} is not an "
                             "int >= 1")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"inference_job: batch_sizes = {batch_sizes!r} has a size twice")
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    unit = sizes[order[0]]
    for size in sizes:
        if size % unit:
            raise ValueError(f"inference_job: batch_sizes = {batch_sizes!r}: {size} is not a "
                             f"multiple of the smallest size, {unit}")
    if batch_size is not None and batch_size != unit:
        raise ValueError(f"inference_job: batch_size = {batch_size} with batch_sizes = "
                         f"{batch_sizes!r}: give batch_size=None or the smallest size, {unit}")
    if item_cost_us is not None and not isinstance(item_cost_us, (int, float)):
        try:
            costs = list(item_cost_us)
        except TypeError:
            costs = []
        if len(costs) != len(sizes) or any(
                isinstance(c, bool) or not isinstance(c, (int, float)) or not c > 0
                for c in costs):
            raise ValueError(f"inference_job: item_cost_us = {item_cost_us!r} with batch_sizes ="
                             f" {batch_sizes!r}: one cost > 0 per size (or one number: the "
                             "smallest size's cost)")
    elif item_cost_us is not None and not item_cost_us > 0:
        raise ValueError(f"inference_job: item_cost_us = {item_cost_us!r} (must be > 0)")
    return [sizes[i] for i in order]


def _split_rows(output: Any, rows: List[int]) -> Optional[List[Any]]:
    """The output of a batch of ``sum(rows)`` rows split into pieces of ``rows`` rows (views),
    or None when it is not a tensor (or a dict / tuple / list of tensors) of that many rows."""
    total = sum(rows)
    if isinstance(output, torch.Tensor):
        if output.dim() == 0 or output.shape[0] != total:
            return None
        return list(output.split(rows))
    if isinstance(output, dict):
        parts = {key: _split_rows(value, rows) for key, value in output.items()}
        if any(p is None for p in parts.values()):
            return None
        return [{key: parts[key][i] for key in output} for i in range(len(rows))]
    if isinstance(output, (tuple, list)):
        parts = [_split_rows(value, rows) for value in output]
        if any(p is None for p in parts):
            return None
        return [type(output)(p[i] for p in parts) for i in range(len(rows))]
    return None


class SizedInferenceJob(InferenceJob):
    """An InferenceJob whose items run one of several batch sizes (see the module's text)."""

    def __init__(self, runtime: Runtime, module: "torch.nn.Module", data: Any, *,
                 batch_sizes: Sequence[int], batch_size: Optional[int], slots: int,
                 item_cost_us: Any, **kw: Any) -> None:
        sizes = check_batch_sizes(batch_sizes, batch_size, item_cost_us)
        if slots < 2:
            raise ValueError(f"inference_job: slots = {slots} (at least 2: one item runs while "
                             "the next is staged)")
        self.unit_rows = sizes[0]
        self.groups = [size // sizes[0] for size in sizes]  # units per item, per configuration
        self.largest = self.groups[-1]
        self._given_costs = item_cost_us
        self._claim_lock = threading.Lock()  # the worker's take; the bound's computation
        self._publish_lock = threading.Lock()  # one publisher of the bound at a time
        self._claims_started = 0
        self._taken = 0        # units taken by claims
        self._units_done = 0   # units whose output is ready (a prefix)
        self._bound = 0        # the available bound last published (claims of this attempt)
        self._input_done = False
        self._native_ended = False  # the drainer ended the native job: no bound any more
        self.sizes_run = [0] * len(sizes)  # claims per configuration (this attempt)
        super().__init__(runtime, module, data, batch_size=self.unit_rows, slots=slots *
                         self.largest, item_cost_us=None, **kw)

    def _identity(self) -> dict:
        return dict(super()._identity(), rows=self.unit_rows)

    def _write_resume(self, next_item: int) -> None:
        assert self._resume is not None
        state = dict(self._identity(), next=next_item, samples=next_item * self.unit_rows)
        _write_atomically(self._resume, lambda f: json.dump(state, f), False)

    # -- the native job: one configuration per batch size --
    def _make_job(self, runtime: Runtime, first: "torch.Tensor", items: int,
                  item_cost_us: Optional[float], priority: int) -> Any:
        self._in = [torch.empty((self.batch_size,) + self.sample_shape, dtype=self.dtype)
                    for _ in range(self.slots)]
        self._out: List[Any] = [None] * self.slots
        costs = self._costs(first)
        self.config_costs_us = costs
        self.item_cost_us = costs[0]
        configs = [(f"batch{g * self.unit_rows}", max(1.0, cost), float(g))
                   for g, cost in zip(self.groups, costs)]
        # Costs the caller gave are kept; timed ones are learned (the fastest sample).
        native = runtime._native.create_config_item_job(self.name, priority, items, configs,
                                                        _in_fill_thread(self._run_claim), 0,
                                                        self._given_costs is not None)
        job = Job(runtime, None, native)
        self._hold_gil_interval()
        return job

    def _costs(self, first: "torch.Tensor") -> List[float]:
        """Per size: the given costs, the smallest size's given cost times the units, or the
        module timed at creation (outside any bubble) on a batch of that size made of the first
        batch's rows. A module whose output cannot be split back into rows is refused here."""
        given = self._given_costs
        if given is not None and isinstance(given, (int, float)):
            return [float(given) * g for g in self.groups]
        costs = []
        for g in self.groups:
            batch = first.repeat((g,) + (1,) * (first.dim() - 1))
            with torch.no_grad():
                output = self.module(batch)
            if _split_rows(output, [first.shape[0]] * g) is None:
                raise ValueError(f"inference_job '{self.name}': batch_sizes needs the module's "
                                 f"output split back into rows: on a batch of {batch.shape[0]} "
                                 f"rows it returned {_describe(output)} (a tensor, or a dict / "
                                 "tuple / list of tensors, with one row per input row)")
            if given is None:
                with torch.no_grad():
                    costs.append(_measure_us(lambda: self.module(batch)))
        return [float(c) for c in given] if given is not None else costs

    # -- the bound (feeder and drainer threads) --
    def _publish(self, staged: int) -> None:
        with self._cv:
            self._staged = staged
        self._republish()

    def _republish(self) -> None:
        """Raises the available bound to claims started plus the claims the staged units not
        taken yet fill whole (every unit left, rounded up, once the input ended)."""
        with self._publish_lock:
            if self._native_ended:
                return
            with self._claim_lock:
                left = self._staged - self._taken
                whole = -(-left // self.largest) if self._input_done else left // self.largest
                bound = self._claims_started + whole
            if bound > self._bound:
                self._bound = bound
                self.job._native.set_available(bound)

    def _input_ended(self, k: int) -> None:
        with self._claim_lock:
            self._input_done = True
        self._republish()  # before the drainer can see the total and end the native job
        with self._cv:
            self._total = k
            self._cv.notify_all()

    # -- items (the device's worker thread, with the GIL) --
    def _run_claim(self, claim: int, config: int) -> None:
        """One claim: the next 1..g staged units as one batch through the module, its output
        split back into units (their slots hold them until the drainer hands them on)."""
        with self._claim_lock:
            first = self._taken
            count = min(self.groups[config], self._staged - first)
            self._taken = first + count
            self._claims_started += 1
        if count <= 0:
            return  # cannot happen while the bound holds (see the module's text)
        self.sizes_run[config] += 1
        slots = [(first + j) % self.slots for j in range(count)]
        rows = [self._rows[s] for s in slots]
        with torch.no_grad():
            if count == 1:
                output = self.module(self._in[slots[0]][:rows[0]])
            else:
                output = self.module(torch.cat([self._in[s][:r] for s, r in zip(slots, rows)]))
        pieces = [output] if count == 1 else _split_rows(output, rows)
        if pieces is None:
            raise ValueError(f"items {self.next_item + first}..{self.next_item + first + count - 1}"
                             f": the module returned {_describe(output)}, which does not split "
                             f"into {count} units of rows {rows}")
        for slot, piece in zip(slots, pieces):
            self._out[slot] = piece
        self._units_done = first + count

    # -- output (drainer thread) --
    def _items_done(self) -> int:
        return self._units_done

    def _wait_items(self, target: int) -> int:
        """Sleeps until the next claim ran (or _drain_wait_s), raising the bound first."""
        self._republish()
        claims = self.job._native.items_run()  # before the units: a claim ending now wakes us
        if self._units_done >= target:
            return self._units_done
        self.job._native.wait_items_run(claims + 1, self._drain_wait_s)
        return self._units_done

    def _drain(self) -> None:
        super()._drain()
        with self._cv:
            finished = self._finished and self._error is None and not self._closing
        if not finished:
            return
        with self._publish_lock:
            self._native_ended = True
            try:  # every unit reached the sink: claims started == the bound, all ran
                self.job._native.end_input()
            except PipeFillError:
                pass  # the native job completed on its own (its item count was reached)
