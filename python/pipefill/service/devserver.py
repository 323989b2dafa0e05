"""A throwaway PostgreSQL server for tests, benchmarks and demos (never for production).

``TempPostgres`` runs initdb/pg_ctl from the machine's PostgreSQL (``/usr/lib/postgresql/*/bin``
or PATH) in a fresh folder, listening only on a Unix socket in that folder (no TCP). initdb
refuses to run as root, so under root the server runs as the unprivileged ``nobody`` user
(``runuser``), its folder owned by that user. The owner role ``pfadmin`` logs in by peer-less
``trust`` on the socket; every other role needs its scram-sha-256 password. ``close`` stops the
server (immediate) and deletes the folder; it is safe to call twice and from a finally/atexit.

``TempPgBouncer`` puts PgBouncer (``apt-get install pgbouncer``) in front of such a server in
transaction pooling mode, on a Unix socket of its own, for the tests and the benchmark that run
the service through it.
"""
from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from typing import Dict, List, Optional

from .._enums import Result
from .._errors import PipeFillError

OWNER = "pfadmin"
DATABASE = "pipefill"


def find_bin_dir() -> pathlib.Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if os.access(os.path.join(folder, "pg_ctl"), os.X_OK):
            return pathlib.Path(folder)
    found = shutil.which("pg_ctl")
    if found:
        return pathlib.Path(found).resolve().parent
    raise PipeFillError(Result.NOT_SUPPORTED, "no PostgreSQL server binaries (pg_ctl) found: "
                        "apt-get install postgresql")


class TempPostgres:
    def __init__(self, *, port: int = 5432, max_connections: int = 100) -> None:
        self.bin = find_bin_dir()
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="pipefill-pg-"))
        self.data = self.root / "data"
        self.port = port
        self.max_connections = max_connections
        self.as_nobody = os.geteuid() == 0
        self.running = False
        os.chmod(self.root, 0o755)
        if self.as_nobody:
            shutil.chown(self.root, user="nobody")

    def _run(self, args: List[str], timeout: float = 60.0) -> str:
        command = ([shutil.which("runuser") or "runuser", "-u", "nobody", "--"]
                   if self.as_nobody else []) + args
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              cwd=self.root)
        if done.returncode != 0:
            raise PipeFillError(Result.INTERNAL, f"{' '.join(args[:2])} failed "
                                f"({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done.stdout

    def start(self) -> "TempPostgres":
        if not self.data.exists():
            self._run([str(self.bin / "initdb"), "-D", str(self.data), "-U", OWNER, "-A",
                       "trust", "-E", "UTF8", "--no-sync"])
            (self.data / "pg_hba.conf").write_text(
                f"local all {OWNER} trust\nlocal all all scram-sha-256\n")
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write(f"listen_addresses = ''\nunix_socket_directories = '{self.root}'\n"
                           f"port = {self.port}\nmax_connections = {self.max_connections}\n"
                           "fsync = off\nshared_buffers = 32MB\n")
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l",
                   str(self.root / "server.log"), "-w", "-t", "60", "start"], timeout=90)
        self.running = True
        return self

    def stop(self, mode: str = "fast") -> None:
        if self.running:
            self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t",
                       "60", "stop"], timeout=90)
            self.running = False

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def conninfo(self, user: str = OWNER, dbname: str = DATABASE) -> str:
        return f"host={self.root} port={self.port} dbname={dbname} user={user}"

    def create_database(self) -> None:
        import psycopg
        with psycopg.connect(self.conninfo(dbname="postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")

    def create_login(self, user: str, role: str, password: str) -> pathlib.Path:
        """A login role that is a member of ``role``; returns a password file (0600)."""
        import psycopg
        from psycopg import sql
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                sql.Identifier(user), sql.Literal(password), sql.Identifier(role)))
        path = self.root / f"{user}.password"
        path.write_text(password)
        os.chmod(path, 0o600)
        return path

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return (self.root / "server.log").read_text()[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        try:
            self.stop("immediate")
        except (PipeFillError, subprocess.TimeoutExpired, OSError):
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "TempPostgres":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def find_pgbouncer() -> str:
    for candidate in (shutil.which("pgbouncer"), "/usr/sbin/pgbouncer"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise PipeFillError(Result.NOT_SUPPORTED, "no pgbouncer binary found: apt-get install "
                        "pgbouncer (scripts/install-deps.sh does)")


class TempPgBouncer:
    """PgBouncer in transaction pooling mode in front of a :class:`TempPostgres`.

    ``users`` maps login names to their passwords (PgBouncer's auth_file; it authenticates the
    clients with scram-sha-256 and logs in to the server as the same user). ``pool_size``
    bounds the server connections per (database, user) pair; ``max_client_conn`` the clients.
    PgBouncer refuses to run as root, so under root it runs as ``nobody`` like the server.
    """

    def __init__(self, pg: TempPostgres, users: Dict[str, str], *, port: int = 6432,
                 pool_size: int = 20, max_client_conn: int = 2000) -> None:
        self.binary = find_pgbouncer()
        self.pg = pg
        self.users = dict(users)
        self.port = port
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.root = pg.root / "pgbouncer"
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "TempPgBouncer":
        self.root.mkdir(exist_ok=True)
        for user, password in self.users.items():
            if '"' in user + password:
                raise PipeFillError(Result.INVALID_ARGUMENT, f"PgBouncer user {user!r}: a name "
                                    "or password with a double quote is not supported here")
        (self.root / "userlist.txt").write_text(
            "".join(f'"{u}" "{p}"\n' for u, p in self.users.items()))
        os.chmod(self.root / "userlist.txt", 0o600)
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"{DATABASE} = host={self.pg.root} port={self.pg.port} dbname={DATABASE}\n"
            "[pgbouncer]\n"
            "listen_addr =\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.root}\n"
            "auth_type = scram-sha-256\n"
            f"auth_file = {self.root / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_client_conn = {self.max_client_conn}\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
            "log_connections = 0\nlog_disconnections = 0\n")
        if os.geteuid() == 0:
            for path in [self.root] + list(self.root.iterdir()):
                shutil.chown(path, user="nobody")
        extra = {"user": "nobody"} if os.geteuid() == 0 else {}
        self.proc = subprocess.Popen([self.binary, str(self.root / "pgbouncer.ini")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     cwd=self.root, **extra)
        socket = self.root / f".s.PGSQL.{self.port}"
        deadline = time.monotonic() + 30
        while not socket.exists():
            if self.proc.poll() is not None:
                error = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise PipeFillError(Result.INTERNAL, f"pgbouncer exited ({self.proc.returncode})"
                                    f": {error.strip()[-2000:]} {self.log_tail(1000)}")
            if time.monotonic() > deadline:
                self.close()
                raise PipeFillError(Result.TIMEOUT, "pgbouncer did not open its socket in 30 s")
            time.sleep(0.02)
        return self

    def conninfo(self, user: str, dbname: str = DATABASE) -> str:
        return f"host={self.root} port={self.port} dbname={dbname} user={user}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return (self.root / "pgbouncer.log").read_text()[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def __enter__(self) -> "TempPgBouncer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def server_connections(pg: TempPostgres, user: Optional[str] = None) -> int:
    """Client backends of the server on the service database (of ``user`` when given), counted
    by the owner over its own connection (which is not counted)."""
    import psycopg
    with psycopg.connect(pg.conninfo(), autocommit=True) as conn:
        return int(conn.execute(
            "select count(*) from pg_stat_activity where datname = %s and backend_type = "
            "'client backend' and pid <> pg_backend_pid() and (%s::text is null or usename = %s)",
            (DATABASE, user, user)).fetchone()[0])
