"""The fill-job service end to end in one process: submit, one rank's agent fills its bubbles
with the shards, the manifest lists one verified output per shard whose records are the job's
real results; status and cancel; the connection secret never shows in a message."""
from __future__ import annotations

import json
import pathlib

import pytest

import pipefill as pf
from service_fixtures import expected_record, run_in_process_rank


def digest_job(world, name, items, shard_items, **extra):
    from pipefill.service import JobSpec
    params = {"seed": name, "item_cost_us": 100.0, "checkpoint_items": 3}
    return JobSpec(name=name, dist_name="pfsvc-testjobs", entry_point="digest",
                   dataset=f"test://{name}", item_count=items, shard_items=shard_items,
                   output_dir=str(world.out_root), params=params, item_cost_us=100.0,
                   lease_ttl_s=10.0, **extra)


def job_state(world, job_id):
    with world.service("alice") as alice:
        return alice.jobs(job_id)[0].state


def test_one_rank_runs_every_shard_once_and_exports_a_verified_manifest(world):
    from pipefill.service import verify_manifest
    with world.service("alice") as alice:
        job_id = alice.submit(digest_job(world, "basic", items=57, shard_items=10))
        before = alice.jobs(job_id)[0]
    assert (before.state, before.shards, before.committed) == ("running", 6, 0)
    agent, reached = run_in_process_rank(world, "inproc-basic",
                                         lambda: job_state(world, job_id) == "completed", 60.0)
    assert reached, f"job not completed; agent error: {agent.error}"
    assert agent.error is None
    assert (agent.counts.committed, agent.counts.fenced, agent.counts.failed) == (6, 0, 0)
    assert agent.counts.manifests == 1
    manifest_path = world.out_root / f"job-{job_id}" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert [s["shard"] for s in manifest["shards"]] == list(range(6))
    assert [tuple(s["items"]) for s in manifest["shards"]] == [
        (0, 10), (10, 20), (20, 30), (30, 40), (40, 50), (50, 57)]
    assert verify_manifest(manifest_path) == []
    content = b"".join(pathlib.Path(s["path"]).read_bytes() for s in manifest["shards"])
    assert content == b"".join(expected_record("basic", i) for i in range(57))
    # Nothing but the canonical outputs and the manifest is left in the job's folder.
    names = sorted(p.name for p in (world.out_root / f"job-{job_id}").iterdir())
    assert names == sorted(["manifest.json"] + [pathlib.Path(s["path"]).name
                                                for s in manifest["shards"]])
    with world.service("alice") as alice:
        progress = alice.jobs(job_id)[0]
        attempts = alice.attempts(job_id)
        ranks = {r["rank"]: r for r in alice.ranks()}
        assert alice.export_manifest(job_id) == manifest_path  # the submitter can re-export
    assert (progress.state, progress.committed, progress.failures) == ("completed", 6, 0)
    assert sorted(a["outcome"] for a in attempts) == ["committed"] * 6
    # Capacity advertised from the runtime's measured bubbles (2000 µs each, one per iteration).
    # (Oversleeping under load only lengthens a host-device bubble, so only the floor is tight.)
    assert 1800.0 <= ranks["inproc-basic"]["bubble_p10_us"] < 20000.0
    # Sampled between a bubble's end and its iteration_end, a 0.5 s window can count one bubble
    # more or less than iterations (about 200 of each).
    assert ranks["inproc-basic"]["bubbles_per_iteration"] == pytest.approx(1.0, abs=0.05)


def test_cancel_stops_a_job_and_only_its_owner_can(world):
    with world.service("alice") as alice, world.service("bob") as bob:
        job_id = alice.submit(digest_job(world, "to-cancel", items=100, shard_items=10))
        assert bob.jobs(job_id) == []              # row-level security: not bob's
        assert bob.cancel(job_id) is False
        assert alice.jobs(job_id)[0].state == "running"
        assert alice.cancel(job_id) is True
        assert alice.cancel(job_id) is False       # no longer running
        progress = alice.jobs(job_id)[0]
        assert progress.state == "cancelled" and progress.pending == 0
        assert {s["state"] for s in alice.shards(job_id)} == {"cancelled"}
    # A rank finds nothing to claim in a cancelled job.
    agent, _ = run_in_process_rank(world, "inproc-cancel", lambda: False, 1.5)
    assert agent.counts.claimed == 0 and agent.error is None


def test_the_connection_secret_never_appears_in_errors(world, tmp_path):
    from pipefill.service import Service
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-secret-91c2")
    with pytest.raises(pf.PipeFillError) as error:
        Service(world.conninfo("alice"), password_file=str(wrong))
    assert "not-the-secret-91c2" not in str(error.value)
    assert "user=alice" in str(error.value)
    with pytest.raises(pf.PipeFillError, match="holds a password") as error:
        Service(world.conninfo("alice") + " password=inline-secret-55")
    assert "inline-secret-55" not in str(error.value)
    with pytest.raises(pf.PipeFillError, match="cannot read the service password file"):
        Service(world.conninfo("alice"), password_file=str(tmp_path / "missing"))


def test_cli_submit_status_cancel(world, tmp_path):
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "pipefill.service.cli", *args],
                              env=world.rank_env("alice"), capture_output=True, text=True,
                              timeout=60)

    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({
        "name": "cli-job", "dist_name": "pfsvc-testjobs", "entry_point": "digest",
        "dataset": "test://cli", "item_count": 30, "shard_items": 7,
        "output_dir": str(world.out_root), "params": {"seed": 3, "item_cost_us": 100.0},
        "priority": 2, "deadline": "2030-01-01T00:00:00+00:00"}))
    done = cli("submit", str(job_file))
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout.strip())
    done = cli("status", str(job_id))
    assert done.returncode == 0, done.stderr
    line = [row for row in done.stdout.splitlines() if row.split()[:1] == [str(job_id)]][0]
    assert line.split()[1:5] == ["cli-job", "running", "5", "0"]
    assert cli("cancel", str(job_id)).returncode == 0
    again = cli("cancel", str(job_id))
    assert again.returncode == 1
    assert f"job {job_id} is cancelled, not a running job of yours" in again.stderr
    assert "cancelled" in cli("status", str(job_id)).stdout
    job_file.write_text(json.dumps({
        "name": "bad", "dist_name": "pfsvc-testjobs", "dist_sha256": "1" * 64,
        "entry_point": "digest", "dataset": "d", "item_count": 1, "shard_items": 1,
        "output_dir": str(world.out_root)}))
    refused = cli("submit", str(job_file))
    assert refused.returncode == 1 and "is not allowlisted" in refused.stderr
    job_file.write_text(json.dumps({"name": "x", "colour": "red"}))
    unknown = cli("submit", str(job_file))
    assert unknown.returncode == 2 and "unknown fields 'colour' (known: name," in unknown.stderr
    secret = world.passwords["alice"].read_text()
    for result in (done, again, refused, unknown):
        assert secret not in result.stdout + result.stderr


class RecordingRuntime:
    """The runtime, recording on which thread and in which state jobs are created/closed."""

    def __init__(self, runtime):
        self._runtime = runtime
        self.calls = []

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    def create_job(self, spec):
        import threading
        self.calls.append(("create", threading.get_ident(), self._runtime.in_bubble))
        job = self._runtime.create_job(spec)
        calls, close = self.calls, job.close

        def recorded_close():
            calls.append(("close", threading.get_ident(), self._runtime.in_bubble))
            close()
        job.close = recorded_close
        return job


def test_the_agent_creates_and_closes_fill_jobs_only_on_the_trainer_thread_between_bubbles(
        world):
    import threading
    import time
    from pipefill.service import Agent
    from pipefill.service.rank import host_runtime
    with world.service("alice") as alice:
        job_id = alice.submit(digest_job(world, "threads", items=12, shard_items=4))
    rt = RecordingRuntime(host_runtime())
    stream = rt.high_priority_stream()
    agent = Agent(rt, "inproc-threads", conninfo=world.conninfo("rank1"),
                  password_file=str(world.passwords["rank1"]), poll_s=0.02).start()
    trainer = threading.get_ident()
    deadline = time.monotonic() + 60
    try:
        while agent.counts.committed < 3 and time.monotonic() < deadline:
            with rt.bubble(stream, expected_us=2000.0):
                pf.host_stream_delay(stream, 2000.0)
                agent.on_iteration_end()  # misuse inside a bubble: must do nothing
            pf.host_stream_delay(stream, 500.0)
            rt.iteration_end()
            agent.on_iteration_end()
            pf.host_stream_synchronize(stream)
    finally:
        agent.drain()
        rt.synchronize()
        rt.close()
    assert agent.counts.committed == 3 and agent.error is None
    assert [c[0] for c in rt.calls].count("create") == 3
    assert [c[0] for c in rt.calls].count("close") == 3
    assert all(thread == trainer and not in_bubble for _, thread, in_bubble in rt.calls)
    assert job_state(world, job_id) == "completed"


def test_an_unreachable_database_ends_the_agent_within_its_budget_not_the_trainer(tmp_path):
    import time
    pytest.importorskip("psycopg")
    from pipefill.service import Agent
    from pipefill.service._db import ConnectionLost
    from pipefill.service.rank import host_runtime
    password = tmp_path / "password"
    password.write_text("never-shown-3e1d")
    rt = host_runtime()
    stream = rt.high_priority_stream()
    agent = Agent(rt, "lost", conninfo=f"host={tmp_path} port=1 dbname=x user=rank1",
                  password_file=str(password), reconnect_budget_s=1.0,
                  capacity_interval_s=0.05).start()
    iterations = 0
    deadline = time.monotonic() + 30
    try:
        while agent.running and time.monotonic() < deadline:
            with rt.bubble(stream, expected_us=1000.0):
                pf.host_stream_delay(stream, 1000.0)
            rt.iteration_end()
            agent.on_iteration_end()
            pf.host_stream_synchronize(stream)
            iterations += 1
        assert not agent.running
        for _ in range(20):  # the trainer goes on without its agent
            with rt.bubble(stream, expected_us=1000.0):
                pf.host_stream_delay(stream, 1000.0)
            rt.iteration_end()
            pf.host_stream_synchronize(stream)
        assert rt.stats().iterations == iterations + 20
    finally:
        agent.drain(5.0)
        rt.close()
    assert isinstance(agent.error, ConnectionLost)
    assert "service database unreachable for 1 s" in str(agent.error)
    assert f"host={tmp_path}" in str(agent.error) and "never-shown-3e1d" not in str(agent.error)


def test_a_deadlock_aborted_call_is_retried_not_fatal():
    """The server rolls back a statement chosen as a deadlock victim (e.g. a rank's pf_fail
    against a cancel of a large job): Reconnecting retries it on the same connection (every
    pf_* call is idempotent) instead of ending the agent; other database errors still raise."""
    psycopg = pytest.importorskip("psycopg")
    from pipefill.service._db import Reconnecting
    db = Reconnecting({"host": "/nonexistent"}, first_delay_s=0.001)
    db._conn = type("Open", (), {"closed": False, "close": lambda self: None})()
    calls = []

    def work(conn):
        calls.append(conn)
        if len(calls) < 3:
            raise (psycopg.errors.DeadlockDetected if len(calls) == 1
                   else psycopg.errors.SerializationFailure)("victim")
        return "done"

    assert db.call(work) == "done"
    assert db.transient == 2 and db.reconnects == 0 and len(set(map(id, calls))) == 1
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.call(lambda conn: (_ for _ in ()).throw(psycopg.errors.UniqueViolation("dup")))
