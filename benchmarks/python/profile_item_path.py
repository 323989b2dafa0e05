"""Where a host item's time goes (issue 32 item 1), measured from inside the process.

  python benchmarks/python/profile_item_path.py [--items 600] [--bubble-us 4000] [--runs 3]

Runs python/examples/streaming_bench.py's default job (a 256->512->16 MLP, batches of 32) alone
and inside bubbles of a trainer loop (bubble, then ~4000 us of the trainer's matmuls), with the
job's Python methods wrapped by timers (the same wrappers on any version of pipefill.torch whose
InferenceJob has _run_item, _feed and _drain), and prints per item, in µs:

  - alone: the module on a staged batch (the bench's plain loop), and the data pipeline (a batch
    made from 32 samples with torch.stack, as the feeder makes it);
  - inside bubbles: the bubble time per item (bubble-seconds / items), the planner's learned
    cost (for Python items the fastest of the window's samples, so that slow samples do not
    starve the job: not a mean), the item function's own wall time (the Python _run_item: the
    module, plus what the version does around it), and the bubble time per item outside the item
    function (the claim, the GIL hand-over to the fill thread, the C->Python call, the slice's
    start and its tail past the last item that fitted); the feeder's and the drainer's CPU time
    per item (time.thread_time of their threads: batch making, staging, sink, hand-offs), their
    loop wake-ups per item, and the Python->C calls
    per item (calls into the native job from the feeder, drainer and items).
Median over --runs runs (each run side by side in this process). Timings move with the
machine's load: compare versions in one session.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "examples"))

import torch  # noqa: E402

import pipefill.torch as pft  # noqa: E402
import streaming_bench as bench  # noqa: E402


class Counting:
    """A proxy of a native job that counts the calls made through it."""

    def __init__(self, native, counts) -> None:
        self._native, self._counts = native, counts

    def __getattr__(self, name):
        attr = getattr(self._native, name)
        if not callable(attr):
            return attr
        counts = self._counts

        def call(*args, **kwargs):
            counts["native calls"] += 1
            return attr(*args, **kwargs)
        return call


def instrument(counts: dict):
    cls = pft.InferenceJob
    originals = {n: getattr(cls, n) for n in ("_run_item", "_feed", "_drain", "_check_item_error")}

    def run_item(self, k):
        t0 = time.perf_counter()
        originals["_run_item"](self, k)
        counts["item fn us"] += (time.perf_counter() - t0) * 1e6
        counts["items"] += 1

    def feed(self, *a):
        if not isinstance(self.job._native, Counting):
            self.job._native = Counting(self.job._native, counts)
        t0 = time.thread_time()
        try:
            originals["_feed"](self, *a)
        finally:
            counts["feeder cpu us"] += (time.thread_time() - t0) * 1e6

    def drain(self, *a):
        t0 = time.thread_time()
        try:
            originals["_drain"](self, *a)
        finally:
            counts["drainer cpu us"] += (time.thread_time() - t0) * 1e6

    def check(self):
        if threading.current_thread().name.startswith("pipefill-drain"):
            counts["drainer wake-ups"] += 1
        return originals["_check_item_error"](self)

    cls._run_item, cls._feed, cls._drain, cls._check_item_error = run_item, feed, drain, check
    return originals


def pipeline_us(items: int) -> float:
    """The feeder's batch making alone: 32 samples stacked into a batch, per item."""
    data = bench.samples(items * bench.BATCH)
    t0 = time.perf_counter()
    for _ in range(items):
        torch.stack([next(data) for _ in range(bench.BATCH)])
    return (time.perf_counter() - t0) * 1e6 / items


def alone(items: int) -> float:
    """The module on a staged batch, no runtime: items/s (the plain loop of the job alone)."""
    module = bench.model()
    batch = torch.stack(list(bench.samples(bench.BATCH)))
    with torch.no_grad():
        module(batch)
        t0 = time.perf_counter()
        for _ in range(items):
            module(batch)
    return items / (time.perf_counter() - t0)


def in_bubbles(items: int, bubble_us: float, reps: int):
    """The job in the trainer's bubbles (streaming_bench's trainer step) until it is done:
    items done, the steps' times, and the runtime's learned cost."""
    rt = bench.host_runtime()
    job = pft.inference_job(rt, bench.model(), bench.samples(items * bench.BATCH),
                            batch_size=bench.BATCH, slots=64, sink=lambda i, y: None)
    stream = rt.high_priority_stream()
    times = []
    while not job.progress().finished and job.error is None and len(times) < 100000:
        times.append(bench.trainer_step(rt, stream, bubble_us, reps))
    done = job.wait(timeout=60).items_done
    learned = job.job.cost_info()
    job.close()
    rt.close()
    return done, times, learned


def one_run(items: int, bubble_us: float, reps: int) -> dict:
    counts = {k: 0.0 for k in ("items", "item fn us", "feeder cpu us", "drainer cpu us",
                               "drainer wake-ups", "native calls")}
    module_us = 1e6 / alone(items)
    data_us = pipeline_us(items)
    originals = instrument(counts)
    try:
        done, times, learned = in_bubbles(items, bubble_us, reps)
    finally:
        for name, fn in originals.items():
            setattr(pft.InferenceJob, name, fn)
    n = max(1.0, counts["items"])
    bubble_per_item = len(times) * bubble_us / max(done, 1)
    item_fn = counts["item fn us"] / n
    return {"alone: module": module_us, "alone: batch making": data_us,
            "bubble time per item": bubble_per_item,
            "planner's learned cost": learned.learned_cost_us,
            "item function (Python)": item_fn,
            "bubble time outside items": bubble_per_item - item_fn,
            "feeder CPU": counts["feeder cpu us"] / n, "drainer CPU": counts["drainer cpu us"] / n,
            "drainer wake-ups": counts["drainer wake-ups"] / n,
            "Python->C calls": counts["native calls"] / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--bubble-us", type=float, default=4000.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    reps = bench.calibrate(4000.0)
    runs = [one_run(args.items, args.bubble_us, reps) for _ in range(args.runs)]
    print(f"per item, median of {args.runs} runs ({args.items} items, bubbles of "
          f"{args.bubble_us:.0f} us, torch threads 1; pipefill.torch from "
          f"{os.path.dirname(pft.__file__)})")
    for key in runs[0]:
        values = [r[key] for r in runs]
        unit = "" if key in ("drainer wake-ups", "Python->C calls") else " us"
        print(f"  {key:30s} {statistics.median(values):9.2f}{unit}   "
              f"(runs: {', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
