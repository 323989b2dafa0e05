"""GPU check of the CUDA path of the streaming fill jobs (scripts/gpu-check.sh, step
cuda_streaming; issue 18): pipefill.torch.inference_job and training_job on the CUDA backend,
inside the bubbles of a synthetic main stream on one GPU.

Prints, one fact per line (prefix "cuda-streaming:"):
  - inference over a dataset 64x the slot ring: every output equals the module run eagerly
    (max abs difference; allclose rtol=atol=1e-4 in float32 with TF32 off: the replayed kernels
    are those of the capture, but cuBLAS may choose another GEMM algorithm for a captured call),
    in item order, exactly once;
  - training (Adam, capturable=True) with checkpoints: the final parameters equal the same steps
    run eagerly with the same optimizer (allclose rtol=1e-4, atol=1e-5: float32, a GEMM algorithm
    may differ under capture and the difference compounds over the steps), the losses likewise,
    every checkpoint copied while no bubble was open, the checkpoint file at the last step.
Exits 0 with "SKIPPED: no CUDA device" only when torch sees no GPU (or does not import); 1 when
a check fails or when torch sees a GPU but the pipefill CUDA runtime does not start.
"""
from __future__ import annotations

import argparse
import sys
import tempfile


def main() -> int:
    parser = argparse.ArgumentParser()
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
    import pipefill.torch as pft
    from gpu_stage import stage_iteration
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        rt = pf.Runtime(backend="cuda", stage_id=0, stage_count=1, min_samples=2)
    except pf.PipeFillError as error:
        print(f"FAILED: torch sees {torch.cuda.device_count()} GPU(s) but the pipefill CUDA "
              f"runtime does not start: {error.message}")
        return 1

    main_stream = torch.cuda.Stream(priority=-1)
    a = torch.randn(2048, 2048, device="cuda")
    stage = stage_iteration(rt, main_stream, a, args.bubble_us)

    def iteration() -> None:
        stage()
        main_stream.synchronize()

    def run(done) -> int:
        n = 0
        while not done() and n < args.max_iterations:
            iteration()
            n += 1
        return n

    ok = True
    # ---- inference: 64x the ring, the last batch partial ----
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
    ok = ok and equal
    job.close()

    # ---- training: a captured step per item, checkpoints at iteration_end ----
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
    with tempfile.TemporaryDirectory() as folder:
        ckpt = f"{folder}/train.pt"
        train = pft.training_job(rt, module, opt, torch.nn.functional.mse_loss, data,
                                 steps=steps, checkpoint=ckpt, every=every, name="stream-train")
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
    print(f"cuda-streaming: training {train.progress().items_done}/{steps} steps, {iterations} "
          f"iterations; params equal eager: {params_equal} (max abs diff {pdiff:.3g}); losses "
          f"equal: {losses_equal}")
    print(f"cuda-streaming: checkpoints at steps {[s.step for s in train.snapshots]} taken at "
          f"{sorted({s.taken_at for s in train.snapshots})}, none in a bubble: {outside}; file "
          f"at step {saved.get('step')}")
    ok = ok and params_equal and losses_equal and outside and saved.get("step") == steps
    train.close()
    rt.close()
    print(f"cuda-streaming: {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
