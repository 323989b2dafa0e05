"""Security of the fill-job service: roles (a rank can only claim/renew/commit through the
service's functions; a submitter only creates, reads and cancels its own jobs) and the
allowlist (a job whose code is not the allowlisted (name, version, sha256) never loads)."""
from __future__ import annotations

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
        rows = conn.execute("select job_id, shard, token from pipefill.pf_claim('r', 0, %s, 1)",
                            (ANY_CLASS,)).fetchall()
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
            ("select * from pipefill.pf_claim('b', 0, %s, 1)", (ANY_CLASS,)),
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


def test_a_stale_token_cannot_commit_or_renew_after_its_lease_was_taken(world):
    """Fencing at the database: rank A's lease expires, B claims the shard (newer token); A's
    renewal and commit are refused even though A never noticed, B's commit wins, and a retry
    of B's commit (a lost reply) is recognised instead of being refused."""
    import time
    job_id = submit_digest(world, "alice", "fencing", lease_ttl_s=0.3)
    with raw(world, "rank1") as a, raw(world, "rank1") as b:
        claim = ("select shard, token from pipefill.pf_claim(%s, 0, '" + ANY_CLASS
                 + "', 1) where job_id = %s")
        shard, stale = a.execute(claim, ("A", job_id)).fetchone()
        deadline = time.monotonic() + 10
        row = None
        while row is None or row[0] != shard:  # B gets the same shard once A's lease expired
            assert time.monotonic() < deadline, "the expired lease was never re-claimed"
            time.sleep(0.1)
            row = b.execute(claim, ("B", job_id)).fetchone()
        current = row[1]
        assert current > stale
        commit = "select pipefill.pf_commit(%s, %s, %s, %s, %s, 1)"
        assert a.execute("select pipefill.pf_renew(%s, %s, %s, NULL)",
                         (job_id, shard, stale)).fetchone()[0] is False
        assert a.execute(commit, (job_id, shard, stale, "/a", "a" * 64)).fetchone()[0] == "refused"
        assert b.execute(commit, (job_id, shard, current, "/b", "b" * 64)).fetchone()[0] == "won"
        assert b.execute(commit, (job_id, shard, current, "/b", "b" * 64)).fetchone()[0] == "won"
        assert a.execute(commit, (job_id, shard, stale, "/a", "a" * 64)).fetchone()[0] == "refused"
    with world.service("alice") as alice:
        row = [s for s in alice.shards(job_id) if s["shard"] == shard][0]
        outcomes = {x["token"]: x["outcome"] for x in alice.attempts(job_id)}
        assert alice.cancel(job_id) is True
    assert (row["state"], row["committed_token"], row["output_path"]) == ("committed", current,
                                                                          "/b")
    assert row["expirations"] == 1
    assert (outcomes[stale], outcomes[current]) == ("fenced", "committed")


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
