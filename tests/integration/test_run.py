"""`kv-guardian run -- python program.py`: real child processes, real programs it has never seen."""

import json
import os
import sys
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).parent / "programs"
pytestmark = pytest.mark.slow


def run_cli(kv_cli, tmp_path, *program, fail_on=None, env=None):
    report = tmp_path / "report.json"
    args = ["run", "--report", str(report)]
    if fail_on:
        args += ["--fail-on", fail_on]
    rc, out, err = kv_cli(*args, "--", *program, timeout=600, env=env)
    data = json.loads(report.read_text()) if report.exists() else None
    return rc, out, err, data


def test_finds_four_unseen_leaks_with_holder_chains(kv_cli, tmp_path):
    rc, out, err, data = run_cli(kv_cli, tmp_path, sys.executable, str(PROGRAMS / "leaky_server.py"), "16")
    assert rc == 1, err
    assert "served; failures=4 memo=4 hooks=4 sessions=4" in out, "the program's own output is preserved"
    errors = [f for f in data["findings"] if f["id"] == "KVG102" and f["severity"] == "error"]
    roots = {f["holder_chain"][0] for f in errors}
    assert roots == {f"module __main__: {n}" for n in ("FAILURES", "MEMO", "ON_SHUTDOWN", "SESSIONS")}
    assert len(errors) == 16, "every leaked request, each with its chain"
    chains = {f["holder_chain"][0]: " → ".join(f["holder_chain"]) for f in errors}
    assert "(traceback)" in chains["module __main__: FAILURES"] and "frame handle_failing()" in \
        chains["module __main__: FAILURES"]
    assert "closure cell" in chains["module __main__: ON_SHUTDOWN"]
    assert "dict['cache'] → DynamicCache.layers" in chains["module __main__: SESSIONS"]
    assert all(f["evidence"]["bytes"] > 0 and f["evidence"]["retention"]["why"] == "unbounded-collection"
               for f in errors)
    assert "KVG102 orphaned-kv (error)" in err and "held by: module __main__:" in err
    proc = data["summary"]["processes"][0]
    assert proc["summary"]["requests_seen"] == 16 and proc["status"] == "audited"


def test_stays_silent_on_a_clean_program_with_a_bounded_lru(kv_cli, tmp_path):
    rc, out, err, data = run_cli(kv_cli, tmp_path, sys.executable, str(PROGRAMS / "clean_server.py"), "18",
                                 fail_on="warning")
    assert rc == 0, err
    assert out.startswith("served")
    sev = {f["severity"] for f in data["findings"]}
    assert sev <= {"info"}, [f["message"] for f in data["findings"] if f["severity"] != "info"]
    whys = {f["evidence"]["retention"]["why"] for f in data["findings"] if f["id"] == "KVG102"}
    assert "observed-eviction" in whys and "declared-bound" in whys  # the LRU and lru_cache(maxsize=2)
    s = data["summary"]["processes"][0]["summary"]
    assert s["events"]["cache_hit"] == 18 and s["reuse"]["by_count"]["hit_rate"] > 0


def test_crash_and_exit_codes_are_preserved(kv_cli, tmp_path):
    rc, out, err, data = run_cli(kv_cli, tmp_path, sys.executable, str(PROGRAMS / "crashing.py"), "crash")
    assert rc == 1 and "generated 7" in out
    assert "SystemError: the program's own crash" in err, "the program's traceback is shown unchanged"
    assert "kv-guardian run: the program exited with code 1; kv-guardian keeps it" in err
    assert data["summary"]["program"]["exit_code"] == 1 and data["summary"]["processes"][0]["crashed"]
    rc, out, err, _ = run_cli(kv_cli, tmp_path, sys.executable, str(PROGRAMS / "crashing.py"), "code")
    assert rc == 7 and "exited with code 7" in err
    rc, out, err, _ = run_cli(kv_cli, tmp_path, sys.executable, str(PROGRAMS / "crashing.py"), "os_exit")
    assert rc == 3 and "exited without running exit handlers" in err


def test_bad_input_gets_one_line_and_an_exit_code(kv_cli, tmp_path):
    rc, out, err = kv_cli("run")
    assert rc == 2 and err.strip().endswith("no program to run; fix: kv-guardian run -- python app.py [args...]")
    rc, out, err = kv_cli("run", "--", "no-such-program-kvg")
    assert rc == 127 and err.strip() == ("kv-guardian run: program 'no-such-program-kvg' not found; fix: check "
                                         "the name or PATH")
    rc, out, err = kv_cli("run", "--", sys.executable, "-c", "print('plain')")
    assert rc == 0 and out == "plain\n" and "never imported transformers" in err


def test_unsupported_transformers_is_refused_naming_the_minimum(kv_cli, tmp_path):
    fake = tmp_path / "fake" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '4.57.1'\n")
    (fake / "cache_utils.py").write_text("class Cache:\n    pass\n")
    env = {"PYTHONPATH": str(tmp_path / "fake") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rc, out, err = kv_cli("run", "--", sys.executable, "-c", "import transformers.cache_utils; print('ran')",
                          env=env)
    assert rc == 3 and out == "ran\n"
    assert "transformers 4.57.1 is not supported; kv-guardian needs transformers >= 5.0" in err
