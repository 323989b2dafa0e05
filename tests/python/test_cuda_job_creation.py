"""Creating a CUDA fill job (issues 18 and 24), on CPU with torch's capture mocked
(cuda_fakes.py's stand-ins): the capture runs inside the capture stream's context without draining
the device and closes its stream, the item cost is timed on the host, a failing capture cleans up;
what training_job refuses at creation (an optimizer it cannot capture, a learning-rate scheduler,
a partial last batch) registers nothing; and Runtime.capture_context pairs on the host backend.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import pipefill as pf
import pipefill.torch as pft
from cuda_fakes import (BATCH, DIM, OUT, SLOTS, FakeGraph, FakeRuntime, fake_cuda,  # noqa: F401
                        model, samples, training_data)


def test_training_refuses_an_optimizer_it_cannot_capture(fake_cuda):
    rt = FakeRuntime()
    module = model()
    data = [(torch.zeros(BATCH, DIM), torch.zeros(BATCH, OUT))]
    with pytest.raises(pf.PipeFillError, match=r"optimizer Adam \(param group 0\) is not "
                                               r"capturable.*Adam\(\.\.\., capturable=True\)"):
        pft.training_job(rt, module, torch.optim.Adam(module.parameters()), nn.MSELoss(), data,
                         steps=3)
    with pytest.raises(pf.PipeFillError, match="optimizer Adagrad is not supported"):
        pft.training_job(rt, module, torch.optim.Adagrad(module.parameters()), nn.MSELoss(),
                         data, steps=3)
    with pytest.raises(pf.PipeFillError, match="SGD param group 0 has momentum and dampening=0.5"):
        pft.training_job(rt, module, torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9,
                                                     dampening=0.5), nn.MSELoss(), data, steps=3)
    elsewhere = nn.Linear(2, 3, device="meta")  # (the mocked CUDA device is the CPU)
    with pytest.raises(pf.PipeFillError, match=r"parameter of shape \(3, 2\) on meta"):
        pft.training_job(rt, elsewhere, torch.optim.AdamW(elsewhere.parameters(), capturable=True),
                         nn.MSELoss(), data, steps=3)
    assert rt.jobs == [], "a refusal registers nothing"


def test_job_creation_captures_without_draining_the_device(fake_cuda):
    """Creating either CUDA job captures with capture_begin/capture_end inside the capture
    stream's context (pfGraphCaptureContextPush), never torch.cuda.graph(...) (its __enter__
    synchronizes the device and empties the cache), never torch.cuda.synchronize/empty_cache; and
    the capture stream is closed once the job is registered (one leaked per job before)."""
    drains = fake_cuda
    rt = FakeRuntime()
    infer = pft.inference_job(rt, model(), samples(4 * BATCH), batch_size=BATCH, slots=SLOTS,
                              item_cost_us=10.0, sink=lambda i, y: None)
    module = model(3).train()
    train = pft.training_job(rt, module, torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9),
                             nn.functional.mse_loss, training_data(3), steps=3, slots=SLOTS,
                             item_cost_us=10.0)
    assert drains == [], f"job creation drained the device: {drains}"
    assert len(FakeGraph.captures) == 2
    assert all(in_context for _, in_context in FakeGraph.captures), \
        "captured with the capture stream's context current"
    assert [s.closed for s in rt.capture_streams] == [True, True]
    assert FakeRuntime.contexts_entered == 0, "every push popped"
    infer.close()
    train.close()


def test_item_cost_is_timed_on_the_host_without_cuda_events(fake_cuda, monkeypatch):
    """The capture stream is a green context's: torch's CUDA events (primary context) must not be
    recorded on it. With item_cost_us unset the replays are timed on the host: one untimed replay,
    then measure_runs timed ones."""
    def no_events(*args, **kwargs):
        raise AssertionError("a CUDA event was made to time the item")

    monkeypatch.setattr(torch.cuda, "Event", no_events)
    rt = FakeRuntime()
    out = torch.zeros(4)
    job = pft.graph_fill_job(rt, lambda index: out.index_fill_(0, index.view(1), 1.0), 4,
                             measure_runs=5)
    graph = rt.jobs[0].spec.graph
    assert graph.replays == 6
    assert job.item_cost_us > 0.0
    assert fake_cuda == []
    assert rt.capture_streams[0].closed


def test_a_failing_capture_ends_the_capture_and_closes_its_stream(fake_cuda):
    rt = FakeRuntime()
    calls = []

    def step(index):
        calls.append(1)
        if len(calls) == 3:  # the two warm-ups pass, the captured run raises
            raise RuntimeError("step failed under capture")

    with pytest.raises(RuntimeError, match="step failed under capture"):
        pft.graph_fill_job(rt, step, 4, item_cost_us=5.0)
    graph = FakeGraph.captures[0][0]
    assert graph._recorder is None, "capture_end ran"
    assert rt.capture_streams[0].closed and rt.jobs == []
    assert FakeRuntime.contexts_entered == 0


def test_training_refuses_a_learning_rate_scheduler(fake_cuda):
    rt = FakeRuntime()
    module = model()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    with pytest.raises(pf.PipeFillError, match=r"optimizer SGD has a learning-rate scheduler "
                                               r"attached \(param group 0 has 'initial_lr'\).*"
                                               r"silently ignored") as caught:
        pft.training_job(rt, module, opt, nn.MSELoss(), training_data(2), steps=3)
    assert caught.value.code == pf.Result.NOT_SUPPORTED
    assert rt.jobs == [] and rt.capture_streams == []


def test_training_refuses_a_partial_last_batch_at_creation(fake_cuda):
    from torch.utils.data import DataLoader, TensorDataset
    rt = FakeRuntime()
    module = model()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    dataset = TensorDataset(torch.randn(10, DIM), torch.randn(10, OUT))
    with pytest.raises(ValueError, match=r"last batch would hold 2 of 4 samples \(10 samples, "
                                         r"drop_last=False\).*drop_last=True"):
        pft.training_job(rt, module, opt, nn.functional.mse_loss,
                         DataLoader(dataset, batch_size=4), steps=3)
    batches = training_data(2) + [(torch.randn(BATCH - 1, DIM), torch.randn(BATCH - 1, OUT))]
    with pytest.raises(ValueError, match=r"batch 2 has shapes \(\(3, 8\), \(3, 4\)\), the first "
                                         r"batch \(\(4, 8\), \(4, 4\)\)"):
        pft.training_job(rt, module, opt, nn.functional.mse_loss, batches, steps=3)
    assert rt.jobs == []
    job = pft.training_job(rt, module, opt, nn.functional.mse_loss,
                           DataLoader(dataset, batch_size=4, drop_last=True), steps=2, slots=SLOTS,
                           item_cost_us=10.0)
    assert len(rt.jobs) == 1
    job.close()


def test_capture_context_pairs_on_a_backend_without_contexts():
    """Runtime.capture_context (pfGraphCaptureContextPush/Pop) on the host backend: nothing to make
    current, but the calls pair up; a pop without a push, or a push of a stream that is not a
    capture stream on CUDA, is refused by name (the CUDA side is a GPU test)."""
    try:
        rt = pf.Runtime(backend="host", reserved_sms=0)
    except pf.PipeFillError as error:
        if error.code == pf.Result.NOT_SUPPORTED:
            pytest.skip(f"no host device in this build: {error.message}")
        raise
    capture = rt.capture_stream()
    with rt.capture_context(capture):
        with rt.capture_context(capture):
            pass
    with pytest.raises(pf.PipeFillError, match="no pfGraphCaptureContextPush of this runtime is "
                                               "open on the calling thread") as caught:
        rt._native.pop_capture_context()
    assert caught.value.code == pf.Result.INVALID_STATE
    capture.close()
    rt.close()
