"""Helpers of the service tests: a tiny installed distribution providing the jobs' entry
points, the expected per-item records, and starting/stopping rank processes.

The distribution ``pfsvc-testjobs`` is written as an installed one (package folder plus a
``.dist-info`` with METADATA, entry_points.txt and a RECORD carrying every file's sha256) into
a folder put on sys.path / PYTHONPATH: what pip would leave, without a build.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

JOBS_MODULE = '''"""Test fill jobs for the service: an item's record is its index and a sha256."""
import hashlib

from pipefill.service import ItemRunner


def record(seed, item):
    return ("%d %s\\n" % (item, hashlib.sha256(("%s:%d" % (seed, item)).encode()).hexdigest())
            ).encode()


def digest(params):
    seed = params["seed"]
    return ItemRunner(lambda item: record(seed, item), item_cost_us=params["item_cost_us"],
                      checkpoint_items=params.get("checkpoint_items", 4))


class _Poisoned:
    def __init__(self, params):
        self.params = params

    def run(self, ctx):
        ctx.output.write(b"partial\\n")
        raise RuntimeError("item %d is poisoned" % ctx.resume_item)


def poisoned(params):
    return _Poisoned(params)
'''

MARKER_MODULE = '''"""Imported only if the service loads it: leaves a marker file."""
import os
import pathlib

pathlib.Path(os.environ["PFSVC_MARKER"]).write_text("loaded")


def runner(params):
    raise RuntimeError("must never be called")
'''


TORCH_MODULE = '''"""Test torch fill job for the service: a seeded model over a seeded dataset."""
import torch


def make_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return model.eval()


def make_dataset(seed, samples):
    generator = torch.Generator().manual_seed(seed + 1)
    return [torch.randn(8, generator=generator) for _ in range(samples)]


class Inference:
    """What the entry point returns: a model and a dataset (the agent runs it as
    pipefill.torch.inference_job shards)."""

    def __init__(self, params):
        self.model = make_model(params["seed"])
        self.dataset = make_dataset(params["seed"], params["samples"])
        self.batch_size = params["batch_size"]


def inference(params):
    return Inference(params)
'''


def _record_line(root: pathlib.Path, relative: str) -> str:
    data = (root / relative).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{relative},sha256={digest},{len(data)}"


def install_distribution(root: pathlib.Path, name: str, version: str, module: str,
                         source: str, entry_points: Dict[str, str]) -> pathlib.Path:
    """Writes an installed distribution into ``root``; returns the module file."""
    package = root / module
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(source)
    info_name = f"{name.replace('-', '_')}-{version}.dist-info"
    info = root / info_name
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(
        "[pipefill.service]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    files = [f"{module}/__init__.py", f"{info_name}/METADATA", f"{info_name}/entry_points.txt"]
    (info / "RECORD").write_text("\n".join([_record_line(root, f) for f in files]
                                           + [f"{info_name}/RECORD,,"]) + "\n")
    return package / "__init__.py"


def install_test_distributions(root: pathlib.Path) -> Dict[str, pathlib.Path]:
    jobs = install_distribution(root, "pfsvc-testjobs", "1.0", "pfsvc_testjobs", JOBS_MODULE,
                                {"digest": "pfsvc_testjobs:digest",
                                 "poisoned": "pfsvc_testjobs:poisoned"})
    marker = install_distribution(root, "pfsvc-marker", "2.0", "pfsvc_marker", MARKER_MODULE,
                                  {"runner": "pfsvc_marker:runner"})
    torch_jobs = install_distribution(root, "pfsvc-torchjobs", "1.0", "pfsvc_torchjobs",
                                      TORCH_MODULE, {"inference": "pfsvc_torchjobs:inference"})
    return {"jobs": jobs, "marker": marker, "torch": torch_jobs}


def expected_record(seed: object, item: int) -> bytes:
    """Computed here, independently of the distribution's code."""
    return f"{item} {hashlib.sha256(f'{seed}:{item}'.encode()).hexdigest()}\n".encode()


class Ranks:
    """Rank processes (python -m pipefill.service.rank); every one is ended in close()."""

    def __init__(self, env: Dict[str, str], log_dir: pathlib.Path, *, bubble_us: float,
                 compute_us: float) -> None:
        self.env = env
        self.log_dir = log_dir
        self.bubble_us = bubble_us
        self.compute_us = compute_us
        self.procs: Dict[str, subprocess.Popen] = {}
        self.summaries: Dict[str, dict] = {}

    def start(self, name: str) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipefill.service.rank", "--name", name,
             "--bubble-us", str(self.bubble_us), "--compute-us", str(self.compute_us),
             "--iterations", "100000"],
            env=self.env, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        self.procs[name] = proc
        return proc

    def alive(self) -> List[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def signal(self, name: str, signum: int) -> None:
        os.kill(self.procs[name].pid, signum)

    def stop(self, name: str) -> None:
        """SIGSTOP, then wait (bounded) until the kernel shows the process stopped, and a moment
        for a statement it had already sent to the server to finish."""
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                stat = pathlib.Path(f"/proc/{proc.pid}/stat").read_text()
            except OSError:
                return  # it ended
            if stat.rsplit(")", 1)[1].split()[0] in ("T", "t"):
                break
            time.sleep(0.005)
        time.sleep(0.05)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()

    def terminate(self, name: str, timeout: float = 60.0) -> Optional[dict]:
        """SIGTERM (drain), wait, parse the JSON summary line."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate(timeout=30)
        lines = [line for line in (out or "").splitlines() if line.startswith("{")]
        summary = json.loads(lines[-1]) if lines else None
        if summary is not None:
            self.summaries[name] = summary
        return summary

    def log(self, name: str) -> str:
        try:
            return (self.log_dir / f"{name}.log").read_text()[-3000:]
        except OSError:
            return ""

    def close(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            if proc.stdout and not proc.stdout.closed:
                proc.stdout.close()


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    """Polls ``predicate`` until truthy (returns it) or fails the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def run_in_process_rank(world, rank: str, until, timeout_s: float, *, bubble_us: float = 2000.0,
                        compute_us: float = 500.0, conninfo: Optional[str] = None):
    """A trainer loop in this process (host backend) with an Agent, until ``until()`` holds
    (checked every 10 iterations) or ``timeout_s``; returns (agent, reached). ``conninfo``:
    rank1's connection (default: directly to the server)."""
    import pipefill as pf
    from pipefill.service import Agent
    from pipefill.service.rank import host_runtime
    rt = host_runtime()
    stream = rt.high_priority_stream()
    agent = Agent(rt, rank, conninfo=conninfo or world.conninfo("rank1"),
                  password_file=str(world.passwords["rank1"]), poll_s=0.02).start()
    reached = False
    deadline = time.monotonic() + timeout_s
    try:
        iteration = 0
        while time.monotonic() < deadline:
            with rt.bubble(stream, expected_us=bubble_us):
                pf.host_stream_delay(stream, bubble_us)
            pf.host_stream_delay(stream, compute_us)
            rt.iteration_end()
            agent.on_iteration_end()
            pf.host_stream_synchronize(stream)
            iteration += 1
            if not agent.running:
                break  # the agent ended (its error is the caller's to report)
            if iteration % 10 == 0 and until():
                reached = True
                break
    finally:
        agent.drain()
        rt.synchronize()
        rt.close()
    return agent, reached
