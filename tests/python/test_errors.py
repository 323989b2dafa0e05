"""Every error path raises PipeFillError with the result code and the C library's message.

Where the C API can be called directly, the expected message is what libpipefill itself says
for the same call (through ctypes, conftest.CLib), compared after masking pointer values.
"""
from __future__ import annotations

import ctypes
import math
import re

import pytest

import pipefill as pf
from pipefill import PipeFillError, Result


def masked(text: str) -> str:
    return re.sub(r"0x[0-9a-fA-F]+", "0x*", text)


def raises(code: Result, call, *args, **kwargs) -> PipeFillError:
    with pytest.raises(PipeFillError) as info:
        call(*args, **kwargs)
    error = info.value
    assert error.code == code, error
    assert error.message and str(error).startswith(f"[{code.name}]")
    return error


# ---- configuration: the C validation, message for message ------------------------------------

BAD_CONFIGS = [
    dict(backend=9),
    dict(device=-2),
    dict(stage_count=0),
    dict(stage_id=4, stage_count=4),
    dict(reserved_sms=-3),
    dict(safety_margin_us=-1.5),
    dict(safety_margin_fraction=1.0),
    dict(prediction_quantile=0.0),
    dict(prediction_quantile=1.5),
    dict(min_samples=-4),
    dict(policy=7),
    dict(log_level=11),
]


@pytest.mark.parametrize("fields", BAD_CONFIGS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_bad_config_values_raise_the_c_message(clib, fields):
    error = raises(Result.INVALID_ARGUMENT, pf.Runtime, backend=fields.get("backend", "sim"),
                   **{k: v for k, v in fields.items() if k != "backend"})
    raw = dict(fields)
    raw.setdefault("backend", int(pf.Backend.SIM))
    code, rt, message = clib.runtime_create(clib.config(**raw))
    assert code == int(Result.INVALID_ARGUMENT) and rt is None
    assert error.message == message
    # The message names the field and the bad value.
    field = next(k for k in fields if k != "stage_count" or len(fields) == 1)
    assert field.split("_")[0] in error.message


def test_bad_environment_raises_the_c_message(clib, monkeypatch):
    monkeypatch.setenv("PIPEFILL_QUANTILE", "7")
    error = raises(Result.INVALID_ARGUMENT, pf.Runtime, backend="sim")
    code, _, message = clib.runtime_create(clib.config(backend=int(pf.Backend.SIM)))
    assert code == int(Result.INVALID_ARGUMENT) and error.message == message
    assert "PIPEFILL_QUANTILE" in error.message


def test_bad_gated_quantile_names_the_field_or_the_variable(clib, monkeypatch):
    error = raises(Result.INVALID_ARGUMENT, pf.Runtime, backend="sim", gated_prediction_quantile=1.5)
    assert "config.gated_prediction_quantile = 1.5 is outside (0, 1]" in error.message
    monkeypatch.setenv("PIPEFILL_GATED_QUANTILE", "0")
    error = raises(Result.INVALID_ARGUMENT, pf.Runtime, backend="sim")
    # The ctypes caller has the version-2 layout (no such field): it reads the variable too.
    code, _, message = clib.runtime_create(clib.config(backend=int(pf.Backend.SIM)))
    assert code == int(Result.INVALID_ARGUMENT) and error.message == message
    assert "PIPEFILL_GATED_QUANTILE" in error.message and "= 0 " in error.message


def test_python_side_config_errors_name_the_value():
    assert "bogus" in raises(Result.INVALID_ARGUMENT, pf.Runtime, backend="bogus").message
    assert "nope" in raises(Result.INVALID_ARGUMENT, pf.Runtime, policy="nope").message
    assert "-5" in raises(Result.INVALID_ARGUMENT, pf.Runtime, arena_bytes=-5).message
    assert "12Q" in raises(Result.INVALID_ARGUMENT, pf.Runtime, arena_bytes="12Q").message
    assert "4294967296" in raises(Result.INVALID_ARGUMENT, pf.Runtime, stage_id=1 << 32).message
    with pytest.raises(TypeError):
        pf.Runtime(stage_id="1")


def test_cuda_backend_without_a_gpu(clib):
    try:
        with pf.Runtime(backend="cuda"):
            pytest.skip("a usable GPU is present: the CUDA backend starts")
    except PipeFillError as error:
        assert error.code in (Result.NOT_SUPPORTED, Result.NO_DEVICE)
        code, _, message = clib.runtime_create(clib.config(backend=int(pf.Backend.CUDA)))
        # Same verdict as the C library (which may be built with or without CUDA).
        assert code in (int(Result.NOT_SUPPORTED), int(Result.NO_DEVICE))
        if code == int(error.code):
            assert masked(message) == masked(error.message)


def test_host_backend_matches_the_c_library(clib):
    code, rt, message = clib.runtime_create(clib.config(backend=int(pf.Backend.HOST)))
    if rt is not None:
        clib.lib.pfRuntimeDestroy(rt)
    try:
        with pf.Runtime(backend="host") as runtime:
            assert runtime.backend == pf.Backend.HOST
            assert code == 0
    except PipeFillError as error:
        assert error.code == Result.NOT_SUPPORTED and code == int(Result.NOT_SUPPORTED)
        assert error.message == message


# ---- bubbles ---------------------------------------------------------------------------------

@pytest.fixture
def sim():
    world = pf.SimWorld(1)
    rt = pf.Runtime(backend="sim", sim_world=world, device=0)
    stream = world.stream(0, -1)
    yield world, rt, stream
    if not rt.closed:
        if rt.in_bubble:
            rt.bubble_end(stream)
        rt.close()
    world.close()


@pytest.fixture
def c_sim(clib):
    """A C runtime on its private world and a stream of that world (through ctypes)."""
    code, rt, message = clib.runtime_create(clib.config(backend=int(pf.Backend.SIM)))
    assert code == 0, message
    world = ctypes.c_void_p()
    assert clib.lib.pfRuntimeGetSimWorld(rt, ctypes.byref(world)) == 0
    stream = ctypes.c_void_p()
    assert clib.lib.pfSimStreamCreate(world, 0, -1, ctypes.byref(stream)) == 0
    yield clib, rt, stream
    clib.lib.pfBubbleEnd(rt, stream)
    assert clib.lib.pfRuntimeDestroy(rt) == 0


def test_end_without_begin(sim, c_sim):
    _, rt, stream = sim
    error = raises(Result.INVALID_STATE, rt.bubble_end, stream)
    clib, crt, cstream = c_sim
    assert clib.lib.pfBubbleEnd(crt, cstream) == int(Result.INVALID_STATE)
    assert error.message == clib.message()


def test_nested_begin(sim, c_sim):
    _, rt, stream = sim
    rt.bubble_begin(stream)
    error = raises(Result.INVALID_STATE, rt.bubble_begin, stream)
    clib, crt, cstream = c_sim
    assert clib.lib.pfBubbleBegin(crt, cstream, None) == 0
    assert clib.lib.pfBubbleBegin(crt, cstream, None) == int(Result.INVALID_STATE)
    assert masked(error.message) == masked(clib.message())
    assert rt.in_bubble  # the failed call changed nothing
    rt.bubble_end(stream)


def test_null_stream_on_the_simulator(sim, c_sim):
    _, rt, _ = sim
    error = raises(Result.INVALID_ARGUMENT, rt.bubble_begin, None)
    clib, crt, _ = c_sim
    assert clib.lib.pfBubbleBegin(crt, None, None) == int(Result.INVALID_ARGUMENT)
    assert error.message == clib.message()
    assert not rt.in_bubble


def test_foreign_stream(sim):
    _, rt, _ = sim
    other = pf.SimWorld(1)
    error = raises(Result.INVALID_ARGUMENT, rt.bubble_begin, other.stream())
    assert "not a main-job stream" in error.message
    raises(Result.INVALID_ARGUMENT, rt.bubble_begin, 12345)
    other.close()


def test_end_on_another_stream(sim):
    world, rt, stream = sim
    rt.bubble_begin(stream)
    error = raises(Result.INVALID_STATE, rt.bubble_end, world.stream(0, -1))
    assert "is not the stream" in error.message
    rt.bubble_end(stream)


@pytest.mark.parametrize("hint, c_hint, words", [
    (dict(kind=42), dict(kind=42), "hint->kind = 42"),
    (dict(expected_us=math.inf), dict(expected_duration_us=math.inf), "expected_duration_us = inf"),
    (dict(label="x" * 200), dict(label=b"x" * 200), "200 characters"),
    (dict(lent_bytes=64), dict(lent_bytes=64), "lent_bytes = 64"),
])
def test_bad_hints(sim, c_sim, hint, c_hint, words):
    _, rt, stream = sim
    error = raises(Result.INVALID_ARGUMENT, rt.bubble_begin, stream, **hint)
    clib, crt, cstream = c_sim
    from conftest import CHint
    h = CHint(0, None, 0.0, 0, None)
    for key, value in c_hint.items():
        setattr(h, key, value)
    assert clib.lib.pfBubbleBegin(crt, cstream, ctypes.byref(h)) == int(Result.INVALID_ARGUMENT)
    assert error.message == clib.message()
    assert words in error.message


def test_bad_bubble_kind_name(sim):
    _, rt, stream = sim
    assert "sideways" in raises(Result.INVALID_ARGUMENT, rt.bubble, stream, kind="sideways").message


def test_iteration_end_inside_a_bubble(sim):
    _, rt, stream = sim
    with rt.bubble(stream):
        error = raises(Result.INVALID_STATE, rt.iteration_end)
        assert "still open" in error.message


def test_close_inside_a_bubble_changes_nothing(sim):
    _, rt, stream = sim
    job = rt.create_job(pf.SimTicketJob(items=10, item_cost_us=1.0))
    rt.bubble_begin(stream)
    error = raises(Result.INVALID_STATE, rt.close)
    assert "bubble is still open" in error.message
    assert not rt.closed and not job.closed  # the refused close destroyed nothing
    rt.bubble_end(stream)
    rt.close()
    assert job.closed


# ---- jobs ------------------------------------------------------------------------------------

def test_job_that_does_not_fit_the_arena(sim):
    world = pf.SimWorld(1)
    with pf.Runtime(backend="sim", sim_world=world, device=0, arena_bytes="1M") as rt:
        error = raises(Result.OUT_OF_MEMORY, rt.create_job,
                       pf.SimTicketJob(items=10, item_cost_us=1.0, resident_bytes=2 << 20))
        assert "2097152" in error.message or "2 MiB" in error.message or "2.0" in error.message
        assert rt.jobs == []
    world.close()


@pytest.mark.parametrize("spec, words", [
    (pf.SimTicketJob(items=0, item_cost_us=1.0), "item_count = 0"),
    (pf.SimTicketJob(items=10, item_cost_us=0.0), "item_cost_hint_us = 0"),
    (pf.SimTicketJob(items=10, item_cost_us=math.nan), "not finite"),
    (pf.SimTicketJob(items=10, item_cost_us=1.0, kind=5), "kind"),
    (pf.SimTicketJob(items=10, item_cost_us=1.0, configs=[pf.JobConfig(1.0, parallelism=-2)]),
     "parallelism = -2"),
])
def test_bad_job_descriptions(sim, spec, words):
    _, rt, _ = sim
    assert words in raises(Result.INVALID_ARGUMENT, rt.create_job, spec).message


def test_wait_timeout(sim):
    _, rt, _ = sim
    job = rt.create_job(pf.SimTicketJob(items=10, item_cost_us=1.0, name="idle"))
    error = raises(Result.TIMEOUT, job.wait, timeout=0.01)
    assert "idle" in error.message
    raises(Result.INVALID_ARGUMENT, job.wait, timeout=math.nan)


def test_wait_on_a_cancelled_job(sim):
    _, rt, _ = sim
    job = rt.create_job(pf.SimTicketJob(items=10, item_cost_us=1.0, name="doomed"))
    job.cancel()
    assert "doomed" in raises(Result.CANCELLED, job.wait, timeout=1).message


def test_a_failing_job_ends_itself_not_the_trainer(sim):
    world, rt, stream = sim
    bad = rt.create_job(pf.SimTicketJob(items=10**6, item_cost_us=10.0, fail_at_slice=2,
                                        name="fails"))
    for _ in range(4):
        stream.launch_kernel(100, 132)
        with rt.bubble(stream, expected_us=300):
            stream.delay(300)
        rt.iteration_end()
    world.run_until_idle()
    rt.synchronize()
    error = raises(Result.JOB_FAILED, bad.wait, timeout=1)
    assert "fails" in error.message
    assert bad.status == pf.JobStatus.FAILED and bad.info().error != Result.SUCCESS
    assert bad.counts().slices == 2  # never launched again after its failure
    # The runtime goes on: a new job fills the next bubbles.
    good = rt.create_job(pf.SimTicketJob(items=100, item_cost_us=1.0))
    for _ in range(2):
        with rt.bubble(stream, expected_us=300):
            stream.delay(300)
        rt.iteration_end()
    world.run_until_idle()
    assert good.wait(timeout=5).status == pf.JobStatus.COMPLETED
    assert rt.stats().jobs_failed == 1


@pytest.mark.parametrize("spec, words", [
    (pf.MlpInference(rows=0), "invalid mlp-inference shape"),
    (pf.EncoderInference(hidden=30, heads=4), "hidden divisible by heads"),
    (pf.Training(parallelism=2), "parallelism 1, got 2"),
    (pf.MlpInference(items=0), "items must be > 0"),
    (pf.MlpInference(execution="sideways"), "sideways"),
])
def test_bad_fill_job_parameters(sim, spec, words):
    _, rt, _ = sim
    assert words in raises(Result.INVALID_ARGUMENT, rt.create_job, spec).message
    assert rt.jobs == []


def test_fill_job_output_errors(sim):
    _, rt, _ = sim
    job = rt.create_job(pf.MlpInference(items=10, keep_every=2))
    assert "item 3 has no kept output" in raises(Result.INVALID_STATE, job.output, 3).message
    assert ">= item count 10" in raises(Result.INVALID_ARGUMENT, job.output, 10).message
    assert "not training" in raises(Result.INVALID_ARGUMENT, job.evaluation_loss).message
    assert "not a SimTicketJob" in raises(Result.INVALID_STATE, job.counts).message


# ---- traces ----------------------------------------------------------------------------------

def test_trace_to_an_unwritable_path(sim, c_sim, tmp_path):
    _, rt, _ = sim
    path = str(tmp_path / "missing" / "trace.json")
    error = raises(Result.IO, rt.write_trace, path)
    clib, crt, _ = c_sim
    assert clib.lib.pfTraceWrite(crt, path.encode()) == int(Result.IO)
    assert error.message == clib.message()
    assert path in error.message
    raises(Result.INVALID_ARGUMENT, rt.write_trace, "")


# ---- simulated world -------------------------------------------------------------------------

def test_bad_world(clib):
    error = raises(Result.INVALID_ARGUMENT, pf.SimWorld, 0)
    world = ctypes.c_void_p()
    assert clib.lib.pfSimWorldCreate(0, None, ctypes.c_uint64(0), ctypes.byref(world)) == 1
    assert error.message == clib.message()


def test_bad_stream_and_kernel(clib):
    world = pf.SimWorld(1)
    error = raises(Result.INVALID_ARGUMENT, world.stream, 3)
    assert "3" in error.message
    stream = world.stream()
    error = raises(Result.INVALID_ARGUMENT, stream.launch_kernel, -1.0, 10)
    assert "-1" in error.message
    stream.close()
    raises(Result.INVALID_ARGUMENT, stream.launch_kernel, 1.0, 10)  # a destroyed stream
    world.close()


def test_world_busy_while_runtimes_are_attached(clib):
    world = pf.SimWorld(2)
    rt = pf.Runtime(backend="sim", sim_world=world, device=1)
    error = raises(Result.BUSY, world.close)
    assert "1 runtime" in error.message
    assert not world.closed
    rt.close()
    world.close()
    assert world.closed


def test_runtime_on_a_missing_device():
    world = pf.SimWorld(2)
    error = raises(Result.INVALID_ARGUMENT, pf.Runtime, backend="sim", sim_world=world, device=2)
    assert "2" in error.message
    world.close()


# ---- closed handles --------------------------------------------------------------------------

def test_closed_handles_raise_instead_of_crashing():
    world = pf.SimWorld(1)
    rt = pf.Runtime(backend="sim", sim_world=world, device=0)
    stream = world.stream(0, -1)
    job = rt.create_job(pf.SimTicketJob(items=10, item_cost_us=1.0))
    rt.close()
    rt.close()  # idempotent
    for call in (rt.stats, rt.iteration_end, rt.synchronize, lambda: rt.bubble_begin(stream),
                 lambda: rt.write_trace("x.json"), lambda: rt.config, job.info, job.cancel,
                 lambda: job.wait(1), lambda: rt.create_job(pf.SimTicketJob(10, 1.0))):
        assert "closed" in raises(Result.INVALID_STATE, call).message
    job.close()  # idempotent after the runtime closed it
    world.close()
    assert "closed" in raises(Result.INVALID_STATE, world.stream).message
    assert "closed" in raises(Result.INVALID_STATE, pf.Runtime, backend="sim",
                              sim_world=world).message


def test_private_world_outlived_by_its_view():
    rt = pf.Runtime(backend="sim")
    world = rt.sim_world
    error = raises(Result.INVALID_STATE, world.close)
    assert "private world" in error.message
    rt.close()
    assert "closed" in raises(Result.INVALID_STATE, world.run_until_idle).message
