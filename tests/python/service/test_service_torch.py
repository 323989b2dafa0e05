"""A torch model + dataset job through the service: its shards run as issue 18's streaming
``pipefill.torch.inference_job`` in the ranks' bubbles (host backend). The outputs equal the
model run eagerly, every item exactly once in order, and a SIGKILLed rank's shard is resumed by
another rank from its progress file (the last durable checkpoint), not from item 0."""
from __future__ import annotations

import json
import pathlib

import pytest

from service_fixtures import Ranks, run_in_process_rank, wait_for

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")


def torch_job(world, name, *, batches, shard_batches, batch_size=4, seed=7, ttl_s=10.0,
              item_cost_us=500.0):
    from pipefill.service import JobSpec
    params = {"seed": seed, "samples": batches * batch_size - 1, "batch_size": batch_size}
    with world.service("alice") as alice:
        return alice.submit(JobSpec(
            name=name, dist_name="pfsvc-torchjobs", entry_point="inference",
            dataset=f"test://{name}", item_count=batches, shard_items=shard_batches,
            output_dir=str(world.out_root), params=params, item_cost_us=item_cost_us,
            lease_ttl_s=ttl_s)), params


def eager_outputs(params):
    """The model run eagerly over the dataset's batches, with the distribution's own model and
    dataset constructors (the last batch is short: samples is not a multiple of batch_size)."""
    import pfsvc_torchjobs as jobs
    model = jobs.make_model(params["seed"])
    data = jobs.make_dataset(params["seed"], params["samples"])
    size = params["batch_size"]
    with torch.no_grad():
        return [model(torch.stack(data[i:i + size])).numpy() for i in range(0, len(data), size)]


def manifest_outputs(world, job_id):
    """Every record of the job's canonical outputs, in shard order (np.load one after another)."""
    from pipefill.service import verify_manifest
    manifest_path = world.out_root / f"job-{job_id}" / "manifest.json"
    assert verify_manifest(manifest_path) == []
    arrays = []
    for shard in json.loads(manifest_path.read_text())["shards"]:
        with open(shard["path"], "rb") as file:
            end = pathlib.Path(shard["path"]).stat().st_size
            count = 0
            while file.tell() < end:
                arrays.append(np.load(file, allow_pickle=False))
                count += 1
        assert count == shard["items"][1] - shard["items"][0], shard
    return arrays


def job_state(world, job_id):
    with world.service("alice") as alice:
        return alice.jobs(job_id)[0].state


def test_torch_job_outputs_equal_the_eager_model_every_item_once(world):
    job_id, params = torch_job(world, "torch-basic", batches=23, shard_batches=6)
    agent, reached = run_in_process_rank(world, "torch-inproc",
                                         lambda: job_state(world, job_id) == "completed", 90.0)
    assert reached, f"job not completed; agent error: {agent.error}"
    assert agent.error is None
    assert (agent.counts.committed, agent.counts.failed, agent.counts.fenced) == (4, 0, 0)
    got = manifest_outputs(world, job_id)
    expected = eager_outputs(params)
    assert len(got) == len(expected) == 23
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, k
        np.testing.assert_array_equal(g, e, err_msg=f"batch {k}")
    # No progress file or partial output is left: only the canonical outputs and the manifest.
    names = {p.name for p in (world.out_root / f"job-{job_id}").iterdir()}
    assert not [n for n in names if n.endswith((".progress.json", ".partial", ".tmp"))], names


def test_a_killed_ranks_shard_resumes_from_its_progress_file_on_another_rank(world, tmp_path):
    """Rank A runs shard 0 (one batch per 40 ms iteration); once its checkpoint passed batch 8
    it is SIGKILLed. Rank B claims the shard after the lease expired, resumes at the
    checkpoint (the attempt's resumed_from) and the job's outputs are still every batch once,
    equal to the eager model."""
    job_id, params = torch_job(world, "torch-kill", batches=60, shard_batches=30, ttl_s=1.5,
                               item_cost_us=1500.0)
    ranks = Ranks(world.rank_env(), tmp_path, bubble_us=2000.0, compute_us=40000.0)
    # One connection for the polls (a new login every 0.1 s beside the rank processes can take
    # longer than the 5 s connect timeout on a loaded machine).
    watcher = world.service("alice")
    try:
        ranks.start("torch-A")

        def checkpointed():
            shard = [s for s in watcher.shards(job_id) if s["shard"] == 0][0]
            ck = shard["checkpoint"] or {}
            return shard["state"] == "leased" and ck.get("next", 0) >= 8 and ck.get("next")

        reached = wait_for(checkpointed, 120, "rank A's checkpoint past batch 8 of shard 0")
        ranks.kill("torch-A")
        ranks.start("torch-B")
        wait_for(lambda: watcher.jobs(job_id)[0].state == "completed", 120,
                 f"the job to complete on rank B; B's log: {ranks.log('torch-B')}")
        summary = ranks.terminate("torch-B")
    finally:
        ranks.close()
        watcher.close()
    assert summary is not None and summary["error"] is None, summary
    assert summary["resumed"] >= 1 and summary["failed"] == 0, summary
    with world.service("alice") as alice:
        attempts = [a for a in alice.attempts(job_id) if a["shard"] == 0]
    by_rank = {a["rank"]: a for a in attempts}
    assert set(by_rank) == {"torch-A", "torch-B"}, attempts
    assert by_rank["torch-B"]["outcome"] == "committed"
    # B started at A's last durable checkpoint: at least the 8 batches seen before the kill.
    assert by_rank["torch-B"]["resumed_from"] >= reached >= 8, attempts
    got = manifest_outputs(world, job_id)
    expected = eager_outputs(params)
    assert len(got) == len(expected) == 60
    for k, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(g, e, err_msg=f"batch {k}")
