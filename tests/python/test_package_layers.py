"""The pipefill package's layers import one way (issue 27), checked on the sources with ast.

Layers, lowest first (a module imports only its own layer's lower modules or lower layers):

0. the binding core: the extension (_pipefill) and _enums, _errors, _config, _sim, _profiler,
   _stats, _extensions, _job, _runtime, jobs;
1. _bubbles (the bubble emitter the adapters share);
2. the pipefill.torch subpackage, in this order: _streams, _schedule, _graph_contexts,
   _fill_capture, _graph_jobs, _job_common, _sinks, _streaming, _batch_sizes, _cuda_ring, _training_state,
   _checkpoints, _micro_steps, _training, then its face (__init__); its modules import pipefill
   modules at module top only (no import inside a function: that is how the old circles were
   hidden);
3. the adapters: deepspeed, megatron;
4. pipefill.service (joins runtimes through _extensions, registered by the package face);
5. the package face, pipefill/__init__.py, which nothing inside the package imports.

Also: the whole import graph (function-level imports included; `if TYPE_CHECKING:` blocks
excluded) has no cycle. Each rule is a separate test naming the offending file and line.
"""
from __future__ import annotations

import ast
import pathlib
from typing import Dict, Iterator, List, Optional, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2] / "python"
PACKAGE = ROOT / "pipefill"

CORE = ["_enums", "_errors", "_config", "_sim", "_profiler", "_stats", "_extensions",
        "_job", "_runtime", "jobs"]
TORCH_ORDER = ["_streams", "_schedule", "_graph_contexts", "_fill_capture", "_graph_jobs",
               "_job_common", "_sinks", "_streaming", "_batch_sizes",
               "_cuda_ring", "_training_state",
               "_checkpoints", "_micro_steps", "_training", "__init__"]


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> Dict[str, pathlib.Path]:
    found = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    found["pipefill._pipefill"] = PACKAGE / "_pipefill (extension)"
    return found


def layer(name: str) -> Tuple[int, int]:
    """(layer, order inside the layer) of a module of the package."""
    rest = name.split(".")[1:]
    if not rest:
        return (5, 0)
    head = rest[0]
    if head == "_pipefill" or head in CORE:
        return (0, 0)
    if head == "_bubbles":
        return (1, 0)
    if head == "torch":
        sub = rest[1] if len(rest) > 1 else "__init__"
        return (2, TORCH_ORDER.index(sub) if sub in TORCH_ORDER else -1)
    if head in ("deepspeed", "megatron"):
        return (3, 0)
    if head == "service":
        return (4, 0)
    raise AssertionError(f"{name}: a module the layer rules do not place (add it to a layer)")


class Import:
    def __init__(self, source: str, line: int, target: str, top: bool, text: str) -> None:
        self.source, self.line, self.target, self.top, self.text = source, line, target, top, text

    def where(self) -> str:
        return f"{self.source} line {self.line}: {self.text}"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, top: bool) -> Iterator[Tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield from _walk(other, top)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, top
        inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                ast.ClassDef, ast.Lambda))
        yield from _walk(child, inner)


def imports() -> List[Import]:
    known = modules()
    out: List[Import] = []
    for name, path in known.items():
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node, top in _walk(tree, True):
            text = ast.unparse(node)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "pipefill" or alias.name.startswith("pipefill."):
                        out.append(Import(name, node.lineno, alias.name, top, text))
                continue
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not (module == "pipefill" or module.startswith("pipefill.")):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                # `from . import jobs` imports the submodule; `from . import Runtime` reads a
                # name from the package's __init__ (the face).
                out.append(Import(name, node.lineno, sub if sub in known else module, top, text))
    return out


def test_the_rules_see_the_package():
    names = set(modules())
    for expected in ("pipefill", "pipefill._runtime", "pipefill.jobs", "pipefill.torch",
                     "pipefill.torch._streaming", "pipefill.service.agent", "pipefill._stats",
                     "pipefill._extensions"):
        assert expected in names, expected
    assert len(imports()) > 40


def test_nothing_inside_the_package_imports_its_face():
    bad = [i.where() for i in imports() if i.target == "pipefill" and i.source != "pipefill"]
    assert not bad, "modules importing pipefill/__init__ (import what you need from the " \
                    "module that defines it):\n" + "\n".join(bad)


def test_every_import_goes_down_the_layers():
    bad = []
    for i in imports():
        if i.source == "pipefill" or i.target == "pipefill":
            continue  # the face imports everything; imports of the face: the test above
        (src_layer, src_order), (dst_layer, dst_order) = layer(i.source), layer(i.target)
        if dst_layer > src_layer:
            bad.append(f"{i.where()}  (layer {src_layer} imports layer {dst_layer})")
        elif src_layer == dst_layer == 2 and not dst_order < src_order:
            bad.append(f"{i.where()}  (pipefill.torch: {TORCH_ORDER[dst_order]} is not below "
                       f"{TORCH_ORDER[src_order]})")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_core_never_imports_torch_adapters_or_the_service():
    bad = [i.where() for i in imports() if layer(i.source)[0] == 0 and layer(i.target)[0] > 0]
    assert not bad, "\n".join(bad)


def test_the_torch_modules_import_the_package_at_module_top_only():
    bad = [i.where() for i in imports() if layer(i.source)[0] == 2 and not i.top]
    assert not bad, "imports inside functions in pipefill.torch (import at the top, from a " \
                    "lower module):\n" + "\n".join(bad)


def test_the_import_graph_has_no_cycle():
    graph: Dict[str, List[Import]] = {}
    for i in imports():
        if i.source != i.target:
            graph.setdefault(i.source, []).append(i)
    state: Dict[str, int] = {}
    stack: List[Import] = []

    def visit(node: str) -> Optional[List[Import]]:
        state[node] = 1
        for edge in graph.get(node, []):
            stack.append(edge)
            if state.get(edge.target) == 1:
                start = next(k for k, e in enumerate(stack) if e.source == edge.target)
                return stack[start:]
            if edge.target not in state:
                found = visit(edge.target)
                if found:
                    return found
            stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            assert cycle is None, "import cycle:\n" + "\n".join(e.where() for e in cycle)
