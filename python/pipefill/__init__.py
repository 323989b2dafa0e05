"""PipeFill: fill the bubbles of pipeline-parallel training with other jobs' work.

The package binds the C API (include/pipefill/pipefill.h) in Python's idiom:

- :class:`Config` (keyword arguments; unset fields follow the PIPEFILL_* environment),
- :class:`Runtime` (a context manager) with ``runtime.bubble(stream, kind=..., label=...,
  expected_us=...)`` as a context manager and as ``bubble_begin``/``bubble_end`` calls,
  ``iteration_end()``, ``stats()`` (a :class:`Stats` dataclass) and ``write_trace(path)``,
- fill jobs (:mod:`pipefill.jobs`) with ``status`` / ``wait`` / ``cancel``, whose launch
  callbacks are native,
- :class:`PipeFillError` carrying the C result code and message,
- the simulated world (:class:`SimWorld`) for tests and notebooks,
- :mod:`pipefill.torch`: torch stream handles and bubble instructions for
  ``torch.distributed.pipelining`` schedules.
"""
from __future__ import annotations

from . import _pipefill
from ._config import Config
from ._enums import Backend, BubbleKind, JobKind, JobStatus, LogLevel, Policy, Result, SkipCause
from ._errors import PipeFillError

_pipefill.set_error_type(PipeFillError)

#: True when the extension was built with the CUDA backend (the default wherever nvcc was found
#: at build time). It says what was compiled in, not that a GPU is usable now: a CUDA runtime
#: on a machine without a GPU refuses with Result.NO_DEVICE.
WITH_CUDA: bool = bool(_pipefill.WITH_CUDA)

from ._runtime import (Bubble, ClassStats, CostInfo, FillProgress, GraphCounts, Job, JobInfo, Runtime, Stats, Stream,  # noqa: E402
                       MemoryInfo, StreamLike, TicketCounts, stream_handle)
from ._sim import SimEvent, SimStream, SimWorld  # noqa: E402
from . import jobs  # noqa: E402
from .jobs import (EncoderInference, GraphJob, JobConfig, MlpInference,  # noqa: E402
                   SimTicketJob, Training)


def host_stream_delay(stream: "StreamLike", duration_us: float) -> None:
    """pfHostStreamDelay: the host-backend stream waits ``duration_us`` (e.g. a stand-in for
    the main job's compute in tests)."""
    _pipefill.host_stream_delay(stream_handle(stream), float(duration_us))


def host_stream_synchronize(stream: "StreamLike") -> None:
    """pfHostStreamSynchronize: blocks until the host-backend stream's work has executed."""
    _pipefill.host_stream_synchronize(stream_handle(stream))


def host_now(stream: "StreamLike") -> float:
    """pfHostNow: the host device's clock (µs; the clock of its events and of the trace)."""
    return _pipefill.host_now(stream_handle(stream))


def error_string(code: int) -> str:
    """pfGetErrorString: the static text naming a result code."""
    return _pipefill.error_string(int(code))


def library_version() -> int:
    """pfGetVersion of the library compiled into the extension (MAJOR*10000+MINOR*100+PATCH)."""
    return _pipefill.version()


def _version_text(code: int) -> str:
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


__version__ = _version_text(_pipefill.HEADER_VERSION)

__all__ = [
    "Backend", "Bubble", "BubbleKind", "ClassStats", "Config", "CostInfo", "EncoderInference", "FillProgress", "GraphCounts",
    "GraphJob", "Job",
    "JobConfig", "JobInfo", "JobKind", "JobStatus", "LogLevel", "MemoryInfo", "MlpInference", "PipeFillError",
    "Policy", "Result", "Runtime", "SkipCause", "SimEvent", "SimStream", "SimTicketJob", "SimWorld", "Stats",
    "Stream", "StreamLike", "TicketCounts", "Training", "error_string", "jobs",
    "library_version", "stream_handle", "host_now", "host_stream_delay",
    "host_stream_synchronize", "WITH_CUDA",
]
