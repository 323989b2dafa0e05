"""Fixtures of the service tests: one throwaway PostgreSQL per test module (a Unix socket in a
temp folder, run as `nobody` under root), the schema, login roles, and the test distributions.

Without psycopg or PostgreSQL binaries the tests skip, unless PIPEFILL_REQUIRE_SERVICE=1 (set by
scripts/test.sh) makes that a failure. The server and its folder are removed even on failure.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from service_fixtures import install_test_distributions  # noqa: E402


def _unavailable(message: str) -> None:
    if os.environ.get("PIPEFILL_REQUIRE_SERVICE") == "1":
        pytest.fail(message)
    pytest.skip(message)


class ServiceWorld:
    """The server, its connection strings, password files and the distributions' folder."""

    def __init__(self, pg, dists_root: pathlib.Path, dist_files, out_root: pathlib.Path):
        self.pg = pg
        self.dists_root = dists_root
        self.dist_files = dist_files
        self.out_root = out_root
        self.passwords = {}

    def conninfo(self, user: str) -> str:
        return self.pg.conninfo(user)

    def service(self, user: str):
        from pipefill.service import Service
        return Service(self.conninfo(user), password_file=str(self.passwords.get(user))
                       if user in self.passwords else None)

    def rank_env(self, user: str = "rank1") -> dict:
        env = dict(os.environ)
        env["PIPEFILL_SERVICE"] = self.conninfo(user)
        env["PIPEFILL_SERVICE_PASSWORD_FILE"] = str(self.passwords[user])
        env.pop("PIPEFILL_SERVICE_PASSWORD", None)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.dists_root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        return env


@pytest.fixture(scope="module")
def world():
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg 3 is not installed (pip install 'psycopg[binary]')")
    from pipefill import PipeFillError
    from pipefill.service.devserver import TempPostgres, find_bin_dir
    try:
        find_bin_dir()
    except PipeFillError as error:
        _unavailable(error.message)
    pg = TempPostgres()
    # Outputs and distributions live where the rank processes (and, as root, nothing else) can
    # reach them; removed at the end like the server.
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="pipefill-svc-"))
    try:
        pg.start()
        pg.create_database()
        dists_root = scratch / "site"
        dist_files = install_test_distributions(dists_root)
        sys.path.insert(0, str(dists_root))
        w = ServiceWorld(pg, dists_root, dist_files, scratch / "out")
        w.out_root.mkdir()
        with w.service("pfadmin") as owner:
            owner.init_schema()
            owner.init_schema()  # idempotent: a second run changes nothing and does not fail
            owner.allow("pfsvc-testjobs")
            owner.allow("pfsvc-marker")
            owner.allow("pfsvc-torchjobs")
        for user, role in (("alice", "pf_submitter"), ("bob", "pf_submitter"),
                           ("rank1", "pf_rank"), ("rank2", "pf_rank")):
            w.passwords[user] = pg.create_login(user, role, f"secret-{user}-7f3a")
        yield w
    finally:
        if str(scratch / "site") in sys.path:
            sys.path.remove(str(scratch / "site"))
        pg.close()
        shutil.rmtree(scratch, ignore_errors=True)
