"""The ``pipefill`` command: submit / status / cancel / manifest jobs, the owner's init and
allow, and ``rank`` (a stand-in trainer rank with the agent, rank.py).

The connection comes from PIPEFILL_SERVICE (a libpq connection string without the password)
and the secret from PIPEFILL_SERVICE_PASSWORD_FILE or PIPEFILL_SERVICE_PASSWORD; neither is
ever printed. Errors print one line naming the problem and exit 1.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from typing import List, Optional

from .. import PipeFillError


def _eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}min"


def _status(service: "object", job: Optional[int]) -> None:
    print(f"{'job':>5} {'name':<20} {'state':<10} {'shards':>7} {'done':>7} {'leased':>6} "
          f"{'retry':>5} {'preempt':>7} {'fail':>4} {'eta':>6}  message")
    for j in service.jobs(job):  # type: ignore[attr-defined]
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


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pipefill", description="PipeFill fill-job service")
    commands = parser.add_subparsers(dest="command", required=True)
    submit = commands.add_parser("submit", help="submit a job described by a JSON file")
    submit.add_argument("job", type=pathlib.Path, help="JSON file with JobSpec's fields")
    status = commands.add_parser("status", help="jobs, progress, ETA and ranks' capacity")
    status.add_argument("job", type=int, nargs="?")
    cancel = commands.add_parser("cancel", help="cancel one of your running jobs")
    cancel.add_argument("job", type=int)
    manifest = commands.add_parser("manifest", help="(re)export a completed job's manifest")
    manifest.add_argument("job", type=int)
    commands.add_parser("init", help="owner: create/update the schema, roles and policies")
    allow = commands.add_parser("allow", help="owner: allowlist an installed distribution")
    allow.add_argument("dist")
    allow.add_argument("--version")
    allow.add_argument("--sha256")
    commands.add_parser("rank", help="a stand-in trainer rank with the agent (rank.py)",
                        add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "rank":
        from .rank import main as rank_main
        return rank_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        from .api import JobSpec, Service
        with Service() as service:
            if args.command == "submit":
                print(service.submit(JobSpec.from_json(args.job.read_text())))
            elif args.command == "status":
                _status(service, args.job)
            elif args.command == "cancel":
                if not service.cancel(args.job):
                    print(f"pipefill: job {args.job} is not a running job of yours",
                          file=sys.stderr)
                    return 1
            elif args.command == "manifest":
                print(service.export_manifest(args.job))
            elif args.command == "init":
                service.init_schema()
            elif args.command == "allow":
                print(" ".join(service.allow(args.dist, args.version, args.sha256)))
    except (PipeFillError, OSError) as error:
        print(f"pipefill: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
