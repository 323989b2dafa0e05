"""Config: pfConfig_t with keyword arguments.

Every field left at None is *unset*: the C library then takes the matching PIPEFILL_*
environment variable, else its default, exactly as for a C caller that starts from
PF_CONFIG_INITIALIZER. ``Runtime.config`` returns the configuration actually in force.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import warnings
from typing import TYPE_CHECKING, Any, Optional, Set, Union

from . import _pipefill
from ._enums import (Backend, LogLevel, Policy, Result, _BACKEND_NAMES, _LOG_NAMES,
                     _POLICY_NAMES)
from ._errors import PipeFillError

if TYPE_CHECKING:
    from ._sim import SimWorld

_INT_FIELDS = ("device", "stage_id", "stage_count", "reserved_sms", "min_samples",
               "sim_sm_count")
_DOUBLE_FIELDS = ("safety_margin_us", "safety_margin_fraction", "prediction_quantile",
                  "gated_prediction_quantile")
_SIZE_FIELDS = ("arena_bytes", "sim_memory_bytes")
_SIZE_SUFFIXES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


_warned_variables: Set[str] = set()


def _warn_unknown_environment(stacklevel: int = 3) -> None:
    """Warns once per process about each PIPEFILL_* environment variable the library does not
    read (a typo would otherwise be ignored silently), naming the nearest valid one."""
    known = _pipefill.known_environment_variables()
    for name in sorted(os.environ):
        if not name.startswith("PIPEFILL_") or name in known or name in _warned_variables:
            continue
        _warned_variables.add(name)
        nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        hint = f": did you mean {nearest[0]}?" if nearest else " (docs/api.md lists the valid names)"
        warnings.warn(f"environment variable {name} is not a PipeFill variable and is "
                      f"ignored{hint}", RuntimeWarning, stacklevel=stacklevel)


def _check_type(field: str, value: Any, expected: tuple, what: str) -> None:
    if isinstance(value, bool) and bool not in expected or not isinstance(value, expected):
        raise TypeError(f"Config.{field} must be {what}, not {type(value).__name__} ({value!r})")


def _enum_value(field: str, value: Any, enum_type: Any, names: dict) -> int:
    if isinstance(value, str):
        key = value.strip().lower()
        if key not in names:
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"Config.{field} '{value}' is not one of {'|'.join(names)}")
        return int(names[key])
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Config.{field} must be a {enum_type.__name__}, str or int, "
                        f"not {type(value).__name__} ({value!r})")
    return int(value)  # out-of-range ints are the C library's to reject (it names them)


def _size_value(field: str, value: Any) -> int:
    if isinstance(value, str):
        text = value.strip().lower()
        suffix = text[-1:] if text[-1:] in _SIZE_SUFFIXES and not text[-1:].isdigit() else ""
        number = text[: len(text) - len(suffix)]
        if not number.isdigit():
            raise PipeFillError(Result.INVALID_ARGUMENT,
                                f"Config.{field} '{value}' is not a size (bytes, K/M/G/T suffix)")
        return int(number) * _SIZE_SUFFIXES[suffix]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Config.{field} must be an int or a size string, not "
                        f"{type(value).__name__} ({value!r})")
    if value < 0 or value >= _pipefill.UNSET_SIZE:
        raise PipeFillError(Result.INVALID_ARGUMENT,
                            f"Config.{field} {value} is not a byte count (0 .. 2**64-2)")
    return value


@dataclasses.dataclass
class Config:
    """Runtime configuration (pfConfig_t). All fields are keyword-only; None means unset.

    Example::

        Config(backend="sim", stage_id=1, stage_count=4, reserved_sms=8)
    """

    backend: Optional[Union[Backend, str, int]] = None
    """auto | cuda | sim | host (PIPEFILL_BACKEND)."""
    device: Optional[int] = None
    """CUDA device ordinal / simulated device index in ``sim_world`` (PIPEFILL_DEVICE). None: on
    CUDA the calling thread's current device (``torch.cuda.set_device(rank)`` first), else 0;
    ``Runtime.config.device`` reports the device chosen."""
    stage_id: Optional[int] = None
    """This rank's pipeline stage, for logs and traces (PIPEFILL_STAGE_ID)."""
    stage_count: Optional[int] = None
    """Number of pipeline stages (PIPEFILL_STAGE_COUNT)."""
    reserved_sms: Optional[int] = None
    """SMs kept free of fill work for the main job, e.g. NCCL's CTAs (PIPEFILL_RESERVED_SMS)."""
    safety_margin_us: Optional[float] = None
    """Subtracted from every predicted bubble (PIPEFILL_SAFETY_MARGIN_US)."""
    safety_margin_fraction: Optional[float] = None
    """And this fraction of the prediction (PIPEFILL_SAFETY_MARGIN_FRACTION)."""
    arena_bytes: Optional[Union[int, str]] = None
    """Device memory reserved up front for fill jobs; "512M" style strings too (PIPEFILL_ARENA_BYTES)."""
    prediction_quantile: Optional[float] = None
    """Quantile of a bubble class's history that sizes ungated (opaque) work, in (0, 1]; default
    0.1, conservative: nothing stops opaque work at the bubble end (PIPEFILL_QUANTILE)."""
    min_samples: Optional[int] = None
    """Samples a bubble class needs before it is filled (PIPEFILL_MIN_SAMPLES)."""
    policy: Optional[Union[Policy, str, int]] = None
    """fifo | priority | srpt | fair (PIPEFILL_POLICY)."""
    log_level: Optional[Union[LogLevel, str, int]] = None
    """off | error | warn | info | debug | trace (PIPEFILL_DEBUG)."""
    enable_cupti: Optional[bool] = None
    """Calibration mode with the CUPTI collector (PIPEFILL_CUPTI)."""
    sim_world: Optional["SimWorld"] = None
    """Simulated backend: the world to run in (None: a private one-device world)."""
    sim_seed: Optional[int] = None
    """Jitter seed of a private world (PIPEFILL_SIM_SEED)."""
    sim_sm_count: Optional[int] = None
    """SMs of a private world's device (PIPEFILL_SIM_SMS)."""
    sim_memory_bytes: Optional[Union[int, str]] = None
    """Memory of a private world's device (PIPEFILL_SIM_MEMORY_BYTES)."""
    gated_prediction_quantile: Optional[float] = None
    """Quantile of a bubble class's history that sizes gated work (ticket kernels, gated graphs),
    in (0, 1]; default 0.5, the median: the gate bounds a too-long prediction to one item of
    overrun (PIPEFILL_GATED_QUANTILE)."""
    fill_optimizer_bubbles: Optional[bool] = None
    """Also fill bubbles of kind ``BubbleKind.OPTIMIZER`` (the data-parallel all-reduce window);
    default False: fill beside the collective stretches it on the critical path
    (PIPEFILL_FILL_OPTIMIZER_BUBBLES)."""

    def __post_init__(self) -> None:
        # Checked here, so a wrong type is named where the Config is written (TypeError naming
        # the field and the type given), not later inside Runtime().
        self._to_raw()
        _warn_unknown_environment(stacklevel=4)

    def _to_raw(self) -> "_pipefill.RawConfig":
        raw = _pipefill.RawConfig()
        if self.backend is not None:
            raw.backend = _enum_value("backend", self.backend, Backend, _BACKEND_NAMES)
        if self.policy is not None:
            raw.policy = _enum_value("policy", self.policy, Policy, _POLICY_NAMES)
        if self.log_level is not None:
            raw.log_level = _enum_value("log_level", self.log_level, LogLevel, _LOG_NAMES)
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            _check_type(name, value, (int,), "an int")
            if not -(1 << 31) <= value < (1 << 31):
                raise PipeFillError(Result.INVALID_ARGUMENT,
                                    f"Config.{name} {value} does not fit a C int")
            setattr(raw, name, value)
        for name in _DOUBLE_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            _check_type(name, value, (int, float), "a number")
            setattr(raw, name, float(value))
        for name in _SIZE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(raw, name, _size_value(name, value))
        for name in ("enable_cupti", "fill_optimizer_bubbles"):
            value = getattr(self, name)
            if value is not None:
                _check_type(name, value, (bool, int), "a bool")
        if self.sim_world is not None and not hasattr(self.sim_world, "_native"):
            raise TypeError(f"Config.sim_world must be a pipefill.SimWorld, not "
                            f"{type(self.sim_world).__name__}")
        if self.enable_cupti is not None:
            raw.enable_cupti = 1 if self.enable_cupti else 0
        if self.fill_optimizer_bubbles is not None:
            raw.fill_optimizer_bubbles = 1 if self.fill_optimizer_bubbles else 0
        if self.sim_seed is not None:
            _check_type("sim_seed", self.sim_seed, (int,), "an int")
            if not 0 <= self.sim_seed < (1 << 64):
                raise PipeFillError(Result.INVALID_ARGUMENT,
                                    f"Config.sim_seed {self.sim_seed} must be in 0 .. 2**64-1 "
                                    "(0 means unset)")
            raw.sim_seed = self.sim_seed
        return raw

    @classmethod
    def _from_raw(cls, raw: "_pipefill.RawConfig", sim_world: "Optional[SimWorld]") -> "Config":
        def opt_enum(value: int, enum_type: Any) -> Any:
            try:
                return enum_type(value)
            except ValueError:
                return value

        values = dict(
            backend=opt_enum(raw.backend, Backend),
            device=raw.device,
            stage_id=raw.stage_id,
            stage_count=raw.stage_count,
            reserved_sms=raw.reserved_sms,
            safety_margin_us=raw.safety_margin_us,
            safety_margin_fraction=raw.safety_margin_fraction,
            arena_bytes=raw.arena_bytes,
            prediction_quantile=raw.prediction_quantile,
            min_samples=raw.min_samples,
            policy=opt_enum(raw.policy, Policy),
            log_level=opt_enum(raw.log_level, LogLevel),
            enable_cupti=bool(raw.enable_cupti),
            sim_world=sim_world,
            sim_seed=raw.sim_seed,
            sim_sm_count=raw.sim_sm_count,
            sim_memory_bytes=raw.sim_memory_bytes,
            gated_prediction_quantile=raw.gated_prediction_quantile,
            fill_optimizer_bubbles=bool(raw.fill_optimizer_bubbles),
        )
        # The library's own values: no checks and no environment warnings again.
        config = cls.__new__(cls)
        for name, value in values.items():
            setattr(config, name, value)
        return config
