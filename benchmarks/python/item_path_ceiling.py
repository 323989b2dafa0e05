"""The Python item path's own ceiling (issue 32 item 3): how many trivial items per second a
streaming job's feeder -> item -> drainer path sustains on the real-time host backend.

  python benchmarks/python/item_path_ceiling.py [--items 20000] [--slots 1024] [--bubble-us 20000]
      [--runs 3]

The item is one small tensor (1 x 8 floats) through ``torch.nn.Identity``; the sink drops it.
Printed side by side, from one process:
  - the bare loop: the same work with no runtime and no threads (copy the batch into a slot,
    the module on the slot, hand the output to the sink), items/s;
  - the job: ``pipefill.torch.inference_job`` in back-to-back bubbles of --bubble-us (the trainer
    thread waits in each, nothing else runs), items per bubble-second;
and their ratio. The goal (issue 32): >= 20,000 items/s on a 2-core machine, so that the path
does not starve a GPU whose items take 50 us (the CUDA ring's feeder and drainer are this path).
Median of --runs runs each; no figure is a pass/fail.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import pipefill as pf
import pipefill.torch as pft

SHAPE = (1, 8)


def batches(count: int):
    x = torch.ones(SHAPE)
    for _ in range(count):
        yield x


def bare_loop(items: int, slots: int) -> float:
    module = torch.nn.Identity()
    ring = [torch.empty(SHAPE) for _ in range(slots)]
    sink = lambda i, y: None  # noqa: E731 - the job's sink, the same call
    t0 = time.perf_counter()
    for k, batch in enumerate(batches(items)):
        slot = ring[k % slots]
        slot.copy_(batch)
        with torch.no_grad():
            out = module(slot)
        sink(k, out)
    return items / (time.perf_counter() - t0)


def job_rate(items: int, slots: int, bubble_us: float) -> float:
    rt = pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                    safety_margin_fraction=0.0, min_samples=1000000)
    job = pft.inference_job(rt, torch.nn.Identity(), batches(items), batch_size=None,
                            sink=lambda i, y: None, slots=slots, item_cost_us=5.0)
    stream = rt.high_priority_stream()
    bubbles = 0
    while not job.progress().finished and job.error is None and bubbles < 100000:
        with rt.bubble(stream, expected_us=bubble_us):
            pf.host_stream_delay(stream, bubble_us)
        pf.host_stream_synchronize(stream)
        rt.iteration_end()
        bubbles += 1
    done = job.wait(timeout=60).items_done
    job.close()
    rt.close()
    return done / (bubbles * bubble_us * 1e-6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--slots", type=int, default=1024,
                        help="the ring: it caps the items one bubble runs (the bound is read "
                             "when a slice is planned), 64 held this path to 64 per bubble")
    parser.add_argument("--bubble-us", type=float, default=20000.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bare, job = [], []
    for _ in range(args.runs):
        bare.append(bare_loop(args.items, args.slots))
        job.append(job_rate(args.items, args.slots, args.bubble_us))
    b, j = statistics.median(bare), statistics.median(job)
    print(f"trivial item (a {SHAPE[0]}x{SHAPE[1]} tensor through nn.Identity), {args.items} items, "
          f"slots {args.slots}, bubbles of {args.bubble_us:.0f} us, median of {args.runs} runs; "
          f"python {sys.version.split()[0]}, torch {torch.__version__}")
    print(f"  bare loop:         {b:10.0f} items/s   (runs: {', '.join(f'{v:.0f}' for v in bare)})")
    print(f"  inference_job:     {j:10.0f} items per bubble-second   "
          f"(runs: {', '.join(f'{v:.0f}' for v in job)})")
    print(f"  ratio job / bare:  {j / b:.3f}; goal >= 20000 items/s: "
          f"{'met' if j >= 20000 else 'NOT met'}")


if __name__ == "__main__":
    main()
