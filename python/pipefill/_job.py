"""Job: a fill job attached to a runtime (pfJob_t) in Python's idiom - its status, waits,
cost, progress and the one way a failure is told (status Failed, the message, jobs_failed,
FillJobError). Split from _runtime.py, which creates jobs."""
from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any, List, Optional

from . import _pipefill
from ._enums import Backend, JobStatus, Result
from ._errors import FillJobError, PipeFillError
from ._stats import CostInfo, FillProgress, GraphCounts, JobInfo, TicketCounts

if TYPE_CHECKING:
    from ._runtime import Runtime


class Job:
    """A fill job attached to a runtime (pfJob_t). Create with :meth:`Runtime.create_job`.

    A job keeps its runtime alive. :meth:`close` (or the end of a ``with`` block) detaches and
    frees it (pfJobDestroy, cancelling first); :meth:`Runtime.close` closes the jobs still open.
    """

    def __init__(self, runtime: "Runtime", spec: Any, native: "_pipefill.Job") -> None:
        self.runtime = runtime
        self.spec = spec
        self._native = native
        # Why the job ended itself on the Python side (a Python item, a sink or a checkpoint
        # raised: _fail), None otherwise. The native job is cancelled then; info(), wait() and
        # Runtime.stats() tell it as the failure it is.
        self._failure: Optional[str] = None
        self._failure_lock = threading.Lock()  # _fail may race (a torch job's threads, info())

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def closed(self) -> bool:
        return self._native.closed

    def info(self) -> JobInfo:
        """pfJobGetStatus; a job that ended itself on the Python side (a Python item raised)
        reads FAILED with error JOB_FAILED, like a native failure."""
        failure = self._python_failure()
        d = self._native.info()
        d["status"] = JobStatus(d["status"])
        d["error"] = Result(d["error"])
        if failure is not None:
            d["status"], d["error"] = JobStatus.FAILED, Result.JOB_FAILED
        return JobInfo(**d)

    @property
    def failure(self) -> Optional[str]:
        """Why the job failed on the Python side (the item and the exception), else None."""
        return self._python_failure()

    def _python_failure(self) -> Optional[str]:
        if self._failure is None and not self._native.closed:
            try:
                item_error = self._native.item_error()  # item jobs: a Python item raised
            except PipeFillError:
                item_error = None  # not an item job
            if item_error is not None:
                self._fail(f"job '{self.name}': {item_error}")
        return self._failure

    def _fail(self, message: str) -> None:
        """Ends the job as failed on the Python side: cancels the native job (nothing more is
        scheduled) and records ``message``; counted once in Runtime.stats().jobs_failed."""
        with self._failure_lock:
            self._fail_once(message)

    def _fail_once(self, message: str) -> None:
        if self._failure is not None:
            return
        completed = False
        if not self._native.closed:
            status = JobStatus(self._native.info()["status"])
            if status == JobStatus.FAILED:
                return  # it failed natively before: that failure is its outcome, counted already
            completed = status == JobStatus.COMPLETED  # its items ran, its sink or item failed
            if status in (JobStatus.PENDING, JobStatus.RUNNING) and self._fails_itself():
                # A Python item raised on the host backend: the device fails the native job
                # with the item's message when its slice is harvested (pfJobWait, the native
                # status and jobs_failed then say it); cancelling now would make it read
                # CANCELLED to C callers, and counting it here would count it twice.
                self._failure = message
                return
            try:
                self._native.cancel()
            except PipeFillError:
                pass  # it ended meanwhile
        self._failure = message
        self.runtime._python_failed_jobs += 1
        self.runtime._python_failed_completed += int(completed)

    def _fails_itself(self) -> bool:
        """A Python item of this job raised on the host backend (see _fail_once)."""
        if self.runtime.backend != Backend.HOST:
            return False
        try:
            return self._native.item_error() is not None
        except PipeFillError:
            return False  # not an item job

    @property
    def status(self) -> JobStatus:
        return self.info().status

    def cost_info(self) -> CostInfo:
        """pfJobGetCostInfo: the item cost given at creation and the one learned from measured
        slices (a bad first estimate corrects itself within a few bubbles)."""
        return CostInfo(**self._native.cost_info())

    def cancel(self) -> None:
        """Stops scheduling the job; slices in flight finish (ticket slices at the next gate)."""
        self._native.cancel()

    def wait(self, timeout: Optional[float] = None) -> JobInfo:
        """Waits until the job completed (returns its info); raises PipeFillError with
        Result.TIMEOUT when ``timeout`` seconds pass, Result.JOB_FAILED when it failed and
        Result.CANCELLED when it was cancelled. Never call it inside a bubble. On the simulated
        backend nothing advances unless the world runs (in another thread)."""
        if timeout is None:
            timeout_us = -1.0
        else:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout):
                raise PipeFillError(Result.INVALID_ARGUMENT, f"Job.wait: timeout {timeout!r} "
                                    "is not a number of seconds")
            timeout_us = max(0.0, float(timeout)) * 1e6
        failure = self._python_failure()
        if failure is not None:
            raise FillJobError(failure)
        try:
            self._native.wait(timeout_us)
        except PipeFillError as error:
            failure = self._python_failure()
            if failure is not None and error.code in (Result.CANCELLED, Result.JOB_FAILED):
                raise FillJobError(failure) from None
            if error.code == Result.JOB_FAILED and not isinstance(error, FillJobError):
                raise FillJobError(error.message) from None  # one exception for a failed job
            raise
        return self.info()

    def close(self) -> None:
        """pfJobDestroy (cancels first, waits for its slices). Idempotent."""
        self._native.close()

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # SimTicketJob
    def counts(self) -> TicketCounts:
        """SimTicketJob only: items run, duplicates, slices launched."""
        return TicketCounts(**self._native.ticket_counts())

    # GraphJob
    def graph_counts(self) -> GraphCounts:
        """GraphJob on the simulated/host backends: items run, duplicates, order, index word."""
        return GraphCounts(**self._native.graph_counts())

    def graph_item_times(self) -> List[float]:
        """GraphJob with a ``clock_stream`` (host backend): the start time of every item run
        (µs, the host device's clock, which is the clock of the runtime's trace), in run order."""
        return list(self._native.graph_item_times())

    # Example fill jobs
    def progress(self) -> FillProgress:
        """Example fill jobs only (fjJobGetProgress)."""
        return FillProgress(**self._native.fill_progress())

    def output(self, item: int) -> List[float]:
        """Inference jobs: the output of ``item`` (rows*output or seq*hidden floats)."""
        return self._native.fill_output(item)

    def parameters(self) -> List[float]:
        """Training job: the current parameters (w1, b1, w2, b2)."""
        return self._native.fill_parameters()

    def evaluation_loss(self) -> float:
        """Training job: loss of the current parameters on a fixed held-out batch."""
        return self._native.fill_evaluation_loss()

    @property
    def item_cost_us(self) -> float:
        """Example fill jobs: the modelled cost of one item (fjJobItemCost)."""
        return self._native.fill_item_cost_us()

    def __repr__(self) -> str:
        if self.closed:
            return f"Job({self.name!r}, closed)"
        return f"Job({self.name!r}, {self.status.name})"
