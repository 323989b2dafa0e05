"""Loading a job's code: an entry point of an installed, allowlisted distribution, never a pickle.

A job names (distribution name, version, sha256, entry point). Before anything of the
distribution is imported, :func:`verify_distribution` checks that the installed distribution has
that version, that the sha256 of its RECORD file (the list of every installed file with its own
hash) is the named one, and that every file RECORD lists still has its recorded hash. Only then
does :func:`load_runner` load the entry point (group ``pipefill.service``) and call it with the
job's parameters; it must return a :class:`pipefill.service.runner.ShardRunner`.

``distribution_sha256(name)`` gives the value to allowlist (``pipefill allow NAME``).
"""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import threading
from typing import Any, Dict, Mapping, Tuple

from .. import PipeFillError, Result

ENTRY_POINT_GROUP = "pipefill.service"


class CodeRefused(PipeFillError):
    """The job's code is not what the allowlist names: nothing of it was imported."""

    def __init__(self, message: str) -> None:
        super().__init__(Result.INVALID_ARGUMENT, message)


def _distribution(name: str) -> metadata.Distribution:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise CodeRefused(f"distribution {name!r} is not installed") from None


def _record_bytes(dist: metadata.Distribution, name: str) -> bytes:
    text = dist.read_text("RECORD")
    if text is None:
        raise CodeRefused(f"distribution {name!r} has no RECORD file: its files cannot be "
                          "checked, so it cannot be allowlisted")
    return text.encode()


def distribution_sha256(name: str) -> str:
    """sha256 (hex) of the installed distribution's RECORD file: what the allowlist holds."""
    dist = _distribution(name)
    return hashlib.sha256(_record_bytes(dist, name)).hexdigest()


def verify_distribution(name: str, version: str, sha256: str) -> metadata.Distribution:
    """The installed distribution, after checking version, RECORD hash and every file's hash.

    Raises :class:`CodeRefused` naming the mismatch; imports nothing of the distribution.
    """
    dist = _distribution(name)
    if dist.version != version:
        raise CodeRefused(f"distribution {name!r} is version {dist.version}, the job names "
                          f"{version}")
    actual = hashlib.sha256(_record_bytes(dist, name)).hexdigest()
    if actual != sha256:
        raise CodeRefused(f"distribution {name!r} {version} has sha256 {actual}, the job names "
                          f"{sha256}")
    for file in dist.files or []:
        if file.hash is None:
            continue  # RECORD itself and compiled caches carry no hash
        if file.hash.mode != "sha256":
            raise CodeRefused(f"{name}: {file} is recorded with hash {file.hash.mode}, "
                              "only sha256 is accepted")
        try:
            data = file.read_binary()
        except OSError:
            raise CodeRefused(f"{name}: {file} is listed in RECORD but missing") from None
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if digest != file.hash.value:
            raise CodeRefused(f"{name}: {file} was modified after installation (sha256 "
                              "differs from RECORD)")
    return dist


_verified: Dict[Tuple[str, str, str, str], Any] = {}
_lock = threading.Lock()


def load_factory(name: str, version: str, sha256: str, entry_point: str) -> Any:
    """The entry point's object, loaded once per process after :func:`verify_distribution`."""
    key = (name, version, sha256, entry_point)
    with _lock:
        if key in _verified:
            return _verified[key]
    dist = verify_distribution(name, version, sha256)
    points = [ep for ep in dist.entry_points
              if ep.group == ENTRY_POINT_GROUP and ep.name == entry_point]
    if not points:
        raise CodeRefused(f"distribution {name!r} {version} has no entry point {entry_point!r} "
                          f"in group {ENTRY_POINT_GROUP!r}")
    factory = points[0].load()
    with _lock:
        _verified[key] = factory
    return factory


def load_runner(name: str, version: str, sha256: str, entry_point: str,
                params: Mapping[str, Any]) -> Any:
    """Verifies, loads and calls the entry point with the job's parameters; checks the result."""
    from .torch_runner import wrap
    factory = load_factory(name, version, sha256, entry_point)
    made = factory(dict(params))
    runner = wrap(made)
    if runner is None:
        raise PipeFillError(Result.INVALID_ARGUMENT,
                            f"entry point {entry_point!r} of {name!r} returned {made!r}, which "
                            "has no run(context) method (see pipefill.service.runner.ShardRunner)"
                            " and no model + dataset (a torch inference job)")
    return runner
