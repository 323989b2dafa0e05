"""Security of the fill-job service: roles (a rank can only claim/renew/commit through the
service's functions; a submitter only creates, reads and cancels its own jobs), leases that
cannot be guessed or borrowed (a random secret per lease, bound to the claiming login, refused
after expiry), rank names bound to their login, and the allowlist (a job whose code is not the
allowlisted (name, version, sha256) never loads; what is imported is the verified copy)."""
from __future__ import annotations

import json
import pathlib
import re
import sys

import pytest

import pipefill as pf
from service_fixtures import run_in_process_rank

# A capacity class every test job fits (pf_claim's classes argument).
ANY_CLASS = '[{"key": "any", "p10_us": 1e9, "per_iteration": 1}]'


def raw(world, user):
    import psycopg
    return psycopg.connect(world.conninfo(user), password=world.passwords[user].read_text(),
                           autocommit=True)


def submit_digest(world, user, name, **extra):
    from pipefill.service import JobSpec
    spec = JobSpec(name=name, dist_name="pfsvc-testjobs", entry_point="digest",
                   dataset="test://x", item_count=20, shard_items=5,
                   output_dir=str(world.out_root), params={"seed": 1, "item_cost_us": 100.0},
                   item_cost_us=100.0, **extra)
    with world.service(user) as service:
        return service.submit(spec)


def test_rank_role_cannot_create_read_or_cancel_jobs(world):
    import psycopg
    job_id = submit_digest(world, "alice", "role-test")
    denied = [
        ("insert into pipefill.jobs (name, dist_name, dist_version, dist_sha256, entry_point,"
         " dataset, item_count, shard_items, output_dir) values ('x', 'pfsvc-testjobs', '1.0',"
         " repeat('0', 64), 'digest', 'd', 1, 1, '/tmp')", ()),
        ("select count(*) from pipefill.jobs", ()),
        ("select count(*) from pipefill.shards", ()),
        ("select pipefill.pf_cancel(%s)", (job_id,)),
        ("update pipefill.shards set state = 'committed' where job_id = %s", (job_id,)),
        ("insert into pipefill.allowlist values ('evil', '1', repeat('a', 64))", ()),
    ]
    with raw(world, "rank1") as conn:
        for sql, args in denied:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql, args)
        # What it may do: claim (through the fencing function), renew, give back.
        rows = conn.execute("select job_id, shard, token, secret from pipefill.pf_claim('r', 0,"
                            " %s, 1) where shard >= 0", (ANY_CLASS,)).fetchall()
        assert len(rows) == 1 and rows[0][0] == job_id
        _, shard, token, secret = rows[0]
        assert conn.execute("select pipefill.pf_renew(%s, %s, %s, %s, NULL)",
                            (job_id, shard, token, secret)).fetchone()[0] is True
        assert conn.execute("select pipefill.pf_renew(%s, %s, %s, %s, NULL)",
                            (job_id, shard, token + 1000, secret)).fetchone()[0] is False
        assert conn.execute("select pipefill.pf_release(%s, %s, %s, %s, NULL)",
                            (job_id, shard, token, secret)).fetchone()[0] is True
    with world.service("alice") as alice:
        assert alice.jobs(job_id)[0].state == "running"
        assert alice.cancel(job_id) is True


def test_submitter_role_cannot_claim_commit_or_touch_others_jobs(world):
    import psycopg
    job_id = submit_digest(world, "alice", "submitter-test")
    with raw(world, "bob") as conn:
        for sql, args in [
            ("select * from pipefill.pf_claim('b', 0, %s, 1)", (ANY_CLASS,)),
            ("select pipefill.pf_commit(%s, 0, 1, NULL, '/x', repeat('0', 64), 1)", (job_id,)),
            ("select pipefill.pf_renew(%s, 0, 1, NULL, NULL)", (job_id,)),
            ("select pipefill.pf_fail(%s, 0, 1, NULL, 'x')", (job_id,)),
            ("select * from pipefill.rank_logins", ()),
            ("update pipefill.jobs set state = 'completed' where id = %s", (job_id,)),
            ("delete from pipefill.jobs where id = %s", (job_id,)),
            ("insert into pipefill.allowlist values ('evil', '1', repeat('a', 64))", ()),
        ]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql, args)
        # Row-level security: bob sees none of alice's rows, and cannot create a job as her.
        assert conn.execute("select count(*) from pipefill.jobs where id = %s",
                            (job_id,)).fetchone()[0] == 0
        assert conn.execute("select count(*) from pipefill.shards where job_id = %s",
                            (job_id,)).fetchone()[0] == 0
        assert conn.execute("select pipefill.pf_cancel(%s)", (job_id,)).fetchone()[0] is False
    with world.service("alice") as alice:
        assert alice.jobs(job_id)[0].state == "running"
        assert len(alice.shards(job_id)) == 4
        assert alice.cancel(job_id) is True


def test_a_job_whose_code_is_not_allowlisted_is_refused_at_submit(world):
    with world.service("alice") as alice:
        before = len(alice.jobs())
        for field, value in (("dist_sha256", "0" * 64), ("dist_version", "9.9")):
            with pytest.raises(pf.PipeFillError, match="is not allowlisted") as error:
                submit_digest(world, "alice", "refused", **{field: value})
            assert value in str(error.value) and "pfsvc-testjobs" in str(error.value)
        assert len(alice.jobs()) == before


def test_a_tampered_distribution_never_loads(world, tmp_path, monkeypatch):
    """Allowlisted as installed, then one file of it changes: every rank refuses it before
    importing anything, the job fails after its max_failures with the reason."""
    from pipefill.service import JobSpec
    marker = tmp_path / "marker"
    monkeypatch.setenv("PFSVC_MARKER", str(marker))
    with world.service("alice") as alice:
        job_id = alice.submit(JobSpec(
            name="tampered", dist_name="pfsvc-marker", entry_point="runner", dataset="d",
            item_count=4, shard_items=2, output_dir=str(world.out_root), max_failures=2))
    module = world.dist_files["marker"]
    module.write_text(module.read_text() + "\n# changed after installation\n")

    def failed():
        with world.service("alice") as alice:
            return alice.jobs(job_id)[0].state == "failed"

    agent, reached = run_in_process_rank(world, "inproc-tampered", failed, 30.0)
    assert reached and agent.error is None
    assert agent.counts.refused == 2 and agent.counts.committed == 0
    with world.service("alice") as alice:
        job = alice.jobs(job_id)[0]
    assert "modified after installation" in job.message
    assert "failed 2 times" in job.message
    assert not marker.exists()
    assert "pfsvc_marker" not in sys.modules


GUARDED_MODULE = '''"""Job code whose import must never run anything but this verified source."""
import os
import pathlib

SOURCE = "verified"
if os.environ.get("PFSVC_MARKER"):
    pathlib.Path(os.environ["PFSVC_MARKER"] + ".verified").write_text("verified source ran")


def runner(params):
    from pipefill.service import ItemRunner
    return ItemRunner(lambda item: b"%d verified\\n" % item, item_cost_us=100.0)
'''

TAMPERED_SOURCE = GUARDED_MODULE.replace(
    'SOURCE = "verified"',
    'SOURCE = "tampered"\nimport pathlib as _p, os as _o\n'
    '_p.Path(_o.environ["PFSVC_MARKER"]).write_text("tampered code ran")')


def install_guarded(world, module):
    """A fresh allowlisted distribution (its own module name: nothing of it imported yet)."""
    from service_fixtures import install_distribution
    dist = module.replace("_", "-")
    path = install_distribution(world.dists_root, dist, "1.0", module, GUARDED_MODULE,
                                {"runner": f"{module}:runner"})
    with world.service("pfadmin") as owner:
        owner.allow(dist)
    return dist, path


@pytest.mark.parametrize("tampering", ["changed file", "added module", "added subpackage"])
def test_tampered_code_is_refused_before_import(world, tmp_path, monkeypatch, tampering):
    """Allowlisted as installed, then a file of the package changes, or a module (or a
    subpackage) RECORD does not list is added beside it: verification refuses it, naming the
    file, before anything of the distribution is imported; a rank fails the job with that
    reason and no code of it ever ran."""
    from pipefill.service import CodeRefused, JobSpec, code
    module = "pfsvc_" + tampering.replace(" ", "_")
    dist, path = install_guarded(world, module)
    marker = tmp_path / "marker"
    monkeypatch.setenv("PFSVC_MARKER", str(marker))
    sha = code.distribution_sha256(dist)
    assert code.verify_distribution(dist, "1.0", sha).version == "1.0"  # intact: accepted
    if tampering == "changed file":
        path.write_text(TAMPERED_SOURCE)
        needle = f"{module}/__init__.py was modified after installation"
    elif tampering == "added module":
        (path.parent / "extra.py").write_text(TAMPERED_SOURCE)
        needle = f"{module}/extra.py is not listed in RECORD"
    else:
        (path.parent / "sub").mkdir()
        (path.parent / "sub" / "__init__.py").write_text(TAMPERED_SOURCE)
        needle = f"{module}/sub/__init__.py is not listed in RECORD"
    with pytest.raises(CodeRefused, match=re.escape(needle)):
        code.verify_distribution(dist, "1.0", sha)
    with world.service("alice") as alice:
        job_id = alice.submit(JobSpec(
            name=module, dist_name=dist, entry_point="runner", dataset="d", item_count=4,
            shard_items=2, output_dir=str(world.out_root), max_failures=2))

    def failed():
        with world.service("alice") as alice:
            return alice.jobs(job_id)[0].state == "failed"

    agent, reached = run_in_process_rank(world, f"inproc-{module}", failed, 30.0)
    assert reached and agent.error is None
    assert agent.counts.refused == 2 and agent.counts.committed == 0
    with world.service("alice") as alice:
        assert needle in alice.jobs(job_id)[0].message
    assert not marker.exists() and not pathlib.Path(str(marker) + ".verified").exists()
    assert module not in sys.modules


def test_a_tampered_bytecode_cache_never_runs(world, tmp_path, monkeypatch):
    """A .pyc beside an allowlisted module, holding other code but a header that matches the
    source (so a plain import loads it: checked in a subprocess), is never read by the
    service: the job's module is compiled from the verified copy's source, and the job
    completes with the verified code's output."""
    import importlib.util
    import os
    import subprocess
    from importlib._bootstrap_external import _code_to_timestamp_pyc
    from pipefill.service import JobSpec, code
    module = "pfsvc_bytecode"
    dist, path = install_guarded(world, module)
    stat = path.stat()
    tampered = compile(TAMPERED_SOURCE, str(path), "exec")
    cache = pathlib.Path(importlib.util.cache_from_source(str(path)))
    cache.parent.mkdir(exist_ok=True)
    cache.write_bytes(bytes(_code_to_timestamp_pyc(tampered, int(stat.st_mtime), stat.st_size)))
    # A plain import runs the tampered bytecode (what the service used to do).
    control = tmp_path / "control"
    env = dict(os.environ, PYTHONPATH=str(world.dists_root), PFSVC_MARKER=str(control))
    plain = subprocess.run([sys.executable, "-c", f"import {module}; print({module}.SOURCE)"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "tampered" and control.read_text() == "tampered code ran"
    # The service: verification passes (bytecode is not part of what it loads) and what
    # runs is the verified source.
    marker = tmp_path / "marker"
    monkeypatch.setenv("PFSVC_MARKER", str(marker))
    code.verify_distribution(dist, "1.0", code.distribution_sha256(dist))
    with world.service("alice") as alice:
        job_id = alice.submit(JobSpec(
            name=module, dist_name=dist, entry_point="runner", dataset="d", item_count=6,
            shard_items=3, output_dir=str(world.out_root), item_cost_us=100.0))

    def completed():
        with world.service("alice") as alice:
            return alice.jobs(job_id)[0].state == "completed"

    agent, reached = run_in_process_rank(world, f"inproc-{module}", completed, 60.0)
    assert reached and agent.error is None, agent.error
    assert not marker.exists()
    assert pathlib.Path(str(marker) + ".verified").read_text() == "verified source ran"
    assert sys.modules[module].SOURCE == "verified"
    assert not sys.modules[module].__file__.startswith(str(world.dists_root))
    manifest = json.loads((world.out_root / f"job-{job_id}" / "manifest.json").read_text())
    content = b"".join(pathlib.Path(s["path"]).read_bytes() for s in manifest["shards"])
    assert content == b"".join(b"%d verified\n" % i for i in range(6))
    # The service wrote no bytecode anywhere near the installed files (only the plain import's
    # cache, unchanged, is there).
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name]


def test_distribution_checks_name_the_mismatch(world):
    from pipefill.service import CodeRefused, distribution_sha256, verify_distribution
    sha = distribution_sha256("pfsvc-testjobs")
    assert verify_distribution("pfsvc-testjobs", "1.0", sha).version == "1.0"
    with pytest.raises(CodeRefused, match="is version 1.0, the job names 1.1"):
        verify_distribution("pfsvc-testjobs", "1.1", sha)
    with pytest.raises(CodeRefused, match=f"has sha256 {sha}, the job names {'f' * 64}"):
        verify_distribution("pfsvc-testjobs", "1.0", "f" * 64)
    with pytest.raises(CodeRefused, match="'no-such-dist' is not installed"):
        verify_distribution("no-such-dist", "1.0", sha)


def claim_one(conn, rank, job_id, **extra):
    """(shard, token, secret) of one lease of ``job_id`` claimed as ``rank`` (None if none)."""
    return conn.execute("select shard, token, secret from pipefill.pf_claim(%s, 0, %s, 1)"
                        " where job_id = %s and shard >= 0", (rank, ANY_CLASS, job_id)
                        ).fetchone()


def out_path(world, job_id, name):
    return f"{world.out_root}/job-{job_id}/{name}"


def lease_rows(world, job_id, shard, token):
    """The shard's row and its attempt's row, as the owner sees them."""
    with raw_owner(world) as conn:
        shard_row = conn.execute("select * from pipefill.shards where job_id = %s and shard = %s",
                                 (job_id, shard)).fetchone()
        attempt = conn.execute("select * from pipefill.attempts where token = %s",
                               (token,)).fetchone()
    return shard_row, attempt


def raw_owner(world):
    import psycopg
    return psycopg.connect(world.conninfo("pfadmin"), autocommit=True)


def test_a_stale_token_cannot_commit_or_renew_after_its_lease_was_taken(world):
    """Fencing at the database: rank A's lease expires, B claims the shard (newer token); A's
    renewal and commit are refused even though A never noticed, B's commit wins, and a retry
    of B's commit (a lost reply) is recognised instead of being refused."""
    import time
    job_id = submit_digest(world, "alice", "fencing", lease_ttl_s=2.0)
    with raw(world, "rank1") as a, raw(world, "rank1") as b:
        shard, stale, stale_secret = claim_one(a, "A", job_id)
        deadline = time.monotonic() + 30
        row = None
        while row is None or row[0] != shard:  # B gets the same shard once A's lease expired
            assert time.monotonic() < deadline, "the expired lease was never re-claimed"
            time.sleep(0.1)
            row = claim_one(b, "B", job_id)
        current, secret = row[1], row[2]
        assert current > stale and secret != stale_secret
        commit = "select pipefill.pf_commit(%s, %s, %s, %s, %s, %s, 1)"
        a_path, b_path = out_path(world, job_id, "a"), out_path(world, job_id, "b")
        assert a.execute("select pipefill.pf_renew(%s, %s, %s, %s, NULL)",
                         (job_id, shard, stale, stale_secret)).fetchone()[0] is False
        assert a.execute(commit, (job_id, shard, stale, stale_secret, a_path, "a" * 64)
                         ).fetchone()[0] == "refused"
        assert b.execute(commit, (job_id, shard, current, secret, b_path, "b" * 64)
                         ).fetchone()[0] == "won"
        assert b.execute(commit, (job_id, shard, current, secret, b_path, "b" * 64)
                         ).fetchone()[0] == "won"
        assert a.execute(commit, (job_id, shard, stale, stale_secret, a_path, "a" * 64)
                         ).fetchone()[0] == "refused"
    with world.service("alice") as alice:
        row = [s for s in alice.shards(job_id) if s["shard"] == shard][0]
        outcomes = {x["token"]: x["outcome"] for x in alice.attempts(job_id)}
        assert alice.cancel(job_id) is True
    assert (row["state"], row["committed_token"], row["output_path"]) == ("committed", current,
                                                                          b_path)
    assert row["expirations"] == 1
    assert (outcomes[stale], outcomes[current]) == ("fenced", "committed")


def test_a_lease_needs_its_secret_and_the_login_that_claimed_it(world):
    """Another rank login knowing the token (and even the secret), or the same login with a
    wrong or missing secret, can neither renew, commit, fail nor release the lease; a refused
    call changes nothing (shard and attempt rows as before). The holder, with its secret, can."""
    import hashlib
    job_id = submit_digest(world, "alice", "borrowed")
    with raw(world, "rank1") as holder, raw(world, "rank2") as other:
        shard, token, secret = claim_one(holder, "holder-1", job_id)
        assert len(secret) == 64 and int(secret, 16) >= 0
        before = lease_rows(world, job_id, shard, token)
        wrong = ("0" if secret[0] != "0" else "1") + secret[1:]
        path = out_path(world, job_id, f"shard-{shard}")
        calls = [
            ("select pipefill.pf_renew(%s, %s, %s, %s, NULL)", (), False),
            ("select pipefill.pf_commit(%s, %s, %s, %s, %s, %s, 1)", (path, "c" * 64),
             "refused"),
            ("select pipefill.pf_fail(%s, %s, %s, %s, 'borrowed')", (), False),
            ("select pipefill.pf_release(%s, %s, %s, %s, NULL)", (), False),
        ]
        attempts = [(other, secret), (other, wrong), (other, None), (holder, wrong),
                    (holder, None), (holder, ""), (holder, secret.upper()), (holder, "x" * 64)]
        for conn, guess in attempts:
            for sql, tail, refused in calls:
                got = conn.execute(sql, (job_id, shard, token, guess) + tail).fetchone()[0]
                assert got == refused, (sql, guess)
        assert lease_rows(world, job_id, shard, token) == before
        # Only the hash of the secret is stored; the holder's own calls work.
        with raw_owner(world) as owner:
            stored = owner.execute("select lease_secret_sha256, lease_login from pipefill.shards"
                                   " where job_id = %s and shard = %s", (job_id, shard)).fetchone()
            dump = owner.execute("select row_to_json(s)::text || row_to_json(a)::text from"
                                 " pipefill.shards s, pipefill.attempts a where s.job_id = %s"
                                 " and s.shard = %s and a.token = %s",
                                 (job_id, shard, token)).fetchone()[0]
        assert bytes(stored[0]) == hashlib.sha256(bytes.fromhex(secret)).digest()
        assert stored[1] == "rank1" and secret not in dump
        assert holder.execute("select pipefill.pf_renew(%s, %s, %s, %s, NULL)",
                              (job_id, shard, token, secret)).fetchone()[0] is True
        assert holder.execute("select pipefill.pf_commit(%s, %s, %s, %s, %s, %s, 1)",
                              (job_id, shard, token, secret, path, "c" * 64)
                              ).fetchone()[0] == "won"
        # A retry of the commit is recognised only with the same secret and login.
        assert other.execute("select pipefill.pf_commit(%s, %s, %s, %s, %s, %s, 1)",
                             (job_id, shard, token, secret, path, "c" * 64)
                             ).fetchone()[0] == "refused"
    with world.service("alice") as alice:
        assert alice.cancel(job_id) is True


def test_secrets_are_random_per_lease(world):
    """Every lease of a batch claim gets its own 256-bit secret (64 hex digits, no two
    alike)."""
    job_id = submit_digest(world, "alice", "secrets")
    with raw(world, "rank1") as conn:
        rows = conn.execute("select token, secret from pipefill.pf_claim('secrets-1', 0, %s, 4)"
                            " where job_id = %s", (ANY_CLASS, job_id)).fetchall()
    secrets = [r[1] for r in rows]
    assert len(rows) == 4 and len(set(secrets)) == 4
    assert all(len(s) == 64 and s == s.lower() for s in secrets)
    with world.service("alice") as alice:
        assert alice.cancel(job_id) is True


def test_a_replay_after_expiry_is_refused(world):
    """With its right token, secret and login, a lease whose TTL passed without a renewal can
    no longer be renewed, committed, failed or released, even before anyone re-claims it; and a
    committed lease's commit cannot be replayed with another output."""
    import time
    job_id = submit_digest(world, "alice", "replay", lease_ttl_s=0.5)
    with raw(world, "rank1") as conn, raw_owner(world) as owner:
        shard, token, secret = claim_one(conn, "replay-1", job_id)
        deadline = time.monotonic() + 30
        while not owner.execute("select lease_expires < now() from pipefill.shards where"
                                " job_id = %s and shard = %s", (job_id, shard)).fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        path = out_path(world, job_id, "late")
        assert conn.execute("select pipefill.pf_renew(%s, %s, %s, %s, NULL)",
                            (job_id, shard, token, secret)).fetchone()[0] is False
        assert conn.execute("select pipefill.pf_commit(%s, %s, %s, %s, %s, %s, 1)",
                            (job_id, shard, token, secret, path, "d" * 64)
                            ).fetchone()[0] == "refused"
        assert conn.execute("select pipefill.pf_fail(%s, %s, %s, %s, 'late')",
                            (job_id, shard, token, secret)).fetchone()[0] is False
        assert conn.execute("select pipefill.pf_release(%s, %s, %s, %s, NULL)",
                            (job_id, shard, token, secret)).fetchone()[0] is False
        state = owner.execute("select state, committed_token, failures, preemptions from"
                              " pipefill.shards where job_id = %s and shard = %s",
                              (job_id, shard)).fetchone()
        assert state[0] in ("leased", "pending") and state[1:] == (None, 0, 0)
        # A lease that committed: replaying its commit with another output is refused.
        other, token2, secret2 = claim_one(conn, "replay-1", job_id)
        first = out_path(world, job_id, "first")
        commit = "select pipefill.pf_commit(%s, %s, %s, %s, %s, %s, 1)"
        assert conn.execute(commit, (job_id, other, token2, secret2, first, "e" * 64)
                            ).fetchone()[0] == "won"
        assert conn.execute(commit, (job_id, other, token2, secret2,
                                     out_path(world, job_id, "second"), "f" * 64)
                            ).fetchone()[0] == "refused"
        assert owner.execute("select output_path, output_sha256 from pipefill.shards where"
                             " job_id = %s and shard = %s", (job_id, other)).fetchone() == (
            first, "e" * 64)
    with world.service("alice") as alice:
        assert alice.cancel(job_id) is True


def test_rank_names_are_bound_to_their_login(world):
    """The first login to advertise or claim with a rank name owns it: another login using the
    name is refused (claims and advertisements alike), its own names work."""
    import psycopg
    with raw(world, "rank1") as a, raw(world, "rank2") as b:
        a.execute("select pipefill.pf_advertise('pool-a-0', 0, %s, 1.0, 0, 0, 0)", (ANY_CLASS,))
        a.execute("select * from pipefill.pf_claim('pool-a-1', 0, %s, 1)", (ANY_CLASS,))
        for sql in ("select * from pipefill.pf_claim('pool-a-0', 0, %s, 1)",
                    "select pipefill.pf_advertise('pool-a-0', 0, %s, 1.0, 0, 0, 0)",
                    "select * from pipefill.pf_claim('pool-a-1', 0, %s, 1)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege,
                               match="rank name '.*' is registered by another login than rank2"):
                b.execute(sql, (ANY_CLASS,))
        b.execute("select pipefill.pf_advertise('pool-b-0', 0, %s, 1.0, 0, 0, 0)", (ANY_CLASS,))
        for bad in ("", "x" * 201):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be 1..200"):
                b.execute("select * from pipefill.pf_claim(%s, 0, %s, 1)", (bad, ANY_CLASS))
    with world.service("alice") as alice:
        logins = {r["rank"]: r for r in alice.ranks()}
    assert "pool-a-0" in logins and "pool-b-0" in logins
    with raw_owner(world) as owner:
        bound = dict(owner.execute("select rank, login from pipefill.rank_logins where rank like"
                                   " 'pool-%'").fetchall())
        advertised = dict(owner.execute("select rank, login from pipefill.ranks where rank like"
                                        " 'pool-%'").fetchall())
    assert bound == {"pool-a-0": "rank1", "pool-a-1": "rank1", "pool-b-0": "rank2"}
    assert advertised == {"pool-a-0": "rank1", "pool-b-0": "rank2"}


def test_two_last_commits_at_once_still_complete_the_job(world):
    """The job's last two shards commit in overlapping transactions: each still sees the
    other's shard leased, so neither completes the job. The claim sweep does (within 250 ms of
    the next claim) and hands the manifest to that claimer (a row with shard -1)."""
    import time
    import psycopg
    job_id = submit_digest(world, "alice", "race")  # 4 shards
    with raw(world, "rank1") as a, psycopg.connect(
            world.conninfo("rank1"), password=world.passwords["rank1"].read_text()) as x, \
            psycopg.connect(world.conninfo("rank1"),
                            password=world.passwords["rank1"].read_text()) as y:
        leases = [claim_one(a, "race-1", job_id) for _ in range(4)]
        commit = "select pipefill.pf_commit(%s, %s, %s, %s, %s, %s, 1)"
        for shard, token, secret in leases[:2]:
            assert a.execute(commit, (job_id, shard, token, secret,
                                      out_path(world, job_id, f"s{shard}"), "a" * 64)
                             ).fetchone()[0] == "won"
        # x and y are not autocommit: each commit stays uncommitted until conn.commit().
        outcomes = []
        for conn, (shard, token, secret) in ((x, leases[2]), (y, leases[3])):
            outcomes.append(conn.execute(commit, (job_id, shard, token, secret,
                                                  out_path(world, job_id, f"s{shard}"), "a" * 64)
                                         ).fetchone()[0])
        x.commit()
        y.commit()
        assert outcomes == ["won", "won"]
        with world.service("alice") as alice:
            assert alice.jobs(job_id)[0].state == "running"
        deadline = time.monotonic() + 30
        swept = []
        while not swept:
            assert time.monotonic() < deadline, "the sweep never completed the job"
            swept = a.execute("select job_id, output_dir from pipefill.pf_claim('race-1', 0, %s,"
                              " 1) where shard = -1", (ANY_CLASS,)).fetchall()
            time.sleep(0.05)
        assert swept == [(job_id, str(world.out_root))]
    with world.service("alice") as alice:
        assert alice.jobs(job_id)[0].state == "completed"


def test_claims_take_only_shards_that_fit_the_rank(world):
    """pf_claim filters by the job's memory need against the rank's free bytes and its item
    duration against the p10 of each of the rank's bubble classes (one class that occurs in
    iterations and is long enough suffices); a second claimer gets only what the first did not
    lease (concurrent claimers: the fault-injection test and the benchmark's 16 processes)."""
    import json
    from pipefill.service import JobSpec
    with world.service("alice") as alice:
        job_id = alice.submit(JobSpec(
            name="fit", dist_name="pfsvc-testjobs", entry_point="digest", dataset="d",
            item_count=6, shard_items=1, output_dir=str(world.out_root),
            memory_bytes=1 << 20, item_cost_us=500.0))

    def classes(*pairs):
        return json.dumps([{"key": f"#{i}", "p10_us": p10, "per_iteration": n}
                           for i, (p10, n) in enumerate(pairs)])

    claim = ("select shard from pipefill.pf_claim(%s, %s, %s, %s) where job_id = %s")
    with raw(world, "rank1") as a, raw(world, "rank1") as b:
        roomy = classes((1e6, 1.0))
        assert a.execute(claim, ("small-memory", (1 << 20) - 1, roomy, 3, job_id)).fetchall() == []
        assert a.execute(claim, ("short-bubbles", 1 << 30, classes((499.0, 1.0), (200.0, 3.0)),
                                 3, job_id)).fetchall() == []
        assert a.execute(claim, ("no-classes", 1 << 30, "[]", 3, job_id)).fetchall() == []
        # A long class that never occurs (0 per iteration) does not count.
        assert a.execute(claim, ("never-occurs", 1 << 30, classes((900.0, 0.0)), 3,
                                 job_id)).fetchall() == []
        first = [r[0] for r in a.execute(claim, ("fits-a", 1 << 20,
                                                 classes((100.0, 4.0), (500.0, 1.0)), 3, job_id))]
        second = [r[0] for r in b.execute(claim, ("fits-b", 1 << 30, classes((900.0, 0.5)), 5,
                                                  job_id))]
        assert sorted(first) == [0, 1, 2] and sorted(second) == [3, 4, 5]
        import psycopg
        with pytest.raises(psycopg.errors.RaiseException, match="claim limit 0 is outside"):
            a.execute(claim, ("bad", 0, roomy, 0, job_id))
        with pytest.raises(psycopg.errors.RaiseException, match="must be a JSON array"):
            a.execute(claim, ("bad", 0, '{"p10_us": 5}', 1, job_id))
        with pytest.raises(psycopg.errors.RaiseException, match="needs numbers p10_us >= 0"):
            a.execute(claim, ("bad", 0, '[{"p10_us": "long"}]', 1, job_id))
        with pytest.raises(psycopg.errors.RaiseException, match="needs numbers p10_us >= 0"):
            a.execute("select pipefill.pf_advertise('bad', 0, %s, 1.0, 0, 0, 0)",
                      ('[{"p10_us": 5, "per_iteration": -1}]',))
    with world.service("alice") as alice:
        assert alice.cancel(job_id) is True
