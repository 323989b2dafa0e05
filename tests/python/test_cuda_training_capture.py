"""The training job's capture on the CUDA path (issue 18), on CPU with torch's capture mocked
(cuda_fakes.py's stand-ins): the warm-up steps before the capture are undone (parameters,
buffers, optimizer state), the captured steps equal eager ones with checkpoints and a resume, and
the clones the undo made are gone once the job is created (issue 24).
"""
from __future__ import annotations

import gc
import time
import weakref

import pytest
import torch
from torch import nn

import eager_reference
import pipefill.torch as pft
from pipefill.torch import _cuda_ring as tcj
from cuda_fakes import (BATCH, DIM, OUT, SLOTS, FakeRuntime, fake_cuda, model,  # noqa: F401
                        training_data)


def test_training_capture_undoes_its_warm_up_steps(fake_cuda):
    """The warm-up steps before the capture train for real; the job's first item must start from
    the parameters and buffers given and zero optimizer state, as an eager first step does."""
    def bn_model(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(DIM, 16), nn.BatchNorm1d(16), nn.ReLU(),
                             nn.Linear(16, OUT)).train()

    module = bn_model(4)
    opt = torch.optim.SGD(module.parameters(), lr=0.5, momentum=0.9)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    first = (torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, OUT, generator=g))
    rt = FakeRuntime()
    capture = tcj.TrainingCapture(rt, module, opt, nn.functional.mse_loss, first, SLOTS, 5,
                                  "t", 0, 10.0)
    after = module.state_dict()
    assert "1.running_mean" in before
    assert all(torch.equal(after[k], before[k]) for k in before), "warm-up steps undone"
    buffers = [s["momentum_buffer"] for s in opt.state.values()]
    assert buffers and all(torch.count_nonzero(b) == 0 for b in buffers)
    # One replay of item 0 is one SGD step on slot 0 (the first batch): equal to eager.
    eager = bn_model(4)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.5, momentum=0.9)
    eager_opt.zero_grad(set_to_none=True)
    nn.functional.mse_loss(eager(first[0]), first[1]).backward()
    eager_opt.step()
    fake = rt.jobs[0]
    assert fake.spec.available == 0
    fake.set_available(1)
    # A CUDA replay overwrites the gradients the capture made (same memory); an eager replay of
    # backward() accumulates into them: start it from zeros.
    for p in module.parameters():
        p.grad.zero_()
    fake.run_bubble(1)
    state = module.state_dict()
    for k, v in eager.state_dict().items():
        assert torch.allclose(state[k], v, rtol=1e-6, atol=1e-7), k
    assert capture.outputs.device[0][0] > 0, "the step's loss went to output slot 0"


def _eager_sgd(steps, data):
    """(losses, state after each step) of the same steps run eagerly."""
    module = model(3).train()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    return eager_reference.eager_steps(module, opt, data, steps, keep_states=True)


def _train_on_fake(rt, job, fake, module, budget=2, deadline_s=60.0):
    # A CUDA replay overwrites the gradients the capture made (same memory); an eager replay of
    # backward() accumulates into them: each replay starts from zeros.
    fake.before_replay = lambda: [p.grad.zero_() for p in module.parameters()]
    deadline = time.monotonic() + deadline_s
    while not (job.progress().finished or job.error is not None):
        assert time.monotonic() < deadline, "the training job did not finish"
        fake.run_bubble(budget)
        rt.iteration_end()
        time.sleep(0.0005)


def test_captured_training_steps_equal_eager_with_checkpoints_and_resume(fake_cuda, tmp_path):
    steps, data = 10, training_data(6)
    eager_losses, eager_states = _eager_sgd(steps, data)
    ckpt = tmp_path / "train.pt"
    rt = FakeRuntime()
    module = model(3).train()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    job = pft.training_job(rt, module, opt, nn.functional.mse_loss, data, steps=steps,
                           checkpoint=ckpt, every=4, slots=SLOTS, item_cost_us=10.0)
    saved = {}
    save = job._save
    job._save = lambda step, state: (saved.__setitem__(step, state), save(step, state))
    fake = rt.jobs[0]
    fake.drained = lambda: job._drained
    _train_on_fake(rt, job, fake, module)
    job.wait(timeout=30)
    assert job.error is None
    assert job.losses == pytest.approx(eager_losses, rel=1e-6, abs=1e-7)
    for k, v in eager_states[-1].items():
        assert torch.allclose(module.state_dict()[k], v, rtol=1e-6, atol=1e-7), k
    # Each checkpoint holds the state after exactly its step: the job ran dry there until the
    # copy at iteration_end (a job that ran on would have moved the parameters past it).
    assert [(s.step, s.taken_at, s.in_bubble) for s in job.snapshots] == [
        (4, "iteration_end", False), (8, "iteration_end", False), (10, "iteration_end", False)]
    for step, state in saved.items():
        for k, v in eager_states[step - 1].items():
            assert torch.allclose(state["model"][k], v, rtol=1e-6, atol=1e-7), (step, k)
    assert all(a <= drained + SLOTS for a, drained in fake.bounds), fake.bounds
    job.close()

    # Resume from step 8 (rewrite the file as it was then) with fresh objects: the capture's
    # warm-up must give the loaded momentum back, not zeros.
    torch.save(saved[8], ckpt)
    module = model(99).train()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    again = pft.training_job(rt, module, opt, nn.functional.mse_loss, data, steps=steps,
                             checkpoint=ckpt, every=4, resume=ckpt, slots=SLOTS,
                             item_cost_us=10.0)
    assert again.resumed_from == 8
    fake = rt.jobs[1]
    assert fake.spec.items == 2
    _train_on_fake(rt, again, fake, module)
    again.wait(timeout=30)
    assert again.losses == pytest.approx(eager_losses, rel=1e-6, abs=1e-7)
    for k, v in eager_states[-1].items():
        assert torch.allclose(module.state_dict()[k], v, rtol=1e-6, atol=1e-7), k
    assert torch.load(ckpt, weights_only=False)["step"] == steps
    again.close()


def test_training_capture_keeps_no_copy_of_the_model_after_creation(fake_cuda, monkeypatch):
    """The clones of parameters, buffers and optimizer state that undo the warm-up are dropped once
    the warm-up is undone (kept for the job's life they were 1x-3x the model in GPU memory)."""
    clones = []
    original = tcj.WarmUpUndo.__init__

    def recording_init(self, module, optimizer):
        original(self, module, optimizer)
        clones.extend(weakref.ref(t) for t in self.saved_params + list(self.saved_state.values()))

    monkeypatch.setattr(tcj.WarmUpUndo, "__init__", recording_init)
    module = model(3).train()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    opt.zero_grad()
    nn.functional.mse_loss(module(torch.randn(BATCH, DIM)), torch.randn(BATCH, OUT)).backward()
    opt.step()  # momentum buffers exist: the undo saves optimizer state too
    rt = FakeRuntime()
    capture = tcj.TrainingCapture(rt, module, opt, nn.functional.mse_loss,
                                  training_data(1)[0], SLOTS, 5, "t", 0, 10.0)
    gc.collect()
    assert len(clones) == 4 + 4  # 4 parameter tensors, 4 momentum buffers
    alive = [ref for ref in clones if ref() is not None]
    assert alive == [], f"{len(alive)} clones outlived the job's creation"
    assert capture.graph_job.job is rt.jobs[0]
