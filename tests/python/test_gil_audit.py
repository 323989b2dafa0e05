"""The GIL rule of the extension (issue 25), audited binding by binding.

Rule (python/src/common.hpp, without_gil): a binding that calls into the C library or takes a
lock a native thread may hold releases the GIL first, because fill-stream threads and the
simulated world's run loop call Python items and observers while the runtime waits for them.

This test reads the extension's sources (python/src/*.cpp, *.hpp), finds every name bound with
.def / .def_prop_* / .def_rw / nb::init, finds the body that runs for it (a lambda, a method of
the bound class, a constructor) and checks that the body releases the GIL (without_gil or
nb::gil_scoped_release). The bindings that keep the GIL are listed below with the reason; the
test fails on a binding that holds the GIL without a listed reason, and on a listed binding that
no longer exists or now releases it (so the list stays true). A runtime check backs it: Use (the
handle lifetime lock every C call takes) raises pfErrorInternal when entered holding the GIL.
"""
from __future__ import annotations

import pathlib
import re

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "python" / "src"

# Bindings that run with the GIL held, and why that cannot deadlock.
HOLDS_GIL = {
    "set_error_type": "stores a Python object (needs the GIL); no C call, no lock",
    "error_string": "pfGetErrorString: a static string per code; no lock",
    "version": "pfGetVersion: a constant; no lock",
    "fill_kind_name": "fjKindName: a static string per kind; no lock",
    "known_environment_variables": "a static list of names; builds a Python list",
    "RawConfig.__init__": "pfConfigInit fills a struct; no lock",
    "RawConfig.size": "a field of a Python-owned struct",
    "RawConfig.version": "a field of a Python-owned struct",
    "RawConfig.<fields>": "fields of a Python-owned struct (PF_FIELD)",
    "FillParams.__init__": "fjParamsInit fills a struct; no lock",
    "FillParams.<fields>": "fields of a Python-owned struct (def_rw)",
    "SimWorld.owned": "reads a pointer fixed at construction; no lock",
    "Job.name": "reads a string fixed at construction; no lock",
    "Job.items_run": "one atomic load",
    "Job.item_error": "the item record's mutex: fill threads take it only after releasing the "
                      "GIL and never wait for the GIL while holding it",
    "Runtime.slice_observer_error": "the observer record's mutex: taken by fill threads only "
                                    "after releasing the GIL",
    "Runtime.slice_observer_calls": "one atomic load",
    "Runtime.fill_window_open": "one atomic load (the host backend's slices in progress)",
    "Runtime.fill_windows": "one atomic load",
}

RELEASES = re.compile(r"without_gil\(|gil_scoped_release")


def sources() -> dict:
    return {p.name: p.read_text() for p in sorted(SRC.glob("*.[ch]pp"))}


def blank_literals(text: str) -> str:
    """text with the insides of string and char literals and of // comments blanked (same
    length), so that braces and semicolons in them do not count."""
    return re.sub(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\'|//[^\n]*',
                  lambda m: m.group(0)[0] + " " * (len(m.group(0)) - 2) + m.group(0)[-1]
                  if m.group(0)[0] in "\"'" else " " * len(m.group(0)), text)


def block_at(text: str, brace: int) -> str:
    """The text of the {...} block whose opening brace is at `brace`."""
    scan = blank_literals(text)
    depth = 0
    for i in range(brace, len(text)):
        if scan[i] == "{":
            depth += 1
        elif scan[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace:i + 1]
    raise AssertionError("unbalanced braces")


def statement_end(text: str, start: int) -> int:
    """The index of the ';' ending the statement that starts at `start` (outside brackets)."""
    scan = blank_literals(text)
    depth = 0
    for i in range(start, len(text)):
        c = scan[i]
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == ";" and depth == 0:
            return i
    raise AssertionError("statement without an end")


def class_body(all_text: str, cls: str) -> str:
    m = re.search(r"\b(?:class|struct)\s+" + cls + r"\b[^;{]*\{", all_text)
    assert m, f"class {cls} not found in python/src"
    return block_at(all_text, m.end() - 1)


def method_body(all_text: str, cls: str, method: str) -> str:
    """The body of cls::method: out of line (Class::method(...) {) or inline in the class."""
    m = re.search(r"\b" + cls + r"::" + method + r"\([^;{]*\)\s*(?:const\s*)?\{", all_text)
    if m:
        return block_at(all_text, m.end() - 1)
    body = class_body(all_text, cls)
    # An inline definition: a return type (or none, for a constructor) then name(...) {.
    m = re.search(r"\n\s+[\w:<>,\s*&]*\b" + method + r"\(([^;{}]|\n)*\)\s*(?:const\s*)?"
                  r"(?::[^{;]*)?\{", body)
    assert m, f"{cls}::{method} not found"
    return block_at(body, m.end() - 1)


def bindings() -> dict:
    """Every bound name -> the C++ text that runs for it (None: a plain field)."""
    files = sources()
    all_text = "\n".join(files.values())
    found = {}
    # nb::class_<Type>(m, "PyName", ...) blocks and module-level m.def(...) lambdas.
    for name, text in files.items():
        for cm in re.finditer(r'nb::class_<(\w+)>\(m,\s*"(\w+)"', text):
            cls, py = cm.group(1), cm.group(2)
            end = statement_end(text, cm.start())
            chain = text[cm.end():end]
            for dm in re.finditer(r'\.(def|def_prop_ro|def_prop_rw|def_rw|def_ro)\(\s*'
                                  r'(?:"(\w+)"|nb::init)', chain):
                kind, attr = dm.group(1), dm.group(2)
                rest = chain[dm.end():]
                if attr is None:  # .def(nb::init<...>()): the constructor
                    found[f"{py}.__init__"] = method_body(all_text, cls, cls)
                    continue
                if attr == "__init__":
                    lam = re.match(r"\s*,\s*\[[^\]]*\](?:\([^)]*\))?\s*\{", rest)
                    found[f"{py}.__init__"] = block_at(rest, lam.end() - 1)
                    continue
                if kind in ("def_rw", "def_ro"):
                    found[f"{py}.<fields>"] = None
                    continue
                ref = re.match(r"\s*,\s*&(\w+)::(\w+)", rest)
                lam = re.match(r"\s*,\s*\[[^\]]*\](?:\([^)]*\))?\s*\{", rest)
                if ref:
                    found[f"{py}.{attr}"] = method_body(all_text, ref.group(1), ref.group(2))
                elif lam:
                    found[f"{py}.{attr}"] = block_at(rest, lam.end() - 1)
                else:
                    raise AssertionError(f"{name}: cannot read the binding {py}.{attr}")
            if "PF_FIELD(" in chain:
                found[f"{py}.<fields>"] = None
        for dm in re.finditer(r'\bm\.def\(\s*"(\w+)"\s*,\s*\[[^\]]*\](?:\([^)]*\))?\s*\{', text):
            found[dm.group(1)] = block_at(text, dm.end() - 1)
    return found


def test_the_audit_finds_the_extension_s_bindings():
    b = bindings()
    # A few that must be there, so a parser that finds nothing cannot pass.
    for name in ("Runtime.create_fill_job", "Runtime.create_graph_job", "Runtime.create_item_job",
                 "Runtime.bubble_begin", "Job.wait", "Job.close", "SimWorld.run_until",
                 "host_stream_synchronize", "Runtime.__init__"):
        assert name in b, name
    assert len(b) > 70, len(b)


def test_every_binding_releases_the_gil_or_says_why_not():
    holding = {name for name, body in bindings().items()
               if body is None or not RELEASES.search(body)}
    unexplained = sorted(holding - HOLDS_GIL.keys())
    stale = sorted(HOLDS_GIL.keys() - holding)
    table = "\n".join(f"  {name}: {HOLDS_GIL.get(name, '(no reason given)')}"
                      for name in sorted(holding))
    print("bindings that keep the GIL:\n" + table)
    assert not unexplained, ("these bindings keep the GIL without a reason in HOLDS_GIL "
                             f"(release it with without_gil, or add the reason): {unexplained}")
    assert not stale, f"HOLDS_GIL lists bindings that release the GIL or are gone: {stale}"


def test_a_lifetime_lock_taken_holding_the_gil_is_refused_at_runtime():
    """The runtime half of the audit: Use (every C call's handle lock) checks the GIL."""
    common = (SRC / "common.hpp").read_text()
    use = block_at(common, common.index("Use(Lifetime& life, const char* what) {") +
                   len("Use(Lifetime& life, const char* what) ") )
    assert "PyGILState_Check()" in use and "pfErrorInternal" in use


@pytest.mark.parametrize("name", ["Runtime.create_fill_job", "Runtime.create_graph_job",
                                  "Runtime.create_item_job", "Runtime.create_sim_ticket_job",
                                  "Job.close", "Job.wait", "Job.cancel", "Job.info",
                                  "Runtime.synchronize", "Runtime.close"])
def test_the_calls_that_wait_for_fill_threads_release_the_gil(name):
    body = bindings()[name]
    assert RELEASES.search(body), f"{name} must release the GIL:\n{body}"
