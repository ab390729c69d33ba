"""Commands started with stdout or stderr closed (``>&-``) or full (``/dev/full``): one line where one can
go, the right exit code, and ``run`` always passes the program's exit code through."""

from __future__ import annotations

import subprocess
import sys

import pytest

EXIT5 = [sys.executable, "-c", "import sys; sys.exit(5)"]


def _kvg(redirect: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m kvguardian ARGV`` with ``redirect`` applied by a shell (e.g. ``>&-``)."""
    cmd = 'exec "$@" ' + redirect
    return subprocess.run(["sh", "-c", cmd, "sh", sys.executable, "-m", "kvguardian", *argv], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("redirect", [">&-", "2>&-", "2>/dev/full", ">&- 2>&-", ">/dev/full 2>/dev/full"])
def test_run_passes_the_programs_exit_code_whatever_its_streams(redirect):
    """2>/dev/full and 2>&- turned the program's 5 into 1 (the summary's write error escaped), >&- into 70
    (AttributeError on sys.stdout None)."""
    proc = _kvg(redirect, "run", "--", *EXIT5)
    assert proc.returncode == 5, (proc.stdout, proc.stderr)
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_program_under_run_still_starts_with_the_descriptor_closed():
    probe = [sys.executable, "-c", "import os, sys\ntry:\n    os.fstat(1)\nexcept OSError:\n    sys.exit(9)\n"]
    assert _kvg(">&-", "run", "--quiet", "--", *probe).returncode == 9


def test_a_command_without_stdout_says_so_in_one_line(tmp_path):
    (tmp_path / "a.py").write_text("CACHE = {}\n")
    proc = _kvg(">&-", "lint", str(tmp_path / "a.py"))
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == ("kv-guardian lint: error: cannot write the output: stdout is closed; fix: give "
                                   "the command a stdout or write elsewhere (-o FILE)")
