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
import os
import pathlib
import re
import stat
from typing import Any, Dict, List, Optional

from .._enums import Result
from .._errors import PipeFillError
from . import _db, code, limits
from .limits import UsageError, shown
from .manifest import MANIFEST_NAME, write_manifest


@dataclasses.dataclass
class JobSpec:
    """A job: its code, input, output, needs and policy (docs/service.md, Model; the limits of
    each field: docs/service.md, Limits, and :mod:`pipefill.service.limits`)."""
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
    """A timezone-aware date and time (one without a timezone is taken as UTC)."""
    lease_ttl_s: float = 30.0
    max_failures: int = 3

    @classmethod
    def from_file(cls, path: "str | pathlib.Path") -> "JobSpec":
        """The spec in a JSON job file (UTF-8, at most JOB_FILE_MAX_BYTES), validated."""
        path = pathlib.Path(path)
        where = shown(str(path), 400)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise UsageError(f"job file {where} is not a regular file")
            with open(path, "rb") as file:
                data = file.read(limits.JOB_FILE_MAX_BYTES + 1)
        except OSError as error:
            raise UsageError(f"cannot read job file {where}: "
                             f"{error.strerror or error}") from None
        if len(data) > limits.JOB_FILE_MAX_BYTES:
            raise UsageError(f"job file {where} is larger than "
                             f"{limits.JOB_FILE_MAX_BYTES} bytes (params are limited to "
                             f"{limits.PARAMS_MAX_BYTES} bytes of JSON)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UsageError(f"job file {where} is not UTF-8 text (byte "
                             f"0x{data[error.start]:02x} at offset {error.start})") from None
        return cls.from_json(text, source=f"job file {where}")

    @classmethod
    def from_json(cls, text: str, *, source: str = "job file") -> "JobSpec":
        """The spec in JSON text (an object of JobSpec's fields), validated."""
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as error:
            raise UsageError(f"{source} is not JSON: {error.msg} at line {error.lineno} "
                             f"column {error.colno}") from None
        except (ValueError, RecursionError) as error:  # e.g. an integer of 5000 digits
            raise UsageError(f"{source} is not usable JSON: {str(error)[:200]}") from None
        if not isinstance(fields, dict):
            kind = {list: "an array", str: "a string", bool: "a boolean", int: "a number",
                    float: "a number", type(None): "null"}.get(type(fields), "a value")
            raise UsageError(f"{source} must hold a JSON object of JobSpec fields, not "
                             f"{kind} ({shown(fields, 40)})")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise UsageError(f"{source} has unknown fields "
                             f"{', '.join(shown(u, 40) for u in unknown)} (known: "
                             f"{', '.join(known)})")
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]  # type: ignore[misc]
        missing = [name for name in required if name not in fields]
        if missing:
            raise UsageError(f"{source} is missing the fields {missing}")
        fields["deadline"] = _parse_deadline(fields.get("deadline"))
        return validated(cls(**fields))


def _parse_deadline(value: Any) -> Optional[datetime.datetime]:
    if value is None or isinstance(value, datetime.datetime):
        return value
    if isinstance(value, str) and len(value) <= 64:
        try:
            return datetime.datetime.fromisoformat(value)
        except ValueError:
            pass
    raise UsageError(f"JobSpec.deadline = {shown(value)} is not an ISO 8601 date and time "
                     "(e.g. \"2030-01-31T18:00:00+00:00\")")


def validated(spec: JobSpec) -> JobSpec:
    """``spec`` with every field checked against docs/service.md's limits (UsageError names
    the first bad field and its value); returns a normalised copy (output_dir without a
    trailing slash, a deadline with a timezone)."""
    def field(name: str) -> str:
        return f"JobSpec.{name}"

    for name in ("name", "dist_name", "entry_point"):
        limits.check_text(field(name), getattr(spec, name), limits.NAME_MAX_CHARS)
    limits.check_text(field("dataset"), spec.dataset, limits.DATASET_MAX_CHARS)
    if spec.dist_version is not None:
        limits.check_text(field("dist_version"), spec.dist_version, limits.NAME_MAX_CHARS)
    if spec.dist_sha256 is not None and (not isinstance(spec.dist_sha256, str)
                                         or not _SHA256.fullmatch(spec.dist_sha256)):
        raise UsageError(f"JobSpec.dist_sha256 = {shown(spec.dist_sha256)} must be 64 "
                         "lowercase hex digits")
    output_dir = limits.check_absolute_path(field("output_dir"), spec.output_dir)
    item_count = limits.check_int(field("item_count"), spec.item_count, 1, limits.ITEMS_MAX)
    shard_items = limits.check_int(field("shard_items"), spec.shard_items, 1, limits.ITEMS_MAX)
    shards = (item_count - 1) // shard_items + 1
    if shards > limits.SHARDS_MAX:
        raise UsageError(f"JobSpec.shard_items = {shard_items} splits item_count = {item_count}"
                         f" into {shards} shards (at most {limits.SHARDS_MAX}): raise it")
    limits.check_int(field("memory_bytes"), spec.memory_bytes, 0, limits.INT64_MAX)
    limits.check_number(field("item_cost_us"), spec.item_cost_us, 0.0, limits.ITEM_COST_US_MAX)
    limits.check_int(field("priority"), spec.priority, limits.INT32_MIN, limits.INT32_MAX)
    limits.check_number(field("lease_ttl_s"), spec.lease_ttl_s, limits.LEASE_TTL_MIN_S,
                        limits.LEASE_TTL_MAX_S)
    limits.check_int(field("max_failures"), spec.max_failures, 1, limits.MAX_FAILURES_MAX)
    deadline = spec.deadline
    if deadline is not None:
        if not isinstance(deadline, datetime.datetime):
            raise UsageError(f"JobSpec.deadline = {shown(deadline)} must be a datetime")
        if deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=datetime.timezone.utc)
    if not isinstance(spec.params, dict):
        raise UsageError(f"JobSpec.params = {shown(spec.params)} must be a JSON object (dict)")
    limits.check_json_value("JobSpec.params", spec.params)
    size = len(_params_json(spec.params).encode("utf-8"))
    if size > limits.PARAMS_MAX_BYTES:
        raise UsageError(f"JobSpec.params is {size} bytes of JSON (at most "
                         f"{limits.PARAMS_MAX_BYTES}): pass large inputs through the dataset")
    return dataclasses.replace(spec, output_dir=output_dir, deadline=deadline)


def _params_json(params: Dict[str, Any]) -> str:
    try:
        return json.dumps(params, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as error:
        raise UsageError(f"JobSpec.params cannot be written as JSON: {str(error)[:200]}"
                         ) from None


_SHA256 = re.compile(r"[0-9a-f]{64}")


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
        """Owner: creates or updates the schema, roles and policies (idempotent; upgrades a
        database of an earlier release in place). Refused, naming the user, for a login that
        may not (a submitter or rank login): nothing is changed then (one transaction)."""
        import psycopg
        try:
            _db.apply_schema(self.conn)
        except psycopg.errors.Error as error:
            if _db.is_connection_error(error):
                raise
            user = self.options.get("user") or "this login"
            if isinstance(error, psycopg.errors.InsufficientPrivilege):
                raise PipeFillError(Result.INVALID_STATE,
                                    f"only the service's owner role (one that may create roles "
                                    f"and the schema pipefill, or owns it) may apply the "
                                    f"schema; {user} may not, nothing was changed: "
                                    f"{_sql_error(error).message}") from None
            raise PipeFillError(Result.INVALID_STATE, f"applying the schema as {user} failed, "
                                f"nothing was changed: {_sql_error(error).message}") from None

    def allow(self, dist_name: str, dist_version: Optional[str] = None,
              sha256: Optional[str] = None) -> tuple:
        """Owner: allowlists (name, version, sha256); version/hash default to the installed
        distribution's. Returns the triple."""
        limits.check_text("dist", dist_name, limits.NAME_MAX_CHARS)
        if dist_version is not None:
            limits.check_text("--version", dist_version, limits.NAME_MAX_CHARS)
        if sha256 is not None and (not isinstance(sha256, str) or not _SHA256.fullmatch(sha256)):
            raise UsageError(f"--sha256 = {shown(sha256)} must be 64 lowercase hex digits")
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
        """Creates the job and its shards; returns its id. Every field is checked first
        (:class:`UsageError` naming the field and value; nothing is written), output_dir must
        be an existing folder, and the database refuses code that is not allowlisted."""
        spec = validated(spec)
        _check_output_dir(spec.output_dir)
        version = spec.dist_version or _installed_version(spec.dist_name)
        sha256 = spec.dist_sha256 or code.distribution_sha256(spec.dist_name)
        row = self._execute(
            "insert into pipefill.jobs (name, dist_name, dist_version, dist_sha256, entry_point,"
            " params, dataset, item_count, shard_items, output_dir, memory_bytes, item_cost_us,"
            " priority, deadline, lease_ttl_s, max_failures) values (%s, %s, %s, %s, %s,"
            " %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) returning id",
            (spec.name, spec.dist_name, version, sha256, spec.entry_point,
             _params_json(spec.params), spec.dataset, spec.item_count, spec.shard_items,
             spec.output_dir, spec.memory_bytes, spec.item_cost_us, spec.priority,
             spec.deadline, spec.lease_ttl_s, spec.max_failures)).fetchone()
        return int(row[0])

    def cancel(self, job_id: int) -> bool:
        """Cancels a running job of this user; False when it is not (any longer) running."""
        check_job_id(job_id)
        return bool(self._execute("select pipefill.pf_cancel(%s)", (job_id,)).fetchone()[0])

    def jobs(self, job_id: Optional[int] = None) -> List[JobProgress]:
        """Progress of this user's jobs (of job ``job_id`` only: empty when it is not one)."""
        if job_id is not None:
            check_job_id(job_id)
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
        check_job_id(job_id)
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


def check_job_id(job_id: Any) -> int:
    return limits.check_int("job id", job_id, 1, limits.INT64_MAX)


def _check_output_dir(path: str) -> None:
    """output_dir must be an existing folder here: the submitter reaches the ranks' shared
    filesystem (docs/service.md, Deploying)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise UsageError(f"JobSpec.output_dir = {shown(path)}: {error.strerror} (it must be an "
                         "existing folder of the filesystem every rank reaches)") from None
    if not stat.S_ISDIR(mode):
        raise UsageError(f"JobSpec.output_dir = {shown(path)} is not a directory")


def _installed_version(dist_name: str) -> str:
    import importlib.metadata as metadata
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        raise code.CodeRefused(f"distribution {dist_name!r} is not installed here: name its "
                               "dist_version and dist_sha256 explicitly") from None
