"""The ring of the CUDA path of inference_job (issue 18), on CPU with torch's capture mocked
(cuda_fakes.py's stand-ins).

The ring's index -> slot mapping, the feeder's staging and the bound (available <= drained +
slots) are the code under test: a wrong slot gives wrong outputs, a feeder running ahead of the
drainer overwrites a slot in use. Also the bound on the real runtime (GraphJob.available, host
backend), a batch of another shape ending the job, and the order of the ring's copies after its
zero fill. The training job's capture: test_cuda_training_capture.py; job creation and its
refusals: test_cuda_job_creation.py.
"""
from __future__ import annotations

import threading
import time

import pytest
import torch

import pipefill as pf
import pipefill.torch as pft
from pipefill.torch import _cuda_ring as tcj
from cuda_fakes import (BATCH, CURRENT_STREAM, DIM, OUT, SLOTS, FakeRuntime, FakeStream,  # noqa: F401
                        fake_cuda, model, samples)


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


def test_ring_copies_are_ordered_after_the_zero_fill(fake_cuda):
    """The ring's zeros are written on the current stream, its copies on a stream of its own: the
    copy stream waits for the current stream on the device before slot 0's first copy."""
    ring = tcj.DeviceRing([torch.zeros(BATCH, DIM)], SLOTS, torch.device("cpu"))
    assert (ring.stream, CURRENT_STREAM) in FakeStream.waits
