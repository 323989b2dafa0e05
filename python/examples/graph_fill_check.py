"""GPU check of graph fill jobs (scripts/gpu-check.sh, step graph_fill): a torch model's
inference as a graph fill job (pipefill.torch.module_inference_job) inside the bubbles of a
synthetic main stream on one GPU.

Two parts, each wrapped so that one's failure does not hide the other's result:
  - matmul (issue 24 item 1): a graph captured by torch holding a cuBLAS GEMM (torch.matmul)
    becomes a gated graph job and runs inside bubbles: every item completes and the outputs equal
    eager ones. Before issue 24 the runtime read the graph's kernel nodes with our statically
    linked CUDA runtime, which never registered cuBLAS's or torch's kernels, and pfJobCreateGraph
    failed with cudaErrorInvalidDeviceFunction for every torch graph;
  - module: the facts below.

Prints, one fact per line (prefix "graph-fill:"):
  - outputs equal eager inference (max abs difference),
  - max overrun past a bubble's end vs the design's bound: one item's replay time plus the
    per-item claim overhead (the gated wrapper's gate read, index claim and cursor read-back),
    which is measured separately first, as the max overrun of a job whose item is one tiny
    kernel on its own runtime,
  - main-stream iteration time without filling and with it, side by side, and the ratio.
Exits 0 with "SKIPPED: no CUDA device" only when torch sees no GPU (or torch does not import);
1 when a check fails, and also when torch sees a GPU but the CUDA runtime of pipefill does not
start (that is a failure of the package on a GPU machine, never a skip).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import traceback


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--bubble-us", type=float, default=600.0)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    try:
        import torch
    except ImportError as error:
        print(f"SKIPPED: no CUDA device (torch does not import: {error})")
        return 0
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device (torch.cuda.is_available() is False)")
        return 0
    import pipefill as pf
    import pipefill.torch as pft
    try:
        pf.Runtime(backend="cuda", stage_id=0, stage_count=1, min_samples=2).close()
    except pf.PipeFillError as error:
        print(f"FAILED: torch sees {torch.cuda.device_count()} GPU(s) but the pipefill CUDA "
              f"runtime does not start: {error.message}")
        return 1
    ok = True
    for name, part in (("matmul", part_matmul), ("module", part_module)):
        try:
            passed = part(args, pf, pft, torch)
        except Exception:
            print(f"graph-fill: {name} FAILED with an exception:")
            print("".join(traceback.format_exc().splitlines(keepends=True)[-12:]), end="")
            passed = False
        print(f"graph-fill: {name} {'PASSED' if passed else 'FAILED'}")
        ok = ok and passed
    return 0 if ok else 1


def part_matmul(args, pf, pft, torch) -> bool:
    """torch.matmul (a cuBLAS GEMM) captured by torch, as a gated graph job inside bubbles."""
    from gpu_stage import stage_iteration
    rt = pf.Runtime(backend="cuda", stage_id=0, stage_count=1, min_samples=2)
    torch.backends.cuda.matmul.allow_tf32 = False  # eager and captured GEMMs in plain float32
    torch.manual_seed(2)
    batch, items = 64, 48
    x = torch.randn(items * batch, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    out = torch.zeros(items * batch, 1024, device="cuda")
    offsets = torch.arange(batch, device="cuda", dtype=torch.int64)

    def step(index):
        rows = index * batch + offsets
        out.index_copy_(0, rows, torch.matmul(x.index_select(0, rows), w))

    job = pft.graph_fill_job(rt, step, items, outputs=out, name="matmul",
                             keep_alive=(x, w, offsets))
    main_stream = torch.cuda.Stream(priority=-1)
    iteration = stage_iteration(rt, main_stream, torch.randn(2048, 2048, device="cuda"),
                                args.bubble_us)
    n = 0
    while not job.job.status.finished and n < 2000:
        iteration()
        main_stream.synchronize()
        n += 1
    rt.synchronize()
    info = job.job.info()
    outputs = job.wait(30.0) if info.status == pf.JobStatus.COMPLETED else out
    eager = torch.matmul(x, w)
    diff = (outputs - eager).abs().max().item()
    equal = info.status == pf.JobStatus.COMPLETED and torch.allclose(outputs, eager, rtol=1e-3,
                                                                    atol=1e-2)
    print(f"graph-fill: torch.matmul (cuBLAS) graph as a gated job: {info.status.name}, "
          f"{info.items_completed}/{items} items in {n} iterations; outputs equal eager: {equal} "
          f"(max abs diff {diff:.3g}; item {job.item_cost_us:.1f} us)")
    job.close()
    rt.close()
    return equal


def part_module(args, pf, pft, torch) -> bool:
    from gpu_stage import sleep_cycles_per_us, stage_iteration
    rt = pf.Runtime(backend="cuda", stage_id=0, stage_count=1, min_samples=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024)).cuda().eval()
    inputs = torch.randn(args.samples, 1024, device="cuda")
    with torch.no_grad():
        eager = torch.cat([model(inputs[i:i + args.batch])
                           for i in range(0, args.samples, args.batch)])
    main_stream = torch.cuda.Stream(priority=-1)
    a = torch.randn(4096, 4096, device="cuda")
    cycles_per_us = sleep_cycles_per_us()
    iteration = stage_iteration(rt, main_stream, a, args.bubble_us, cycles_per_us)

    def timed(n: int) -> list:
        times = []
        for _ in range(n):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(main_stream)
            iteration()
            e.record(main_stream)
            e.synchronize()
            times.append(s.elapsed_time(e) * 1000.0)
        return times

    claim_overhead_us = measure_claim_overhead(pf, pft, torch, main_stream, args.bubble_us,
                                               cycles_per_us)
    for _ in range(3):
        iteration()  # warm-up; gives the bubble class its history
    torch.cuda.synchronize()
    rt.synchronize()
    no_fill = timed(args.iterations)  # bubbles marked, no job: the baseline
    fill = pft.module_inference_job(rt, model, inputs, batch=args.batch)
    filled = timed(args.iterations)
    extra = 0
    while not fill.job.status.finished and extra < 2000:
        iteration()
        rt.synchronize()
        extra += 1
    rt.synchronize()
    info = fill.job.info()
    outputs = fill.wait(30.0) if info.status == pf.JobStatus.COMPLETED else fill.outputs
    stats = rt.stats()
    diff = (outputs - eager).abs().max().item()
    equal = info.status == pf.JobStatus.COMPLETED and torch.allclose(outputs, eager, rtol=1e-4,
                                                                    atol=1e-4)
    base, with_fill = statistics.median(no_fill), statistics.median(filled)
    print(f"graph-fill: job {info.status.name}, {info.items_completed}/{info.item_count} items "
          f"of {args.batch} samples, {stats.slices_launched} slices, {args.iterations + extra} "
          f"filled iterations")
    print(f"graph-fill: outputs equal eager: {equal} (max abs diff {diff:.3g})")
    bound = fill.item_cost_us + claim_overhead_us
    ok_overrun = stats.max_overrun_us <= bound
    print(f"graph-fill: max overrun {stats.max_overrun_us:.1f} us vs the bound one item "
          f"{fill.item_cost_us:.1f} us + claim overhead {claim_overhead_us:.1f} us = {bound:.1f} us: "
          f"{'within' if ok_overrun else 'MORE THAN ONE ITEM PLUS THE CLAIM'}")
    print(f"graph-fill: main-stream iteration median {base:.1f} us without filling, "
          f"{with_fill:.1f} us with filling, ratio {with_fill / base:.3f} "
          f"({args.iterations} iterations each, bubble {args.bubble_us:.0f} us)")
    print(f"graph-fill: filled {stats.filled_time_us:.0f} of {stats.bubble_time_us:.0f} us "
          f"of bubble time ({stats.filled_share:.1%})")
    fill.close()
    rt.close()
    return equal and ok_overrun


def measure_claim_overhead(pf, pft, torch, main_stream, bubble_us: float,
                           cycles_per_us: float) -> float:
    """The gated wrapper's cost per item apart from the user's work: the max overrun past a
    bubble's end of a job whose item is one tiny kernel, on a runtime of its own (stats are per
    runtime). Whatever the real job overruns beyond its own item is bounded by this."""
    rt = pf.Runtime(backend="cuda", stage_id=0, stage_count=1, min_samples=2)
    scratch = torch.zeros((), dtype=torch.int64, device="cuda")
    tiny = pft.graph_fill_job(rt, lambda index: scratch.copy_(index), 100_000, name="claim-probe")
    for _ in range(30):
        with torch.cuda.stream(main_stream):
            with rt.bubble(main_stream, expected_us=bubble_us):
                torch.cuda._sleep(int(bubble_us * cycles_per_us))
        rt.iteration_end()
    rt.synchronize()
    overhead = rt.stats().max_overrun_us
    print(f"graph-fill: claim overhead (max overrun of a 1-kernel item, item {tiny.item_cost_us:.1f} "
          f"us, 30 bubbles): {overhead:.1f} us")
    tiny.close()
    rt.close()
    return overhead


if __name__ == "__main__":
    sys.exit(main())
