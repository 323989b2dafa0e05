"""One rank of the Megatron-Core adapter tests (test_megatron_adapter.py starts 2 over gloo).

Megatron-Core's own pipeline schedules (2 pipeline stages, 4 micro-batches; interleaved: 2
model chunks per rank) train a small MLP on CPU. Two CPU shims belong to this harness only
(Megatron-Core allocates its receive buffers with ``device=torch.cuda.current_device()``): a
TorchFunctionMode that turns ``device="cuda"`` / a CUDA device index into cpu, and
``torch.cuda.current_device`` returning "cpu". ``batch_p2p_sync`` is off (it calls
``torch.cuda.synchronize``).

Scenarios (--scenario):
  equivalence  for each --schedules entry (1f1b-batched, 1f1b, interleaved,
               interleaved-batched, interleaved-overlap): STEPS forward-backward calls + SGD
               without PipeFill, then the same from the same seed with
               pipefill.megatron.instrument() and a fill job on this rank's runtime (each of
               --backends sim,host); reports losses and gradients, bubbles per call, the receive waits
               counted by wrapping torch.distributed's receive calls (independent of the
               adapter), where the fill work ran, and whether remove() restored Megatron-Core.
  raise        1F1B with the adapter; rank FAIL_RANK's forward raises at call 1: every process
               must end (bounded by the process-group timeout), with no bubble left open.
Writes <out>/rank<r>.json and leaves with os._exit.
"""
from __future__ import annotations

import argparse
import os
import traceback

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

import adapter_checks as checks
import pipefill as pf

STEPS = 5
MICRO_BATCHES = 4
SEQ, MICRO_BATCH, HIDDEN = 3, 2, 8
FAIL_RANK = 0  # the first stage: the last one is then waiting for its activation, in a bubble
SCHEDULES = {  # name: (batch_p2p_comm, virtual stages per rank, overlap_p2p_comm)
    "1f1b-batched": (True, None, False),
    "1f1b": (False, None, False),
    "interleaved": (False, 2, False),
    "interleaved-batched": (True, 2, False),
    "interleaved-overlap": (False, 2, True),
}


class CpuDevices(TorchFunctionMode):
    """Test harness only: tensors Megatron-Core asks on "cuda" are made on the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and (device == "cpu" or isinstance(device, int)
                                   or "cuda" in str(device)):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


class Chunk(torch.nn.Module):
    """One model chunk (a pipeline stage): input tensor from the previous stage or the data."""

    fail = False

    def __init__(self, config, first: bool, last: bool) -> None:
        super().__init__()
        from megatron.core.enums import ModelType
        self.config = config
        self.model_type = ModelType.encoder_or_decoder
        self.first, self.last = first, last
        self.layer = torch.nn.Linear(HIDDEN, HIDDEN)
        self.input_tensor = None

    def set_input_tensor(self, tensor) -> None:
        self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

    def forward(self, x):
        if Chunk.fail:
            raise RuntimeError("injected failure in the forward pass")
        return torch.tanh(self.layer(x if self.first else self.input_tensor))


def setup(name: str, rank: int, world: int):
    from megatron.core import parallel_state
    from megatron.core.transformer import TransformerConfig
    batched, virtual, overlap = SCHEDULES[name]
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=world,
                                             virtual_pipeline_model_parallel_size=virtual)
    config = TransformerConfig(num_layers=world * (virtual or 1), hidden_size=HIDDEN,
                               num_attention_heads=1, pipeline_dtype=torch.float32,
                               pipeline_model_parallel_size=world,
                               virtual_pipeline_model_parallel_size=virtual,
                               batch_p2p_comm=batched, batch_p2p_sync=False,
                               overlap_p2p_comm=overlap)
    chunks = virtual or 1
    torch.manual_seed(0)
    stages = world * chunks
    models = []
    for chunk in range(chunks):
        stage = chunk * world + rank
        models.append(Chunk(config, first=(stage == 0), last=(stage == stages - 1)))
    return config, models


def train(name: str, rank: int, world: int, steps: int, on_step=None):
    """`steps` forward-backward calls + SGD; returns (losses, gradients) of this rank."""
    from megatron.core.pipeline_parallel import get_forward_backward_func
    config, models = setup(name, rank, world)
    optimizer = torch.optim.SGD([p for m in models for p in m.parameters()], lr=0.05)
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(SEQ, MICRO_BATCH, HIDDEN, generator=generator),
             torch.randn(SEQ, MICRO_BATCH, HIDDEN, generator=generator))
            for _ in range(steps * MICRO_BATCHES)]
    iterators = [iter(data) for _ in models]  # each chunk reads micro-batch k's (x, target)

    def forward_step(data_iterator, model):
        x, target = next(data_iterator)
        output = model(x)

        def loss_func(output_tensor):
            loss = torch.nn.functional.mse_loss(output_tensor, target)
            return loss, {"loss": loss.detach()}
        return output, loss_func

    losses, grads = [], []
    for step in range(steps):
        if on_step:
            on_step(step)
        forward_backward = get_forward_backward_func()
        results = forward_backward(forward_step_func=forward_step,
                                   data_iterator=iterators if len(models) > 1 else iterators[0],
                                   model=models if len(models) > 1 else models[0],
                                   num_microbatches=MICRO_BATCHES, seq_length=SEQ,
                                   micro_batch_size=MICRO_BATCH, decoder_seq_length=SEQ)
        losses.append([r["loss"].clone() for r in results])
        grads.append([p.grad.detach().clone() for m in models for p in m.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return losses, grads


class ReceiveWaits:
    """Counts the waits on receive requests that torch.distributed hands Megatron-Core, by
    wrapping torch.distributed.batch_isend_irecv (batched p2p: the requests of a batch that
    carries a receive are one wait, Megatron-Core waits on them back to back) or
    torch.distributed.irecv (unbatched): independent of the adapter. (Only one of the two:
    P2POp accepts nothing but the original irecv.)"""

    def __init__(self, batched: bool) -> None:
        self.count = 0
        self.originals = (dist.irecv, dist.batch_isend_irecv)
        counter = self

        class Counted:
            def __init__(self, request, group):
                self.request, self.group = request, group

            def wait(self, *args, **kwargs):
                if not self.group["waited"]:
                    self.group["waited"] = True
                    counter.count += 1
                return self.request.wait(*args, **kwargs)

            def __getattr__(self, name):
                return getattr(self.request, name)

        def irecv(*args, **kwargs):
            return Counted(counter.originals[0](*args, **kwargs), {"waited": False})

        def batch_isend_irecv(ops):
            requests = counter.originals[1](ops)
            if not any(op.op is counter.originals[0] for op in ops):
                return requests
            group = {"waited": False}
            return [Counted(r, group) for r in requests]
        if batched:
            dist.batch_isend_irecv = batch_isend_irecv
        else:
            dist.irecv = irecv

    def close(self) -> None:
        dist.irecv, dist.batch_isend_irecv = self.originals


def megatron_globals():
    from megatron.core.pipeline_parallel import p2p_communication, schedules
    return {(m.__name__, n): getattr(m, n) for m in (p2p_communication, schedules)
            for n in dir(m) if not n.startswith("__")}


def equivalence(rank: int, world: int, backend: str, names: list, out: dict) -> None:
    import pipefill.megatron as pfm
    for name in names:
        result: dict = {}
        try:
            base = train(name, rank, world, STEPS)
            dist.barrier()
            before = megatron_globals()
            with pf.Runtime(backend=backend, stage_id=rank, stage_count=world, min_samples=1,
                            reserved_sms=0) as runtime:
                job = checks.fill_job(runtime, backend)
                kinds: list = []
                checks.recording_kinds(runtime, kinds)
                waits = ReceiveWaits(batched=SCHEDULES[name][0])
                per_step = []
                try:
                    with pfm.instrument(runtime, strict=True) as bubbles:
                        filled = train(name, rank, world, STEPS,
                                       on_step=lambda step: per_step.append(waits.count))
                finally:
                    waits.close()
                per_step.append(waits.count)
                trace = os.path.join(os.environ["PIPEFILL_TEST_OUT"],
                                     f"mcore-{name}-{backend}-rank{rank}.json")
                result.update(checks.fill_report(runtime, job, backend, trace))
                result.update(
                    identical_losses=checks.identical(base[0], filled[0]),
                    identical_grads=checks.identical(base[1], filled[1]),
                    losses=[[float(l) for l in step] for step in filled[0]],
                    grads_seen=sum(len(g) for g in base[1]),
                    receive_waits=[b - a for a, b in zip(per_step, per_step[1:])],
                    call_bubbles=bubbles.call_bubbles, outside=bubbles.outside_receives,
                    kinds=kinds,
                    restored=megatron_globals() == before,
                    errors=[str(e) for e in bubbles.errors],
                    bubble_failures=runtime.bubble_failures)
                job.close()
            dist.barrier()
        except Exception as error:  # noqa: BLE001 - reported, the other schedules still run
            result["exception"] = "".join(traceback.format_exception(error))
        out[name] = result


def failure(rank: int, world: int, out: dict) -> None:
    import pipefill.megatron as pfm
    runtime = pf.Runtime(backend="sim", stage_id=rank, stage_count=world, min_samples=1)
    runtime.create_job(pf.SimTicketJob(items=10**7, item_cost_us=20.0))
    bubbles = pfm.instrument(runtime, strict=True)

    def on_step(step: int) -> None:
        if step == 1 and rank == FAIL_RANK:
            Chunk.fail = True
    try:
        train("1f1b", rank, world, STEPS, on_step=on_step)
        out["error"] = None
    except Exception as error:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(error).__name__}: {error}"
    checks.failure_report(runtime, bubbles, out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--backends", default="sim", help="sim and/or host, comma-separated")
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    out: dict = {"rank": rank}
    try:
        checks.join_gloo(rank, world, args.timeout)
        torch.cuda.current_device = lambda: "cpu"  # CPU shim (harness only)
        with CpuDevices():
            if args.scenario == "equivalence":
                for backend in args.backends.split(","):  # one process start for all runs
                    out[backend] = {}
                    equivalence(rank, world, backend, args.schedules.split(","), out[backend])
            else:
                failure(rank, world, out)
    except Exception as error:  # noqa: BLE001
        out["fatal"] = "".join(traceback.format_exception(error))
    checks.finish(out)


if __name__ == "__main__":
    main()
