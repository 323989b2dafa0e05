"""Bad input to the service's CLI and API: every case is refused with exit code 2 (a usage error:
bad argument, option, job file or field) or 1 (the operation failed: an unknown job, a
permission), one line on stderr naming the field or option and the value, no traceback, and the
database unchanged (its rows and its schema). The outside tester's failing cases (issue 26: an
empty or 300-character rank name, --bubble-us -5, init as a submitter, status of an unknown job,
job files that are not UTF-8 or hold a number, null or list, a deadline that is not a date, 300 MB
of params, an output_dir of 100 kB, not a directory or of 5,000 characters, lease_ttl_s 1e13)
and their neighbours."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import pipefill as pf


def base_spec(world):
    return {"name": "inputs", "dist_name": "pfsvc-testjobs", "entry_point": "digest",
            "dataset": "test://inputs", "item_count": 10, "shard_items": 5,
            "output_dir": str(world.out_root), "params": {"seed": 1, "item_cost_us": 100.0}}


def fingerprint(world):
    """Rows of every service table and a digest of the schema's catalog (functions, tables,
    indexes, constraints), as the owner sees them."""
    import psycopg
    with psycopg.connect(world.conninfo("pfadmin"), autocommit=True) as conn:
        rows = conn.execute(
            "select (select count(*) from pipefill.jobs), (select count(*) from pipefill.shards),"
            " (select count(*) from pipefill.attempts), (select count(*) from pipefill.allowlist),"
            " (select count(*) from pipefill.rank_logins), (select count(*) from pipefill.ranks),"
            " (select coalesce(max(id), 0) from pipefill.jobs)").fetchone()
        catalog = conn.execute(
            "select md5(string_agg(x, ',' order by x)) from (select p.proname::text || p.prosrc"
            " as x from pg_proc p where p.pronamespace = 'pipefill'::regnamespace union all"
            " select relname::text || relkind::text from pg_class where relnamespace ="
            " 'pipefill'::regnamespace union all select conname::text ||"
            " pg_get_constraintdef(oid) from pg_constraint where connamespace ="
            " 'pipefill'::regnamespace) q").fetchone()[0]
    return rows, catalog


@pytest.fixture
def cli(world, monkeypatch, capsys):
    """Runs ``pipefill ARGS`` in this process as ``user`` (default alice); returns (exit code,
    stdout, stderr)."""
    from pipefill.service.cli import main

    def run(*args, user="alice"):
        monkeypatch.setenv("PIPEFILL_SERVICE", world.conninfo(user))
        if user in world.passwords:
            monkeypatch.setenv("PIPEFILL_SERVICE_PASSWORD_FILE", str(world.passwords[user]))
        else:
            monkeypatch.delenv("PIPEFILL_SERVICE_PASSWORD_FILE", raising=False)
        try:
            code = main(list(args))
        except SystemExit as exit_:
            code = exit_.code
        out, err = capsys.readouterr()
        return code, out, err
    return run


def assert_refused(result, code, *needles):
    rc, out, err = result
    assert rc == code, (rc, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and out == "", (out, err)
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ---- job files -----------------------------------------------------------------------------

BIG = 300 * 1000 * 1000


def _field(**changes):
    return ("field", changes)


# (id, how the job file is made, needles of the one-line message)
JOB_FILES = [
    ("not-utf8", ("bytes", b'{"name": "caf\xe9"}'), ["not UTF-8", "byte 0xe9 at offset 13"]),
    ("not-json", ("text", "{name: 1"), ["is not JSON", "line 1 column 2"]),
    ("empty-file", ("text", ""), ["is not JSON"]),
    ("json-number", ("text", "5"), ["must hold a JSON object", "not a number (5)"]),
    ("json-null", ("text", "null"), ["must hold a JSON object", "not null (None)"]),
    ("json-list", ("text", "[1, 2]"), ["must hold a JSON object", "not an array ([1, 2])"]),
    ("json-string", ("text", '"job"'), ["must hold a JSON object", "not a string"]),
    ("json-bool", ("text", "true"), ["must hold a JSON object", "not a boolean"]),
    ("huge-int", ("text", '{"item_count": ' + "9" * 5000 + "}"), ["not usable JSON"]),
    ("deep-nesting", ("text", "[" * 100000 + "]" * 100000), ["not usable JSON"]),
    ("missing-fields", ("text", '{"name": "x"}'), ["missing the fields", "'dist_name'"]),
    ("unknown-field", _field(colour="red"), ["unknown fields 'colour'"]),
    ("300MB-params", ("sparse", BIG), ["larger than 2097152 bytes", "params are limited"]),
    ("deadline-not-a-date", _field(deadline="next tuesday"),
     ["JobSpec.deadline = 'next tuesday'", "ISO 8601"]),
    ("deadline-month-13", _field(deadline="2030-13-01T00:00:00"),
     ["JobSpec.deadline = '2030-13-01T00:00:00'"]),
    ("deadline-number", _field(deadline=5), ["JobSpec.deadline = 5"]),
    ("output_dir-100kB", _field(output_dir="/" + "a" * 100000),
     ["JobSpec.output_dir = '/aaaa", "(100001 characters)", "1..1024 characters"]),
    ("output_dir-5000", _field(output_dir="/" + "b/" * 2500),
     ["JobSpec.output_dir = '/b/b/", "(5001 characters)"]),
    ("output_dir-not-a-directory", ("file-output-dir", None),
     ["JobSpec.output_dir = ", "is not a directory"]),
    ("output_dir-missing", _field(output_dir="/nonexistent/pipefill-out"),
     ["JobSpec.output_dir = '/nonexistent/pipefill-out'", "No such file or directory"]),
    ("output_dir-relative", _field(output_dir="relative/out"),
     ["JobSpec.output_dir = 'relative/out' must be an absolute path"]),
    ("output_dir-dotdot", _field(output_dir="/tmp/../etc"),
     ["JobSpec.output_dir = '/tmp/../etc' must not hold '.' or '..'"]),
    ("output_dir-component", _field(output_dir="/" + "c" * 300),
     ["JobSpec.output_dir = ", "has a component of 300 bytes (at most 255)"]),
    ("output_dir-number", _field(output_dir=7), ["JobSpec.output_dir = 7 must be a string"]),
    ("lease_ttl_s-1e13", _field(lease_ttl_s=1e13),
     ["JobSpec.lease_ttl_s = 10000000000000.0", "[0.1, 604800]"]),
    ("lease_ttl_s-0", _field(lease_ttl_s=0), ["JobSpec.lease_ttl_s = 0"]),
    ("lease_ttl_s-negative", _field(lease_ttl_s=-1), ["JobSpec.lease_ttl_s = -1"]),
    ("lease_ttl_s-nan", ("text-field", '"lease_ttl_s": NaN'), ["JobSpec.lease_ttl_s = nan"]),
    ("lease_ttl_s-string", _field(lease_ttl_s="30"), ["JobSpec.lease_ttl_s = '30'"]),
    ("name-empty", _field(name=""), ["JobSpec.name = '' must be 1..200 characters"]),
    ("name-201", _field(name="n" * 201), ["JobSpec.name = 'nnn", "(201 characters)"]),
    ("name-newline", _field(name="a\nb"), ["JobSpec.name = 'a\\nb'", "control character"]),
    ("name-nul", _field(name="a\x00b"), ["JobSpec.name = 'a\\x00b'", "control character"]),
    ("name-number", _field(name=5), ["JobSpec.name = 5 must be a string"]),
    ("dist_name-empty", _field(dist_name=""), ["JobSpec.dist_name = ''"]),
    ("entry_point-201", _field(entry_point="e" * 201), ["JobSpec.entry_point = 'eee"]),
    ("dataset-5000", _field(dataset="d" * 5000), ["JobSpec.dataset = 'ddd", "1..4096"]),
    ("dist_version-list", _field(dist_version=["1"]), ["JobSpec.dist_version = ['1']"]),
    ("dist_sha256-short", _field(dist_sha256="abc"),
     ["JobSpec.dist_sha256 = 'abc' must be 64 lowercase hex digits"]),
    ("item_count-0", _field(item_count=0), ["JobSpec.item_count = 0 must be an integer"]),
    ("item_count-string", _field(item_count="10"), ["JobSpec.item_count = '10'"]),
    ("item_count-float", _field(item_count=10.5), ["JobSpec.item_count = 10.5"]),
    ("item_count-bool", _field(item_count=True), ["JobSpec.item_count = True"]),
    ("item_count-2^63", _field(item_count=2 ** 63), [f"JobSpec.item_count = {2 ** 63}"]),
    ("shard_items-0", _field(shard_items=0), ["JobSpec.shard_items = 0"]),
    ("too-many-shards", _field(item_count=10 ** 8, shard_items=1),
     ["JobSpec.shard_items = 1 splits item_count = 100000000 into 100000000 shards"]),
    ("memory_bytes-negative", _field(memory_bytes=-1), ["JobSpec.memory_bytes = -1"]),
    ("item_cost_us-negative", _field(item_cost_us=-1.0), ["JobSpec.item_cost_us = -1.0"]),
    ("item_cost_us-huge", _field(item_cost_us=1e30), ["JobSpec.item_cost_us = 1e+30"]),
    ("priority-2^31", _field(priority=2 ** 31), [f"JobSpec.priority = {2 ** 31}"]),
    ("max_failures-0", _field(max_failures=0), ["JobSpec.max_failures = 0"]),
    ("max_failures-huge", _field(max_failures=10 ** 9), ["JobSpec.max_failures = 1000000000"]),
    ("params-list", _field(params=[1, 2]), ["JobSpec.params = [1, 2] must be a JSON object"]),
    ("params-null", _field(params=None), ["JobSpec.params = None must be a JSON object"]),
    ("params-nan", ("text-field", '"params": {"x": NaN}'),
     ["JobSpec.params['x'] = nan is not a finite number"]),
    ("params-nul", _field(params={"x": "a\x00"}), ["JobSpec.params['x'] = 'a\\x00'", "NUL"]),
    ("params-deep", _field(params=json.loads('{"a":' * 70 + "1" + "}" * 70)),
     ["JobSpec.params", "nests deeper than 64 levels"]),
    ("params-2MB", _field(params={"x": "p" * (1 << 20)}),
     ["JobSpec.params is ", "bytes of JSON (at most 1048576)"]),
]


def write_job_file(world, tmp_path, how):
    kind, value = how
    path = tmp_path / "job.json"
    if kind == "bytes":
        path.write_bytes(value)
    elif kind == "text":
        path.write_text(value)
    elif kind == "field":
        path.write_text(json.dumps({**base_spec(world), **value}))
    elif kind == "text-field":  # raw JSON text for one field (e.g. NaN, which json.dumps refuses)
        key = value.split(":", 1)[0]
        spec = {k: v for k, v in base_spec(world).items() if f'"{k}"' != key}
        path.write_text(json.dumps(spec)[:-1] + ", " + value + "}")
    elif kind == "sparse":  # a job file of `value` bytes: '{"params": {"x": "' then zeros
        with open(path, "wb") as file:
            file.write(b'{"params": {"x": "')
            file.truncate(value)
    elif kind == "file-output-dir":
        not_a_dir = tmp_path / "plain-file"
        not_a_dir.write_text("x")
        path.write_text(json.dumps({**base_spec(world), "output_dir": str(not_a_dir)}))
    return path


@pytest.mark.parametrize("how,needles", [c[1:] for c in JOB_FILES], ids=[c[0] for c in JOB_FILES])
def test_bad_job_files_are_refused_at_submit(world, tmp_path, cli, how, needles):
    path = write_job_file(world, tmp_path, how)
    before = fingerprint(world)
    assert_refused(cli("submit", str(path)), 2, "pipefill submit: ", *needles)
    assert fingerprint(world) == before


def test_a_good_job_file_is_accepted_and_naive_deadlines_are_utc(world, tmp_path, cli):
    """The control of the matrix: the same base spec is accepted; a deadline without a timezone
    is taken as UTC."""
    path = tmp_path / "job.json"
    path.write_text(json.dumps({**base_spec(world), "deadline": "2030-01-31T18:00:00",
                                "output_dir": str(world.out_root) + "/"}))
    rc, out, err = cli("submit", str(path))
    assert rc == 0 and err == "", err
    job_id = int(out)
    with world.service("alice") as alice:
        row = alice._execute("select deadline = '2030-01-31T18:00:00+00'::timestamptz,"
                             " output_dir from pipefill.jobs where id = %s",
                             (job_id,)).fetchone()
        assert alice.cancel(job_id) is True
    assert row == (True, str(world.out_root))


@pytest.mark.parametrize("source,needle", [
    ("directory", "is not a regular file"),
    ("missing", "No such file or directory"),
])
def test_job_files_that_cannot_be_read(world, tmp_path, cli, source, needle):
    path = tmp_path if source == "directory" else tmp_path / "missing.json"
    before = fingerprint(world)
    assert_refused(cli("submit", str(path)), 2, f"job file '{path}'", needle)
    assert fingerprint(world) == before


def test_the_api_refuses_the_same_fields_naming_them(world):
    """Service.submit (Python) checks what the CLI checks: a UsageError (a PipeFillError with
    INVALID_ARGUMENT) naming the field, nothing written."""
    import dataclasses
    from pipefill.service import JobSpec, UsageError
    spec = JobSpec(**base_spec(world))
    before = fingerprint(world)
    with world.service("alice") as alice:
        for changes, needle in [
            ({"lease_ttl_s": 1e13}, "JobSpec.lease_ttl_s = 10000000000000.0"),
            ({"params": {"x": "p" * (3 << 20)}}, "bytes of JSON (at most 1048576)"),
            ({"params": {"x": object()}}, "JobSpec.params['x'] = <object object"),
            ({"params": {1: 2}}, "JobSpec.params has the key 1: keys must be strings"),
            ({"deadline": "2030-01-01"}, "JobSpec.deadline = '2030-01-01' must be a datetime"),
            ({"output_dir": "/" + "a" * 100000}, "JobSpec.output_dir = '/aaa"),
            ({"item_cost_us": float("nan")}, "JobSpec.item_cost_us = nan"),
        ]:
            with pytest.raises(UsageError) as error:
                alice.submit(dataclasses.replace(spec, **changes))
            assert needle in error.value.message and "\n" not in error.value.message
            assert error.value.code == pf.Result.INVALID_ARGUMENT
    assert fingerprint(world) == before


# ---- other commands ------------------------------------------------------------------------

@pytest.mark.parametrize("args,user,code,needles", [
    (("init",), "alice", 1, ["pipefill init: only the service's owner role", "alice may not",
                             "nothing was changed", "permission denied"]),
    (("init",), "rank1", 1, ["pipefill init: only the service's owner role", "rank1 may not"]),
    (("status", "999999"), "alice", 1, ["pipefill status: job 999999 does not exist"]),
    (("status", "abc"), "alice", 2, ["job id 'abc' is not an integer"]),
    (("status", "0"), "alice", 2, ["job id '0' is outside [1, 9223372036854775807]"]),
    (("status", "-5"), "alice", 2, ["job id '-5' is outside"]),
    (("status", "99999999999999999999"), "alice", 2, ["job id '99999999999999999999' is outside"]),
    (("status", "1", "2"), "alice", 2, ["unrecognized arguments: '2'"]),
    (("cancel", "999999"), "alice", 1, ["pipefill cancel: job 999999 does not exist"]),
    (("cancel",), "alice", 2, ["the following arguments are required: job"]),
    (("cancel", "1.5"), "alice", 2, ["job id '1.5' is not an integer"]),
    (("manifest", "999999"), "alice", 1, ["pipefill manifest: job 999999 does not exist"]),
    (("manifest", "x"), "alice", 2, ["job id 'x' is not an integer"]),
    (("allow", ""), "pfadmin", 2, ["pipefill allow: dist = '' must be 1..200 characters"]),
    (("allow", "pfsvc-testjobs", "--sha256", "zz"), "pfadmin", 2,
     ["--sha256 = 'zz' must be 64 lowercase hex digits"]),
    (("allow", "no-such-dist-x"), "pfadmin", 1, ["'no-such-dist-x' is not installed"]),
    (("allow", "pfsvc-testjobs"), "alice", 1, ["permission denied for table allowlist"]),
    (("frobnicate",), "alice", 2, ["invalid choice: 'frobnicate'"]),
    ((), "alice", 2, ["the following arguments are required: command"]),
])
def test_bad_commands_are_refused_in_one_line(world, cli, args, user, code, needles):
    before = fingerprint(world)
    assert_refused(cli(*args, user=user), code, *needles)
    assert fingerprint(world) == before


def test_no_connection_is_one_line(world, cli, monkeypatch, capsys):
    from pipefill.service.cli import main
    monkeypatch.delenv("PIPEFILL_SERVICE", raising=False)
    assert main(["status"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "pipefill status: no service connection: set PIPEFILL_SERVICE (a libpq connection "
        "string without the password) or pass one"]
    # No password file: the server refuses the login; the message names the user, not a secret.
    assert_refused(cli("status", user="nobody-such"), 1, "user=nobody-such",
                   "cannot connect to the service database")


# ---- pipefill rank (subprocesses: no traceback, no nanobind leak report at exit) ---------------

@pytest.mark.parametrize("args,needle", [
    (["--name", ""], "--name = '' must be 1..200 characters"),
    (["--name", "r" * 300], "--name = 'rrrr"),
    (["--name", "bad\nname"], "--name = 'bad\\nname' holds the control character"),
    (["--name", "r", "--bubble-us", "-5"],
     "--bubble-us = -5.0 must be a finite number in (0, 1e+07]"),
    (["--name", "r", "--bubble-us", "0"], "--bubble-us = 0.0"),
    (["--name", "r", "--bubble-us", "nan"], "--bubble-us = nan"),
    (["--name", "r", "--bubble-us", "inf"], "--bubble-us = inf"),
    (["--name", "r", "--compute-us", "-1"], "--compute-us = -1.0"),
    (["--name", "r", "--iterations", "0"], "--iterations = 0 must be an integer"),
    (["--name", "r", "--exit-when-idle", "-1"], "--exit-when-idle = -1.0"),
    (["--name", "r", "--bubble-us", "abc"], "argument --bubble-us: invalid float value: 'abc'"),
    ([], "the following arguments are required: --name"),
])
def test_pipefill_rank_validates_its_arguments(world, args, needle):
    env = world.rank_env()
    done = subprocess.run([sys.executable, "-m", "pipefill.service.cli", "rank", *args],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "leak" not in done.stderr


def test_pipefill_rank_without_a_connection_is_one_line(world, tmp_path):
    env = world.rank_env()
    env.pop("PIPEFILL_SERVICE")
    done = subprocess.run([sys.executable, "-m", "pipefill.service.cli", "rank", "--name", "r"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "pipefill rank: no service connection: set PIPEFILL_SERVICE (a libpq connection string "
        "without the password) or pass one"]


def test_the_pipefill_entry_point_refuses_like_main(world, tmp_path):
    """The real command (python -m pipefill.service.cli, what the `pipefill` script runs) on two
    of the issue's cases: exit codes and one line each, nothing on stdout."""
    env = world.rank_env("alice")
    job = tmp_path / "job.json"
    job.write_text("null")
    for args, code, needle in ((["submit", str(job)], 2, "must hold a JSON object"),
                               (["status", "424242"], 1, "job 424242 does not exist"),
                               (["init"], 1, "alice may not")):
        done = subprocess.run([sys.executable, "-m", "pipefill.service.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == code and done.stdout == "", done
        assert len(done.stderr.splitlines()) == 1 and needle in done.stderr
        assert "Traceback" not in done.stderr
