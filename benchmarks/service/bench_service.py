"""Benchmark of the fill-job service on a throwaway local PostgreSQL (printed, not a test).

    build-py/venv/bin/python benchmarks/service/bench_service.py [--quick]

Prints:
1. claim latency (pf_claim of one shard, one client): p50 / p99;
2. claims+commits per second with 16 client processes (each: claim one shard, commit it), and
   with claim batching (8 shards per pf_claim), the figure that sizes a 10,000-rank cluster;
2b. side by side, directly and through PgBouncer in transaction pooling mode (pool of 20 server
   connections): claims+commits per second with 16 and 64 client processes, and the peak number
   of server connections of the rank user during each run (what limits a 10,000-rank cluster is
   connections: one per rank directly, the pool's size through PgBouncer). Skipped, saying so,
   without the pgbouncer binary;
3. time for a dead rank's shard to be re-claimed (a client polling every 20 ms) against the
   lease TTL: the ratio re-claim / TTL (ideal: just above 1);
4. the trainer's iteration time with the agent on vs off (host backend, same loop): the ratio.

Everything runs on this machine (Unix socket); figures depend on its load, so they are ratios
or distributions of one run, never compared with a fixed threshold.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

import psycopg

from pipefill.service import JobSpec, Service
from pipefill import PipeFillError
from pipefill.service.devserver import TempPgBouncer, TempPostgres, server_connections

HEX = "0" * 64
# A capacity class every bench job fits (pf_claim's classes argument).
ANY_CLASS = '[{"key": "any", "p10_us": 1e9, "per_iteration": 1}]'
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


def make_job(pg, password_files, out_dir, items, shard_items, ttl_s=30.0, item_cost_us=0.0):
    with Service(pg.conninfo("alice"), password_file=str(password_files["alice"])) as alice:
        return alice.submit(JobSpec(
            name="bench", dist_name="pipefill", entry_point="none", dataset="bench://",
            item_count=items, shard_items=shard_items, output_dir=out_dir,
            item_cost_us=item_cost_us, lease_ttl_s=ttl_s, dist_version="0",
            dist_sha256=HEX))


def rank_conn(pg, password_files):
    return psycopg.connect(pg.conninfo("rank1"), password=password_files["rank1"].read_text(),
                           autocommit=True, prepare_threshold=None)


def claim_commit_worker(args):
    conninfo, password, name, batch, deadline_s = args
    # No server-side prepared statements, as the service's own connections (PgBouncer).
    conn = psycopg.connect(conninfo, password=password, autocommit=True, prepare_threshold=None)
    done = 0
    stop = time.monotonic() + deadline_s
    while time.monotonic() < stop:
        rows = conn.execute("select job_id, shard, token from pipefill.pf_claim(%s, 0, %s::jsonb,"
                            " %s)", (name, ANY_CLASS, batch)).fetchall()
        if not rows:
            break
        for job_id, shard, token in rows:
            conn.execute("select pipefill.pf_commit(%s, %s, %s, '/bench', %s, 0)",
                         (job_id, shard, token, HEX))
            done += 1
    conn.close()
    return done


def throughput(pg, password_files, out_dir, processes, batch, shards, conninfo=None):
    """(claims+commits, seconds, peak server connections of the rank user) for ``processes``
    clients claiming and committing ``shards`` shards over ``conninfo`` (default: direct)."""
    make_job(pg, password_files, out_dir, shards, 1)
    password = password_files["rank1"].read_text()
    conninfo = conninfo or pg.conninfo("rank1")
    args = [(conninfo, password, f"w{i}", batch, 120.0) for i in range(processes)]
    peak = [0]
    sampling = threading.Event()

    def sample():
        while not sampling.is_set():
            peak[0] = max(peak[0], server_connections(pg, "rank1"))
            sampling.wait(0.05)

    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(len, [[0]] * processes)  # start the workers before timing
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.perf_counter()
        done = sum(pool.map(claim_commit_worker, args, chunksize=1))
        elapsed = time.perf_counter() - start
        sampling.set()
        sampler.join()
    return done, elapsed, peak[0]


def reclaim_after_death(pg, password_files, out_dir, ttl_s, repeats):
    ratios = []
    for _ in range(repeats):
        job = make_job(pg, password_files, out_dir, 1, 1, ttl_s=ttl_s)
        dying = rank_conn(pg, password_files)
        row = dying.execute("select shard, token from pipefill.pf_claim('dying', 0, %s::jsonb, 1)"
                            " where job_id = %s", (ANY_CLASS, job)).fetchone()
        died = time.perf_counter()
        dying.close()  # the rank dies holding the lease
        survivor = rank_conn(pg, password_files)
        deadline = died + ttl_s * 5
        while time.perf_counter() < deadline:
            got = survivor.execute("select token from pipefill.pf_claim('survivor', 0, %s::jsonb,"
                                   " 1) where job_id = %s", (ANY_CLASS, job)).fetchone()
            if got:
                ratios.append((time.perf_counter() - died) / ttl_s)
                survivor.execute("select pipefill.pf_commit(%s, 0, %s, '/b', %s, 0)",
                                 (job, got[0], HEX))
                break
            time.sleep(0.02)
        survivor.close()
        assert row is not None
    return ratios


def trainer_ratio(pg, password_files, out_dir, iterations):
    """Iteration time of the stand-in trainer with the agent on / off, same loop and bubbles;
    'on' fills the bubbles with a real job (the tests' pfsvc-testjobs distribution)."""
    sys.path.insert(0, os.path.join(REPO, "tests", "python", "service"))
    from service_fixtures import install_test_distributions
    site = os.path.join(out_dir, "site")
    install_test_distributions(pathlib.Path(site))
    sys.path.insert(0, site)
    with Service(pg.conninfo()) as owner:
        owner.allow("pfsvc-testjobs")
    with Service(pg.conninfo("alice"), password_file=str(password_files["alice"])) as alice:
        alice.submit(JobSpec(name="fill", dist_name="pfsvc-testjobs", entry_point="digest",
                             dataset="bench://fill", item_count=100000, shard_items=16,
                             output_dir=out_dir, item_cost_us=500.0,
                             params={"seed": 1, "item_cost_us": 500.0, "checkpoint_items": 4}))
    os.environ["PIPEFILL_SERVICE"] = pg.conninfo("rank1")
    os.environ["PIPEFILL_SERVICE_PASSWORD_FILE"] = str(password_files["rank1"])
    from pipefill.service.rank import run_rank
    pairs = []
    for repeat in range(3):  # alternating, so a change of the machine's load hits both
        off = run_rank(f"bench-off-{repeat}", bubble_us=2000.0, compute_us=2000.0,
                       iterations=iterations, exit_when_idle_s=None, agent_on=False)
        on = run_rank(f"bench-on-{repeat}", bubble_us=2000.0, compute_us=2000.0,
                      iterations=iterations, exit_when_idle_s=None, agent_on=True)
        pairs.append((off, on))
    return pairs


def pooled(pg, password_files, out_dir, shards, pool_size=20):
    """Direct vs PgBouncer (transaction pooling), 16 and 64 client processes, claim batch 1."""
    users = {u: p.read_text() for u, p in password_files.items()}
    try:
        bouncer = TempPgBouncer(pg, users, pool_size=pool_size).start()
    except PipeFillError as error:
        print(f"PgBouncer side by side: skipped ({error.message})")
        return
    try:
        for processes in (16, 64):
            figures = []
            for route, conninfo in (("direct", None), ("PgBouncer", bouncer.conninfo("rank1"))):
                done, elapsed, peak = throughput(pg, password_files, out_dir, processes, 1,
                                                 shards, conninfo)
                figures.append((route, done / elapsed, peak))
            (_, direct, direct_peak), (_, pooled_rate, pooled_peak) = figures
            print(f"{processes} client processes, claim batch 1: direct {direct:.0f} claims+commits"
                  f"/s with {direct_peak} server connections; through PgBouncer (transaction "
                  f"pool of {pool_size}) {pooled_rate:.0f} /s with {pooled_peak} server "
                  f"connections; ratio PgBouncer/direct {pooled_rate / direct:.2f}")
    finally:
        bouncer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (about 30 s)")
    args = parser.parse_args()
    claims = 300 if args.quick else 2000
    shards = 2000 if args.quick else 8000
    with TempPostgres(max_connections=100) as pg, tempfile.TemporaryDirectory() as out_dir:
        pg.create_database()
        with psycopg.connect(pg.conninfo(), autocommit=True) as owner:
            from pipefill.service._db import apply_schema
            apply_schema(owner)
            owner.execute("insert into pipefill.allowlist values ('pipefill', '0', %s)", (HEX,))
        password_files = {u: pg.create_login(u, r, f"bench-{u}")
                          for u, r in (("alice", "pf_submitter"), ("rank1", "pf_rank"))}

        make_job(pg, password_files, out_dir, claims, 1)
        conn = rank_conn(pg, password_files)
        latencies = []
        for _ in range(claims):
            start = time.perf_counter()
            row = conn.execute("select job_id, shard, token from pipefill.pf_claim('lat', 0,"
                               " %s::jsonb, 1)", (ANY_CLASS,)).fetchone()
            latencies.append((time.perf_counter() - start) * 1e6)
            conn.execute("select pipefill.pf_commit(%s, %s, %s, '/b', %s, 0)",
                         (row[0], row[1], row[2], HEX))
        conn.close()
        print(f"claim latency (1 client, {claims} claims, job of {claims} shards): "
              f"p50 {quantile(latencies, 0.5):.0f} us, p99 {quantile(latencies, 0.99):.0f} us")

        for batch in (1, 8):
            done, elapsed, _ = throughput(pg, password_files, out_dir, 16, batch, shards)
            print(f"16 processes, claim batch {batch}: {done} claims+commits in {elapsed:.2f} s"
                  f" = {done / elapsed:.0f} /s")

        pooled(pg, password_files, out_dir, shards)

        ttl = 1.0
        ratios = reclaim_after_death(pg, password_files, out_dir, ttl, 3 if args.quick else 8)
        print(f"re-claim of a dead rank's shard, from its claim's return (TTL {ttl:.1f} s, "
              f"survivor polls every 20 ms): median {statistics.median(ratios):.2f} x TTL, "
              f"max {max(ratios):.2f} x TTL")

        pairs = trainer_ratio(pg, password_files, out_dir, 400 if args.quick else 1500)
        ratios = []
        for off, on in pairs:
            per_off = off["wall_s"] / off["iterations"] * 1e3
            per_on = on["wall_s"] / on["iterations"] * 1e3
            ratios.append(per_on / per_off)
            print(f"trainer iteration (host backend, 2 ms bubble + 2 ms compute): agent off "
                  f"{per_off:.3f} ms, on {per_on:.3f} ms, ratio on/off {per_on / per_off:.3f} "
                  f"(agent on: {on['committed']} shards committed in bubbles, {on['failed']} "
                  "failed)")
        print(f"trainer iteration ratio agent on/off: median of {len(ratios)} pairs "
              f"{statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
