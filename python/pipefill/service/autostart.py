"""``PIPEFILL_SERVICE`` set: a :class:`pipefill.Runtime` joins the fill-job service by itself.

:class:`pipefill.Runtime` calls :func:`runtime_extension` (registered by the package face
through ``pipefill._extensions``; the binding core never imports the service) when it is created;
with ``PIPEFILL_SERVICE`` in the environment that starts an agent, whose job requests the runtime
serves after each ``iteration_end()`` and which it drains in ``close()``. The rank's name is
``PIPEFILL_SERVICE_RANK`` when set, else ``<host>-<pid>-<n>`` (n counts the runtimes of the
process); ``PIPEFILL_SERVICE_CAPACITY_INTERVAL_S`` sets how often it advertises its capacity
(default 0.5 s; raise it on a cluster). The password comes from ``PIPEFILL_SERVICE_PASSWORD_FILE`` / ``PIPEFILL_SERVICE_PASSWORD``
as for every service connection; log lines and warnings name host, port, database and user only.

A bad value (not a libpq connection string, a password inside it, psycopg missing, an unreadable
password file) is a RuntimeWarning naming the variable, and the runtime goes on without an
agent: a fill service must never stop a training job.
"""
from __future__ import annotations

import itertools
import logging
import os
import socket
import warnings
from typing import Any, Optional

from .._enums import Result
from .._errors import PipeFillError
from . import _db

ENV_RANK = "PIPEFILL_SERVICE_RANK"
# Seconds between the agent's capacity advertisements (one UPDATE each): the default suits one
# machine; at thousands of ranks it is the service's main write load (docs/service.md, Scale).
ENV_CAPACITY_INTERVAL = "PIPEFILL_SERVICE_CAPACITY_INTERVAL_S"
DEFAULT_CAPACITY_INTERVAL_S = 0.5
_log = logging.getLogger("pipefill")
_runtimes = itertools.count()


class RuntimeAgent:
    """The runtime extension (pipefill._extensions) holding a runtime's service agent."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def on_iteration_end(self) -> None:
        self.agent.on_iteration_end()

    def close(self) -> None:
        if not self.agent.drain():  # leases back to the service, its fill jobs closed
            _log.warning("pipefill: the fill-job service agent of rank %s did not stop within "
                         "30 s; closing the runtime anyway (its lease expires on the service)",
                         self.agent.rank)


def runtime_extension(runtime: Any) -> Optional[RuntimeAgent]:
    """The factory the package face registers: an agent for ``runtime`` when
    ``PIPEFILL_SERVICE`` is set (else None)."""
    agent = start_from_environment(runtime)
    return RuntimeAgent(agent) if agent is not None else None


def start_from_environment(runtime: Any) -> Optional[Any]:
    """The started :class:`pipefill.service.Agent` of ``runtime``, or None (warned) when
    ``PIPEFILL_SERVICE`` is unusable. Does nothing (None) when the variable is not set."""
    conninfo = os.environ.get(_db.ENV_CONNECTION)
    if conninfo is None:
        return None
    serial = next(_runtimes)
    try:
        if not conninfo.strip():
            raise PipeFillError(Result.INVALID_ARGUMENT, f"{_db.ENV_CONNECTION} is set but "
                                "empty (unset it, or give a libpq connection string)")
        options = _db.connection_options(conninfo)
        rank = os.environ.get(ENV_RANK) or f"{socket.gethostname()}-{os.getpid()}-{serial}"
        from .agent import Agent
        agent = Agent(runtime, rank, conninfo=conninfo,
                      capacity_interval_s=_capacity_interval_s()).start()
    except PipeFillError as error:
        warnings.warn(f"pipefill: {_db.ENV_CONNECTION} is set but this runtime did not join the "
                      f"fill-job service: {error.message}", RuntimeWarning, stacklevel=3)
        return None
    _log.info("pipefill: rank %s joined the fill-job service at %s (%s); its agent thread "
              "connects and claims work in the background", rank, _db.describe(options),
              _db.ENV_CONNECTION)
    return agent


def _capacity_interval_s() -> float:
    """PIPEFILL_SERVICE_CAPACITY_INTERVAL_S, or the default. A bad value is warned about (naming
    the variable and the value) and the default used: a tuning knob must not cost the rank its
    agent."""
    text = os.environ.get(ENV_CAPACITY_INTERVAL)
    if text is None:
        return DEFAULT_CAPACITY_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0.0 < value < float("inf")):
        warnings.warn(f"pipefill: {ENV_CAPACITY_INTERVAL}={text!r} is not a positive number of "
                      f"seconds; the agent advertises every {DEFAULT_CAPACITY_INTERVAL_S} s",
                      RuntimeWarning, stacklevel=4)
        return DEFAULT_CAPACITY_INTERVAL_S
    return value
