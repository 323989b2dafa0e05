"""The C trainer's 4-stage pipeline driven from Python gives the C program's figures.

python/examples/sim_trainer.py is examples/c_trainer/main.c written against the pipefill
package. Both run here, in the same test, with the same arguments; their printed tables
(run time, bubbles, bubble time, filled time and share, fill items, slowdown, bubbles filled,
max overrun) must be identical.
"""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args", [
    [],
    ["--iterations", "3", "--item-us", "7.5"],
    ["--iterations", "4", "--items", "5000", "--item-us", "25"],
])
def test_python_trainer_prints_the_c_trainers_figures(repo, c_trainer, args):
    c = subprocess.run([str(c_trainer), *args], capture_output=True, text=True, timeout=120)
    assert c.returncode == 0, c.stderr
    py = subprocess.run([sys.executable, str(repo / "python" / "examples" / "sim_trainer.py"),
                         *args], capture_output=True, text=True, timeout=120)
    assert py.returncode == 0, py.stderr
    c_lines, py_lines = c.stdout.splitlines(), py.stdout.splitlines()
    assert len(c_lines) == 5
    # A run that filled something, so that equal tables mean equal filling.
    filled = c_lines[3].split()
    assert filled[0] == "filling" and int(filled[2]) > 0 and int(filled[6]) > 0
    assert py_lines == c_lines
