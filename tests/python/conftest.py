"""Fixtures of the pipefill Python tests.

The tests run against the *installed* package (scripts/test.sh pip-installs it into a virtual
environment). Two checks compare with the C side built from the same tree: the C trainer
program and libpipefill (through ctypes, for the error messages). They come from
PIPEFILL_BUILD_DIR (default: the repository's build/, which scripts/test.sh builds first); they
skip without it, unless PIPEFILL_REQUIRE_BUILD=1 (set by scripts/test.sh) makes that a failure.
"""
from __future__ import annotations

import ctypes
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# nanobind's leak report at interpreter exit is on for this suite and its subprocesses only (a
# user's script exits quietly: python/src/module.cpp). Read when pipefill is first imported.
os.environ.setdefault("PIPEFILL_LEAK_WARNINGS", "1")


def _build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("PIPEFILL_BUILD_DIR", REPO / "build"))


def _missing(what: str, path: pathlib.Path) -> None:
    message = (f"{what} not found at {path}: build the C targets first (cmake --build build) or "
               "set PIPEFILL_BUILD_DIR")
    if os.environ.get("PIPEFILL_REQUIRE_BUILD") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def repo() -> pathlib.Path:
    return REPO


@pytest.fixture(scope="session")
def c_trainer() -> pathlib.Path:
    path = _build_dir() / "examples" / "c_trainer" / "c_trainer"
    if not path.exists():
        _missing("the C trainer (examples/c_trainer)", path)
    return path


class CConfig(ctypes.Structure):
    """pfConfig_t, laid out from include/pipefill/pipefill.h (independently of the bindings)."""

    _fields_ = [
        ("size", ctypes.c_size_t), ("version", ctypes.c_int), ("backend", ctypes.c_int),
        ("device", ctypes.c_int), ("stage_id", ctypes.c_int), ("stage_count", ctypes.c_int),
        ("reserved_sms", ctypes.c_int), ("safety_margin_us", ctypes.c_double),
        ("safety_margin_fraction", ctypes.c_double), ("arena_bytes", ctypes.c_size_t),
        ("prediction_quantile", ctypes.c_double), ("min_samples", ctypes.c_int),
        ("policy", ctypes.c_int), ("log_level", ctypes.c_int), ("enable_cupti", ctypes.c_int),
        ("sim_world", ctypes.c_void_p), ("sim_seed", ctypes.c_uint64),
        ("sim_sm_count", ctypes.c_int), ("sim_memory_bytes", ctypes.c_size_t),
    ]


class CHint(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("label", ctypes.c_char_p),
                ("expected_duration_us", ctypes.c_double), ("lent_bytes", ctypes.c_size_t),
                ("lent_memory", ctypes.c_void_p)]


class CLib:
    """libpipefill through ctypes: the reference for what the C API says on each error."""

    def __init__(self, path: pathlib.Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        self.lib.pfGetLastErrorMessage.restype = ctypes.c_char_p
        self.lib.pfGetErrorString.restype = ctypes.c_char_p
        self.lib.pfGetErrorString.argtypes = [ctypes.c_int]
        for name in ("pfRuntimeCreate", "pfRuntimeDestroy", "pfBubbleBegin", "pfBubbleEnd",
                     "pfTraceWrite", "pfSimWorldCreate", "pfSimWorldDestroy", "pfSimStreamCreate",
                     "pfSimStreamDestroy", "pfConfigInit", "pfSimLaunchKernel",
                     "pfIterationEnd", "pfRuntimeGetSimWorld"):
            getattr(self.lib, name).restype = ctypes.c_int
        self.lib.pfSimLaunchKernel.argtypes = [ctypes.c_void_p, ctypes.c_double, ctypes.c_int]
        self.lib.pfBubbleEnd.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.lib.pfBubbleBegin.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.lib.pfSimStreamCreate.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                               ctypes.POINTER(ctypes.c_void_p)]

    def message(self) -> str:
        return self.lib.pfGetLastErrorMessage().decode()

    def config(self, **fields) -> CConfig:
        c = CConfig()
        assert self.lib.pfConfigInit(ctypes.byref(c)) == 0
        for key, value in fields.items():
            setattr(c, key, value)
        return c

    def runtime_create(self, config: CConfig | None):
        rt = ctypes.c_void_p()
        code = self.lib.pfRuntimeCreate(ctypes.byref(config) if config else None, ctypes.byref(rt))
        return code, (rt if code == 0 else None), (self.message() if code else "")


@pytest.fixture(scope="session")
def clib() -> CLib:
    path = _build_dir() / "lib" / "libpipefill.so"
    if not path.exists():
        _missing("libpipefill.so", path)
    return CLib(path)
