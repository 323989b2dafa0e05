"""The bindings on the simulated device: Config, Runtime, bubbles, jobs, stats, traces."""
from __future__ import annotations

import json
import re
import threading

import pytest

import pipefill as pf
from pipefill import BubbleKind, JobStatus, Result


def header_enum(repo, c_name: str) -> dict:
    """Name -> value of a C enum in pipefill.h, parsed from the header text."""
    text = (repo / "include" / "pipefill" / "pipefill.h").read_text()
    body = re.search(r"typedef enum %s \{(.*?)\} %s;" % (c_name, c_name), text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    values = {}
    for name, value in re.findall(r"(\w+)\s*=\s*(\d+)", body):
        values[name] = int(value)
    return values


@pytest.mark.parametrize("py_enum, c_name, prefix", [
    (pf.Result, "pfResult_t", "pfError"),
    (pf.Backend, "pfBackend_t", "pfBackend"),
    (pf.Policy, "pfSchedulePolicy_t", "pfPolicy"),
    (pf.LogLevel, "pfLogLevel_t", "pfLog"),
    (pf.BubbleKind, "pfBubbleKind_t", "pfBubble"),
    (pf.JobKind, "pfJobKind_t", "pfJob"),
    (pf.JobStatus, "pfJobStatus_t", "pfJob"),
])
def test_enums_match_the_header(repo, py_enum, c_name, prefix):
    c_values = header_enum(repo, c_name)
    c_values = {k: v for k, v in c_values.items() if not k.endswith("Count")}
    if py_enum is pf.Result:
        c_values.pop("pfSuccess")
        assert py_enum.SUCCESS == 0
    # Every C value has a Python member of the same value, and nothing else exists.
    assert sorted(c_values.values()) == sorted(int(m) for m in py_enum if m != 0 or
                                               py_enum is not pf.Result)
    squash = lambda s: s.replace("_", "").lower()
    py_by_name = {squash(m.name): int(m) for m in py_enum}
    for name, value in c_values.items():
        assert py_by_name[squash(name[len(prefix):])] == value, name


def test_version_and_error_strings(repo):
    text = (repo / "include" / "pipefill" / "pipefill.h").read_text()
    major, minor, patch = (int(re.search(r"#define PIPEFILL_VERSION_%s (\d+)" % k, text).group(1))
                           for k in ("MAJOR", "MINOR", "PATCH"))
    assert pf.library_version() == major * 10000 + minor * 100 + patch
    assert pf.__version__ == f"{major}.{minor}.{patch}"
    assert pf.error_string(Result.TIMEOUT).startswith("pfErrorTimeout")
    assert pf.error_string(999).startswith("pfErrorUnknown")


def test_config_fields_reach_the_runtime():
    cfg = pf.Config(backend="sim", stage_id=2, stage_count=4, reserved_sms=8,
                    safety_margin_us=5.5, safety_margin_fraction=0.25, arena_bytes="64M",
                    prediction_quantile=0.5, min_samples=3, policy="srpt", log_level="error",
                    sim_seed=7, sim_sm_count=100, sim_memory_bytes=1 << 33,
                    gated_prediction_quantile=0.75, fill_optimizer_bubbles=True)
    with pf.Runtime(cfg) as rt:
        got = rt.config
        assert rt.backend == pf.Backend.SIM
        assert (got.stage_id, got.stage_count, got.reserved_sms) == (2, 4, 8)
        assert (got.safety_margin_us, got.safety_margin_fraction) == (5.5, 0.25)
        assert got.arena_bytes == 64 << 20
        assert (got.prediction_quantile, got.min_samples) == (0.5, 3)
        assert got.gated_prediction_quantile == 0.75
        assert got.fill_optimizer_bubbles is True
        assert got.policy == pf.Policy.SHORTEST_REMAINING
        assert got.log_level == pf.LogLevel.ERROR
        assert (got.sim_seed, got.sim_sm_count, got.sim_memory_bytes) == (7, 100, 1 << 33)
    assert rt.closed


def test_gated_prediction_quantile_defaults_to_the_median():
    with pf.Runtime(backend="sim") as rt:
        assert rt.config.gated_prediction_quantile == 0.5
        assert rt.config.prediction_quantile == 0.1


def test_the_all_reduce_window_is_left_unfilled_unless_asked(monkeypatch):
    with pf.Runtime(backend="sim") as rt:
        assert rt.config.fill_optimizer_bubbles is False
    monkeypatch.setenv("PIPEFILL_FILL_OPTIMIZER_BUBBLES", "1")
    with pf.Runtime(backend="sim") as rt:
        assert rt.config.fill_optimizer_bubbles is True


def test_keyword_arguments_override_a_config():
    base = pf.Config(backend="sim", stage_count=4, stage_id=1)
    with pf.Runtime(base, stage_id=3, reserved_sms=2) as rt:
        assert (rt.config.stage_id, rt.config.reserved_sms) == (3, 2)
    assert base.stage_id == 1  # the given config is not modified


def test_unset_fields_follow_the_environment(monkeypatch):
    monkeypatch.setenv("PIPEFILL_BACKEND", "sim")
    monkeypatch.setenv("PIPEFILL_STAGE_COUNT", "8")
    monkeypatch.setenv("PIPEFILL_STAGE_ID", "5")
    monkeypatch.setenv("PIPEFILL_ARENA_BYTES", "3M")
    monkeypatch.setenv("PIPEFILL_POLICY", "fair")
    with pf.Runtime() as rt:
        cfg = rt.config
        assert rt.backend == pf.Backend.SIM
        assert (cfg.stage_id, cfg.stage_count, cfg.arena_bytes) == (5, 8, 3 << 20)
        assert cfg.policy == pf.Policy.FAIR_SHARE
    # A field given explicitly wins over the environment.
    with pf.Runtime(stage_id=1) as rt:
        assert rt.config.stage_id == 1


def run_pipeline(rt, world, stream, iterations, bubble_us=400.0, compute_us=100.0,
                 use_context_manager=True, label=None):
    """Compute, one bubble, compute per iteration; returns the stream's end time."""
    done = world.event()
    for _ in range(iterations):
        stream.launch_kernel(compute_us, 132)
        if use_context_manager:
            with rt.bubble(stream, kind=BubbleKind.WARMUP, label=label, expected_us=bubble_us):
                stream.delay(bubble_us)
        else:
            rt.bubble_begin(stream, kind="warmup", label=label, expected_us=bubble_us)
            stream.delay(bubble_us)
            rt.bubble_end(stream)
        stream.launch_kernel(compute_us, 132)
        rt.iteration_end()
    stream.record(done)
    world.run_until_idle()
    return done.time


@pytest.mark.parametrize("use_context_manager", [True, False])
def test_bubbles_fill_a_ticket_job(use_context_manager):
    with pf.SimWorld(1) as world:
        with pf.Runtime(backend="sim", sim_world=world, device=0, safety_margin_us=0,
                        safety_margin_fraction=0) as rt:
            stream = world.stream(0, -1)
            job = rt.create_job(pf.SimTicketJob(items=10**7, item_cost_us=10.0))
            end = run_pipeline(rt, world, stream, 5, use_context_manager=use_context_manager)
            rt.synchronize()
            st = rt.stats()
            assert isinstance(st, pf.Stats)
            assert (st.iterations, st.bubbles) == (5, 5)
            # expected_us lets every class fill from the first iteration.
            assert st.bubbles_filled == 5
            assert st.bubble_time_us == pytest.approx(5 * 400.0)
            assert 0 < st.filled_time_us <= st.bubble_time_us
            counts = job.counts()
            # Every completed item ran exactly once, and the runtime counted the same items.
            assert counts.items_run == st.items_completed == job.info().items_completed > 0
            assert counts.duplicates == 0 and counts.out_of_range == 0 and counts.tracked
            # SM x us: every item ran on one SM for its 10 us inside a bubble (no overrun: the
            # main stream's end below is undelayed), out of fill SMs x bubble time.
            assert st.filled_sm_us == pytest.approx(counts.items_run * 10.0)
            assert 0 < st.filled_sm_share <= 1.0
            assert st.capacity_sm_us >= st.filled_sm_us
            assert job.status == JobStatus.RUNNING
            # Filling inside the bubble does not delay the main stream (ticket items <= gap).
            assert end == pytest.approx(5 * (200.0 + 400.0), abs=1e-6)


def test_job_completes_and_wait_returns_its_info():
    world = pf.SimWorld(1)
    rt = pf.Runtime(backend="sim", sim_world=world, device=0)
    stream = world.stream(0, -1)
    job = rt.create_job(pf.SimTicketJob(items=500, item_cost_us=5.0, name="small"))
    assert job.status == JobStatus.PENDING
    run_pipeline(rt, world, stream, 3)
    info = job.wait(timeout=5)
    assert info.status == JobStatus.COMPLETED
    assert info.items_completed == info.item_count == 500
    assert job.counts().items_run == 500
    assert rt.stats().jobs_completed == 1
    rt.close()
    world.close()


def test_cancel_stops_scheduling():
    world = pf.SimWorld(1)
    with pf.Runtime(backend="sim", sim_world=world, device=0) as rt:
        stream = world.stream(0, -1)
        job = rt.create_job(pf.SimTicketJob(items=10**8, item_cost_us=10.0))
        run_pipeline(rt, world, stream, 2)
        job.cancel()
        assert job.status == JobStatus.CANCELLED
        before = job.counts().items_run
        run_pipeline(rt, world, stream, 3)
        rt.synchronize()
        assert job.counts().items_run == before
    world.close()


def test_wait_in_another_thread_returns_when_the_job_completes():
    world = pf.SimWorld(1)
    with pf.Runtime(backend="sim", sim_world=world, device=0) as rt:
        stream = world.stream(0, -1)
        job = rt.create_job(pf.SimTicketJob(items=200, item_cost_us=5.0))
        result = {}
        waiter = threading.Thread(target=lambda: result.setdefault("info", job.wait(timeout=30)))
        waiter.start()  # blocks in pfJobWait with the GIL released
        run_pipeline(rt, world, stream, 3)
        waiter.join(timeout=30)
        assert not waiter.is_alive()
        assert result["info"].status == JobStatus.COMPLETED
    world.close()


def test_policies_and_priorities_pick_the_job():
    world = pf.SimWorld(1)
    with pf.Runtime(backend="sim", sim_world=world, device=0, policy="priority") as rt:
        stream = world.stream(0, -1)
        low = rt.create_job(pf.SimTicketJob(items=10**8, item_cost_us=10.0, priority=1, name="low"))
        high = rt.create_job(pf.SimTicketJob(items=10**8, item_cost_us=10.0, priority=9, name="high"))
        run_pipeline(rt, world, stream, 3)
        rt.synchronize()
        assert high.counts().items_run > 0
        assert low.counts().items_run == 0
        assert [j.name for j in rt.jobs] == ["low", "high"]
    world.close()


def test_planner_chooses_among_job_configs():
    world = pf.SimWorld(1)
    with pf.Runtime(backend="sim", sim_world=world, device=0, arena_bytes="1G") as rt:
        stream = world.stream(0, -1)
        configs = [pf.JobConfig(20.0, "slow"), pf.JobConfig(10.0, "fast", items_per_item=4)]
        job = rt.create_job(pf.SimTicketJob(items=10**8, item_cost_us=20.0, configs=configs))
        run_pipeline(rt, world, stream, 3)
        rt.synchronize()
        # The fast configuration gives more useful work per second: the planner takes it.
        assert job.info().config_index == 1
    world.close()


def test_private_world_of_a_runtime():
    with pf.Runtime(backend="sim", sim_sm_count=64) as rt:
        world = rt.sim_world
        assert not world.owned
        stream = world.stream(0, -1)
        job = rt.create_job(pf.SimTicketJob(items=1000, item_cost_us=3.0))
        run_pipeline(rt, world, stream, 3)
        assert job.wait(timeout=5).status == JobStatus.COMPLETED
    assert world.closed  # it closed with its runtime


def test_high_priority_stream_is_a_main_stream():
    with pf.Runtime(backend="sim") as rt:
        stream = rt.high_priority_stream()
        world = rt.sim_world
        with rt.bubble(stream):
            world._native.stream_delay(stream.handle, 50.0)
        rt.iteration_end()
        world.run_until_idle()
        rt.synchronize()
        assert rt.stats().bubbles == 1
        stream.close()


def test_stream_handle_conversions():
    class TorchLike:
        cuda_stream = 0x1234

    class Protocol:
        def __cuda_stream__(self):
            return (0, 0x5678)

    world = pf.SimWorld(1)
    s = world.stream()
    assert pf.stream_handle(None) == 0
    assert pf.stream_handle(77) == 77
    assert pf.stream_handle(s) == s.handle
    assert pf.stream_handle(TorchLike()) == 0x1234
    assert pf.stream_handle(Protocol()) == 0x5678
    with pytest.raises(TypeError):
        pf.stream_handle("stream")
    world.close()


def test_write_trace_writes_the_bubbles(tmp_path):
    world = pf.SimWorld(1)
    with pf.Runtime(backend="sim", sim_world=world, device=0) as rt:
        stream = world.stream(0, -1)
        rt.create_job(pf.SimTicketJob(items=10**6, item_cost_us=10.0))
        run_pipeline(rt, world, stream, 4, label="recv-a")
        rt.synchronize()
        path = tmp_path / "trace.json"
        rt.write_trace(path)
        data = json.loads(path.read_text())
        events = data["traceEvents"] if isinstance(data, dict) else data
        assert len(events) > 4
        # Byte-identical for identical simulated runs: a second write is the same.
        rt.write_trace(tmp_path / "again.json")
        assert (tmp_path / "again.json").read_bytes() == path.read_bytes()
    world.close()


def test_identical_simulated_runs_give_identical_stats():
    def once():
        world = pf.SimWorld(1, jitter=0.1, seed=3)
        with pf.Runtime(backend="sim", sim_world=world, device=0) as rt:
            stream = world.stream(0, -1)
            job = rt.create_job(pf.SimTicketJob(items=10**7, item_cost_us=7.0))
            end = run_pipeline(rt, world, stream, 6)
            rt.synchronize()
            result = (end, rt.stats(), job.counts().items_run)
        world.close()
        return result

    a, b = once(), once()
    assert a[0] == b[0] and a[2] == b[2]
    assert dataclass_without_timing(a[1]) == dataclass_without_timing(b[1])


def dataclass_without_timing(stats):
    import dataclasses
    return dataclasses.replace(stats, host_begin_end_ns=0.0)


def test_the_bubble_context_manager_ends_the_bubble_when_the_body_raises():
    with pf.Runtime(backend="sim") as rt:
        stream = rt.sim_world.stream()
        with pytest.raises(ZeroDivisionError):
            with rt.bubble(stream):
                assert rt.in_bubble
                1 / 0
        assert not rt.in_bubble
        rt.iteration_end()  # would be INVALID_STATE with the bubble still open


def test_garbage_collected_objects_clean_up():
    import gc
    world = pf.SimWorld(1)
    rt = pf.Runtime(backend="sim", sim_world=world, device=0)
    stream = world.stream(0, -1)
    rt.create_job(pf.SimTicketJob(items=10, item_cost_us=1.0))
    rt.bubble_begin(stream)
    del rt  # no close(): the destructor ends the bubble, destroys the job and the runtime
    gc.collect()
    world.close()  # would be BUSY if the runtime were still attached
    assert world.closed


def wait_until_in_native_call(thread: threading.Thread, method, call: str,
                              limit_s: float = 10.0) -> None:
    """Returns once `thread`'s innermost Python frame is `method` at its line that starts with
    `call` (a native call, which runs without a Python frame of its own: the thread is in it or
    about to enter it). Fails naming the thread's position after `limit_s`, which only turns a
    waiter that never gets there into a failure; nothing is timed."""
    import inspect
    import sys
    import time
    lines, first = inspect.getsourcelines(method)
    call_lines = [first + i for i, line in enumerate(lines) if line.strip().startswith(call)]
    assert call_lines, f"{method.__qualname__} has no line starting with {call!r}"
    deadline = time.monotonic() + limit_s
    while True:
        frame = sys._current_frames().get(thread.ident)
        if frame is not None and frame.f_code is method.__code__ and frame.f_lineno in call_lines:
            return
        if not thread.is_alive() or time.monotonic() > deadline:
            where = ("it has ended" if frame is None
                     else f"it is at {frame.f_code.co_qualname}:{frame.f_lineno}")
            pytest.fail(f"thread {thread.name} did not reach {call!r} in {method.__qualname__} "
                        f"within {limit_s} s ({where})")
        time.sleep(0.001)


def test_closing_the_runtime_releases_a_waiter_on_another_thread():
    world = pf.SimWorld(1)
    rt = pf.Runtime(backend="sim", sim_world=world, device=0)
    job = rt.create_job(pf.SimTicketJob(items=10**6, item_cost_us=10.0))
    outcome = {}

    def wait_forever():
        try:
            job.wait()  # no timeout: only the close below can end it
        except pf.PipeFillError as error:
            outcome["code"] = error.code

    waiter = threading.Thread(target=wait_forever)
    waiter.start()
    wait_until_in_native_call(waiter, pf.Job.wait, "self._native.wait(")
    rt.close()  # cancels the job (the wait returns), then destroys it and the runtime
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert outcome["code"] in (Result.CANCELLED, Result.INVALID_STATE)
    assert job.closed and rt.closed
    world.close()


def test_the_package_ships_type_stubs_and_docstrings():
    import pathlib
    package = pathlib.Path(pf.__file__).parent
    assert (package / "py.typed").exists()
    stub = (package / "_pipefill.pyi").read_text()
    for name in ("class Runtime", "def bubble_begin", "class SimWorld", "def create_fill_job"):
        assert name in stub
    for obj in (pf.Runtime, pf.Runtime.bubble, pf.Config, pf.Job.wait, pf.SimWorld,
                pf.PipeFillError, pf.jobs.SimTicketJob):
        assert obj.__doc__ and len(obj.__doc__) > 20, obj


def test_class_margins_are_set_removed_and_checked():
    """Runtime.set_class_margin (pfRuntimeSetClassMargin): accepted for a class not seen yet,
    removable with a negative margin, refused for a NaN margin or an empty key."""
    with pf.Runtime(backend="sim") as rt:
        rt.set_class_margin("#0", 0.0)
        rt.set_class_margin("#0", -1.0)
        with pytest.raises(pf.PipeFillError, match="margin_us = nan"):
            rt.set_class_margin("#0", float("nan"))
        with pytest.raises(pf.PipeFillError, match="class_key"):
            rt.set_class_margin("", 5.0)


def test_bubble_close_fill_ends_the_open_bubbles_fill_early():
    """Runtime.bubble_close_fill (pfBubbleCloseFill): closed in stream order 100 us into a 400 us
    bubble, the bubble's fill runs about a quarter of the items of an unclosed one; outside a
    bubble the call is refused."""
    with pf.SimWorld(1) as world:
        with pf.Runtime(backend="sim", sim_world=world, device=0, safety_margin_us=0,
                        safety_margin_fraction=0) as rt:
            stream = world.stream(0, -1)
            job = rt.create_job(pf.SimTicketJob(items=10**7, item_cost_us=10.0))
            with pytest.raises(pf.PipeFillError, match="no bubble is open"):
                rt.bubble_close_fill(stream)
            run_pipeline(rt, world, stream, 3)

            def bubble(close_after_us):
                before = job.counts().items_run
                stream.launch_kernel(100.0, 132)
                rt.bubble_begin(stream, expected_us=400.0)
                if close_after_us is None:
                    stream.delay(400.0)
                else:
                    stream.delay(close_after_us)
                    rt.bubble_close_fill(stream)
                    stream.delay(400.0 - close_after_us)
                rt.bubble_end(stream)
                rt.iteration_end()
                world.run_until_idle()
                rt.synchronize()
                return job.counts().items_run - before

            unclosed = bubble(None)
            closed = bubble(100.0)
            assert unclosed > 0
            assert closed <= 0.3 * unclosed
            assert closed >= 0.2 * unclosed
