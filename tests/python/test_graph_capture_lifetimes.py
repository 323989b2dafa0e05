"""pipefill.torch's graph helpers keep alive every tensor a captured graph reads (issue 16).

A CUDA graph reads tensors by address. A tensor that the capture read but that nothing references
after the helper returns goes back to torch's caching allocator, which hands its block to the
next allocation on that stream (a loss scalar, say): every later item then reads garbage or
trips a device assert that kills the training process's CUDA context.

These tests run on CPU: torch.cuda's capture machinery is replaced by stand-ins that run ``step``
eagerly under a TorchFunctionMode which records every tensor an op *reads* that the capture did
not itself produce (those would live in the graph's private pool). After the helper returns and
the caller drops its own references, each of those tensors must still be alive.
"""
from __future__ import annotations

import contextlib
import gc
import types
import weakref

import pytest

torch = pytest.importorskip("torch")
from torch.overrides import TorchFunctionMode  # noqa: E402

import pipefill as pf  # noqa: E402
import pipefill.torch as pft  # noqa: E402


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


class _CaptureRecorder(TorchFunctionMode):
    """Weak references to the tensors ops read during the capture, except the capture's own."""

    def __init__(self):
        super().__init__()
        self.read = []
        self._produced = []  # strong refs during the capture, so ids are not reused

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        produced = {id(t) for t in self._produced}
        for t in _tensors((args, kwargs)):
            if id(t) not in produced:
                self.read.append((getattr(func, "__name__", str(func)), weakref.ref(t)))
        result = func(*args, **kwargs)
        self._produced.extend(_tensors(result))
        return result

    def finish(self):
        self._produced.clear()


class _FakeCuda:
    """Stand-ins for what graph_fill_job uses of torch.cuda (CPU tensors, eager 'capture')."""

    def __init__(self, monkeypatch):
        self.recorder = _CaptureRecorder()
        self.capture_modes = []
        recorder, modes = self.recorder, self.capture_modes

        class Stream:
            def __init__(self, *args, **kwargs):
                pass

            def wait_stream(self, other):
                pass

            def synchronize(self):
                pass

        class Graph:
            """capture_begin/capture_end, what graph_fill_job captures with (torch.cuda.graph
            would synchronize the device on entry: issue 24)."""

            def __init__(self, keep_graph=False):
                assert keep_graph, "graph_fill_job must keep the graph for raw_cuda_graph()"

            def capture_begin(self, pool=None, capture_error_mode="global"):
                modes.append(capture_error_mode)
                recorder.__enter__()

            def capture_end(self):
                recorder.__exit__(None, None, None)
                recorder.finish()

            def raw_cuda_graph(self):
                return 0

            def instantiate(self):
                pass

        monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
        monkeypatch.setattr(torch.cuda, "ExternalStream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)


class _FakeRuntime:
    backend = pf.Backend.CUDA

    def __init__(self):
        self.created = []

    def capture_stream(self):
        return types.SimpleNamespace(handle=1, close=lambda: None)

    def capture_context(self, stream):
        return contextlib.nullcontext()

    def create_job(self, desc):
        self.created.append(desc)
        return types.SimpleNamespace(desc=desc)


def _dead(recorder):
    return sorted({name for name, ref in recorder.read if ref() is None})


def test_module_inference_job_keeps_every_tensor_its_graph_reads(monkeypatch):
    fake = _FakeCuda(monkeypatch)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 4)).eval()
    inputs = torch.randn(32, 8)
    fill = pft.module_inference_job(_FakeRuntime(), model, inputs, batch=4, item_cost_us=5.0,
                                    warmup=0)
    # The capture read the inputs, the row offsets, the index word and the weights.
    assert len(fake.recorder.read) >= 6
    del model, inputs
    gc.collect()
    assert _dead(fake.recorder) == [], "tensors the captured graph reads were freed"
    assert fill.outputs.shape == (32, 4)


def test_graph_fill_job_keeps_the_step_closure_and_keep_alive(monkeypatch):
    fake = _FakeCuda(monkeypatch)
    table = torch.arange(10.0)
    out = torch.zeros(10)
    scale = torch.tensor(3.0)

    def make_step(table, scale):
        def step(index):
            out.index_copy_(0, index.view(1), table.index_select(0, index.view(1)) * scale)
        return step

    step = make_step(table, scale)
    extra = torch.ones(2)
    extra_ref = weakref.ref(extra)
    fill = pft.graph_fill_job(_FakeRuntime(), step, 10, outputs=out, item_cost_us=2.0, warmup=0,
                              keep_alive=(extra,))
    del step, table, scale, extra
    gc.collect()
    assert _dead(fake.recorder) == []
    assert extra_ref() is not None
    assert fill.job.desc.items == 10


def test_capture_uses_the_thread_local_error_mode(monkeypatch):
    # "global" would let the executor thread's event queries during the capture invalidate it.
    fake = _FakeCuda(monkeypatch)
    pft.graph_fill_job(_FakeRuntime(), lambda index: index + 1, 3, item_cost_us=1.0, warmup=0)
    assert fake.capture_modes == ["thread_local"]


def test_graph_fill_jobs_refuse_torch_without_keep_graph(monkeypatch):
    _FakeCuda(monkeypatch)
    monkeypatch.setattr(torch, "__version__", "2.7.1")
    with pytest.raises(pf.PipeFillError) as raised:
        pft.graph_fill_job(_FakeRuntime(), lambda index: None, 3, item_cost_us=1.0)
    assert "torch >= 2.8" in raised.value.message and "2.7.1" in raised.value.message
