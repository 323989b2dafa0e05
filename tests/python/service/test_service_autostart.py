"""PIPEFILL_SERVICE in the environment: a plain ``pipefill.Runtime`` joins the service by itself
(its agent serves job requests after each iteration_end and is drained by close), logs which
service it joined without the secret, and a bad value is a warning naming the variable (never
the secret) while the runtime works on without an agent."""
from __future__ import annotations

import logging
import time

import pytest

import pipefill as pf
from service_fixtures import expected_record


def host_runtime():
    return pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                      safety_margin_fraction=0.0, min_samples=1000000)


def train(rt, until, timeout_s):
    """A stage loop that knows nothing of the service: bubbles, compute, iteration_end."""
    stream = rt.high_priority_stream()
    deadline = time.monotonic() + timeout_s
    iteration = 0
    while time.monotonic() < deadline:
        with rt.bubble(stream, expected_us=2000.0):
            pf.host_stream_delay(stream, 2000.0)
        pf.host_stream_delay(stream, 500.0)
        rt.iteration_end()
        pf.host_stream_synchronize(stream)
        iteration += 1
        if iteration % 10 == 0 and until():
            return True
    return False


def test_a_runtime_joins_the_service_from_the_environment(world, monkeypatch, caplog):
    import json
    import pathlib

    from pipefill.service import JobSpec
    with world.service("alice") as alice:
        job_id = alice.submit(JobSpec(
            name="autostart", dist_name="pfsvc-testjobs", entry_point="digest",
            dataset="d", item_count=12, shard_items=4, output_dir=str(world.out_root),
            params={"seed": "auto", "item_cost_us": 100.0, "checkpoint_items": 2},
            item_cost_us=100.0, lease_ttl_s=10.0))
    for key, value in world.rank_env("rank1").items():
        if key.startswith("PIPEFILL_SERVICE"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("PIPEFILL_SERVICE_RANK", "auto-rank")

    def completed():
        with world.service("alice") as alice:
            return alice.jobs(job_id)[0].state == "completed"

    with caplog.at_level(logging.INFO, logger="pipefill"):
        rt = host_runtime()
    agent = rt._extensions["service"].agent
    assert agent is not None and agent.running and agent.rank == "auto-rank"
    try:
        reached = train(rt, completed, 60.0)
    finally:
        rt.close()
    assert reached, f"job not completed; agent error: {agent.error}"
    assert not agent.running and agent.error is None       # close() drained it
    assert agent.counts.committed == 3
    joined = [r.getMessage() for r in caplog.records if "joined the fill-job service" in
              r.getMessage()]
    assert len(joined) == 1, caplog.text
    assert "auto-rank" in joined[0] and "user=rank1" in joined[0] and "dbname=" in joined[0]
    assert "secret-rank1" not in caplog.text
    manifest = json.loads((world.out_root / f"job-{job_id}" / "manifest.json").read_text())
    content = b"".join(pathlib.Path(s["path"]).read_bytes() for s in manifest["shards"])
    assert content == b"".join(expected_record("auto", i) for i in range(12))
    with world.service("alice") as alice:
        ranks = {r["rank"]: r for r in alice.ranks()}
    # Its capacity was advertised per bubble class from the runtime's measurements.
    classes = ranks["auto-rank"]["classes"]
    assert [c["key"] for c in classes] == ["#0"]
    assert classes[0]["p10_us"] >= 1800.0 and classes[0]["per_iteration"] == pytest.approx(1.0,
                                                                                           abs=0.05)


@pytest.mark.parametrize("value, reason", [
    ("host=/tmp dbname=x password=hunter2-9c1", "holds a password"),
    ("this is = not a = conninfo", "is not a libpq connection string"),
    ("   ", "is set but empty"),
])
def test_a_bad_value_warns_naming_the_variable_and_the_runtime_works_on(monkeypatch, value,
                                                                         reason):
    pytest.importorskip("psycopg")
    monkeypatch.setenv("PIPEFILL_SERVICE", value)
    monkeypatch.delenv("PIPEFILL_SERVICE_PASSWORD", raising=False)
    monkeypatch.delenv("PIPEFILL_SERVICE_PASSWORD_FILE", raising=False)
    with pytest.warns(RuntimeWarning, match="PIPEFILL_SERVICE") as caught:
        rt = host_runtime()
    message = str(caught[0].message)
    assert reason in message and "hunter2" not in message
    assert "service" not in rt._extensions
    stream = rt.high_priority_stream()
    with rt.bubble(stream, expected_us=100.0):
        pf.host_stream_delay(stream, 100.0)
    rt.iteration_end()
    rt.synchronize()
    assert rt.stats().bubbles == 1
    rt.close()


def test_an_unreachable_service_ends_the_agent_with_a_clear_error_never_the_trainer(
        monkeypatch, tmp_path):
    pytest.importorskip("psycopg")
    monkeypatch.setenv("PIPEFILL_SERVICE", f"host={tmp_path} port=1 dbname=none user=nobody")
    monkeypatch.setenv("PIPEFILL_SERVICE_PASSWORD", "never-shown-4b2")
    rt = host_runtime()
    agent = rt._extensions["service"].agent
    agent.db.budget_s = 0.3  # give up quickly
    assert train(rt, lambda: not agent.running, 30.0)
    rt.close()
    assert agent.error is not None
    text = str(agent.error)
    assert "unreachable" in text and f"host={tmp_path}" in text and "never-shown" not in text


@pytest.mark.parametrize("value, expected, warned", [
    ("30", 30.0, False),
    ("0", 0.5, True),
    ("soon", 0.5, True),
])
def test_the_capacity_interval_comes_from_the_environment(monkeypatch, tmp_path, value, expected,
                                                          warned):
    pytest.importorskip("psycopg")
    monkeypatch.setenv("PIPEFILL_SERVICE", f"host={tmp_path} port=1 dbname=none user=nobody")
    monkeypatch.setenv("PIPEFILL_SERVICE_PASSWORD", "never-shown-7d1")
    monkeypatch.setenv("PIPEFILL_SERVICE_CAPACITY_INTERVAL_S", value)
    import warnings as _warnings
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        rt = host_runtime()
    agent = rt._extensions["service"].agent
    agent.db.budget_s = 0.3  # unreachable on purpose: give up quickly
    try:
        assert agent.capacity_interval_s == expected
        named = [str(w.message) for w in caught
                 if "PIPEFILL_SERVICE_CAPACITY_INTERVAL_S" in str(w.message)]
        if warned:
            assert len(named) == 1 and repr(value) in named[0], named
        else:
            assert not named
    finally:
        train(rt, lambda: not agent.running, 30.0)
        rt.close()
