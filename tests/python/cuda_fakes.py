"""torch.cuda stand-ins for the CPU tests of the CUDA path of inference_job / training_job /
graph_fill_job (issue 18): test_cuda_streaming_jobs.py, test_cuda_training_capture.py,
test_cuda_job_creation.py and test_fill_capture.py import them by name from this folder (like
trace_checks); a test takes the ``fake_cuda`` fixture by importing it.

No GPU here, so torch.cuda's streams, events and graph capture are replaced by stand-ins: the
capture records every torch op ``step(index)`` makes (a TorchFunctionMode) and a replay runs the
recorded ops again on the same tensors, reading the index word's current value - what a CUDA
graph replay does. A fake runtime plays the gated graph job: per bubble it claims items below
the job's available bound, writes each into the index word, replays the graph, then reports
them complete (items_completed), as the harvest does.
"""
from __future__ import annotations

import contextlib
import threading
import types

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import pipefill as pf
from pipefill.torch import _cuda_ring as tcj

DIM, OUT, BATCH, SLOTS = 8, 4, 4, 3


def _map(value, env):
    if isinstance(value, torch.Tensor):
        return env.get(id(value), value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, env) for k, v in value.items()}
    return value


def _bind(captured, replayed, env):
    if isinstance(captured, torch.Tensor):
        env[id(captured)] = replayed
    elif isinstance(captured, (list, tuple)) and isinstance(replayed, (list, tuple)):
        for c, r in zip(captured, replayed):
            _bind(c, r, env)


class _Recorder(TorchFunctionMode):
    """Every op of the capture, with its arguments and results (kept alive, so ids stay unique)."""

    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, result, torch.is_grad_enabled()))
        return result


class FakeGraph:
    """torch.cuda.CUDAGraph: capture_begin/capture_end record the ops between them (what the
    CUDA path uses; torch.cuda.graph(...) is made to fail, see fake_cuda)."""

    captures = []  # (graph, whether the runtime's capture context was entered) per capture_begin

    def __init__(self, keep_graph=False):
        assert keep_graph
        self.ops = []
        self._recorder = None
        self.replays = 0

    def capture_begin(self, pool=None, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"
        FakeGraph.captures.append((self, FakeRuntime.contexts_entered > 0))
        self._recorder = _Recorder(self.ops)
        self._recorder.__enter__()

    def capture_end(self):
        self._recorder.__exit__(None, None, None)
        self._recorder = None

    def instantiate(self):
        pass

    def raw_cuda_graph(self):
        return self

    def replay(self):
        """The recorded ops again: tensors the capture made are the replay's own results, every
        other tensor (the rings, the index word, the weights) is the same object."""
        self.replays += 1
        env = {}
        for func, args, kwargs, result, grad_mode in self.ops:
            with torch.set_grad_enabled(grad_mode):
                _bind(result, func(*_map(args, env), **_map(kwargs, env)), env)


class FakeStream:
    waits = []  # (waiting stream, stream waited for)

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        FakeStream.waits.append((self, other))

    def synchronize(self):
        pass


class FakeEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


CURRENT_STREAM = FakeStream()


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's streams, events and capture replaced by stand-ins. Yields the list of
    device-draining calls made (torch.cuda.synchronize / empty_cache, and entering
    torch.cuda.graph(...), whose __enter__ does both)."""
    drains = []

    def graph(*args, **kwargs):
        drains.append("torch.cuda.graph")
        raise AssertionError("torch.cuda.graph(...) synchronizes the device and empties the cache")

    FakeGraph.captures = []
    FakeStream.waits = []
    FakeRuntime.contexts_entered = 0
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(torch.cuda, "ExternalStream", FakeStream)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: CURRENT_STREAM)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: drains.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: drains.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(tcj, "_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(tcj, "_pinned", lambda shape, dtype: torch.zeros(shape, dtype=dtype))
    yield drains


class FakeNative:
    def __init__(self, job):
        self.job = job

    def set_available(self, available):
        self.job.set_available(available)

    def end_input(self):
        with self.job.lock:
            self.job.items = self.job.available

    def release_item_fn(self):
        pass


class FakeJob:
    """A gated graph job: claims below the available bound only, one replay per item."""

    def __init__(self, runtime, spec):
        self.runtime, self.spec, self.name = runtime, spec, spec.name
        self.lock = threading.Lock()
        self.items = spec.items
        self.available = spec.available
        self.claimed = 0
        self.completed = 0
        self.bounds = []  # (available, items drained when it was raised)
        self.drained = lambda: 0  # the test points it at the job's drained count
        self.before_replay = lambda: None
        self.closed = False
        self.failure = None
        self._native = FakeNative(self)

    def _fail(self, message):
        # pipefill.Job._fail: the job ends as failed on the Python side (the failing feeder calls
        # it); the fake records the message and schedules nothing more.
        with self.lock:
            if self.failure is None:
                self.failure = message
            self.available = self.claimed

    def set_available(self, available):
        with self.lock:
            assert available >= self.claimed
            self.bounds.append((available, self.drained()))
            self.available = available

    def run_bubble(self, budget):
        with self.lock:
            end = min(self.available, self.items, self.claimed + budget)
            start = self.claimed
        for k in range(start, end):
            self.spec.index_word.fill_(k)
            self.before_replay()
            self.spec.graph.replay()
        with self.lock:
            self.claimed = self.completed = end

    def info(self):
        with self.lock:
            done = self.completed >= self.items
        return types.SimpleNamespace(items_completed=self.completed, item_count=self.items,
                                     status=pf.JobStatus.COMPLETED if done else pf.JobStatus.RUNNING,
                                     error=pf.Result.SUCCESS)

    def cancel(self):
        pass

    def wait(self, timeout=None):
        return self.info()

    def close(self):
        self.closed = True


class FakeCaptureStream:
    def __init__(self, runtime):
        self.runtime = runtime
        self.handle = 1
        self.closed = False

    def close(self):
        self.closed = True


class FakeRuntime:
    backend = pf.Backend.CUDA
    in_bubble = False
    contexts_entered = 0  # capture contexts open now (pfGraphCaptureContextPush without pop)

    def __init__(self):
        self.jobs = []
        self._bubble_index = 0
        self._iteration_ends = 0
        self._hooks = []
        self.capture_streams = []

    def capture_stream(self):
        stream = FakeCaptureStream(self)
        self.capture_streams.append(stream)
        return stream

    @contextlib.contextmanager
    def capture_context(self, stream):
        assert stream in self.capture_streams and not stream.closed
        FakeRuntime.contexts_entered += 1
        try:
            yield
        finally:
            FakeRuntime.contexts_entered -= 1

    def create_job(self, spec):
        job = FakeJob(self, spec)
        self.jobs.append(job)
        return job

    def synchronize(self):
        pass

    def _add_iteration_end_hook(self, hook):
        self._hooks.append(hook)

    def _remove_iteration_end_hook(self, hook):
        self._hooks = [h for h in self._hooks if h != hook]

    def iteration_end(self):
        self._iteration_ends += 1
        for hook in list(self._hooks):
            hook()



def model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Linear(16, OUT)).eval()


def samples(count):
    g = torch.Generator().manual_seed(7)
    return [torch.randn(DIM, generator=g) for _ in range(count)]



def training_data(count):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, OUT, generator=g))
            for _ in range(count)]
