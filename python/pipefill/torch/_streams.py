"""pipefill.torch: torch streams as PipeFill stream handles, the runtime's fill streams as
torch streams, and the SM partition of a torch green context (the lowest module of the
subpackage)."""
from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Union

import torch

from .._config import Config
from .._enums import Backend, Result
from .._errors import PipeFillError
from .._runtime import Runtime
from .._runtime import stream_handle as _generic_stream_handle



# ---- streams ------------------------------------------------------------------------------

def stream_handle(stream: Optional["torch.cuda.Stream"] = None) -> int:
    """The ``cudaStream_t`` (an int) of a ``torch.cuda.Stream``; None: the current stream."""
    if stream is None:
        return current_stream_handle()
    return _generic_stream_handle(stream)


def current_stream_handle(device: Optional[Union[int, "torch.device"]] = None) -> int:
    """The ``cudaStream_t`` of ``torch.cuda.current_stream(device)``."""
    return int(torch.cuda.current_stream(device).cuda_stream)


def fill_streams(runtime: Runtime) -> List["torch.cuda.ExternalStream"]:
    """The runtime's fill streams as ``torch.cuda.ExternalStream`` (CUDA backend): to record
    events on them or see them in a profiler. Never enqueue main-job work on them. Other
    backends: PipeFillError NOT_SUPPORTED naming the backend (their handles are not CUDA
    streams; ``runtime.fill_stream_handles()`` gives them as ints)."""
    if not isinstance(runtime, Runtime):
        raise TypeError(f"fill_streams: runtime must be a pipefill.Runtime, not "
                        f"{type(runtime).__name__}")
    if runtime.backend != Backend.CUDA:
        raise PipeFillError(Result.NOT_SUPPORTED,
                            f"fill_streams: the runtime's backend is {runtime.backend}, whose "
                            "fill streams are not CUDA streams (runtime.fill_stream_handles() "
                            "gives the raw handles)")
    device = runtime.config.device or 0
    return [torch.cuda.ExternalStream(handle, device=device)
            for handle in runtime.fill_stream_handles()]


# ---- torch green contexts -----------------------------------------------------------------

def main_job_sms(main: Any) -> int:
    """The SM count a user keeps for the main job: an int, a ``torch.cuda.green_contexts``
    ``GreenContext`` or ``SMPartition`` (anything with an int ``sm_count``). A bad value is a
    TypeError / PipeFillError naming it."""
    if isinstance(main, bool):
        raise TypeError("main_sms: a bool is not an SM count")
    if isinstance(main, int):
        count = main
    else:
        count = getattr(main, "sm_count", None)
        if count is None:
            raise TypeError(f"main_sms must be an int, a torch.cuda.green_contexts.GreenContext "
                            f"or SMPartition, not {type(main).__name__}")
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"main_sms: {type(main).__name__}.sm_count is "
                            f"{type(count).__name__} {count!r}, not an int")
    if count < 1:
        raise PipeFillError(Result.INVALID_ARGUMENT,
                            f"main_sms {count}: the main job must keep at least 1 SM")
    return count


def complement_config(main_sms: Any, config: Optional[Config] = None, /,
                      **fields: Any) -> Config:
    """A :class:`pipefill.Config` whose fill partition is the complement of the SMs the user
    keeps for the main job (``main_sms``: an int, a torch ``GreenContext`` or ``SMPartition``):
    ``reserved_sms`` = that count, ``device`` = the partition's device. A ``reserved_sms`` or
    ``device`` given as well must agree (ValueError naming both), so the two partitions never
    overlap in SM count. See docs/pytorch-graph-jobs.md ("Torch green contexts") for what the
    CUDA backend does with it."""
    count = main_job_sms(main_sms)
    base = config if config is not None else Config()
    if not isinstance(base, Config):
        raise TypeError(f"complement_config: config must be a pipefill.Config, not "
                        f"{type(base).__name__}")
    reserved = fields.get("reserved_sms", base.reserved_sms)
    if reserved is not None and reserved != count:
        raise ValueError(f"complement_config: reserved_sms={reserved!r} disagrees with the "
                         f"main job's {count} SMs ({type(main_sms).__name__}); the fill "
                         "partition would overlap it or leave SMs idle")
    fields["reserved_sms"] = count
    device_id = getattr(main_sms, "device_id", None)
    if isinstance(device_id, int) and not isinstance(device_id, bool):
        device = fields.get("device", base.device)
        if device is not None and device != device_id:
            raise ValueError(f"complement_config: device={device!r} but the main job's "
                             f"partition is on device {device_id}")
        fields["device"] = device_id
    return dataclasses.replace(base, **fields)


def complement_runtime(main_sms: Any, config: Optional[Config] = None, /,
                       **fields: Any) -> Runtime:
    """``Runtime(complement_config(main_sms, config, **fields))``."""
    return Runtime(complement_config(main_sms, config, **fields))
