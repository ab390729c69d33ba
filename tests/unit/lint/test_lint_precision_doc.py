"""docs/lint-precision.md's labelled-set section is what lint finds on the labelled set today.

`scripts/lint_precision.py --labelled` lints the labelled set (tests/fixtures/lint/labels.toml: fixtures, the
corpus, the project's servers; offline) and exits 1 when the page's table, false positives or misses differ,
or when a corpus leak program has no label. The real-project half of the page needs PyPI and is a script only.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_labelled_set_section_matches_a_lint_run():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "lint_precision.py"), "--labelled"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr + proc.stdout[-3000:]
    assert "| KVG406 handler-callback-registry |" in proc.stdout
