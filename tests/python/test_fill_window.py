"""The host backend's fill window and the fill threads' torch threads (issue 32 item 1: the
trainer's step while a Python job fills its bubbles).

- Runtime.fill_window_open / wait_fill_window / fill_windows: a fill slice in progress (the
  extension's native slice observer counts them) whose bubble has not ended (a marker behind the
  bubble's end on the trainer's stream); an item claimed in a bubble sees the window open.
- inference_job's feeder (the dataset) and drainer (the sink) run inside the windows once the
  ring's first fill is staged: outside them they would hold the GIL the trainer needs.
- an item's thread has the process's torch intra-op thread count (OpenMP keeps it per thread: a
  fill thread had the core count, and its matmuls' spinning team slowed the trainer).
"""
from __future__ import annotations

import ctypes
import os
import threading
import time

import pytest
import torch
from torch import nn

import pipefill as pf
import pipefill.torch as pft
from test_torch_jobs import host_runtime

ALL = (1 << 64) - 1


def trainer(rt: pf.Runtime, done, bubble_us: float = 3000.0, compute_s: float = 0.003,
            max_steps: int = 2000) -> int:
    """Bubbles, and between them the trainer's compute (here a sleep: the GIL is free for any
    fill thread that would run outside the bubbles)."""
    stream = rt.high_priority_stream()
    steps = 0
    while not done() and steps < max_steps:
        with rt.bubble(stream, expected_us=bubble_us):
            pf.host_stream_delay(stream, bubble_us)
        pf.host_stream_synchronize(stream)
        time.sleep(compute_s)
        rt.iteration_end()
        steps += 1
    return steps


def test_the_window_is_open_exactly_while_slices_run():
    rt = host_runtime()
    native = rt._native
    assert not native.fill_window_open()
    assert native.fill_windows() == 0
    t0 = time.monotonic()
    assert native.wait_fill_window(0.02) is False  # no bubble: the wait times out
    assert time.monotonic() - t0 >= 0.015
    with pytest.raises(pf.PipeFillError, match="timeout_s = -1"):
        native.wait_fill_window(-1.0)
    seen = []
    job = native.create_item_job("window", 0, 40, 100.0,
                                 lambda item: seen.append(native.fill_window_open()), ALL, True)
    steps = trainer(rt, lambda: len(seen) >= 40)
    assert len(seen) == 40 and all(seen)  # every item ran inside a window
    assert 1 <= native.fill_windows() <= steps
    assert not native.fill_window_open()  # the last slice ended with its bubble
    del job
    rt.close()


def test_the_window_closes_at_the_bubbles_end_while_its_last_item_runs():
    """The bubble's end on the trainer's stream closes the window, although the item in flight
    at the gate runs on: the feeder and drainer must not compete with the trainer's compute
    beside it. The next bubble's slice opens a new window."""
    rt = host_runtime()
    native = rt._native
    started, release = threading.Event(), threading.Event()
    ran = []

    def item(i):
        ran.append(i)
        if i == 0:
            started.set()
            release.wait(10.0)  # the item stays in flight past its bubble, GIL released

    job = native.create_item_job("tail", 0, 2, 100.0, item, ALL, True)
    stream = rt.high_priority_stream()
    try:
        for _ in range(50):
            with rt.bubble(stream, expected_us=3000.0):
                pf.host_stream_delay(stream, 3000.0)
            pf.host_stream_synchronize(stream)  # the bubble's end ran on the stream
            rt.iteration_end()
            if started.is_set():
                break
        assert started.is_set()
        assert ran == [0] and not release.is_set()  # item 0 still running, its bubble over
        assert not native.fill_window_open()
        opened = native.fill_windows()
    finally:
        release.set()
    trainer(rt, lambda: len(ran) >= 2)
    assert ran == [0, 1]
    assert native.fill_windows() > opened  # item 1's slice opened a window of its own
    del job
    rt.close()


def test_other_backends_have_no_window():
    rt = pf.Runtime(backend="sim")
    assert rt._native.fill_window_open() is False
    assert rt._native.wait_fill_window(1.0) is False  # at once: no window to wait for
    rt.close()


class SleepyIdentity(nn.Module):
    """An item of ~200 us that leaves the GIL free (a sleep), so the window lasts a while."""

    def forward(self, x):
        time.sleep(0.0002)
        return x


def test_feeder_and_sink_run_inside_the_windows():
    rt = host_runtime()
    native = rt._native
    batches, slots = 150, 32
    produced, sunk = [], []

    def data():
        for i in range(batches):
            produced.append(native.fill_window_open())
            yield torch.full((2, 4), float(i))

    job = pft.inference_job(rt, SleepyIdentity().eval(), data(), batch_size=None, slots=slots,
                            sink=lambda i, y: sunk.append(native.fill_window_open()),
                            item_cost_us=300.0)
    # Compute phases longer than the drainer's longest sleep (10 ms): an ungated drainer would
    # wake in them, free slots, and the feeder would fill them there.
    trainer(rt, lambda: job.progress().finished or job.error is not None, compute_s=0.015)
    job.wait(timeout=30)
    assert len(produced) == batches and len(sunk) == batches
    # The first ring is staged at once; after it, a batch is produced outside a window only
    # when the job has nothing staged left to run (then its next slice needs it), and ~10
    # items a bubble never empty a ring of 32. (A batch started as its window closes may be
    # seen closed: a few are allowed.)
    outside = produced[slots:].count(False)
    assert outside <= 3, f"{outside} of {batches - slots} batches were produced outside windows"
    # The sink: inside the windows, but for the outputs drained once every staged item ran.
    assert sunk.count(False) <= batches // 5, f"{sunk.count(False)} sink calls outside windows"
    job.close()
    rt.close()


def test_a_job_that_empties_its_ring_each_bubble_keeps_its_slices_full():
    """Trivial items: every bubble could run the whole ring. A slice takes only the items staged
    when it is planned, so with staging and draining inside the windows only, a shrinking
    backlog made shorter slices and shorter windows, down to 0-5 items a bubble
    (item_path_ceiling.py: 4,098-9,615 items/s). Below half a ring of staged items the feeder
    stages, and the drainer drains, outside the window too."""
    rt = host_runtime()
    slots, items = 64, 3000
    job = pft.inference_job(rt, nn.Identity().eval(), (torch.ones(1, 8) for _ in range(items)),
                            batch_size=None, slots=slots, sink=lambda i, y: None,
                            item_cost_us=5.0)
    stream = rt.high_priority_stream()
    per_bubble, before = [], 0
    while not job.progress().finished and job.error is None and len(per_bubble) < 400:
        with rt.bubble(stream, expected_us=8000.0):
            pf.host_stream_delay(stream, 8000.0)
        pf.host_stream_synchronize(stream)
        time.sleep(0.004)  # the trainer's compute
        rt.iteration_end()
        done = job.progress().items_done
        per_bubble.append(done - before)
        before = done
    job.wait(timeout=30)
    steady = sorted(per_bubble[2:-2])
    assert steady, per_bubble
    median = steady[len(steady) // 2]
    # Half a ring is staged before each slice; the spiral ran a few items a bubble.
    assert median >= slots // 4, f"items per bubble: {per_bubble}"
    job.close()
    rt.close()


def _omp_max_threads():
    """omp_get_max_threads of the OpenMP runtime torch loaded (None when there is none)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "omp" in line.rsplit("/", 1)[-1]
                 and line.split()[-1].startswith("/")}
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).omp_get_max_threads
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        return fn
    return None


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: OpenMP's default is 1 anyway")
def test_an_items_thread_has_the_processes_torch_threads():
    omp_max_threads = _omp_max_threads()
    if omp_max_threads is None or not torch.__config__.parallel_info().count("OpenMP"):
        pytest.skip("torch here does not use OpenMP")
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rt = host_runtime()
        seen = []

        class Record(nn.Module):
            def forward(self, x):
                seen.append(omp_max_threads())  # before any torch call of the item
                return x

        job = pft.inference_job(rt, Record().eval(), [torch.ones(1, 4)] * 6, batch_size=None,
                                sink=lambda i, y: None, item_cost_us=100.0)
        seen.clear()  # the call at creation ran on this thread
        trainer(rt, lambda: job.progress().finished or job.error is not None)
        job.wait(timeout=30)
        assert seen and set(seen) == {1}, seen
        job.close()
        rt.close()
    finally:
        torch.set_num_threads(saved)


def _child() -> None:
    pass


def test_a_process_forked_by_an_item_exits_cleanly():
    """A Python item that starts a process with the fork method (a DataLoader with workers does,
    inside a training_job's item) forks the host device's fill thread; after
    threading.current_thread() ran there (torch's DataLoader calls it), the child's main thread
    was a _DummyThread and the child exited with code 1 at its end (CPython 3.11)."""
    import multiprocessing
    import threading
    context = multiprocessing.get_context("fork")
    rt = host_runtime()
    codes = []

    def item(i):
        threading.current_thread()  # what torch's DataLoader does before starting its workers
        process = context.Process(target=_child)
        process.start()
        process.join(30)
        codes.append(process.exitcode)

    job = rt._native.create_item_job("forks", 0, 3, 100.0, item, ALL, True)
    trainer(rt, lambda: len(codes) >= 3)
    assert codes == [0, 0, 0]
    del job
    rt.close()
