"""inference_job with several batch sizes (issue 32 item 6): one configuration per size, the
planner picks per bubble class. The sink gets one call per unit (the smallest size), in order,
whatever sizes ran: tested bit-identical against a plain loop over the dataset (the same batches,
and for a row-wise module a single-size loop), resumed exactly after a close and after a failure
mid-run with mixed sizes, and bad input refused at creation naming the value.
"""
from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

import pipefill as pf
import pipefill.torch as pft
from test_torch_jobs import DIM, Samples, host_runtime, model

UNIT = 2
SIZES = [UNIT, 2 * UNIT, 4 * UNIT]
SHORT_US, LONG_US = 1100.0, 2100.0  # host bubbles


class Recording(nn.Module):
    """The module, recording the rows of every batch it is called on."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.rows = inner, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows.append(x.shape[0])
        return self.inner(x)


class RowWise(nn.Module):
    """A module whose rows do not depend on the other rows in floating point (IEEE mul/add)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 0.5 + 0.25)


def units(samples: Samples, count: int = None):
    """The dataset's samples in units of UNIT rows (the last one partial)."""
    rows = torch.stack(list(samples))
    return list(rows.split(UNIT))[:count]


class Sim:
    """A simulated trainer (virtual time: an item takes its size's given cost): bubbles of
    SIM_SHORT_US fit only the smallest size, bubbles of SIM_LONG_US run the largest (the most
    units per µs). ``used[bubble_us]``: the configurations whose claims ran in that class."""

    def __init__(self) -> None:
        self.world = pf.SimWorld(1, sm_count=32, seed=0)
        self.rt = pf.Runtime(backend="sim", sim_world=self.world, device=0, reserved_sms=4,
                             safety_margin_us=0.0, safety_margin_fraction=0.0)
        self.stream = self.world.stream(0, -1)
        self.used = {SIM_SHORT_US: set(), SIM_LONG_US: set()}

    def run(self, job, done, deadline_s=60.0) -> None:
        """Rounds of both classes until done(); virtual time runs ahead of the feeder and
        drainer threads, so each round leaves them the GIL for a moment."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(0.0005)
            for bubble_us in self.used:
                # The feeder is a real-time thread: give it time to stage a claim's units
                # (on a loaded machine a bubble could otherwise find none, and a class none).
                wait_until = time.monotonic() + 0.2
                while (job._bound <= job._claims_started and not job._input_done
                       and time.monotonic() < wait_until):
                    time.sleep(0.0005)
                before = list(job.sizes_run)
                with self.rt.bubble(self.stream, expected_us=bubble_us):
                    self.stream.delay(bubble_us)
                self.stream.launch_kernel(50.0, 32)
                self.world.run_until_idle()
                self.used[bubble_us] |= {c for c in range(3) if job.sizes_run[c] > before[c]}
            self.rt.iteration_end()

    def close(self) -> None:
        self.rt.close()
        self.world.close()


SIM_COSTS = [100.0, 140.0, 200.0]
SIM_SHORT_US, SIM_LONG_US = 120.0, 2000.0


def host_bubbles(rt, done, classes=(SHORT_US, LONG_US), max_rounds=2000):
    stream = rt.high_priority_stream()
    for _ in range(max_rounds):
        if done():
            return
        for bubble_us in classes:
            with rt.bubble(stream, expected_us=bubble_us):
                pf.host_stream_delay(stream, bubble_us)
            pf.host_stream_delay(stream, 100.0)
            rt.iteration_end()
            pf.host_stream_synchronize(stream)


def plain_loop_with_batches(module: nn.Module, data: Samples, batch_rows):
    """The module over the dataset in batches of ``batch_rows`` rows, cut into units."""
    rows, want, at = torch.stack(list(data)), [], 0
    with torch.no_grad():
        for n in batch_rows:
            want += list(module(rows[at:at + n]).split(UNIT))
            at += n
    return want


def test_sim_mixed_sizes_equal_the_plain_loop_and_fit_each_class():
    """Simulated backend: bubbles of 120 µs run only the smallest size (configuration 0), bubbles
    of 2000 µs only the largest; the sink sees UNIT-row outputs in order, each equal (bitwise) to
    the module on the very batches the items ran, cut into units."""
    data = Samples(81)  # 41 units, the last one 1 row
    module = Recording(model(4)).eval()
    got = []
    sim = Sim()
    job = pft.inference_job(sim.rt, module, data, batch_size=None, batch_sizes=SIZES,
                            item_cost_us=SIM_COSTS, sink=lambda i, y: got.append((i, y.clone())))
    assert job.config_costs_us == SIM_COSTS
    module.rows.clear()  # the creation's checks
    sim.run(job, lambda: job.progress().finished or job.error is not None)
    progress = job.wait(timeout=30)
    assert job.error is None
    assert progress.items_done == 41 and progress.finished
    assert [i for i, _ in got] == list(range(41))
    assert sim.used == {SIM_SHORT_US: {0}, SIM_LONG_US: {2}}, sim.used
    assert set(module.rows) >= {UNIT, 4 * UNIT} and sum(module.rows) == 81
    want = plain_loop_with_batches(module.inner, data, module.rows)
    assert len(want) == 41 and all(torch.equal(y, w) for (_, y), w in zip(got, want))
    assert job.job.info().status == pf.JobStatus.COMPLETED
    job.close()
    sim.close()


def test_sim_row_wise_module_equals_a_single_size_loop_bit_identically(tmp_path):
    """With a row-wise module the outputs equal a plain batch_size=UNIT loop's, and the memmap
    sink's rows are the whole dataset through the module."""
    import numpy as np
    data = Samples(80)
    want = [RowWise()(u) for u in units(data)]
    rows = np.lib.format.open_memmap(tmp_path / "rows.npy", mode="w+", dtype=np.float32,
                                     shape=(80, DIM))
    got = []
    sim = Sim()
    a = pft.inference_job(sim.rt, RowWise().eval(), data, batch_size=UNIT, batch_sizes=SIZES,
                          item_cost_us=SIM_COSTS, sink=lambda i, y: got.append((i, y.clone())))
    sim.run(a, lambda: a.progress().finished or a.error is not None)
    a.wait(timeout=30)
    b = pft.inference_job(sim.rt, RowWise().eval(), data, batch_size=None, batch_sizes=SIZES,
                          item_cost_us=SIM_COSTS, sink=rows, name="memmap")
    sim.run(b, lambda: b.progress().finished or b.error is not None)
    b.wait(timeout=30)
    assert a.sizes_run[0] > 0 and a.sizes_run[2] > 0 and b.sizes_run[2] > 0
    assert [i for i, _ in got] == list(range(40))
    assert all(torch.equal(y, w) for (_, y), w in zip(got, want))
    assert torch.equal(torch.from_numpy(np.asarray(rows)), torch.cat(want))
    a.close()
    b.close()
    sim.close()


def test_host_outputs_equal_the_plain_loop_whatever_sizes_ran():
    """Host backend (real time; the planner's costs are learned from the slices, so which sizes
    run depends on the machine): outputs in order, equal to the module on the batches that ran."""
    data = Samples(121)
    module = Recording(model(5)).eval()
    got = []
    rt = host_runtime()
    job = pft.inference_job(rt, module, data, batch_size=None, batch_sizes=SIZES,
                            sink=lambda i, y: got.append((i, y.clone())))
    assert len(job.config_costs_us) == 3 and min(job.config_costs_us) > 0  # timed at creation
    module.rows.clear()
    host_bubbles(rt, lambda: job.progress().finished or job.error is not None)
    progress = job.wait(timeout=30)
    assert job.error is None and progress.items_done == 61
    assert [i for i, _ in got] == list(range(61))
    assert sum(module.rows) == 121 and sum(job.sizes_run) == len(module.rows)
    want = plain_loop_with_batches(module.inner, data, module.rows)
    assert all(torch.equal(y, w) for (_, y), w in zip(got, want))
    assert job.job.info().status == pf.JobStatus.COMPLETED
    job.close()
    rt.close()


def test_host_stated_costs_are_kept_per_size():
    """Host backend with item_cost_us given per size: the planner keeps each configuration's
    stated cost (pfJobSetCostPolicy 2) whatever the measured slices take."""
    data = Samples(4801)  # enough claims for several timed slices of the configuration in use (a loaded machine stages fewer per bubble)
    stated = [300.0, 500.0, 900.0]
    rt = host_runtime()
    job = pft.inference_job(rt, model(5).eval(), data, batch_size=None, batch_sizes=SIZES,
                            item_cost_us=stated, sink=lambda i, y: None)
    seen = []  # the cost of the configuration in use, read after every round of bubbles

    def done():
        seen.append(job.job.cost_info())
        return job.progress().finished or job.error is not None

    host_bubbles(rt, done)
    job.wait(timeout=30)
    assert job.error is None
    seen.append(job.job.cost_info())
    # Measured (enough to move a learned cost) at some point, but never used: every reading
    # is the stated cost of its configuration. (Which configuration is in use, and how many of
    # its slices were measured, depends on how many items the feeder staged per bubble.)
    assert max(c.samples for c in seen) >= 3
    for cost in seen:
        assert cost.prior_cost_us == stated[cost.config_index]
        assert cost.learned_cost_us == cost.prior_cost_us
    job.close()
    rt.close()


@pytest.mark.parametrize("how", ["close", "failure"])
def test_resume_mid_run_with_mixed_sizes_is_exact(tmp_path, how):
    """The first attempt stops mid-run (closed after 13 units, or its sink raises at unit 13)
    after items of both sizes; the second starts at the first unit not durably handed on (the
    progress file counts units of UNIT samples), and the two attempts' outputs are the
    single-size loop's."""
    data = Samples(120)
    want = [RowWise()(u) for u in units(data)]
    progress_file = tmp_path / "progress.json"
    got = {}
    sim = Sim()

    def sink(i, y):
        if how == "failure" and i == 13:
            raise RuntimeError("the disk is full")
        got[i] = y.clone()

    first = pft.inference_job(sim.rt, RowWise().eval(), data, batch_size=None,
                              batch_sizes=SIZES, item_cost_us=SIM_COSTS, sink=sink,
                              resume=progress_file, name="r")
    if how == "failure":
        sim.run(first, lambda: first.error is not None)
    else:
        sim.run(first, lambda: first.progress().items_done >= 13)
    first.close()
    state = json.loads(progress_file.read_text())
    assert state["samples"] == state["next"] * UNIT and state["rows"] == UNIT
    assert 13 <= state["next"] < 60
    if how == "failure":
        assert "the disk is full" in first.error and state["next"] == 13
    assert first.sizes_run[0] > 0 and first.sizes_run[2] > 0, first.sizes_run
    assert sorted(got) == list(range(len(got)))

    second = pft.inference_job(sim.rt, RowWise().eval(), data, batch_size=None,
                               batch_sizes=SIZES, item_cost_us=SIM_COSTS,
                               sink=lambda i, y: got.__setitem__(i, y.clone()),
                               resume=progress_file, name="r")
    assert second.resumed_from == state["next"]
    sim.run(second, lambda: second.progress().finished or second.error is not None)
    progress = second.wait(timeout=30)
    assert second.error is None and progress.items_done == 60 and progress.items_total == 60
    assert sorted(got) == list(range(60))
    assert all(torch.equal(got[i], want[i]) for i in range(60))
    assert json.loads(progress_file.read_text())["next"] == 60
    second.close()
    # A progress file of another unit is refused, naming it.
    with pytest.raises(ValueError, match="its rows is 2, this job's is 4"):
        pft.inference_job(sim.rt, RowWise().eval(), data, batch_size=None, batch_sizes=[4, 8],
                          item_cost_us=[1.0, 2.0], sink=lambda i, y: None,
                          resume=progress_file, name="r")
    sim.close()


@pytest.mark.parametrize("kw, message", [
    (dict(batch_sizes=[0]), r"batch_sizes = \[0\]: 0 is not an int >= 1"),
    (dict(batch_sizes=[2, 2.5]), r"batch_sizes = \[2, 2.5\]: 2.5 is not an int >= 1"),
    (dict(batch_sizes=[True]), r"batch_sizes = \[True\]: True is not an int >= 1"),
    (dict(batch_sizes=[]), r"batch_sizes = \[\] \(1 to 16 sizes\)"),
    (dict(batch_sizes="4"), r"batch_sizes = '4' \(a list of ints >= 1\)"),
    (dict(batch_sizes=[4, 6]), r"batch_sizes = \[4, 6\]: 6 is not a multiple of the smallest "
                               r"size, 4"),
    (dict(batch_sizes=[2, 4, 2]), r"batch_sizes = \[2, 4, 2\] has a size twice"),
    (dict(batch_sizes=[2, 4], batch_size=4), r"batch_size = 4 with batch_sizes = \[2, 4\]"),
    (dict(batch_sizes=[2, 4], item_cost_us=[1.0]), r"item_cost_us = \[1.0\] with batch_sizes"),
    (dict(batch_sizes=[2, 4], item_cost_us=-1.0), r"item_cost_us = -1.0 \(must be > 0\)"),
    (dict(batch_sizes=[2, 4], item_cost_us=object), r"item_cost_us = <class 'object'> with"),
    (dict(batch_sizes=[2, 4], slots=1), r"slots = 1"),
])
def test_bad_input_is_refused_at_creation_naming_the_value(kw, message):
    rt = host_runtime()
    kw.setdefault("batch_size", None)
    with pytest.raises(ValueError, match=message):
        pft.inference_job(rt, RowWise().eval(), Samples(20), sink=lambda i, y: None, **kw)
    assert rt.jobs == []  # a refused job leaves nothing behind
    rt.close()


def test_a_module_whose_output_has_no_rows_is_refused():
    class Pooled(nn.Module):
        def forward(self, x):
            return x.sum()

    rt = host_runtime()
    with pytest.raises(ValueError, match=r"output split back into rows: on a batch of 2 rows"):
        pft.inference_job(rt, Pooled().eval(), Samples(20), batch_size=None, batch_sizes=[2, 4],
                          sink=lambda i, y: None)
    assert rt.jobs == []
    rt.close()
