"""One rank of test_profiler_slices.py's pipeline (2 gloo ranks): torch.distributed.pipelining
1F1B (pipelining_worker's stages) instrumented by pipefill.torch, each rank's runtime on the
real-time host backend with a graph fill job, the whole run under torch.profiler recording
every thread. Exports the torch trace (<out>/torch-rank<r>.json) and PipeFill's own trace
(<out>/pipefill-rank<r>.json) and reports the runtime's counters in <out>/rank<r>.json."""
from __future__ import annotations

import os
import traceback

import torch
import torch.distributed as dist
from torch._C._profiler import _ExperimentalConfig

import adapter_checks as checks
import pipefill as pf
import pipefill.torch as pft
from pipelining_worker import build, train

STEPS = 8  # enough bubbles that a loaded machine still launches slices (3 gave none on both ranks, 1 run in ~10)


def run(rank: int, world: int, out: dict) -> None:
    out_dir = os.environ["PIPEFILL_TEST_OUT"]
    schedule, modules, indices, num_stages = build("1F1B", rank, world)
    with pf.Runtime(backend="host", stage_id=rank, stage_count=world, reserved_sms=0,
                    min_samples=1) as runtime:
        job = checks.fill_job(runtime, "host")
        every_thread = _ExperimentalConfig(profile_all_threads=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    experimental_config=every_thread) as prof:
            bubbles = pft.instrument(schedule, runtime, strict=True)
            train(schedule, modules, indices, num_stages, STEPS)
            bubbles.remove()
            runtime.synchronize()  # every slice ended (its range closed) before the profiler
        prof.export_chrome_trace(os.path.join(out_dir, f"torch-rank{rank}.json"))
        stats = runtime.stats()
        runtime.write_trace(os.path.join(out_dir, f"pipefill-rank{rank}.json"))
        tracking = runtime.__dict__.get("_slice_tracking")
        out.update(pid=os.getpid(), slices_launched=stats.slices_launched,
                   runtime_bubbles=stats.bubbles, adapter_bubbles=bubbles.bubbles,
                   items_completed=stats.items_completed,
                   spans_entered=tracking.spans.spans if tracking else None,
                   observer_error=runtime._native.slice_observer_error(),
                   item_cost_us=checks.HOST_ITEM_US)
        job.close()
    dist.barrier()


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    out: dict = {"rank": rank}
    try:
        checks.join_gloo(rank, world, 60.0)
        run(rank, world, out)
    except Exception as error:  # noqa: BLE001 - reported to the test
        out["fatal"] = "".join(traceback.format_exception(error))
    checks.finish(out)


if __name__ == "__main__":
    main()
