"""One rank of the DeepSpeed adapter tests (test_deepspeed_adapter.py starts 2 over gloo).

A 2-stage ``PipelineModule`` (4 linear layers) trained by ``PipelineEngine.train_batch`` with
4 micro-batches per batch, on CPU.

Scenarios (--scenario):
  equivalence  STEPS batches without PipeFill, then the same from the same seed with
               pipefill.deepspeed.instrument() and a fill job on this rank's runtime, for each
               --runs entry backend:pipe (sim | host, train | dualpipev); reports losses and gradients of both runs, bubbles per batch, the
               receives counted by wrapping DeepSpeed's p2p.recv (independent of the adapter),
               the bubble kinds, where the fill work ran, and whether remove() restored the
               engine.
  raise        with the adapter, rank FAIL_RANK's forward raises at batch 1: every process must
               end (bounded by the process-group timeout), with no bubble left open.
Writes <out>/rank<r>.json and leaves with os._exit.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import traceback

import torch
import torch.distributed as dist

import adapter_checks as checks
import pipefill as pf

STEPS = 5
MICRO_BATCHES = 4
MICRO_BATCH = 2
DIM = 8
FAIL_RANK = 1


class Layer(torch.nn.Linear):
    """A linear layer that can be told to raise (failure scenario)."""

    fail = False

    def forward(self, x):
        if Layer.fail:
            raise RuntimeError("injected failure in the forward pass")
        return torch.tanh(super().forward(x))


def build(pipe: str = "train"):
    """A 2-stage engine: PipelineEngine (TrainSchedule), or with pipe="dualpipev" a
    DualPipeVEngine (4 stages, 2 per rank, one layer each)."""
    import deepspeed
    from deepspeed.pipe import DualPipeVModule, PipelineModule
    torch.manual_seed(0)
    layers = [Layer(DIM, DIM) for _ in range(4)]
    module = DualPipeVModule if pipe == "dualpipev" else PipelineModule
    model = module(layers=layers, num_stages=2, partition_method="uniform",
                   loss_fn=lambda out, y: torch.nn.functional.mse_loss(out, y))
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH,
              "gradient_accumulation_steps": MICRO_BATCHES,
              "train_batch_size": MICRO_BATCH * MICRO_BATCHES,
              "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
              "steps_per_print": 10**9, "wall_clock_breakdown": False}
    engine, _, _, _ = deepspeed.initialize(model=model, config=config,
                                           model_parameters=list(model.parameters()))
    return engine


class ReceiveCounter:
    """Counts the blocking receives DeepSpeed's engine makes, independently of the adapter:
    PipelineEngine: p2p.recv called from _exec_recv_activations / _exec_recv_grads (the
    one-time shape exchange is not counted), by wrapping deepspeed.runtime.pipe.p2p.recv;
    DualPipeVEngine: the receive requests of deepspeed.comm.batch_isend_irecv whose wait() the
    engine calls (each counted at its wait; when the backend returns fewer requests than ops,
    each request of a batch that carries a receive), by wrapping that function and the
    requests it returns."""

    def __init__(self, pipe: str) -> None:
        import deepspeed.comm
        from deepspeed.runtime.pipe import p2p
        self.count = 0
        self.commits = 0  # DualPipeVEngine: batches that carry a receive
        counter = self
        if pipe == "dualpipev":
            self.module, self.name = deepspeed.comm, "batch_isend_irecv"
        else:
            self.module, self.name = p2p, "recv"
        self.original = original = getattr(self.module, self.name)

        def recv(*args, **kwargs):
            if sys._getframe(1).f_code.co_name in ("_exec_recv_activations", "_exec_recv_grads"):
                counter.count += 1
            return original(*args, **kwargs)

        class CountedWait:
            def __init__(self, request):
                self.request = request

            def wait(self, *args, **kwargs):
                counter.count += 1
                return self.request.wait(*args, **kwargs)

            def __getattr__(self, name):
                return getattr(self.request, name)

        def batch_isend_irecv(ops, *args, **kwargs):
            requests = original(ops, *args, **kwargs)
            if any(op.op == "irecv" for op in ops):
                counter.commits += 1
            if len(requests) == len(ops):
                return [CountedWait(r) if op.op == "irecv" else r for op, r in zip(ops, requests)]
            if any(op.op == "irecv" for op in ops):
                return [CountedWait(r) for r in requests]
            return requests
        setattr(self.module, self.name, batch_isend_irecv if pipe == "dualpipev" else recv)

    def close(self) -> None:
        setattr(self.module, self.name, self.original)


def comm_restored() -> bool:
    """DualPipeV's module uses deepspeed.comm itself again (the adapter's proxy is gone)."""
    import deepspeed.comm
    from deepspeed.runtime.pipe import dualpipev
    return dualpipev.dist is deepspeed.comm


def train(engine, steps: int, counter=None):
    """`steps` train_batch calls on fixed data; returns (losses, gradients, receives per batch):
    every gradient accumulated into a parameter (post-accumulate hooks), per batch."""
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(MICRO_BATCH, DIM, generator=generator),
             torch.randn(MICRO_BATCH, DIM, generator=generator))
            for _ in range(steps * MICRO_BATCHES)]
    grads: list = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p: grads.append(p.grad.detach().clone()))
             for p in engine.module.parameters()]
    losses, grads_per_step, receives = [], [], []
    iterator = iter(data)
    try:
        for _ in range(steps):
            before = counter.count if counter else 0
            loss = engine.train_batch(iterator)
            losses.append([loss.detach().clone()])
            grads_per_step.append(list(grads))
            grads.clear()
            receives.append((counter.count - before) if counter else 0)
    finally:
        for h in hooks:
            h.remove()
    return losses, grads_per_step, receives


def expected_kinds(engine) -> list:
    """Kinds of the receive bubbles of one batch from DeepSpeed's own TrainSchedule: a
    RecvActivation before the batch's first BackwardPass is WARMUP, a RecvGrad after its last
    ForwardPass is COOLDOWN, the rest OTHER."""
    from deepspeed.runtime.pipe import schedule as ds
    kinds, forwards, backwards = [], 0, 0
    for cmds in engine._train_schedule():
        for cmd in cmds:
            if isinstance(cmd, ds.ForwardPass):
                forwards += 1
            elif isinstance(cmd, ds.BackwardPass):
                backwards += 1
            elif isinstance(cmd, ds.RecvActivation):
                kinds.append(int(pf.BubbleKind.WARMUP if backwards == 0 else pf.BubbleKind.OTHER))
            elif isinstance(cmd, ds.RecvGrad):
                kinds.append(int(pf.BubbleKind.COOLDOWN if forwards == engine.micro_batches
                                 else pf.BubbleKind.OTHER))
    return kinds


def equivalence(rank: int, world: int, backend: str, pipe: str, out: dict) -> None:
    import pipefill.deepspeed as pfds
    engine = build(pipe)
    base = train(engine, STEPS)
    base_vars = set(vars(engine))  # what training alone leaves on an engine
    dist.barrier()
    engine = build(pipe)
    engine_class = type(engine)
    instruction_map = dict(engine_class._INSTRUCTION_MAP)
    counter = ReceiveCounter(pipe)
    with pf.Runtime(backend=backend, stage_id=rank, stage_count=world, min_samples=1,
                    reserved_sms=0) as runtime:
        job = checks.fill_job(runtime, backend)
        kinds: list = []
        checks.recording_kinds(runtime, kinds)
        with pfds.instrument(engine, runtime, strict=True) as bubbles:
            filled = train(engine, STEPS, counter)
        counter.close()
        trace = os.path.join(os.environ["PIPEFILL_TEST_OUT"], f"ds-{backend}-rank{rank}.json")
        out.update(checks.fill_report(runtime, job, backend, trace))
        out.update(
            identical_losses=checks.identical(base[0], filled[0]),
            identical_grads=checks.identical(base[1], filled[1]),
            grads_seen=sum(len(g) for g in base[1]),
            losses=[float(l[0]) for l in filled[0]],
            receives_per_batch=filled[2], batch_bubbles=bubbles.batch_bubbles,
            commits_with_receives=counter.commits, comm_restored=comm_restored(),
            commit_receive_handles=bubbles.commit_receive_handles,
            engine=engine_class.__name__, kinds=kinds,
            expected_kinds=expected_kinds(engine) * STEPS if pipe == "train" else None,
            restored=(type(engine) is engine_class and set(vars(engine)) == base_vars
                      and engine_class._INSTRUCTION_MAP == instruction_map
                      and all(engine_class._INSTRUCTION_MAP[k] is v
                              for k, v in instruction_map.items())),
            errors=[str(e) for e in bubbles.errors], bubble_failures=runtime.bubble_failures)
        job.close()
    if pipe == "train":  # one more batch with the optimizer step marked as a bubble
        with pf.Runtime(backend=backend, stage_id=rank, stage_count=world) as runtime:
            kinds = []
            checks.recording_kinds(runtime, kinds)
            with pfds.instrument(engine, runtime, strict=True, optimizer_bubbles=True) as handle:
                train(engine, 1)
            out.update(optimizer_kinds=kinds, optimizer_bubbles=handle.optimizer_bubbles_begun,
                       optimizer_in_bubble_after=runtime.in_bubble)
    dist.barrier()


def failure(rank: int, world: int, out: dict) -> None:
    import pipefill.deepspeed as pfds
    engine = build()
    runtime = pf.Runtime(backend="sim", stage_id=rank, stage_count=world, min_samples=1)
    runtime.create_job(pf.SimTicketJob(items=10**7, item_cost_us=20.0))
    bubbles = pfds.instrument(engine, runtime, strict=True)
    generator = torch.Generator().manual_seed(1)
    data = iter([(torch.randn(MICRO_BATCH, DIM, generator=generator),
                  torch.randn(MICRO_BATCH, DIM, generator=generator)) for _ in range(64)])
    try:
        for step in range(STEPS):
            if step == 1 and rank == FAIL_RANK:
                Layer.fail = True
            engine.train_batch(data)
        out["error"] = None
    except Exception as error:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(error).__name__}: {error}"
    checks.failure_report(runtime, bubbles, out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--runs", default="sim:train",
                        help="equivalence runs, backend:pipe (pipe: train | dualpipev), comma-separated")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    out: dict = {"rank": rank}
    try:
        checks.join_gloo(rank, world, args.timeout)
        import deepspeed
        import deepspeed.ops
        # DeepSpeed would compile its CPU shared-memory op at the first start (~150 s).
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False,
                                   timeout=datetime.timedelta(seconds=args.timeout))
        out["deepspeed"] = deepspeed.__version__
        if args.scenario == "equivalence":
            for run in args.runs.split(","):  # one process start for all runs
                backend, pipe = run.split(":")
                result: dict = {}
                try:
                    equivalence(rank, world, backend, pipe, result)
                except Exception as error:  # noqa: BLE001 - reported, the next run still runs
                    result["exception"] = "".join(traceback.format_exception(error))
                out[run] = result
        else:
            failure(rank, world, out)
    except Exception as error:  # noqa: BLE001
        out["fatal"] = "".join(traceback.format_exception(error))
    checks.finish(out)


if __name__ == "__main__":
    main()
