"""Loading a job's code: an entry point of an installed, allowlisted distribution, never a pickle.

A job names (distribution name, version, sha256, entry point). Before anything of the
distribution is imported, :func:`verify_distribution` checks that the installed distribution has
that version, that the sha256 of its RECORD file (the list of every installed file with its own
hash) is the named one, that every file RECORD lists still has its recorded hash, and that its
packages' folders hold no file RECORD does not list (an added module), bytecode caches aside.

What is imported is what was verified: :func:`load_factory` reads each file RECORD lists once,
checks its hash on the bytes read and writes them into a private copy (a fresh 0700 folder of
this process), then imports the distribution's top-level modules from that copy only, through
a finder placed first on ``sys.meta_path``. Modules are compiled from the verified source
bytes: bytecode caches (``__pycache__/*.pyc``) are neither copied, read nor written, so a
tampered ``.pyc`` next to the installed files never runs. A module of the distribution's
packages that is not in the copy cannot be imported at all (no fallback to ``sys.path``). Only
then is the entry point (group ``pipefill.service``) loaded and called with the job's
parameters; it must return a :class:`pipefill.service.runner.ShardRunner`.

``distribution_sha256(name)`` gives the value to allowlist (``pipefill allow NAME``).
"""
from __future__ import annotations

import atexit
import base64
import hashlib
import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import importlib.util
import os
import pathlib
import shutil
import sys
import tempfile
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from .._enums import Result
from .._errors import PipeFillError

ENTRY_POINT_GROUP = "pipefill.service"
_BYTECODE_SUFFIXES = (".pyc", ".pyo")


class CodeRefused(PipeFillError):
    """The job's code is not what the allowlist names: nothing of it was imported."""

    def __init__(self, message: str) -> None:
        super().__init__(Result.INVALID_ARGUMENT, message)

    def __reduce__(self):  # picklable: the base class's form passes (code, message)
        return (type(self), (self.message,))


def _distribution(name: str) -> metadata.Distribution:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise CodeRefused(f"distribution {name!r} is not installed") from None
    except (ValueError, TypeError) as error:  # a malformed name
        raise CodeRefused(f"distribution name {name!r}: {error}") from None


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


def _is_bytecode(relative: str) -> bool:
    return relative.endswith(_BYTECODE_SUFFIXES) or "/__pycache__/" in f"/{relative}"


def _importable_files(dist: metadata.Distribution, name: str) -> List[Any]:
    """RECORD's files below the distribution's root that an import may read: everything but
    bytecode, metadata folders and files installed elsewhere (scripts, ``../``)."""
    files = []
    for file in dist.files or []:
        relative = file.as_posix()
        top = relative.split("/", 1)[0]
        if (relative.startswith(("/", "../")) or top.endswith((".dist-info", ".data"))
                or _is_bytecode(relative)):
            continue
        if file.hash is None:
            raise CodeRefused(f"{name}: {relative} is listed in RECORD without a hash")
        if file.hash.mode != "sha256":
            raise CodeRefused(f"{name}: {relative} is recorded with hash {file.hash.mode}, "
                              "only sha256 is accepted")
        files.append(file)
    return files


def _verified_bytes(name: str, file: Any) -> bytes:
    """The file's bytes, read once, after checking them against RECORD's hash."""
    try:
        data = file.read_binary()
    except OSError:
        raise CodeRefused(f"{name}: {file} is listed in RECORD but missing") from None
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if digest != file.hash.value:
        raise CodeRefused(f"{name}: {file} was modified after installation (sha256 differs "
                          "from RECORD)")
    return data


def _top_level(files: Sequence[Any]) -> Tuple[Set[str], Set[str]]:
    """(top-level module names, package folders relative to the root that hold an
    ``__init__.py`` of this distribution)."""
    names: Set[str] = set()
    packages: Set[str] = set()
    for file in files:
        parts = file.as_posix().split("/")
        first = parts[0]
        if len(parts) == 1:
            stem = first.split(".", 1)[0]
            if first.endswith(".py") or any(first.endswith(s) for s in
                                            importlib.machinery.EXTENSION_SUFFIXES):
                names.add(stem)
        else:
            names.add(first)
        if parts[-1] == "__init__.py":
            packages.add("/".join(parts[:-1]))
    return {n for n in names if n.isidentifier()}, packages


def _unlisted_files(dist: metadata.Distribution, packages: Set[str],
                    listed: Set[str]) -> List[str]:
    """Files inside the distribution's own packages that RECORD does not list (bytecode caches
    aside: they are never read)."""
    root = pathlib.Path(str(dist.locate_file("")))
    extra = []
    for package in sorted(packages):
        folder = root / package
        for path in folder.rglob("*"):
            if path.is_dir():
                continue
            relative = path.relative_to(root).as_posix()
            if relative not in listed and not _is_bytecode(relative):
                extra.append(relative)
    return extra


def verify_distribution(name: str, version: str, sha256: str) -> metadata.Distribution:
    """The installed distribution, after checking version, RECORD hash, every file's hash and
    that its packages hold no unlisted file.

    Raises :class:`CodeRefused` naming the mismatch; imports nothing of the distribution.
    """
    dist, _ = _verify(name, version, sha256, keep=False)
    return dist


def _verify(name: str, version: str, sha256: str, *, keep: bool
            ) -> Tuple[metadata.Distribution, List[Tuple[str, bytes]]]:
    dist = _distribution(name)
    if dist.version != version:
        raise CodeRefused(f"distribution {name!r} is version {dist.version}, the job names "
                          f"{version}")
    actual = hashlib.sha256(_record_bytes(dist, name)).hexdigest()
    if actual != sha256:
        raise CodeRefused(f"distribution {name!r} {version} has sha256 {actual}, the job names "
                          f"{sha256}")
    files = _importable_files(dist, name)
    contents = []
    for file in files:
        data = _verified_bytes(name, file)
        if keep:
            contents.append((file.as_posix(), data))
    _, packages = _top_level(files)
    extra = _unlisted_files(dist, packages, {f.as_posix() for f in dist.files or []})
    if extra:
        more = f", and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise CodeRefused(f"{name}: {extra[0]} is not listed in RECORD (a file added after "
                          f"installation{more})")
    return dist, contents


class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles the verified copy's source; never reads or writes a bytecode cache."""

    def get_code(self, fullname: str) -> Any:
        source = self.get_data(self.path)
        return compile(source, self.path, "exec", dont_inherit=True)

    def set_data(self, path: str, data: bytes, *, _mode: int = 0o666) -> None:
        return None


class _VerifiedFinder(importlib.abc.MetaPathFinder):
    """Finds a verified distribution's top-level modules (and their submodules) in its private
    copy, and nowhere else: a name of those packages missing from the copy is an ImportError."""

    def __init__(self, dist_name: str, root: pathlib.Path, top_level: Set[str]) -> None:
        self.dist_name = dist_name
        self.root = root
        self.top_level = top_level

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname.partition(".")[0] not in self.top_level:
            return None
        base = self.root.joinpath(*fullname.split("."))
        init = base / "__init__.py"
        if init.is_file():
            return importlib.util.spec_from_file_location(
                fullname, str(init), loader=_SourceOnlyLoader(fullname, str(init)),
                submodule_search_locations=[str(base)])
        module = base.with_name(base.name + ".py")
        if module.is_file():
            return importlib.util.spec_from_file_location(
                fullname, str(module), loader=_SourceOnlyLoader(fullname, str(module)))
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            extension = base.with_name(base.name + suffix)
            if extension.is_file():
                return importlib.util.spec_from_file_location(
                    fullname, str(extension),
                    loader=importlib.machinery.ExtensionFileLoader(fullname, str(extension)))
        if base.is_dir():  # a namespace package of the distribution
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [str(base)]
            return spec
        raise ModuleNotFoundError(f"{fullname} is not part of the verified copy of "
                                  f"{self.dist_name}", name=fullname)


_verified: Dict[Tuple[str, str, str, str], Any] = {}
_finders: Dict[str, Tuple[Tuple[str, str, str], _VerifiedFinder]] = {}
_copies_root: List[pathlib.Path] = []
_lock = threading.Lock()


_COPY_PREFIX = "pipefill-code-"


def _private_root() -> pathlib.Path:
    """This process's folder of verified copies (0700, removed at exit). A rank killed with
    SIGKILL cannot remove its own: the next process removes the folders of this user whose
    process is gone (their names carry the pid)."""
    if not _copies_root:
        _remove_stale_copies()
        root = pathlib.Path(tempfile.mkdtemp(prefix=f"{_COPY_PREFIX}{os.getpid()}-"))
        atexit.register(shutil.rmtree, root, True)
        _copies_root.append(root)
    return _copies_root[0]


def _remove_stale_copies() -> None:
    for folder in pathlib.Path(tempfile.gettempdir()).glob(f"{_COPY_PREFIX}*-*"):
        try:
            pid = int(folder.name[len(_COPY_PREFIX):].split("-", 1)[0])
            if folder.lstat().st_uid != os.getuid() or pid == os.getpid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, OSError):
            continue  # not one of ours, or a live process of another user


def _install_copy(name: str, version: str, sha256: str) -> metadata.Distribution:
    """Verifies the distribution, writes the verified bytes into a private copy and puts a
    finder for its top-level modules first on sys.meta_path (once per process and
    distribution; a second version of one distribution in one process is refused)."""
    identity = (name, version, sha256)
    known = _finders.get(name)
    if known is not None:
        if known[0] != identity:
            raise CodeRefused(f"distribution {name!r} {known[0][1]} is already loaded in this "
                              f"process; the job names {version} ({sha256[:12]}...)")
        return _distribution(name)
    dist, contents = _verify(name, version, sha256, keep=True)
    top_level, _ = _top_level([metadata.PackagePath(p) for p, _ in contents])
    for module in sorted(top_level):
        loaded = sys.modules.get(module)
        if loaded is not None:
            raise CodeRefused(f"{name}: module {module!r} was imported in this process before "
                              f"verification (from {getattr(loaded, '__file__', None)}); "
                              "it cannot be trusted")
    copy = _private_root() / f"{len(_finders)}-{sha256[:16]}"
    for relative, data in contents:
        target = copy / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as file:
            file.write(data)
    finder = _VerifiedFinder(name, copy, top_level)
    sys.meta_path.insert(0, finder)
    importlib.invalidate_caches()
    _finders[name] = (identity, finder)
    return dist


def load_factory(name: str, version: str, sha256: str, entry_point: str) -> Any:
    """The entry point's object, loaded once per process from the verified copy."""
    key = (name, version, sha256, entry_point)
    with _lock:
        if key in _verified:
            return _verified[key]
        dist = _install_copy(name, version, sha256)
        points = [ep for ep in dist.entry_points
                  if ep.group == ENTRY_POINT_GROUP and ep.name == entry_point]
        if not points:
            raise CodeRefused(f"distribution {name!r} {version} has no entry point "
                              f"{entry_point!r} in group {ENTRY_POINT_GROUP!r}")
        top_level = _finders[name][1].top_level
        if points[0].module.partition(".")[0] not in top_level:
            raise CodeRefused(f"entry point {entry_point!r} of {name!r} names module "
                              f"{points[0].module!r}, which is not one of the distribution's "
                              f"own ({sorted(top_level)})")
        factory = points[0].load()
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
