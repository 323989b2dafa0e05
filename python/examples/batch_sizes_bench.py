"""inference_job with several batch sizes on the real-time host backend (issue 32 item 6): a batch
longer than the bubbles, run with one batch size (one configuration) and with several (the
planner picks the size per bubble class).

  python python/examples/batch_sizes_bench.py [--batch-ms 4] [--bubble-us 2000] [--bubbles 150]
      [--sizes 4]

Prints, from one process, side by side:
  - alone: samples per second of the plain loop (module on batches of the largest size; and of
    the smallest), the median of 3 timed groups, measured right before each job's bubbles (the
    same moment of a machine whose speed drifts; python/examples/micro_steps_bench.py);
  - for each job (one size: the largest; then --sizes sizes, largest / 2**i): samples per
    bubble-second (samples handed to the sink over --bubbles bubbles of --bubble-us), its ratio
    to alone, the claims run per size and the planner's learned costs.
No figure is a pass/fail: timings on a shared machine are noisy; compare the ratios.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import pipefill as pf
import pipefill.torch as pft

DIM, HIDDEN, OUT = 256, 512, 16


def make_module() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, OUT)).eval()


class Samples:
    """Samples cycled from a pool of 4096 (made once; the feeder stacks them into batches)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.pool = torch.randn(4096, DIM, generator=torch.Generator().manual_seed(1))

    def __iter__(self):
        pool = self.pool
        return (pool[i % 4096] for i in range(self.count))

    def __len__(self) -> int:
        return self.count


def plain_samples_per_s(module: nn.Module, rows: int, batches: int = 10, groups: int = 3,
                        fastest: bool = False) -> float:
    """The plain loop's samples per second over `groups` timed groups: their median, or with
    `fastest` their best."""
    x = torch.randn(rows, DIM)
    rates = []
    with torch.no_grad():
        module(x)
        for _ in range(groups):
            t0 = time.perf_counter()
            for _ in range(batches):
                module(x)
            rates.append(batches * rows / (time.perf_counter() - t0))
    return max(rates) if fastest else statistics.median(rates)


def rows_for(module: nn.Module, batch_ms: float) -> int:
    """Rows whose plain forward takes about batch_ms here (a multiple of 64)."""
    rate = plain_samples_per_s(module, 256, fastest=True)
    return max(64, int(round(rate * batch_ms * 1e-3 / 64)) * 64)


def in_bubbles(module: nn.Module, sizes, bubble_us: float, bubbles: int):
    rt = pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                    safety_margin_fraction=0.0, min_samples=1000000)
    kw = (dict(batch_size=sizes[0]) if len(sizes) == 1 else
          dict(batch_size=None, batch_sizes=sizes))
    job = pft.inference_job(rt, module, Samples(10**7), sink=lambda i, y: None, slots=4,
                            name=f"sizes{len(sizes)}", **kw)
    stream = rt.high_priority_stream()
    for _ in range(bubbles):
        with rt.bubble(stream, expected_us=bubble_us):
            pf.host_stream_delay(stream, bubble_us)
        pf.host_stream_synchronize(stream)
        pf.host_stream_delay(stream, 500.0)  # the trainer's own work between bubbles
        rt.iteration_end()
        pf.host_stream_synchronize(stream)
    rt.synchronize()
    unit = min(sizes)
    samples = job.progress().items_done * unit
    runs = list(getattr(job, "sizes_run", [job.job.info().items_completed]))
    cost = job.job.cost_info()
    job.close()
    rt.close()
    return samples / (bubbles * bubble_us * 1e-6), runs, cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-ms", type=float, default=4.0)
    parser.add_argument("--bubble-us", type=float, default=2000.0)
    parser.add_argument("--bubbles", type=int, default=150)
    parser.add_argument("--sizes", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    module = make_module()
    rows = rows_for(module, args.batch_ms)
    sizes = sorted({max(1, rows >> i) for i in range(args.sizes)})
    print(f"MLP {DIM}->{HIDDEN}->{HIDDEN}->{OUT} inference, torch threads 1; "
          f"{args.bubbles} bubbles of {args.bubble_us:.0f} us; sizes {sizes}")
    for job_sizes in ([rows], sizes):
        alone = plain_samples_per_s(module, rows)  # right before the job: the same moment
        alone_small = plain_samples_per_s(module, sizes[0])
        print(f"  alone (the plain loop, median of 3): {alone:.0f} samples/s at batch {rows} "
              f"({rows / alone * 1e3:.2f} ms a batch); {alone_small:.0f} samples/s at batch "
              f"{sizes[0]}")
        rate, runs, cost = in_bubbles(module, job_sizes, args.bubble_us, args.bubbles)
        print(f"  batch sizes {str(job_sizes):22s}: {rate:9.0f} samples per bubble-second: "
              f"ratio {rate / alone:.3f} of the plain loop at batch {rows}; claims per size "
              f"{runs}; learned cost of the last configuration {cost.learned_cost_us:.0f} us "
              f"({cost.probes} probes, {cost.too_short_bubbles} bubbles too short)")


if __name__ == "__main__":
    main()
