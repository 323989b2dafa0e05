"""One rank of the torch.distributed.pipelining tests over gloo (test_pipelining.py starts 4).

Scenarios:
  equivalence  for each schedule: train a few steps without PipeFill, then the same from the
               same seed with pipefill.torch.instrument() and a fill job on this rank's
               runtime; report losses/gradients equality, bubble counts, the schedule's own
               receive-wait count and where fill work ran.
  raise        1F1B; at step 1 rank FAIL_RANK's forward raises.
  exit         1F1B; at step 1 rank FAIL_RANK's process exits abruptly (os._exit).
  hang         1F1B; at step 1 rank FAIL_RANK's forward stalls past the process-group timeout.
Each rank writes <out>/rank<r>.json (except a rank that exits abruptly) and leaves with
os._exit, so no teardown can hang the test.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining as pp

import pipefill as pf
import pipefill.torch as pft
from trace_checks import items_against_bubbles

DIM = 16
BATCH = 16
MICROBATCHES = 4
STEPS = 3
FAIL_RANK = 2

SCHEDULES = {
    # name: (class, stages per rank: "single" | "loop" (r, r+w) | "v" (r, 2w-1-r), micro-batches)
    "GPipe": (pp.ScheduleGPipe, "single", MICROBATCHES),
    "1F1B": (pp.Schedule1F1B, "single", MICROBATCHES),
    "Interleaved1F1B": (pp.ScheduleInterleaved1F1B, "loop", MICROBATCHES),
    "LoopedBFS": (getattr(pp, "ScheduleLoopedBFS", None), "loop", MICROBATCHES),
    "InterleavedZeroBubble": (getattr(pp, "ScheduleInterleavedZeroBubble", None), "loop",
                              MICROBATCHES),
    "ZBVZeroBubble": (getattr(pp, "ScheduleZBVZeroBubble", None), "v", MICROBATCHES),
    # DualPipeV needs at least as many micro-batches as stages (2 per rank).
    "DualPipeV": (getattr(pp, "ScheduleDualPipeV", None), "v", 2 * MICROBATCHES),
}


class Chunk(nn.Module):
    """One pipeline stage's layers; a forward can be told to fail (failure scenarios)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1000 + index)
        self.linear = nn.Linear(DIM, DIM)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(DIM, DIM, generator=generator) / DIM ** 0.5)
            self.linear.bias.copy_(torch.randn(DIM, generator=generator) * 0.1)
        self.fail = None  # None | "raise" | "exit" | "hang"
        self.hang_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail == "raise":
            raise RuntimeError("injected failure in the forward of this rank's stage")
        if self.fail == "exit":
            os._exit(17)
        if self.fail == "hang":
            time.sleep(self.hang_s)
            raise RuntimeError("injected stall ended")
        return torch.tanh(self.linear(x))


def local_stage_indices(layout: str, rank: int, world: int) -> list:
    if layout == "single":
        return [rank]
    if layout == "loop":
        return [rank, rank + world]
    return [rank, 2 * world - 1 - rank]


def build(name: str, rank: int, world: int):
    cls, layout, microbatches = SCHEDULES[name]
    num_stages = world if layout == "single" else 2 * world
    indices = local_stage_indices(layout, rank, world)
    modules = [Chunk(i) for i in indices]
    stages = [pp.PipelineStage(m, i, num_stages, torch.device("cpu"),
                               input_args=(torch.zeros(BATCH // microbatches, DIM),))
              for m, i in zip(modules, indices)]
    loss_fn = nn.MSELoss()
    if layout == "single":
        schedule = cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    else:
        schedule = cls(stages, n_microbatches=microbatches, loss_fn=loss_fn)
    return schedule, modules, indices, num_stages


def train(schedule, modules, indices, num_stages, steps, on_step=None):
    """Runs `steps` SGD steps; returns per-step losses and gradients (this rank's part)."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH, DIM, generator=generator)
    target = torch.randn(BATCH, DIM, generator=generator)
    optimizer = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.1)
    losses_per_step, grads_per_step = [], []
    for step in range(steps):
        if on_step:
            on_step(step)
        losses: list = []
        args = (x,) if 0 in indices else ()
        kwargs = {"target": target, "losses": losses} if num_stages - 1 in indices else {}
        schedule.step(*args, **kwargs)
        losses_per_step.append([l.detach().clone() for l in losses])
        grads_per_step.append([p.grad.detach().clone() for m in modules for p in m.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return losses_per_step, grads_per_step


def identical(a, b) -> bool:
    if len(a) != len(b):
        return False
    return all(len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y))
               for x, y in zip(a, b))


def receive_actions_with_comms(schedule, rank: int):
    """RECV_F / RECV_B actions of the schedule's comms-expanded action list (runtime
    schedules only): a second count of the receives, independent of the hook."""
    order = getattr(schedule, "pipeline_order_with_comms", None)
    if not order:
        return None
    return sum(1 for a in order[rank] if a is not None and
               str(getattr(a.computation_type, "value", a.computation_type)) in ("RECV_F", "RECV_B"))


def fill_outside_bubbles(trace_path: str, slack_us: float):
    """(fill slices, slices not inside the bubble they were launched for) in the runtime's
    trace; a slice may outlast its bubble's end by at most one item (the gate's bound)."""
    with open(trace_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    bubbles = {e["args"]["id"]: (e["ts"], e["ts"] + e["dur"]) for e in events
               if e.get("ph") == "X" and e.get("cat") == "bubble"}
    slices = [(e["args"]["bubble"], e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("ph") == "X" and e.get("cat") == "fill"]
    outside = [s for s in slices if s[0] not in bubbles or not
               (bubbles[s[0]][0] - 1e-6 <= s[1] and s[2] <= bubbles[s[0]][1] + slack_us)]
    return len(slices), len(outside)


def equivalence(rank: int, world: int, out: dict, schedule_names) -> None:
    for name in schedule_names:
        cls = SCHEDULES[name][0]
        if cls is None:
            out[name] = {"skipped": f"torch {torch.__version__} has no Schedule{name}"}
            continue
        result: dict = {}
        try:
            schedule, modules, indices, num_stages = build(name, rank, world)
            base = train(schedule, modules, indices, num_stages, STEPS)
            dist.barrier()

            schedule, modules, indices, num_stages = build(name, rank, world)
            item_us = 20.0
            with pf.Runtime(backend="sim", stage_id=rank, stage_count=world,
                            min_samples=1) as runtime:
                job = runtime.create_job(pf.SimTicketJob(items=10**7, item_cost_us=item_us))
                bubbles = pft.instrument(schedule, runtime, strict=True)
                filled = train(schedule, modules, indices, num_stages, STEPS)
                bubbles.remove()
                runtime.synchronize()
                stats = runtime.stats()
                trace = os.path.join(os.environ["PIPEFILL_TEST_OUT"], f"{name}-rank{rank}.json")
                runtime.write_trace(trace)
                slices, outside = fill_outside_bubbles(trace, slack_us=item_us)
                result.update(
                    identical_losses=identical(base[0], filled[0]),
                    identical_grads=identical(base[1], filled[1]),
                    losses_seen=sum(len(l) for l in base[0]),
                    expected_waits=pft.expected_receive_waits(schedule, rank, indices, num_stages),
                    recv_actions=receive_actions_with_comms(schedule, rank),
                    step_bubbles=bubbles.step_bubbles,
                    runtime_bubbles=stats.bubbles,
                    iterations=stats.iterations,
                    items_run=job.counts().items_run,
                    items_completed=stats.items_completed,
                    duplicates=job.counts().duplicates,
                    fill_slices=slices,
                    fill_slices_outside=outside,
                    in_bubble_after=runtime.in_bubble,
                    errors=[str(e) for e in bubbles.errors],
                )
            dist.barrier()
        except Exception as error:  # reported, not raised: the other schedules still run
            result["exception"] = "".join(traceback.format_exception(error))
        out[name] = result


def host_device(rank: int, world: int, out: dict, names: list) -> None:
    """Each schedule of `names` with each rank's runtime on the real-time host device and a graph
    fill job (items of HOST_ITEM_US real time each on one host-device SM thread): slices start
    inside their bubble and no item starts outside a bubble but the one per bubble claimed before
    its gate closed (item start times against the trace, one clock), every item once and in
    index order, losses/gradients unchanged. out[name] holds each schedule's figures."""
    item_us = HOST_ITEM_US
    for name in names:
        result: dict = {}
        try:
            schedule, modules, indices, num_stages = build(name, rank, world)
            base = train(schedule, modules, indices, num_stages, STEPS)
            dist.barrier()
            schedule, modules, indices, num_stages = build(name, rank, world)
            with pf.Runtime(backend="host", stage_id=rank, stage_count=world, reserved_sms=0,
                            min_samples=1) as runtime:
                clock = runtime.high_priority_stream()
                job = runtime.create_job(pf.GraphJob(items=10**6, item_cost_us=item_us,
                                                     clock_stream=clock))
                bubbles = pft.instrument(schedule, runtime, strict=True)
                filled = train(schedule, modules, indices, num_stages, STEPS)
                runtime.synchronize()
                stats = runtime.stats()  # the bubbles of the STEPS steps compared above
                # A loaded machine may skip all of a rank's few fillable bubbles (late, too
                # short): more steps, until every rank ran an item (the ranks agree through an
                # all-reduce, so all of them run the same steps), at most EXTRA_STEPS.
                for _ in range(EXTRA_STEPS):
                    ran = torch.tensor([int(job.graph_counts().items_run > 0)])
                    dist.all_reduce(ran, op=dist.ReduceOp.MIN)
                    if ran.item():
                        break
                    train(schedule, modules, indices, num_stages, 1)
                bubbles.remove()
                runtime.synchronize()
                trace = os.path.join(os.environ["PIPEFILL_TEST_OUT"], f"host-{name}-rank{rank}.json")
                runtime.write_trace(trace)
                slices, outside = fill_outside_bubbles(trace, slack_us=float("inf"))
                items_outside, most_late = items_against_bubbles(trace, job.graph_item_times())
                counts = job.graph_counts()
                result.update(
                    identical_losses=identical(base[0], filled[0]),
                    identical_grads=identical(base[1], filled[1]),
                    expected_waits=pft.expected_receive_waits(schedule, rank, indices,
                                                              num_stages),
                    step_bubbles=bubbles.step_bubbles[:STEPS], runtime_bubbles=stats.bubbles,
                    items_run=counts.items_run,
                    items_completed=runtime.stats().items_completed,
                    duplicates=counts.duplicates, out_of_order=counts.out_of_order,
                    index_mismatches=counts.index_mismatches, fill_slices=slices,
                    fill_slices_outside=outside, items_outside=items_outside,
                    most_late_items=most_late, errors=[str(e) for e in bubbles.errors])
            dist.barrier()
        except Exception as error:  # reported, not raised: the other schedules still run
            result["exception"] = "".join(traceback.format_exception(error))
        out[name] = result


HOST_ITEM_US = 200.0
EXTRA_STEPS = 100
"""Steps host_device runs at most beyond STEPS until every rank ran a fill item."""


def failure(rank: int, world: int, out: dict, mode: str, timeout_s: float) -> None:
    schedule, modules, indices, num_stages = build("1F1B", rank, world)
    runtime = pf.Runtime(backend="sim", stage_id=rank, stage_count=world, min_samples=1)
    runtime.create_job(pf.SimTicketJob(items=10**7, item_cost_us=20.0))
    bubbles = pft.instrument(schedule, runtime, strict=True)

    def on_step(step: int) -> None:
        if step == 1 and rank == FAIL_RANK:
            modules[0].fail = mode
            modules[0].hang_s = 2.0 * timeout_s

    start = time.monotonic()
    try:
        train(schedule, modules, indices, num_stages, STEPS, on_step=on_step)
        out["error"] = None
    except Exception as error:
        chain, e = [], error
        while e is not None:  # the schedule wraps the stage's exception: keep the causes
            chain.append(f"{type(e).__name__}: {e}")
            e = e.__cause__ or e.__context__
        out["error"] = " <- ".join(chain)
    out["seconds"] = time.monotonic() - start
    out["in_bubble_after_failure"] = runtime.in_bubble
    out["bubbles"] = bubbles.bubbles
    out["interrupted_waits"] = bubbles.interrupted_waits
    bubbles.remove()
    try:
        runtime.close()  # refused while a bubble is open
        out["runtime_closed"] = runtime.closed
    except pf.PipeFillError as error:
        out["runtime_closed"] = False
        out["close_error"] = str(error)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out_dir = os.environ["PIPEFILL_TEST_OUT"]
    torch.set_num_threads(1)
    out: dict = {"rank": rank, "torch": torch.__version__}
    try:
        dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=args.timeout))
        if args.scenario == "equivalence":
            equivalence(rank, world, out, args.schedules.split(","))
        elif args.scenario == "host":
            host_device(rank, world, out, args.schedules.split(","))
        else:
            failure(rank, world, out, args.scenario, args.timeout)
    except Exception as error:
        out["fatal"] = "".join(traceback.format_exception(error))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f, indent=1)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
