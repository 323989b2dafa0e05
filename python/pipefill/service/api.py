"""Submitting, watching and cancelling fill jobs (the submitter's side), and the owner's setup.

    svc = Service()                       # PIPEFILL_SERVICE (+ PIPEFILL_SERVICE_PASSWORD_FILE)
    job = svc.submit(JobSpec(name="embed", dist_name="my-embedder", entry_point="embed",
                             dataset="s3://docs/part-*", item_count=200_000_000,
                             shard_items=10_000, output_dir="/shared/out/embed"))
    svc.status()                           # jobs (progress, ETA), ranks' capacity
    svc.cancel(job)

A job's code is (distribution, version, sha256 of its RECORD, entry point); the version and
hash default to the distribution installed where ``submit`` runs, and the database refuses the
job unless that triple is in the allowlist (``Service.allow``, owner only).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import pathlib
from typing import Any, Dict, List, Optional

from .. import PipeFillError, Result
from . import _db, code
from .manifest import MANIFEST_NAME, write_manifest


@dataclasses.dataclass
class JobSpec:
    name: str
    dist_name: str
    entry_point: str
    dataset: str
    item_count: int
    shard_items: int
    output_dir: str
    dist_version: Optional[str] = None
    dist_sha256: Optional[str] = None
    params: Dict[str, Any] = dataclasses.field(default_factory=dict)
    memory_bytes: int = 0
    item_cost_us: float = 0.0
    """One item's duration: a shard is only claimed by ranks whose p10 bubble is at least this."""
    priority: int = 0
    deadline: Optional[datetime.datetime] = None
    lease_ttl_s: float = 30.0
    max_failures: int = 3

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as error:
            raise PipeFillError(Result.INVALID_ARGUMENT, f"job file is not JSON: {error}"
                                ) from None
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise PipeFillError(Result.INVALID_ARGUMENT, f"job file has unknown fields {unknown}"
                                f" (known: {sorted(known)})")
        if isinstance(fields.get("deadline"), str):
            fields["deadline"] = datetime.datetime.fromisoformat(fields["deadline"])
        try:
            return cls(**fields)
        except TypeError as error:
            raise PipeFillError(Result.INVALID_ARGUMENT, f"job file: {error}") from None


@dataclasses.dataclass
class JobProgress:
    id: int
    name: str
    owner: str
    state: str
    priority: int
    item_count: int
    shards: int
    committed: int
    leased: int
    pending: int
    attempts: int
    expirations: int
    preemptions: int
    failures: int
    message: Optional[str]
    eta_s: Optional[float]


def _sql_error(error: Exception) -> PipeFillError:
    diag = getattr(error, "diag", None)
    text = (getattr(diag, "message_primary", None) or str(error)).strip()
    return PipeFillError(Result.INVALID_ARGUMENT, text)


class Service:
    """A submitter's (or the owner's) connection to the service database."""

    def __init__(self, conninfo: Optional[str] = None, *, password_file: Optional[str] = None
                 ) -> None:
        self.options = _db.connection_options(conninfo, password_file=password_file)
        self.conn = _db.connect(self.options)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Service":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _execute(self, sql: str, args: tuple = ()) -> Any:
        import psycopg
        try:
            return self.conn.execute(sql, args)
        except psycopg.errors.Error as error:
            if _db.is_connection_error(error):
                raise
            raise _sql_error(error) from None

    # ---- owner ---------------------------------------------------------------------------

    def init_schema(self) -> None:
        """Owner: creates or updates the schema, roles and policies (idempotent)."""
        _db.apply_schema(self.conn)

    def allow(self, dist_name: str, dist_version: Optional[str] = None,
              sha256: Optional[str] = None) -> tuple:
        """Owner: allowlists (name, version, sha256); version/hash default to the installed
        distribution's. Returns the triple."""
        if dist_version is None or sha256 is None:
            dist = code.verify_distribution(
                dist_name, dist_version or _installed_version(dist_name),
                sha256 or code.distribution_sha256(dist_name))
            dist_version, sha256 = dist.version, code.distribution_sha256(dist_name)
        self._execute("insert into pipefill.allowlist (dist_name, dist_version, sha256) "
                      "values (%s, %s, %s) on conflict do nothing",
                      (dist_name, dist_version, sha256))
        return dist_name, dist_version, sha256

    # ---- submitter -----------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> int:
        """Creates the job and its shards; refused (PipeFillError) unless allowlisted."""
        _validate(spec)
        version = spec.dist_version or _installed_version(spec.dist_name)
        sha256 = spec.dist_sha256 or code.distribution_sha256(spec.dist_name)
        if not pathlib.PurePosixPath(spec.output_dir).is_absolute():
            raise PipeFillError(Result.INVALID_ARGUMENT, f"output_dir {spec.output_dir!r} must "
                                "be an absolute path")
        row = self._execute(
            "insert into pipefill.jobs (name, dist_name, dist_version, dist_sha256, entry_point,"
            " params, dataset, item_count, shard_items, output_dir, memory_bytes, item_cost_us,"
            " priority, deadline, lease_ttl_s, max_failures) values (%s, %s, %s, %s, %s,"
            " %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) returning id",
            (spec.name, spec.dist_name, version, sha256, spec.entry_point,
             json.dumps(spec.params), spec.dataset, spec.item_count, spec.shard_items,
             spec.output_dir, spec.memory_bytes, spec.item_cost_us, spec.priority,
             spec.deadline, spec.lease_ttl_s, spec.max_failures)).fetchone()
        return int(row[0])

    def cancel(self, job_id: int) -> bool:
        """Cancels a running job of this user; False when it is not (any longer) running."""
        return bool(self._execute("select pipefill.pf_cancel(%s)", (job_id,)).fetchone()[0])

    def jobs(self, job_id: Optional[int] = None) -> List[JobProgress]:
        rows = self._execute(
            "select id, name, owner, state, priority, item_count, shards, committed, leased,"
            " pending, attempts, expirations, preemptions, failures, message,"
            " extract(epoch from last_commit - least(first_commit, created_at)) from"
            " pipefill.job_progress where %s::bigint is null or id = %s order by id",
            (job_id, job_id)).fetchall()
        result = []
        for r in rows:
            elapsed = float(r[15]) if r[15] is not None else None
            remaining = r[6] - r[7]
            eta = (elapsed / r[7] * remaining if elapsed and r[7] and r[3] == "running"
                   else None)
            result.append(JobProgress(*r[:15], eta_s=eta))
        return result

    def ranks(self) -> List[Dict[str, Any]]:
        rows = self._execute("select rank, free_bytes, bubble_p10_us, bubbles_per_iteration,"
                             " iterations_per_s, extract(epoch from now() - seen_at), classes,"
                             " arena_bytes, device_free_bytes, device_total_bytes"
                             " from pipefill.ranks order by rank").fetchall()
        keys = ("rank", "free_bytes", "bubble_p10_us", "bubbles_per_iteration",
                "iterations_per_s", "seen_s_ago", "classes", "arena_bytes", "device_free_bytes",
                "device_total_bytes")
        return [dict(zip(keys, r)) for r in rows]

    def shards(self, job_id: int) -> List[Dict[str, Any]]:
        cur = self._execute("select * from pipefill.shards where job_id = %s order by shard",
                            (job_id,))
        names = [c.name for c in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    def attempts(self, job_id: int) -> List[Dict[str, Any]]:
        cur = self._execute("select * from pipefill.attempts where job_id = %s order by token",
                            (job_id,))
        names = [c.name for c in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    def export_manifest(self, job_id: int) -> pathlib.Path:
        """(Re)writes a completed job's manifest.json; returns its path."""
        job = self._execute("select state, output_dir from pipefill.jobs where id = %s",
                            (job_id,)).fetchone()
        if job is None:
            raise PipeFillError(Result.INVALID_ARGUMENT, f"job {job_id} does not exist (or is "
                                "not yours)")
        if job[0] != "completed":
            raise PipeFillError(Result.INVALID_STATE, f"job {job_id} is {job[0]}, not completed")
        rows = self._execute("select shard, item_start, item_end, committed_token, output_path,"
                             " output_sha256, output_bytes from pipefill.shards where job_id ="
                             " %s order by shard", (job_id,)).fetchall()
        job_dir = pathlib.Path(job[1]) / f"job-{job_id}"
        write_manifest(job_dir, job_id, rows)
        return job_dir / MANIFEST_NAME


def _validate(spec: JobSpec) -> None:
    """Names the first bad field (the database's CHECK constraints back this up)."""
    def bad(field: str, rule: str) -> PipeFillError:
        return PipeFillError(Result.INVALID_ARGUMENT,
                             f"JobSpec.{field} = {getattr(spec, field)!r} {rule}")

    for field in ("name", "dist_name", "entry_point", "dataset"):
        value = getattr(spec, field)
        if not isinstance(value, str) or not 1 <= len(value) <= 200:
            raise bad(field, "must be a string of 1..200 characters")
    for field, low in (("item_count", 1), ("shard_items", 1), ("memory_bytes", 0),
                       ("max_failures", 1)):
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise bad(field, f"must be an int >= {low}")
    for field, positive in (("item_cost_us", False), ("lease_ttl_s", True)):
        value = getattr(spec, field)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value < 0 or (positive and value == 0)):
            raise bad(field, "must be a finite number " + ("> 0" if positive else ">= 0"))
    if not isinstance(spec.params, dict):
        raise bad("params", "must be a JSON object (dict)")


def _installed_version(dist_name: str) -> str:
    import importlib.metadata as metadata
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        raise code.CodeRefused(f"distribution {dist_name!r} is not installed here: name its "
                               "dist_version and dist_sha256 explicitly") from None
