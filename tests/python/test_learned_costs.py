"""Item costs learned from measured slices (src/core/cost_model.hpp), on the real-time host
backend: an item job created with an item cost 25x too large (the creation-time timing of a busy
rank) still runs all its items within a bounded number of bubbles, and Job.cost_info() shows the
learned cost near the real one. Bounds are generous (a loaded 2-core machine): the point is that
without learning a 25 ms item never fits a 10 ms bubble and no item would ever run.
"""
from __future__ import annotations

import time

import pipefill as pf
from pipefill._runtime import Job

ITEMS = 40
REAL_ITEM_S = 0.001          # each item spins for 1 ms on the fill thread
GIVEN_COST_US = 25_000.0     # 25x the real item
BUBBLE_US = 10_000.0
MAX_BUBBLES = 200            # ~8 needed when idle; generous for a loaded machine


def spin(_index: int) -> None:
    end = time.perf_counter() + REAL_ITEM_S
    while time.perf_counter() < end:
        pass


def test_a_cost_25x_too_large_is_learned_and_every_item_runs():
    rt = pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                    safety_margin_fraction=0.0, min_samples=1000000, log_level=pf.LogLevel.ERROR)
    try:
        job = Job(rt, None, rt._native.create_item_job("misjudged", 0, ITEMS, GIVEN_COST_US, spin,
                                                       ITEMS))
        before = job.cost_info()
        assert isinstance(before, pf.CostInfo)
        assert before.prior_cost_us == GIVEN_COST_US
        assert before.learned_cost_us == GIVEN_COST_US  # the prior until measured
        assert before.samples == 0
        stream = rt.high_priority_stream()
        bubbles = 0
        while job.info().items_completed < ITEMS and bubbles < MAX_BUBBLES:
            with rt.bubble(stream, expected_us=BUBBLE_US):
                pf.host_stream_delay(stream, BUBBLE_US)
            rt.iteration_end()
            pf.host_stream_synchronize(stream)
            rt.synchronize()
            bubbles += 1
        info = job.info()
        cost = job.cost_info()
        assert info.items_completed == ITEMS, (bubbles, info, cost)
        assert cost.probes >= 1, cost           # the first measurement came from a probe
        assert cost.samples >= 2, cost
        # Near the real 1 ms: well below the 25 ms prior, at least the spin itself.
        assert 0.8 * REAL_ITEM_S * 1e6 <= cost.learned_cost_us <= 8_000.0, cost
        assert cost.prior_cost_us == GIVEN_COST_US
        assert cost.too_short_streak == 0 and not cost.warned, cost
        job.wait(timeout=30)
        job.close()
    finally:
        rt.close()
