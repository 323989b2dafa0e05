"""`pipefill init` upgrades a database made by the release before issue 26 in place: a job and a
lease of that release survive, the old token-only lease functions are gone (nothing can act on a
lease without a secret), the old lease cannot be renewed or committed, and once its TTL passes its
shard is re-claimed with a secret and committed. A second init changes nothing.
data/schema_before_issue26.sql is that release's schema.sql, unchanged."""
from __future__ import annotations

import pathlib
import time

ANY_CLASS = '[{"key": "any", "p10_us": 1e9, "per_iteration": 1}]'
OLD_SCHEMA = pathlib.Path(__file__).with_name("data") / "schema_before_issue26.sql"


def test_init_upgrades_a_database_of_the_previous_release(world):
    import psycopg
    from pipefill.service._db import apply_schema
    with psycopg.connect(world.pg.conninfo(dbname="pipefill"), autocommit=True) as admin:
        admin.execute("create database pipefill_upgrade")
    conninfo = world.pg.conninfo(dbname="pipefill_upgrade")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(OLD_SCHEMA.read_text())
        conn.execute("insert into pipefill.allowlist values ('d', '1', repeat('0', 64))")
        job = conn.execute(
            "insert into pipefill.jobs (name, dist_name, dist_version, dist_sha256, entry_point,"
            " dataset, item_count, shard_items, output_dir, lease_ttl_s) values ('old', 'd', '1',"
            " repeat('0', 64), 'e', 'ds', 4, 1, %s, 0.5) returning id",
            (str(world.out_root),)).fetchone()[0]
        conn.execute("update pipefill.shards set failures = 2 where job_id = %s and shard = 3",
                     (job,))
        shard, token = conn.execute("select shard, token from pipefill.pf_claim('old-rank', 0,"
                                    " %s, 1)", (ANY_CLASS,)).fetchone()

        apply_schema(conn)
        apply_schema(conn)  # idempotent

        for old in ("pf_renew(bigint, integer, bigint, jsonb)",
                    "pf_commit(bigint, integer, bigint, text, text, bigint)",
                    "pf_release(bigint, integer, bigint, jsonb)",
                    "pf_fail(bigint, integer, bigint, text)"):
            assert conn.execute("select to_regprocedure(%s)", (f"pipefill.{old}",)
                                ).fetchone()[0] is None, old
        assert conn.execute("select failures, state from pipefill.jobs where id = %s",
                            (job,)).fetchone() == (2, "running")
        # The old lease has no secret: refused whatever is passed.
        assert conn.execute("select pipefill.pf_renew(%s, %s, %s, %s, NULL)",
                            (job, shard, token, "0" * 64)).fetchone()[0] is False
        # Once its TTL passed, the sweep puts it back and it is claimed with a secret.
        deadline = time.monotonic() + 30
        got = None
        while got is None:
            assert time.monotonic() < deadline, "the old lease's shard was never re-claimed"
            time.sleep(0.1)
            got = conn.execute("select shard, token, secret from pipefill.pf_claim('new-rank', 0,"
                               " %s, 4) where shard = %s", (ANY_CLASS, shard)).fetchone()
        assert got[1] > token and len(got[2]) == 64
        path = f"{world.out_root}/job-{job}/shard-{shard}"
        assert conn.execute("select pipefill.pf_commit(%s, %s, %s, %s, %s, repeat('a', 64), 1)",
                            (job, shard, got[1], got[2], path)).fetchone()[0] == "won"
        assert conn.execute("select expirations from pipefill.shards where job_id = %s and"
                            " shard = %s", (job, shard)).fetchone()[0] == 1
    with psycopg.connect(world.pg.conninfo(dbname="pipefill"), autocommit=True) as admin:
        admin.execute("drop database pipefill_upgrade with (force)")
