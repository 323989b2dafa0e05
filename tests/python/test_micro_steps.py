"""training_job micro-steps (issue 32 item 6) and the item path's honoured costs (item 1).

- micro_batches=k: each step's batch split into k micro-batches with gradient accumulation; the
  job offers one configuration per divisor of k and the planner picks per bubble class. Tested
  bit-identical (losses and parameters) against the plain loop with the same accumulation, on
  bubbles too short for a whole step, and resumed mid-step from a checkpoint.
- an explicit item_cost_us is kept by the planner (not learned from slower in-bubble items).
- bad input names the value.
"""
from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import pipefill as pf
import pipefill.torch as pft
from test_torch_jobs import DIM, OUT, host_runtime, model, run_bubbles

ROWS = 8  # rows per step's batch: 4 micro-batches of 2


def data(steps: int):
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(ROWS, DIM, generator=g), torch.randn(ROWS, OUT, generator=g))
            for _ in range(steps)]


def plain_accumulation(steps: int, batches, k: int):
    """The plain loop with the same accumulation (pipefill/torch/_micro_steps.py)."""
    module = model(3).train()
    opt = torch.optim.Adam(module.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        inputs, target = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for x, y in zip(inputs.tensor_split(k), target.tensor_split(k)):
            loss = nn.functional.mse_loss(module(x), y) * (x.shape[0] / inputs.shape[0])
            loss.backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total)
    return losses, module.state_dict()


def new_job(rt, steps, batches, k, **kw):
    module = model(kw.pop("seed", 3)).train()
    opt = torch.optim.Adam(module.parameters(), lr=0.01)
    job = pft.training_job(rt, module, opt, nn.functional.mse_loss, batches, steps=steps,
                           micro_batches=k, **kw)
    return job, module


def test_micro_steps_equal_the_plain_accumulation_loop_bit_identically():
    steps, k, batches = 12, 4, data(5)
    want_losses, want_state = plain_accumulation(steps, batches, k)
    rt = host_runtime()
    # A whole step is given as 8000 us: 2000 us per micro-batch, 4 configurations (1, 2, 4 per
    # item). Bubbles of 3000 us fit one micro-batch per item, not a step: only micro-steps run.
    job, module = new_job(rt, steps, batches, k, item_cost_us=8000.0)
    assert [c[2] for c in job._micro.configs(2000.0, 0.0)] == [1.0, 2.0, 4.0]
    run_bubbles(rt, lambda: job.progress().finished or job.error is not None, max_bubbles=4000)
    progress = job.wait(timeout=30)
    assert job.error is None
    assert progress.items_done == steps
    assert job.losses == want_losses
    state = module.state_dict()
    assert all(torch.equal(state[name], want_state[name]) for name in want_state)
    assert job._micro.micro_batches_run == steps * k
    assert job.job.info().status == pf.JobStatus.COMPLETED  # ended at its completed claims
    job.close()
    rt.close()


def test_micro_steps_resume_mid_step_bit_identically(tmp_path):
    steps, k, batches = 10, 4, data(7)
    want_losses, want_state = plain_accumulation(steps, batches, k)
    ckpt = tmp_path / "micro.pt"
    rt = host_runtime()
    first, _ = new_job(rt, steps, batches, k, checkpoint=ckpt, every=2, item_cost_us=4000.0)
    # Stopped in the middle of a step (some micro-batches accumulated, no optimizer step yet).
    run_bubbles(rt, lambda: (first.step >= 5 and first._micro.in_step in (1, 2, 3))
                or first.error is not None, max_bubbles=4000)
    stopped_at = (first.step, first._micro.in_step)
    first.close()
    assert first.error is None
    assert stopped_at[0] >= 5 and stopped_at[1] > 0, stopped_at
    assert first.losses == want_losses[:len(first.losses)]

    second, module = new_job(rt, steps, batches, k, checkpoint=ckpt, every=2, resume=ckpt,
                             item_cost_us=4000.0, seed=42)
    assert second.resumed_from % 2 == 0 and 4 <= second.resumed_from <= stopped_at[0]
    run_bubbles(rt, lambda: second.progress().finished or second.error is not None,
                max_bubbles=4000)
    second.wait(timeout=30)
    assert second.error is None
    assert second.losses == want_losses
    state = module.state_dict()
    assert all(torch.equal(state[name], want_state[name]) for name in want_state)
    second.close()
    rt.close()


def test_micro_steps_refuse_bad_input_naming_the_value():
    rt = host_runtime()
    with pytest.raises(ValueError, match="micro_batches = 0"):
        new_job(rt, 4, data(2), 0)
    small = [(torch.randn(3, DIM), torch.randn(3, OUT))]
    with pytest.raises(ValueError, match="micro_batches = 4, but step 0's batch has inputs a "
                                         r"tensor of shape \(3, 8\)"):
        new_job(rt, 4, small, 4, item_cost_us=1000.0)
    assert rt.jobs() == []  # a refused job leaves nothing behind
    rt.close()


class SlowInBubbles(nn.Module):
    """An item that takes 2 ms inside bubbles (it sleeps there), nothing at creation."""

    def __init__(self) -> None:
        super().__init__()
        self.sleep_s = 0.0

    def forward(self, x):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return x


def test_explicit_item_cost_is_kept_not_learned():
    rt = host_runtime()
    slow = SlowInBubbles()
    given = pft.inference_job(rt, slow, [torch.ones(1, 4)] * 30, batch_size=None,
                              sink=lambda i, y: None, item_cost_us=500.0, name="given")
    slow.sleep_s = 0.002
    run_bubbles(rt, lambda: given.progress().finished or given.error is not None,
                max_bubbles=400, bubble_us=6000.0)
    cost = given.job.cost_info()
    given.wait(timeout=30)
    assert cost.samples >= 3  # slices were measured ...
    assert cost.learned_cost_us == 500.0  # ... and the given cost kept
    given.close()

    timed = pft.inference_job(rt, SlowInBubbles(), [torch.ones(1, 4)] * 30, batch_size=None,
                              sink=lambda i, y: None, name="timed")
    timed.module.sleep_s = 0.002
    run_bubbles(rt, lambda: timed.progress().finished or timed.error is not None,
                max_bubbles=400, bubble_us=6000.0)
    learned = timed.job.cost_info()
    timed.wait(timeout=30)
    assert learned.learned_cost_us > 1500.0  # timed at creation (~0), learned from the slices
    timed.close()
    rt.close()


def test_wait_items_run_returns_at_the_target_and_refuses_bad_timeouts():
    rt = host_runtime()
    job = pft.inference_job(rt, nn.Identity(), [torch.ones(1, 4)] * 8, batch_size=None,
                            sink=lambda i, y: None, item_cost_us=50.0)
    native = job.job._native
    with pytest.raises(pf.PipeFillError, match="timeout_s = -1"):
        native.wait_items_run(1, -1.0)
    assert native.wait_items_run(1, 0.0) == 0  # no bubble yet: nothing ran
    run_bubbles(rt, lambda: job.progress().finished, max_bubbles=200)
    assert native.wait_items_run(8, 1.0) == 8
    job.wait(timeout=30)
    job.close()
    rt.close()
