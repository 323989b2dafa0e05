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
                       MemoryInfo, StreamLike, TicketCounts, error_string, host_now,
                       host_stream_delay, host_stream_synchronize, library_version,
                       stream_handle)
from ._sim import SimEvent, SimStream, SimWorld  # noqa: E402
from . import jobs  # noqa: E402
from .jobs import (EncoderInference, GraphJob, JobConfig, MlpInference,  # noqa: E402
                   SimTicketJob, Training)
from . import _extensions  # noqa: E402


def _service_extension(runtime: "Runtime"):
    """PIPEFILL_SERVICE set: the runtime joins the fill-job service (pipefill.service.autostart).
    The service (and psycopg) is imported only then."""
    import os
    if "PIPEFILL_SERVICE" not in os.environ:
        return None
    from .service import autostart
    return autostart.runtime_extension(runtime)


_extensions.register_runtime_extension("service", _service_extension)


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
