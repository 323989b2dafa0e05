"""training_job micro-steps (issue 32 item 6): each step's batch split into k micro-batches with
gradient accumulation; the job offers one configuration per divisor of k and the planner picks
per bubble class. Tested bit-identical (losses and parameters) against the plain loop with the
same accumulation, on bubbles too short for a whole step, and resumed mid-step from a
checkpoint; bad input names the value.
"""
from __future__ import annotations

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


def test_micro_steps_keep_the_stated_item_cost():
    """A whole step given as item_cost_us: each configuration's cost (g micro-batches of a
    quarter step) is kept, not learned from the measured slices (pfJobSetCostPolicy 2), however
    long the Python items really take on the host."""
    steps, k, batches = 4, 4, data(3)
    rt = host_runtime()
    job, _ = new_job(rt, steps, batches, k, item_cost_us=8000.0)
    run_bubbles(rt, lambda: job.progress().finished or job.error is not None, max_bubbles=2000)
    job.wait(timeout=30)
    assert job.error is None
    cost = job.job.cost_info()
    assert cost.samples >= 3  # measured (enough to move a learned cost), not used
    assert cost.prior_cost_us == 2000.0 * job._micro.groups[cost.config_index]
    assert cost.learned_cost_us == cost.prior_cost_us
    job.close()
    rt.close()


def test_micro_steps_resume_mid_step_bit_identically(tmp_path):
    """The first attempt dies in the middle of step 5 (its loss raises in the 3rd micro-batch,
    2 micro-batches accumulated, no optimizer step): resumed from its last checkpoint (step 4),
    the losses and parameters equal the plain loop's."""
    steps, k, batches = 10, 4, data(7)
    want_losses, want_state = plain_accumulation(steps, batches, k)
    ckpt = tmp_path / "micro.pt"
    rt = host_runtime()
    calls = [0]

    def dies_mid_step(output, target):
        calls[0] += 1
        if calls[0] == 5 * k + 3:
            raise RuntimeError("the trainer's process died here")
        return nn.functional.mse_loss(output, target)

    module = model(3).train()
    opt = torch.optim.Adam(module.parameters(), lr=0.01)
    first = pft.training_job(rt, module, opt, dies_mid_step, batches, steps=steps,
                             micro_batches=k, checkpoint=ckpt, every=2, item_cost_us=4000.0)
    run_bubbles(rt, lambda: first.error is not None, max_bubbles=4000)
    assert "the trainer's process died here" in first.error
    assert (first.step, first._micro.in_step) == (5, 2)  # mid-step
    first.close()
    assert first.losses == want_losses[:5]

    second, module = new_job(rt, steps, batches, k, checkpoint=ckpt, every=2, resume=ckpt,
                             item_cost_us=4000.0, seed=42)
    assert second.resumed_from == 4
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
    assert rt.jobs == []  # a refused job leaves nothing behind
    rt.close()


def test_micro_steps_on_the_simulated_backend_fit_the_short_bubble_class():
    """Simulated backend (virtual time: an item of g micro-batches takes g x 100 us, a whole step
    given as 400 us): bubbles of 150 us fit only one micro-batch per item (configuration 0), and
    that is what runs there; bubbles of 2000 us fit any configuration (with costs linear in g the
    planner's work per µs ties, and it keeps the lowest index). The training equals the plain
    accumulation loop."""
    steps, k, batches = 16, 4, data(5)
    want_losses, want_state = plain_accumulation(steps, batches, k)
    world = pf.SimWorld(1, sm_count=32, seed=0)
    rt = pf.Runtime(backend="sim", sim_world=world, device=0, reserved_sms=4,
                    safety_margin_us=0.0, safety_margin_fraction=0.0)
    stream = world.stream(0, -1)
    job, module = new_job(rt, steps, batches, k, item_cost_us=400.0)
    used = {150.0: set(), 2000.0: set()}
    for _ in range(2000):
        if job.progress().finished or job.error is not None:
            break
        for bubble_us in (150.0, 2000.0):
            before = job._micro.micro_batches_run
            with rt.bubble(stream, expected_us=bubble_us):
                stream.delay(bubble_us)
            stream.launch_kernel(50.0, 32)
            world.run_until_idle()
            if job._micro.micro_batches_run > before:
                used[bubble_us].add(job.job.info().config_index)
        rt.iteration_end()
    job.wait(timeout=30)
    assert job.error is None
    assert job.losses == want_losses
    state = module.state_dict()
    assert all(torch.equal(state[name], want_state[name]) for name in want_state)
    assert used[150.0] == {0}, used  # one micro-batch per item: the only one that fits
    assert used[2000.0], used  # the long class ran micro-batches too (any configuration fits)
    job.close()
    rt.close()
    world.close()
