"""GPU check of the CUDA path of the streaming fill jobs and of job creation (scripts/gpu-check.sh;
issues 18 and 24): pipefill.torch.inference_job and training_job on the CUDA backend inside the
bubbles of a synthetic main stream on one GPU, the trainer's stream across a job creation, and a
torch green context current across the runtime's calls.

Each part runs on its own (``--part NAME``; gpu-check runs each as a step of its own, so a part
that fails - or kills the CUDA context - hides none of the others) and is wrapped again here, so
``--part all`` reports every part too. Prints one fact per line (prefix "cuda-streaming:"):
  - inference: a dataset 64x the slot ring; every output equals the module run eagerly (max abs
    difference; allclose rtol=atol=1e-4 in float32 with TF32 off: the replayed kernels are those
    of the capture, but cuBLAS may choose another GEMM algorithm for a captured call), in item
    order, exactly once;
  - training: Adam (capturable=True) with checkpoints; the final parameters equal the same steps
    run eagerly with the same optimizer (allclose rtol=1e-4, atol=1e-5: float32, a GEMM algorithm
    may differ under capture and the difference compounds over the steps), the losses likewise,
    every checkpoint copied while no bubble was open, the checkpoint file at the last step;
  - creation: the trainer's stream across a job's creation (issue 24 item 5). 100 iterations of
    1 ms are queued on the main stream, a graph job is created on the same thread, 20 more are
    queued; the GPU-side gap between the last iteration queued before the creation and the first
    one after it is measured with events on the main stream. Side by side in the same run: the
    same sequence with ``torch.cuda.synchronize(); torch.cuda.empty_cache()`` before the creation
    (what ``torch.cuda.graph(...).__enter__`` did), and the ratio. Passes when the gap without the
    drain is under half the gap with it (or under 200 us);
  - green-context: a torch GreenContext made current (``set_context``) stays current across
    Runtime creation, bubbles on the current stream (admitted, or refused by name) and close (the
    current context read through torch's cuda.bindings driver module; skipped without it).
Exits 0 with "SKIPPED: no CUDA device" only when torch sees no GPU (or does not import); 1 when
a part fails or when torch sees a GPU but the pipefill CUDA runtime does not start.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
import warnings

PARTS = ("inference", "training", "creation", "green-context")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=PARTS + ("all",), default="all")
    parser.add_argument("--bubble-us", type=float, default=800.0)
    parser.add_argument("--max-iterations", type=int, default=4000)
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
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        pf.Runtime(backend="cuda", stage_id=0, stage_count=1, min_samples=2).close()
    except pf.PipeFillError as error:
        print(f"FAILED: torch sees {torch.cuda.device_count()} GPU(s) but the pipefill CUDA "
              f"runtime does not start: {error.message}")
        return 1
    parts = PARTS if args.part == "all" else (args.part,)
    functions = {"inference": part_inference, "training": part_training,
                 "creation": part_creation, "green-context": part_green_context}
    ok = True
    for name in parts:
        start = time.monotonic()
        try:
            verdict = functions[name](args)
        except Exception:  # one part's failure never hides the next one's result
            print(f"cuda-streaming: {name} FAILED with an exception:")
            print("".join(traceback.format_exc().splitlines(keepends=True)[-12:]), end="")
            verdict = False
        label = verdict if isinstance(verdict, str) else ("PASSED" if verdict else "FAILED")
        print(f"cuda-streaming: {name} {label} ({time.monotonic() - start:.1f} s)")
        ok = ok and verdict is not False
    return 0 if ok else 1


def _stage(args):
    """A runtime and one stage iteration on a high-priority main stream (gpu_stage.py)."""
    import torch
    import pipefill as pf
    from gpu_stage import stage_iteration
    rt = pf.Runtime(backend="cuda", stage_id=0, stage_count=1, min_samples=2)
    main_stream = torch.cuda.Stream(priority=-1)
    a = torch.randn(2048, 2048, device="cuda")
    stage = stage_iteration(rt, main_stream, a, args.bubble_us)

    def run(done) -> int:
        n = 0
        while not done() and n < args.max_iterations:
            stage()
            main_stream.synchronize()
            n += 1
        return n

    return rt, run


def part_inference(args) -> bool:
    import torch
    import pipefill as pf
    import pipefill.torch as pft
    rt, run = _stage(args)
    slots, batch = 4, 32
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 64)).cuda().eval()
    count = 64 * slots * batch + 5
    g = torch.Generator().manual_seed(1)
    samples = torch.randn(count, 256, generator=g)
    got = []
    job = pft.inference_job(rt, model, list(samples), batch_size=batch, slots=slots,
                            sink=lambda i, y: got.append((i, y.clone())), name="stream-infer")
    iterations = run(lambda: job.progress().finished or job.error is not None)
    ok = True
    try:
        job.wait(timeout=30)
    except (pft.FillJobError, pf.PipeFillError) as error:
        print(f"cuda-streaming: inference FAILED: {error}")
        ok = False
    items = -(-count // batch)
    with torch.no_grad():
        eager = [model(samples[k:k + batch].cuda()).cpu() for k in range(0, count, batch)]
    order = [i for i, _ in got] == list(range(items))
    diff = max(((y - e).abs().max().item() for (_, y), e in zip(got, eager)), default=float("nan"))
    equal = order and all(torch.allclose(y, e, rtol=1e-4, atol=1e-4) for (_, y), e in zip(got, eager))
    print(f"cuda-streaming: inference {len(got)}/{items} items (ring of {slots} slots, batch "
          f"{batch}, item {job.item_cost_us:.1f} us), {iterations} iterations; in order once "
          f"each: {order}; outputs equal eager: {equal} (max abs diff {diff:.3g})")
    job.close()
    rt.close()
    return ok and equal


def part_training(args) -> bool:
    import torch
    import pipefill as pf
    import pipefill.torch as pft
    rt, run = _stage(args)
    steps, every = 40, 10

    def fresh():
        torch.manual_seed(3)
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 8)).cuda()
        return m, torch.optim.Adam(m.parameters(), lr=1e-2, capturable=True)

    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)) for _ in range(12)]
    eager_model, eager_opt = fresh()
    eager_losses = []
    for k in range(steps):
        x, y = (t.cuda() for t in data[k % len(data)])
        eager_opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(eager_model(x), y)
        loss.backward()
        eager_opt.step()
        eager_losses.append(loss.item())
    module, opt = fresh()
    ok = True
    before = torch.cuda.memory_allocated()
    with tempfile.TemporaryDirectory() as folder:
        ckpt = f"{folder}/train.pt"
        train = pft.training_job(rt, module, opt, torch.nn.functional.mse_loss, data,
                                 steps=steps, checkpoint=ckpt, every=every, name="stream-train")
        # Issue 24 item 2: no clone of the model or the optimizer state outlives creation.
        held = torch.cuda.memory_allocated() - before
        iterations = run(lambda: train.progress().finished or train.error is not None)
        try:
            train.wait(timeout=30)
        except (pft.FillJobError, pf.PipeFillError) as error:
            print(f"cuda-streaming: training FAILED: {error}")
            ok = False
        saved = torch.load(ckpt, weights_only=False) if train.progress().finished else {}
    state, reference = module.state_dict(), eager_model.state_dict()
    pdiff = max((state[k] - reference[k]).abs().max().item() for k in reference)
    params_equal = all(torch.allclose(state[k], reference[k], rtol=1e-4, atol=1e-5) for k in reference)
    losses_equal = len(train.losses) == steps and all(
        abs(a_ - b_) <= 1e-4 * abs(b_) + 1e-5 for a_, b_ in zip(train.losses, eager_losses))
    outside = all(not s.in_bubble for s in train.snapshots)
    model_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    print(f"cuda-streaming: training {train.progress().items_done}/{steps} steps, {iterations} "
          f"iterations; params equal eager: {params_equal} (max abs diff {pdiff:.3g}); losses "
          f"equal: {losses_equal}")
    print(f"cuda-streaming: checkpoints at steps {[s.step for s in train.snapshots]} taken at "
          f"{sorted({s.taken_at for s in train.snapshots})}, none in a bubble: {outside}; file "
          f"at step {saved.get('step')}")
    print(f"cuda-streaming: training job creation held {held / 1e6:.2f} MB more than before "
          f"(model {model_bytes / 1e6:.2f} MB: the ring, the graph pool and the optimizer state; "
          "no saved copy of the model)")
    train.close()
    rt.close()
    return ok and params_equal and losses_equal and outside and saved.get("step") == steps


def part_creation(args) -> bool:
    """The trainer's stream across a job's creation, with and without the old device drain."""
    import torch
    import pipefill as pf
    import pipefill.torch as pft
    from gpu_stage import sleep_cycles_per_us
    cycles = sleep_cycles_per_us()
    rt = pf.Runtime(backend="cuda", stage_id=0, stage_count=1, min_samples=2)
    main = torch.cuda.Stream(priority=-1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 512)).cuda().eval()
    inputs = torch.randn(64 * 16, 512, device="cuda")
    torch.cuda.synchronize()

    def queue(n: int, iteration_us: float = 1000.0):
        events = []
        with torch.cuda.stream(main):
            for _ in range(n):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(main)
                torch.cuda._sleep(int(iteration_us * cycles))
                end.record(main)
                events.append((start, end))
        return events

    def one(drain: bool):
        before = queue(100)
        t0 = time.perf_counter()
        if drain:  # what torch.cuda.graph(...).__enter__ does
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        job = pft.module_inference_job(rt, model, inputs, batch=16)
        host_ms = (time.perf_counter() - t0) * 1e3
        after = queue(20)
        main.synchronize()
        gap_us = before[-1][1].elapsed_time(after[0][0]) * 1e3
        job.close()
        return gap_us, host_ms

    one(False)  # warm-up: torch's and cuBLAS's first-use costs out of the measurement
    drained_gap, drained_ms = one(True)
    gap, host_ms = one(False)
    print(f"cuda-streaming: creation gap in the trainer's stream {gap:.0f} us without a device "
          f"drain vs {drained_gap:.0f} us after synchronize + empty_cache (the old path), ratio "
          f"{gap / max(drained_gap, 1e-9):.3f}; creation took {host_ms:.1f} ms host time "
          f"({drained_ms:.1f} ms with the drain) with 100 ms of work queued")
    rt.close()
    return gap < 0.5 * drained_gap or gap < 200.0


def part_green_context(args):
    """A torch GreenContext current across Runtime creation, bubbles and close (issue 24 item 3)."""
    import torch
    import pipefill as pf
    try:
        from torch.cuda import green_contexts as gcs
        drv = getattr(gcs, "_drv", None)
        if drv is None:
            import cuda.bindings.driver as drv  # type: ignore[no-redef]
        green = gcs.GreenContext.create(
            num_sms=max(8, torch.cuda.get_device_properties(0).multi_processor_count // 2),
            device_id=torch.cuda.current_device())
    except Exception as error:
        print(f"cuda-streaming: green-context skipped: no torch green context here "
              f"({type(error).__name__}: {error})")
        return "skipped"

    def current() -> int:
        result = drv.cuCtxGetCurrent()
        return int(result[1] if isinstance(result, tuple) else result)

    from gpu_stage import sleep_cycles_per_us
    cycles = sleep_cycles_per_us()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # set_context is deprecated in torch 2.15
        green.set_context()
    ok = True
    try:
        mine = current()
        rt = pf.Runtime(backend="cuda", stage_id=0, stage_count=1, min_samples=2)
        checks = [("after Runtime()", current())]
        stream = torch.cuda.current_stream()
        admitted, refusal = 0, ""
        for _ in range(5):
            try:
                with rt.bubble(stream, expected_us=200.0):
                    checks.append(("after bubble_begin", current()))
                    torch.cuda._sleep(int(200 * cycles))
                admitted += 1
            except pf.PipeFillError as error:
                refusal = error.message
            checks.append(("after bubble_end", current()))
            rt.iteration_end()
        stream.synchronize()
        rt.close()
        checks.append(("after close", current()))
        changed = [where for where, ctx in checks if ctx != mine]
        ok = not changed
        print(f"cuda-streaming: green-context {mine:#x} current across Runtime(), "
              f"{len(checks) - 2} bubble calls and close: {'unchanged' if ok else 'CHANGED ' + ', '.join(changed)}; "
              f"bubbles on its stream: {admitted}/5 admitted"
              + (f", refused: {refusal}" if refusal else ""))
        if refusal and "belongs to context" not in refusal:
            print("cuda-streaming: green-context: the refusal does not name the stream's context")
            ok = False
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            green.pop_context()
    return ok


if __name__ == "__main__":
    sys.exit(main())
