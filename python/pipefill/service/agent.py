"""The rank's agent: claims shards that fit this rank's bubbles and runs them, exactly-once.

The agent runs on its own background thread. The trainer's thread only calls
:meth:`Agent.on_iteration_end` after ``runtime.iteration_end()`` - outside every bubble - which
pops at most two queued job create/close requests (job creation may allocate and load modules,
which must never happen inside a bubble); nothing of the agent runs on the bubble path.

Per shard: claim (``pf_claim``: fit-filtered, ``FOR UPDATE SKIP LOCKED``, a fresh fencing token
and a random secret known only to this session; one extra lease is prefetched), load the job's
code only after its allowlist check, from a verified copy (:mod:`pipefill.service.code`), write
this attempt's own file ``shard-N.attempt-TOKEN.partial`` (resuming from the last checkpoint's
durable prefix, an earlier attempt's file of the same shard verified by hash), renew at each
durable checkpoint (``pf_renew`` with token and secret: refused when the lease is no longer
current -> :class:`LeaseLost`), then fsync, rename to ``shard-N.attempt-TOKEN`` and
``pf_commit`` with token and secret. A refused commit deletes the attempt's file: a fenced
attempt's output is never canonical. The attempt that completes the job (or the claim whose
sweep completed it) writes ``manifest.json`` and collects the losing attempts' files.

Failures: the job's code raising -> ``pf_fail`` (the job fails after its max_failures); a
drain (:meth:`Agent.drain`, trainer restart) -> ``pf_release``, a preemption, not a failure; a
lost database -> reconnect with bounded backoff (:class:`pipefill.service._db.Reconnecting`).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from .._enums import Result
from .._errors import PipeFillError
from . import _db, code, limits
from .runner import LeaseLost, ShardContext, Stopping
from .manifest import write_manifest


@dataclasses.dataclass
class Lease:
    job_id: int
    shard: int
    """The shard; -1: no lease, the job was completed by the claim's sweep and its manifest is
    this agent's to export."""
    token: int
    secret: Optional[str]
    """The lease's random secret (64 hex digits), known only to the session that claimed it;
    every renew/commit/release/fail passes it with the token."""
    item_start: int
    item_end: int
    checkpoint: Optional[Dict[str, Any]]
    lease_ttl_s: float
    dist_name: str
    dist_version: str
    dist_sha256: str
    entry_point: str
    params: Dict[str, Any]
    dataset: str
    output_dir: str
    item_count: int
    item_cost_us: float


@dataclasses.dataclass
class AgentCounts:
    claimed: int = 0
    committed: int = 0
    fenced: int = 0
    failed: int = 0
    refused: int = 0
    preempted: int = 0
    resumed: int = 0
    manifests: int = 0


class _HashingFile:
    """A binary file whose running sha256 covers everything written (prefix included)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.file = open(path, "wb")
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.file.write(data)
        self.hash.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def digest(self) -> str:
        return self.hash.copy().hexdigest()

    def flush(self) -> None:
        self.file.flush()

    def sync(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


class _Request:
    def __init__(self, work: Callable[[Any], Any]) -> None:
        self.work = work
        self.done = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_ATTEMPT_FILE = re.compile(r"shard-\d{6,}\.attempt-\d+\.partial")


def shard_path(output_dir: str, job_id: int, shard: int, token: int, partial: bool
               ) -> pathlib.Path:
    name = f"shard-{shard:06d}.attempt-{token}" + (".partial" if partial else "")
    return pathlib.Path(output_dir) / f"job-{job_id}" / name


class Agent:
    """Claims and runs shards for one rank on a background thread (see the module doc).

    Args:
        runtime: the rank's :class:`pipefill.Runtime`.
        rank: this rank's name in the service (unique per process).
        conninfo / password_file: as :func:`pipefill.service._db.connection_options`
            (default: the PIPEFILL_SERVICE* environment).
        free_bytes: memory a fill job may use (default: measured, the largest free block of the
            runtime's arena, ``Runtime.memory_info()``).
        prefetch: leases held ready beyond the running one (0 or 1).
        poll_s: sleep between empty claims.
        reconnect_budget_s: how long one database call may spend reconnecting.
        job_request_timeout_s: bound on a job create/close handed to the trainer thread.
    """

    def __init__(self, runtime: Any, rank: str, *, conninfo: Optional[str] = None,
                 password_file: Optional[str] = None, free_bytes: Optional[int] = None,
                 prefetch: int = 1, poll_s: float = 0.05, capacity_interval_s: float = 0.5,
                 reconnect_budget_s: float = 60.0, job_request_timeout_s: float = 30.0) -> None:
        if prefetch not in (0, 1):
            raise PipeFillError(Result.INVALID_ARGUMENT, f"Agent prefetch {prefetch} must be 0 "
                                "or 1")
        limits.check_text("Agent rank", rank, limits.NAME_MAX_CHARS)
        self.runtime = runtime
        self.rank = rank
        self.db = _db.Reconnecting(_db.connection_options(conninfo, password_file=password_file),
                                   budget_s=reconnect_budget_s)
        self.fixed_free_bytes = None if free_bytes is None else int(free_bytes)
        self.free_bytes = self.fixed_free_bytes or 0
        """What the last advertisement said a job may use (bytes)."""
        self.prefetch = prefetch
        self.poll_s = poll_s
        self.capacity_interval_s = capacity_interval_s
        self.job_request_timeout_s = job_request_timeout_s
        self.counts = AgentCounts()
        self.error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._requests: Deque[_Request] = collections.deque()
        self._ready: Deque[Lease] = collections.deque()
        self._thread: Optional[threading.Thread] = None
        # Capacity, measured from the runtime's statistics on the agent thread.
        self._last_stats: Any = None
        self._last_stats_time = 0.0
        self.classes: List[Dict[str, Any]] = []
        """The bubble classes last measured: {"key", "p10_us", "per_iteration"} each."""
        self.memory: Any = None
        """The runtime's last :class:`pipefill.MemoryInfo` (None before the first)."""
        self._iterations_per_s = 0.0
        self._advertised_at = 0.0
        self.last_activity = time.monotonic()
        """When the agent last claimed or checkpointed (time.monotonic)."""

    # ---- trainer thread ----------------------------------------------------------------

    def start(self) -> "Agent":
        if self._thread is not None:
            raise PipeFillError(Result.INVALID_STATE, f"agent {self.rank} already started")
        self._thread = threading.Thread(target=self._main, name=f"pipefill-agent-{self.rank}",
                                        daemon=True)
        self._thread.start()
        return self

    def on_iteration_end(self, max_requests: int = 2) -> None:
        """Trainer thread, outside bubbles: runs up to ``max_requests`` job create/close.
        Called inside a bubble by mistake it does nothing (the requests wait)."""
        if self.runtime.in_bubble:
            return
        for _ in range(max_requests):
            try:
                request = self._requests.popleft()
            except IndexError:
                return
            try:
                request.result = request.work(self.runtime)
            except BaseException as error:  # noqa: BLE001 - handed to the agent thread
                request.error = error
            request.done.set()

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Trainer thread: stop claiming, give running/prefetched leases back (preemptions),
        serve the agent's last job requests; True when the agent thread ended in time."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        while self._thread is not None and self._thread.is_alive():
            self.on_iteration_end(max_requests=16)
            if time.monotonic() > deadline:
                return False
            self._thread.join(0.01)
        self.on_iteration_end(max_requests=16)
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- agent thread ------------------------------------------------------------------

    def _main(self) -> None:
        try:
            while not self._stop.is_set():
                self._advertise_if_due()
                lease = self._next_lease()
                if lease is None:
                    self._stop.wait(self.poll_s)
                    continue
                self._run(lease)
        except BaseException as error:  # noqa: BLE001 - the agent ends, the trainer goes on
            self.error = error
            logging.getLogger("pipefill").warning(
                "pipefill: the fill-job service agent of rank %s stopped (the trainer goes on): "
                "%s", self.rank, error)
        finally:
            try:
                while self._ready:
                    lease = self._ready.popleft()
                    self._call("select pipefill.pf_release(%s, %s, %s, %s, NULL)",
                               (lease.job_id, lease.shard, lease.token, lease.secret))
                    self.counts.preempted += 1
            except BaseException as error:  # noqa: BLE001
                self.error = self.error or error
            self.db.close()

    def _call(self, sql: str, args: tuple) -> Any:
        return self.db.call(lambda conn: conn.execute(sql, args).fetchone()[0])

    def _measure(self) -> None:
        """Per bubble class: the runtime's p10 duration and the class's bubbles per iteration
        (over the last interval, or since the start at the first measurement); the arena's
        largest free block and the device's memory (pfRuntimeGetMemoryInfo)."""
        now = time.monotonic()
        stats = self.runtime.stats()
        self.memory = self.runtime.memory_info()
        if self.fixed_free_bytes is None:
            self.free_bytes = self.memory.arena_largest_free_bytes
        last, self._last_stats = self._last_stats, stats
        elapsed, self._last_stats_time = now - self._last_stats_time, now
        before = {c.key: c.bubbles for c in last.classes} if last is not None else {}
        iterations = stats.iterations - (last.iterations if last is not None else 0)
        if last is not None and iterations > 0:
            self._iterations_per_s = iterations / elapsed
        if iterations <= 0:
            return  # no iteration ended in the interval: keep the last classes
        self.classes = [
            {"key": c.key, "p10_us": float(c.p10_us),
             "per_iteration": (c.bubbles - before.get(c.key, 0)) / iterations}
            for c in stats.classes if c.p10_us > 0 and c.bubbles_timed > 0]

    def bubble_p10_us(self) -> float:
        """The longest p10 duration of the bubble classes that occur (0 before a measurement)."""
        return max((c["p10_us"] for c in self.classes if c["per_iteration"] > 0), default=0.0)

    def _advertise_if_due(self) -> None:
        now = time.monotonic()
        if now - self._advertised_at < self.capacity_interval_s:
            return
        self._measure()
        self._advertised_at = now
        if self.classes:
            memory = self.memory
            self._call("select pipefill.pf_advertise(%s, %s, %s::jsonb, %s, %s, %s, %s)",
                       (self.rank, self.free_bytes, json.dumps(self.classes),
                        self._iterations_per_s, memory.arena_bytes, memory.device_free_bytes,
                        memory.device_total_bytes))

    def _next_lease(self) -> Optional[Lease]:
        if self._ready:
            return self._ready.popleft()
        if self.bubble_p10_us() <= 0:
            return None  # no bubble measured yet: nothing can be said to fit
        rows = self.db.call(lambda conn: conn.execute(
            "select * from pipefill.pf_claim(%s, %s, %s::jsonb, %s)",
            (self.rank, self.free_bytes, json.dumps(self.classes), 1 + self.prefetch)).fetchall())
        leases = [Lease(*row) for row in rows]
        for done in [lease for lease in leases if lease.shard < 0]:
            self._export_manifest(done.job_id, done.output_dir)
        leases = [lease for lease in leases if lease.shard >= 0]
        self.counts.claimed += len(leases)
        if not leases:
            return None
        self.last_activity = time.monotonic()
        self._ready.extend(leases[1:])
        return leases[0]

    def _job_request(self, work: Callable[[Any], Any]) -> Any:
        request = _Request(work)
        self._requests.append(request)
        if not request.done.wait(self.job_request_timeout_s):
            # The trainer stopped iterating: the request may still run later; say so.
            raise Stopping() if self._stop.is_set() else PipeFillError(
                Result.TIMEOUT, f"the trainer thread served no job request for "
                f"{self.job_request_timeout_s} s (is on_iteration_end called?)")
        if request.error is not None:
            raise request.error
        return request.result

    def _resume(self, lease: Lease, out: _HashingFile) -> int:
        """Copies the checkpoint's durable prefix into this attempt's file; the resume item."""
        ck = lease.checkpoint or {}
        try:
            next_item = int(ck["next"])
            size = int(ck["bytes"])
            path = pathlib.Path(ck["path"])
            # Only an earlier attempt's file of this very shard (a checkpoint names a path a
            # rank chose: never read anything else).
            own = shard_path(lease.output_dir, lease.job_id, lease.shard, 0, True)
            if (path.parent != own.parent or not _ATTEMPT_FILE.fullmatch(path.name)
                    or not path.name.startswith(f"shard-{lease.shard:06d}.")):
                return lease.item_start
            with open(path, "rb") as previous:
                prefix = previous.read(size)
        except (KeyError, TypeError, ValueError, OSError):
            return lease.item_start
        if (len(prefix) != size or hashlib.sha256(prefix).hexdigest() != ck.get("sha256")
                or not lease.item_start < next_item <= lease.item_end):
            return lease.item_start  # a torn or foreign prefix: redo the shard
        out.write(prefix)
        self.counts.resumed += 1
        return next_item

    def _run(self, lease: Lease) -> None:
        final = shard_path(lease.output_dir, lease.job_id, lease.shard, lease.token, False)
        partial = final.with_name(final.name + ".partial")
        try:
            runner = code.load_runner(lease.dist_name, lease.dist_version, lease.dist_sha256,
                                      lease.entry_point, lease.params)
        except code.CodeRefused as error:
            self.counts.refused += 1
            self._fail(lease, f"code refused before loading: {error.message}")
            return
        except Exception as error:  # noqa: BLE001 - the job's code failed to load
            self._fail(lease, f"loading {lease.entry_point}: {type(error).__name__}: {error}")
            return
        partial.parent.mkdir(parents=True, exist_ok=True)
        out = _HashingFile(partial)
        last_checkpoint: List[Optional[Dict[str, Any]]] = [lease.checkpoint]

        def checkpoint(next_item: int, durable: Optional[Tuple[int, str]] = None) -> None:
            if durable is None:
                out.sync()
                durable = (out.tell(), out.digest())
            state = {"next": int(next_item), "path": str(partial), "bytes": int(durable[0]),
                     "sha256": str(durable[1])}
            if self._stop.is_set():
                last_checkpoint[0] = state
                raise Stopping()
            renewed = self._call("select pipefill.pf_renew(%s, %s, %s, %s, %s::jsonb)",
                                 (lease.job_id, lease.shard, lease.token, lease.secret,
                                  json.dumps(state)))
            if not renewed:
                raise LeaseLost(f"shard {lease.job_id}/{lease.shard} token {lease.token}")
            last_checkpoint[0] = state
            self.last_activity = time.monotonic()
            for ready in list(self._ready):  # keep the prefetched lease alive too
                if not self._call("select pipefill.pf_renew(%s, %s, %s, %s, NULL)",
                                  (ready.job_id, ready.shard, ready.token, ready.secret)):
                    self._ready.remove(ready)  # expired meanwhile: it would only be fenced
                    self.counts.fenced += 1
            self._advertise_if_due()

        try:
            resume = self._resume(lease, out)
            ctx = ShardContext(
                runtime=self.runtime, job_id=lease.job_id, shard=lease.shard,
                item_start=lease.item_start, item_end=lease.item_end, resume_item=resume,
                params=lease.params, output=out, checkpoint=checkpoint,  # type: ignore[arg-type]
                item_cost_us=float(lease.item_cost_us),
                create_job=lambda spec: self._job_request(
                    spec if callable(spec) and not hasattr(spec, "_create")
                    else lambda rt: rt.create_job(spec)),
                close_job=lambda job: self._job_request(lambda rt: job.close()),
                stopping=self._stop)
            runner.run(ctx)
            out.sync()
            out.close()
        except LeaseLost:
            out.close()
            partial.unlink(missing_ok=True)
            self.counts.fenced += 1
            return
        except Stopping:
            out.close()
            state = last_checkpoint[0]
            released = self._call("select pipefill.pf_release(%s, %s, %s, %s, %s::jsonb)",
                                  (lease.job_id, lease.shard, lease.token, lease.secret,
                                   None if state is None else json.dumps(state)))
            self.counts.preempted += 1 if released else 0
            self.counts.fenced += 0 if released else 1
            return
        except _db.ConnectionLost:
            out.close()
            raise
        except Exception as error:  # noqa: BLE001 - the job's code failed this shard
            out.close()
            partial.unlink(missing_ok=True)
            self._fail(lease, f"{type(error).__name__}: {error}")
            return
        digest = out.hash.hexdigest()
        try:
            os.rename(partial, final)
            _fsync_dir(final.parent)
        except OSError as error:
            # E.g. the job completed meanwhile and its collection removed this stale attempt's
            # file: pf_fail is refused then (token not current) and nothing is counted.
            self._fail(lease, f"publishing the output {final}: {error.strerror}")
            return
        outcome = self._call("select pipefill.pf_commit(%s, %s, %s, %s, %s, %s, %s)",
                             (lease.job_id, lease.shard, lease.token, lease.secret, str(final),
                              digest, out.size))
        if outcome == "refused":
            final.unlink(missing_ok=True)  # fenced: never canonical
            self.counts.fenced += 1
            return
        self.counts.committed += 1
        if outcome == "completed":
            self._export_manifest(lease.job_id, lease.output_dir)

    def _export_manifest(self, job_id: int, output_dir: str) -> None:
        rows = self.db.call(lambda conn: conn.execute(
            "select * from pipefill.pf_manifest(%s)", (job_id,)).fetchall())
        write_manifest(pathlib.Path(output_dir) / f"job-{job_id}", job_id, rows)
        self.counts.manifests += 1

    def _fail(self, lease: Lease, message: str) -> bool:
        self.counts.failed += 1
        return self._call("select pipefill.pf_fail(%s, %s, %s, %s, %s)",
                          (lease.job_id, lease.shard, lease.token, lease.secret, message))
