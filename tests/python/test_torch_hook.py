"""pipefill.torch without processes: hook points, the source audit, installation, streams."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pipefill as pf  # noqa: E402
import pipefill.torch as pft  # noqa: E402
from torch.distributed.pipelining import schedules  # noqa: E402


def test_the_hook_points_exist():
    pft.check_hook_points()  # raises, naming the torch version, when one is missing


def test_only_batch_p2p_posts_and_no_other_wait_touches_p2p_works():
    """A torch version that posts or waits on point-to-point works somewhere else than the two
    helpers the hook wraps makes this fail (then: extend the hook, and TESTED_TORCH)."""
    audit = pft.audit_schedules_source()
    assert audit["posts"] == ["_batch_p2p"]
    known = {
        "drain: self.wait()",  # _PendingSendTracker.drain -> wait -> _wait_batch_p2p (sends)
        "_step_microbatches._perform_action: pending_sends.wait()",  # same tracker (sends)
        "_assert_unsharded: op.wait()",  # FSDP unshard handles
    }
    assert set(audit["direct_waits"]) <= known, audit["direct_waits"]


def test_torch_version_is_one_the_hook_was_audited_against():
    major_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if major_minor not in pft.TESTED_TORCH:
        pytest.xfail(f"torch {torch.__version__} is not in TESTED_TORCH {pft.TESTED_TORCH}: the "
                     "audit and gloo tests say whether the hook still holds")


def test_hooks_pass_through_without_an_instrumented_schedule():
    pft._schedule._install()
    assert schedules._wait_batch_p2p is pft._schedule._wait_batch_p2p_hook
    assert schedules._batch_p2p([]) == []
    schedules._wait_batch_p2p([])  # the original: nothing to wait for


class FakeStage:
    stage_index = 1

    def get_fwd_recv_ops(self, chunk):
        return []

    def get_bwd_recv_ops(self, chunk):
        return []


class FakeSchedule:
    def __init__(self):
        self._stage = FakeStage()
        self.calls = 0

    def step(self, *args, **kwargs):
        self.calls += 1
        return ("stepped", args, kwargs)


def test_instrument_installs_on_the_instance_and_remove_restores():
    with pf.Runtime(backend="sim") as rt:
        schedule = FakeSchedule()
        stage_method = schedule._stage.get_fwd_recv_ops
        bubbles = pft.instrument(schedule, rt, strict=True)
        assert schedule.step("x", target=1) == ("stepped", ("x",), {"target": 1})
        assert schedule.calls == 1 and bubbles.step_bubbles == [0]
        assert rt.stats().iterations == 1  # each step() ends an iteration
        assert schedule._stage.get_fwd_recv_ops != stage_method
        bubbles.remove()
        assert schedule.step.__func__ is FakeSchedule.step
        assert schedule._stage.get_fwd_recv_ops == stage_method
        assert rt.stats().iterations == 1


def test_runtime_errors_do_not_break_the_trainer():
    rt = pf.Runtime(backend="sim")
    schedule = FakeSchedule()
    bubbles = pft.instrument(schedule, rt)
    rt.close()  # every bubble instruction now fails
    with pytest.warns(RuntimeWarning, match="training goes on"):
        assert schedule.step()[0] == "stepped"
    assert bubbles.errors and bubbles.errors[0].code == pf.Result.INVALID_STATE
    strict = pft.instrument(FakeSchedule(), pf.Runtime(backend="sim"), strict=True)
    strict.runtime.close()
    with pytest.raises(pf.PipeFillError):
        strict.schedule.step()


def test_graph_fill_job_needs_the_cuda_backend():
    with pf.Runtime(backend="sim") as rt:
        with pytest.raises(pf.PipeFillError, match="not cuda") as error:
            pft.graph_fill_job(rt, lambda index: None, 4)
        assert error.value.code == pf.Result.NOT_SUPPORTED


def test_stream_handles_from_torch():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda streams cannot be created")
    stream = torch.cuda.Stream()
    assert pft.stream_handle(stream) == stream.cuda_stream == pf.stream_handle(stream)
    with torch.cuda.stream(stream):
        assert pft.current_stream_handle() == stream.cuda_stream
    assert pft.stream_handle() == torch.cuda.current_stream().cuda_stream


class FakeRequest:
    def __init__(self, log, name, fail=False):
        self.log, self.name, self.fail = log, name, fail

    def wait(self, timeout=None):
        self.log.append(("wait", self.name))
        if self.fail:
            raise RuntimeError("peer gone")
        return True

    def is_completed(self):
        return True


def recording_runtime(log):
    rt = pf.Runtime(backend="sim")
    stream = rt.sim_world.stream()
    begin, end = rt.bubble_begin, rt.bubble_end
    rt.bubble_begin = lambda s, **k: (log.append(("begin", k.get("label"))), begin(s, **k))
    rt.bubble_end = lambda s: (log.append(("end",)), end(s))
    return rt, stream


def test_bubble_on_wait_spans_a_group_of_requests():
    log = []
    rt, stream = recording_runtime(log)
    reqs = pft.bubble_on_wait({"recv_prev": FakeRequest(log, "a"), "send_next": FakeRequest(log, "b")},
                              rt, stream=stream, label="fwd")
    assert reqs["recv_prev"].is_completed()  # other attributes pass through
    for r in reqs.values():
        assert r.wait() is True
    assert log == [("begin", "fwd"), ("wait", "a"), ("wait", "b"), ("end",)]
    assert not rt.in_bubble
    log.clear()
    single = pft.bubble_on_wait(FakeRequest(log, "c"), rt, stream=stream)
    single.wait()
    assert log == [("begin", None), ("wait", "c"), ("end",)]
    rt.iteration_end()
    rt.sim_world.run_until_idle()
    rt.synchronize()
    assert rt.stats().bubbles == 2
    rt.close()


def test_bubble_on_wait_ends_the_bubble_when_a_wait_raises():
    log = []
    rt, stream = recording_runtime(log)
    reqs = pft.bubble_on_wait([FakeRequest(log, "a", fail=True), FakeRequest(log, "b")], rt,
                              stream=stream)
    with pytest.raises(RuntimeError, match="peer gone"):
        reqs[0].wait()
    assert log == [("begin", None), ("wait", "a"), ("end",)]
    assert not rt.in_bubble
    reqs[1].wait()  # later waits of the group no longer open a bubble
    assert log[-1] == ("wait", "b")
    rt.close()


def test_a_schedule_is_instrumented_once():
    with pf.Runtime(backend="sim") as rt:
        schedule = FakeSchedule()
        first = pft.instrument(schedule, rt)
        with pytest.raises(ValueError, match="already instrumented"):
            pft.instrument(schedule, rt)
        first.remove()
        pft.instrument(schedule, rt).remove()  # fine again after remove()
