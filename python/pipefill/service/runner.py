"""The interface between the service and the code that runs one shard.

A job's entry point returns a :class:`ShardRunner`. The rank's agent calls ``runner.run(ctx)``
on its own thread (never the trainer's) with a :class:`ShardContext`: the runtime, the shard's
item range, the item to resume from (the last durable checkpoint), the attempt's own output file
(already holding the checkpointed prefix) and ``ctx.checkpoint(next_item)``, which makes the
output durable and renews the lease. ``run`` returns when the shard's items are all written; the
agent then hashes the file, renames it to its final per-attempt name and commits it with the
lease's fencing token.

``run`` must stop promptly (raise or return) when ``ctx.checkpoint`` raises :class:`LeaseLost`
(another rank owns the shard now) or :class:`Stopping` (the trainer is draining: the shard goes
back to the queue as a preemption). Any other exception counts as a failure of the job's code.

Fill work reaches the GPU only through runtime jobs: ``ctx.create_job(spec)`` hands the
creation to the trainer thread between iterations (job creation may allocate and load modules,
which must never happen inside a bubble) and ``ctx.close_job(job)`` likewise.

:class:`ItemRunner` is the runner the package ships today: each item is one item of a
:class:`pipefill.jobs.GraphJob` (on the host or simulated backend a timed stand-in for a CUDA
graph run, on CUDA a captured graph), and as items complete inside bubbles it writes each one's
``compute(item)`` record. A torch model + dataset job runs as issue 18's streaming
``pipefill.torch.inference_job(..., resume=)`` through
:class:`pipefill.service.torch_runner.TorchInferenceRunner`.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Mapping

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8
    Protocol = object  # type: ignore[assignment,misc]

from .._enums import JobStatus, Result
from .._errors import PipeFillError
from ..jobs import GraphJob


class LeaseLost(Exception):
    """The lease's fencing token is no longer current: stop, this attempt can never commit."""


class Stopping(Exception):
    """The agent is draining (trainer restart): give the shard back at the last checkpoint."""


@dataclasses.dataclass
class ShardContext:
    runtime: Any
    """The rank's :class:`pipefill.Runtime`."""
    job_id: int
    shard: int
    item_start: int
    item_end: int
    resume_item: int
    """First item this attempt must produce (item_start, or the last durable checkpoint)."""
    params: Mapping[str, Any]
    output: Any
    """This attempt's own file, positioned after the resumed prefix; write records in order.
    Besides ``write`` it has ``tell()``, ``sync()`` (flush + fsync) and ``digest()`` (sha256 hex
    of everything written, prefix included)."""
    checkpoint: Callable[..., None]
    """checkpoint(next_item, durable=None): renews the lease with the output prefix that holds
    the items before next_item - by default all of output (fsynced here), or ``durable=(bytes,
    sha256)`` of a prefix the runner already fsynced; raises LeaseLost/Stopping."""
    create_job: Callable[[Any], Any]
    """create_job(spec): ``runtime.create_job(spec)`` on the trainer thread between iterations;
    ``spec`` may also be a callable ``make(runtime) -> job`` (e.g. a streaming torch job)."""
    close_job: Callable[[Any], None]
    stopping: threading.Event
    item_cost_us: float = 0.0
    """The job's declared duration of one item (its JobSpec.item_cost_us; 0: not declared)."""
    deadline_s: float = 600.0
    """Bound on one attempt's time (a runner must not wait longer)."""


class ShardRunner(Protocol):
    def run(self, ctx: ShardContext) -> None:
        """Produces items [ctx.resume_item, ctx.item_end) into ctx.output, inside bubbles."""


class ItemRunner:
    """Items run as GraphJob items inside bubbles; each completed item's record is written.

    ``compute(item) -> bytes`` gives an item's record (the job's real result for it);
    ``item_cost_us`` is one item's duration; a checkpoint every ``checkpoint_items`` items.
    """

    def __init__(self, compute: Callable[[int], bytes], *, item_cost_us: float = 200.0,
                 checkpoint_items: int = 8, poll_s: float = 0.01, name: str = "service-shard"
                 ) -> None:
        if not item_cost_us > 0:
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"ItemRunner item_cost_us {item_cost_us} must be > 0")
        if checkpoint_items < 1:
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"ItemRunner checkpoint_items {checkpoint_items} must be >= 1")
        self.compute = compute
        self.item_cost_us = float(item_cost_us)
        self.checkpoint_items = int(checkpoint_items)
        self.poll_s = poll_s
        self.name = name

    def run(self, ctx: ShardContext) -> None:
        first = ctx.resume_item
        count = ctx.item_end - first
        if count <= 0:
            return
        job = ctx.create_job(GraphJob(items=count, item_cost_us=self.item_cost_us,
                                      name=f"{self.name}-{ctx.job_id}-{ctx.shard}"))
        try:
            written = 0
            checkpointed = 0
            give_up = time.monotonic() + ctx.deadline_s
            while written < count:
                info = job.info()
                if info.status in (JobStatus.FAILED, JobStatus.CANCELLED):
                    raise PipeFillError(info.error, f"fill job of shard {ctx.shard} ended "
                                        f"{info.status.name} after {info.items_completed} items")
                for offset in range(written, info.items_completed):
                    ctx.output.write(self.compute(first + offset))
                written = max(written, info.items_completed)
                if written - checkpointed >= self.checkpoint_items and written < count:
                    ctx.checkpoint(first + written)
                    checkpointed = written
                if written < count:
                    if ctx.stopping.is_set():
                        raise Stopping()
                    if time.monotonic() > give_up:
                        raise PipeFillError(Result.TIMEOUT,
                                            f"shard {ctx.shard}: {written}/{count} items after "
                                            f"{ctx.deadline_s} s (no bubbles?)")
                    time.sleep(self.poll_s)
        finally:
            ctx.close_job(job)

