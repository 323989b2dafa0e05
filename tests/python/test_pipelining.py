"""torch.distributed.pipelining over gloo on CPU, 4 processes, with pipefill.torch.instrument.

For GPipe, 1F1B, interleaved 1F1B, looped BFS and the zero-bubble schedules (interleaved ZB,
ZBV, DualPipeV) each rank trains a few steps without PipeFill and again with it (a fill job on
the rank's runtime on the simulated backend; a second run puts GPipe, 1F1B and interleaved
1F1B on the real-time host device with a graph fill job), then checks:
bubble instructions per stage == the receive waits of the schedule's own action list; losses
and gradients bit-identical; fill work (from the runtime's trace) only inside bubbles. The
failure tests make one rank raise, exit or stall and check that every process ends, that no
bubble is left open and that every runtime closes.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import pipefill as pf  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORLD = 4
WORKER = pathlib.Path(__file__).with_name("pipelining_worker.py")
SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
             "ZBVZeroBubble", "DualPipeV"]


def launch(tmp: pathlib.Path, scenario: str, deadline_s: float, timeout_s: float = 30.0,
           schedules: str = ""):
    """Starts WORLD worker processes; returns (return codes, per-rank JSON or None, seconds).
    Processes still running at the deadline are killed and the test fails: nothing may hang."""
    env = dict(os.environ, WORLD_SIZE=str(WORLD), PIPEFILL_TEST_OUT=str(tmp),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PIPEFILL_DEBUG="error")
    start = time.monotonic()
    procs = []
    for rank in range(WORLD):
        log = open(tmp / f"log{rank}.txt", "w")
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKER), "--scenario", scenario, "--timeout", str(timeout_s)]
            + (["--schedules", schedules] if schedules else []),
            env=dict(env, RANK=str(rank)), stdout=log, stderr=subprocess.STDOUT))
    codes = []
    for rank, p in enumerate(procs):
        try:
            codes.append(p.wait(timeout=max(1.0, deadline_s - (time.monotonic() - start))))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            logs = "\n".join((tmp / f"log{r}.txt").read_text()[-2000:] for r in range(WORLD))
            pytest.fail(f"{scenario}: rank {rank} still running after {deadline_s} s:\n{logs}")
    seconds = time.monotonic() - start
    results = []
    for rank in range(WORLD):
        path = tmp / f"rank{rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else None)
    for rank, r in enumerate(results):
        if r is not None and "fatal" in r:
            pytest.fail(f"rank {rank} failed outside the scenario:\n{r['fatal']}")
    return codes, results, seconds


@pytest.fixture(scope="module")
def equivalence(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipelining")
    codes, results, _ = launch(tmp, "equivalence", deadline_s=400)
    assert codes == [0] * WORLD
    return results


def result(equivalence, rank: int, name: str) -> dict:
    r = equivalence[rank][name]
    if "skipped" in r:
        pytest.skip(r["skipped"])
    assert "exception" not in r, r["exception"]
    return r


@pytest.mark.parametrize("name", SCHEDULES)
def test_bubble_instructions_equal_the_schedules_receive_waits(equivalence, name):
    for rank in range(WORLD):
        r = result(equivalence, rank, name)
        steps = len(r["step_bubbles"])
        assert steps == 3 and r["iterations"] == steps  # every step() ended an iteration
        # Counted from the schedule's own pipeline_order, independently of the hook.
        assert r["expected_waits"] > 0
        assert r["step_bubbles"] == [r["expected_waits"]] * steps, rank
        if r["recv_actions"] is not None:  # the comms-expanded action list agrees
            assert r["recv_actions"] == r["expected_waits"], rank
        # What the runtime received: begin/end pairs harvested as bubbles.
        assert r["runtime_bubbles"] == r["expected_waits"] * steps, rank
        assert not r["in_bubble_after"] and r["errors"] == []


@pytest.mark.parametrize("name", SCHEDULES)
def test_losses_and_gradients_are_bit_identical(equivalence, name):
    losses = 0
    for rank in range(WORLD):
        r = result(equivalence, rank, name)
        assert r["identical_losses"] and r["identical_grads"], rank
        losses += r["losses_seen"]
    assert losses > 0  # the rank holding the last stage compared real losses


@pytest.mark.parametrize("name", SCHEDULES)
def test_fill_work_runs_only_inside_bubbles_simulated(equivalence, name):
    """Simulated backend: bubbles last as long as the real waits (mirrored), the fill job's
    slices (from the runtime's trace) lie inside the bubble they were launched for, each item
    ran once."""
    for rank in range(WORLD):
        r = result(equivalence, rank, name)
        assert r["fill_slices"] > 0 and r["items_run"] > 0, rank
        assert r["fill_slices_outside"] == 0, rank
        assert r["items_run"] == r["items_completed"] and r["duplicates"] == 0


HOST_SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B"]


@pytest.fixture(scope="module")
def host_runs(tmp_path_factory):
    """One 4-process run of HOST_SCHEDULES with every rank's runtime on the real-time host
    device (skipped where the build has no host device)."""
    try:
        with pf.Runtime(backend="host"):
            pass
    except pf.PipeFillError as error:
        if error.code == pf.Result.NOT_SUPPORTED:
            pytest.skip(f"no host device in this build: {error.message}")
        raise
    tmp = tmp_path_factory.mktemp("pipelining-host")
    env_schedules = ",".join(HOST_SCHEDULES)
    codes, results, _ = launch(tmp, "host", deadline_s=400, schedules=env_schedules)
    assert codes == [0] * WORLD
    return results


@pytest.mark.parametrize("name", HOST_SCHEDULES)
def test_fill_work_runs_only_inside_bubbles_on_the_host_device(host_runs, name):
    """Each rank's runtime on the real-time host device with a graph fill job (host-device
    items of 200 µs of real time): bubble instructions per stage equal the schedule's receive
    waits; its slices (from the runtime's trace) start inside the bubble they were launched for;
    no item starts outside a bubble, except at most the one per bubble that was claimed before
    the gate closed (counts from item start times on the trace's clock, so the machine's load
    does not matter); every item ran once in index order; losses and gradients are
    bit-identical to the run without PipeFill."""
    for rank in range(WORLD):
        r = result(host_runs, rank, name)
        assert r["identical_losses"] and r["identical_grads"], rank
        assert r["step_bubbles"] == [r["expected_waits"]] * 3, rank
        assert r["runtime_bubbles"] == 3 * r["expected_waits"], rank
        assert r["fill_slices"] > 0 and r["items_run"] > 0, rank
        assert r["fill_slices_outside"] == 0, rank  # starts inside its bubble
        assert r["items_outside"] == 0 and r["most_late_items"] <= 1, rank
        assert r["items_run"] == r["items_completed"], rank
        assert (r["duplicates"], r["out_of_order"], r["index_mismatches"]) == (0, 0, 0), rank
        assert r["errors"] == [], rank


@pytest.mark.parametrize("mode", ["raise", "exit", "hang"])
def test_nothing_hangs_when_a_rank_fails(tmp_path, mode):
    timeout_s = 2.0
    codes, results, seconds = launch(tmp_path, mode, deadline_s=120, timeout_s=timeout_s)
    failing = 2  # pipelining_worker.FAIL_RANK
    if mode == "exit":
        assert codes[failing] == 17 and results[failing] is None
    else:
        assert "injected" in results[failing]["error"]
    interrupted = 0
    for rank, r in enumerate(results):
        if r is None:
            continue
        assert r["error"], rank  # every surviving rank saw the failure as an exception
        assert r["in_bubble_after_failure"] is False, rank  # no bubble was left open
        assert r["runtime_closed"] is True, (rank, r.get("close_error"))
        if rank != failing:
            assert any(w in r["error"] for w in ("Timed out", "closed", "reset")), r["error"]
            interrupted += r["interrupted_waits"]
    # The failure reached some peer inside a receive wait, that is inside a bubble, and the
    # bubble was ended all the same (others met it in a send or when posting).
    assert interrupted >= 1
    assert codes == [0 if r is not None else 17 for r in results]
