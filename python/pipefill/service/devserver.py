"""A throwaway PostgreSQL server for tests, benchmarks and demos (never for production).

``TempPostgres`` runs initdb/pg_ctl from the machine's PostgreSQL (``/usr/lib/postgresql/*/bin``
or PATH) in a fresh folder, listening only on a Unix socket in that folder (no TCP). initdb
refuses to run as root, so under root the server runs as the unprivileged ``nobody`` user
(``runuser``), its folder owned by that user. The owner role ``pfadmin`` logs in by peer-less
``trust`` on the socket; every other role needs its scram-sha-256 password. ``close`` stops the
server (immediate) and deletes the folder; it is safe to call twice and from a finally/atexit.
"""
from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import List

from .. import PipeFillError, Result

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
