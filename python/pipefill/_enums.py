"""The C API's enumerations as Python IntEnums (values are the C values: pipefill.h)."""
from __future__ import annotations

import enum


class _NamedIntEnum(enum.IntEnum):
    """An IntEnum that prints by name: ``str(Backend.HOST)`` and ``f"{Backend.HOST}"`` give
    ``Backend.HOST`` (a plain IntEnum prints its number since Python 3.11); ``int()`` and
    format specs such as ``{:d}`` still give the C value."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else int.__format__(int(self), spec)


class Result(_NamedIntEnum):
    """pfResult_t: what a call returned (carried by PipeFillError.code)."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    INVALID_STATE = 2
    OUT_OF_MEMORY = 3
    NOT_SUPPORTED = 4
    NO_DEVICE = 5
    CUDA_FAILURE = 6
    CUPTI_FAILURE = 7
    NCCL_FAILURE = 8
    JOB_FAILED = 9
    CANCELLED = 10
    TIMEOUT = 11
    BUSY = 12
    IO = 13
    INTERNAL = 14


class Backend(_NamedIntEnum):
    """pfBackend_t: the device a runtime runs on."""

    AUTO = 0  #: CUDA when built with it and a GPU is present, else simulated
    CUDA = 1
    SIM = 2  #: the deterministic simulated device (virtual time)
    HOST = 3  #: the real-time host device (CPU threads as streams)


class Policy(_NamedIntEnum):
    """pfSchedulePolicy_t: which fill job gets the next bubble."""

    FIFO = 0
    PRIORITY = 1
    SHORTEST_REMAINING = 2
    FAIR_SHARE = 3


class LogLevel(_NamedIntEnum):
    """pfLogLevel_t (PIPEFILL_DEBUG)."""

    OFF = 0
    ERROR = 1
    WARN = 2
    INFO = 3
    DEBUG = 4
    TRACE = 5


class BubbleKind(_NamedIntEnum):
    """pfBubbleKind_t: where in the schedule a bubble is."""

    OTHER = 0
    WARMUP = 1  #: before a stage's first forward
    COOLDOWN = 2  #: waits during the backward drain
    DRAIN = 3  #: end of iteration before the gradient reduction
    OPTIMIZER = 4  #: data-parallel all-reduce / optimizer step


class JobKind(_NamedIntEnum):
    """pfJobKind_t: how a fill job's items run."""

    TICKET = 0  #: items claimed by persistent gated blocks; overrun <= one item
    OPAQUE = 1  #: ungated work, admitted only when it fits the time left
    GRAPH = 2  #: one captured CUDA graph per item, gated before every item (jobs.GraphJob)


class JobStatus(_NamedIntEnum):
    """pfJobStatus_t."""

    PENDING = 0
    RUNNING = 1
    COMPLETED = 2
    FAILED = 3
    CANCELLED = 4

    @property
    def finished(self) -> bool:
        """True for COMPLETED, FAILED and CANCELLED."""
        return self >= JobStatus.COMPLETED


class SkipCause(_NamedIntEnum):
    """pfSkipCause_t: why a bubble got no fill slice (Stats.skips, ClassStats.skips)."""

    NO_HISTORY = 0  #: its class has fewer than min_samples samples and no expected_us
    TOO_SHORT = 1  #: prediction minus the safety margins fits no item of any job
    NO_MEMORY = 2  #: a job's workspace does not fit the arena
    NO_JOB = 3  #: no runnable fill job (none created, or all finished)
    OPTIMIZER = 4  #: an optimizer bubble while fill_optimizer_bubbles is off
    LATE = 5  #: the bubble ended before its (opaque) slice could be launched
    NO_RESOURCES = 6  #: event pools exhausted, or every fill stream/SM already taken
    LAUNCH_FAILED = 7  #: every launch attempted failed
    UNTIMED = 8  #: its timings could not be measured
    OTHER = 9  #: anything else (PIPEFILL_DEBUG=trace logs the full reason)

    @property
    def description(self) -> str:
        """A short phrase for tables and messages."""
        return _SKIP_DESCRIPTIONS[self]


_SKIP_DESCRIPTIONS = {
    SkipCause.NO_HISTORY: "no samples yet", SkipCause.TOO_SHORT: "too short",
    SkipCause.NO_MEMORY: "no memory", SkipCause.NO_JOB: "no job",
    SkipCause.OPTIMIZER: "optimizer bubble unfilled", SkipCause.LATE: "ended before launch",
    SkipCause.NO_RESOURCES: "no free stream/SM/event", SkipCause.LAUNCH_FAILED: "launch failed",
    SkipCause.UNTIMED: "not timed", SkipCause.OTHER: "other",
}

_BACKEND_NAMES = {"auto": Backend.AUTO, "cuda": Backend.CUDA, "sim": Backend.SIM,
                  "host": Backend.HOST}
_POLICY_NAMES = {"fifo": Policy.FIFO, "priority": Policy.PRIORITY,
                 "srpt": Policy.SHORTEST_REMAINING, "fair": Policy.FAIR_SHARE}
_LOG_NAMES = {level.name.lower(): level for level in LogLevel}
_KIND_NAMES = {kind.name.lower(): kind for kind in BubbleKind}
