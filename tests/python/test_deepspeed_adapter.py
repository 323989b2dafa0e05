"""pipefill.deepspeed: DeepSpeed's PipelineEngine trained for real over gloo on 2 CPU processes
(tests/python/deepspeed_worker.py), on the simulated and the real-time host backend with a
fill job running; plus the adapter's refusals and its removal, without processes.

Skipped when DeepSpeed is not installed (python/test-package.sh installs 0.19.8)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

import pipefill as pf  # noqa: E402
import pipefill.deepspeed as pfds  # noqa: E402
from adapter_checks import launch  # noqa: E402

WORLD = 2
STEPS = 5
MICRO_BATCHES = 4


RUNS = ["sim:train", "host:train", "sim:dualpipev"]


@pytest.fixture(scope="module")
def all_runs(tmp_path_factory):
    """One start of the 2 processes for every run (DeepSpeed's start is the slow part)."""
    tmp = tmp_path_factory.mktemp("deepspeed")
    codes, results = launch(tmp, "deepspeed_worker.py",
                            ["--scenario", "equivalence", "--runs", ",".join(RUNS)],
                            world=WORLD, deadline_s=400)
    assert codes == [0] * WORLD
    for run in RUNS:
        for rank, r in enumerate(results):
            if "exception" not in r[run]:
                print(f"deepspeed {r[run]['engine']} {run} rank {rank}: bubbles per batch "
                      f"{r[run]['batch_bubbles']}, losses {r[run]['losses']}")
    return results


@pytest.fixture(params=RUNS, ids=["sim", "host", "dualpipev-sim"])
def runs(request, all_runs):
    """(pipe, [this run's result of each rank, with its "rank"])."""
    results = []
    for rank, r in enumerate(all_runs):
        run = r[request.param]
        assert "exception" not in run, run["exception"]
        results.append(dict(run, rank=rank))
    return request.param.split(":")[1], results


def test_every_blocking_receive_is_one_bubble(runs):
    pipe, results = runs
    for r in results:
        # Counted by wrapping DeepSpeed's receive functions, independently of the adapter.
        if pipe == "train":
            # 2 stages x 4 micro-batches: stage 1 receives 4 activations, stage 0 4 gradients.
            assert r["engine"] == "PipelineEngine"
            assert r["receives_per_batch"] == [MICRO_BATCHES] * STEPS, r["rank"]
            assert r["kinds"] == r["expected_kinds"], r["rank"]  # from TrainSchedule's order
        else:  # DualPipeVEngine: the receive handles its CommitP2P batches wait, one by one
            assert r["engine"] == "DualPipeVEngine"
            assert r["receives_per_batch"][0] > 0
            assert r["receives_per_batch"] == [r["receives_per_batch"][0]] * STEPS, r["rank"]
            assert r["commit_receive_handles"] == sum(r["receives_per_batch"]), r["rank"]
            assert sum(r["receives_per_batch"]) >= r["commits_with_receives"] > 0, r["rank"]
        assert r["comm_restored"], r["rank"]  # DualPipeV's dist global is deepspeed.comm again
        assert r["batch_bubbles"] == r["receives_per_batch"], r["rank"]
        assert r["runtime_bubbles"] == sum(r["receives_per_batch"]), r["rank"]
        assert r["iterations"] == STEPS  # every train_batch ended an iteration
        assert not r["in_bubble_after"] and r["errors"] == [] and r["bubble_failures"] == 0
    if pipe == "dualpipev":
        # Commits that wait several receive handles exist, so one bubble per commit would not
        # pass the equality above.
        assert any(sum(r["receives_per_batch"]) > r["commits_with_receives"] for r in results)


def test_optimizer_step_is_a_bubble_only_when_asked(runs):
    pipe, results = runs
    if pipe != "train":
        pytest.skip("checked on PipelineEngine")
    for r in results:
        assert r["optimizer_bubbles"] == 1, r["rank"]
        # the batch's receive bubbles, then one OPTIMIZER bubble (none in the runs above)
        per_batch = r["expected_kinds"][:MICRO_BATCHES]
        assert r["optimizer_kinds"] == per_batch + [int(pf.BubbleKind.OPTIMIZER)], r["rank"]
        assert int(pf.BubbleKind.OPTIMIZER) not in r["kinds"]
        assert r["optimizer_in_bubble_after"] is False


def test_losses_and_gradients_are_bit_identical(runs):
    _, results = runs
    for r in results:
        assert r["identical_losses"] and r["identical_grads"], r["rank"]
        assert r["grads_seen"] == STEPS * MICRO_BATCHES * 4  # 2 linear layers per stage


def test_fill_work_runs_only_inside_bubbles(runs):
    _, results = runs
    # Liveness over the ranks, safety per rank (test_megatron_adapter.py says why).
    assert sum(r["fill_slices"] for r in results) > 0
    assert sum(r["items_run"] for r in results) > 0
    for r in results:
        assert r["fill_slices_outside"] == 0, r["rank"]
        assert r["items_outside"] == 0 and r["most_late_items"] <= 1, r["rank"]
        assert r["duplicates"] == 0 and r["items_run"] == r["items_completed"], r["rank"]


def test_remove_restores_the_engine(runs):
    _, results = runs
    assert all(r["restored"] for r in results)


def test_a_rank_that_raises_ends_every_process_with_no_bubble_open(tmp_path):
    codes, results = launch(tmp_path, "deepspeed_worker.py",
                            ["--scenario", "raise", "--timeout", "30"], world=WORLD,
                            deadline_s=200)
    assert codes == [0] * WORLD
    failing = results[1]
    assert "injected failure" in failing["error"]
    survivor = results[0]
    assert survivor["error"], "rank 0 went on as if nothing happened"
    assert survivor["interrupted_waits"] >= 1  # it was waiting for a gradient, in a bubble
    for r in results:
        assert r["in_bubble_after_failure"] is False, r["rank"]
        assert r["runtime_closed"] is True, (r["rank"], r.get("close_error"))


# ---- without processes ----------------------------------------------------------------------

def test_refuses_what_is_not_a_pipeline_engine():
    with pf.Runtime(backend="sim") as rt:
        with pytest.raises(TypeError, match="torch.nn.modules.linear.Linear is not a deepspeed "
                                            "PipelineEngine"):
            pfds.instrument(torch.nn.Linear(2, 2), rt)


def test_refuses_an_engine_whose_instruction_map_lacks_the_receives():
    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.pipe.engine import PipelineEngine

    class OldEngine(PipelineEngine):
        _INSTRUCTION_MAP = {k: v for k, v in PipelineEngine._INSTRUCTION_MAP.items()
                            if k is not schedule.RecvGrad}

        def __init__(self):  # no DeepSpeed initialisation: only the class matters here
            pass

    with pf.Runtime(backend="sim") as rt:
        with pytest.raises(RuntimeError, match="OldEngine of DeepSpeed 0.19.8: "
                                               "_INSTRUCTION_MAP has no entry for RecvGrad"):
            pfds.instrument(OldEngine.__new__(OldEngine), rt)


def test_refuses_a_dualpipev_engine_whose_commit_posts_differently():
    from deepspeed.runtime.pipe.dualpipev import DualPipeVEngine

    class ChangedCommit(DualPipeVEngine):
        def _exec_commit_p2p(self):  # waits some other way: no batch_isend_irecv to hook
            for op in self._p2p_ops:
                op.tensor.zero_()

        def __init__(self):
            pass

    with pf.Runtime(backend="sim") as rt:
        with pytest.raises(RuntimeError, match="ChangedCommit of DeepSpeed 0.19.8: "
                                               "_exec_commit_p2p does not refer to "
                                               "batch_isend_irecv; _exec_commit_p2p does not "
                                               "refer to wait"):
            pfds.instrument(ChangedCommit.__new__(ChangedCommit), rt)


def test_dualpipev_proxy_lives_as_long_as_the_handles():
    import deepspeed.comm
    from deepspeed.runtime.pipe import dualpipev
    engines = [dualpipev.DualPipeVEngine.__new__(dualpipev.DualPipeVEngine) for _ in range(2)]
    with pf.Runtime(backend="sim") as rt:
        first = pfds.instrument(engines[0], rt)
        proxy = dualpipev.dist
        assert proxy is not deepspeed.comm
        assert proxy.get_rank is deepspeed.comm.get_rank  # everything else passes through
        second = pfds.instrument(engines[1], rt)
        assert dualpipev.dist is proxy  # one proxy for both handles
        first.remove()
        assert dualpipev.dist is proxy  # the second handle still needs it
        dualpipev.dist = "replaced by someone else"
        with pytest.raises(RuntimeError, match="dualpipev.dist is now"):
            second.remove()  # refused: nothing touched
        assert type(engines[1]) is not dualpipev.DualPipeVEngine
        dualpipev.dist = proxy
        second.remove()
        assert dualpipev.dist is deepspeed.comm
        assert type(engines[1]) is dualpipev.DualPipeVEngine


def bare_engine():
    """A PipelineEngine object without DeepSpeed's initialisation: enough for the class-level
    parts of the adapter (instrument / remove), no training."""
    from deepspeed.runtime.pipe.engine import PipelineEngine
    return PipelineEngine.__new__(PipelineEngine)


def test_instrument_changes_only_the_class_and_remove_restores_it():
    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.pipe.engine import PipelineEngine
    engine = bare_engine()
    original_map = dict(PipelineEngine._INSTRUCTION_MAP)
    with pf.Runtime(backend="sim") as rt:
        handle = pfds.instrument(engine, rt)
        assert type(engine) is not PipelineEngine and isinstance(engine, PipelineEngine)
        assert type(engine).__name__ == "PipelineEngine"  # reprs and logs unchanged
        wrapped = type(engine)._INSTRUCTION_MAP[schedule.RecvGrad]
        assert wrapped.__wrapped__ is original_map[schedule.RecvGrad]
        assert PipelineEngine._INSTRUCTION_MAP == original_map  # DeepSpeed's class untouched
        assert vars(engine) == {}
        with pytest.raises(ValueError, match="already instrumented"):
            pfds.instrument(engine, rt)
        handle.remove()
        handle.remove()  # idempotent
        assert type(engine) is PipelineEngine and vars(engine) == {}
        with pfds.instrument(engine, rt):  # again after remove(), as a context manager
            pass
        assert type(engine) is PipelineEngine


def test_remove_refuses_when_the_class_was_changed_again():
    from deepspeed.runtime.pipe.engine import PipelineEngine
    engine = bare_engine()
    with pf.Runtime(backend="sim") as rt:
        handle = pfds.instrument(engine, rt)
        ours = type(engine)
        engine.__class__ = type("Other", (ours,), {})
        with pytest.raises(RuntimeError, match="the engine's class is now .*Other"):
            handle.remove()
        assert type(engine).__name__ == "Other"  # nothing touched
        engine.__class__ = ours
        handle.remove()
        assert type(engine) is PipelineEngine
