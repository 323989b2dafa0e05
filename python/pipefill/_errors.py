"""PipeFillError: every failing PipeFill call raises it, with the C result code and message."""
from __future__ import annotations

from ._enums import Result


class PipeFillError(Exception):
    """A PipeFill call failed.

    Attributes:
        code: the pfResult_t the C call returned, as a :class:`Result`.
        message: the C library's message for the failure (pfGetLastErrorMessage on the calling
            thread, read right after the call), which names the bad value.
    """

    code: Result
    message: str

    def __init__(self, code: int, message: str) -> None:
        try:
            self.code = Result(code)
        except ValueError:  # a code from a newer library
            self.code = code  # type: ignore[assignment]
        self.message = message
        super().__init__(code, message)

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, Result) else str(self.code)
        return f"[{name}] {self.message}"

    def __reduce__(self):  # picklable across processes (multiprocessing, torch.distributed)
        return (type(self), (int(self.code), self.message))


class FillJobError(PipeFillError, RuntimeError):
    """A fill job ended itself (a Python item, the sink or a checkpoint raised): ``code`` is
    Result.JOB_FAILED and ``message`` names the job, the item and the reason. The same failure
    reads as JobStatus.FAILED in ``Job.info()``, counts in ``Runtime.stats().jobs_failed`` and is
    raised by ``Job.wait()``. A RuntimeError too, as before it was a PipeFillError."""

    def __init__(self, message: str, code: int = int(Result.JOB_FAILED)) -> None:
        super().__init__(code, message)

    def __reduce__(self):
        return (type(self), (self.message, int(self.code)))
