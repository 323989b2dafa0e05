"""training_job micro-steps on the real-time host backend (issue 32 item 6): a step longer than
the bubbles, run as one item per step (one configuration) and as micro-steps (the planner picks
micro-batches per item per bubble class).

  python python/examples/micro_steps_bench.py [--step-ms 20] [--bubble-us 8000] [--bubbles 150]
      [--micro-batches 8,16] [--rounds 5] [--compute-us 0]

Each round runs, back to back in one process, so that every ratio compares runs made at the same
moment of a machine whose speed drifts (2-core VMs here: a micro-batch's CPU time moved 3.1 -> 4.8
ms between runs minutes apart on 2026-12-07):
  - alone: optimizer steps per second of the same training in a plain loop, the whole batch per
    step and, per k of --micro-batches, k micro-batches with gradient accumulation (the median of
    3 timed groups of 5 steps each);
  - in bubbles: the one-configuration job (micro_batches = 1) and, per k, the micro-step job:
    steps over --bubbles bubbles of --bubble-us, per bubble-second, with the configuration the
    planner used last, the learned item cost, the share of bubble time filled and the fill time
    past bubble ends (the runtime's stats: what a trainer sharing the cores would wait for; the
    trainer is a sleep unless --compute-us gives it CPU work between bubbles, streaming_bench's
    matmuls on the main thread: then each job's trainer step is also timed against the same
    trainer with a runtime and no job, run right before it, and the median ratio printed).
Then, per job, the median over the rounds of its ratio to the plain loop and to the accumulation
loop. Goal (issue 32): the micro-step job at >= 0.5 of alone per bubble-second, where the
one-config job runs only in probes (a ~20 ms step on 8 ms bubbles ran at 0.03).

A micro-batch is the smallest piece the job can run, so a bubble holds whole ones only: with 8 ms
bubbles, k = 8 (micro-batches of ~2.4-4 ms here) fits 2 (3 in fast moments, 1 when the machine
is slow) per bubble; k = 16 (1.4-1.9 ms) fits 4-5. Choose k so a micro-batch is at most about a
quarter of the bubbles to fill (docs/pytorch-streaming.md, "Micro-steps").
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, List, NamedTuple

import torch
from torch import nn

import pipefill as pf
import pipefill.torch as pft
import streaming_bench  # this folder's: the trainer's CPU work (run as a script, it is on the path)

DIM, HIDDEN, OUT = 256, 512, 16


def make(rows: int, seed: int = 0):
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                           nn.Linear(HIDDEN, OUT))
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(rows, DIM, generator=g), torch.randn(rows, OUT, generator=g))
               for _ in range(4)]
    return module, opt, batches


def plain_steps_per_s(rows: int, k: int, steps: int = 5, groups: int = 3,
                      fastest: bool = False) -> float:
    """Steps per second of the plain loop (k micro-batches with gradient accumulation; k = 1: the
    whole batch per step) over `groups` timed groups of `steps` steps: their median (as the
    bubbles' runs are an average over the machine's moment), or with `fastest` their best."""
    module, opt, batches = make(rows)

    def step(i: int) -> None:
        inputs, target = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        for x, y in zip(inputs.tensor_split(k), target.tensor_split(k)):
            (nn.functional.mse_loss(module(x), y) * (x.shape[0] / rows)).backward()
        opt.step()

    step(0)
    rates = []
    for _ in range(groups):
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        rates.append(steps / (time.perf_counter() - t0))
    return max(rates) if fastest else statistics.median(rates)


def rows_for(step_ms: float) -> int:
    """Rows per step whose plain step takes about step_ms here (its fastest; a multiple of 64).
    Scaled from 256 rows, then once more from the rows found: a step's time is not linear in
    its rows (the first guess made 16-17 ms steps for a 20 ms target on 2026-12-07)."""
    rows = 256
    for _ in range(2):
        ms = 1e3 / plain_steps_per_s(rows, 1, fastest=True)
        rows = max(64, int(round(rows * step_ms / ms / 64)) * 64)
    return rows


# The trainer's own CPU work between bubbles with --compute-us: streaming_bench's (128x128
# matmuls on the main thread, calibrated to a time); without it, a 500 us sleep on its stream.
def compute_reps(compute_us: float) -> int:
    """Matmul repetitions that take compute_us here now; 0 for none."""
    return streaming_bench.calibrate(compute_us) if compute_us > 0 else 0


def trainer(rt: pf.Runtime, bubble_us: float, bubbles: int, reps: int) -> List[float]:
    """The trainer's steps: a bubble of bubble_us, then its own work; each step's wall time (s)."""
    stream = rt.high_priority_stream()
    steps = []
    for _ in range(bubbles):
        t0 = time.perf_counter()
        with rt.bubble(stream, expected_us=bubble_us):
            pf.host_stream_delay(stream, bubble_us)
        pf.host_stream_synchronize(stream)
        if reps:
            streaming_bench.cpu_compute(reps)
        else:
            pf.host_stream_delay(stream, 500.0)
            pf.host_stream_synchronize(stream)
        rt.iteration_end()
        steps.append(time.perf_counter() - t0)
    return steps


def plain_step_s(bubble_us: float, bubbles: int, reps: int) -> float:
    """The trainer's median step with a runtime and no job (the step ratio's base)."""
    rt = streaming_bench.host_runtime()
    steps = trainer(rt, bubble_us, bubbles, reps)
    rt.close()
    return statistics.median(steps[2:])


class BubbleRun(NamedTuple):
    """One job's run over the bubbles."""
    rate: float            # optimizer steps per bubble-second
    config: str            # the configuration the planner used last
    cost: Any              # Job.cost_info() at the end
    overrun_us: float      # fill time past bubble ends, per bubble (runtime stats)
    max_overrun_us: float  # the largest single overrun
    filled_share: float    # fill time inside bubbles / bubble time
    trainer_step_s: float  # the trainer's median step meanwhile


def in_bubbles(rows: int, k: int, bubble_us: float, bubbles: int, reps: int = 0) -> BubbleRun:
    module, opt, batches = make(rows)
    rt = streaming_bench.host_runtime()
    job = pft.training_job(rt, module, opt, nn.functional.mse_loss, batches, steps=10**6,
                           micro_batches=k, name=f"micro{k}")
    trainer_step_s = statistics.median(trainer(rt, bubble_us, bubbles, reps)[2:])
    rt.synchronize()
    stats = rt.stats()
    names = [c[0] for c in job._micro.configs(1.0, 0.0)] if job._micro else ["1 step"]
    index = job.job.info().config_index
    run = BubbleRun(rate=job.step / (bubbles * bubble_us * 1e-6),
                    config=names[index] if 0 <= index < len(names) else str(index),
                    cost=job.job.cost_info(), overrun_us=stats.overrun_time_us / bubbles,
                    max_overrun_us=stats.max_overrun_us, filled_share=stats.filled_share,
                    trainer_step_s=trainer_step_s)
    job.close()
    rt.close()
    return run


def describe(run: BubbleRun) -> str:
    cost = run.cost
    return (f"last configuration {run.config}, learned item cost {cost.learned_cost_us:.0f} us "
            f"({cost.probes} probes, {cost.too_short_bubbles} bubbles too short); filled "
            f"{100 * run.filled_share:.0f}% of bubble time, fill past bubble ends "
            f"{run.overrun_us:.0f} us per bubble (largest {run.max_overrun_us:.0f} us)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--bubble-us", type=float, default=8000.0)
    parser.add_argument("--bubbles", type=int, default=150)
    parser.add_argument("--micro-batches", default="8,16",
                        help="comma-separated k of the micro-step jobs (each > 1)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compute-us", type=float, default=0.0,
                        help="the trainer's own CPU work between bubbles (matmuls on the main "
                             "thread), its step with the job against without it; 0: a sleep")
    args = parser.parse_args()
    ks = [int(k) for k in args.micro_batches.split(",")]
    if any(k < 2 for k in ks) or args.rounds < 1:
        parser.error(f"--micro-batches {args.micro_batches!r}: each k must be >= 2; "
                     f"--rounds {args.rounds}: at least 1")
    torch.set_num_threads(1)
    rows = rows_for(args.step_ms)
    reps = compute_reps(args.compute_us)
    print(f"MLP {DIM}->{HIDDEN}->{HIDDEN}->{OUT}, SGD, {rows} rows per step, torch threads 1; "
          f"{args.bubbles} bubbles of {args.bubble_us:.0f} us; {args.rounds} rounds")
    ratios = {micro: ([], []) for micro in [1] + ks}  # per job: (to plain, to accumulation)
    steps = {micro: [] for micro in [1] + ks}  # per job: trainer step filling / plain
    for r in range(args.rounds):
        print(f"  round {r + 1}:")
        for micro in [1] + ks:
            alone = plain_steps_per_s(rows, 1)  # right before each job: the same moment
            alone_k = alone if micro == 1 else plain_steps_per_s(rows, micro)
            plain_step = plain_step_s(args.bubble_us, args.bubbles, reps) if reps else 0.0
            run = in_bubbles(rows, micro, args.bubble_us, args.bubbles, reps)
            ratios[micro][0].append(run.rate / alone)
            ratios[micro][1].append(run.rate / alone_k)
            print(f"    micro_batches {micro:2d}: {run.rate:7.2f} steps per bubble-second; alone "
                  f"{alone:.2f} steps/s, with its accumulation {alone_k:.2f}; ratio "
                  f"{run.rate / alone:.3f} of the plain loop, {run.rate / alone_k:.3f} of the "
                  f"accumulation loop; {describe(run)}")
            if reps:
                steps[micro].append(run.trainer_step_s / plain_step)
                print(f"      trainer step with the job {run.trainer_step_s * 1e3:.3f} ms, without "
                      f"{plain_step * 1e3:.3f} ms: ratio {run.trainer_step_s / plain_step:.3f}")
    print(f"  median of {args.rounds} rounds (steps per bubble-second / steps per second alone):")
    for micro in [1] + ks:
        plain, accumulated = (statistics.median(v) for v in ratios[micro])
        low, high = min(ratios[micro][0]), max(ratios[micro][0])
        verdict = ("" if micro == 1 else
                   f"; goal >= 0.5 of the plain loop: {'met' if plain >= 0.5 else 'MISSED'}")
        trainer_ratio = (f"; trainer step {statistics.median(steps[micro]):.3f}x its plain step"
                         if steps[micro] else "")
        print(f"  micro_batches {micro:2d}: {plain:.3f} of the plain loop ({low:.3f}-{high:.3f}), "
              f"{accumulated:.3f} of the accumulation loop with {micro} micro-batches of "
              f"{rows // micro} rows{verdict}{trainer_ratio}")


if __name__ == "__main__":
    main()
