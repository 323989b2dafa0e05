"""The host item path (issue 32 items 1 and 3): the planner's item cost for Python items (an
explicit item_cost_us kept; slow in-bubble slices do not starve the job), and the native wait the
drainer sleeps in instead of a wake-up per item.
"""
from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import pipefill as pf
import pipefill.torch as pft
from pipefill._runtime import Job
from test_torch_jobs import host_runtime, run_bubbles


class SlowInBubbles(nn.Module):
    """An item that takes 2 ms inside bubbles (it sleeps there), nothing at creation."""

    def __init__(self) -> None:
        super().__init__()
        self.sleep_s = 0.0

    def forward(self, x):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return x


def test_explicit_item_cost_is_kept_not_learned():
    rt = host_runtime()
    slow = SlowInBubbles()
    given = pft.inference_job(rt, slow.eval(), [torch.ones(1, 4)] * 30, batch_size=None,
                              sink=lambda i, y: None, item_cost_us=500.0, name="given")
    slow.sleep_s = 0.002
    run_bubbles(rt, lambda: given.progress().finished or given.error is not None,
                max_bubbles=400, bubble_us=6000.0)
    cost = given.job.cost_info()
    given.wait(timeout=30)
    assert cost.samples >= 3  # slices were measured ...
    assert cost.learned_cost_us == 500.0  # ... and the given cost kept
    given.close()

    timed = pft.inference_job(rt, SlowInBubbles().eval(), [torch.ones(1, 4)] * 30, batch_size=None,
                              sink=lambda i, y: None, name="timed")
    timed.module.sleep_s = 0.002
    run_bubbles(rt, lambda: timed.progress().finished or timed.error is not None,
                max_bubbles=400, bubble_us=6000.0)
    learned = timed.job.cost_info()
    timed.wait(timeout=30)
    assert learned.learned_cost_us > 1500.0  # timed at creation (~0), learned from the slices
    timed.close()
    rt.close()


def test_wait_items_run_returns_at_the_target_and_refuses_bad_timeouts():
    rt = host_runtime()
    job = pft.inference_job(rt, nn.Identity().eval(), [torch.ones(1, 4)] * 8, batch_size=None,
                            sink=lambda i, y: None, item_cost_us=50.0)
    native = job.job._native
    with pytest.raises(pf.PipeFillError, match="timeout_s = -1"):
        native.wait_items_run(1, -1.0)
    assert native.wait_items_run(1, 0.0) == 0  # no bubble yet: nothing ran
    run_bubbles(rt, lambda: job.progress().finished, max_bubbles=200)
    assert native.wait_items_run(8, 1.0) == 8
    job.wait(timeout=30)
    job.close()
    rt.close()


def test_a_burst_of_slow_items_does_not_starve_the_job():
    """Five items that take 10 ms (longer than the 6 ms bubbles: a rank's CPU busy for a while),
    then 0.2 ms ones. Measured by the window's median, the estimate would stay above the bubbles
    until six fast probes came in (2 + 4 + ... + 64 bubbles); the fastest sample keeps the job
    running."""
    rt = host_runtime()
    done = []

    def item(k: int) -> None:
        time.sleep(0.010 if k < 5 else 0.0002)
        done.append(k)

    job = Job(rt, None, rt._native.create_item_job("burst", 0, 60, 300.0, item, 60))
    bubbles = run_bubbles(rt, lambda: len(done) == 60, max_bubbles=60, bubble_us=6000.0)
    cost = job.cost_info()
    assert done == list(range(60)), f"{len(done)} of 60 items after {bubbles} bubbles ({cost})"
    assert cost.learned_cost_us < 6000.0
    job.close()
    rt.close()
