"""pipefill with the user's own torch tooling (issue 17, items 3 and 5): the fill partition as
the complement of a torch green context / SM partition / SM count, the fill streams as
torch.cuda.ExternalStream, and bubbles in the user's torch.profiler trace that pipefill-analyze
reads as bubble markers. CPU tests use stand-ins where torch's objects need a GPU; the GPU part
skips without one."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

import pipefill as pf
from pipefill import Result

torch = pytest.importorskip("torch")
pft = pytest.importorskip("pipefill.torch")


class FakeGreenContext:
    """What pipefill reads of torch.cuda.green_contexts.GreenContext / SMPartition."""

    def __init__(self, sm_count, device_id=0):
        self.sm_count = sm_count
        self.device_id = device_id


# ---- the complement of the user's partition ---------------------------------------------------

@pytest.mark.parametrize("main, expected", [(16, 16), (FakeGreenContext(100), 100)])
def test_the_main_jobs_sms_become_the_reserved_sms(main, expected):
    config = pft.complement_config(main, backend="sim", stage_id=1)
    assert config.reserved_sms == expected
    assert config.stage_id == 1
    if isinstance(main, FakeGreenContext):
        assert config.device == main.device_id


def test_the_fill_partition_is_the_complement_on_the_simulator():
    # A 132-SM device whose main job keeps 100 SMs (a GreenContext of 100 SMs): fill work gets
    # the 32 others. capacity_sm_us = bubble time x fill SMs measures the partition used.
    with pft.complement_runtime(FakeGreenContext(100), backend="sim", sim_sm_count=132,
                                min_samples=1) as rt:
        assert rt.config.reserved_sms == 100
        world = rt.sim_world
        stream = world.stream(0, -1)
        with rt.bubble(stream, expected_us=500.0):
            stream.delay(500.0)
        rt.iteration_end()
        world.run_until_idle()
        rt.synchronize()
        st = rt.stats()
    assert st.bubble_time_us == pytest.approx(500.0)
    assert st.capacity_sm_us == pytest.approx(500.0 * 32)


@pytest.mark.parametrize("main, error, match", [
    (True, TypeError, "a bool is not an SM count"),
    ("16", TypeError, "main_sms must be an int, a torch.cuda.green_contexts.GreenContext or "
                      "SMPartition, not str"),
    (FakeGreenContext("many"), TypeError, r"FakeGreenContext\.sm_count is str 'many'"),
    (0, pf.PipeFillError, "main_sms 0: the main job must keep at least 1 SM"),
])
def test_bad_partitions_are_named(main, error, match):
    with pytest.raises(error, match=match):
        pft.complement_config(main, backend="sim")


def test_a_disagreeing_reservation_or_device_is_refused():
    with pytest.raises(ValueError, match="reserved_sms=8 disagrees with the main job's 16 SMs"):
        pft.complement_config(16, reserved_sms=8)
    with pytest.raises(ValueError, match="device=1 but the main job's partition is on device 0"):
        pft.complement_config(FakeGreenContext(16, device_id=0), device=1)
    # The same values agree.
    assert pft.complement_config(16, pf.Config(reserved_sms=16)).reserved_sms == 16


def test_a_main_job_keeping_every_sm_is_refused_by_the_library():
    with pytest.raises(pf.PipeFillError) as caught:
        pft.complement_runtime(64, backend="sim", sim_sm_count=64)
    assert caught.value.code == Result.INVALID_ARGUMENT
    assert "64" in caught.value.message


# ---- fill streams --------------------------------------------------------------------------------

def test_fill_streams_are_cuda_streams_only_on_cuda():
    with pf.Runtime(backend="sim") as rt:
        handles = rt.fill_stream_handles()
        assert handles and all(isinstance(h, int) and h != 0 for h in handles)
        assert len(set(handles)) == len(handles)
        with pytest.raises(pf.PipeFillError, match="backend is Backend.SIM") as caught:
            pft.fill_streams(rt)
        assert caught.value.code == Result.NOT_SUPPORTED
    with pytest.raises(TypeError, match="runtime must be a pipefill.Runtime, not str"):
        pft.fill_streams("runtime")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (gpu-check)")
def test_green_context_complement_and_fill_streams_on_a_gpu():
    green = torch.cuda.green_contexts.GreenContext.create(num_sms=16, device_id=0)
    try:
        rt = pft.complement_runtime(green, backend="cuda")
    except pf.PipeFillError as error:
        pytest.skip(f"the CUDA backend does not start here: {error}")
    with rt:
        assert rt.config.reserved_sms == green.sm_count
        streams = pft.fill_streams(rt)
        assert len(streams) == len(rt.fill_stream_handles()) >= 1
        assert all(isinstance(s, torch.cuda.ExternalStream) for s in streams)
        assert [s.cuda_stream for s in streams] == rt.fill_stream_handles()


# ---- torch.profiler ranges -----------------------------------------------------------------------

def profiled_bubbles(path: pathlib.Path, bubbles: int) -> None:
    """Host-backend bubbles marked through pipefill while a CPU torch.profiler records."""
    try:
        rt = pf.Runtime(backend="host")
    except pf.PipeFillError as error:
        pytest.skip(f"no host device: {error}")
    # A thread-local profiler cannot show the fill threads' slices: the runtime says so (once)
    # and how to get them; bubbles are recorded either way.
    with rt, torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, \
            pytest.warns(RuntimeWarning, match="profile_all_threads=True"):
        stream = rt.high_priority_stream()
        for _ in range(bubbles // 2):
            torch.ones(64, 64) @ torch.ones(64, 64)  # the user's own op, kept in the trace
            with rt.bubble(stream):
                pf.host_stream_delay(stream, 300.0)
                pf.host_stream_synchronize(stream)  # a real wait, like a blocking receive
            rt.bubble_begin(stream, label="fwd:s1:mb0")
            pf.host_stream_delay(stream, 200.0)
            pf.host_stream_synchronize(stream)
            rt.bubble_end(stream)
            rt.iteration_end()
        rt.synchronize()
    prof.export_chrome_trace(str(path))


def test_bubbles_appear_in_the_users_torch_profiler_trace(tmp_path):
    trace = tmp_path / "torch_trace.json"
    profiled_bubbles(trace, 6)
    events = json.loads(trace.read_text())["traceEvents"]
    names = [e["name"] for e in events if e.get("cat") == "user_annotation"
             and e["name"].startswith("bubble ")]
    assert names == ["bubble #0", "bubble fwd:s1:mb0"] * 3
    marked = [e for e in events if e.get("name") == "bubble #0"]
    assert all(e["dur"] >= 250 for e in marked)  # the real wait is inside the range
    assert any(e.get("name") == "aten::mm" for e in events)


def test_no_range_and_no_torch_cost_without_a_profiler():
    rt = pf.Runtime(backend="sim")
    with rt:
        stream = rt.sim_world.stream(0, -1)
        rt.bubble_begin(stream)
        assert rt._profiler_scope is None
        rt.bubble_end(stream)


def _analyzer() -> pathlib.Path:
    build = pathlib.Path(os.environ.get("PIPEFILL_BUILD_DIR",
                                        pathlib.Path(__file__).resolve().parents[2] / "build"))
    path = build / "tools" / "pipefill_analyze" / "pipefill-analyze"
    if not path.exists():
        message = f"pipefill-analyze not built at {path}"
        if os.environ.get("PIPEFILL_REQUIRE_BUILD") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def test_pipefill_analyze_reads_the_profiler_ranges_as_bubbles(tmp_path):
    analyzer = _analyzer()
    trace = tmp_path / "torch_trace.json"
    profiled_bubbles(trace, 6)
    done = subprocess.run([str(analyzer), str(trace), "--json", "-"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (device,) = json.loads(done.stdout)["devices"]  # the process, as the device
    assert device["explicit_bubbles"] is True
    assert device["device"] == os.getpid()
    assert len(device["bubbles"]) == 6
    assert [c["label"] for c in device["classes"]] == ["#0", "fwd:s1:mb0"]
    assert device["bubble_us"] >= 3 * (250 + 150)  # the real waits inside the ranges

