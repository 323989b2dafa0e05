"""pipefill.torch.inference_job / training_job in one process (issue 18).

Host backend (real-time, items run the real module on the host device's fill worker thread
while the trainer thread waits in its bubble): outputs equal the module run eagerly, in order,
once each, with a ring of 4 slots over a dataset 20x larger; the training job's losses and
parameters equal the same steps run eagerly; resume after close continues bit-identically; bad
input ends the job with a message naming the value and leaves the runtime usable. Simulated
backend: items compute their result at their virtual completion. Every wait has a timeout.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import eager_reference
import pipefill as pf
import pipefill.torch as pft

DIM, OUT, BATCH, SLOTS = 8, 4, 4, 4


def model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Linear(16, OUT)).eval()


class Samples:
    """A dataset generated on demand (never held in memory): sample i is a fixed function of i."""

    def __init__(self, count: int, bad_at: int = -1) -> None:
        self.count, self.bad_at = count, bad_at

    def sample(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        return torch.randn(DIM + (1 if i == self.bad_at else 0), generator=g)

    def __iter__(self):
        return (self.sample(i) for i in range(self.count))

    def __len__(self) -> int:
        return self.count


def host_runtime() -> pf.Runtime:
    try:
        return pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                          safety_margin_fraction=0.0, min_samples=1000000)
    except pf.PipeFillError as error:
        if error.code == pf.Result.NOT_SUPPORTED:
            pytest.skip(f"no host device in this build: {error.message}")
        raise


def run_bubbles(rt: pf.Runtime, done, max_bubbles: int = 3000, bubble_us: float = 3000.0) -> int:
    """The trainer: bubbles (the main stream waits, fill work runs) and compute between them,
    until done() or max_bubbles."""
    stream = rt.high_priority_stream()
    n = 0
    while not done() and n < max_bubbles:
        with rt.bubble(stream, expected_us=bubble_us):
            pf.host_stream_delay(stream, bubble_us)
        pf.host_stream_delay(stream, 200.0)
        rt.iteration_end()
        pf.host_stream_synchronize(stream)
        n += 1
    return n


def eager_outputs(module: nn.Module, data: Samples):
    return eager_reference.eager_outputs(module, data, BATCH)


def test_host_inference_outputs_equal_eager_in_order_exactly_once():
    module = model()
    data = Samples(20 * SLOTS * BATCH + 3)  # 81 items (the last one 3 rows), 20x the ring
    got = []
    rt = host_runtime()
    job = pft.inference_job(rt, module, data, batch_size=BATCH, slots=SLOTS,
                            sink=lambda i, y: got.append((i, y.clone())))
    assert job.progress().items_total == 81
    bubbles = run_bubbles(rt, lambda: job.progress().finished or job.error is not None)
    progress = job.wait(timeout=30)
    assert job.error is None
    assert progress.items_done == 81 and progress.finished
    assert [i for i, _ in got] == list(range(81)), "in order, once each"
    expected = eager_outputs(module, data)
    assert all(torch.equal(y, e) for (_, y), e in zip(got, expected))
    assert bubbles > 1, "the job spans several bubbles"
    assert rt.stats().items_completed == 81
    job.close()
    rt.close()


def test_host_inference_item_range_folder_and_memmap_sinks(tmp_path):
    module = model(1)
    data = Samples(40 * BATCH)
    expected = eager_outputs(module, data)
    rt = host_runtime()
    folder = tmp_path / "out"
    rows = np.lib.format.open_memmap(tmp_path / "rows.npy", mode="w+", dtype=np.float32,
                                     shape=(40 * BATCH, OUT))
    a = pft.inference_job(rt, module, data, batch_size=BATCH, sink=folder, start=10, items=12,
                          name="shard-10-22")
    b = pft.inference_job(rt, module, data, batch_size=BATCH, sink=rows, name="all")
    run_bubbles(rt, lambda: all(j.progress().finished or j.error for j in (a, b)))
    a.wait(timeout=30)
    b.wait(timeout=30)
    files = sorted(p.name for p in folder.iterdir())
    assert files == [f"{i:012d}.npy" for i in range(10, 22)], "exactly the shard's items"
    for i in range(10, 22):
        assert np.array_equal(np.load(folder / f"{i:012d}.npy"), expected[i].numpy())
    assert np.array_equal(np.asarray(rows), torch.cat(expected).numpy())
    a.close()
    b.close()
    rt.close()


def test_sim_inference_items_compute_at_virtual_completion():
    module = model(2)
    data = Samples(12 * BATCH)
    world = pf.SimWorld(1, sm_count=32, seed=0)
    rt = pf.Runtime(backend="sim", sim_world=world, device=0, reserved_sms=4,
                    safety_margin_us=0.0, safety_margin_fraction=0.0)
    stream = world.stream(0, -1)
    got = []
    job = pft.inference_job(rt, module, data, batch_size=BATCH, slots=3, item_cost_us=10.0,
                            sink=lambda i, y: got.append((i, y.clone())))
    for _ in range(2000):
        if job.progress().finished or job.error is not None:
            break
        with rt.bubble(stream, expected_us=100.0):
            stream.delay(100.0)
        stream.launch_kernel(50.0, 32)
        rt.iteration_end()
        world.run_until_idle()
    job.wait(timeout=30)
    assert [i for i, _ in got] == list(range(12))
    assert all(torch.equal(y, e) for (_, y), e in zip(got, eager_outputs(module, data)))
    job.close()
    rt.close()
    world.close()


def test_bad_input_ends_the_job_not_the_trainer(tmp_path):
    rt = host_runtime()
    module = model()
    # A sample of another shape mid-stream (sample 21: item 5).
    bad = pft.inference_job(rt, module, Samples(40, bad_at=21), batch_size=BATCH,
                            sink=lambda i, y: None, name="bad-shape")
    run_bubbles(rt, lambda: bad.error is not None or bad.progress().finished, max_bubbles=500)
    with pytest.raises(pft.FillJobError, match=r"item 5: sample 21 of the dataset has shape \(9,\)"):
        bad.wait(timeout=10)
    bad.close()
    # Batches given as such (batch_size=None): batch 3 has other samples.
    batches = [torch.zeros(BATCH, DIM)] * 3 + [torch.zeros(BATCH, DIM + 1), torch.zeros(BATCH, DIM)]
    bad = pft.inference_job(rt, module, batches, batch_size=None, sink=lambda i, y: None,
                            name="bad-batch")
    run_bubbles(rt, lambda: bad.error is not None or bad.progress().finished, max_bubbles=500)
    with pytest.raises(pft.FillJobError, match=r"item 3: the dataset yielded a batch of shape "
                                               r"\(4, 9\)"):
        bad.wait(timeout=10)
    bad.close()

    def broken_sink(i, y):
        if i == 3:
            raise OSError("disk full")

    sink_fails = pft.inference_job(rt, module, Samples(40), batch_size=BATCH, sink=broken_sink,
                                   name="bad-sink")
    run_bubbles(rt, lambda: sink_fails.error is not None or sink_fails.progress().finished,
                max_bubbles=500)
    with pytest.raises(pft.FillJobError, match="sink raised on item 3: OSError: disk full"):
        sink_fails.wait(timeout=10)
    sink_fails.close()

    def broken_module(x):
        raise RuntimeError("kaput")

    with pytest.raises(ValueError, match=r"the module failed on the first batch of data \(a tensor "
                                         r"of shape \(4, 8\).*RuntimeError: kaput"):  # at creation
        pft.inference_job(rt, broken_module, Samples(8), batch_size=BATCH, sink=lambda i, y: None)

    class FailsLater(nn.Module):  # 6 calls at creation (the probe, 5 timings); items 0, 1 run
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 9:
                raise RuntimeError("module broke")
            return module(x)

    late = pft.inference_job(rt, FailsLater().eval(), Samples(40), batch_size=BATCH,
                             sink=lambda i, y: None, name="bad-module")
    run_bubbles(rt, lambda: late.error is not None or late.progress().finished, max_bubbles=500)
    with pytest.raises(pft.FillJobError, match=r"(?s)job 'bad-module': item 2: .*RuntimeError: module broke"):
        late.wait(timeout=10)
    assert late.progress().items_done <= 2, "items after the one that raised never reach the sink"
    late.close()

    progress = tmp_path / "progress.json"
    progress.write_text(json.dumps({"kind": "pipefill.inference_job", "name": "other",
                                    "start": 0, "end": None, "next": 3}))
    with pytest.raises(ValueError, match="belongs to another job: its name is 'other'"):
        pft.inference_job(rt, module, Samples(8), batch_size=BATCH, sink=lambda i, y: None,
                          resume=progress, name="mine")
    blocker = tmp_path / "file"
    blocker.write_text("")
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    with pytest.raises(pf.PipeFillError, match="checkpoint path .*file/ckpt.pt' cannot be written"):
        pft.training_job(rt, module, opt, nn.MSELoss(), [(torch.zeros(2, DIM), torch.zeros(2, OUT))],
                         steps=3, checkpoint=blocker / "ckpt.pt")

    # The trainer's runtime goes on: a good job still completes.
    got = []
    good = pft.inference_job(rt, module, Samples(16), batch_size=BATCH,
                             sink=lambda i, y: got.append(i), name="good")
    run_bubbles(rt, lambda: good.progress().finished or good.error is not None)
    good.wait(timeout=30)
    assert got == [0, 1, 2, 3]
    good.close()
    rt.close()


def training_data(steps: int):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, OUT, generator=g))
            for _ in range(steps)]


def eager_training(steps: int, data):
    module = model(3).train()
    opt = torch.optim.Adam(module.parameters(), lr=0.01)
    return eager_reference.eager_steps(module, opt, data, steps)


def test_host_training_equals_eager_and_resumes_bit_identically(tmp_path):
    steps, data = 24, training_data(10)  # the data is iterated again after 10 steps
    eager_losses, eager_state = eager_training(steps, data)
    ckpt = tmp_path / "train.pt"
    rt = host_runtime()

    # First attempt: stops (closed) after 9 steps; the last checkpoint is at step 8.
    module = model(3).train()
    opt = torch.optim.Adam(module.parameters(), lr=0.01)
    first = pft.training_job(rt, module, opt, nn.functional.mse_loss, data, steps=steps,
                             checkpoint=ckpt, every=4, item_cost_us=1000.0)  # fits the bubbles
    run_bubbles(rt, lambda: first.progress().items_done >= 9 or first.error is not None)
    first.close()
    assert first.error is None
    assert first.progress().items_done >= 9
    assert first.losses == eager_losses[:len(first.losses)]
    # Checkpoints: the job ran dry at each due step and its state was copied at the trainer's
    # iteration_end, with no bubble open.
    assert [s.step for s in first.snapshots][:2] == [4, 8]
    assert all(s.step % 4 == 0 and s.taken_at == "iteration_end" and not s.in_bubble
               for s in first.snapshots), first.snapshots

    # Second attempt, from fresh objects, as after a restart.
    module = model(99).train()  # other initial weights: the checkpoint must replace them
    opt = torch.optim.Adam(module.parameters(), lr=0.01)
    second = pft.training_job(rt, module, opt, nn.functional.mse_loss, data, steps=steps,
                              checkpoint=ckpt, every=4, resume=ckpt, item_cost_us=1000.0)
    assert second.resumed_from % 4 == 0 and second.resumed_from >= 8
    run_bubbles(rt, lambda: second.progress().finished or second.error is not None)
    progress = second.wait(timeout=30)
    assert progress.items_done == steps
    assert second.losses == eager_losses, "the loss curve equals the eager one"
    state = module.state_dict()
    assert all(torch.equal(state[k], eager_state[k]) for k in eager_state), "bit-identical"
    saved = torch.load(ckpt, weights_only=False)
    assert saved["step"] == steps
    assert [s.step for s in second.snapshots] == list(range(second.resumed_from + 4, steps + 1, 4))
    assert all(s.taken_at == "iteration_end" and not s.in_bubble for s in second.snapshots)
    second.close()

    with pytest.raises(ValueError, match="its steps is 24, this job's is 30"):
        pft.training_job(rt, model(3), torch.optim.Adam(model(3).parameters()),
                         nn.functional.mse_loss, data, steps=30, resume=ckpt)
    rt.close()


def test_item_job_bound_errors_name_the_value():
    rt = host_runtime()
    ran = []
    job = rt._native.create_item_job("bounded", 0, 10, 100.0, ran.append, 0)
    with pytest.raises(pf.PipeFillError, match="has no item available \\(available = 0\\)"):
        job.end_input()
    job.set_available(3)
    run_bubbles(rt, lambda: len(ran) >= 3, max_bubbles=500)
    run_bubbles(rt, lambda: False, max_bubbles=3)  # dry: nothing more runs
    rt.synchronize()
    assert ran == [0, 1, 2]
    with pytest.raises(pf.PipeFillError, match="available = 1 is below the 3 items already claimed"):
        job.set_available(1)
    job.end_input()
    job.wait(5e6)
    assert job.info()["item_count"] == 3
    with pytest.raises(pf.PipeFillError, match="fn is not callable"):
        rt._native.create_item_job("not-callable", 0, 10, 100.0, 5, 0)
    job.close()
    rt.close()


def test_training_without_iteration_end_still_checkpoints(tmp_path, monkeypatch):
    """A trainer that never calls iteration_end: the job's writer thread takes each checkpoint
    once the runtime began FALLBACK_BUBBLES bubbles since the job ran dry, and warns once."""
    from pipefill.torch import _checkpoints as torch_training
    monkeypatch.setattr(torch_training, "FALLBACK_BUBBLES", 3)
    steps, data = 8, training_data(8)
    eager_losses, eager_state = eager_training(steps, data)
    rt = host_runtime()
    module = model(3).train()
    opt = torch.optim.Adam(module.parameters(), lr=0.01)
    ckpt = tmp_path / "train.pt"
    with pytest.warns(RuntimeWarning, match="has seen no iteration_end call in 3 bubbles"):
        job = pft.training_job(rt, module, opt, nn.functional.mse_loss, data, steps=steps,
                               checkpoint=ckpt, every=4, item_cost_us=1000.0)
        stream = rt.high_priority_stream()
        for _ in range(5000):  # bubbles, never an iteration_end
            if job.progress().finished or job.error is not None:
                break
            with rt.bubble(stream, expected_us=3000.0):
                pf.host_stream_delay(stream, 3000.0)
            pf.host_stream_synchronize(stream)
        job.wait(timeout=30)
    assert [(s.step, s.taken_at) for s in job.snapshots] == [(4, "fallback"), (8, "fallback")]
    assert torch.load(ckpt, weights_only=False)["step"] == steps
    assert job.losses == eager_losses
    assert all(torch.equal(module.state_dict()[k], v) for k, v in eager_state.items())
    job.close()
    rt.close()


def test_training_checkpoint_hook_leaves_with_the_job(tmp_path):
    rt = host_runtime()
    module = model(3).train()
    job = pft.training_job(rt, module, torch.optim.SGD(module.parameters(), lr=0.1),
                           nn.functional.mse_loss, training_data(2), steps=4,
                           checkpoint=tmp_path / "c.pt", every=2, item_cost_us=1000.0)
    assert rt._iteration_end_hooks == [job._on_iteration_end]
    job.close()
    assert rt._iteration_end_hooks == []
    rt.iteration_end()  # nothing left to call
    rt.close()
