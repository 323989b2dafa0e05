"""Security of the fill-job service: roles (a rank can only claim/renew/commit through the
service's functions; a submitter only creates, reads and cancels its own jobs) and the
allowlist (a job whose code is not the allowlisted (name, version, sha256) never loads)."""
from __future__ import annotations

import sys

import pytest

import pipefill as pf
from service_fixtures import run_in_process_rank


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
        rows = conn.execute("select job_id, shard, token from pipefill.pf_claim('r', 0, 1e9, 1)"
                            ).fetchall()
        assert len(rows) == 1 and rows[0][0] == job_id
        _, shard, token = rows[0]
        assert conn.execute("select pipefill.pf_renew(%s, %s, %s, NULL)",
                            (job_id, shard, token)).fetchone()[0] is True
        assert conn.execute("select pipefill.pf_renew(%s, %s, %s, NULL)",
                            (job_id, shard, token + 1000)).fetchone()[0] is False
        assert conn.execute("select pipefill.pf_release(%s, %s, %s, NULL)",
                            (job_id, shard, token)).fetchone()[0] is True
    with world.service("alice") as alice:
        assert alice.jobs(job_id)[0].state == "running"
        assert alice.cancel(job_id) is True


def test_submitter_role_cannot_claim_commit_or_touch_others_jobs(world):
    import psycopg
    job_id = submit_digest(world, "alice", "submitter-test")
    with raw(world, "bob") as conn:
        for sql, args in [
            ("select * from pipefill.pf_claim('b', 0, 1e9, 1)", ()),
            ("select pipefill.pf_commit(%s, 0, 1, '/x', repeat('0', 64), 1)", (job_id,)),
            ("select pipefill.pf_renew(%s, 0, 1, NULL)", (job_id,)),
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
