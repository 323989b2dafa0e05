"""training_job micro-steps on the real-time host backend (issue 32 item 6): a step longer than
the bubbles, run as one item per step (one configuration) and as micro-steps (the planner picks
micro-batches per item per bubble class).

  python python/examples/micro_steps_bench.py [--step-ms 20] [--bubble-us 8000] [--bubbles 150]
      [--micro-batches 8]

Prints, from one process, side by side:
  - alone: optimizer steps per second of the same training in a plain loop, the whole batch per
    step and with the micro-batches' gradient accumulation (the fastest of 3 timed groups);
  - for each job (micro_batches = 1, then --micro-batches): steps per bubble-second (steps done
    over --bubbles bubbles of --bubble-us), its ratio to alone, the configuration the planner
    used last and the learned item cost.
Goal (issue 32): the micro-step job at >= 0.5 of alone per bubble-second, where the one-config
job runs only in probes (a ~20 ms step on 8 ms bubbles ran at 0.03). No figure is a pass/fail.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import pipefill as pf
import pipefill.torch as pft

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


def plain_steps_per_s(rows: int, k: int, steps: int = 5, groups: int = 3) -> float:
    """Steps per second of the plain loop (k micro-batches with gradient accumulation; k = 1: the
    whole batch per step): the best of `groups` timed groups of `steps` steps (a loaded machine
    only adds time)."""
    module, opt, batches = make(rows)

    def step(i: int) -> None:
        inputs, target = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        for x, y in zip(inputs.tensor_split(k), target.tensor_split(k)):
            (nn.functional.mse_loss(module(x), y) * (x.shape[0] / rows)).backward()
        opt.step()

    step(0)
    best = 0.0
    for _ in range(groups):
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        best = max(best, steps / (time.perf_counter() - t0))
    return best


def rows_for(step_ms: float) -> int:
    """Rows per step whose plain step takes about step_ms here (its fastest; a multiple of 64).
    Scaled from 256 rows, then once more from the rows found: a step's time is not linear in
    its rows (the first guess made 16-17 ms steps for a 20 ms target on 2026-12-07)."""
    rows = 256
    for _ in range(2):
        ms = 1e3 / plain_steps_per_s(rows, 1)
        rows = max(64, int(round(rows * step_ms / ms / 64)) * 64)
    return rows


def in_bubbles(rows: int, k: int, bubble_us: float, bubbles: int):
    module, opt, batches = make(rows)
    rt = pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                    safety_margin_fraction=0.0, min_samples=1000000)
    job = pft.training_job(rt, module, opt, nn.functional.mse_loss, batches, steps=10**6,
                           micro_batches=k, name=f"micro{k}")
    stream = rt.high_priority_stream()
    for _ in range(bubbles):
        with rt.bubble(stream, expected_us=bubble_us):
            pf.host_stream_delay(stream, bubble_us)
        pf.host_stream_synchronize(stream)
        pf.host_stream_delay(stream, 500.0)  # the trainer's own work between bubbles
        rt.iteration_end()
        pf.host_stream_synchronize(stream)
    rt.synchronize()
    steps = job.step
    cost = job.job.cost_info()
    config = job.job.info().config_index
    job.close()
    rt.close()
    return steps / (bubbles * bubble_us * 1e-6), config, cost, job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--bubble-us", type=float, default=8000.0)
    parser.add_argument("--bubbles", type=int, default=150)
    parser.add_argument("--micro-batches", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = rows_for(args.step_ms)
    k = args.micro_batches
    print(f"MLP {DIM}->{HIDDEN}->{HIDDEN}->{OUT}, SGD, {rows} rows per step, torch threads 1; "
          f"{args.bubbles} bubbles of {args.bubble_us:.0f} us")
    alone = plain_steps_per_s(rows, 1)
    alone_k = plain_steps_per_s(rows, k)
    print(f"  alone (the plain loop, best of 3): {alone:.2f} steps/s ({1e3 / alone:.2f} ms a step) "
          f"with the whole batch per step; {alone_k:.2f} steps/s with {k} micro-batches of "
          f"{rows // k} rows (gradient accumulation)")
    for micro in (1, k):
        rate, config, cost, job = in_bubbles(rows, micro, args.bubble_us, args.bubbles)
        names = [c[0] for c in job._micro.configs(1.0, 0.0)] if job._micro else ["1 step"]
        print(f"  micro_batches {micro:2d}: {rate:7.2f} steps per bubble-second: ratio "
              f"{rate / alone:.3f} of the plain loop, {rate / alone_k:.3f} of the accumulation "
              f"loop; last configuration "
              f"{names[config] if 0 <= config < len(names) else config} (micro-batches per item "
              f"x per step), learned item cost {cost.learned_cost_us:.0f} us ({cost.probes} "
              f"probes, {cost.too_short_bubbles} bubbles too short)")


if __name__ == "__main__":
    main()
