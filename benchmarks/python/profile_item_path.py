"""Where a host item's time goes (issue 32 item 1): runs streaming_bench's job inside bubbles (or
alone) under py-spy and sums the samples per thread and per state.

  py-spy record --native --idle --threads --format raw -r 2000 -o /tmp/prof.txt -- \\
      python benchmarks/python/profile_item_path.py run [--alone] [--items 600]
  python benchmarks/python/profile_item_path.py summarize /tmp/prof.txt

``run`` prints the job's item cost alone and learned inside bubbles (µs per item). ``summarize``
classifies every sample of py-spy's collapsed stacks (--threads --format raw) by thread - the
trainer, the fill worker (the host device's SM thread running items), the feeder, the drainer,
others - and by state at the leaf: waiting for the GIL (take_gil), building a thread state
(PyGILState_Ensure without a wait), idle (a condition wait or sleep), torch compute (ATen / MKL /
oneDNN), or the Python interpreter and bindings; and prints each share of the worker's samples
next to the per-item time it stands for.
"""
from __future__ import annotations

import collections
import os
import re
import sys

THREADS = (("trainer", ("trainer_step", "cpu_compute", "plain_steps", "alone (")),
           ("feeder", ("_feed (",)),
           ("drainer", ("_drain (",)),
           ("fill worker", ("_run_item", "run_item", "HostGraphItems", "launch_ticket",
                            "host::Engine", "pipefill::host")))


def thread_of(stack: str) -> str:
    for name, marks in THREADS:
        if any(m in stack for m in marks):
            return name
    return "other"


def state_of(frames: list) -> str:
    leaf = ";".join(frames[-12:])
    if "take_gil" in leaf or "drop_gil" in leaf:
        return "GIL wait"
    if re.search(r"PyThreadState_New|PyThreadState_Clear|PyThreadState_Delete|new_threadstate|"
                 r"tstate_delete", leaf):
        return "thread state"
    tail = ";".join(frames[-4:])
    if re.search(r"pthread_cond|futex|nanosleep|clock_nanosleep|sleep_until|__poll|epoll|"
                 r"sem_.*wait|select", tail):
        return "idle"
    if re.search(r"at::|mkl|dnnl|sgemm|gemm|omp|libgomp|c10::|torch::autograd", leaf):
        return "torch compute"
    return "python/bindings"


def summarize(path: str) -> None:
    counts: "collections.Counter[tuple]" = collections.Counter()
    for line in open(path):
        line = line.rstrip()
        if not line or " " not in line:
            continue
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        counts[(thread_of(stack), state_of(frames))] += int(n)
    threads = sorted({t for t, _ in counts})
    states = ["torch compute", "python/bindings", "GIL wait", "thread state", "idle"]
    print(f"{'thread':12s} " + " ".join(f"{s:>16s}" for s in states) + f" {'samples':>8s}")
    for t in threads:
        total = sum(v for (tt, _), v in counts.items() if tt == t)
        cells = " ".join(f"{100.0 * counts[(t, s)] / max(total, 1):15.1f}%" for s in states)
        print(f"{t:12s} {cells} {total:8d}")


def run(alone: bool, items: int) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "examples"))
    import torch
    import streaming_bench as b
    torch.set_num_threads(1)
    rate = b.alone(items)
    print(f"alone: {1e6 / rate:.0f} us per item")
    if alone:
        return
    reps = b.calibrate(4000.0)
    done, times, cost, learned = b.in_bubbles(items, 4000.0, reps)
    per_bubble_s = done / (len(times) * 4000e-6)
    print(f"inside bubbles: {done} items in {len(times)} bubbles, {per_bubble_s:.0f} items per "
          f"bubble-second (ratio {per_bubble_s / rate:.3f}); learned item cost "
          f"{learned.learned_cost_us:.0f} us ({learned.samples} slices)")


if __name__ == "__main__":
    if sys.argv[1] == "summarize":
        summarize(sys.argv[2])
    else:
        run("--alone" in sys.argv, int(sys.argv[sys.argv.index("--items") + 1])
            if "--items" in sys.argv else 600)
