"""The Python benchmarks and examples that print the issue's figures still run: each script with
tiny arguments, checked for its summary line. profile_item_path.py called two functions that
streaming_bench.py no longer had (AttributeError) and nothing noticed; a figure that cannot be
printed cannot be compared."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPTS = [
    ("python/examples/streaming_bench.py", ["--items", "40", "--runs", "1", "--no-memory"],
     "median of 1 runs"),
    ("benchmarks/python/item_path_ceiling.py",
     ["--items", "400", "--runs", "1", "--bubble-us", "5000"], "inference_job:"),
    ("benchmarks/python/profile_item_path.py", ["--items", "40", "--runs", "1"],
     "item function (Python)"),
    ("benchmarks/python/trainer_phases.py", [], "compute phase"),
    ("python/examples/micro_steps_bench.py", ["--bubbles", "10", "--step-ms", "4", "--rounds", "1"],
     "micro_batches  8"),
    ("python/examples/micro_steps_bench.py", ["--bubbles", "10", "--step-ms", "4", "--rounds", "1",
                                              "--micro-batches", "8", "--compute-us", "500"],
     "x its plain step"),
    ("python/examples/batch_sizes_bench.py", ["--bubbles", "10"], "samples per bubble-second"),
]


@pytest.mark.parametrize("script,args,expected", SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_the_script_runs_and_prints_its_summary(script, args, expected):
    run = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{script}: rc {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert expected in run.stdout, f"{script}: no '{expected}' in\n{run.stdout}\n{run.stderr}"
