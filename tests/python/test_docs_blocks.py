"""Every ```python block of README.md and docs/*.md runs as written (issue 25): each is extracted
(dedented when it sits in a list) and run in a fresh interpreter in an empty folder, under a
timeout, with no PIPEFILL_* variables. A block that needs what a CPU machine has not - a GPU, a
cluster of ranks, a trainer's own objects - is marked on the line before its fence with

    <!-- docs-test: skip: <why> -->

and is reported skipped with that reason. README.md's first block under "Using it from Python"
is run and its printed figures checked by test_readme.py; it is marked so here, not run twice."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SKIP = re.compile(r"<!--\s*docs-test:\s*skip:\s*(.+?)\s*-->")
FENCE = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)


def blocks():
    found = []
    for path in [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md")):
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[:match.start()].rstrip("\n ").rsplit("\n", 1)[-1]
            skip = SKIP.search(before)
            found.append(pytest.param(textwrap.dedent(match.group(2)),
                                      skip.group(1) if skip else None,
                                      id=f"{path.relative_to(REPO)}:{line}"))
    return found


BLOCKS = blocks()


def test_the_docs_have_python_blocks_and_every_skip_has_a_reason():
    assert len(BLOCKS) >= 10
    runnable = [b for b in BLOCKS if b.values[1] is None]
    assert len(runnable) >= 3, "most CPU-runnable blocks run"
    assert all(b.values[1] is None or len(b.values[1]) > 8 for b in BLOCKS)


@pytest.mark.parametrize("source,skip", BLOCKS)
def test_python_block_runs_as_written(source, skip, tmp_path):
    if skip is not None:
        pytest.skip(skip)
    script = tmp_path / "block.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEFILL_")}
    env["OMP_NUM_THREADS"] = "1"
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path, env=env)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the block still ran after 300 s:\n{source}\n{error.stdout}\n{error.stderr}")
    assert done.returncode == 0, f"{source}\n--- output ---\n{done.stdout}\n{done.stderr[-4000:]}"
