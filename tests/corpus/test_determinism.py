"""Identical verdicts and holder chains over three runs of one program, the third with the machine busy
(CPU-burning processes started here, and stopped by their PIDs)."""

import os
import subprocess
import sys

import pytest

from corpus import HERE, expectation, problems, run

pytestmark = [pytest.mark.slow, pytest.mark.corpus_full]

PROGRAM = HERE / "leak_mixed_server.py"
_BURN = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end:\n    pass\n"


def test_same_findings_idle_and_busy():
    runs = [run(PROGRAM), run(PROGRAM)]
    burners = [subprocess.Popen([sys.executable, "-c", _BURN]) for _ in range(os.cpu_count() or 2)]
    try:
        runs.append(run(PROGRAM))
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert problems(expectation(PROGRAM), runs[0]) == []
    first = runs[0].signature()
    assert {f[0] for f in first} >= {"KVG102"} and {f[1] for f in first} >= {"error", "info"}
    for other in runs[1:]:
        assert other.signature() == first
