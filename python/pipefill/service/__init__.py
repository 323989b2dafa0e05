"""The fill-job service: work submitted from outside the trainers, leased into their bubbles.

PostgreSQL holds the state (schema.sql): jobs split into shards by item ranges, leases with
fencing tokens, per-attempt outputs with one winning commit per shard, and a manifest per
completed job. See docs/service.md.

- :class:`Service` / :class:`JobSpec` (api.py): submit, status, cancel, manifest; the owner's
  schema setup and allowlist.
- :class:`Agent` (agent.py): a rank's background thread that claims shards fitting its bubbles
  and runs them through the job's :class:`ShardRunner` (runner.py).
- code.py: a job's code is an allowlisted entry point (name, version, sha256), never a pickle.
- ``pipefill`` CLI (cli.py), a stand-in trainer rank (rank.py), a throwaway server for tests
  (devserver.py).

Needs psycopg 3 (``pip install 'psycopg[binary]'``); importing this package does not.
"""
from __future__ import annotations

from .agent import Agent, AgentCounts, Lease
from .api import JobProgress, JobSpec, Service
from .code import CodeRefused, distribution_sha256, verify_distribution
from .limits import UsageError
from .manifest import verify_manifest
from .runner import ItemRunner, LeaseLost, ShardContext, ShardRunner, Stopping

__all__ = ["Agent", "AgentCounts", "CodeRefused", "ItemRunner", "JobProgress", "JobSpec",
           "Lease", "LeaseLost", "Service", "ShardContext", "ShardRunner", "Stopping", "UsageError",
           "distribution_sha256", "verify_distribution", "verify_manifest"]
