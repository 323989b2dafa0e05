"""Jobs created, waited on and destroyed from the user's thread while torch items run (issue 25).

gil_stress_worker.py runs 100 rounds: in each, the trainer's bubble is enqueued (so a
pipefill.torch job's items run on the fill thread, each needing the GIL) and the main thread
creates the README's native MlpInference job, reads its info and the stats, waits on it with a
timeout, destroys it, and every tenth round creates and closes a second torch job. Before the
fix the first create_job deadlocked (3 of 3 runs by a user; reproduced here against the old
extension). The worker runs in its own process under a deadline, dumping every thread's stack
if it is reached, so a deadlock fails this test instead of hanging the suite.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

import pipefill as pf

WORKER = pathlib.Path(__file__).with_name("gil_stress_worker.py")


def test_jobs_from_the_main_thread_while_torch_items_run_100_times(tmp_path):
    try:
        pf.Runtime(backend="host").close()
    except pf.PipeFillError as error:
        if error.code == pf.Result.NOT_SUPPORTED:
            pytest.skip(f"no host device in this build: {error.message}")
        raise
    out = tmp_path / "counts.json"
    # The worker's own deadline (faulthandler, 240 s) comes first: its stacks are the message.
    proc = subprocess.run([sys.executable, str(WORKER), "100", str(out), "240"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"deadlock or failure:\n{proc.stdout[-4000:]}{proc.stderr[-8000:]}"
    counts = json.loads(out.read_text())
    assert counts["rounds"] == 100
    assert counts["native_created"] == 100
    assert counts["torch_jobs_created"] == 10
    # The point of the test: torch items were running while the main thread made those calls
    # (items completed between the bubble's enqueue and the round's end in most rounds).
    assert counts["items_seen_running"] >= 10, counts
    assert counts["outputs"] > 0
