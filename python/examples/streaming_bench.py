"""Throughput and memory of pipefill.torch.inference_job on the real-time host backend.

  python python/examples/streaming_bench.py [--items 400] [--bubble-us 4000] [--compute-us 4000] [--slots 16]

Prints, from one run on this machine:
  1. items/s of the job alone: the same module over the same batches in a plain loop (no
     runtime, no threads);
  2. items/s of the job inside bubbles: a trainer loop of bubbles (bubble-us of waiting, the
     fill work runs) and compute between them (compute-us, no fill work); the ratio to 1, the
     bubble share of the trainer's time, and the ratio divided by that share (the fraction of
     the bubble time that became items at the alone rate);
  3. peak RSS growth (ru_maxrss, from before the job) while streaming 1x, 4x and 16x the items,
     one fresh process each, and the same with the dataset held in a list first (the control):
     memory vs dataset size.
No figure is a pass/fail; the ratios come from one run, side by side.
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

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


def alone(items: int) -> float:
    module = model()
    batches = [torch.stack(list(samples(BATCH)))] * 4
    with torch.no_grad():
        module(batches[0])
        t0 = time.perf_counter()
        for k in range(items):
            module(batches[k % 4])
        return items / (time.perf_counter() - t0)


def in_bubbles(items: int, bubble_us: float, compute_us: float, slots: int = 16):
    rt = pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                    safety_margin_fraction=0.0, min_samples=1000000)
    done = [0]

    def sink(i, y):
        done[0] += 1

    job = pft.inference_job(rt, model(), samples(items * BATCH), batch_size=BATCH, slots=slots,
                            sink=sink)
    stream = rt.high_priority_stream()
    bubbles = 0
    t0 = time.perf_counter()
    while not job.progress().finished and job.error is None and bubbles < 100000:
        with rt.bubble(stream, expected_us=bubble_us):
            pf.host_stream_delay(stream, bubble_us)
        pf.host_stream_delay(stream, compute_us)
        rt.iteration_end()
        pf.host_stream_synchronize(stream)
        bubbles += 1
    seconds = time.perf_counter() - t0
    job.wait(timeout=60)
    cost = job.item_cost_us
    job.close()
    rt.close()
    return done[0] / seconds, bubbles, seconds, cost


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--bubble-us", type=float, default=4000.0)
    parser.add_argument("--compute-us", type=float, default=4000.0)
    parser.add_argument("--memory-items", type=int, default=100)
    parser.add_argument("--slots", type=int, default=16,
                        help="the job's ring (4 held 4000 us bubbles to ~6 items here: the feeder "
                             "waits for the drainer)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rate_alone = alone(args.items)
    rate, bubbles, seconds, cost = in_bubbles(args.items, args.bubble_us, args.compute_us, args.slots)
    share = args.bubble_us / (args.bubble_us + args.compute_us)
    print(f"model {DIM}->{HIDDEN}->{OUT}, batch {BATCH}, {args.items} items, torch threads 1")
    print(f"alone:          {rate_alone:10.1f} items/s")
    print(f"inside bubbles: {rate:10.1f} items/s ({bubbles} bubbles of {args.bubble_us:.0f} us "
          f"+ {args.compute_us:.0f} us compute, {seconds:.2f} s; item cost measured "
          f"{cost:.0f} us)")
    print(f"ratio inside/alone: {rate / rate_alone:.3f}; bubble share {share:.3f}; "
          f"ratio / share: {rate / rate_alone / share:.3f}")
    print("memory vs dataset size (peak RSS growth from before the job, one process each):")
    for factor in (1, 4, 16):
        n = args.memory_items * factor
        mib_in = n * BATCH * DIM * 4 / 2**20
        print(f"  {n:6d} items ({mib_in:7.1f} MiB of input): streamed "
              f"{memory(n) / 1024:6.1f} MiB, held in a list first {memory(n, 'held') / 1024:6.1f} MiB")


if __name__ == "__main__":
    main()
