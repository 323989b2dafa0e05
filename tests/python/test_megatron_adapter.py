"""pipefill.megatron: Megatron-Core's own pipeline schedules trained for real over gloo on 2
CPU processes (tests/python/megatron_worker.py): 1F1B with batched and unbatched p2p,
interleaved (unbatched, batched, and with overlap_p2p_comm), on the simulated and the
real-time host backend with a fill job running; plus the hook-point checks and refusals,
without processes.

Skipped when megatron-core is not installed (python/test-package.sh installs it)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core.pipeline_parallel")

import pipefill as pf  # noqa: E402
import pipefill.megatron as pfm  # noqa: E402
from adapter_checks import launch  # noqa: E402

WORLD = 2
STEPS = 5
MICRO_BATCHES = 4
SCHEDULES = ["1f1b-batched", "1f1b", "interleaved", "interleaved-batched", "interleaved-overlap"]
# Receive waits per call and rank, from the schedule's structure (2 ranks, 4 micro-batches):
# 1F1B: the last stage waits for 4 activations, the first for 4 gradients; interleaved (2
# chunks per rank, stages r and r+2): 4 activations + 8 gradients on rank 0, 8 + 4 on rank 1,
# where batched p2p may fuse a forward and a backward receive into one batch (one wait).
RECEIVES = {"1f1b-batched": (4, 4), "1f1b": (4, 4), "interleaved": (12, 12),
            "interleaved-overlap": (12, 12)}


@pytest.fixture(scope="module")
def all_runs(tmp_path_factory):
    """One start of the 2 processes for both backends (Megatron-Core's import is the slow
    part)."""
    tmp = tmp_path_factory.mktemp("megatron")
    codes, results = launch(tmp, "megatron_worker.py",
                            ["--scenario", "equivalence", "--backends", "sim,host"],
                            world=WORLD, deadline_s=500)
    assert codes == [0] * WORLD
    for backend in ("sim", "host"):
        for rank, r in enumerate(results):
            for name in SCHEDULES:
                s = r[backend][name]
                if "exception" not in s:
                    print(f"megatron {name} {backend} rank {rank}: bubbles per call "
                          f"{s['call_bubbles']}, losses {s['losses']}")
    return results


@pytest.fixture(params=["sim", "host"])
def runs(request, all_runs):
    """(backend, [this backend's results of each rank])."""
    return request.param, [r[request.param] for r in all_runs]


def result(runs, rank: int, name: str) -> dict:
    r = runs[1][rank][name]
    assert "exception" not in r, r["exception"]
    return r


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_receive_wait_is_one_bubble(runs, name):
    for rank in range(WORLD):
        r = result(runs, rank, name)
        # Counted by wrapping torch.distributed's receive calls, independently of the adapter.
        assert r["call_bubbles"] == r["receive_waits"], rank
        if name in RECEIVES:
            assert r["receive_waits"] == [RECEIVES[name][rank]] * STEPS, rank
        else:
            assert all(0 < w <= 12 for w in r["receive_waits"]), rank
        assert r["runtime_bubbles"] == sum(r["call_bubbles"]), rank
        assert r["iterations"] == STEPS  # every forward-backward call ended an iteration
        assert r["outside"] == 0 and not r["in_bubble_after"], rank
        assert r["errors"] == [] and r["bubble_failures"] == 0, rank


@pytest.mark.parametrize("name", ["1f1b-batched", "1f1b"])
def test_bubble_kinds_follow_the_1f1b_phases(runs, name):
    """Megatron-Core's 1F1B with 2 stages and 4 micro-batches: the last stage receives micro-
    batch 0's activation before any backward (warm-up), the rest in steady send_backward_recv_
    forward posts; the first stage receives 3 gradients in steady send_forward_recv_backward
    posts and the last one alone in the cool-down (recognised from the second call on, once a
    call's forward receive count is known)."""
    W, O, C = (int(pf.BubbleKind.WARMUP), int(pf.BubbleKind.OTHER), int(pf.BubbleKind.COOLDOWN))
    assert result(runs, 1, name)["kinds"] == [W, O, O, O] * STEPS
    assert result(runs, 0, name)["kinds"] == [O, O, O, O] + [O, O, O, C] * (STEPS - 1)


@pytest.mark.parametrize("name", SCHEDULES)
def test_losses_and_gradients_are_bit_identical(runs, name):
    losses = 0
    for rank in range(WORLD):
        r = result(runs, rank, name)
        assert r["identical_losses"] and r["identical_grads"], rank
        assert r["grads_seen"] > 0
        losses += sum(len(step) for step in r["losses"])
    assert losses == STEPS * MICRO_BATCHES  # the last stage's rank compared real losses


@pytest.mark.parametrize("name", SCHEDULES)
def test_fill_work_runs_only_inside_bubbles(runs, name):
    # Fill ran (slices and items) on the pipeline; every rank's fill stayed inside its bubbles.
    # Liveness is checked over the ranks, not per rank: the bubbles are real gloo waits (mirrored
    # into virtual time on the simulator), and one rank's waits can all be shorter than an item
    # plus the margins on an idle machine, or under load - seen: rank 1 of host-1f1b with 1 slice
    # and 0 items, rank 1 of sim-1f1b-batched with no slice. The safety checks stay per rank.
    assert sum(result(runs, rank, name)["fill_slices"] for rank in range(WORLD)) > 0
    assert sum(result(runs, rank, name)["items_run"] for rank in range(WORLD)) > 0
    for rank in range(WORLD):
        r = result(runs, rank, name)
        assert r["fill_slices_outside"] == 0, rank
        assert r["items_outside"] == 0 and r["most_late_items"] <= 1, rank
        assert r["duplicates"] == 0 and r["items_run"] == r["items_completed"], rank


@pytest.mark.parametrize("name", SCHEDULES)
def test_remove_restores_megatron(runs, name):
    for rank in range(WORLD):
        assert result(runs, rank, name)["restored"], rank


def test_a_rank_that_raises_ends_every_process_with_no_bubble_open(tmp_path):
    codes, results = launch(tmp_path, "megatron_worker.py",
                            ["--scenario", "raise", "--timeout", "30"], world=WORLD,
                            deadline_s=200)
    assert codes == [0] * WORLD
    assert "injected failure" in results[0]["error"]  # the first stage's forward raised
    assert results[1]["error"], "rank 1 went on as if nothing happened"
    assert results[1]["interrupted_waits"] >= 1  # it was waiting for an activation, in a bubble
    for r in results:
        assert r["in_bubble_after_failure"] is False, r["rank"]
        assert r["runtime_closed"] is True, (r["rank"], r.get("close_error"))


# ---- without processes ----------------------------------------------------------------------

def test_the_hook_points_exist():
    pfm.check_hook_points()


def test_instrument_replaces_and_remove_restores_the_module_globals():
    from megatron.core.pipeline_parallel import p2p_communication as p2p
    from megatron.core.pipeline_parallel import schedules
    originals = (p2p._batched_p2p_ops, p2p._p2p_ops,
                 schedules.forward_backward_pipelining_without_interleaving,
                 schedules.forward_backward_pipelining_with_interleaving)
    with pf.Runtime(backend="sim") as rt:
        with pfm.instrument(rt) as handle:
            assert schedules.get_forward_backward_func(2, None) is not originals[2]
            assert p2p._p2p_ops.__wrapped__ is originals[1]
            with pytest.raises(ValueError, match="already instrumented"):
                pfm.instrument(rt)
            p2p._p2p_ops = lambda **kwargs: {}  # someone else's change on top of ours
            with pytest.raises(RuntimeError, match="_p2p_ops was replaced again"):
                handle.remove()
            p2p._p2p_ops = handle._wrappers[p2p]["_p2p_ops"]
        assert (p2p._batched_p2p_ops, p2p._p2p_ops,
                schedules.forward_backward_pipelining_without_interleaving,
                schedules.forward_backward_pipelining_with_interleaving) == originals


def test_a_missing_hook_point_is_refused_naming_the_version(monkeypatch):
    from megatron.core.pipeline_parallel import p2p_communication as p2p
    monkeypatch.delattr(p2p, "_batched_p2p_ops")
    with pf.Runtime(backend="sim") as rt:
        with pytest.raises(RuntimeError, match=r"cannot hook megatron-core 0\.16\.1: "
                                               r"p2p_communication._batched_p2p_ops is missing"):
            pfm.instrument(rt)


def test_receives_outside_an_instrumented_call_are_counted_and_warned():
    from megatron.core.pipeline_parallel import p2p_communication as p2p

    class Request:
        def wait(self):
            return None

    with pf.Runtime(backend="sim") as rt:
        with pfm.instrument(rt) as handle:
            original = handle._originals[p2p]["_p2p_ops"]
            handle._originals[p2p]["_p2p_ops"] = original  # unchanged: posts go to torch
            post = handle._poster(lambda **kwargs: {"recv_prev": Request()})
            with pytest.warns(RuntimeWarning, match="outside an instrumented forward-backward"):
                reqs = post(tensor_recv_prev=torch.zeros(1), tensor_recv_next=None)
            reqs["recv_prev"].wait()
            assert handle.outside_receives == 1 and handle.bubbles == 0


def test_ring_exchange_is_refused_at_the_call():
    from megatron.core.pipeline_parallel import schedules

    class Model(torch.nn.Module):
        class config:
            use_ring_exchange_p2p = True

    with pf.Runtime(backend="sim") as rt:
        with pfm.instrument(rt):
            with pytest.raises(RuntimeError, match="config.use_ring_exchange_p2p = True is not "
                                                   "supported"):
                schedules.forward_backward_pipelining_without_interleaving(
                    forward_step_func=None, data_iterator=None, model=Model(),
                    num_microbatches=1, seq_length=1, micro_batch_size=1)
        assert rt.stats().iterations == 0  # refused before anything ran
