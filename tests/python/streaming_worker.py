"""One process of the streaming fill-job tests (test_streaming_jobs.py).

Scenarios:
  pipeline  rank of a 2-stage torch.distributed.pipelining 1F1B pipeline over gloo on the host
            backend, whose bubbles run an inference job over a dataset 20x the slot ring and a
            training job; writes <out>/rank<r>.json: outputs vs eager, losses/parameters vs
            eager, the pipeline's own losses vs a run without filling.
  resume    a single trainer process (bubbles on the host backend) running an inference job
            (folder sink, progress file) and a training job (checkpoint); with --kill-after N it
            SIGKILLs itself once N inference items reached the sink (kill -9 mid-run); rerun
            without it, it resumes and finishes. Writes <out>/resume-done.json when finished.
Leaves with os._exit, so no teardown can hang a test.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining as pp

import eager_reference
import pipefill as pf
import pipefill.torch as pft

DIM, OUT, BATCH, SLOTS = 8, 4, 4, 4
STAGE_DIM, MICROBATCHES = 16, 4
TRAIN_STEPS = 20


def fill_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Linear(16, OUT))


class Samples:
    """Sample i is a fixed function of i, generated on demand."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        return (torch.randn(DIM, generator=torch.Generator().manual_seed(i))
                for i in range(self.count))

    def __len__(self) -> int:
        return self.count


def eager_outputs(module: nn.Module, data: Samples):
    return eager_reference.eager_outputs(module, data, BATCH)


def training_data():
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, OUT, generator=g))
            for _ in range(7)]


def eager_training(steps: int):
    module = fill_model(3)
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    return eager_reference.eager_steps(module, opt, training_data(), steps)


class Stage(nn.Module):
    """A pipeline stage whose forward also waits 2 ms (GIL released), so that the other stage's
    receive waits - the bubbles - last long enough for fill items."""

    def __init__(self, index: int) -> None:
        super().__init__()
        torch.manual_seed(100 + index)
        self.linear = nn.Linear(STAGE_DIM, STAGE_DIM)

    def forward(self, x):
        time.sleep(0.002)
        return torch.tanh(self.linear(x))


def pipeline(rank: int, world: int, out: dict) -> None:
    def build():
        module = Stage(rank)
        stage = pp.PipelineStage(module, rank, world, torch.device("cpu"),
                                 input_args=(torch.zeros(BATCH * 2 // MICROBATCHES, STAGE_DIM),))
        return module, pp.Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=nn.MSELoss())

    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH * 2, STAGE_DIM, generator=g)
    target = torch.randn(BATCH * 2, STAGE_DIM, generator=g)

    def step(schedule, losses):
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=target, losses=losses)

    # The pipeline without filling, as the reference for its own losses.
    module, schedule = build()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    base_losses = []
    for _ in range(6):
        losses: list = []
        step(schedule, losses)
        opt.step()
        opt.zero_grad()
        base_losses.append([float(l) for l in losses])
    dist.barrier()

    module, schedule = build()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    data = Samples(20 * SLOTS * BATCH)  # 80 items through a ring of 4 slots
    infer_model = fill_model(rank).eval()
    got = []
    with pf.Runtime(backend="host", stage_id=rank, stage_count=world, reserved_sms=0,
                    min_samples=1) as runtime:
        infer = pft.inference_job(runtime, infer_model, data, batch_size=BATCH, slots=SLOTS,
                                  sink=lambda i, y: got.append((i, y.clone())), name="infer")
        train_model = fill_model(3)
        train_opt = torch.optim.SGD(train_model.parameters(), lr=0.05, momentum=0.9)
        train = pft.training_job(runtime, train_model, train_opt, nn.functional.mse_loss,
                                 training_data(), steps=TRAIN_STEPS, name="train",
                                 item_cost_us=200.0)
        bubbles = pft.instrument(schedule, runtime, strict=True)
        filled_losses = []
        steps = 0
        while steps < 600:
            losses = []
            step(schedule, losses)
            opt.step()
            opt.zero_grad()
            if steps < 6:
                filled_losses.append([float(l) for l in losses])
            steps += 1
            if pft.all_finished([infer, train]) and steps >= 6:  # every rank at the same step
                break
        bubbles.remove()
        errors = [infer.error, train.error]
        infer.wait(timeout=30)
        train.wait(timeout=30)
        stats = runtime.stats()
        infer.close()
        train.close()
    expected = eager_outputs(infer_model, data)
    eager_losses, eager_state = eager_training(TRAIN_STEPS)
    state = train_model.state_dict()
    out.update(
        steps=steps, bubbles=stats.bubbles, errors=errors,
        indices_in_order=[i for i, _ in got] == list(range(len(expected))),
        items=len(got), expected_items=len(expected),
        outputs_equal=len(got) == len(expected) and all(
            torch.equal(y, e) for (_, y), e in zip(got, expected)),
        train_losses_equal=train.losses == eager_losses,
        train_params_equal=all(torch.equal(state[k], eager_state[k]) for k in eager_state),
        pipeline_losses_equal=filled_losses == base_losses[:len(filled_losses)])


def transformer_fill(rank: int, world: int, out: dict) -> None:
    """Issue 32: a small transformer as the fill model of a 2-rank 1F1B pipeline, its item cost
    given (item_cost_us=1600, below the bubbles): the planner keeps it, whatever the items
    measure inside bubbles, so the job is not starved (it was: 15-17 of 256 items)."""
    def build():
        module = Stage(rank)
        stage = pp.PipelineStage(module, rank, world, torch.device("cpu"),
                                 input_args=(torch.zeros(BATCH * 2 // MICROBATCHES, STAGE_DIM),))
        return module, pp.Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=nn.MSELoss())

    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH * 2, STAGE_DIM, generator=g)
    target = torch.randn(BATCH * 2, STAGE_DIM, generator=g)
    module, schedule = build()
    torch.manual_seed(rank)
    fill = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                      batch_first=True).eval()
    items = 48
    seqs = [torch.randn(2, 16, 32, generator=g) for _ in range(items)]
    got = []
    with pf.Runtime(backend="host", stage_id=rank, stage_count=world, reserved_sms=0,
                    min_samples=1) as runtime:
        job = pft.inference_job(runtime, fill, seqs, batch_size=None, slots=8,
                                sink=lambda i, y: got.append(i), name="transformer",
                                item_cost_us=1600.0)
        bubbles = pft.instrument(schedule, runtime, strict=True)
        steps = 0
        while steps < 400:
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=target, losses=[])
            steps += 1
            if pft.all_finished([job]):
                break
        bubbles.remove()
        cost = job.job.cost_info()
        error = job.error
        job.close()
    out.update(steps=steps, items=len(got), expected_items=items, error=error,
               learned_cost_us=cost.learned_cost_us, samples=cost.samples, probes=cost.probes)


def stop(rank: int, world: int, out: dict) -> None:
    """The documented loop, ``while not pft.all_finished(jobs): schedule.step()``, with jobs of
    very different lengths per rank (4 items on rank 0, 40 on rank 1): a per-rank
    ``while not job.progress().finished`` would end rank 0's loop first and leave rank 1 waiting
    in its schedule for rank 0's sends forever."""
    module = Stage(rank)
    stage = pp.PipelineStage(module, rank, world, torch.device("cpu"),
                             input_args=(torch.zeros(BATCH * 2 // MICROBATCHES, STAGE_DIM),))
    schedule = pp.Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=nn.MSELoss())
    x = torch.randn(BATCH * 2, STAGE_DIM, generator=torch.Generator().manual_seed(7))
    items = 4 if rank == 0 else 40
    got = []
    with pf.Runtime(backend="host", stage_id=rank, stage_count=world, reserved_sms=0,
                    min_samples=1) as runtime:
        job = pft.inference_job(runtime, fill_model(rank).eval(), Samples(items * BATCH),
                                batch_size=BATCH, slots=SLOTS, sink=lambda i, y: got.append(i),
                                name="infer")
        bubbles = pft.instrument(schedule, runtime, strict=True)
        steps, finished_alone_at = 0, None
        while not pft.all_finished([job]):
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=x)
            steps += 1
            if finished_alone_at is None and job.progress().finished:
                finished_alone_at = steps
        bubbles.remove()
        job.wait(timeout=30)
        job.close()
    out.update(steps=steps, items=len(got), expected_items=items,
               finished_alone_at=finished_alone_at)


def resume(out_dir: str, kill_after: int) -> None:
    data = Samples(60 * BATCH)
    folder = os.path.join(out_dir, "outputs")
    with pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                    safety_margin_fraction=0.0, min_samples=1000000) as runtime:
        # Items of fixed real-time costs (the host device sleeps out the rest of an item), so
        # that both jobs are mid-run when the kill comes, whatever this machine's speed.
        infer = pft.inference_job(runtime, fill_model(0).eval(), data, batch_size=BATCH,
                                  slots=SLOTS, sink=folder, name="infer", item_cost_us=600.0,
                                  resume=os.path.join(out_dir, "infer-progress.json"))
        model = fill_model(3)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        ckpt = os.path.join(out_dir, "train.pt")
        train = pft.training_job(runtime, model, opt, nn.functional.mse_loss, training_data(),
                                 steps=TRAIN_STEPS, checkpoint=ckpt, every=3, resume=ckpt,
                                 name="train", item_cost_us=1200.0)
        print(f"resumed: inference at {infer.resumed_from}, training at {train.resumed_from}",
              flush=True)
        stream = runtime.high_priority_stream()
        for _ in range(5000):
            if infer.progress().finished and train.progress().finished:
                break
            if infer.error or train.error:
                break
            # Both jobs mid-run, the training job past a durable checkpoint (written by its
            # background thread after the copy at iteration_end). The jobs' relative speeds
            # depend on the machine's load (the inference drainer fsyncs each item), so the kill
            # comes at kill_after inference items or, when training runs ahead, before its last
            # two steps (it takes at most 2 per 3000 us bubble of 1200 us items), whichever is
            # first: a condition, never a timing.
            done, steps = infer.progress().items_done, train.progress().items_done
            if (kill_after and done >= 1 and not infer.progress().finished
                    and 4 <= steps < TRAIN_STEPS and os.path.exists(ckpt)
                    and (done >= kill_after or steps >= TRAIN_STEPS - 2)):
                os.kill(os.getpid(), signal.SIGKILL)  # kill -9, mid-run
            with runtime.bubble(stream, expected_us=3000.0):
                pf.host_stream_delay(stream, 3000.0)
            pf.host_stream_delay(stream, 200.0)
            runtime.iteration_end()
            pf.host_stream_synchronize(stream)
        infer.wait(timeout=30)
        train.wait(timeout=30)
        result = dict(inference_resumed_from=infer.resumed_from,
                      training_resumed_from=train.resumed_from,
                      params={k: v.tolist() for k, v in model.state_dict().items()},
                      losses=train.losses)
        infer.close()
        train.close()
    with open(os.path.join(out_dir, "resume-done.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--kill-after", type=int, default=0)
    args = parser.parse_args()
    out_dir = os.environ["PIPEFILL_TEST_OUT"]
    torch.set_num_threads(1)
    code = 0
    if args.scenario == "resume":
        try:
            resume(out_dir, args.kill_after)
        except Exception:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        os._exit(code)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out: dict = {"rank": rank}
    try:
        dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        if args.scenario == "stop":
            stop(rank, world, out)
        elif args.scenario == "transformer":
            transformer_fill(rank, world, out)
        else:
            pipeline(rank, world, out)
    except Exception as error:
        out["fatal"] = "".join(traceback.format_exception(error))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f, indent=1)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
