"""The service through PgBouncer in transaction pooling mode (what a 10,000-rank cluster needs):
consecutive statements of one client land on different server connections, and many clients
share few server connections. Skips without the pgbouncer binary, unless
PIPEFILL_REQUIRE_SERVICE=1 (scripts/test.sh) makes that a failure."""
from __future__ import annotations

import json
import os

import pytest

from service_fixtures import expected_record, wait_for

ANY_CLASS = json.dumps([{"key": "any", "p10_us": 1e9, "per_iteration": 1}])


@pytest.fixture(scope="module")
def bouncer(world):
    from pipefill import PipeFillError
    from pipefill.service.devserver import TempPgBouncer, find_pgbouncer
    try:
        find_pgbouncer()
    except PipeFillError as error:
        if os.environ.get("PIPEFILL_REQUIRE_SERVICE") == "1":
            pytest.fail(error.message)
        pytest.skip(error.message)
    users = {u: world.passwords[u].read_text() for u in ("alice", "bob", "rank1")}
    # One server connection per (database, user): every rank client shares it.
    b = TempPgBouncer(world.pg, users, pool_size=1)
    try:
        b.start()
        yield b
    finally:
        b.close()


def connect_via(bouncer, world, user):
    from pipefill.service import _db
    return _db.connect(_db.connection_options(bouncer.conninfo(user),
                                              password_file=str(world.passwords[user])))


def test_two_clients_sharing_one_server_connection_claim_and_commit(world, bouncer):
    """Two rank clients alternate claims and commits over PgBouncer's single server connection
    of the rank user, more often than psycopg's automatic preparation threshold (5): with
    server-side prepared statements the second client's statement would clash with the first's
    (same name on the same server connection) or be missing on another one."""
    from pipefill.service import JobSpec
    from pipefill.service.devserver import server_connections
    with world.service("alice") as alice:
        job_id = alice.submit(JobSpec(
            name="bouncer-claims", dist_name="pfsvc-testjobs", entry_point="digest",
            dataset="d", item_count=40, shard_items=1, output_dir=str(world.out_root)))
    a, b = connect_via(bouncer, world, "rank1"), connect_via(bouncer, world, "rank1")
    try:
        won = []
        for round_ in range(20):
            for name, conn in (("A", a), ("B", b)):
                row = conn.execute("select shard, token, secret from pipefill.pf_claim(%s, 0,"
                                   " %s::jsonb, 1) where job_id = %s",
                                   (name, ANY_CLASS, job_id)).fetchone()
                assert row is not None, f"round {round_}: {name} found no shard"
                path = f"{world.out_root}/job-{job_id}/shard-{row[0]}"
                outcome = conn.execute("select pipefill.pf_commit(%s, %s, %s, %s, %s, %s, 0)",
                                       (job_id, row[0], row[1], row[2], path, "0" * 64)
                                       ).fetchone()[0]
                won.append((row[0], outcome))
        # Both clients are connected: the server sees one connection of rank1 (the pool).
        assert server_connections(world.pg, "rank1") == 1
    finally:
        a.close()
        b.close()
    assert sorted(s for s, _ in won) == list(range(40))
    assert [o for _, o in won].count("completed") == 1
    with world.service("alice") as alice:
        assert alice.jobs(job_id)[0].state == "completed"


def test_row_level_security_still_sees_the_client_user_through_the_pool(world, bouncer):
    """PgBouncer logs in to the server as the client's user, so session_user (row-level
    security, job ownership) is still the submitter."""
    from pipefill.service import JobSpec, Service
    alice = Service(bouncer.conninfo("alice"), password_file=str(world.passwords["alice"]))
    bob = Service(bouncer.conninfo("bob"), password_file=str(world.passwords["bob"]))
    try:
        job_id = alice.submit(JobSpec(
            name="bouncer-rls", dist_name="pfsvc-testjobs", entry_point="digest", dataset="d",
            item_count=4, shard_items=2, output_dir=str(world.out_root)))
        assert alice.jobs(job_id)[0].owner == "alice"
        assert bob.jobs(job_id) == []
        assert bob.cancel(job_id) is False
        assert alice.cancel(job_id) is True
    finally:
        alice.close()
        bob.close()


def test_a_rank_completes_a_job_through_pgbouncer(world, bouncer):
    """The agent end to end over the pool (claims, renewals at checkpoints, commits, the
    manifest): the same verified outputs as over a direct connection."""
    import pathlib

    from pipefill.service import JobSpec, verify_manifest
    from service_fixtures import run_in_process_rank
    with world.service("alice") as alice:
        job_id = alice.submit(JobSpec(
            name="bouncer-run", dist_name="pfsvc-testjobs", entry_point="digest",
            dataset="d", item_count=30, shard_items=6, output_dir=str(world.out_root),
            params={"seed": "bouncer", "item_cost_us": 100.0, "checkpoint_items": 2},
            item_cost_us=100.0, lease_ttl_s=10.0))

    def completed():
        with world.service("alice") as alice:
            return alice.jobs(job_id)[0].state == "completed"

    agent, reached = run_in_process_rank(world, "bouncer-rank", completed, 60.0,
                                         conninfo=bouncer.conninfo("rank1"))
    assert reached, f"job not completed; agent error: {agent.error}; {bouncer.log_tail(1500)}"
    assert agent.error is None
    assert (agent.counts.committed, agent.counts.fenced, agent.counts.failed) == (5, 0, 0)
    manifest_path = world.out_root / f"job-{job_id}" / "manifest.json"
    assert verify_manifest(manifest_path) == []
    manifest = json.loads(manifest_path.read_text())
    content = b"".join(pathlib.Path(s["path"]).read_bytes() for s in manifest["shards"])
    assert content == b"".join(expected_record("bouncer", i) for i in range(30))
    wait_for(lambda: server_connections_ok(world), 10, "the server's rank1 connections <= 1")


def server_connections_ok(world):
    from pipefill.service.devserver import server_connections
    return server_connections(world.pg, "rank1") <= 1
