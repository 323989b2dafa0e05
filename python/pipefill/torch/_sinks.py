"""pipefill.torch._sinks: where inference_job's outputs go, in item order - a callable, a folder of
``<index>.npy`` / ``.npz`` files (each written atomically; one live job per folder), or the rows of
a numpy memmap.
"""
from __future__ import annotations

import os
import pathlib
import threading
import weakref
from typing import Any, Callable

import torch

from ._job_common import PathLike, _check_writable, _describe, _write_atomically

# ---- sinks --------------------------------------------------------------------------------

_FOLDERS_IN_USE: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
"""Resolved sink folder -> the live job writing it (in this process)."""
_FOLDERS_LOCK = threading.Lock()


class _FolderSink:
    """One ``<index>.npy`` per item (12 digits, so that a sorted listing is item order), each
    written atomically: rewriting an item after a resume replaces it, so the folder holds each
    item exactly once. A module that returns a dict, tuple or list: ``<index>.npz`` with one
    array per key (``"0"``, ``"1"``, ... for a tuple). The folder belongs to one job: while
    another job of this process that has not finished writes it, it is refused (the folder holds
    nothing but the items' files, so other processes' jobs are not seen)."""

    def __init__(self, folder: PathLike, job: Any) -> None:
        self.folder = pathlib.Path(folder)
        _check_writable(self.folder / "sink", "sink folder")
        key = os.path.realpath(self.folder)
        with _FOLDERS_LOCK:
            other = _FOLDERS_IN_USE.get(key)
            if other is not None and other is not job and not other._finished_or_closed():
                raise ValueError(f"inference_job: sink folder {os.fspath(folder)!r} is already "
                                 f"written by job {other.name!r} (live in this process): give "
                                 "each job a folder of its own")
            _FOLDERS_IN_USE[key] = job

    def __call__(self, index: int, output: Any) -> None:
        import numpy as np
        if isinstance(output, torch.Tensor):
            array = output.detach().cpu().numpy()
            _write_atomically(self.folder / f"{index:012d}.npy", lambda f: np.save(f, array),
                              True)
            return
        arrays = _named_arrays(index, output)
        _write_atomically(self.folder / f"{index:012d}.npz", lambda f: np.savez(f, **arrays),
                          True)


def _named_arrays(index: int, output: Any) -> dict:
    items = output.items() if isinstance(output, dict) else enumerate(output) \
        if isinstance(output, (tuple, list)) else None
    if items is None:
        raise TypeError(f"item {index}: the module returned {_describe(output)}; a folder sink "
                        "writes a tensor, or a dict / tuple / list of tensors")
    return {str(k): torch.as_tensor(v).detach().cpu().numpy() for k, v in items}


class _MemmapSink:
    """Rows of a numpy memmap: item i's output goes to rows [i*batch_size, i*batch_size + n)."""

    def __init__(self, memmap: Any, batch_size: int) -> None:
        self.memmap = memmap
        self.batch_size = batch_size

    def __call__(self, index: int, output: "torch.Tensor") -> None:
        array = output.detach().cpu().numpy()
        first = index * self.batch_size
        if first + array.shape[0] > self.memmap.shape[0] or array.shape[1:] != self.memmap.shape[1:]:
            raise ValueError(f"item {index}: output of shape {tuple(array.shape)} does not fit the "
                             f"memmap of shape {tuple(self.memmap.shape)} at row {first}")
        self.memmap[first:first + array.shape[0]] = array
        self.memmap.flush()  # durable before the progress file says so


def _make_sink(sink: Any, batch_size: int, job: Any,
               output: Any = None) -> Callable[[int, "torch.Tensor"], None]:
    """The sink; ``output``: what the module returned for the first batch (checked against it)."""
    try:
        import numpy as np
        if isinstance(sink, np.memmap):
            if output is not None and not isinstance(output, torch.Tensor):
                raise TypeError(f"inference_job: sink is a numpy memmap, which holds one tensor "
                                f"per item, but the module returns {_describe(output)}: use a "
                                "folder or a callable sink")
            return _MemmapSink(sink, batch_size)
    except ImportError:  # pragma: no cover - numpy comes with torch
        pass
    if isinstance(sink, (str, os.PathLike)):
        return _FolderSink(sink, job)
    if callable(sink):
        return sink
    raise TypeError(f"sink {sink!r} is neither a callable, a folder path nor a numpy memmap")
