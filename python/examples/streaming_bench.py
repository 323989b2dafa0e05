"""Throughput and memory of pipefill.torch.inference_job on the real-time host backend.

  python python/examples/streaming_bench.py [--items 1500] [--bubble-us 4000] [--compute-us 4000]
      [--runs 5] [--block 10] [--skip 2] [--slots 64] [--item-cost-us C]
      [--memory-items 100 | --no-memory]

Prints, from one process on this machine, the trainer (a loop of bubbles: bubble-us of waiting
in which the fill work runs, then its own CPU compute, torch matmuls on the main thread
calibrated to compute-us, no bubble open) in alternating blocks of --block steps, plain (a
runtime without fill jobs) and filling (a runtime whose inference_job fills its bubbles), with
the job alone (the same module over the same batches in a plain loop: no runtime, no threads)
timed between the blocks, until the job is done; so the machine's drift over the run hits every
side alike:
  1. the job's items per bubble-second vs its items/s alone, as a ratio;
  2. the trainer's median step filling vs plain, as a ratio (the first --skip steps of each
     block not counted: a filling block's first steps follow plain ones, a plain block's follow
     filling ones);
  3. the job's item cost as timed at creation (or given: --item-cost-us, kept by the planner)
     and as learned from its measured slices (Job.cost_info);
  1-3 are repeated --runs times (default 5), each run side by side, and the medians of the two
     ratios printed against the goals (issue 32: >= 0.6 of alone, trainer step <= 1.03x);
  4. peak RSS growth (ru_maxrss, from before the job) while streaming 1x, 4x and 16x the items,
     one fresh process each, and the same with the dataset held in a list first (the control):
     memory vs dataset size.
No figure is a pass/fail; the ratios come from one run, side by side.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import statistics
import time
from typing import List, Optional

import torch

import pipefill as pf
import pipefill.torch as pft

DIM, HIDDEN, OUT, BATCH = 256, 512, 16, 32


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, OUT)).eval()


def samples(count: int):
    for i in range(count):
        yield torch.full((DIM,), float(i % 13) / 13.0)


# The trainer's own compute: CPU matmuls on the main thread (the host backend's "GPU" is the
# CPU, so this is what fill threads compete with).
_A = torch.randn(128, 128)


def cpu_compute(reps: int) -> None:
    x = _A
    for _ in range(reps):
        x = torch.mm(x, _A).clamp_(-1.0, 1.0)


def calibrate(compute_us: float) -> int:
    """Matmul repetitions that take compute_us on this machine now (no fill running)."""
    cpu_compute(50)
    t0 = time.perf_counter()
    cpu_compute(200)
    per_rep_us = (time.perf_counter() - t0) * 1e6 / 200
    return max(1, round(compute_us / per_rep_us))


def host_runtime() -> pf.Runtime:
    return pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                      safety_margin_fraction=0.0, min_samples=1000000)


def trainer_step(rt: pf.Runtime, stream, bubble_us: float, reps: int) -> float:
    """One trainer step: a bubble (waiting for a peer, bubble_us; fill work runs), then the
    trainer's compute. Returns its wall time (s)."""
    t0 = time.perf_counter()
    with rt.bubble(stream, expected_us=bubble_us):
        pf.host_stream_delay(stream, bubble_us)
    pf.host_stream_synchronize(stream)  # the peer's data arrived: the bubble is over
    cpu_compute(reps)
    rt.iteration_end()
    return time.perf_counter() - t0


def interleaved(items: int, bubble_us: float, reps: int, slots: int, item_cost_us: Optional[float],
                block: int, skip: int):
    """The trainer in alternating blocks of `block` steps: plain (a runtime without fill jobs)
    and filling (a runtime whose job fills its bubbles), with `block` items of the job alone
    (a plain loop) between them, until the job is done. The first `skip` steps of each block are
    not counted (a filling step's last item, which may run past its bubble, falls into the next
    step: counted in the filling blocks, kept out of the plain ones). Drift of the machine over
    the run (this one's load changes by 5-10% in a second) hits both sides alike."""
    plain_rt, fill_rt = host_runtime(), host_runtime()
    done = [0]

    def sink(i, y):
        done[0] += 1

    job = pft.inference_job(fill_rt, model(), samples(items * BATCH), batch_size=BATCH,
                            slots=slots, sink=sink, item_cost_us=item_cost_us)
    module = model()
    batches = [torch.stack(list(samples(BATCH)))] * 4
    plain_stream, fill_stream = plain_rt.high_priority_stream(), fill_rt.high_priority_stream()
    plain: List[float] = []
    filled: List[float] = []
    filled_bubbles = 0
    alone_items, alone_s = 0, 0.0
    with torch.no_grad():
        module(batches[0])
    while not job.progress().finished and job.error is None and filled_bubbles < 100000:
        for k in range(block):
            t = trainer_step(plain_rt, plain_stream, bubble_us, reps)
            if k >= skip:
                plain.append(t)
        with torch.no_grad():
            t0 = time.perf_counter()
            for k in range(block):
                module(batches[k % 4])
            alone_s += time.perf_counter() - t0
            alone_items += block
        for k in range(block):
            t = trainer_step(fill_rt, fill_stream, bubble_us, reps)
            filled_bubbles += 1
            finished = job.progress().finished
            if k >= skip or finished:
                filled.append(t)
            if finished:
                break
    job.wait(timeout=60)
    cost = job.item_cost_us
    learned = job.job.cost_info()
    job.close()
    fill_rt.close()
    plain_rt.close()
    return dict(done=done[0], plain=plain, filled=filled, bubbles=filled_bubbles, cost=cost,
                learned=learned, alone=alone_items / alone_s)


MEMORY = r"""
import resource, sys, torch, pipefill as pf, pipefill.torch as pft
sys.path.insert(0, sys.argv[2]); import streaming_bench as b
torch.set_num_threads(1)
items = int(sys.argv[1])
rt = pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0, safety_margin_fraction=0.0,
                min_samples=1000000)
model = b.model()
model(torch.zeros(b.BATCH, b.DIM))                  # torch's first-call allocations
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
data = list(b.samples(items * b.BATCH)) if sys.argv[3] == "held" else b.samples(items * b.BATCH)
job = pft.inference_job(rt, model, data, batch_size=b.BATCH, slots=4, sink=lambda i, y: None)
stream = rt.high_priority_stream()
while not job.progress().finished and job.error is None:
    with rt.bubble(stream, expected_us=20000.0):
        pf.host_stream_delay(stream, 20000.0)
    rt.iteration_end(); pf.host_stream_synchronize(stream)
job.wait(timeout=120); job.close(); rt.close()
print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def memory(items: int, data: str = "streamed") -> int:
    import os
    out = subprocess.run([sys.executable, "-c", MEMORY, str(items), os.path.dirname(__file__),
                          data],
                         capture_output=True, text=True, timeout=600, check=True)
    base, peak = map(int, out.stdout.split()[-2:])
    return peak - base


def one_run(args: argparse.Namespace, reps: int) -> dict:
    """One side-by-side run: plain and filling trainer blocks and the job alone, interleaved."""
    r = interleaved(args.items, args.bubble_us, reps, args.slots, args.item_cost_us, args.block,
                    args.skip)
    per_bubble_s = r["done"] / (r["bubbles"] * args.bubble_us * 1e-6)
    step_plain, step_filled = statistics.median(r["plain"]), statistics.median(r["filled"])
    return dict(alone=r["alone"], per_bubble_s=per_bubble_s, fill_ratio=per_bubble_s / r["alone"],
                bubbles=r["bubbles"], step_plain=step_plain, step_filled=step_filled,
                step_ratio=step_filled / step_plain, cost=r["cost"], learned=r["learned"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1500)
    parser.add_argument("--block", type=int, default=10,
                        help="trainer steps per block (plain and filling blocks alternate)")
    parser.add_argument("--skip", type=int, default=2,
                        help="steps not counted at the start of each block")
    parser.add_argument("--bubble-us", type=float, default=4000.0)
    parser.add_argument("--compute-us", type=float, default=4000.0)
    parser.add_argument("--runs", type=int, default=5, help="side-by-side runs (median printed)")
    parser.add_argument("--memory-items", type=int, default=100)
    parser.add_argument("--no-memory", action="store_true", help="skip the memory part")
    parser.add_argument("--item-cost-us", type=float, default=None,
                        help="the job's item cost, kept by the planner (default: timed at "
                             "creation, then learned from the slices)")
    parser.add_argument("--slots", type=int, default=64,
                        help="the job's ring: on the host backend it caps the items one bubble "
                             "runs (the bound is read when a slice is planned, at the bubble's "
                             "begin), so it must hold a bubble's worth of items (16 capped 4000 "
                             "us bubbles at 16 items, 0.57 of this model's alone rate)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    reps = calibrate(args.compute_us)
    share = args.bubble_us / (args.bubble_us + args.compute_us)
    print(f"model {DIM}->{HIDDEN}->{OUT}, batch {BATCH}, {args.items} items, torch threads 1; "
          f"trainer compute {reps} matmuls of 128x128 (~{args.compute_us:.0f} us when idle); "
          f"bubbles of {args.bubble_us:.0f} us (share {share:.3f})")
    runs = []
    for r in range(args.runs):
        run = one_run(args, reps)
        runs.append(run)
        learned = run["learned"]
        print(f"run {r + 1}: alone {run['alone']:8.1f} items/s; inside bubbles "
              f"{run['per_bubble_s']:8.1f} items per bubble-second ({run['bubbles']} bubbles): "
              f"ratio {run['fill_ratio']:.3f}; trainer step plain {run['step_plain'] * 1e3:.3f} ms, "
              f"filling {run['step_filled'] * 1e3:.3f} ms: ratio {run['step_ratio']:.3f}; item "
              f"cost first {run['cost']:.0f} us"
              f"{' (given)' if args.item_cost_us is not None else ' (timed at creation)'}, "
              f"learned {learned.learned_cost_us:.0f} us ({learned.samples} slices, "
              f"{learned.probes} probes, {learned.too_short_bubbles} too-short bubbles), alone "
              f"{1e6 / run['alone']:.0f} us")
    fill = statistics.median(r["fill_ratio"] for r in runs)
    step = statistics.median(r["step_ratio"] for r in runs)
    print(f"median of {len(runs)} runs (each side by side in this process):")
    print(f"  items per bubble-second / alone: {fill:.3f} (goal >= 0.6: "
          f"{'met' if fill >= 0.6 else 'NOT met'}); runs "
          + ", ".join(f"{r['fill_ratio']:.3f}" for r in runs))
    print(f"  trainer step filling / plain:    {step:.3f} (goal <= 1.03: "
          f"{'met' if step <= 1.03 else 'NOT met'}); runs "
          + ", ".join(f"{r['step_ratio']:.3f}" for r in runs))
    if args.no_memory:
        return
    print("memory vs dataset size (peak RSS growth from before the job, one process each):")
    for factor in (1, 4, 16):
        n = args.memory_items * factor
        mib_in = n * BATCH * DIM * 4 / 2**20
        print(f"  {n:6d} items ({mib_in:7.1f} MiB of input): streamed "
              f"{memory(n) / 1024:6.1f} MiB, held in a list first {memory(n, 'held') / 1024:6.1f} MiB")


if __name__ == "__main__":
    main()
