"""What the DeepSpeed and Megatron-Core adapter tests share: starting 2 gloo ranks as
processes with a hard deadline (test side), and on each rank a fill job on the simulated or
host backend plus the checks of where its work ran (worker side). Imported by name from this
folder, like trace_checks."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).parent
SIM_ITEM_US = 20.0
HOST_ITEM_US = 200.0


# ---- test side ------------------------------------------------------------------------------

def launch(tmp: pathlib.Path, worker: str, args: list, world: int = 2,
           deadline_s: float = 300.0):
    """Starts `world` processes of tests/python/<worker> with `args`; returns (return codes,
    per-rank JSON or None). A process still running at the deadline fails the test (after all
    are killed): nothing may hang."""
    import pytest
    env = dict(os.environ, WORLD_SIZE=str(world), PIPEFILL_TEST_OUT=str(tmp),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PIPEFILL_DEBUG="error",
               MASTER_ADDR="127.0.0.1", PYTHONWARNINGS="default")
    start = time.monotonic()
    procs = []
    for rank in range(world):
        log = open(tmp / f"log{rank}.txt", "w")
        procs.append(subprocess.Popen([sys.executable, str(HERE / worker)] + list(args),
                                      env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                                      stdout=log, stderr=subprocess.STDOUT, cwd=str(HERE)))
    codes = []
    for rank, p in enumerate(procs):
        try:
            codes.append(p.wait(timeout=max(1.0, deadline_s - (time.monotonic() - start))))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            logs = "\n".join((tmp / f"log{r}.txt").read_text()[-3000:] for r in range(world))
            pytest.fail(f"{worker} {args}: rank {rank} still running after {deadline_s} s:\n{logs}")
    results = []
    for rank in range(world):
        path = tmp / f"rank{rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else None)
    for rank, r in enumerate(results):
        if r is not None and "fatal" in r:
            log = (tmp / f"log{rank}.txt").read_text()[-3000:]
            pytest.fail(f"{worker} rank {rank} failed outside the scenario:\n{r['fatal']}\n{log}")
    return codes, results


# ---- worker side ----------------------------------------------------------------------------

def join_gloo(rank: int, world: int, timeout_s: float) -> None:
    """This worker joins the test's gloo group (a file store in PIPEFILL_TEST_OUT, which
    launch() sets), with ``timeout_s`` for every collective."""
    import datetime

    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{os.environ['PIPEFILL_TEST_OUT']}/store",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def fill_job(runtime, backend: str):
    """A fill job that is always pending: simulated ticket items, or host-device graph items
    whose start times are recorded on the trace's clock."""
    import pipefill as pf
    if backend == "sim":
        return runtime.create_job(pf.SimTicketJob(items=10**7, item_cost_us=SIM_ITEM_US))
    clock = runtime.high_priority_stream()
    return runtime.create_job(pf.GraphJob(items=10**6, item_cost_us=HOST_ITEM_US,
                                          clock_stream=clock))


def fill_report(runtime, job, backend: str, trace_path: str) -> dict:
    """Where the fill work ran, from the runtime's trace: slices outside the bubble they were
    launched for (the simulator's slices may outlast their bubble by one item), and on the host
    backend item starts outside every bubble and the most items of one bubble that started
    after its end (the gate allows one); plus the runtime's counters."""
    from pipelining_worker import fill_outside_bubbles
    from trace_checks import items_against_bubbles
    runtime.synchronize()
    stats = runtime.stats()
    runtime.write_trace(trace_path)
    report = dict(runtime_bubbles=stats.bubbles, iterations=stats.iterations,
                  items_completed=stats.items_completed, bubbles_filled=stats.bubbles_filled,
                  in_bubble_after=runtime.in_bubble)
    if backend == "sim":
        slices, outside = fill_outside_bubbles(trace_path, slack_us=SIM_ITEM_US)
        counts = job.counts()
        report.update(fill_slices=slices, fill_slices_outside=outside, items_run=counts.items_run,
                      duplicates=counts.duplicates, items_outside=0, most_late_items=0)
    else:
        slices, outside = fill_outside_bubbles(trace_path, slack_us=float("inf"))
        items_outside, most_late = items_against_bubbles(trace_path, job.graph_item_times())
        counts = job.graph_counts()
        report.update(fill_slices=slices, fill_slices_outside=outside, items_run=counts.items_run,
                      duplicates=counts.duplicates, items_outside=items_outside,
                      most_late_items=most_late)
    return report


def recording_kinds(runtime, kinds: list) -> None:
    """Records the kind of every bubble begun on `runtime` (test-side wrapper of the Python
    method, the adapter does not know about it)."""
    begin = runtime.bubble_begin

    def recorded(stream, **kwargs):
        begin(stream, **kwargs)
        kinds.append(int(kwargs.get("kind", 0)))
    runtime.bubble_begin = recorded


def failure_report(runtime, handle, out: dict) -> None:
    """The end of a failure scenario on a rank whose training raised: whether a bubble was left
    open, the adapter handle's bubbles and interrupted waits, then the handle removed and
    whether the runtime closes (refused while a bubble is open) - into `out`."""
    import pipefill as pf
    out["in_bubble_after_failure"] = runtime.in_bubble
    out["bubbles"] = handle.bubbles
    out["interrupted_waits"] = handle.interrupted_waits
    handle.remove()
    try:
        runtime.close()
        out["runtime_closed"] = runtime.closed
    except pf.PipeFillError as error:
        out["runtime_closed"] = False
        out["close_error"] = str(error)


def identical(a, b) -> bool:
    import torch
    if len(a) != len(b):
        return False
    return all(len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y))
               for x, y in zip(a, b))


def finish(out: dict) -> None:
    """Writes this rank's JSON and leaves with os._exit (no teardown can hang the test)."""
    with open(os.path.join(os.environ["PIPEFILL_TEST_OUT"], f"rank{os.environ['RANK']}.json"),
              "w") as f:
        json.dump(out, f, indent=1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
