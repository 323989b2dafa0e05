"""Fill slices in the user's own torch.profiler trace (python/pipefill/_profiler.py).

A real pipeline (torch.distributed.pipelining 1F1B over gloo, 2 ranks, pipefill.torch, the
host backend, a graph fill job) under torch.profiler recording every thread: each rank's
exported trace has one ``fill slice <job>`` range per slice the runtime launched (its own
count), on the fill threads, each starting at or after the start of its bubble's range, and
pipefill-analyze reads them as that process's fill work. Without a profiler that covers every
thread, or on the simulated backend, the runtime says once why no slice is in the trace.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import warnings

import pytest

torch = pytest.importorskip("torch")

import pipefill as pf  # noqa: E402
from adapter_checks import launch  # noqa: E402
from pipefill._profiler import MARKER_PREFIX, SLICE_PREFIX  # noqa: E402
from test_torch_interop import _analyzer  # noqa: E402

WORLD = 2
JOB = "graph-job"  # adapter_checks.fill_job's host job (pf.GraphJob's default name)


def _spans(trace: pathlib.Path):
    events = json.loads(trace.read_text())["traceEvents"]
    ranges = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    bubbles = [e for e in ranges if e["name"].startswith(MARKER_PREFIX)]
    slices = [e for e in ranges if e["name"].startswith(SLICE_PREFIX)]
    return bubbles, slices


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profiler-slices")
    codes, results = launch(tmp, "profiler_worker.py", [], world=WORLD, deadline_s=300)
    assert codes == [0] * WORLD
    for rank, r in enumerate(results):
        print(f"rank {rank}: slices launched {r['slices_launched']}, bubbles "
              f"{r['runtime_bubbles']}, items {r['items_completed']}")
    return tmp, results


def test_every_launched_slice_is_a_range_in_the_torch_trace(pipeline):
    tmp, results = pipeline
    for rank, r in enumerate(results):
        assert r["observer_error"] is None, r["observer_error"]
        bubbles, slices = _spans(tmp / f"torch-rank{rank}.json")
        assert len(bubbles) == r["runtime_bubbles"] == r["adapter_bubbles"] > 0, rank
        # The runtime's own count, and its own trace's slices, equal the ranges in torch's.
        own = json.loads((tmp / f"pipefill-rank{rank}.json").read_text())["traceEvents"]
        own_slices = [e for e in own if e.get("ph") == "X" and e.get("cat") == "fill"]
        assert len(slices) == r["slices_launched"] == len(own_slices) == r["spans_entered"], rank
        assert {e["name"] for e in slices} <= {SLICE_PREFIX + JOB}
        assert all(e["pid"] == r["pid"] for e in slices + bubbles)
    # Fill liveness over the ranks (a rank whose waits were all short may launch none).
    assert sum(r["slices_launched"] for r in results) > 0


def test_each_slice_range_starts_in_its_bubble_on_a_fill_thread(pipeline):
    """The torch ranges matched one to one, in start order, with the slices of the runtime's own
    trace (which name their bubble): each range is on a fill stream's thread and starts at or
    after the start of its bubble's range (the k-th bubble range is bubble id k: one runtime,
    one training thread). Only that order is structural: the slice waits for its bubble's begin,
    which follows the range's start. When a slice starts (the executor's reaction, the GIL for
    the call) and when it ends (its last item) are real-time figures a loaded machine stretches,
    so they are printed, not asserted."""
    tmp, results = pipeline
    for rank in range(WORLD):
        bubbles, slices = _spans(tmp / f"torch-rank{rank}.json")
        own = json.loads((tmp / f"pipefill-rank{rank}.json").read_text())["traceEvents"]
        own_slices = sorted((e["ts"], e["args"]["bubble"], e["args"]["items"]) for e in own
                            if e.get("ph") == "X" and e.get("cat") == "fill")
        bubble_threads = {b["tid"] for b in bubbles}
        bubble_starts = sorted(b["ts"] for b in bubbles)
        ranges = sorted(slices, key=lambda e: e["ts"])
        assert len(ranges) == len(own_slices)
        for s, (_, bubble_id, items) in zip(ranges, own_slices):
            assert s["tid"] not in bubble_threads, s
            bubble_start = bubble_starts[bubble_id - 1]
            assert s["ts"] >= bubble_start, (rank, bubble_id, s)
            print(f"rank {rank} bubble {bubble_id}: slice range starts "
                  f"{s['ts'] - bubble_start:.0f} us after the bubble range, lasts "
                  f"{s['dur']:.0f} us, {items} items")


def test_pipefill_analyze_reads_the_slice_ranges_as_fill(pipeline):
    analyzer = _analyzer()
    tmp, results = pipeline
    in_bubbles = []
    for rank, r in enumerate(results):
        _, slices = _spans(tmp / f"torch-rank{rank}.json")
        done = subprocess.run([str(analyzer), str(tmp / f"torch-rank{rank}.json"), "--json", "-"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        (device,) = json.loads(done.stdout)["devices"]
        assert device["device"] == r["pid"] and device["explicit_bubbles"] is True
        assert device["fill_kernels"] == len(slices), rank
        in_bubbles.append(device["fill_in_bubbles_us"])
    # Fill liveness over the ranks: some slice range overlaps a bubble range.
    assert sum(in_bubbles) > 0.0, in_bubbles


def _one_bubble_run(rt: "pf.Runtime", profile_kwargs: dict) -> list:
    """A host or simulated runtime, one graph job, a few bubbles under a CPU profiler; returns
    the warnings raised."""
    job = rt.create_job(pf.GraphJob(items=10**6, item_cost_us=200.0))
    stream = rt.high_priority_stream()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    **profile_kwargs):
            for _ in range(3):
                with rt.bubble(stream, expected_us=2000.0):
                    if rt.backend == pf.Backend.HOST:
                        pf.host_stream_delay(stream, 2000.0)
                        pf.host_stream_synchronize(stream)
                rt.iteration_end()
            if rt.backend == pf.Backend.SIM:
                rt.sim_world.run_until_idle()
            rt.synchronize()
    job.close()
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_a_thread_local_profiler_gets_no_slices_and_a_warning_saying_how(tmp_path):
    with pf.Runtime(backend="host", reserved_sms=0, min_samples=1) as rt:
        messages = _one_bubble_run(rt, {})
        assert rt.stats().slices_launched > 0  # there were slices to show
        tracking = rt.__dict__["_slice_tracking"]
        assert not tracking.installed and tracking.spans.spans == 0
    matching = [m for m in messages if "fill slices are not in this torch.profiler trace" in m]
    assert len(matching) == 1 and "profile_all_threads=True" in matching[0], messages


def test_the_simulated_backend_says_its_slices_are_not_in_the_trace():
    with pf.Runtime(backend="sim", min_samples=1) as rt:
        messages = _one_bubble_run(rt, {})
        with pytest.raises(pf.PipeFillError, match="needs the host backend"):
            rt._native.set_slice_observer(lambda *args: None)
    matching = [m for m in messages if "virtual time" in m]
    assert len(matching) == 1 and "write_trace" in matching[0], messages


def test_a_failing_observer_stops_and_is_reported():
    def broken(*args):
        raise ValueError("observer broke")
    with pf.Runtime(backend="host", reserved_sms=0, min_samples=1) as rt:
        job = rt.create_job(pf.GraphJob(items=10**6, item_cost_us=200.0))
        rt._native.set_slice_observer(broken)
        stream = rt.high_priority_stream()
        for _ in range(3):
            with rt.bubble(stream, expected_us=2000.0):
                pf.host_stream_delay(stream, 2000.0)
                pf.host_stream_synchronize(stream)
            rt.iteration_end()
        rt.synchronize()
        assert rt.stats().slices_launched > 0
        error = rt._native.slice_observer_error()
        assert error is not None and "observer broke" in error
        assert rt._native.slice_observer_calls() == 0  # the first call raised; no more calls
        with pytest.raises(pf.PipeFillError, match="not callable"):
            rt._native.set_slice_observer(42)
        job.close()
