"""Ready-made fill jobs. Their launch callbacks are native: no Python runs in the fill loop.

- :class:`SimTicketJob`: simulated ticket (or opaque) items of a given cost - the job of
  ``examples/c_trainer`` - counting every item it runs and checking each ran exactly once.
- :class:`MlpInference`, :class:`EncoderInference`, :class:`Training`: the example fill jobs of
  ``examples/fill_jobs`` (fill_jobs.h), on every backend. On the simulated backend an item
  takes its modelled cost in virtual time, on the host backend in real time (an SM thread
  sleeps it out); an inference item's real result is computed on the CPU only when asked
  (``keep_every``; default none), a training item (an SGD step) always. On CUDA they run
  ticket kernels or cuBLAS work.

Pass a description to :meth:`pipefill.Runtime.create_job`; it returns a :class:`pipefill.Job`.
Fields left at None take the C defaults (fjParamsInit), except ``keep_every`` (0 here).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Union

from . import _pipefill
from ._enums import JobKind, Result
from ._errors import PipeFillError


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """One way to run a job (pfJobConfig_t); the planner picks per bubble class."""

    item_cost_us: float
    """Time one worker (block) needs for one item; > 0."""
    name: str = ""
    parallelism: int = 0
    """Items in flight at once (ticket: blocks); 0 = all fill SMs."""
    resident_bytes: int = 0
    workspace_bytes_per_item: int = 0
    items_per_item: float = 0.0
    """Useful work of one item in job units (e.g. samples); 0 = 1."""

    def _tuple(self) -> tuple:
        return (self.name, float(self.item_cost_us), int(self.parallelism),
                int(self.resident_bytes), int(self.workspace_bytes_per_item),
                float(self.items_per_item))


@dataclasses.dataclass(frozen=True)
class SimTicketJob:
    """Simulated fill items of ``item_cost_us`` each (pfSimLaunchTicketKernel per slice).

    ``kind=JobKind.OPAQUE`` runs them ungated (pfSimLaunchOpaque). ``configs`` offers the
    planner several configurations (the slice's chosen one sets the item cost).
    ``fail_at_slice=n`` makes the n-th slice's launch fail: the job ends FAILED, the runtime and
    the other jobs go on (for tests of failure handling). Simulated backend only.
    """

    items: int
    item_cost_us: float
    name: str = "sim-ticket"
    priority: int = 0
    kind: JobKind = JobKind.TICKET
    parallelism: int = 0
    resident_bytes: int = 0
    workspace_bytes_per_item: int = 0
    configs: Optional[Sequence[JobConfig]] = None
    fail_at_slice: int = 0

    def _create(self, native_runtime: "_pipefill.Runtime") -> "_pipefill.Job":
        configs = list(self.configs) if self.configs else []
        if not configs and self.parallelism != 0:
            # pfJobDesc_t has no parallelism field: say it through one explicit config.
            configs = [JobConfig(self.item_cost_us, self.name, self.parallelism,
                                 self.resident_bytes, self.workspace_bytes_per_item)]
        for name in ("items", "resident_bytes", "workspace_bytes_per_item", "fail_at_slice"):
            if getattr(self, name) < 0:
                raise PipeFillError(Result.INVALID_ARGUMENT,
                                    f"SimTicketJob.{name} {getattr(self, name)} must be >= 0")
        return native_runtime.create_sim_ticket_job(
            self.name, int(self.priority), int(self.items), float(self.item_cost_us),
            int(self.parallelism), int(self.resident_bytes), int(self.workspace_bytes_per_item),
            [c._tuple() for c in configs], int(self.kind), int(self.fail_at_slice))


def _address(value: Any, what: str) -> int:
    """An int address from an int, a ctypes object, or a tensor/array with data_ptr()."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise PipeFillError(Result.INVALID_ARGUMENT, f"GraphJob.{what} cannot be a bool")
    if isinstance(value, int):
        return value
    data_ptr = getattr(value, "data_ptr", None)
    if callable(data_ptr):
        return int(data_ptr())
    as_parameter = getattr(value, "value", None)
    if isinstance(as_parameter, int):
        return as_parameter
    raise PipeFillError(Result.INVALID_ARGUMENT,
                        f"GraphJob.{what} {value!r} is not an address (int, tensor, ctypes)")


def _stream_address(stream: Any) -> int:
    from ._runtime import stream_handle
    return stream_handle(stream)


@dataclasses.dataclass(frozen=True)
class GraphJob:
    """Any captured CUDA graph as a fill job (pfJobCreateGraph, kind JobKind.GRAPH).

    One item is one run of ``graph`` (a ``cudaGraph_t`` as an int, e.g.
    ``torch.cuda.CUDAGraph(keep_graph=True).raw_cuda_graph()``), whose kernels read the item's
    index from ``index_word`` (the address of an 8-byte device word, e.g. an int64 CUDA tensor of
    shape ()). The runtime wraps the graph, once at creation, in a graph that checks the gate
    before every item: the overrun past a bubble's end is at most one item, and each index
    0..items-1 runs exactly once across bubbles. The graph must not allocate, synchronise with
    the host or hold event/host/conditional nodes, and must write its results into memory
    allocated before the job (see docs/pytorch-graph-jobs.md, "Graph fill jobs").
    :func:`pipefill.torch.graph_fill_job` captures one for a module.

    On the simulated and host backends there is no graph: ``graph`` and ``index_word`` may stay
    None; each item takes ``item_cost_us`` and is counted (:meth:`pipefill.Job.graph_counts`).
    """

    items: int
    item_cost_us: float
    """Measured duration of one run of the graph (µs); > 0."""
    graph: Any = None
    index_word: Any = None
    name: str = "graph-job"
    priority: int = 0
    clock_stream: Any = None
    """Host backend only: a stream of the runtime (e.g. ``runtime.high_priority_stream()``)
    whose device clock stamps every item's start (:meth:`pipefill.Job.graph_item_times`, the
    clock of the runtime's trace)."""
    available: Optional[int] = None
    """Streaming bound the job starts with (pfGraphJobDesc_t.available): only items below it
    may be claimed until pfJobSetAvailable raises it. None: every item."""

    def _create(self, native_runtime: "_pipefill.Runtime") -> "_pipefill.Job":
        if isinstance(self.items, bool) or not isinstance(self.items, int) or self.items < 0:
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"GraphJob.items {self.items!r} must be an int >= 0")
        available = (1 << 64) - 1 if self.available is None else self.available
        if isinstance(available, bool) or not isinstance(available, int) or available < 0:
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"GraphJob.available {self.available!r} must be an int >= 0 or None")
        return native_runtime.create_graph_job(
            self.name, int(self.priority), int(self.items), float(self.item_cost_us),
            _address(self.graph, "graph"), _address(self.index_word, "index_word"),
            _stream_address(self.clock_stream), available)


_EXECUTIONS = {"ticket": 0, "opaque": 1}


def _fill_params(kind: int, spec: object, fields: Sequence[str]) -> "_pipefill.FillParams":
    params = _pipefill.FillParams(kind)
    for name in ("items", "seed", "priority", "item_cost_us", "parallelism", "keep_every",
                 "ticket_flops_per_us", "opaque_flops_per_us", "opaque_blocks", *fields):
        value = getattr(spec, name)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value < 0 and name in (
                "items", "seed", "keep_every"):
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"{type(spec).__name__}.{name} {value} must be >= 0")
        setattr(params, name, value)
    if kind in (0, 1) and getattr(spec, "keep_every") is None:
        # Inference results are computed on the CPU (simulated and host backends) only when
        # asked for: a real result per filled item made a 7 ms simulated step take seconds.
        params.keep_every = 0
    execution = getattr(spec, "execution")
    if execution is not None:
        if execution not in _EXECUTIONS:
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"{type(spec).__name__}.execution '{execution}' is not "
                                "'ticket' or 'opaque'")
        params.execution = _EXECUTIONS[execution]
    return params


@dataclasses.dataclass(frozen=True)
class _FillJobBase:
    items: Optional[int] = None
    seed: Optional[int] = None
    """Weights and inputs are a pure function of the seed."""
    priority: Optional[int] = None
    execution: Optional[str] = None
    """'ticket' (gated persistent blocks) or 'opaque' (ungated library-style work)."""
    item_cost_us: Optional[float] = None
    """Modelled cost of one item (<= 0 or None: from the FLOP count and the rates)."""
    parallelism: Optional[int] = None
    keep_every: Optional[int] = None
    """Inference: compute on the CPU and keep the output of every Nth item for reading back
    with ``job.output(item)`` (1: all). Default (None) 0: none, so filled items cost no CPU
    time on the simulated and host backends; opt in to check results (measured on the
    default shapes, docs/pytorch.md: a real result costs CPU time per item comparable to or
    above the item's modelled GPU cost). On CUDA every item runs on the GPU regardless."""
    ticket_flops_per_us: Optional[float] = None
    opaque_flops_per_us: Optional[float] = None
    opaque_blocks: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class MlpInference(_FillJobBase):
    """Batch inference of ``y = W2 gelu(W1 x + b1) + b2``; an item is ``rows`` samples."""

    input: Optional[int] = None
    hidden: Optional[int] = None
    output: Optional[int] = None
    rows: Optional[int] = None

    def _create(self, native_runtime: "_pipefill.Runtime") -> "_pipefill.Job":
        return native_runtime.create_fill_job(
            _fill_params(0, self, ("input", "hidden", "output", "rows")))


@dataclasses.dataclass(frozen=True)
class EncoderInference(_FillJobBase):
    """Inference of a pre-LN transformer encoder layer; an item is one sequence."""

    hidden: Optional[int] = None
    heads: Optional[int] = None
    ffn: Optional[int] = None
    seq: Optional[int] = None

    def _create(self, native_runtime: "_pipefill.Runtime") -> "_pipefill.Job":
        return native_runtime.create_fill_job(
            _fill_params(1, self, ("hidden", "heads", "ffn", "seq")))


@dataclasses.dataclass(frozen=True)
class Training(_FillJobBase):
    """A 2-layer tanh MLP regression trained by SGD; an item is one step, in order."""

    input: Optional[int] = None
    hidden: Optional[int] = None
    output: Optional[int] = None
    rows: Optional[int] = None
    """Batch size."""
    learning_rate: Optional[float] = None

    def _create(self, native_runtime: "_pipefill.Runtime") -> "_pipefill.Job":
        return native_runtime.create_fill_job(
            _fill_params(2, self, ("input", "hidden", "output", "rows", "learning_rate")))


JobSpec = Union[SimTicketJob, MlpInference, EncoderInference, Training]
