"""The seam through which the layers above the binding core join a runtime.

The binding core (_runtime, jobs, ...) never imports the adapters, ``pipefill.torch`` or
``pipefill.service``. A layer above that must act on every runtime - the fill-job service's
agent when ``PIPEFILL_SERVICE`` is set - registers a factory here from the package face
(``pipefill/__init__.py``); :class:`pipefill.Runtime` calls every factory when it is created and
keeps what they return:

- ``factory(runtime)`` returns an extension object, or None when it has nothing to do for this
  runtime (the factory decides cheaply, e.g. from the environment, and imports its layer only
  then);
- the runtime calls ``extension.on_iteration_end()`` after each ``iteration_end()`` and
  ``extension.close()`` first thing in ``close()`` (outside any bubble); neither may raise into
  the training job: an exception is warned and the extension dropped.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

Factory = Callable[[Any], Optional[Any]]

_lock = threading.Lock()
_factories: List[Tuple[str, Factory]] = []


def register_runtime_extension(name: str, factory: Factory) -> None:
    """Calls ``factory(runtime)`` for every runtime created from now on; ``name`` identifies
    the extension (``Runtime._extensions[name]``). Registering a name again replaces it."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_runtime_extension: name must be a non-empty str, not {name!r}")
    if not callable(factory):
        raise TypeError(f"register_runtime_extension: factory must be callable, not "
                        f"{type(factory).__name__}")
    with _lock:
        _factories[:] = [(n, f) for n, f in _factories if n != name]
        _factories.append((name, factory))


def start(runtime: Any) -> Dict[str, Any]:
    """The extensions of a new runtime, by name (a factory that returned None is left out)."""
    with _lock:
        factories = list(_factories)
    started: Dict[str, Any] = {}
    for name, factory in factories:
        extension = factory(runtime)
        if extension is not None:
            started[name] = extension
    return started


def call_each(extensions: Dict[str, Any], method: str) -> None:
    """extension.<method>() of each; one that raises is warned and dropped (never raised into
    the training job's iteration_end or close)."""
    for name, extension in list(extensions.items()):
        try:
            getattr(extension, method)()
        except Exception as error:  # noqa: BLE001 - an extension must not stop the trainer
            extensions.pop(name, None)
            warnings.warn(f"pipefill: the runtime extension {name!r} raised in {method}() and "
                          f"was dropped ({type(error).__name__}: {error})", RuntimeWarning,
                          stacklevel=3)
