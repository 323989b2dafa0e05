"""A stand-in pipeline stage on the GPU for the GPU checks (graph_fill_check.py,
cuda_streaming_check.py): a GEMM as the stage's compute, then a bubble whose "receive wait" is
torch.cuda._sleep for the bubble's length, on a high-priority main stream."""
from __future__ import annotations

from typing import Callable, Optional

import torch


def sleep_cycles_per_us() -> float:
    """torch.cuda._sleep spins a number of GPU cycles: how many make one microsecond here."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    stop.record()
    stop.synchronize()
    return 10_000_000 / (start.elapsed_time(stop) * 1000.0)


def stage_iteration(rt, main_stream: "torch.cuda.Stream", a: "torch.Tensor", bubble_us: float,
                    cycles_per_us: Optional[float] = None) -> Callable[[], None]:
    """One iteration of the stage: ``a @ a``, a bubble of ``bubble_us``, iteration_end."""
    if cycles_per_us is None:
        cycles_per_us = sleep_cycles_per_us()

    def iteration() -> None:
        with torch.cuda.stream(main_stream):
            torch.mm(a, a)  # the stage's compute
            with rt.bubble(main_stream, expected_us=bubble_us):
                torch.cuda._sleep(int(bubble_us * cycles_per_us))  # the receive wait
        rt.iteration_end()

    return iteration
