"""The C API's enumerations as Python IntEnums (values are the C values: pipefill.h)."""
from __future__ import annotations

import enum


class Result(enum.IntEnum):
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


class Backend(enum.IntEnum):
    """pfBackend_t: the device a runtime runs on."""

    AUTO = 0  #: CUDA when built with it and a GPU is present, else simulated
    CUDA = 1
    SIM = 2  #: the deterministic simulated device (virtual time)
    HOST = 3  #: the real-time host device (CPU threads as streams)


class Policy(enum.IntEnum):
    """pfSchedulePolicy_t: which fill job gets the next bubble."""

    FIFO = 0
    PRIORITY = 1
    SHORTEST_REMAINING = 2
    FAIR_SHARE = 3


class LogLevel(enum.IntEnum):
    """pfLogLevel_t (PIPEFILL_DEBUG)."""

    OFF = 0
    ERROR = 1
    WARN = 2
    INFO = 3
    DEBUG = 4
    TRACE = 5


class BubbleKind(enum.IntEnum):
    """pfBubbleKind_t: where in the schedule a bubble is."""

    OTHER = 0
    WARMUP = 1  #: before a stage's first forward
    COOLDOWN = 2  #: waits during the backward drain
    DRAIN = 3  #: end of iteration before the gradient reduction
    OPTIMIZER = 4  #: data-parallel all-reduce / optimizer step


class JobKind(enum.IntEnum):
    """pfJobKind_t: how a fill job's items run."""

    TICKET = 0  #: items claimed by persistent gated blocks; overrun <= one item
    OPAQUE = 1  #: ungated work, admitted only when it fits the time left
    GRAPH = 2  #: one captured CUDA graph per item, gated before every item (jobs.GraphJob)


class JobStatus(enum.IntEnum):
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


_BACKEND_NAMES = {"auto": Backend.AUTO, "cuda": Backend.CUDA, "sim": Backend.SIM,
                  "host": Backend.HOST}
_POLICY_NAMES = {"fifo": Policy.FIFO, "priority": Policy.PRIORITY,
                 "srpt": Policy.SHORTEST_REMAINING, "fair": Policy.FAIR_SHARE}
_LOG_NAMES = {level.name.lower(): level for level in LogLevel}
_KIND_NAMES = {kind.name.lower(): kind for kind in BubbleKind}
