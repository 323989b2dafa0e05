"""Connections to the service's PostgreSQL database.

The connection string comes from ``PIPEFILL_SERVICE`` (or an argument) without its secret; the
password comes from ``PIPEFILL_SERVICE_PASSWORD`` or the file named by
``PIPEFILL_SERVICE_PASSWORD_FILE`` (or libpq's own PGPASSFILE). The secret is passed to libpq as
a separate keyword and never appears in a message, log line or exception this module raises:
:func:`describe` names only host, port, database and user.

:func:`reconnecting` retries a database call across a server restart with bounded exponential
backoff (bounded in attempts and in total time), so agents ride through a restart.
"""
from __future__ import annotations

import os
import pathlib
import random
import time
from typing import Any, Callable, Dict, Optional, TypeVar

from .._enums import Result
from .._errors import PipeFillError

T = TypeVar("T")

ENV_CONNECTION = "PIPEFILL_SERVICE"
ENV_PASSWORD = "PIPEFILL_SERVICE_PASSWORD"
ENV_PASSWORD_FILE = "PIPEFILL_SERVICE_PASSWORD_FILE"
SCHEMA_PATH = pathlib.Path(__file__).with_name("schema.sql")


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise PipeFillError(Result.NOT_SUPPORTED,
                            "pipefill.service needs psycopg 3: pip install 'psycopg[binary]'"
                            ) from error
    return psycopg


def _secret(password_file: Optional[str]) -> Optional[str]:
    path = password_file or os.environ.get(ENV_PASSWORD_FILE)
    if path:
        try:
            return pathlib.Path(path).read_text().strip()
        except OSError as error:
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"cannot read the service password file {path}: "
                                f"{error.strerror}") from None
    return os.environ.get(ENV_PASSWORD)


def connection_options(conninfo: Optional[str] = None, *,
                       password_file: Optional[str] = None) -> Dict[str, Any]:
    """The keyword arguments of psycopg.connect for ``conninfo`` (default: $PIPEFILL_SERVICE)."""
    conninfo = conninfo if conninfo is not None else os.environ.get(ENV_CONNECTION)
    if not conninfo:
        raise PipeFillError(Result.INVALID_ARGUMENT,
                            f"no service connection: set {ENV_CONNECTION} (a libpq connection "
                            "string without the password) or pass one")
    psycopg = _psycopg()
    try:
        options: Dict[str, Any] = dict(psycopg.conninfo.conninfo_to_dict(conninfo))
    except psycopg.ProgrammingError:
        raise PipeFillError(Result.INVALID_ARGUMENT,
                            f"{ENV_CONNECTION} is not a libpq connection string") from None
    if "password" in options:
        raise PipeFillError(Result.INVALID_ARGUMENT,
                            f"the service connection string holds a password: put it in "
                            f"{ENV_PASSWORD_FILE} or {ENV_PASSWORD} instead")
    secret = _secret(password_file)
    if secret:
        options["password"] = secret
    options.setdefault("connect_timeout", 5)
    options.setdefault("application_name", "pipefill")
    return options


def describe(options: Dict[str, Any]) -> str:
    """Where a connection goes, without its secret."""
    return ", ".join(f"{key}={options[key]}" for key in ("host", "port", "dbname", "user")
                     if key in options)


def connect(options: Dict[str, Any]) -> Any:
    """An autocommit connection (every service call is one statement, atomic by itself).

    No server-side prepared statements (``prepare_threshold=None``): behind PgBouncer in
    transaction pooling mode consecutive statements may run on different server connections,
    where a statement prepared on another one does not exist (or clashes by name). The service
    uses no other session state (no SET, advisory locks or LISTEN), so it runs through such a
    pooler unchanged (tests/python/service/test_service_pgbouncer.py)."""
    psycopg = _psycopg()
    try:
        return psycopg.connect(autocommit=True, prepare_threshold=None, **options)
    except psycopg.OperationalError as error:
        # libpq's text never holds the password, but say only what we know is safe.
        raise ConnectionLost(f"cannot connect to the service database ({describe(options)}): "
                             f"{str(error).splitlines()[0] if str(error) else 'no reason'}"
                             ) from None


class ConnectionLost(PipeFillError):
    """The database could not be reached within the reconnect budget."""

    def __init__(self, message: str) -> None:
        super().__init__(Result.TIMEOUT, message)


def is_connection_error(error: BaseException) -> bool:
    psycopg = _psycopg()
    return isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError, ConnectionLost))


def is_transient_error(error: BaseException) -> bool:
    """The server aborted the statement for a reason a retry clears: a deadlock or a
    serialization failure (the statement's transaction was rolled back: nothing happened)."""
    psycopg = _psycopg()
    return isinstance(error, (psycopg.errors.DeadlockDetected,
                              psycopg.errors.SerializationFailure))


class Reconnecting:
    """One connection that reconnects with bounded exponential backoff when a call loses it.

    ``budget_s`` bounds the total time one call spends reconnecting and ``max_attempts`` the
    tries; past either, :class:`ConnectionLost` is raised. A deadlock or serialization failure
    (the server rolled the statement back) is retried the same way, on the same connection.
    Only calls that are safe to repeat go through :meth:`call` (every pf_* function is: a
    repeated renew/commit/release with the same token and secret returns the same answer).
    """

    def __init__(self, options: Dict[str, Any], *, budget_s: float = 60.0,
                 max_attempts: int = 200, first_delay_s: float = 0.05,
                 max_delay_s: float = 2.0) -> None:
        self.options = options
        self.budget_s = budget_s
        self.max_attempts = max_attempts
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.reconnects = 0
        """Connections made after the first (a server restart or a dropped connection)."""
        self.transient = 0
        """Calls retried after a deadlock or serialization failure (rolled back by the server)."""
        self._connected_before = False
        self._conn: Any = None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def call(self, work: Callable[[Any], T]) -> T:
        deadline = time.monotonic() + self.budget_s
        delay = self.first_delay_s
        last = "no attempt"
        for attempt in range(self.max_attempts):
            try:
                if self._conn is None or self._conn.closed:
                    if self._connected_before:
                        self.reconnects += 1
                    self._conn = connect(self.options)
                    self._connected_before = True
                return work(self._conn)
            except Exception as error:  # noqa: BLE001 - only connection errors are retried
                if is_transient_error(error):
                    last = str(error).splitlines()[0] if str(error) else type(error).__name__
                    self.transient += 1
                elif is_connection_error(error):
                    last = str(error).splitlines()[0] if str(error) else type(error).__name__
                    self.close()
                else:
                    raise
            if time.monotonic() + delay > deadline:
                break
            time.sleep(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, self.max_delay_s)
        raise ConnectionLost(f"service database unreachable for {self.budget_s:.0f} s "
                             f"({describe(self.options)}): {last}")


def apply_schema(conn: Any) -> None:
    """Creates (or updates in place) the roles, tables, functions and policies."""
    conn.execute(SCHEMA_PATH.read_text())
