"""A completed job's manifest: the one winning output per shard, with its sha256.

``manifest.json`` (written to a temp name, fsynced, renamed) lists per shard its item range, the
winning attempt's fencing token, path, sha256 and size. Writing it also collects the losing
attempts: every ``shard-*.attempt-*`` file in the job's folder that the manifest does not name.
:func:`verify_manifest` re-hashes every listed file.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any, Dict, Iterable, List, Sequence

from .._enums import Result
from .._errors import PipeFillError

MANIFEST_NAME = "manifest.json"


def write_manifest(job_dir: pathlib.Path, job_id: int, rows: Iterable[Sequence[Any]]
                   ) -> Dict[str, int]:
    """Writes manifest.json from (shard, start, end, token, path, sha256, bytes) rows; removes
    the losing attempts' files. Returns {"shards": n, "collected": m}."""
    shards = [{"shard": int(r[0]), "items": [int(r[1]), int(r[2])], "token": int(r[3]),
               "path": str(r[4]), "sha256": str(r[5]), "bytes": int(r[6])} for r in rows]
    if not shards:
        raise PipeFillError(Result.INVALID_STATE, f"job {job_id} has no committed shards to "
                            "list (is it completed?)")
    job_dir.mkdir(parents=True, exist_ok=True)
    temp = job_dir / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
    with open(temp, "w") as file:
        json.dump({"job": job_id, "shards": shards}, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    os.rename(temp, job_dir / MANIFEST_NAME)
    canonical = {pathlib.Path(s["path"]).name for s in shards}
    collected = 0
    for path in job_dir.glob("shard-*.attempt-*"):
        if path.name not in canonical:
            path.unlink(missing_ok=True)
            collected += 1
    return {"shards": len(shards), "collected": collected}


def file_sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_manifest(path: pathlib.Path) -> List[str]:
    """Problems found (empty when every listed file exists with its listed sha256 and size)."""
    manifest = json.loads(pathlib.Path(path).read_text())
    problems = []
    for entry in manifest["shards"]:
        file = pathlib.Path(entry["path"])
        if not file.exists():
            problems.append(f"shard {entry['shard']}: {file} is missing")
        elif file.stat().st_size != entry["bytes"] or file_sha256(file) != entry["sha256"]:
            problems.append(f"shard {entry['shard']}: {file} does not match its sha256/size")
    return problems
