"""Benchmark of the fill-job service on a throwaway local PostgreSQL (printed, not a test).

    build-py/venv/bin/python benchmarks/service/bench_service.py [--quick] [--only queue]
        [--sizes 1000,100000,1000000] [--explain]

Prints:
0. claim cost against the queue's length ("queue"): at each size N (default 10^3, 10^5,
   10^6 queued shards), side by side in the same server and run, 16 client processes doing
   claim + commit through the service (pf_claim / pf_commit: fit filter, fencing token and
   secret, attempts log) and through a bare ``UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP
   LOCKED LIMIT 1)`` loop on a plain table; rounds alternate service / bare (a change of the
   machine's load hits both). The service's queue holds N claimable shards in one job plus N
   shards of a higher-priority job no client fits (memory), so a claim that scanned shards
   would pay for both; the bare table holds N rows. Printed per size: claims+commits per second
   of each and their ratio (the median over the rounds), claim p50 / p99 (all claims of all
   rounds) of each. ``--explain``: the claim's statements at the largest size with EXPLAIN
   (ANALYZE, BUFFERS), through auto_explain (nested statements of pf_claim);
1. claim latency (pf_claim of one shard, one client): p50 / p99;
2. claims+commits per second with 16 client processes (each: claim one shard, commit it), and
   with claim batching (8 shards per pf_claim), the figure that sizes a 10,000-rank cluster;
2b. side by side, directly and through PgBouncer in transaction pooling mode (pool of 20 server
   connections): claims+commits per second with 16 and 64 client processes, and the peak number
   of server connections of the rank user during each run (what limits a 10,000-rank cluster is
   connections: one per rank directly, the pool's size through PgBouncer). Skipped, saying so,
   without the pgbouncer binary;
3. time for a dead rank's shard to be re-claimed (a client polling every 20 ms) against the
   lease TTL: the ratio re-claim / TTL (ideal: just above 1; the expiry sweep runs at most every
   250 ms);
4. the trainer's iteration time with the agent on vs off (host backend, same loop): the ratio.

Everything runs on this machine (Unix socket, ``fsync = off``); figures depend on its load, so
they are ratios or distributions of one run, never compared with a fixed threshold.
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
FREE_BYTES = 1 << 30           # what the bench clients advertise
UNFIT_BYTES = 1 << 40          # the memory need of the job no client fits
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLAIM = ("select job_id, shard, token, secret from pipefill.pf_claim(%s, %s, %s::jsonb, %s)"
         " where shard >= 0")
COMMIT = "select pipefill.pf_commit(%s, %s, %s, %s, %s, %s, 0)"
BARE_CLAIM = ("update bench.queue set state = 'leased', token = nextval('bench.tokens'),"
              " claimed_by = %s where id = (select id from bench.queue where state = 'pending'"
              " order by id limit 1 for update skip locked) returning id, token")
BARE_COMMIT = ("update bench.queue set state = 'done', done_at = now() where id = %s and"
               " token = %s")


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


def make_job(pg, password_files, out_dir, items, shard_items, ttl_s=30.0, item_cost_us=0.0,
             memory_bytes=0, priority=0):
    with Service(pg.conninfo("alice"), password_file=str(password_files["alice"])) as alice:
        return alice.submit(JobSpec(
            name="bench", dist_name="pipefill", entry_point="none", dataset="bench://",
            item_count=items, shard_items=shard_items, output_dir=out_dir,
            item_cost_us=item_cost_us, lease_ttl_s=ttl_s, dist_version="0",
            dist_sha256=HEX, memory_bytes=memory_bytes, priority=priority))


def rank_conn(pg, password_files):
    return psycopg.connect(pg.conninfo("rank1"), password=password_files["rank1"].read_text(),
                           autocommit=True, prepare_threshold=None)


def commit_args(out_dir, job_id, shard, token, secret):
    return (job_id, shard, token, secret, f"{out_dir}/job-{job_id}/shard-{shard}", HEX)


def claim_commit_worker(args):
    conninfo, password, name, batch, deadline_s, out_dir = args
    # No server-side prepared statements, as the service's own connections (PgBouncer).
    conn = psycopg.connect(conninfo, password=password, autocommit=True, prepare_threshold=None)
    done = 0
    stop = time.monotonic() + deadline_s
    while time.monotonic() < stop:
        rows = conn.execute(CLAIM, (name, FREE_BYTES, ANY_CLASS, batch)).fetchall()
        if not rows:
            break
        for job_id, shard, token, secret in rows:
            conn.execute(COMMIT, commit_args(out_dir, job_id, shard, token, secret))
            done += 1
    conn.close()
    return done


def throughput(pg, password_files, out_dir, processes, batch, shards, conninfo=None):
    """(claims+commits, seconds, peak server connections of the rank user) for ``processes``
    clients claiming and committing ``shards`` shards over ``conninfo`` (default: direct)."""
    make_job(pg, password_files, out_dir, shards, 1)
    password = password_files["rank1"].read_text()
    conninfo = conninfo or pg.conninfo("rank1")
    args = [(conninfo, password, f"w{i}", batch, 120.0, out_dir) for i in range(processes)]
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


# ---- 0. claim cost against the queue's length ------------------------------------------------

_barrier = None


def _init_queue_worker(barrier):
    global _barrier
    _barrier = barrier


def queue_worker(args):
    """One client of a round: connect, wait for the others, then ``claims`` claim + commit
    pairs (service or bare). Returns (claim latencies in us, start, end) on the shared
    CLOCK_MONOTONIC."""
    kind, conninfo, password, name, claims, out_dir = args
    conn = psycopg.connect(conninfo, password=password, autocommit=True, prepare_threshold=None)
    latencies = []
    _barrier.wait()
    start = time.monotonic()
    for _ in range(claims):
        t0 = time.perf_counter()
        if kind == "service":
            row = conn.execute(CLAIM, (name, FREE_BYTES, ANY_CLASS, 1)).fetchone()
        else:
            row = conn.execute(BARE_CLAIM, (name,)).fetchone()
        latencies.append((time.perf_counter() - t0) * 1e6)
        if row is None:
            raise RuntimeError(f"{kind} queue ran dry (raise the queue's size)")
        if kind == "service":
            outcome = conn.execute(COMMIT, commit_args(out_dir, *row)).fetchone()[0]
            assert outcome in ("won", "completed"), outcome
        else:
            assert conn.execute(BARE_COMMIT, row).rowcount == 1
    end = time.monotonic()
    conn.close()
    return latencies, start, end


def load_queues(pg, password_files, out_dir, size, claimable):
    """Empties the service's tables and the bare queue, then loads ``claimable`` shards in a job
    the clients fit, ``size`` shards in a higher-priority job they do not (memory), and
    ``claimable`` rows in the bare table, all in bulk (generate_series); VACUUM ANALYZE after.
    Returns the seconds it took."""
    start = time.perf_counter()
    with psycopg.connect(pg.conninfo(), autocommit=True) as owner:
        owner.execute("truncate pipefill.attempts, pipefill.shards, pipefill.jobs,"
                      " pipefill.rank_logins, pipefill.ranks, bench.queue")
    make_job(pg, password_files, out_dir, size, 1, memory_bytes=UNFIT_BYTES, priority=1)
    make_job(pg, password_files, out_dir, claimable, 1)
    with psycopg.connect(pg.conninfo(), autocommit=True) as owner:
        owner.execute("insert into bench.queue (id, state) select g, 'pending' from"
                      " generate_series(1, %s) g", (claimable,))
        for table in ("pipefill.jobs", "pipefill.shards", "pipefill.attempts", "bench.queue"):
            owner.execute(f"vacuum analyze {table}")
    return time.perf_counter() - start


def queue_round(pool, pg, password_files, out_dir, kind, clients, per_client):
    password = password_files["rank1"].read_text()
    args = [(kind, pg.conninfo("rank1"), password, f"q{i}", per_client, out_dir)
            for i in range(clients)]
    results = pool.map(queue_worker, args, chunksize=1)
    latencies = [x for r in results for x in r[0]]
    elapsed = max(r[2] for r in results) - min(r[1] for r in results)
    return clients * per_client / elapsed, latencies


def explain_claim(pg, out_dir):
    """The claim's statements (nested in pf_claim) with EXPLAIN (ANALYZE, BUFFERS), as
    auto_explain logs them, plus the commit's; the claim runs as the owner (pf_claim is
    SECURITY DEFINER: the same plans) in a session that claimed 3 shards before, and is
    committed like any claim. The sweep runs in it when due (more than 250 ms since the last)."""
    plans = []
    with psycopg.connect(pg.conninfo(), autocommit=True) as owner:
        for _ in range(3):  # a warm session: PL/pgSQL compiled, plans cached
            row = owner.execute(CLAIM, ("explain", FREE_BYTES, ANY_CLASS, 1)).fetchone()
            owner.execute(COMMIT, commit_args(out_dir, *row))
        owner.add_notice_handler(lambda diag: plans.append(diag.message_primary))
        owner.execute("load 'auto_explain'")
        for setting in ("client_min_messages = log", "auto_explain.log_min_duration = 0",
                        "auto_explain.log_analyze = on", "auto_explain.log_buffers = on",
                        "auto_explain.log_timing = on", "auto_explain.log_nested_statements = on"):
            owner.execute(f"set {setting}")
        row = owner.execute(CLAIM, ("explain", FREE_BYTES, ANY_CLASS, 1)).fetchone()
        claim_plans = list(plans)
        plans.clear()
        owner.execute(COMMIT, commit_args(out_dir, *row))
        commit_plans = list(plans)
    return claim_plans, commit_plans


def queue_scale(pg, password_files, out_dir, sizes, clients, per_client, rounds, explain):
    with psycopg.connect(pg.conninfo(), autocommit=True) as owner:
        owner.execute("create schema if not exists bench; grant usage on schema bench to pf_rank;"
                      " create table if not exists bench.queue (id bigint primary key, state text"
                      " not null, token bigint, claimed_by text, done_at timestamptz);"
                      " create index if not exists queue_pending on bench.queue (id) where state"
                      " = 'pending'; create sequence if not exists bench.tokens;"
                      " grant select, update on bench.queue to pf_rank;"
                      " grant usage on sequence bench.tokens to pf_rank")
    per_round = clients * per_client
    claimable_extra = per_round * rounds
    print(f"claim cost against the queue's length: {clients} client processes, {per_client} "
          f"claim+commit pairs each per round, {rounds} rounds per side alternating service / "
          f"bare; the service's queue: N claimable shards (+{claimable_extra} the rounds take) "
          "and N in a higher-priority job no client fits; the bare table: the same number of "
          "claimable rows")
    print(f"{'queued N':>10} {'load s':>7} {'service /s':>10} {'bare /s':>9} {'ratio':>6} "
          f"{'svc p50 us':>10} {'svc p99 us':>10} {'bare p50 us':>11} {'bare p99 us':>11}")
    summary = []
    barrier = multiprocessing.get_context("spawn").Barrier(clients)
    with multiprocessing.get_context("spawn").Pool(
            clients, initializer=_init_queue_worker, initargs=(barrier,)) as pool:
        for size in sizes:
            load_s = load_queues(pg, password_files, out_dir, size, size + claimable_extra)
            rates = {"service": [], "bare": []}
            latencies = {"service": [], "bare": []}
            for _ in range(rounds):
                for kind in ("service", "bare"):
                    rate, lat = queue_round(pool, pg, password_files, out_dir, kind, clients,
                                            per_client)
                    rates[kind].append(rate)
                    latencies[kind].extend(lat)
            ratios = [s / b for s, b in zip(rates["service"], rates["bare"])]
            row = (size, statistics.median(rates["service"]), statistics.median(rates["bare"]),
                   statistics.median(ratios), quantile(latencies["service"], 0.5),
                   quantile(latencies["service"], 0.99), quantile(latencies["bare"], 0.5),
                   quantile(latencies["bare"], 0.99))
            summary.append(row)
            print(f"{size:>10} {load_s:>7.1f} {row[1]:>10.0f} {row[2]:>9.0f} {row[3]:>6.2f} "
                  f"{row[4]:>10.0f} {row[5]:>10.0f} {row[6]:>11.0f} {row[7]:>11.0f}", flush=True)
            if explain and size == max(sizes):
                claim_plans, commit_plans = explain_claim(pg, out_dir)
                print(f"EXPLAIN (ANALYZE, BUFFERS) of one claim at N = {size} (auto_explain, "
                      "statements nested in pf_claim):")
                for plan in claim_plans:
                    print(plan)
                print("... and of its commit (pf_commit):")
                for plan in commit_plans:
                    print(plan)
    first, last = summary[0], summary[-1]
    print(f"service claim p50 at N = {last[0]} / at N = {first[0]}: {last[4] / first[4]:.2f}; "
          f"ratio service/bare: {', '.join(f'{r[3]:.2f}' for r in summary)}")


# ---- 3. re-claim after a death -----------------------------------------------------------------

def reclaim_after_death(pg, password_files, out_dir, ttl_s, repeats):
    ratios = []
    for _ in range(repeats):
        job = make_job(pg, password_files, out_dir, 1, 1, ttl_s=ttl_s)
        dying = rank_conn(pg, password_files)
        row = dying.execute(CLAIM + " and job_id = %s", ("dying", FREE_BYTES, ANY_CLASS, 1, job)
                            ).fetchone()
        died = time.perf_counter()
        dying.close()  # the rank dies holding the lease
        survivor = rank_conn(pg, password_files)
        deadline = died + ttl_s * 5
        while time.perf_counter() < deadline:
            got = survivor.execute(CLAIM + " and job_id = %s",
                                   ("survivor", FREE_BYTES, ANY_CLASS, 1, job)).fetchone()
            if got:
                ratios.append((time.perf_counter() - died) / ttl_s)
                survivor.execute(COMMIT, commit_args(out_dir, *got))
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
    parser.add_argument("--only", choices=["queue", "others"],
                        help="only the queue-length comparison, or only the other sections")
    parser.add_argument("--sizes", default="1000,100000,1000000",
                        help="queued shards of the queue-length comparison (comma-separated)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=60,
                        help="claim+commit pairs of each client per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--explain", action="store_true",
                        help="EXPLAIN (ANALYZE, BUFFERS) of a claim at the largest size")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    claims = 300 if args.quick else 2000
    shards = 2000 if args.quick else 8000
    with TempPostgres(max_connections=100) as pg, tempfile.TemporaryDirectory() as out_dir:
        os.chmod(out_dir, 0o755)
        pg.create_database()
        with psycopg.connect(pg.conninfo(), autocommit=True) as owner:
            from pipefill.service._db import apply_schema
            apply_schema(owner)
            owner.execute("insert into pipefill.allowlist values ('pipefill', '0', %s)", (HEX,))
        password_files = {u: pg.create_login(u, r, f"bench-{u}")
                          for u, r in (("alice", "pf_submitter"), ("rank1", "pf_rank"))}
        conditions = (f"{os.cpu_count()} CPUs, load average "
                      f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the start")
        print(f"conditions: {conditions}; PostgreSQL {pg.bin.parent.name}, Unix socket, "
              "fsync = off, shared_buffers = 32MB")
        if args.only != "others":
            queue_scale(pg, password_files, out_dir, sizes, args.clients, args.per_client,
                        args.rounds, args.explain)
            print(f"load average at the end: "
                  f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
            if args.only == "queue":
                return 0
            with psycopg.connect(pg.conninfo(), autocommit=True) as owner:
                owner.execute("truncate pipefill.attempts, pipefill.shards, pipefill.jobs")

        make_job(pg, password_files, out_dir, claims, 1)
        conn = rank_conn(pg, password_files)
        latencies = []
        for _ in range(claims):
            start = time.perf_counter()
            row = conn.execute(CLAIM, ("lat", FREE_BYTES, ANY_CLASS, 1)).fetchone()
            latencies.append((time.perf_counter() - start) * 1e6)
            conn.execute(COMMIT, commit_args(out_dir, *row))
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
