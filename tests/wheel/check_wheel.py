"""Installs a pipefill wheel (scripts/build-wheel.sh) into a fresh virtual environment and checks that
it works there on its own - the test of scripts/test.sh's wheel stage, which runs it inside
scripts/with-hidden-deps.sh --hide-cuda-toolkit (no Debian dev packages, no CUDA toolkit: what a
GPU node has), and of the GPU machine's check (scripts/gpu-check.sh's wheel step, --gpu).

  1. `python -m venv`, then `pip install --no-index <wheel>` (timed: the install a user waits for);
  2. bare (no torch): `import pipefill` resolves to the venv's copy, WITH_CUDA is as expected, the
     README's first Python snippet runs as written (20 steps -> 20 iterations and 40 bubbles, some
     filled, items run), no fmt/spdlog/CUDA/NCCL library is mapped into the process, and
     Runtime(backend="cuda") fails cleanly with NO_DEVICE without a GPU (--gpu: starts on one);
  3. with torch (--torch-from: the site folders of an interpreter that has torch are put on the
     fresh venv's path): `import pipefill` before and after `import torch`, each in a fresh
     process, then a runtime; pipefill still the venv's copy; then every runnable ```python
     block of README.md and docs/*.md (tests/python/test_docs_blocks.py, under the fresh venv's
     interpreter, its pytest from the torch interpreter's folders): the docs' examples as a user
     of `pip install` runs them, not only from the build tree.
Stdlib only: it runs under the interpreter the wheel is for. Exits non-zero on the first failure.
Usage: check_wheel.py <wheel> [--expect-cuda 0|1] [--torch-from PYTHON] [--gpu]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = re.compile(r"lib(fmt|spdlog|nccl|cudart|cublas|cublasLt|cupti|cuda)\.so[.0-9]*")


def readme_snippet() -> str:
    """The README's first ```python block (under "Using it from Python"), as tests/python/test_readme.py reads it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using it from Python"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def fail(message: str) -> None:
    print(f"check_wheel: FAIL: {message}", flush=True)
    sys.exit(1)


def run(python: Path, code: str, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd)
    if done.returncode != 0:
        fail(f"{python} -c ...\n{code}\nexited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return done.stdout


# Run in the fresh venv: where pipefill came from, and what the extension says about itself.
WHERE = """
import sys, pipefill
from pipefill import _pipefill
print(pipefill.__file__); print(_pipefill.__file__); print(int(pipefill.WITH_CUDA))
"""

CUDA_BACKEND = """
import pipefill as pf
try:
    with pf.Runtime(backend="cuda") as rt:
        print("started", rt.stats().bubbles)
except pf.PipeFillError as error:
    # The message only on a second line: gpu-check.sh reads "no ... CUDA device" in a failed
    # step's log as a clean refusal, so a passing line must not carry it.
    print("refused", error.code.name)
    print(error.message)
"""

TORCH_FIRST = "import torch, torch.distributed\nimport pipefill as pf\n"
PIPEFILL_FIRST = "import pipefill as pf\nimport torch, torch.distributed\n"
# The folders torch (and what it imports) is found in, for another interpreter's path (found, not
# imported: the interpreter's torch may need libraries only LD_LIBRARY_PATH gives it).
TORCH_SITE = """
import importlib.util, os, site, sysconfig
spec = importlib.util.find_spec("torch")
assert spec is not None, "no torch in this interpreter"
folders = [os.path.dirname(os.path.dirname(spec.origin))] + site.getsitepackages()
folders += [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
print("\\n".join(dict.fromkeys(f for f in folders if os.path.isdir(f))))
"""

AFTER_IMPORTS = """
rt = pf.Runtime(backend="sim"); rt.close()
print(pf.__file__); print(torch.__version__)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--expect-cuda", choices=("0", "1"), help="pipefill.WITH_CUDA must be this")
    parser.add_argument("--torch-from", type=Path,
                        help="an interpreter with torch (its site folders go on the fresh venv's path)")
    parser.add_argument("--gpu", action="store_true", help="a GPU is present: the CUDA backend must start")
    args = parser.parse_args()
    wheel = args.wheel.resolve()
    if not wheel.is_file():
        fail(f"no wheel at {wheel}")

    with tempfile.TemporaryDirectory(prefix="pipefill-wheel-venv-") as tmp:
        venv = Path(tmp) / "venv"
        t0 = time.monotonic()
        python = venv / "bin" / "python"
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
        env = {k: v for k, v in env.items() if not k.startswith("PIPEFILL_") and k != "PYTHONPATH"}
        pip = [str(python), "-m", "pip"]
        if subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True).returncode != 0:
            # An interpreter without ensurepip (Debian's without python3-venv): its own pip installs.
            subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True)
            pip = [sys.executable, "-m", "pip", "--python", str(python)]
        t1 = time.monotonic()
        done = subprocess.run(pip + ["install", "--no-index", "-q", str(wheel)],
                              capture_output=True, text=True, env=env)
        t2 = time.monotonic()
        if done.returncode != 0:
            fail(f"pip install {wheel.name} failed:\n{done.stdout}{done.stderr}")
        print(f"check_wheel: fresh venv {t1 - t0:.1f} s; pip install --no-index {wheel.name}: "
              f"{t2 - t1:.1f} s ({wheel.stat().st_size / 2**20:.1f} MiB)", flush=True)
        site = Path(run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])", env=env).strip())
        work = Path(tmp) / "work"  # cwd of every check: never the checkout (no ./python/pipefill)
        work.mkdir()

        # ---- 2. bare --------------------------------------------------------------------------
        package, extension, with_cuda = run(python, WHERE, env=env, cwd=work).split()
        for path in (package, extension):
            if not Path(path).resolve().is_relative_to(site.resolve()):
                fail(f"pipefill was imported from {path}, not from the fresh venv's {site}")
        if args.expect_cuda is not None and with_cuda != args.expect_cuda:
            fail(f"pipefill.WITH_CUDA is {with_cuda}, expected {args.expect_cuda}")
        snippet = readme_snippet()
        out = run(python, snippet + "\nprint(open('/proc/self/maps').read())\n", env=env, cwd=work)
        totals = re.search(r"(\d+) iterations, (\d+) bubbles \((\d+) filled, (\d+) skipped\)", out)
        if not totals:
            fail(f"the README snippet printed no stats line:\n{out[:3000]}")
        iterations, bubbles, filled, _ = map(int, totals.groups())
        items = re.search(r"fill: \d+ slices, (\d+) items", out)
        if (iterations, bubbles) != (20, 40) or filled == 0 or not items or int(items.group(1)) == 0:
            fail(f"the README snippet's figures: {totals.group(0)}; {items and items.group(0)}")
        mapped = sorted({m.group(0) for m in LIBRARIES.finditer(out)})
        if mapped:
            fail(f"after the README snippet, the process maps {mapped}")
        print(f"check_wheel: bare: imported from {Path(extension).name} in the fresh venv; "
              f"WITH_CUDA={with_cuda}; README snippet: {totals.group(0)}, {items.group(0)}; "
              "no fmt/spdlog/CUDA/NCCL library mapped", flush=True)
        verdict = run(python, CUDA_BACKEND, env=env, cwd=work).strip()
        if with_cuda == "1":
            expected = "started" if args.gpu else "refused NO_DEVICE"
            if not verdict.splitlines()[0].startswith(expected):
                fail(f"Runtime(backend='cuda'): {verdict!r}, expected {expected!r}")
            print(f"check_wheel: Runtime(backend='cuda'): {verdict.splitlines()[0]}", flush=True)

        # ---- 3. with torch ------------------------------------------------------------------------
        if args.torch_from:
            torch_env = dict(env)
            if os.environ.get("HIDDEN_CUDA_TOOLKIT_LIBS"):  # the hidden toolkit's libraries, for torch
                torch_env["LD_LIBRARY_PATH"] = os.environ["HIDDEN_CUDA_TOOLKIT_LIBS"]
            # Plain path entries, after the venv's own site-packages: the .pth files in those folders
            # (scripts/test.sh's venv points one at its build tree's pipefill) are not read.
            (site / "torch-from.pth").write_text(run(args.torch_from, TORCH_SITE, env=torch_env, cwd=work))
            for name, first in (("torch first", TORCH_FIRST), ("pipefill first", PIPEFILL_FIRST)):
                where, version = run(python, first + AFTER_IMPORTS, env=torch_env, cwd=work).split()[-2:]
                if not Path(where).resolve().is_relative_to(site.resolve()):
                    fail(f"{name}: pipefill came from {where}")
            print(f"check_wheel: import pipefill before and after torch {version}: ok", flush=True)
            docs = subprocess.run(
                [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(work),
                 str(ROOT / "tests" / "python" / "test_docs_blocks.py")],
                capture_output=True, text=True, timeout=1800, env=torch_env, cwd=work)
            summary = (docs.stdout.strip().splitlines() or ["(no output)"])[-1]
            if docs.returncode != 0 or " passed" not in summary:
                fail(f"the docs' Python blocks under the fresh venv:\n{docs.stdout[-6000:]}"
                     f"{docs.stderr[-3000:]}")
            print(f"check_wheel: the docs' Python blocks under the fresh venv: {summary}", flush=True)
    print("check_wheel: PASS", flush=True)


if __name__ == "__main__":
    main()
