"""The example fill jobs (examples/fill_jobs) as ready-made Python jobs on the simulated device:
each item's real result is computed on the CPU as it completes in virtual time."""
from __future__ import annotations

import math

import pytest

import pipefill as pf


def fill_until_done(job_spec, bubble_us: float, max_iterations: int = 400, world_seed: int = 0):
    """Runs compute / bubble iterations until the job completes; returns (job, runtime, world)."""
    world = pf.SimWorld(1, seed=world_seed)
    rt = pf.Runtime(backend="sim", sim_world=world, device=0)
    stream = world.stream(0, -1)
    job = rt.create_job(job_spec)
    for _ in range(max_iterations):
        stream.launch_kernel(50.0, 132)
        with rt.bubble(stream, expected_us=bubble_us):
            stream.delay(bubble_us)
        rt.iteration_end()
        world.run_until_idle()
        if job.status.finished:
            break
    return job, rt, world


def close(rt, world):
    rt.close()
    world.close()


def test_mlp_inference_runs_every_item_once_and_results_do_not_depend_on_slicing():
    spec = pf.MlpInference(items=300, seed=11, input=16, hidden=32, output=8, rows=4,
                           item_cost_us=50.0, parallelism=4, keep_every=1)  # results opt-in
    a, rt_a, world_a = fill_until_done(spec, bubble_us=150.0)
    b, rt_b, world_b = fill_until_done(spec, bubble_us=900.0)  # other bubbles, other slices
    other, rt_o, world_o = fill_until_done(
        pf.MlpInference(items=300, seed=12, input=16, hidden=32, output=8, rows=4,
                        keep_every=1), 900.0)
    for job in (a, b):
        assert job.info().status == pf.JobStatus.COMPLETED
        p = job.progress()
        assert (p.items_done, p.duplicate_items, p.outputs_kept) == (300, 0, 300)
    assert a.info().slices_launched != b.info().slices_launched
    for item in (0, 1, 137, 299):
        out = a.output(item)
        assert len(out) == 4 * 8 and all(math.isfinite(v) for v in out)
        assert out == b.output(item)
        assert out != other.output(item)
    assert a.output(0) != a.output(1)
    for rt, world in ((rt_a, world_a), (rt_b, world_b), (rt_o, world_o)):
        close(rt, world)


def test_encoder_inference_keeps_every_nth_output():
    job, rt, world = fill_until_done(
        pf.EncoderInference(items=40, hidden=16, heads=2, ffn=32, seq=4, keep_every=10), 2000.0)
    assert job.info().status == pf.JobStatus.COMPLETED
    p = job.progress()
    assert (p.items_done, p.outputs_kept, p.duplicate_items) == (40, 4, 0)
    assert len(job.output(30)) == 4 * 16
    assert job.item_cost_us > 0
    close(rt, world)


def test_training_steps_run_in_order_and_the_loss_goes_down():
    spec = pf.Training(items=150, input=8, hidden=16, output=2, rows=16, learning_rate=0.05,
                       seed=5)
    world = pf.SimWorld(1)
    with pf.Runtime(backend="sim", sim_world=world, device=0) as rt:
        untrained = rt.create_job(spec)
        loss_before = untrained.evaluation_loss()
        parameters_before = untrained.parameters()
        assert len(parameters_before) == 16 * 8 + 16 + 2 * 16 + 2
    world.close()

    job, rt, world = fill_until_done(spec, bubble_us=400.0)
    assert job.info().status == pf.JobStatus.COMPLETED
    p = job.progress()
    assert (p.items_done, p.out_of_order, p.duplicate_items) == (150, 0, 0)
    assert p.last_loss < p.first_loss
    assert job.evaluation_loss() < loss_before
    assert job.parameters() != parameters_before
    assert job.info().slices_launched > 1  # it resumed across bubbles
    close(rt, world)


def test_fill_jobs_take_the_runtimes_backend():
    world = pf.SimWorld(1)
    with pf.Runtime(backend="sim", sim_world=world, device=0) as rt:
        job = rt.create_job(pf.MlpInference(items=5))
        assert job.name == "mlp-inference/ticket"
        opaque = rt.create_job(pf.MlpInference(items=5, execution="opaque"))
        assert opaque.name == "mlp-inference/opaque"
        assert [j.name for j in rt.jobs] == ["mlp-inference/ticket", "mlp-inference/opaque"]
    world.close()
