"""pipefill.torch._fill_capture: torch's settings around the capture of a graph fill job, and
the wait for its results (issue 33 items 1-3).

- **Matmul SM target** (item 1). cuBLASLt (and torch's CUTLASS kernels) size persistent GEMMs to
  the SM count they are given, by default the device's (132 on an H100/H200). Inside the fill
  partition (e.g. 112 SMs of a green context) the blocks beyond it run as a second wave - up to
  2x the item's time (pytorch#143988) - and a captured graph keeps that grid for its life. So the
  warm-up and the capture run with torch's matmul SM carve-out (``torch._C._set_sm_carveout_
  experimental``: SMs a matmul leaves out) set to ``device SMs - fill SMs``, then the previous
  value is put back, also when the step raises. The carve-out is process-global: a GEMM another
  thread (the trainer) launches *during* the capture is sized to the fill partition too; nested
  or concurrent captures share one setting, restored when the last one ends. A carve-out the
  caller set already is kept when it leaves out more. torch applies it to its cuBLASLt and
  CUTLASS GEMMs (pytorch#147966, torch >= 2.7); its plain cuBLAS path only since pytorch#183330
  (2026), and cuBLAS treats the target mainly as an input of its heuristics, so gpu-check's
  captured-GEMM step (with and without the target) measures what it changes.
- **Backward on the capturing thread** (item 2). Autograd runs the backward of CUDA tensors on
  its own per-device worker thread, where the fill context that
  :meth:`pipefill.Runtime.capture_context` pushed on the capturing thread is not current: those
  kernels would land in whatever context that thread has (the primary one), and the runtime
  refuses such a graph in green-context mode. With ``torch.autograd.set_multithreading_enabled
  (False)`` (thread-local) the engine runs every node on the calling thread, so a training step's
  backward kernels are launched with the fill context current, like its forward.
- **Waiting for results on the fill streams only** (item 3): ``torch.cuda.synchronize()`` would
  wait for every stream of the device - the trainer's included, and every green context's.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator, Optional, Tuple

import torch

from .._runtime import Runtime
from ._graph_contexts import DriverGraphReader

log = logging.getLogger("pipefill.torch")


# ---- item 1: torch's matmul SM carve-out ---------------------------------------------------

class _CarveoutState:
    """The process-global carve-out shared by the captures open now (torch has one setting)."""

    lock = threading.Lock()
    depth = 0                      # captures inside matmul_sm_target now
    previous: Optional[int] = None  # what the first of them found (restored by the last)
    changed = False                 # whether one of them set a carve-out


def _carveout_api() -> Optional[Tuple[Any, Any]]:
    get = getattr(torch._C, "_get_sm_carveout_experimental", None)
    set_ = getattr(torch._C, "_set_sm_carveout_experimental", None)
    if get is None or set_ is None:
        return None
    return get, set_


def carveout_for(fill_sms: Optional[int], device_sms: int,
                 previous: Optional[int]) -> Optional[int]:
    """The carve-out that sizes GEMMs to ``fill_sms`` of ``device_sms`` SMs, never smaller than a
    ``previous`` one; None when nothing is to be set (unknown or full-device partition)."""
    if fill_sms is None or device_sms <= 0 or fill_sms <= 0 or fill_sms >= device_sms:
        return None
    carveout = max(device_sms - fill_sms, previous or 0)
    if carveout >= device_sms or carveout == (previous or 0):
        return None
    return carveout


@contextlib.contextmanager
def matmul_sm_target(fill_sms: Optional[int], device_sms: int) -> Iterator[Optional[int]]:
    """Inside the block torch's matmuls target at most ``fill_sms`` SMs (the carve-out in force
    is yielded, None when none is); the caller's carve-out is back after it, also on an
    exception."""
    api = _carveout_api()
    if api is None:
        yield None
        return
    get, set_ = api
    with _CarveoutState.lock:
        if _CarveoutState.depth == 0:
            _CarveoutState.previous = get()
        carveout = carveout_for(fill_sms, device_sms, _CarveoutState.previous)
        current = get()
        if carveout is not None and (current is None or carveout > current):
            set_(carveout)
            _CarveoutState.changed = True
        _CarveoutState.depth += 1
        in_force = get()
    try:
        yield in_force
    finally:
        with _CarveoutState.lock:
            _CarveoutState.depth -= 1
            if _CarveoutState.depth == 0:
                if _CarveoutState.changed:
                    set_(_CarveoutState.previous)
                _CarveoutState.previous, _CarveoutState.changed = None, False


def fill_sm_count(runtime: Runtime, capture_handle: int, device_sms: int) -> Optional[int]:
    """The SMs fill work may use: those of the capture stream's context as the driver reports them
    (the green context's partition), at most the device's SMs less the runtime's reserved ones
    (grid-cap mode caps fill grids there; it is also the bound when the driver cannot be asked).
    None when neither is known."""
    bounds = []
    try:
        reserved = int(runtime.config.reserved_sms)
        if 0 <= reserved < device_sms:
            bounds.append(device_sms - reserved)
    except Exception:  # a runtime without a resolved config (a stand-in): the driver decides
        pass
    reader = DriverGraphReader.open()
    if reader is not None:
        try:
            sms = reader.context_sm_count(reader.stream_context(capture_handle))
        except OSError as error:  # the reserved-SMs bound stands
            log.info("the capture context's SMs are unknown: %s", error)
            sms = None
        if sms:
            bounds.append(sms)
    return min(bounds) if bounds else None


def device_sm_count(device: Any) -> int:
    """The device's SMs (torch's cached properties; 0 when torch cannot say: no carve-out)."""
    try:
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    except (RuntimeError, AssertionError, ValueError, TypeError) as error:
        log.info("no matmul SM target: the device's SM count is unknown (%s)", error)
        return 0


# ---- item 2: the backward on the capturing thread ------------------------------------------

def backward_on_this_thread() -> Any:
    """A context in which autograd runs every backward node on the calling thread (thread-local),
    so the fill context pushed there is current for the backward's kernels too."""
    return torch.autograd.set_multithreading_enabled(False)


@contextlib.contextmanager
def fill_capture_settings(runtime: Runtime, capture_handle: int, device: Any,
                          name: str) -> Iterator[Optional[int]]:
    """Items 1 and 2 together, around a graph fill job's warm-up and capture; yields the matmul
    carve-out in force (None: none set)."""
    device_sms = device_sm_count(device)
    fill_sms = fill_sm_count(runtime, capture_handle, device_sms)
    with matmul_sm_target(fill_sms, device_sms) as carveout, backward_on_this_thread():
        log.info("graph job '%s': captured with matmuls sized to %s of %d SMs (carve-out %s), "
                 "backward on the capturing thread", name,
                 fill_sms if fill_sms is not None else "all", device_sms, carveout)
        yield carveout


# ---- item 3: the results' wait -------------------------------------------------------------

def wait_for_fill_streams(runtime: Runtime) -> None:
    """Waits until the work queued on the runtime's fill streams ran (their writes are then
    visible to every later stream operation), and for nothing else."""
    device = runtime.config.device or 0
    for handle in runtime.fill_stream_handles():
        torch.cuda.ExternalStream(handle, device=device).synchronize()
