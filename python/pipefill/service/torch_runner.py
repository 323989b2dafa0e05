"""A shard of a torch model + dataset job, run as issue 18's streaming inference job.

A job's entry point returns :class:`TorchInferenceRunner` (or any object with ``model`` and
``dataset`` attributes, which the agent wraps in one). One service item is one batch: shard
``[a, b)`` runs ``pipefill.torch.inference_job(rt, model, dataset, batch_size=B, start=a,
items=b - a, sink=<this attempt's file>, resume=<the shard's progress file>)``.

- The sink appends each batch's output to the attempt's own file as one ``.npy`` record (what
  ``numpy.load`` reads back one after the other), fsyncs it, and remembers the file's size and
  sha256 after that item.
- The inference job then rewrites the shard's progress file (``shard-N.progress.json`` beside
  the outputs): that is the durable checkpoint. The runner watches it and renews the lease at
  each new value with the output prefix it covers (``ctx.checkpoint(next, durable=...)``).
- A new attempt (another rank, after a kill) gets the last checkpoint from the database: the
  agent copies the verified prefix, and the runner sets the progress file to that item before
  the job starts, so the job resumes there - not from item 0 - and the output holds every item
  exactly once. (The progress file may be ahead of the database by the items written after the
  last renewal, or have been rewritten by a fenced attempt: the database's checkpoint is the one
  whose output prefix is verified.)

The job is created and closed on the trainer thread between iterations (``ctx.create_job`` /
``ctx.close_job``); the runner's own loop runs on the agent thread and never synchronises the
device.
"""
from __future__ import annotations

import io
import json
import os
import pathlib
import threading
import time
from typing import Any, Dict, Optional, Tuple

from .._enums import Result
from .._errors import PipeFillError
from .runner import ShardContext, Stopping

PROGRESS_KIND = "pipefill.inference_job"  # the progress file inference_job reads (resume=)


def progress_path(output: Any, shard: int) -> pathlib.Path:
    folder = pathlib.Path(getattr(output, "path", "")).parent
    return folder / f"shard-{shard:06d}.progress.json"


def _write_progress(path: pathlib.Path, name: str, start: int, end: int, next_item: int) -> None:
    """The progress file of an inference job named ``name`` over [start, end), at next_item,
    written atomically (temp, fsync, rename)."""
    state = {"kind": PROGRESS_KIND, "name": name, "start": start, "end": end, "next": next_item}
    temp = path.with_name(path.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
    with open(temp, "w") as file:
        json.dump(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, path)


def _read_next(path: pathlib.Path) -> Optional[int]:
    try:
        return int(json.loads(path.read_text())["next"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not written yet, or being replaced


class TorchInferenceRunner:
    """Runs a shard's batches through ``model`` inside the bubbles (see the module doc).

    Args:
        model: a ``torch.nn.Module`` (eval mode is the caller's choice).
        dataset: samples (grouped into batches of ``batch_size``) or batches
            (``batch_size=None``), as :func:`pipefill.torch.inference_job` takes them; service
            item k is batch k.
        item_cost_us: one batch's duration in a bubble (default: the job's declared
            ``item_cost_us``, else measured by inference_job on the first batch).
        poll_s: how often the agent thread looks at the progress file.
    """

    def __init__(self, model: Any, dataset: Any, *, batch_size: Optional[int] = None,
                 item_cost_us: Optional[float] = None, poll_s: float = 0.01) -> None:
        if batch_size is not None and batch_size <= 0:
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"TorchInferenceRunner batch_size {batch_size} must be > 0")
        if item_cost_us is not None and not item_cost_us > 0:
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"TorchInferenceRunner item_cost_us {item_cost_us} must be > 0")
        self.model = model
        self.dataset = dataset
        self.batch_size = batch_size
        self.item_cost_us = item_cost_us
        self.poll_s = poll_s

    def run(self, ctx: ShardContext) -> None:
        if ctx.resume_item >= ctx.item_end:
            return
        import numpy as np
        import pipefill.torch as pft

        name = f"service-{ctx.job_id}-{ctx.shard}"
        progress = progress_path(ctx.output, ctx.shard)
        # The database's checkpoint is the verified one: the job resumes exactly there.
        if ctx.resume_item > ctx.item_start:
            _write_progress(progress, name, ctx.item_start, ctx.item_end, ctx.resume_item)
        else:
            progress.unlink(missing_ok=True)
        lock = threading.Lock()
        marks: Dict[int, Tuple[int, str]] = {}  # next item -> (bytes, sha256) after its output

        def sink(index: int, output: Any) -> None:
            record = io.BytesIO()
            np.save(record, output.detach().cpu().numpy(), allow_pickle=False)
            ctx.output.write(record.getvalue())
            ctx.output.sync()  # durable before inference_job writes the progress file
            with lock:
                marks[index + 1] = (ctx.output.tell(), ctx.output.digest())

        cost = self.item_cost_us or ctx.item_cost_us or None
        job = ctx.create_job(lambda rt: pft.inference_job(
            rt, self.model, self.dataset, batch_size=self.batch_size, start=ctx.item_start,
            items=ctx.item_end - ctx.item_start, sink=sink, resume=progress, name=name,
            item_cost_us=cost))
        try:
            if getattr(job, "resumed_from", ctx.resume_item) != ctx.resume_item:
                raise PipeFillError(Result.INTERNAL,
                                    f"shard {ctx.shard}: the inference job resumed at item "
                                    f"{job.resumed_from}, the checkpoint says {ctx.resume_item}")
            renewed = ctx.resume_item
            give_up = time.monotonic() + ctx.deadline_s
            while True:
                error = job.error
                if error is not None:
                    raise PipeFillError(Result.JOB_FAILED, f"shard {ctx.shard}: {error}")
                durable = _read_next(progress)
                if durable is not None and durable > renewed and durable < ctx.item_end:
                    with lock:
                        mark = marks.get(durable)
                    if mark is not None:
                        ctx.checkpoint(durable, durable=mark)
                        renewed = durable
                if job.progress().finished:
                    break
                if ctx.stopping.is_set():
                    raise Stopping()
                if time.monotonic() > give_up:
                    raise PipeFillError(Result.TIMEOUT, f"shard {ctx.shard}: not finished after "
                                        f"{ctx.deadline_s} s (no bubbles?)")
                time.sleep(self.poll_s)
        finally:
            ctx.close_job(job)
        with lock:
            last = marks.get(ctx.item_end)
        if last is None or last[0] != ctx.output.tell():
            raise PipeFillError(Result.INTERNAL, f"shard {ctx.shard}: the inference job finished "
                                f"without item {ctx.item_end - 1}'s output")
        progress.unlink(missing_ok=True)


def wrap(candidate: Any) -> Any:
    """An entry point's result as a runner: itself when it has ``run``; a
    :class:`TorchInferenceRunner` when it provides ``model`` and ``dataset`` (optional
    ``batch_size``, ``item_cost_us``); else None."""
    if callable(getattr(candidate, "run", None)):
        return candidate
    if hasattr(candidate, "model") and hasattr(candidate, "dataset"):
        return TorchInferenceRunner(candidate.model, candidate.dataset,
                                    batch_size=getattr(candidate, "batch_size", None),
                                    item_cost_us=getattr(candidate, "item_cost_us", None))
    return None
