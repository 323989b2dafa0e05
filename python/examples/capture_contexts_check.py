"""GPU check of which CUDA context each kernel of a captured fill item lands in (issue 33 item 2;
scripts/gpu-check.sh, step capture_contexts).

In green-context mode every kernel of a graph fill job must belong to the fill partition's green
context. Autograd runs a backward on its own per-device worker thread, where the fill context
pushed on the capturing thread is not current; pipefill.torch therefore captures with autograd's
multithreading off (the backward on the capturing thread). This prints, for three captures made
the way pipefill.torch makes them, every kernel node with its kernel's name and its context (the
fill partition's green context, the device's primary context, or another), one line each
(prefix "capture-contexts:"), then one verdict line per capture:

  - inference: a module's forward (pipefill.torch.module_inference_job's step);
  - training: forward, loss, backward and optimizer step with the backward on the capturing
    thread (what pipefill.torch.training_job does now);
  - training-autograd-thread: the same step with autograd's worker thread (torch's default), to
    answer whether the fix was needed: its backward kernels land in the primary context (then the
    runtime would refuse the job) or in the fill context anyway (then the push alone suffices).

The first two are registered as graph jobs (pipefill.torch.graph_fill_job, which also refuses a
kernel outside the fill context before registering, naming it); the third is only captured and
read. Exits 0 with "SKIPPED: no CUDA device" only when torch sees no GPU; 1 when a check fails
(a registered capture with a kernel outside the fill context, a refusal, an exception).
"""
from __future__ import annotations

import sys
import traceback


def report(tag, graph_handle, fill, primary, gc):
    reader = gc.DriverGraphReader.open()
    if reader is None:
        print(f"capture-contexts: {tag}: the driver cannot be read (libcuda not loaded)")
        return None
    nodes = gc.walk_kernel_nodes(reader, graph_handle)
    for line in gc.context_report(nodes, fill, primary):
        print(f"capture-contexts: {tag}: {line}")
    foreign = gc.foreign_kernels(nodes, fill)
    mode = "grid-cap (the fill context is the primary one)" if fill == primary else "green-context"
    print(f"capture-contexts: {tag}: {len(nodes)} kernel nodes, {len(foreign)} outside the fill "
          f"context ({mode} mode)")
    return foreign


def main() -> int:
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
    from pipefill.torch import _fill_capture as fc
    from pipefill.torch import _graph_contexts as gc
    from pipefill.torch import _graph_jobs as gj
    try:
        rt = pf.Runtime(backend="cuda", stage_id=0, stage_count=1, min_samples=2)
    except pf.PipeFillError as error:
        print(f"FAILED: torch sees a GPU but the pipefill CUDA runtime does not start: {error.message}")
        return 1
    ok = True
    device = torch.cuda.current_device()
    reader = gc.DriverGraphReader.open()
    fill = reader.stream_context(rt.fill_stream_handles()[0]) if reader else None
    primary = reader.primary_context(device) if reader else None
    device_sms = fc.device_sm_count(device)
    fill_sms = fc.fill_sm_count(rt, rt.fill_stream_handles()[0], device_sms)
    print(f"capture-contexts: fill context {fill and hex(fill)}, primary context "
          f"{primary and hex(primary)}; matmuls of fill captures target {fill_sms} of "
          f"{device_sms} SMs (carve-out {fc.carveout_for(fill_sms, device_sms, None)})")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 256)).cuda()
    inputs = torch.randn(64, 256, device="cuda")

    # -- inference, registered --
    try:
        job = pft.module_inference_job(rt, model.eval(), inputs, batch=16, item_cost_us=50.0)
        foreign = report("inference", job.graph.raw_cuda_graph(), fill, primary, gc)
        ok &= not foreign
        job.close()
    except Exception:
        print("capture-contexts: inference FAILED with an exception:")
        traceback.print_exc(file=sys.stdout)
        ok = False

    # -- training, registered (backward on the capturing thread) --
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    target = torch.randn(16, 256, device="cuda")

    def train_step(index):
        optimizer.zero_grad(set_to_none=True)
        x = inputs.index_select(0, (index * 16 + torch.arange(16, device="cuda")) % 64)
        torch.nn.functional.mse_loss(model(x), target).backward()
        optimizer.step()

    try:
        job = pft.graph_fill_job(rt, train_step, 4, item_cost_us=200.0, name="training")
        foreign = report("training", job.graph.raw_cuda_graph(), fill, primary, gc)
        ok &= not foreign
        job.close()
    except pf.PipeFillError as error:
        print(f"capture-contexts: training REFUSED: {error.message}")
        ok = False
    except Exception:
        print("capture-contexts: training FAILED with an exception:")
        traceback.print_exc(file=sys.stdout)
        ok = False

    # -- training with autograd's worker thread: captured and read, never registered --
    capture = rt.capture_stream()
    try:
        stream = torch.cuda.ExternalStream(capture.handle, device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        index = torch.zeros((), dtype=torch.int64, device="cuda")
        with rt.capture_context(capture), torch.cuda.stream(stream), \
                torch.autograd.set_multithreading_enabled(True):
            train_step(index)  # warm-up
            gj._capture(graph, train_step, index)
            stream.synchronize()
        foreign = report("training-autograd-thread", graph.raw_cuda_graph(), fill, primary, gc)
        if foreign is not None:
            verdict = ("its backward kernels land outside the fill context: capturing the backward "
                       "on the capturing thread is needed" if foreign else
                       "every kernel is in the fill context anyway: the push alone suffices")
            print(f"capture-contexts: training-autograd-thread: {verdict}")
    except Exception:
        print("capture-contexts: training-autograd-thread: the capture failed (informative only):")
        traceback.print_exc(file=sys.stdout)
    finally:
        capture.close()
    rt.close()
    print(f"capture-contexts: {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
