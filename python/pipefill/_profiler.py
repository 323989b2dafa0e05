"""Bubbles in the user's own torch.profiler trace.

While a ``torch.profiler`` (Kineto) session is recording, every bubble a :class:`Runtime`
begins and ends on the calling thread is also a ``record_function`` range named
``bubble <class key>`` (``#k`` for the k-th bubble of an iteration, or the bubble's label):
a ``user_annotation`` event in the exported Chrome trace, next to the user's own ops, which
``pipefill-analyze`` reads as a bubble marker (names starting with ``bubble ``, as in PipeFill's
own trace). When torch is not imported or no profiler is recording, this costs a dict lookup
and an attribute read per bubble; nothing here imports torch.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

MARKER_PREFIX = "bubble "
"""The name prefix pipefill-analyze treats as a bubble marker (src/analysis/activity.hpp)."""


def open_range(class_key: str) -> Optional[Any]:
    """Enters a ``record_function`` range for the bubble when a torch profiler records; returns
    what :func:`close_range` needs, or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    profiler = getattr(getattr(torch, "autograd", None), "profiler", None)
    if profiler is None or not getattr(profiler, "_is_profiler_enabled", False):
        return None
    scope = profiler.record_function(MARKER_PREFIX + class_key)
    scope.__enter__()
    return scope


def close_range(scope: Optional[Any]) -> None:
    """Ends a range :func:`open_range` entered (None: nothing to do)."""
    if scope is not None:
        scope.__exit__(None, None, None)
