"""The CUDA path of inference_job / training_job, on CPU with torch's capture mocked (issue 18).

No GPU here, so torch.cuda's streams, events and graph capture are replaced by stand-ins: the
capture records every torch op ``step(index)`` makes (a TorchFunctionMode) and a replay runs the
recorded ops again on the same tensors, reading the index word's current value - what a CUDA
graph replay does. A fake runtime plays the gated graph job: per bubble it claims items below
the job's available bound, writes each into the index word, replays the graph, then reports
them complete (items_completed), as the harvest does. So the ring's index -> slot mapping, the
feeder's staging and the bound (available <= drained + slots) are the code under test: a wrong
slot gives wrong outputs, a feeder running ahead of the drainer overwrites a slot in use.
"""
from __future__ import annotations

import contextlib
import gc
import threading
import time
import types
import weakref

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import eager_reference
import pipefill as pf
import pipefill.torch as pft
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


def run_until(rt, job, done, budget, deadline_s=60.0):
    """Bubbles until done(); the feeder and drainer threads run between them."""
    deadline = time.monotonic() + deadline_s
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"the job did not finish in {deadline_s} s")
        job.run_bubble(budget)
        time.sleep(0.0005)


@pytest.mark.parametrize("budget", [1, 2, SLOTS + 2])
def test_graph_over_the_ring_gives_eager_outputs_in_order_once(fake_cuda, budget):
    module = model()
    data = samples(20 * SLOTS * BATCH + 3)  # 61 items, the last one 3 rows: 20x the ring
    got = []
    rt = FakeRuntime()
    job = pft.inference_job(rt, module, data, batch_size=BATCH, slots=SLOTS, item_cost_us=10.0,
                            sink=lambda i, y: got.append((i, y.clone())))
    assert isinstance(job, tcj.CudaInferenceJob)
    fake = rt.jobs[0]
    fake.drained = lambda: job._drained
    assert fake.spec.available == 0, "nothing is claimable before the feeder staged it"
    assert fake.spec.items == 61
    run_until(rt, fake, lambda: job.progress().finished or job.error is not None, budget)
    job.wait(timeout=30)
    assert job.error is None
    assert [i for i, _ in got] == list(range(61)), "in order, once each"
    with torch.no_grad():
        expected = [module(torch.stack(data[k:k + BATCH])) for k in range(0, len(data), BATCH)]
    assert got[-1][1].shape == (3, OUT), "the partial last batch keeps its 3 rows"
    for (i, y), e in zip(got, expected):
        # The slot holds the batch padded with zero rows; rows are computed independently, but a
        # GEMM of 4 rows may sum in another order than one of 3: equal to float32 rounding.
        assert torch.allclose(y, e, rtol=1e-6, atol=1e-6), f"item {i}"
    assert all(a <= drained + SLOTS for a, drained in fake.bounds), fake.bounds
    assert max(a for a, _ in fake.bounds) == 61
    job.close()


def test_feeder_never_runs_more_than_the_ring_ahead_of_the_drainer(fake_cuda):
    """A sink that blocks until released: the feeder must stop at `slots` staged items."""
    release, entered = threading.Event(), threading.Event()
    seen = []

    def slow_sink(i, y):
        seen.append(i)
        entered.set()
        release.wait(30)

    rt = FakeRuntime()
    job = pft.inference_job(rt, model(), samples(12 * BATCH), batch_size=BATCH, slots=SLOTS,
                            item_cost_us=10.0, sink=slow_sink)
    fake = rt.jobs[0]
    fake.drained = lambda: job._drained
    with job._cv:  # the feeder stages the ring full before any item ran
        assert job._cv.wait_for(lambda: job._staged >= SLOTS, timeout=10)
    fake.run_bubble(100)  # items 0..2 run; the drainer takes item 0 and blocks in the sink
    assert entered.wait(10)
    for _ in range(20):  # more bubbles: nothing more is claimable
        fake.run_bubble(100)
    with job._cv:  # a feeder that ignored the drainer would stage item 3 now
        overran = job._cv.wait_for(lambda: job._staged > SLOTS, timeout=0.5)
    assert not overran and fake.available == SLOTS, "stopped at the ring's size"
    assert fake.claimed == SLOTS and seen == [0]
    release.set()
    run_until(rt, fake, lambda: job.progress().finished or job.error is not None, 100)
    job.wait(timeout=30)
    assert seen == list(range(12))
    assert all(a <= drained + SLOTS for a, drained in fake.bounds), fake.bounds
    job.close()


def test_slot_of_maps_every_index_onto_the_ring():
    index = torch.zeros((), dtype=torch.int64)
    for k in range(3 * SLOTS + 1):
        index.fill_(k)
        assert tcj.slot_of(index, SLOTS).tolist() == [k % SLOTS]


def test_a_batch_of_another_shape_ends_the_job_with_its_item(fake_cuda):
    data = [torch.zeros(BATCH, DIM)] * 2 + [torch.zeros(BATCH, DIM + 1)]
    rt = FakeRuntime()
    job = pft.inference_job(rt, model(), data, batch_size=None, slots=SLOTS, item_cost_us=1.0,
                            sink=lambda i, y: None)
    run_until(rt, rt.jobs[0], lambda: job.error is not None or job.progress().finished, 1)
    with pytest.raises(pft.FillJobError, match=r"item 2: the dataset yielded a batch of shape "
                                               r"\(4, 9\)"):
        job.wait(timeout=10)
    assert "item 2: the dataset yielded a batch of shape (4, 9)" in rt.jobs[0].failure
    job.close()


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


def test_graph_job_available_holds_claims_until_raised():
    """GraphJob.available (pfGraphJobDesc_t.available), which the CUDA path creates its job with,
    on the real runtime (host backend: the graph job's items are counted)."""
    try:
        rt = pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                        safety_margin_fraction=0.0, min_samples=1000000)
    except pf.PipeFillError as error:
        if error.code == pf.Result.NOT_SUPPORTED:
            pytest.skip(f"no host device in this build: {error.message}")
        raise
    with pytest.raises(pf.PipeFillError, match=r"GraphJob.available -1 must be an int >= 0"):
        rt.create_job(pf.GraphJob(items=5, item_cost_us=50.0, available=-1))
    job = rt.create_job(pf.GraphJob(items=5, item_cost_us=50.0, available=0, name="held"))
    stream = rt.high_priority_stream()

    def bubbles(n, until=lambda: False):
        """n bubbles, or (with until) bubbles until until() holds, at most 2000: a loaded machine
        may skip some bubbles (late, too short), so the test waits on counts, not on a number of
        bubbles."""
        for _ in range(2000 if n is None else n):
            if until():
                break
            with rt.bubble(stream, expected_us=2000.0):
                pf.host_stream_delay(stream, 2000.0)
            rt.iteration_end()
            pf.host_stream_synchronize(stream)
            rt.synchronize()
        rt.synchronize()

    bubbles(3)
    assert job.graph_counts().items_run == 0, "nothing claimable below available = 0"
    job._native.set_available(3)
    bubbles(None, until=lambda: job.graph_counts().items_run >= 3)
    bubbles(3)  # more bubbles, and still no claim past the bound
    counts = job.graph_counts()
    assert counts.items_run == 3 and counts.duplicates == 0 and counts.index_mismatches == 0
    job._native.set_available(5)
    bubbles(None, until=lambda: job.graph_counts().items_run >= 5)
    assert job.graph_counts().items_run == 5
    job.wait(5)
    job.close()
    rt.close()


def _training_data(count):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, OUT, generator=g))
            for _ in range(count)]


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
    steps, data = 10, _training_data(6)
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


# ---- issue 24: job creation on CUDA ---------------------------------------------------------

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
                             nn.functional.mse_loss, _training_data(3), steps=3, slots=SLOTS,
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
                                  _training_data(1)[0], SLOTS, 5, "t", 0, 10.0)
    gc.collect()
    assert len(clones) == 4 + 4  # 4 parameter tensors, 4 momentum buffers
    alive = [ref for ref in clones if ref() is not None]
    assert alive == [], f"{len(alive)} clones outlived the job's creation"
    assert capture.graph_job.job is rt.jobs[0]


def test_training_refuses_a_learning_rate_scheduler(fake_cuda):
    rt = FakeRuntime()
    module = model()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    with pytest.raises(pf.PipeFillError, match=r"optimizer SGD has a learning-rate scheduler "
                                               r"attached \(param group 0 has 'initial_lr'\).*"
                                               r"silently ignored") as caught:
        pft.training_job(rt, module, opt, nn.MSELoss(), _training_data(2), steps=3)
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
    batches = _training_data(2) + [(torch.randn(BATCH - 1, DIM), torch.randn(BATCH - 1, OUT))]
    with pytest.raises(ValueError, match=r"batch 2 has shapes \(\(3, 8\), \(3, 4\)\), the first "
                                         r"batch \(\(4, 8\), \(4, 4\)\)"):
        pft.training_job(rt, module, opt, nn.functional.mse_loss, batches, steps=3)
    assert rt.jobs == []
    job = pft.training_job(rt, module, opt, nn.functional.mse_loss,
                           DataLoader(dataset, batch_size=4, drop_last=True), steps=2, slots=SLOTS,
                           item_cost_us=10.0)
    assert len(rt.jobs) == 1
    job.close()


def test_ring_copies_are_ordered_after_the_zero_fill(fake_cuda):
    """The ring's zeros are written on the current stream, its copies on a stream of its own: the
    copy stream waits for the current stream on the device before slot 0's first copy."""
    ring = tcj.DeviceRing([torch.zeros(BATCH, DIM)], SLOTS, torch.device("cpu"))
    assert (ring.stream, CURRENT_STREAM) in FakeStream.waits


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
