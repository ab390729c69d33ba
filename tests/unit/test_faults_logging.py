"""Issue 13 item 16: a contained hook error is one warning line, once, through the `kvguardian` logger (which
has a NullHandler); the traceback only at debug level, and nothing on stderr unless the program asks."""

import logging
import subprocess
import sys

from kvguardian.core.faults import FailOpen

PROGRAM = """
import kvguardian
from kvguardian.core.faults import FailOpen
fo = FailOpen(lambda site: 0, strict=False)
for _ in range(3):
    try:
        raise ValueError("boom")
    except ValueError as exc:
        fo.handle("track", exc)
print("model output unchanged")
"""


def test_nothing_reaches_stderr_through_the_last_resort_handler():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "model output unchanged\n"
    assert done.stderr == "", "no traceback through logging's last-resort handler"


def test_one_warning_line_once_and_the_traceback_at_debug(caplog):
    fo = FailOpen(lambda site: 0, strict=False)
    with caplog.at_level(logging.DEBUG, logger="kvguardian"):
        for _ in range(3):
            try:
                raise ValueError("boom")
            except ValueError as exc:
                fo.handle("track", exc)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(warnings) == 1 and warnings[0].exc_info is None and warnings[0].name == "kvguardian"
    assert "instrumentation error at track (ValueError: boom)" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()
    assert len(debug) == 1 and debug[0].exc_info is not None
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("kvguardian").handlers)


def test_the_cli_shows_library_warnings_as_one_escaped_line(capsys):
    from kvguardian.apps.cli import _OneLine

    record = logging.LogRecord("kvguardian", logging.WARNING, __file__, 1, "bad key %s", ("a\x1b[2Jb",), None)
    assert _OneLine().format(record) == "kv-guardian: warning: bad key a\\x1b[2Jb"
