"""The Python experience without silent failures (issue 17, item 5): skipped bubbles by cause
and a table per bubble class, enums printed by name, misspelled PIPEFILL_* variables warned
about, type errors naming the argument, backend auto saying what it chose, the example fill
jobs on the host backend with their CPU results opt-in, instrument() refusing a non-runtime."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import warnings

import pytest

import pipefill as pf
from pipefill import BubbleKind, Result, SkipCause


def sim_runtime(world, **fields):
    return pf.Runtime(backend="sim", sim_world=world, device=0, safety_margin_us=0,
                      safety_margin_fraction=0, **fields)


def run_bubbles(rt, world, stream, bubbles, bubble_us=400.0, label=None, expected_us=None):
    """One bubble of bubble_us then compute, per iteration; the world runs after each (so a
    bubble is measured before the next one begins)."""
    for _ in range(bubbles):
        with rt.bubble(stream, kind=BubbleKind.WARMUP, label=label, expected_us=expected_us):
            stream.delay(bubble_us)
        stream.launch_kernel(100.0, 132)
        rt.iteration_end()
        world.run_until_idle()
    rt.synchronize()


# ---- skipped bubbles by cause, the class table ------------------------------------------------

def test_skipped_bubbles_are_counted_by_cause():
    with pf.SimWorld(1) as world, sim_runtime(world, min_samples=2) as rt:
        stream = world.stream(0, -1)
        run_bubbles(rt, world, stream, 5)  # no job at all
        st = rt.stats()
    assert (st.bubbles, st.bubbles_skipped) == (5, 5)
    # Class "#0" collects 2 samples first; from then on it is ready but there is no job.
    assert st.skips[SkipCause.NO_HISTORY] == 2
    assert st.skips[SkipCause.NO_JOB] == 3
    assert sum(st.skips.values()) == st.bubbles_skipped
    (only,) = st.classes
    assert (only.key, only.kind, only.bubbles, only.bubbles_filled) == ("#0", BubbleKind.WARMUP, 5, 0)
    assert only.skips[SkipCause.NO_JOB] == 3
    assert only.mean_us == pytest.approx(400.0)


def test_print_stats_shows_totals_causes_and_a_row_per_class():
    with pf.SimWorld(1) as world, sim_runtime(world, min_samples=1) as rt:
        stream = world.stream(0, -1)
        job = rt.create_job(pf.SimTicketJob(items=10**6, item_cost_us=10.0))
        for _ in range(3):
            with rt.bubble(stream, label="long", expected_us=400.0):
                stream.delay(400.0)
            with rt.bubble(stream, label="tiny", expected_us=4.0):  # shorter than one item
                stream.delay(4.0)
            stream.launch_kernel(100.0, 132)
            rt.iteration_end()
            world.run_until_idle()
        rt.synchronize()
        st = rt.stats()
        counts = job.counts()
    # The original 15 fields are still the dataclass's fields (plus the new ones).
    names = [f.name for f in dataclasses.fields(pf.Stats)]
    assert names[:3] == ["iterations", "bubbles", "bubbles_filled"] and "skips" in names
    by_key = {c.key: c for c in st.classes}
    assert by_key["long"].bubbles_filled == 3 and by_key["tiny"].bubbles_filled == 0
    assert by_key["tiny"].skips[SkipCause.TOO_SHORT] == 3
    assert by_key["long"].items_completed == counts.items_run == st.items_completed > 0
    assert 0 < by_key["long"].filled_share <= 1.0

    text = str(st)
    assert text.count("\n") >= 5  # not one 15-field line
    assert "6 bubbles (3 filled, 3 skipped)" in text
    assert "skipped by cause: too short 3" in text
    rows = {line.split()[0]: line for line in st.table().splitlines()
            if line.split() and line.split()[0] in ("long", "tiny")}
    assert set(rows) == {"long", "tiny"}
    assert f" {counts.items_run} " in rows["long"] and "100.0%" not in rows["tiny"]
    assert rows["tiny"].rstrip().endswith("too short 3")
    assert re.search(r"\bclass\b.*\bbubbles\b.*\bmean\b.*\bp10\b.*\bitems\b", st.table())
    # Sorted by bubble time by default: "long" first; by key on request.
    assert st.table().index("long") < st.table().index("tiny")
    with pytest.raises(ValueError, match="sort_by 'nonsense'"):
        st.table(sort_by="nonsense")


def test_skip_causes_match_the_header(repo):
    text = (repo / "include" / "pipefill" / "pipefill.h").read_text()
    body = re.search(r"typedef enum pfSkipCause_t \{(.*?)\} pfSkipCause_t;", text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    c_values = {name: int(v) for name, v in re.findall(r"(pfSkip\w+)\s*=\s*(\d+)", body)}
    squash = lambda s: s.replace("_", "").lower()  # noqa: E731
    assert {squash(k[len("pfSkip"):]): v for k, v in c_values.items()} == \
        {squash(m.name): int(m) for m in SkipCause}


# ---- enums by name -----------------------------------------------------------------------------

def test_enums_print_by_name_and_keep_their_values():
    assert str(pf.Backend.HOST) == "Backend.HOST"
    assert f"{pf.JobStatus.COMPLETED}" == "JobStatus.COMPLETED"
    assert f"status {pf.Result.TIMEOUT}" == "status Result.TIMEOUT"
    assert f"{pf.Result.TIMEOUT:d}" == "11" and int(pf.Result.TIMEOUT) == 11
    assert pf.Backend.SIM == 2
    with pf.SimWorld(1) as world, sim_runtime(world) as rt:
        job = rt.create_job(pf.SimTicketJob(items=10, item_cost_us=1.0))
        info = job.info()
        assert "status=<JobStatus.PENDING" in repr(info) or "status=<JobStatus." in repr(info)
        assert f"{info.status}".startswith("JobStatus.")
        assert str(rt.config.backend) == "Backend.SIM"
        assert f"{rt.backend}" == "Backend.SIM"


# ---- environment ---------------------------------------------------------------------------------

def test_a_misspelled_variable_is_warned_about_with_the_nearest_name(monkeypatch):
    monkeypatch.setattr(pf._config, "_warned_variables", set())
    monkeypatch.setenv("PIPEFILL_RESERVED_SM", "8")
    with pytest.warns(RuntimeWarning, match="PIPEFILL_RESERVED_SM is not a PipeFill variable.*"
                                            "did you mean PIPEFILL_RESERVED_SMS"):
        pf.Config(backend="sim")
    # Once per name and process.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pf.Config(backend="sim")


def test_a_variable_far_from_any_name_is_warned_about_too(monkeypatch):
    monkeypatch.setattr(pf._config, "_warned_variables", set())
    monkeypatch.setenv("PIPEFILL_SOMETHING_ELSE_ENTIRELY", "1")
    with pytest.warns(RuntimeWarning, match="PIPEFILL_SOMETHING_ELSE_ENTIRELY.*docs/api.md"):
        with pf.Runtime(backend="sim"):
            pass


def test_the_c_library_warns_once_about_unknown_variables(repo):
    env = dict(os.environ, PIPEFILL_BAKEND="sim", PIPEFILL_BACKEND="sim")
    code = ("import warnings; warnings.simplefilter('ignore'); import pipefill as pf\n"
            "pf.Runtime().close(); pf.Runtime().close()\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "PIPEFILL_BAKEND" in line]
    assert len(lines) == 1, done.stderr  # the C library's log line, once for two runtimes
    assert "did you mean PIPEFILL_BACKEND" in lines[0]


def test_known_variables_are_not_warned_about(monkeypatch):
    monkeypatch.setattr(pf._config, "_warned_variables", set())
    for name in ("PIPEFILL_MIN_SAMPLES", "PIPEFILL_HOST_SMS", "PIPEFILL_FILL_STREAMS"):
        assert name in pf._pipefill.known_environment_variables()
    monkeypatch.setenv("PIPEFILL_MIN_SAMPLES", "3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pf.Runtime(backend="sim") as rt:
            assert rt.config.min_samples == 3


# ---- type errors name the argument ------------------------------------------------------------

@pytest.mark.parametrize("fields, named", [
    ({"stage_id": "1"}, r"Config\.stage_id must be an int, not str \('1'\)"),
    ({"safety_margin_us": "5"}, r"Config\.safety_margin_us must be a number, not str"),
    ({"enable_cupti": "yes"}, r"Config\.enable_cupti must be a bool, not str"),
    ({"backend": 2.0}, r"Config\.backend must be a Backend, str or int, not float"),
    ({"arena_bytes": 1.5}, r"Config\.arena_bytes must be an int or a size string, not float"),
    ({"sim_world": "world"}, r"Config\.sim_world must be a pipefill\.SimWorld, not str"),
])
def test_config_type_errors_name_the_field_where_the_config_is_written(fields, named):
    with pytest.raises(TypeError, match=named):
        pf.Config(**fields)
    with pytest.raises(TypeError, match=named):
        pf.Runtime(**fields)


def test_an_unknown_runtime_keyword_names_the_nearest_field():
    with pytest.raises(TypeError, match="'stage' is not a Config field: did you mean stage_id"):
        pf.Runtime(stage=1)
    with pytest.raises(TypeError, match="'zzz' is not a Config field$"):
        pf.Runtime(zzz=1)


def test_bubble_arguments_of_the_wrong_type_are_named():
    with pf.SimWorld(1) as world, sim_runtime(world) as rt:
        stream = world.stream(0, -1)
        with pytest.raises(TypeError, match=r"expected_us must be a number.*str \('5'\)"):
            rt.bubble_begin(stream, expected_us="5")
        with pytest.raises(TypeError, match=r"lent_bytes must be an int, not float"):
            rt.bubble(stream, lent_bytes=1.5)
        with pytest.raises(TypeError, match=r"label must be a str or None, not int"):
            rt.bubble_begin(stream, label=3)
        assert not rt.in_bubble  # nothing began


# ---- backend auto ------------------------------------------------------------------------------

def test_backend_auto_falls_back_to_the_simulator_without_a_second_warning(monkeypatch):
    # The library warns once (its log at level warn; test_failure_and_exit.py reads it from a
    # subprocess's stderr); the Python layer adds no second warning of its own.
    monkeypatch.delenv("PIPEFILL_BACKEND", raising=False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rt = pf.Runtime()
    except pf.PipeFillError:
        pytest.skip("backend auto found a GPU that could not start")
    with rt:
        if rt.backend == pf.Backend.CUDA:
            pytest.skip("a GPU is present: auto chose CUDA (logged at info)")
        assert rt.backend == pf.Backend.SIM
        assert not [w for w in caught if "auto" in str(w.message)]
    # Chosen explicitly: no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pf.Runtime(backend="sim").close()


# ---- example fill jobs: CPU results opt-in, host backend ---------------------------------------

def mlp(items, **fields):
    return pf.MlpInference(items=items, seed=5, input=16, hidden=32, output=8, rows=4, **fields)


def test_inference_results_are_computed_only_when_asked():
    with pf.SimWorld(1) as world, sim_runtime(world, min_samples=1) as rt:
        stream = world.stream(0, -1)
        quiet = rt.create_job(mlp(200))
        run_bubbles(rt, world, stream, 3, bubble_us=2000.0, expected_us=2000.0)
        assert quiet.progress().items_done > 0
        assert quiet.progress().outputs_kept == 0  # nothing computed on the CPU by default
        with pytest.raises(pf.PipeFillError, match="no kept output.*keep_every 0"):
            quiet.output(0)
        quiet.close()
        kept = rt.create_job(mlp(200, keep_every=1))
        run_bubbles(rt, world, stream, 3, bubble_us=2000.0, expected_us=2000.0)
        assert kept.progress().outputs_kept == kept.progress().items_done > 0
        assert len(kept.output(0)) == 4 * 8


def host_runtime(**fields):
    try:
        return pf.Runtime(backend="host", safety_margin_us=0.0, safety_margin_fraction=0.0,
                          **fields)
    except pf.PipeFillError as error:
        if error.code == Result.NOT_SUPPORTED:
            pytest.skip(f"no host device in this build: {error.message}")
        raise


def test_example_fill_jobs_run_on_the_host_backend_with_the_simulators_results():
    rt = host_runtime(min_samples=1)
    with rt:
        stream = rt.high_priority_stream()
        job = rt.create_job(mlp(40, keep_every=1))  # refused before: "backend 3: must be ..."
        for _ in range(50):
            if job.progress().items_done >= 5:
                break
            with rt.bubble(stream, expected_us=3000.0):
                pf.host_stream_delay(stream, 3000.0)
            rt.iteration_end()
            pf.host_stream_synchronize(stream)
        rt.synchronize()
        done = job.progress()
        assert done.items_done >= 5 and done.duplicate_items == 0
        host_outputs = {item: job.output(item) for item in range(40)
                        if item < done.items_done and _has_output(job, item)}
        job.close()
    assert host_outputs
    # The same item computed on the simulator gives the same floats.
    with pf.SimWorld(1) as world, sim_runtime(world, min_samples=1) as sim:
        reference = sim.create_job(mlp(40, keep_every=1))
        run_bubbles(sim, world, world.stream(0, -1), 40, bubble_us=5000.0, expected_us=5000.0)
        for item, values in host_outputs.items():
            assert reference.output(item) == values


def _has_output(job, item):
    try:
        job.output(item)
        return True
    except pf.PipeFillError:
        return False


# ---- pipefill.torch: instrument's argument check -----------------------------------------------

def test_instrument_refuses_a_runtime_that_is_not_one():
    pft = pytest.importorskip("pipefill.torch")

    class Schedule:
        def step(self, *args, **kwargs):
            return None

    with pytest.raises(TypeError, match=r"instrument: runtime must be a pipefill\.Runtime, "
                                        r"not str \('runtime'\)"):
        pft.instrument(Schedule(), "runtime")
