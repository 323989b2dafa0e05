"""Graph fill jobs (pipefill.jobs.GraphJob, pfJobCreateGraph) from Python.

Simulated and host backends (run everywhere): every item runs once, in index order, with the
index word holding it; an early bubble end costs at most one item (closed form); bad
descriptions raise PipeFillError naming the field. On a GPU (skipped without one):
pipefill.torch.module_inference_job's outputs equal eager inference, computed inside bubbles.
"""
from __future__ import annotations

import json
import math

import pytest

import pipefill as pf
from trace_checks import items_against_bubbles


def sim_stage():
    world = pf.SimWorld(1, sm_count=32, seed=0)
    rt = pf.Runtime(backend="sim", sim_world=world, device=0, reserved_sms=4,
                    safety_margin_us=0.0, safety_margin_fraction=0.0)
    return world, rt, world.stream(0, -1)


def sim_step(world, rt, stream, bubble_us, expected_us=None):
    with rt.bubble(stream, expected_us=bubble_us if expected_us is None else expected_us):
        stream.delay(bubble_us)
    stream.launch_kernel(50.0, 32)
    rt.iteration_end()
    world.run_until_idle()


def test_sim_graph_job_runs_every_item_once_in_index_order():
    world, rt, stream = sim_stage()
    job = rt.create_job(pf.GraphJob(items=97, item_cost_us=7.0, name="g"))
    lengths = [100.0, 37.0, 64.0, 55.0, 120.0]
    steps = 0
    while not job.status.finished and steps < 300:
        sim_step(world, rt, stream, lengths[steps % 5])
        steps += 1
    rt.synchronize()
    assert job.info().status == pf.JobStatus.COMPLETED
    counts = job.graph_counts()
    assert counts == pf.GraphCounts(items_run=97, duplicates=0, out_of_order=0,
                                    index_mismatches=0)
    assert steps > 3
    assert rt.stats().items_completed == 97
    rt.close()
    world.close()


def test_sim_graph_job_overrun_is_at_most_one_item():
    world, rt, stream = sim_stage()
    item = 10.0
    rt.create_job(pf.GraphJob(items=10**6, item_cost_us=item))
    # Planned for 100 µs, the bubble ends after 55: items start at 0, 10, .., 50 µs; the one
    # started at 50 ends at 60, 5 µs past the end (ceil(55/10)*10 - 55).
    sim_step(world, rt, stream, 55.0, expected_us=100.0)
    rt.synchronize()
    stats = rt.stats()
    assert stats.items_completed == math.ceil(55.0 / item)
    assert stats.max_overrun_us == pytest.approx(math.ceil(55.0 / item) * item - 55.0)
    assert stats.max_overrun_us <= item
    rt.close()
    world.close()


@pytest.mark.parametrize("field,value,needle", [
    ("items", 0, "desc->item_count = 0"),
    ("item_cost_us", 0.0, "desc->item_cost_us = 0"),
    ("item_cost_us", float("nan"), "desc->item_cost_us = nan"),
])
def test_bad_graph_job_descriptions_name_the_field(field, value, needle):
    with pf.Runtime(backend="sim") as rt:
        spec = dict(items=4, item_cost_us=10.0)
        spec[field] = value
        with pytest.raises(pf.PipeFillError, match=needle) as error:
            rt.create_job(pf.GraphJob(**spec))
        assert error.value.code == pf.Result.INVALID_ARGUMENT
        assert rt.jobs == []
        with pytest.raises(pf.PipeFillError, match="not 8-byte aligned"):
            rt.create_job(pf.GraphJob(items=4, item_cost_us=10.0, index_word=0x1003))


def host_runtime():
    try:
        return pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                          safety_margin_fraction=0.0, min_samples=1000000)
    except pf.PipeFillError as error:
        if error.code == pf.Result.NOT_SUPPORTED:
            pytest.skip(f"no host device in this build: {error.message}")
        raise


def test_host_graph_job_runs_only_inside_bubbles(tmp_path):
    rt = host_runtime()
    stream = rt.high_priority_stream()
    item = 200.0
    job = rt.create_job(pf.GraphJob(items=40, item_cost_us=item, clock_stream=stream))
    for _ in range(200):
        if job.status.finished:
            break
        with rt.bubble(stream, expected_us=2000.0):
            pf.host_stream_delay(stream, 2000.0)
        pf.host_stream_delay(stream, 1000.0)  # compute between bubbles: no fill work there
        rt.iteration_end()
        pf.host_stream_synchronize(stream)
    rt.synchronize()
    assert job.info().status == pf.JobStatus.COMPLETED
    assert job.graph_counts() == pf.GraphCounts(40, 0, 0, 0)
    trace = tmp_path / "trace.json"
    rt.write_trace(trace)
    times = job.graph_item_times()
    assert len(times) == 40 and times == sorted(times)
    # Counts, not durations: whatever this machine's load, no item starts outside a bubble
    # except the one per bubble claimed before its gate closed.
    outside, most_late = items_against_bubbles(trace, times)
    assert outside == 0
    assert most_late <= 1
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    bubbles = {e["args"]["id"]: e["ts"] for e in events
               if e.get("ph") == "X" and e.get("cat") == "bubble"}
    slices = [(e["args"]["bubble"], e["ts"]) for e in events
              if e.get("ph") == "X" and e.get("cat") == "fill"]
    assert slices and all(begin >= bubbles[b] - 1e-6 for b, begin in slices)
    t0 = pf.host_now(stream)
    pf.host_stream_delay(stream, 300.0)
    pf.host_stream_synchronize(stream)
    assert pf.host_now(stream) - t0 >= 300.0
    rt.close()


def test_module_inference_graph_job_equals_eager_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import pipefill.torch as pft
    try:
        rt = pf.Runtime(backend="cuda")
    except pf.PipeFillError as error:
        pytest.skip(f"no CUDA backend: {error.message}")
    torch.manual_seed(0)

    def make_job():
        # The model and inputs are referenced only by the job once this returns (issue 16: a
        # tensor the graph reads must not go back to the caching allocator).
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                    torch.nn.Linear(128, 16)).cuda().eval()
        inputs = torch.randn(256, 64, device="cuda")
        with torch.no_grad():
            eager = torch.cat([model(inputs[i * 8:(i + 1) * 8]) for i in range(32)])
        return pft.module_inference_job(rt, model, inputs, batch=8), eager

    fill, eager = make_job()
    import gc
    gc.collect()
    main = torch.cuda.Stream(priority=-1)
    for step in range(500):
        if fill.job.status.finished:
            break
        with torch.cuda.stream(main):
            # Allocations and frees on the trainer's stream while the job runs: freed blocks of
            # the job's tensors would be handed out here and overwritten.
            junk = [torch.full((64 + step % 7, 64), float(step), device="cuda") for _ in range(4)]
            del junk
            with rt.bubble(main, expected_us=500.0):
                torch.cuda._sleep(1_000_000)
        rt.iteration_end()
        rt.synchronize()
    assert fill.job.info().status == pf.JobStatus.COMPLETED
    outputs = fill.wait(10.0)
    assert torch.allclose(outputs, eager, rtol=1e-5, atol=1e-6)
    fill.close()
    rt.close()
