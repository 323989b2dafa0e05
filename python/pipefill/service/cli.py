"""The ``pipefill`` command: submit / status / cancel / manifest jobs, the owner's init and
allow, and ``rank`` (a stand-in trainer rank with the agent, rank.py).

The connection comes from PIPEFILL_SERVICE (a libpq connection string without the password)
and the secret from PIPEFILL_SERVICE_PASSWORD_FILE or PIPEFILL_SERVICE_PASSWORD; neither is
ever printed. Every argument and job file is checked before anything is written. Errors are
one line on stderr, ``pipefill <command>: <what>``, naming the bad field or option and its
value, never a traceback. Exit codes: 0 done, 1 the operation failed (the database refused it,
an unknown job, no connection), 2 a usage error (a bad argument, option, job file or field).
"""
from __future__ import annotations

import argparse
import sys
from typing import List, NoReturn, Optional

from .._enums import Result
from .._errors import PipeFillError
from .limits import INT64_MAX, UsageError, shown

EXIT_FAILED = 1
EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the argument (exit 2), not the usage
    text: ``pipefill: argument job: invalid job id value: 'x' (see pipefill --help)``."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def job_id(text: str) -> int:
    """A job id: a positive integer of the database's bigint range."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"job id {shown(text)} is not an integer") from None
    if not 1 <= value <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"job id {shown(text)} is outside [1, {INT64_MAX}]")
    return value


def _eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}min"


def _status(service: "object", job: Optional[int]) -> None:
    jobs = service.jobs(job)  # type: ignore[attr-defined]
    if job is not None and not jobs:
        raise PipeFillError(Result.INVALID_ARGUMENT,
                            f"job {job} does not exist (or is not yours)")
    print(f"{'job':>5} {'name':<20} {'state':<10} {'shards':>7} {'done':>7} {'leased':>6} "
          f"{'retry':>5} {'preempt':>7} {'fail':>4} {'eta':>6}  message")
    for j in jobs:
        print(f"{j.id:>5} {j.name[:20]:<20} {j.state:<10} {j.shards:>7} {j.committed:>7} "
              f"{j.leased:>6} {j.expirations:>5} {j.preemptions:>7} {j.failures:>4} "
              f"{_eta(j.eta_s):>6}  {j.message or ''}")
    ranks = service.ranks()  # type: ignore[attr-defined]
    if ranks and job is None:
        print(f"\n{'rank':<20} {'free MiB':>9} {'p10 bubble us':>13} {'bubbles/it':>10} "
              f"{'it/s':>7} {'seen':>6}")
        for r in ranks:
            print(f"{r['rank'][:20]:<20} {r['free_bytes'] / 2**20:>9.0f} "
                  f"{r['bubble_p10_us']:>13.0f} {r['bubbles_per_iteration']:>10.2f} "
                  f"{r['iterations_per_s']:>7.1f} {float(r['seen_s_ago']):>5.0f}s")


def _cancel(service: "object", job: int) -> None:
    if service.cancel(job):  # type: ignore[attr-defined]
        return
    found = service.jobs(job)  # type: ignore[attr-defined]
    if not found:
        raise PipeFillError(Result.INVALID_ARGUMENT,
                            f"job {job} does not exist (or is not yours)")
    raise PipeFillError(Result.INVALID_ARGUMENT,
                        f"job {job} is {found[0].state}, not a running job of yours")


def _parser() -> OneLineParser:
    parser = OneLineParser(prog="pipefill", description="PipeFill fill-job service")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    submit = commands.add_parser("submit", help="submit a job described by a JSON file")
    submit.add_argument("job", help="JSON file with JobSpec's fields")
    status = commands.add_parser("status", help="jobs, progress, ETA and ranks' capacity")
    status.add_argument("job", type=job_id, nargs="?")
    cancel = commands.add_parser("cancel", help="cancel one of your running jobs")
    cancel.add_argument("job", type=job_id)
    manifest = commands.add_parser("manifest", help="(re)export a completed job's manifest")
    manifest.add_argument("job", type=job_id)
    commands.add_parser("init", help="owner: create/update the schema, roles and policies")
    allow = commands.add_parser("allow", help="owner: allowlist an installed distribution")
    allow.add_argument("dist")
    allow.add_argument("--version")
    allow.add_argument("--sha256")
    commands.add_parser("rank", help="a stand-in trainer rank with the agent (rank.py)",
                        add_help=False)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "rank":
        from .rank import main as rank_main
        return rank_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(shown(r, 40) for r in rest)}")
    prog = f"pipefill {args.command}"
    try:
        from .api import JobSpec, Service
        spec = JobSpec.from_file(args.job) if args.command == "submit" else None
        with Service() as service:
            if spec is not None:
                print(service.submit(spec))
            elif args.command == "status":
                _status(service, args.job)
            elif args.command == "cancel":
                _cancel(service, args.job)
            elif args.command == "manifest":
                print(service.export_manifest(args.job))
            elif args.command == "init":
                service.init_schema()
            elif args.command == "allow":
                print(" ".join(service.allow(args.dist, args.version, args.sha256)))
    except UsageError as error:
        print(f"{prog}: {error.message}", file=sys.stderr)
        return EXIT_USAGE
    except PipeFillError as error:
        print(f"{prog}: {error.message}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # noqa: BLE001 - one line, never a traceback (docs/service.md)
        first = (str(error).strip().splitlines() or [""])[0]
        print(f"{prog}: {type(error).__name__}: {first[:500]}", file=sys.stderr)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
