"""Runtime.memory_info() (pfRuntimeGetMemoryInfo): the arena's use by jobs and the device's
memory measured at the call, refused inside a bubble."""
from __future__ import annotations

import pytest

import pipefill as pf

MiB = 1 << 20
GiB = 1 << 30


def test_memory_info_follows_the_jobs_and_the_main_jobs_memory():
    world = pf.SimWorld(devices=1)
    with pf.Runtime(backend="sim", sim_world=world, arena_bytes=64 * MiB) as rt:
        before = rt.memory_info()
        assert isinstance(before, pf.MemoryInfo)
        assert (before.arena_bytes, before.arena_used_bytes, before.arena_largest_free_bytes) == (
            64 * MiB, 0, 64 * MiB)
        total = before.device_total_bytes
        assert before.device_free_bytes == total - 64 * MiB
        job = rt.create_job(pf.SimTicketJob(name="resident", items=100, item_cost_us=10.0,
                                            resident_bytes=3 * MiB))
        world.set_memory_used(0, 10 * GiB)
        during = rt.memory_info()
        assert (during.arena_used_bytes, during.arena_largest_free_bytes) == (3 * MiB, 61 * MiB)
        assert during.device_free_bytes == total - 10 * GiB - 64 * MiB
        job.close()
        assert rt.memory_info().arena_used_bytes == 0


def test_memory_info_is_refused_inside_a_bubble():
    with pf.Runtime(backend="host", arena_bytes=MiB) as rt:
        stream = rt.high_priority_stream()
        with rt.bubble(stream, expected_us=50.0):
            with pytest.raises(pf.PipeFillError, match="pfRuntimeGetMemoryInfo") as caught:
                rt.memory_info()
            assert caught.value.code == pf.Result.INVALID_STATE
        assert rt.memory_info().arena_bytes == MiB
