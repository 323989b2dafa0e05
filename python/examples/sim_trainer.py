"""sim_trainer: examples/c_trainer/main.c in Python, through the pipefill package.

It runs a simulated 4-stage 1F1B pipeline (8 micro-batches per iteration) twice - once without
filling and once with one simulated inference fill job per stage - and prints the same table as
the C program: bubbles, bubble time, filled time, fill items and the main job's slowdown. The
test suite runs both and compares their output line by line.

The engine pattern: for every receive a stage waits on, a bubble around the wait
(``with runtime.bubble(stream): stream.wait_event(...)``), and ``runtime.iteration_end()`` after
each iteration.

Usage: python sim_trainer.py [--iterations N] [--items N] [--item-us X]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import List, Optional

import pipefill as pf

STAGES = 4
MICROBATCHES = 8
SMS = 132
COMM_SMS = 8
FORWARD_US = 100.0
BACKWARD_US = 200.0
LINK_US = 5.0


def one_f_one_b(stage: int) -> List[tuple]:
    """1F1B order of one stage: warm-up forwards, one forward / one backward, then drain."""
    warmup = min(STAGES - stage - 1, MICROBATCHES)
    ops = [(True, i) for i in range(warmup)]
    for i in range(MICROBATCHES - warmup):
        ops += [(True, warmup + i), (False, i)]
    ops += [(False, i) for i in range(MICROBATCHES - warmup, MICROBATCHES)]
    return ops


class Pipeline:
    def __init__(self, fill: bool, items: int, item_us: float) -> None:
        self.world = pf.SimWorld(STAGES, sm_count=SMS, seed=42)
        self.streams = [self.world.stream(s, -1) for s in range(STAGES)]
        self.forward_done = [[self.world.event() for _ in range(MICROBATCHES)] for _ in range(STAGES)]
        self.backward_done = [[self.world.event() for _ in range(MICROBATCHES)] for _ in range(STAGES)]
        self.stage_done = [self.world.event() for _ in range(STAGES)]
        self.runtimes: List[Optional[pf.Runtime]] = [None] * STAGES
        self.jobs: List[Optional[pf.Job]] = [None] * STAGES
        if fill:
            for s in range(STAGES):
                rt = pf.Runtime(backend="sim", sim_world=self.world, device=s, stage_id=s,
                                stage_count=STAGES, reserved_sms=COMM_SMS)
                self.runtimes[s] = rt
                self.jobs[s] = rt.create_job(
                    pf.SimTicketJob(items=items, item_cost_us=item_us, name="batch-inference"))

    def bubble(self, stage: int, kind: pf.BubbleKind = pf.BubbleKind.OTHER):
        rt = self.runtimes[stage]
        return rt.bubble(self.streams[stage], kind=kind) if rt else contextlib.nullcontext()

    def recv_wait(self, stage: int, dependency: pf.SimEvent) -> None:
        with self.bubble(stage):
            # A spinning NCCL recv: holds COMM_SMS SMs until the peer's data arrives.
            self.streams[stage].wait_event(dependency, LINK_US, COMM_SMS)

    def run_iteration(self) -> float:
        """Enqueues one iteration round robin (each record before the wait that needs it),
        then the end-of-iteration barrier (the drain bubble); runs the world; returns the end."""
        ops = [one_f_one_b(s) for s in range(STAGES)]
        nxt = [0] * STAGES
        forward_enqueued = [[False] * MICROBATCHES for _ in range(STAGES)]
        backward_enqueued = [[False] * MICROBATCHES for _ in range(STAGES)]
        progressed = True
        while progressed:
            progressed = False
            for s in range(STAGES):
                while nxt[s] < len(ops[s]):
                    is_forward, mb = ops[s][nxt[s]]
                    if is_forward:
                        if s > 0 and not forward_enqueued[s - 1][mb]:
                            break
                        if s > 0:
                            self.recv_wait(s, self.forward_done[s - 1][mb])
                        self.streams[s].launch_kernel(FORWARD_US, SMS)
                        self.streams[s].record(self.forward_done[s][mb])
                        forward_enqueued[s][mb] = True
                    else:
                        if s < STAGES - 1 and not backward_enqueued[s + 1][mb]:
                            break
                        if s < STAGES - 1:
                            self.recv_wait(s, self.backward_done[s + 1][mb])
                        self.streams[s].launch_kernel(BACKWARD_US, SMS)
                        self.streams[s].record(self.backward_done[s][mb])
                        backward_enqueued[s][mb] = True
                    nxt[s] += 1
                    progressed = True
        for s in range(STAGES):
            self.streams[s].record(self.stage_done[s])
        for s in range(STAGES):
            with self.bubble(s, pf.BubbleKind.DRAIN):
                for other in range(STAGES):
                    if other != s:
                        self.streams[s].wait_event(self.stage_done[other], LINK_US, COMM_SMS)
            if self.runtimes[s]:
                self.runtimes[s].iteration_end()
            self.streams[s].record(self.stage_done[s])
        self.world.run_until_idle()
        return max(e.time for e in self.stage_done)

    def close(self) -> None:
        for rt in self.runtimes:
            if rt:
                rt.close()  # destroys its job first
        self.world.close()


@dataclasses.dataclass
class RunResult:
    seconds: float = 0.0
    bubbles: int = 0
    bubbles_filled: int = 0
    bubble_time_us: float = 0.0
    filled_time_us: float = 0.0
    items_completed: int = 0
    max_overrun_us: float = 0.0
    items_run: int = 0


def run(fill: bool, iterations: int, items: int, item_us: float) -> RunResult:
    p = Pipeline(fill, items, item_us)
    end = 0.0
    for _ in range(iterations):
        end = p.run_iteration()
    result = RunResult(seconds=end * 1e-6)
    for rt, job in zip(p.runtimes, p.jobs):
        if not rt:
            continue
        rt.synchronize()
        st = rt.stats()
        result.bubbles += st.bubbles
        result.bubbles_filled += st.bubbles_filled
        result.bubble_time_us += st.bubble_time_us
        result.filled_time_us += st.filled_time_us
        result.items_completed += st.items_completed
        result.max_overrun_us = max(result.max_overrun_us, st.max_overrun_us)
        result.items_run += job.counts().items_run
    p.close()
    return result


def report(iterations: int, item_us: float, base: RunResult, filled: RunResult) -> str:
    """The C program's table, formatted as its printf calls format it."""
    share = 100.0 * filled.filled_time_us / filled.bubble_time_us if filled.bubble_time_us > 0 else 0.0
    lines = [
        f"simulated {STAGES}-stage 1F1B pipeline, {MICROBATCHES} micro-batches, {iterations} "
        f"iterations, fill items of {item_us:.1f} us",
        f"{'run':<12} {'time (ms)':>10} {'bubbles':>10} {'bubble time (ms)':>16} "
        f"{'filled time (ms)':>16} {'filled share':>14} {'fill items':>12} {'slowdown':>10}",
        f"{'no filling':<12} {base.seconds * 1e3:10.3f} {'-':>10} {'-':>16} {'-':>16} "
        f"{'-':>14} {'-':>12} {'-':>10}",
        f"{'filling':<12} {filled.seconds * 1e3:10.3f} {filled.bubbles:10d} "
        f"{filled.bubble_time_us * 1e-3:16.3f} {filled.filled_time_us * 1e-3:16.3f} "
        f"{share:13.1f}% {filled.items_completed:12d} "
        f"{100.0 * (filled.seconds - base.seconds) / base.seconds:9.3f}%",
        f"bubbles filled: {filled.bubbles_filled} of {filled.bubbles} (empty recv waits are "
        f"learned and skipped); max overrun {filled.max_overrun_us:.3f} us",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--items", type=int, default=100000000)
    parser.add_argument("--item-us", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.items <= 0 or not args.item_us > 0:
        print("bad arguments", file=sys.stderr)
        return 2
    base = run(False, args.iterations, args.items, args.item_us)
    filled = run(True, args.iterations, args.items, args.item_us)
    sys.stdout.write(report(args.iterations, args.item_us, base, filled))
    if filled.items_run != filled.items_completed:
        print(f"item accounting mismatch: {filled.items_run} run, {filled.items_completed} "
              "reported", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
