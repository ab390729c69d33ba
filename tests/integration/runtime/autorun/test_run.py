"""`kv-guardian run -- python program.py`: real child processes, real programs it has never seen."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).parents[2] / "programs"
pytestmark = pytest.mark.slow


def run_cli(kv_cli, tmp_path, *program, fail_on=None, env=None):
    report = tmp_path / "report.json"
    args = ["run", "--output", str(report)]
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


# ---------------------------------------------------------------------------------------------- signals
SLEEPER = """
import signal, sys, time
def stop(signum, frame):
    print("program got", signal.Signals(signum).name, flush=True)
    sys.exit(int(sys.argv[1]))
if len(sys.argv) > 1:
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
print("ready", flush=True)
time.sleep(60)
print("slept to the end", flush=True)
"""


def _in_pty(argv, env):
    """Start ``argv`` as a session leader with a new pseudo-terminal as its controlling terminal (stdin, stdout
    and stderr), as a shell runs a command: Ctrl-C typed there goes to its whole foreground process group."""
    import fcntl
    import subprocess
    import termios

    master, slave = os.openpty()

    def controlling_tty():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, preexec_fn=controlling_tty, env=env,
                            cwd=str(Path(__file__).resolve().parents[4]))
    os.close(slave)
    return proc, master


def _read_pty(master, proc, until=None, timeout=30.0):
    import select
    import time

    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other side is closed: everything is read
                break
            if not chunk:
                break
            out += chunk
            if until is not None and until.encode() in out:
                return out.decode(errors="replace")
        elif proc.poll() is not None and until is None:
            break
    return out.decode(errors="replace")


def test_ctrl_c_in_a_terminal_reaches_the_program_once(tmp_path):
    """Issue 13 item 2: the parent used to ignore SIGINT before starting the program, which inherited the
    ignore: Ctrl-C never raised KeyboardInterrupt and a sleeper ran to its end."""
    import time

    from kvg_testing import cli_command

    program = tmp_path / "sleeper.py"
    program.write_text(SLEEPER)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc, master = _in_pty(cli_command("run", "--", sys.executable, str(program)), env)
    try:
        assert "ready" in _read_pty(master, proc, until="ready")
        t0 = time.monotonic()
        os.write(master, b"\x03")  # Ctrl-C: the terminal signals the foreground process group
        rest = _read_pty(master, proc, timeout=20)
        rc = proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert rc == 130, rest
    assert time.monotonic() - t0 < 15, "the program slept to its end: Ctrl-C did not reach it"
    assert rest.count("KeyboardInterrupt") == 1 and "slept to the end" not in rest
    assert "the program was killed by SIGINT; exit code 130" in rest
    assert not list(tmp_path.glob("kvg-run-*")), "the temporary folder is removed"


@pytest.mark.parametrize("sig, code", [("SIGTERM", 0), ("SIGHUP", 4), ("SIGINT", None)])
def test_signals_to_run_are_forwarded_waited_for_and_the_report_written(tmp_path, sig, code):
    """Issue 13 item 3: SIGTERM to `run` used to kill it at once (-15), orphan the program, write no report
    and leave its kvg-run-* folder behind."""
    import signal as _signal
    import subprocess
    import time

    from kvg_testing import cli_command, wait_for_line

    program = tmp_path / "sleeper.py"
    program.write_text(SLEEPER)
    report = tmp_path / "report.json"
    argv = cli_command("run", "-o", str(report), "--", sys.executable, str(program),
                       *([] if code is None else [str(code)]))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)}, start_new_session=True)
    try:
        wait_for_line(proc.stdout, "ready")
        t0 = time.monotonic()
        proc.send_signal(getattr(_signal, sig))  # to kv-guardian only, as a supervisor does
        out = proc.stdout.read()
        rc = proc.wait(20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, _signal.SIGKILL)
    assert time.monotonic() - t0 < 15, out
    data = json.loads(report.read_text())
    if code is None:  # no handler: KeyboardInterrupt ends the program
        assert rc == 130 and "KeyboardInterrupt" in out
    else:
        assert rc == code and f"program got {sig}" in out
    assert data["summary"]["program"]["signals"]["forwarded"] == [sig]
    assert data["summary"]["program"]["exit_code"] == rc
    assert not list(tmp_path.glob("kvg-run-*"))


def test_a_sigkilled_program_says_nothing_was_audited(kv_cli, tmp_path):
    """Issue 13 item 10: the summary said "0 finding(s)" as if the program had been audited."""
    rc, _out, err, data = run_cli(kv_cli, tmp_path, sys.executable, "-c",
                                 "import os, transformers.cache_utils; os.kill(os.getpid(), 9)")
    assert rc == 137, err
    assert "nothing was audited: the program was killed by SIGKILL" in err and "0 finding(s)" not in err
    assert data["summary"]["complete"] is False and data["summary"]["program"]["killed_by"] == "SIGKILL"


# ---------------------------------------------------------------------------------------------- item 10
def test_report_path_is_checked_before_the_program_starts(kv_cli, tmp_path):
    started = tmp_path / "started"
    rc, _out, err = kv_cli("run", "--output", str(tmp_path / "no" / "such" / "r.json"), "--", sys.executable, "-c",
                          f"open({str(started)!r}, 'w'); raise SystemExit(3)")
    assert rc == 2 and not started.exists(), "refused before the program ran, so nothing it did is lost"
    assert err.startswith("kv-guardian run: error: --output ") and "folder that does not exist" in err
    assert len(err.strip().splitlines()) == 1


def test_error_lines_name_the_command_not_its_arguments(kv_cli):
    rc, _out, err = kv_cli("run", "--holder-seconds", "0", "--", sys.executable, "exit3.py")
    assert rc == 2 and err.startswith("kv-guardian run: error: --holder-seconds 0"), err


def test_markup_in_the_program_arguments_keeps_its_exit_code(kv_cli, tmp_path):
    """Issue 13 item 6: '[/oops]' in argv crashed the summary (MarkupError, rc 70) and lost exit code 5. The
    arguments are not shown (they may carry prompts); the script's name is, escaped."""
    script = tmp_path / "[bold red]m\x1b[2J.py"  # a file name cannot hold the "/" of a closing tag
    script.write_text("import sys\nsys.exit(5)\n")
    rc, _, err = kv_cli("run", "--", sys.executable, str(script), "[/oops]", "\x1b[2J")
    assert rc == 5, err
    assert "[bold red]m\\x1b[2J.py (+2 arguments)" in err and "\x1b" not in err


POOL = """
import multiprocessing as mp
import sys
import transformers.cache_utils  # noqa: F401


def square(x):
    return x * x


if __name__ == "__main__":
    with mp.get_context(sys.argv[1]).Pool(1) as pool:
        print(sum(pool.map(square, range(4))), flush=True)
"""


POOL_KV = POOL.replace("    return x * x", """    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), 0)  # this worker has KV
    KEPT.append(cache)
    return x * x""").replace("def square", "KEPT = []\n\n\ndef square")


@pytest.mark.parametrize("method, why", [("spawn", "a multiprocessing worker ended by its pool"),
                                         ("fork", "a forked child that exited without running exit handlers")])
def test_multiprocessing_pools_keep_the_exit_code_and_name_the_unaudited_workers(kv_cli, tmp_path, method, why):
    """Issue 13 item 10: a program exiting 0 after a spawn Pool returned 3; fork workers (os._exit) were
    silently unaudited. A worker that used a cache and was ended by its pool (terminate) is named."""
    program = tmp_path / "pool.py"
    program.write_text(POOL_KV)
    rc, out, err, data = run_cli(kv_cli, tmp_path, sys.executable, str(program), method)
    assert rc == 0 and out == "14\n", err
    (worker,) = data["summary"]["unaudited"]
    assert why in worker["why"] and data["summary"]["complete"] is False
    assert f"pid {worker['pid']}: NOT audited: {why}" in err


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_workers_that_only_imported_transformers_lose_nothing(kv_cli, tmp_path, method):
    """A process that imported transformers but never used one of its caches (vLLM's model worker) and ended
    without exit handlers has nothing to audit: the report stays complete, the process is listed as such."""
    program = tmp_path / "pool.py"
    program.write_text(POOL)
    rc, out, err, data = run_cli(kv_cli, tmp_path, sys.executable, str(program), method)
    assert rc == 0 and out == "14\n", err
    assert data["summary"]["unaudited"] == [] and data["summary"]["complete"] is True, err
    (worker,) = data["summary"]["without_kv_pids"]
    assert f"pid {worker}: imported transformers but used none of its caches" in err


FORKED_PROCESS = """
import multiprocessing as mp
import torch
from transformers import DynamicCache

KEPT = []


def work():
    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), 0)
    KEPT.append(cache)  # alive when the child ends: its exit audit sees it


if __name__ == "__main__":
    p = mp.get_context("fork").Process(target=work)
    p.start()
    p.join()
    print(p.exitcode, flush=True)
"""


def test_a_forked_multiprocessing_child_is_audited_when_its_target_returns(kv_cli, tmp_path):
    """A fork-context child ends with os._exit (no atexit) after its target returns: its exit audit runs from a
    multiprocessing finalizer, so its KV is in the report (on main it was "not audited")."""
    program = tmp_path / "forked.py"
    program.write_text(FORKED_PROCESS)
    rc, out, err, data = run_cli(kv_cli, tmp_path, sys.executable, str(program))
    assert rc == 0 and out == "0\n", err
    assert data["summary"]["unaudited"] == [], err
    pids = [p["pid"] for p in data["summary"]["processes"] if p.get("status") == "audited"]
    assert len(pids) == 2, data["summary"]["processes"]  # the parent and the forked child


def test_python_dash_e_says_why_it_cannot_audit(kv_cli, tmp_path):
    """Issue 13 item 10: `run -- python -E leak.py` said "never imported transformers" (rc 0)."""
    from kvguardian.apps.cli.run import blind_interpreter

    rc, _out, err, data = run_cli(kv_cli, tmp_path, sys.executable, "-E", str(PROGRAMS / "leaky_server.py"), "2")
    assert rc == 3, err
    assert "nothing was audited: python -E ignores PYTHONPATH" in err and "never imported" not in err
    assert data["summary"]["complete"] is False
    assert blind_interpreter(["python3", "-IB", "x.py"]) and blind_interpreter(["python", "-X", "dev", "-S", "x"])
    assert blind_interpreter(["python", "-c", "pass", "-E"]) is None and blind_interpreter(["bash", "-E"]) is None


def test_a_failing_sitecustomize_of_the_program_prints_what_python_prints(kv_cli, tmp_path):
    """The boot folder shadows the program's own sitecustomize and runs it; when it raised, the program's
    stderr said "kv-guardian run: the shadowed ... failed: boom" instead of Python's own two lines."""
    (tmp_path / "sc").mkdir()
    (tmp_path / "sc" / "sitecustomize.py").write_text("raise RuntimeError('boom in sitecustomize')\n")
    code = "import sys; print('prog'); sys.exit(4)"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(tmp_path / "sc")})
    # only the program gets the folder (after run's own boot entries), so run itself does not import it
    rc, out, err = kv_cli("run", "--quiet", "--", "sh", "-c", f'PYTHONPATH="$PYTHONPATH:{tmp_path / "sc"}" '
                          f'exec {sys.executable} -c "{code}"', timeout=120)
    assert (rc, out) == (plain.returncode, plain.stdout) == (4, "prog\n")
    assert plain.stderr == "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n" \
                           "RuntimeError: boom in sitecustomize\n"
    assert err.startswith(plain.stderr), err
