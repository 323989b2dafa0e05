"""pipefill.torch.inference_job / training_job validate at creation (issue 25): one sample goes
through the model outside any bubble, and what would fail every item, or silently do something
else, is refused then with a message naming the argument and the value (or warned about, for a
module left in training mode). Also: (x, y) datasets feed x, dict and tuple outputs reach the
sinks as the module returns them, the training job's item cost is measured, and progress()
reports the rate over a recent window. Host backend, one process; every wait has a timeout."""
from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import pipefill.torch as pft
import pipefill.torch._job_common as torch_jobs
from test_torch_jobs import BATCH, DIM, OUT, Samples, host_runtime, model, run_bubbles


def none_sink(i, y):
    return None


@pytest.fixture
def rt():
    runtime = host_runtime()
    yield runtime
    runtime.close()


def test_a_batch_of_another_dtype_than_the_module_is_refused(rt):
    data = [torch.zeros(BATCH, DIM, dtype=torch.float64)] * 3
    with pytest.raises(TypeError, match=r"data: batches have dtype torch.float64, the module's "
                                        r"parameters torch.float32"):
        pft.inference_job(rt, model(), data, batch_size=None, sink=none_sink)


def test_a_batch_on_another_device_than_the_module_is_refused(rt):
    with pytest.raises(ValueError, match=r"data: batches are on cpu, the module's parameters on "
                                         r"meta"):
        pft.inference_job(rt, model().to("meta"), Samples(8), batch_size=BATCH, sink=none_sink)


def test_a_map_style_dataset_of_x_y_pairs_feeds_x(rt):
    x = torch.randn(12, DIM, generator=torch.Generator().manual_seed(1))
    pairs = torch.utils.data.TensorDataset(x, torch.arange(12))
    got = {}
    job = pft.inference_job(rt, model(), pairs, batch_size=BATCH,
                            sink=lambda i, y: got.__setitem__(i, y))
    run_bubbles(rt, lambda: job.progress().finished or job.error is not None)
    job.wait(timeout=30)
    job.close()
    with torch.no_grad():
        expected = [model()(x[i:i + BATCH]) for i in range(0, 12, BATCH)]
    assert sorted(got) == [0, 1, 2]
    assert all(torch.equal(got[i], expected[i]) for i in got)


class DictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = model()

    def forward(self, x):
        y = self.inner(x)
        return {"logits": y, "top": y.argmax(dim=1)}


def test_dict_outputs_reach_the_sinks_as_the_module_returns_them(rt, tmp_path):
    module = DictModel().eval()
    got = {}
    job = pft.inference_job(rt, module, Samples(8), batch_size=BATCH,
                            sink=lambda i, y: got.__setitem__(i, y), name="callable")
    folder = pft.inference_job(rt, module, Samples(8), batch_size=BATCH, sink=tmp_path / "out",
                               name="folder")
    run_bubbles(rt, lambda: all(j.progress().finished or j.error for j in (job, folder)))
    job.wait(timeout=30)
    folder.wait(timeout=30)
    job.close()
    folder.close()
    with torch.no_grad():
        expected = [module(torch.stack([Samples(8).sample(i * BATCH + j) for j in range(BATCH)]))
                    for i in range(2)]
    assert set(got[0]) == {"logits", "top"}
    assert all(torch.equal(got[i][k], expected[i][k]) for i in range(2) for k in expected[i])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "000000000000.npz", "000000000001.npz"]
    for i in range(2):
        saved = np.load(tmp_path / "out" / f"{i:012d}.npz")
        assert np.array_equal(saved["logits"], expected[i]["logits"].numpy())
        assert np.array_equal(saved["top"], expected[i]["top"].numpy())


def test_a_memmap_sink_refuses_a_module_that_returns_a_dict(rt, tmp_path):
    memmap = np.lib.format.open_memmap(tmp_path / "m.npy", mode="w+", dtype=np.float32,
                                       shape=(8, OUT))
    with pytest.raises(TypeError, match=r"sink is a numpy memmap.*returns a dict with keys "
                                        r"\['logits', 'top'\]: use a folder or a callable sink"):
        pft.inference_job(rt, DictModel().eval(), Samples(8), batch_size=BATCH, sink=memmap)


def test_items_beyond_the_data_are_refused_with_the_numbers(rt):
    with pytest.raises(ValueError, match=r"items = 10 from start = 0 goes past the end of data "
                                         r"\(4 batches: at most 4 items from start 0\)"):
        pft.inference_job(rt, model(), Samples(16), batch_size=BATCH, sink=none_sink, items=10)


def test_start_past_the_end_is_refused_with_the_numbers(rt):
    with pytest.raises(ValueError, match=r"start = 5 is past the end of data \(4 batches"):
        pft.inference_job(rt, model(), Samples(16), batch_size=BATCH, sink=none_sink, start=5)
    unsized = (torch.zeros(BATCH, DIM) for _ in range(3))  # no len(): found by iterating
    with pytest.raises(ValueError, match=r"start = 7 is past the end of data \(it yields 3 "
                                         r"batches\)"):
        pft.inference_job(rt, model(), unsized, batch_size=None, sink=none_sink, start=7)


def test_a_sink_folder_written_by_another_live_job_is_refused(rt, tmp_path):
    first = pft.inference_job(rt, model(), Samples(8), batch_size=BATCH, sink=tmp_path / "out",
                              name="first")
    with pytest.raises(ValueError, match=r"sink folder '.*out' is already written by job "
                                         r"'first'"):
        pft.inference_job(rt, model(), Samples(8), batch_size=BATCH, sink=tmp_path / "out",
                          name="second")
    first.close()
    again = pft.inference_job(rt, model(), Samples(8), batch_size=BATCH, sink=tmp_path / "out",
                              name="second")  # the folder is free once the first job is closed
    again.close()


def test_a_module_in_training_mode_is_warned_about(rt):
    with pytest.warns(RuntimeWarning, match=r"inference_job 'inference': the module is in "
                                            r"training mode .*call module.eval\(\) first"):
        job = pft.inference_job(rt, model().train(), Samples(8), batch_size=BATCH, sink=none_sink)
    job.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eval(): no warning
        pft.inference_job(rt, model().eval(), Samples(8), batch_size=BATCH, sink=none_sink).close()


def test_training_batches_without_labels_are_refused(rt):
    module = model(3).train()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"data: step 0's batch is a tensor of shape \(4, 8\), "
                                         r"dtype torch.float32 on cpu; each batch must be an "
                                         r"\(inputs, target\) pair"):
        pft.training_job(rt, module, opt, nn.functional.mse_loss, [torch.zeros(BATCH, DIM)],
                         steps=3)


def test_training_data_of_another_dtype_is_refused(rt):
    module = model(3).train()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    data = [(torch.zeros(BATCH, DIM, dtype=torch.float64), torch.zeros(BATCH, OUT))]
    with pytest.raises(TypeError, match=r"data: inputs have dtype torch.float64"):
        pft.training_job(rt, module, opt, nn.functional.mse_loss, data, steps=3)


def test_a_capturable_optimizer_off_cuda_is_refused_naming_the_fix(rt):
    module = model(3).train()
    opt = torch.optim.AdamW(module.parameters(), capturable=True)
    before = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(ValueError, match=r"optimizer AdamW \(param group 0\) has capturable=True"
                                         r".*capturable=\(runtime.backend == pf.Backend.CUDA\)"):
        pft.training_job(rt, module, opt, nn.functional.mse_loss,
                         [(torch.zeros(BATCH, DIM), torch.zeros(BATCH, OUT))], steps=3)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters())), "nothing changed"


def test_the_training_item_cost_is_a_measured_step(rt):
    module = model(3).train()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)

    def slow_loss(y, target):  # a step of at least 20 ms, where the old default was 1 ms
        time.sleep(0.02)
        return nn.functional.mse_loss(y, target)

    before = [p.detach().clone() for p in module.parameters()]
    job = pft.training_job(rt, module, opt, slow_loss,
                           [(torch.ones(BATCH, DIM), torch.zeros(BATCH, OUT))], steps=3)
    assert job.item_cost_us >= 20000.0, job.item_cost_us
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters())), \
        "the timed steps ran on copies"
    job.close()


def test_progress_rate_is_over_a_recent_window(rt, monkeypatch):
    monkeypatch.setattr(torch_jobs, "RATE_WINDOW_S", 0.5)
    job = pft.inference_job(rt, model(), Samples(16), batch_size=BATCH, sink=none_sink)
    run_bubbles(rt, lambda: job.progress().finished or job.error is not None)
    job.wait(timeout=30)
    assert job.progress().items_done == 4
    # Items stopped: the rate over the last window falls to 0 (an average since the start never
    # would). A condition, waited on with a generous timeout.
    deadline = time.monotonic() + 60
    while job.progress().rate_per_s > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.progress().rate_per_s == 0.0
    job.close()
