"""The package never chooses the training process's CUDA or NCCL libraries (issue 16).

Built with its CUDA backend (what `pip install .` does on a machine with nvcc), the extension
used to carry DT_NEEDED entries on the toolkit's libnccl.so.2, libcudart, libcublas and libcupti:
`import pipefill` before `import torch` bound torch to the toolkit's older NCCL and torch failed to
import (`libtorch_cuda.so: undefined symbol: ncclCommResume`). Now the CUDA runtime is linked
statically and cuBLAS/CUPTI are opened at first use (cuda/lazy_library.hpp). These tests import
in both orders in fresh processes, read the extension's dynamic section, and check that creating
a runtime maps none of those libraries. scripts/test.sh builds the extension with the CUDA
backend when the toolkit is present and sets PIPEFILL_REQUIRE_CUDA_BUILD=1, so CI checks the
CUDA build (the one users get), not only the CPU one.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

import pipefill
from pipefill import _pipefill

CUDA_LIBRARIES = re.compile(r"lib(nccl|cudart|cublas|cublasLt|cupti|cuda)\.so")


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ))


def test_the_cuda_build_is_the_one_under_test_when_required():
    if os.environ.get("PIPEFILL_REQUIRE_CUDA_BUILD") == "1":
        assert pipefill.WITH_CUDA, "scripts/test.sh asked for the CUDA build of the extension"
    # The public flag (users check it after pip install) is the extension's own.
    assert isinstance(pipefill.WITH_CUDA, bool)
    assert pipefill.WITH_CUDA == _pipefill.WITH_CUDA
    assert "WITH_CUDA" in pipefill.__all__


def test_the_extension_has_no_dt_needed_on_cuda_or_nccl_libraries():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf not installed")
    dynamic = subprocess.run([readelf, "-d", _pipefill.__file__], capture_output=True, text=True,
                             check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert needed, dynamic  # the check reads the right section
    assert [n for n in needed if CUDA_LIBRARIES.search(n)] == [], needed


@pytest.mark.parametrize("first,second", [("pipefill", "torch"), ("torch", "pipefill")])
def test_import_order_with_torch_does_not_matter(first, second):
    pytest.importorskip("torch")
    code = (f"import {first}, {second}; import torch, torch.distributed; "
            "import pipefill as pf; rt = pf.Runtime(backend='sim'); rt.close(); "
            "print('ok', torch.__version__)")
    done = _fresh(code)
    assert done.returncode == 0, f"import {first} then {second} failed:\n{done.stderr[-3000:]}"
    assert done.stdout.startswith("ok ")


def test_a_runtime_maps_no_cuda_library_of_its_own():
    # After import and a runtime on the simulated and host backends, none of the CUDA libraries
    # is mapped: the library loads cuBLAS/CUPTI only for the features that need them, on CUDA.
    code = ("import pipefill as pf\n"
            "for b in ('sim', 'host'):\n"
            "    pf.Runtime(backend=b).close()\n"
            "print(open('/proc/self/maps').read())\n")
    done = _fresh(code)
    assert done.returncode == 0, done.stderr[-3000:]
    mapped = sorted({m.group(0) for m in CUDA_LIBRARIES.finditer(done.stdout)})
    assert mapped == [], mapped
