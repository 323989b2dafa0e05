"""The simulated world (pfSim*): simulated GPUs on one virtual clock, for tests and notebooks.

Work enqueued on a world's streams runs in virtual time when the world runs
(:meth:`SimWorld.run_until_idle`), deterministically for a seed. Runtimes created with
``Config(backend="sim", sim_world=world, device=d)`` fill the bubbles of the main-job work
enqueued on the world's streams.
"""
from __future__ import annotations

from typing import Optional

from . import _pipefill


class SimWorld:
    """A set of simulated GPUs sharing one virtual clock (pfSimWorldCreate).

    Args:
        devices: number of simulated GPUs.
        sm_count: SMs per device (132: H100/H200).
        memory_bytes: memory per device.
        jitter: relative std-dev of kernel and item durations.
        interference: main-job kernels co-running with fill blocks are slowed by
            ``1 + interference * fill_sm_share``.
        seed: jitter seed.

    Closing (or leaving a ``with`` block) fails with ``Result.BUSY`` while runtimes are still
    attached; close them first.
    """

    def __init__(self, devices: int = 1, *, sm_count: int = 132, memory_bytes: int = 141 << 30,
                 jitter: float = 0.0, interference: float = 0.0, seed: int = 0) -> None:
        self._native = _pipefill.SimWorld(devices, sm_count, memory_bytes, float(jitter),
                                          float(interference), seed)

    @classmethod
    def _wrap(cls, native: "_pipefill.SimWorld") -> "SimWorld":
        world = cls.__new__(cls)
        world._native = native
        return world

    @property
    def handle(self) -> int:
        """The pfSimWorld_t as an integer."""
        return self._native.handle

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def owned(self) -> bool:
        """False for a runtime's private world (it closes with the runtime)."""
        return self._native.owned

    def close(self) -> None:
        """pfSimWorldDestroy. Idempotent; Result.BUSY while runtimes are attached."""
        self._native.close()

    def __enter__(self) -> "SimWorld":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stream(self, device: int = 0, priority: int = 0) -> "SimStream":
        """A main-job stream on ``device`` (priority as CUDA: lower is higher, 0 the lowest)."""
        return SimStream(self, self._native.stream_create(device, priority))

    def event(self) -> "SimEvent":
        """An event across the world's streams (a communication edge)."""
        return SimEvent(self, self._native.event_create())

    def run_until_idle(self) -> None:
        """Runs every enqueued operation (and the attached runtimes' fill work) to completion."""
        self._native.run_until_idle()

    def run_until(self, time_us: float) -> None:
        """Runs until virtual time ``time_us`` or idle, whichever is first."""
        self._native.run_until(float(time_us))

    @property
    def now(self) -> float:
        """Virtual time in microseconds."""
        return self._native.now()

    def set_memory_used(self, device: int, nbytes: int) -> None:
        """Device memory the simulated main job uses on ``device``."""
        self._native.set_memory_used(device, nbytes)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"handle=0x{self.handle:x}"
        return f"SimWorld({state})"


class SimStream:
    """A stream of a :class:`SimWorld` (pass it wherever a stream is expected)."""

    def __init__(self, world: SimWorld, handle: int) -> None:
        self.world = world
        self.handle = handle

    def launch_kernel(self, duration_us: float, sm_count: int) -> None:
        """A main-job kernel of ``duration_us`` that needs ``sm_count`` SMs (pfSimLaunchKernel)."""
        self.world._native.launch_kernel(self.handle, float(duration_us), sm_count)

    def delay(self, duration_us: float) -> None:
        """Occupies the stream without using SMs (pfSimStreamDelay)."""
        self.world._native.stream_delay(self.handle, float(duration_us))

    def record(self, event: "SimEvent") -> None:
        """Records ``event`` on this stream (pfSimEventRecord)."""
        self.world._native.event_record(event.handle, self.handle)

    def wait_event(self, event: "SimEvent", latency_us: float = 0.0, sm_count: int = 0) -> None:
        """Waits for the event's latest record plus ``latency_us``, keeping a communication
        kernel of ``sm_count`` SMs resident meanwhile (pfSimStreamWaitEvent)."""
        self.world._native.stream_wait_event(self.handle, event.handle, float(latency_us),
                                             sm_count)

    def close(self) -> None:
        """pfSimStreamDestroy (work already enqueued still runs)."""
        self.world._native.stream_destroy(self.handle)

    def __repr__(self) -> str:
        return f"SimStream(0x{self.handle:x})"


class SimEvent:
    """An event of a :class:`SimWorld`."""

    def __init__(self, world: SimWorld, handle: int) -> None:
        self.world = world
        self.handle = handle

    def record(self, stream: SimStream) -> None:
        self.world._native.event_record(self.handle, stream.handle)

    @property
    def time(self) -> Optional[float]:
        """Completion time of the latest record in microseconds (None while not completed)."""
        t = self.world._native.event_time(self.handle)
        return None if t < 0 else t

    def close(self) -> None:
        """pfSimEventDestroy."""
        self.world._native.event_destroy(self.handle)

    def __repr__(self) -> str:
        return f"SimEvent(0x{self.handle:x})"
