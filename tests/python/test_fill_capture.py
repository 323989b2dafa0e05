"""torch's settings around a graph fill job's capture and the wait for its results (issue 33
items 1-3), on CPU with torch's capture mocked (cuda_fakes.py's stand-ins):

- item 1: the matmul SM carve-out sizes GEMMs to the fill partition during the warm-up and the
  capture, and the caller's value is back afterwards - also when the step raises;
- item 2: the backward runs on the capturing thread (autograd multithreading off) during the
  warm-up and the capture; a captured kernel node outside the fill context is refused before
  registration, naming it, after the training step's undo ran;
- item 3: ``GraphFillJob.wait`` waits on the runtime's fill streams, never the whole device.
"""
from __future__ import annotations

import ctypes
import logging
import pathlib
import subprocess
import sys
import threading

import pytest
import torch

import pipefill as pf
import pipefill.torch as pft
from pipefill.torch import _fill_capture as fc
from pipefill.torch import _graph_contexts as gc
from cuda_fakes import FakeGraph, FakeRuntime, fake_cuda  # noqa: F401 (fixture)

DEVICE_SMS, RESERVED = 132, 20


def carveout() -> "int | None":
    return torch._C._get_sm_carveout_experimental()


@pytest.fixture
def partition(monkeypatch, fake_cuda):  # noqa: F811
    """A 132-SM device whose runtime reserves 20 SMs (fill partition: 112), no driver to ask."""
    monkeypatch.setattr(fc, "device_sm_count", lambda device: DEVICE_SMS)
    monkeypatch.setattr(FakeRuntime, "config", pf.Config(reserved_sms=RESERVED), raising=False)
    monkeypatch.setattr(gc.DriverGraphReader, "open", classmethod(lambda cls: None))
    torch._C._set_sm_carveout_experimental(None)
    yield fake_cuda
    torch._C._set_sm_carveout_experimental(None)


def test_carveout_arithmetic():
    assert fc.carveout_for(112, 132, None) == 20
    assert fc.carveout_for(112, 132, 8) == 20, "a smaller carve-out of the caller is raised"
    assert fc.carveout_for(112, 132, 30) is None, "a larger one of the caller is kept as it is"
    assert fc.carveout_for(None, 132, None) is None, "unknown partition: nothing set"
    assert fc.carveout_for(132, 132, None) is None, "the whole device: nothing set"
    assert fc.carveout_for(112, 0, None) is None, "unknown device: nothing set"


@pytest.mark.parametrize("previous, during", [(None, 20), (8, 20), (30, 30)])
def test_matmuls_are_sized_to_the_fill_partition_during_warm_up_and_capture(partition, previous,
                                                                            during):
    torch._C._set_sm_carveout_experimental(previous)
    seen = []
    weights = torch.randn(4, 4)

    def step(index):
        seen.append(carveout())
        torch.matmul(weights, weights)

    rt = FakeRuntime()
    job = pft.graph_fill_job(rt, step, 4, item_cost_us=10.0, warmup=2)
    assert seen == [during] * 3, "two warm-ups and the capture, all with the fill SM target"
    assert carveout() == previous, "the caller's carve-out is back after the capture"
    assert rt.jobs, "the job was registered"
    job.close()


def test_the_carveout_is_restored_when_the_step_raises(partition):
    torch._C._set_sm_carveout_experimental(4)

    def step(index):
        assert carveout() == 20
        raise RuntimeError("the step failed")

    rt = FakeRuntime()
    with pytest.raises(RuntimeError, match="the step failed"):
        pft.graph_fill_job(rt, step, 4, item_cost_us=10.0, warmup=1)
    assert carveout() == 4
    assert not rt.jobs and all(s.closed for s in rt.capture_streams)


def test_nested_and_concurrent_targets_restore_once_the_last_ends():
    torch._C._set_sm_carveout_experimental(None)
    try:
        entered, release = threading.Event(), threading.Event()

        def other_capture():
            with fc.matmul_sm_target(116, 132):
                entered.set()
                release.wait(10)

        thread = threading.Thread(target=other_capture)
        thread.start()
        assert entered.wait(10)
        with fc.matmul_sm_target(112, 132) as mine:
            assert mine == 20 and carveout() == 20, "the larger carve-out of the two wins"
        assert carveout() == 20, "still set: the other capture is open"
        release.set()
        thread.join()
        assert carveout() is None, "restored by the last capture to end"
    finally:
        torch._C._set_sm_carveout_experimental(None)


def test_the_backward_runs_on_the_capturing_thread_during_warm_up_and_capture(partition):
    model = torch.nn.Linear(4, 2)
    inputs = torch.randn(3, 4)
    seen = []  # (thread, autograd multithreading enabled) per backward
    model.weight.register_hook(
        lambda g: seen.append((threading.get_ident(), torch.autograd.is_multithreading_enabled())))

    def step(index):
        model.zero_grad(set_to_none=True)
        model(inputs).square().sum().backward()

    job = pft.graph_fill_job(FakeRuntime(), step, 2, item_cost_us=10.0, warmup=2)
    me = threading.get_ident()
    assert seen == [(me, False)] * 3, "warm-ups and capture: backward on this thread, threads off"
    assert torch.autograd.is_multithreading_enabled(), "the thread's autograd mode is restored"
    job.close()


# ---- kernel node contexts (item 2) ------------------------------------------------------------

FILL, PRIMARY, OTHER = 0xF111, 0x9000, 0x7777


class FakeReader:
    """A graph of node ids: kernels with (name, context), child graphs, other nodes."""

    def __init__(self, graphs):
        self.graphs = graphs  # graph -> [("kernel", name, ctx) | ("child", graph) | ("memcpy",)]
        self.ids = {}

    def nodes(self, graph):
        out = []
        for entry in self.graphs[graph]:
            self.ids[id(entry)] = entry
            out.append(id(entry))
        return out

    def node_type(self, node):
        kind = self.ids[node][0]
        return {"kernel": gc.KERNEL_NODE, "child": gc.CHILD_GRAPH_NODE}.get(kind, 1)

    def kernel(self, node):
        _, name, ctx = self.ids[node]
        return name, ctx

    def child(self, node):
        return self.ids[node][1]

    def stream_context(self, stream):
        return FILL

    def primary_context(self, device):
        return PRIMARY

    def context_sm_count(self, context):
        return 112 if context == FILL else None


TRAINING_GRAPH = {1: [("kernel", "gemm_fwd", FILL), ("memcpy",), ("child", 2)],
                  2: [("kernel", "ampere_sgemm_bwd", PRIMARY), ("kernel", "reduce", FILL),
                      ("kernel", "adam", None)]}


def test_every_kernel_node_is_found_with_its_context_in_child_graphs_too():
    nodes = gc.walk_kernel_nodes(FakeReader(TRAINING_GRAPH), 1)
    assert [(n.where, n.kernel, n.context) for n in nodes] == [
        ("node 0 of the graph", "gemm_fwd", FILL),
        ("node 0 of child graph 2 of the graph", "ampere_sgemm_bwd", PRIMARY),
        ("node 1 of child graph 2 of the graph", "reduce", FILL),
        ("node 2 of child graph 2 of the graph", "adam", None)]
    lines = gc.context_report(nodes, FILL, PRIMARY)
    assert lines[0].endswith("(the fill partition's green context)")
    assert lines[1].endswith("(the device's primary context)")
    assert lines[3].endswith("context not reported by the driver")
    assert gc.describe_context(OTHER, FILL, PRIMARY).endswith("(another context)")
    assert "grid-cap" in gc.describe_context(FILL, FILL, FILL)


def test_children_nested_too_deep_are_refused():
    deep = {i: [("child", i + 1)] for i in range(12)}
    deep[12] = [("kernel", "k", FILL)]
    with pytest.raises(ValueError, match="nested deeper than 8"):
        gc.walk_kernel_nodes(FakeReader(deep), 0)


def test_a_node_outside_the_fill_context_is_refused_by_name_and_logged(caplog):
    reader = FakeReader(TRAINING_GRAPH)
    with caplog.at_level(logging.WARNING, logger="pipefill.torch"):
        with pytest.raises(pf.PipeFillError) as raised:
            gc.check_capture_contexts(reader, 1, FILL, PRIMARY, "train")
    assert raised.value.code == pf.Result.NOT_SUPPORTED
    message = str(raised.value)
    assert "1 of 4 kernel nodes" in message
    assert "node 0 of child graph 2 of the graph: ampere_sgemm_bwd" in message
    assert "the device's primary context" in message and "PIPEFILL_GREEN_CONTEXT=0" in message
    assert any("ampere_sgemm_bwd" in r.getMessage() for r in caplog.records), "the reason is logged"


def test_kernels_all_in_the_fill_context_or_unreadable_are_accepted():
    good = {1: [("kernel", "gemm", FILL), ("child", 2)], 2: [("kernel", "relu", FILL)]}
    assert len(gc.check_capture_contexts(FakeReader(good), 1, FILL, PRIMARY, "infer")) == 2
    assert gc.check_capture_contexts(None, 1, FILL, PRIMARY, "infer") == [], "no driver: the runtime checks"
    # Grid-cap mode: the fill context is the primary one; kernels there are accepted.
    primary_only = {1: [("kernel", "gemm", PRIMARY)]}
    assert len(gc.check_capture_contexts(FakeReader(primary_only), 1, PRIMARY, PRIMARY, "x")) == 1


def test_graph_fill_job_refuses_before_registering_and_after_the_undo(partition, monkeypatch):
    reader = FakeReader(TRAINING_GRAPH)
    monkeypatch.setattr(gc.DriverGraphReader, "open", classmethod(lambda cls: reader))
    monkeypatch.setattr(FakeGraph, "raw_cuda_graph", lambda self: 1)
    undone = []
    rt = FakeRuntime()
    with pytest.raises(pf.PipeFillError, match="ampere_sgemm_bwd"):
        pft.graph_fill_job(rt, lambda index: None, 2, item_cost_us=10.0,
                           before_register=lambda: undone.append(True))
    assert undone == [True], "the training step's undo ran before the refusal"
    assert not rt.jobs, "nothing registered"
    assert all(s.closed for s in rt.capture_streams), "the capture stream is destroyed"


# ---- the results' wait (item 3) -------------------------------------------------------------

def test_wait_synchronizes_the_fill_streams_only(partition, monkeypatch):
    synced = []

    class Recording:
        def __init__(self, handle, device=None):
            self.handle = handle

        def synchronize(self):
            synced.append(self.handle)

    monkeypatch.setattr(FakeRuntime, "fill_stream_handles", lambda self: [11, 12], raising=False)
    rt = FakeRuntime()
    out = torch.zeros(2)
    job = pft.graph_fill_job(rt, lambda index: None, 2, outputs=out, item_cost_us=10.0)
    monkeypatch.setattr(torch.cuda, "ExternalStream", Recording)
    partition.clear()  # device drains so far (none expected either)
    assert job.wait(1.0) is out
    assert synced == [11, 12], "each fill stream waited for"
    assert partition == [], "no torch.cuda.synchronize (it waits for every stream of the device)"
    job.close()


# ---- the driver binding (item 2), against the CUDA 13.0 headers and the toolkit's stub ---------

STUB = pathlib.Path("/usr/local/cuda/lib64/stubs/libcuda.so")


def test_the_driver_structures_match_cuda_h():
    # cuda.h 13.0, compiled here: sizeof(CUDA_KERNEL_NODE_PARAMS_v2) = 72, offsetof(ctx) = 64;
    # sizeof(CUdevResource) = 144, offsetof(sm.smCount) = 96.
    assert ctypes.sizeof(gc._KernelNodeParams) == 72
    assert gc._KernelNodeParams.ctx.offset == 64
    assert (gc._RESOURCE_BYTES, gc._SM_COUNT_OFFSET) == (144, 96)


@pytest.mark.skipif(not STUB.exists(), reason="no CUDA toolkit stub libcuda here")
def test_every_driver_call_exists_and_a_failure_names_the_call():
    # In a child process: the stub, once loaded, would be the process's libcuda for other tests.
    script = f"""
import ctypes
import pytest
from pipefill.torch import _graph_contexts as gc
assert gc.DriverGraphReader.open() is None, "libcuda is not loaded: open() must not load it"
reader = gc.DriverGraphReader(ctypes.CDLL({str(STUB)!r}))  # the stub fails every call (34)
with pytest.raises(OSError, match=r"cuGraphGetNodes failed: CUresult 34"):
    reader.nodes(1)
with pytest.raises(OSError, match=r"cuStreamGetCtx failed: CUresult 34"):
    reader.stream_context(1)
assert reader.primary_context(0) is None and reader.context_sm_count(1) is None
for name in ("cuGraphNodeGetType", "cuGraphKernelNodeGetParams_v2",
             "cuGraphChildGraphNodeGetGraph", "cuFuncGetName", "cuKernelGetName", "cuDeviceGet",
             "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2", "cuCtxGetDevResource"):
    assert hasattr(reader._lib, name), name
assert gc.DriverGraphReader.open() is not None, "a loaded libcuda.so.1 is reused"
print("driver binding ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "driver binding ok" in done.stdout
