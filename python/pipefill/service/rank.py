"""A stand-in trainer rank with the service agent: ``pipefill rank`` / ``python -m
pipefill.service.rank``.

It runs a host-backend runtime (pfBackendHost: CPU threads as streams) whose main stream does
what a pipeline stage does - a bubble of ``bubble_us`` then ``compute_us`` of compute per
iteration - and an :class:`pipefill.service.agent.Agent` that fills the bubbles with claimed
shards. A real trainer does the same with its own loop: create the agent with its runtime, call
``agent.on_iteration_end()`` after ``runtime.iteration_end()``, and ``agent.drain()`` before it
exits. SIGTERM drains (the leases go back as preemptions); ``--iterations`` and
``--exit-when-idle`` bound the run. The last line printed is a JSON summary of the agent's counts.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from typing import List, NoReturn, Optional

from .. import _runtime as pf
from .._errors import PipeFillError

from . import _db, limits
from ._db import ENV_CONNECTION
from .agent import Agent


def host_runtime() -> "pf.Runtime":
    """The stand-in stage's runtime. PIPEFILL_SERVICE is hidden while it is made: the caller
    makes its Agent itself (with its rank name), so the runtime must not start a second one."""
    hidden = os.environ.pop(ENV_CONNECTION, None)
    try:
        return pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                          safety_margin_fraction=0.0, min_samples=1000000)
    finally:
        if hidden is not None:
            os.environ[ENV_CONNECTION] = hidden


_OPTIONS = {"rank": "--name", "bubble_us": "--bubble-us", "compute_us": "--compute-us",
            "iterations": "--iterations", "exit_when_idle_s": "--exit-when-idle"}


def check_rank_args(rank: object, bubble_us: object, compute_us: object, iterations: object,
                    exit_when_idle_s: object, *, options: bool = False) -> None:
    """UsageError naming the first bad argument (as its ``pipefill rank`` option when
    ``options``): a rank name of 1..NAME_MAX_CHARS characters without control characters, a
    bubble in (0, RANK_US_MAX] us, compute in [0, RANK_US_MAX] us, iterations >= 1, an idle
    limit > 0 s (or None)."""
    def name(argument: str) -> str:
        return _OPTIONS[argument] if options else argument

    limits.check_text(name("rank"), rank, limits.NAME_MAX_CHARS)
    limits.check_number(name("bubble_us"), bubble_us, 0.0, limits.RANK_US_MAX, low_open=True)
    limits.check_number(name("compute_us"), compute_us, 0.0, limits.RANK_US_MAX)
    limits.check_int(name("iterations"), iterations, 1, limits.INT64_MAX)
    if exit_when_idle_s is not None:
        limits.check_number(name("exit_when_idle_s"), exit_when_idle_s, 0.0,
                            limits.LEASE_TTL_MAX_S, low_open=True)


def run_rank(rank: str, *, bubble_us: float, compute_us: float, iterations: int,
             exit_when_idle_s: Optional[float], agent_on: bool = True,
             conninfo: Optional[str] = None, password_file: Optional[str] = None) -> dict:
    """The stand-in stage loop with the agent; returns the summary. Every argument and the
    connection settings are checked before the runtime is made (a bad one raises, naming it,
    and leaves nothing behind); the runtime is closed however the loop ends."""
    check_rank_args(rank, bubble_us, compute_us, iterations, exit_when_idle_s)
    if agent_on:
        _db.connection_options(conninfo, password_file=password_file)  # refused before the runtime
    stop = {"requested": False}

    def on_term(signum: int, frame: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_term)
    rt = host_runtime()
    agent: Optional[Agent] = None
    try:
        stream = rt.high_priority_stream()
        if agent_on:
            agent = Agent(rt, rank, conninfo=conninfo, password_file=password_file)
            agent.start()
        started = time.monotonic()
        done = 0
        for done in range(1, iterations + 1):
            if stop["requested"]:
                break
            with rt.bubble(stream, expected_us=bubble_us):
                pf.host_stream_delay(stream, bubble_us)
            pf.host_stream_delay(stream, compute_us)
            rt.iteration_end()
            if agent is not None:
                agent.on_iteration_end()
                if not agent.running:
                    break  # the agent ended (its error is in the summary); the trainer could go on
                if (exit_when_idle_s is not None
                        and time.monotonic() - agent.last_activity > exit_when_idle_s):
                    break
            pf.host_stream_synchronize(stream)
        wall = time.monotonic() - started
        summary = {"rank": rank, "iterations": done, "wall_s": wall}
        if agent is not None:
            summary["drained"] = agent.drain()
            summary.update(dataclasses.asdict(agent.counts))
            summary["reconnects"] = agent.db.reconnects
            summary["error"] = str(agent.error) if agent.error else None
        rt.synchronize()
    finally:
        if agent is not None and agent.running:
            agent.drain()
        rt.close()
    return summary


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def main(argv: Optional[List[str]] = None) -> int:
    """``pipefill rank``: exit 0 when the agent ended without an error, 1 when it did (or the
    connection settings are unusable), 2 for a bad argument (one line naming it)."""
    parser = _Parser(prog="pipefill rank", description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="this rank's unique name")
    parser.add_argument("--bubble-us", type=float, default=3000.0)
    parser.add_argument("--compute-us", type=float, default=1000.0)
    parser.add_argument("--iterations", type=int, default=1_000_000)
    parser.add_argument("--exit-when-idle", type=float, default=None, metavar="SECONDS",
                        help="stop after this long without a claim")
    parser.add_argument("--no-agent", action="store_true", help="the trainer alone (baseline)")
    args = parser.parse_args(argv)
    try:
        check_rank_args(args.name, args.bubble_us, args.compute_us, args.iterations,
                        args.exit_when_idle, options=True)
    except limits.UsageError as error:
        print(f"pipefill rank: {error.message}", file=sys.stderr)
        return 2
    try:
        summary = run_rank(args.name, bubble_us=args.bubble_us, compute_us=args.compute_us,
                           iterations=args.iterations, exit_when_idle_s=args.exit_when_idle,
                           agent_on=not args.no_agent)
    except PipeFillError as error:
        print(f"pipefill rank: {error.message}", file=sys.stderr)
        return 2 if isinstance(error, limits.UsageError) else 1
    print(json.dumps(summary), flush=True)
    return 0 if not summary.get("error") else 1


if __name__ == "__main__":
    sys.exit(main())
