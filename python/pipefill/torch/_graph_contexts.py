"""pipefill.torch._graph_contexts: which CUDA context each kernel node of a captured graph belongs
to (issue 33 item 2), read through the driver, for the check after a graph fill job's capture and
for gpu-check's report of an inference and a training capture.

In green-context mode every kernel of a graph fill job's item must belong to the fill partition's
green context (CUDA runs a conditional body in one context); the runtime refuses any other graph
at ``pfJobCreateGraph``. A kernel launched while another context is current lands there - e.g. a
backward kernel launched by autograd's worker thread, where the fill context pushed on the
capturing thread is not current. :func:`check_capture_contexts` finds such nodes right after the
capture and refuses the job with the reason logged, naming each node, its kernel and its context.

The driver is libcuda as the process has loaded it already (torch did, to run CUDA): opened with
``RTLD_NOLOAD``, never loaded by us (docs/architecture.md: the process's CUDA libraries are the
framework's choice). Without it (no CUDA, another platform) :meth:`DriverGraphReader.open` gives
None and nothing is checked here; the runtime's own check at registration still holds.
"""
from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from .._enums import Result
from .._errors import PipeFillError

log = logging.getLogger("pipefill.torch")

KERNEL_NODE, CHILD_GRAPH_NODE = 0, 4  # CUgraphNodeType: CU_GRAPH_NODE_TYPE_KERNEL, _GRAPH
MAX_CHILD_DEPTH = 8
_SM_RESOURCE = 1                       # CU_DEV_RESOURCE_TYPE_SM
_RESOURCE_BYTES, _SM_COUNT_OFFSET = 144, 96  # sizeof(CUdevResource), offsetof(.sm.smCount)


@dataclass(frozen=True)
class KernelNode:
    where: str              # "node 3 of child graph 1 of the graph"
    kernel: str             # the kernel's name ("?" when the driver gives none)
    context: Optional[int]  # CUcontext the node runs in (None: not reported)


class _KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h, CUDA >= 12.0)
    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint),
                ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint),
                ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class DriverGraphReader:
    """The driver calls the walk needs; every call's CUresult is checked (OSError naming it)."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib

    @classmethod
    def open(cls) -> Optional["DriverGraphReader"]:
        try:
            lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
            for name in ("cuStreamGetCtx", "cuGraphGetNodes", "cuGraphNodeGetType",
                         "cuGraphKernelNodeGetParams_v2", "cuGraphChildGraphNodeGetGraph"):
                getattr(lib, name)
        except (OSError, AttributeError):
            return None
        return cls(lib)

    def _call(self, name: str, *args: Any) -> None:
        result = getattr(self._lib, name)(*args)
        if result != 0:
            raise OSError(f"{name} failed: CUresult {result}")

    def _optional(self, name: str, *args: Any) -> bool:
        function = getattr(self._lib, name, None)
        return function is not None and function(*args) == 0

    def stream_context(self, stream: int) -> Optional[int]:
        context = ctypes.c_void_p()
        self._call("cuStreamGetCtx", ctypes.c_void_p(stream), ctypes.byref(context))
        return context.value

    def primary_context(self, ordinal: int) -> Optional[int]:
        """The device's primary context (retained and released at once: torch keeps it alive)."""
        device, context = ctypes.c_int(), ctypes.c_void_p()
        if not self._optional("cuDeviceGet", ctypes.byref(device), ctypes.c_int(ordinal)):
            return None
        if not self._optional("cuDevicePrimaryCtxRetain", ctypes.byref(context), device):
            return None
        self._optional("cuDevicePrimaryCtxRelease_v2", device)
        return context.value

    def context_sm_count(self, context: Optional[int]) -> Optional[int]:
        """SMs of a context (a green context's partition; the device's for the primary one)."""
        if context is None:
            return None
        resource = (ctypes.c_ubyte * _RESOURCE_BYTES)()
        if not self._optional("cuCtxGetDevResource", ctypes.c_void_p(context), resource,
                              ctypes.c_int(_SM_RESOURCE)):
            return None
        return int(ctypes.c_uint.from_buffer(resource, _SM_COUNT_OFFSET).value) or None

    # -- the walk's interface (walk_kernel_nodes) --
    def nodes(self, graph: int) -> List[int]:
        count = ctypes.c_size_t(0)
        self._call("cuGraphGetNodes", ctypes.c_void_p(graph), None, ctypes.byref(count))
        nodes = (ctypes.c_void_p * max(1, count.value))()
        self._call("cuGraphGetNodes", ctypes.c_void_p(graph), nodes, ctypes.byref(count))
        return [nodes[i] for i in range(count.value)]

    def node_type(self, node: int) -> int:
        kind = ctypes.c_int()
        self._call("cuGraphNodeGetType", ctypes.c_void_p(node), ctypes.byref(kind))
        return kind.value

    def kernel(self, node: int) -> "tuple[str, Optional[int]]":
        params = _KernelNodeParams()
        self._call("cuGraphKernelNodeGetParams_v2", ctypes.c_void_p(node), ctypes.byref(params))
        name = ctypes.c_char_p()
        if params.func and self._optional("cuFuncGetName", ctypes.byref(name),
                                          ctypes.c_void_p(params.func)):
            pass
        elif params.kern:
            self._optional("cuKernelGetName", ctypes.byref(name), ctypes.c_void_p(params.kern))
        kernel = name.value.decode(errors="replace") if name.value else "?"
        return kernel, params.ctx

    def child(self, node: int) -> int:
        graph = ctypes.c_void_p()
        self._call("cuGraphChildGraphNodeGetGraph", ctypes.c_void_p(node), ctypes.byref(graph))
        return graph.value or 0


def walk_kernel_nodes(reader: Any, graph: int, where: str = "the graph",
                      depth: int = 0) -> List[KernelNode]:
    """Every kernel node of ``graph`` and of its child graphs (nested at most 8 deep), in the
    driver's node order, each with its kernel's name and its context."""
    if depth > MAX_CHILD_DEPTH:
        raise ValueError(f"child graphs nested deeper than {MAX_CHILD_DEPTH} ({where})")
    found: List[KernelNode] = []
    for i, node in enumerate(reader.nodes(graph)):
        kind = reader.node_type(node)
        if kind == KERNEL_NODE:
            kernel, context = reader.kernel(node)
            found.append(KernelNode(f"node {i} of {where}", kernel, context))
        elif kind == CHILD_GRAPH_NODE:
            found += walk_kernel_nodes(reader, reader.child(node),
                                       f"child graph {i} of {where}", depth + 1)
    return found


def describe_context(context: Optional[int], fill: Optional[int],
                     primary: Optional[int]) -> str:
    if context is None:
        return "context not reported by the driver"
    text = f"context {context:#x}"
    if context == fill and context == primary:
        return text + " (the primary context, which holds the fill partition: grid-cap mode)"
    if context == fill:
        return text + " (the fill partition's green context)"
    if context == primary:
        return text + " (the device's primary context)"
    return text + " (another context)"


def context_report(nodes: Sequence[KernelNode], fill: Optional[int],
                   primary: Optional[int]) -> List[str]:
    """One line per kernel node: where it is, its kernel, its context."""
    return [f"{n.where}: {n.kernel}: {describe_context(n.context, fill, primary)}"
            for n in nodes]


def foreign_kernels(nodes: Sequence[KernelNode], fill: Optional[int]) -> List[KernelNode]:
    """The kernel nodes whose reported context is not the fill context."""
    return [n for n in nodes if n.context is not None and n.context != fill]


def refusal_reason(nodes: Sequence[KernelNode], fill: Optional[int], primary: Optional[int],
                   name: str) -> Optional[str]:
    """Why graph job ``name`` cannot run in the fill partition (None when it can): its kernel
    nodes outside the fill context, each named. The runtime's rule (pfJobCreateGraph) in both
    modes: in grid-cap mode the fill context is the primary one."""
    wrong = foreign_kernels(nodes, fill)
    if not wrong or fill is None:
        return None
    listed = "; ".join(context_report(wrong[:8], fill, primary))
    more = f" (and {len(wrong) - 8} more)" if len(wrong) > 8 else ""
    return (f"graph job '{name}': {len(wrong)} of {len(nodes)} kernel nodes of the captured item "
            f"do not belong to the fill partition's context {fill:#x}: {listed}{more}. They were "
            "launched on a thread without the fill context current (autograd's worker thread, a "
            "library's own thread); the job cannot run gated in the green-context partition. "
            "Run the runtime in grid-cap mode (PIPEFILL_GREEN_CONTEXT=0) for such work")


def check_capture_contexts(reader: Optional[Any], graph: int, fill: Optional[int],
                           primary: Optional[int], name: str) -> List[KernelNode]:
    """Reads every kernel node's context after a capture; raises PipeFillError(NOT_SUPPORTED)
    with :func:`refusal_reason` (logged first) when one is outside the fill context. Returns the
    nodes ([] when the driver cannot be read: the runtime's check at registration decides)."""
    if reader is None or fill is None:
        return []
    nodes = walk_kernel_nodes(reader, graph)
    why = refusal_reason(nodes, fill, primary, name)
    if why is not None:
        log.warning("%s", why)
        raise PipeFillError(Result.NOT_SUPPORTED, why)
    return nodes
