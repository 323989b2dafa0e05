"""Bubbles and fill slices in the user's own torch.profiler trace.

Bubbles: while a ``torch.profiler`` (Kineto) session is recording, every bubble a
:class:`Runtime` begins and ends on the calling thread is also a ``record_function`` range
named ``bubble <class key>`` (``#k`` for the k-th bubble of an iteration, or the bubble's
label): a ``user_annotation`` event in the exported Chrome trace, next to the user's own ops,
which ``pipefill-analyze`` reads as a bubble marker (names starting with ``bubble ``, as in
PipeFill's own trace).

Fill slices (host backend): each slice is a ``record_function`` range named
``fill slice <job name>`` on the thread of the fill stream that runs it, from when the slice
starts (its bubble began, before its first item) to when it ends (its last item done, which may
be one item past the bubble's end: the gate stops a slice between items). The runtime calls
:class:`SliceSpans` there (``pfRuntimeSetSliceObserver``), so the range has the slice's real
wall-clock times; ``pipefill-analyze`` reads ``fill slice`` ranges as the process's fill work.
Kineto records CPU ranges only on the threads its profiler covers: a plain
``torch.profiler.profile()`` covers the thread that started it (and torch's own worker threads),
not PipeFill's fill threads, so slices land only when the profiler records every thread::

    from torch._C._profiler import _ExperimentalConfig
    torch.profiler.profile(experimental_config=_ExperimentalConfig(profile_all_threads=True))

Without it the runtime warns once, saying so, and installs no observer. The simulated backend
runs slices in virtual time inside ``SimWorld.run_until_idle``, not during the real wait: they
have no wall-clock span to show (``Runtime.write_trace`` has them), and the runtime warns once.
On CUDA the fill kernels are in Kineto's GPU trace already (CUPTI; on the runtime's fill
streams, ``Runtime.fill_stream_handles()``): nothing is added.

When torch is not imported or no profiler is recording, this costs a dict lookup and an
attribute read per bubble; nothing here imports torch.
"""
from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, Dict, Optional

from ._enums import Backend

MARKER_PREFIX = "bubble "
"""The name prefix pipefill-analyze treats as a bubble marker (src/analysis/activity.hpp)."""

SLICE_PREFIX = "fill slice "
"""The name prefix pipefill-analyze treats as a fill slice (kFillSpanPrefix)."""

_SLICE_START = 0  # pfSliceStart


def _profiler_module(torch: Any) -> Optional[Any]:
    profiler = getattr(getattr(torch, "autograd", None), "profiler", None)
    if profiler is None or not getattr(profiler, "_is_profiler_enabled", False):
        return None
    return profiler


def open_range(class_key: str) -> Optional[Any]:
    """Enters a ``record_function`` range for the bubble when a torch profiler records; returns
    what :func:`close_range` needs, or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    profiler = _profiler_module(torch)
    if profiler is None:
        return None
    scope = profiler.record_function(MARKER_PREFIX + class_key)
    scope.__enter__()
    return scope


def close_range(scope: Optional[Any]) -> None:
    """Ends a range :func:`open_range` entered (None: nothing to do)."""
    if scope is not None:
        scope.__exit__(None, None, None)


def _records_every_thread(torch: Any) -> bool:
    """Whether the recording profiler covers every thread (``profile_all_threads``): then it
    keeps no profiler state on this thread, while a thread-local one does."""
    autograd = getattr(getattr(torch, "_C", None), "_autograd", None)
    profiler_type = getattr(autograd, "_profiler_type", None)
    if profiler_type is None:
        return False
    return getattr(profiler_type(), "name", "") == "NONE"


class SliceSpans:
    """The slice observer of one runtime: a ``fill slice <job>`` range per slice, entered and
    exited on the fill stream's thread (called there by the runtime, with the GIL).

    ``spans``: ranges entered so far. A slice start on a fill stream whose previous slice saw
    no end (a device error dropped it) first closes that range."""

    def __init__(self) -> None:
        self.spans = 0
        self._open: Dict[int, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, phase: int, job_name: str, bubble_id: int, fill_stream: int,
                 first_item: int, max_items: int) -> None:
        with self._lock:
            stale = self._open.pop(fill_stream, None)
        if stale is not None:
            stale.__exit__(None, None, None)
        if phase != _SLICE_START:
            return
        torch = sys.modules.get("torch")
        if torch is None:
            return
        scope = torch.autograd.profiler.record_function(SLICE_PREFIX + job_name)
        scope.__enter__()
        with self._lock:
            self._open[fill_stream] = scope
            self.spans += 1


class SliceTracking:
    """Per runtime: installs :class:`SliceSpans` as the runtime's slice observer while a profiler
    that covers every thread records (checked at each bubble begin, before the bubble's slices
    are launched), removes it when none does, and says once why slices cannot be shown
    (thread-local profiler, simulated backend) or that the observer failed."""

    def __init__(self, native: Any, backend: Backend) -> None:
        self._native = native
        self._backend = backend
        self.spans = SliceSpans()
        self.installed = False
        self._warned: set = set()

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=6)  # the user's bubble call

    def before_bubble(self) -> None:
        torch = sys.modules.get("torch")
        recording = torch is not None and _profiler_module(torch) is not None
        if not recording:
            if self.installed:
                self._native.set_slice_observer(None)
                self.installed = False
            return
        if self._backend == Backend.SIM:
            self._warn_once("sim", "pipefill: the simulated backend's fill slices run in virtual "
                            "time (inside SimWorld.run_until_idle), not during the real waits: "
                            "they are not put into the torch.profiler trace "
                            "(Runtime.write_trace has them)")
            return
        if self._backend != Backend.HOST:
            return  # CUDA: the fill kernels are in Kineto's GPU trace (CUPTI)
        if not _records_every_thread(torch):
            self._warn_once("thread-local", "pipefill: fill slices are not in this "
                            "torch.profiler trace: the profiler records only the thread that "
                            "started it, and slices run on PipeFill's fill threads; pass "
                            "experimental_config=torch._C._profiler._ExperimentalConfig("
                            "profile_all_threads=True) to torch.profiler.profile to have them "
                            "(bubbles are recorded either way)")
            if self.installed:
                self._native.set_slice_observer(None)
                self.installed = False
            return
        error = self._native.slice_observer_error()
        if error is not None:
            self._warn_once("error", "pipefill: the fill-slice profiler ranges stopped after an "
                            f"error in the slice observer: {error}")
            return
        if not self.installed:
            self._native.set_slice_observer(self.spans)
            self.installed = True


def before_bubble(runtime: Any) -> None:
    """Called by :class:`Runtime` before each bubble begin (the bubble's slices may be launched
    by the begin itself). Costs a dict lookup when torch is not imported."""
    tracking = runtime.__dict__.get("_slice_tracking")
    if tracking is None:
        if "torch" not in sys.modules:
            return
        tracking = SliceTracking(runtime._native, runtime.backend)
        runtime.__dict__["_slice_tracking"] = tracking
    tracking.before_bubble()
