"""The service's size and range limits (docs/service.md, Limits) and the checks that enforce them.

Every submitted field and command-line argument is checked here before anything is written or
created; a bad one raises :class:`UsageError`, one line naming the field (or option) and the
value, shortened when long. schema.sql's constraint ``jobs_limits_v1`` holds the same limits for
rows a submitter inserts directly.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from .._enums import Result
from .._errors import PipeFillError

NAME_MAX_CHARS = 200
"""Job name, dist_name, dist_version, entry_point and rank names."""
DATASET_MAX_CHARS = 4096
OUTPUT_DIR_MAX_BYTES = 1024
"""UTF-8 bytes; the attempt files' paths below it stay far under PATH_MAX (4096)."""
PATH_COMPONENT_MAX_BYTES = 255
"""NAME_MAX of Linux filesystems."""
PARAMS_MAX_BYTES = 1 << 20
"""The job's params as JSON text (every claim of the job carries them)."""
PARAMS_MAX_DEPTH = 64
JOB_FILE_MAX_BYTES = 2 << 20
"""A job file is refused before it is read past this size."""
ITEMS_MAX = 1 << 62
"""item_count and shard_items (shard arithmetic stays within a signed 64-bit integer)."""
SHARDS_MAX = 10_000_000
LEASE_TTL_MIN_S = 0.1
LEASE_TTL_MAX_S = 7 * 24 * 3600.0
ITEM_COST_US_MAX = 1e9
MAX_FAILURES_MAX = 1_000_000
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
"""Job ids, memory_bytes."""
RANK_US_MAX = 1e7
"""`pipefill rank`'s --bubble-us / --compute-us (10 s)."""


class UsageError(PipeFillError):
    """A bad argument or field, refused before anything was written (the CLI exits 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(Result.INVALID_ARGUMENT, message)

    def __reduce__(self):  # picklable: the base class's form passes (code, message)
        return (type(self), (self.message,))


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)``, shortened to about ``limit`` characters with the full length named."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, (str, bytes)) else ""
    return text[:limit] + "..." + size


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(what: str, value: Any, low: int, high: int) -> int:
    if not _is_int(value) or not low <= value <= high:
        raise UsageError(f"{what} = {shown(value)} must be an integer in [{low}, {high}]")
    return int(value)


def check_number(what: str, value: Any, low: float, high: float, *,
                 low_open: bool = False) -> float:
    """A finite int or float in [low, high] (``(low, high]`` with ``low_open``)."""
    ok = ((_is_int(value) or isinstance(value, float)) and math.isfinite(value)
          and (value > low if low_open else value >= low) and value <= high)
    if not ok:
        bracket = "(" if low_open else "["
        raise UsageError(f"{what} = {shown(value)} must be a finite number in "
                         f"{bracket}{low:g}, {high:g}]")
    return float(value)


def check_text(what: str, value: Any, max_chars: int, *, min_chars: int = 1,
               max_bytes: Optional[int] = None) -> str:
    """A string of ``min_chars..max_chars`` characters (and at most ``max_bytes`` UTF-8
    bytes) without control characters, encodable as UTF-8 (what PostgreSQL text holds)."""
    if not isinstance(value, str):
        raise UsageError(f"{what} = {shown(value)} must be a string")
    if not min_chars <= len(value) <= max_chars:
        raise UsageError(f"{what} = {shown(value)} must be {min_chars}..{max_chars} characters")
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise UsageError(f"{what} = {shown(value)} holds the control character {bad!r}")
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise UsageError(f"{what} = {shown(value)} is not valid Unicode (character "
                         f"{value[error.start]!r} at {error.start})") from None
    if max_bytes is not None and len(encoded) > max_bytes:
        raise UsageError(f"{what} = {shown(value)} is {len(encoded)} bytes as UTF-8 (at most "
                         f"{max_bytes})")
    return value


def check_absolute_path(what: str, value: Any) -> str:
    """An absolute, normalised POSIX path within OUTPUT_DIR_MAX_BYTES (components within
    PATH_COMPONENT_MAX_BYTES); returned without a trailing slash."""
    check_text(what, value, OUTPUT_DIR_MAX_BYTES, max_bytes=OUTPUT_DIR_MAX_BYTES)
    if not value.startswith("/"):
        raise UsageError(f"{what} = {shown(value)} must be an absolute path")
    parts = [p for p in value.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise UsageError(f"{what} = {shown(value)} must not hold '.' or '..' components")
    long = next((p for p in parts if len(p.encode("utf-8")) > PATH_COMPONENT_MAX_BYTES), None)
    if long is not None:
        raise UsageError(f"{what} = {shown(value)} has a component of "
                         f"{len(long.encode('utf-8'))} bytes (at most "
                         f"{PATH_COMPONENT_MAX_BYTES})")
    return "/" + "/".join(parts)


def check_json_value(what: str, value: Any, depth: int = 0) -> None:
    """Plain JSON (dict with string keys, list, str, finite number, bool, None), nested at most
    PARAMS_MAX_DEPTH deep, without NUL characters (PostgreSQL's jsonb refuses them)."""
    if depth > PARAMS_MAX_DEPTH:
        raise UsageError(f"{what} nests deeper than {PARAMS_MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise UsageError(f"{what} has the key {shown(key)}: keys must be strings")
            if "\x00" in key:
                raise UsageError(f"{what} has a key holding a NUL character: {shown(key)}")
            check_json_value(f"{what}[{shown(key, 30)}]", item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json_value(f"{what}[{index}]", item, depth + 1)
    elif isinstance(value, str):
        if "\x00" in value:
            raise UsageError(f"{what} = {shown(value)} holds a NUL character")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UsageError(f"{what} = {value!r} is not a finite number (JSON has none)")
    elif value is None or isinstance(value, (bool, int)):
        pass
    else:
        raise UsageError(f"{what} = {shown(value)} is a {type(value).__name__}, not a JSON "
                         "value")
