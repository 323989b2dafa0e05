"""Bubble instructions that fail inside pipefill.torch / the framework adapters are counted
(Runtime.bubble_failures, by message) and warned about once per message, never swallowed;
and the stream defaults work on every backend (issue 17, item 5: the Megatron guide made 0
bubbles on the host backend because bubble_on_wait passed a NULL stream and hid the error)."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import pipefill as pf  # noqa: E402
import pipefill.torch as pft  # noqa: E402
from pipefill import _bubbles  # noqa: E402


class Request:
    def __init__(self):
        self.waited = 0

    def wait(self):
        self.waited += 1
        return True


def host_runtime():
    try:
        return pf.Runtime(backend="host", reserved_sms=0)
    except pf.PipeFillError as error:
        if error.code == pf.Result.NOT_SUPPORTED:
            pytest.skip(f"no host device in this build: {error.message}")
        raise


@pytest.mark.parametrize("backend", ["sim", "host"])
def test_bubble_on_wait_without_a_stream_makes_bubbles_on_every_backend(backend):
    rt = pf.Runtime(backend="sim") if backend == "sim" else host_runtime()
    with rt:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no failure may be reported either
            for _ in range(3):
                request = pft.bubble_on_wait(Request(), rt)  # no stream=
                assert request.wait() is True
            rt.iteration_end()
        if backend == "sim":
            rt.sim_world.run_until_idle()
        rt.synchronize()
        assert rt.stats().bubbles == 3
        assert rt.bubble_failures == 0


def test_the_null_stream_message_names_the_host_backend():
    with host_runtime() as rt:
        with pytest.raises(pf.PipeFillError) as error:
            rt.bubble_begin(None)
        assert "stream is NULL (the host backend has no default stream" in error.value.message
        assert "simulated" not in error.value.message
    with pf.Runtime(backend="sim") as rt:
        with pytest.raises(pf.PipeFillError, match="the sim backend has no default stream"):
            rt.bubble_end(None)


def test_bubble_on_wait_failures_are_counted_and_warned_once_per_message():
    with pf.Runtime(backend="sim") as rt:
        stream = rt.sim_world.stream()
        rt.bubble_begin(stream)  # a bubble the engine left open: every begin now fails
        with pytest.warns(RuntimeWarning, match=r"bubble_on_wait: a bubble instruction failed.*"
                                                r"nested bubbles are not allowed") as caught:
            for _ in range(3):
                assert pft.bubble_on_wait(Request(), rt, stream=stream).wait() is True
        assert len([w for w in caught if "bubble instruction failed" in str(w.message)]) == 1
        assert rt.bubble_failures == 3
        [(message, count)] = rt.bubble_failures_by_message.items()
        assert "pfBubbleBegin" in message and "bubble 1 is still open" in message and count == 3
        with pytest.raises(pf.PipeFillError, match="still open"):  # strict: raised instead
            pft.bubble_on_wait(Request(), rt, stream=stream, strict=True).wait()
        rt.bubble_end(stream)


def test_schedule_wrapper_failures_reach_the_runtime_counter():
    class Schedule:
        _stage = type("Stage", (), {"stage_index": 0})()

        def step(self):
            return "stepped"

    rt = pf.Runtime(backend="sim")
    bubbles = pft.instrument(Schedule(), rt)
    rt.close()  # iteration_end fails from now on
    with pytest.warns(RuntimeWarning, match="pipefill.torch: a bubble instruction failed"):
        bubbles.schedule.step()
    assert rt.bubble_failures == len(bubbles.errors) >= 1


def test_adapter_emitter_reports_each_distinct_failure():
    with pf.Runtime(backend="sim") as rt:
        emitter = _bubbles.BubbleEmitter(rt, where="pipefill.megatron", run_sim_world=False)
        with pytest.warns(RuntimeWarning) as caught:
            assert emitter.begin(kind="bogus-kind") is None  # Python-side refusal
            assert emitter.begin(kind="bogus-kind") is None
            bubble = emitter.begin()
            bubble.end()
            bubble.stream = rt.high_priority_stream()
            bubble.open = True
            bubble.end()  # ends on another stream: no bubble is open
        messages = [str(w.message) for w in caught]
        assert len(messages) == 2, messages  # one warning per distinct message
        assert all(m.startswith("pipefill.megatron: a bubble instruction failed") for m in messages)
        assert rt.bubble_failures == 3 and len(emitter.errors) == 3
        assert emitter.bubbles == 1


def test_the_default_stream_is_made_once_per_runtime():
    with pf.Runtime(backend="sim") as rt, pf.Runtime(backend="sim") as other:
        first = _bubbles.default_stream(rt)
        assert _bubbles.default_stream(rt) is first
        assert _bubbles.default_stream(other) is not first


def test_stats_carry_the_adapter_failure_count():
    # Issue 17: the count is in Stats too, and print(stats) mentions it.
    import warnings
    import pipefill as pf
    rt = pf.Runtime(backend="sim")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt._report_bubble_failure(pf.PipeFillError(pf.Result.INVALID_ARGUMENT, "x is bad"), "test")
        rt._report_bubble_failure(pf.PipeFillError(pf.Result.INVALID_ARGUMENT, "x is bad"), "test")
    stats = rt.stats()
    assert stats.bubble_failures == 2
    assert "failed inside an adapter: 2" in str(stats)
    rt.close()
