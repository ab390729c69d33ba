"""The old module paths still import, as the very modules of the new paths, with a warning naming the new path;
scripts/rewrite_imports.py rewrites them, once."""

import importlib
import subprocess
import sys

import pytest

from kvg_testing import ROOT
from kvguardian._moved import MOVED, new_name

sys.path.insert(0, str(ROOT / "scripts"))
import rewrite_imports


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_path_is_the_new_module(old):
    new = importlib.import_module(new_name(f"kvguardian.{old}"))
    code = (f"import warnings, sys\nwarnings.simplefilter('always')\nimport kvguardian\n"
            f"with warnings.catch_warnings(record=True) as w:\n"
            f"    import kvguardian.{old} as m\n"
            f"print(m.__name__, [str(x.message) for x in w if x.category is DeprecationWarning])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith(new.__name__ + " ")
    assert f"moved to {new.__name__}" in out


def test_an_old_submodule_and_a_new_one_are_one_object():
    import kvguardian.core.ledger.records as new

    with pytest.warns(DeprecationWarning, match="kvguardian.core.ledger.records"):
        old = importlib.import_module("kvguardian.ledger.records")
    assert old is new
    assert new_name("kvguardian.lint") is None and new_name("kvguardian.apps.cli") is None


def test_the_rewrite_covers_imports_paths_and_tests_and_is_idempotent():
    text = ("from kvguardian.hf.observers import x\nimport kvguardian.audit.sequential\n"
            "from kvguardian import _faults\nfrom kvguardian import retention as R\n"
            "see src/kvguardian/oom/guard.py and tests/unit/k8s/test_x.py\n"
            "log = logging.getLogger('kvguardian.oom')\nfrom kvguardian.lint import rules\n")
    once = rewrite_imports.rewrite_text(text)
    assert once == ("from kvguardian.runtime.hf.observers import x\nimport kvguardian.isolation.sequential\n"
                    "from kvguardian.core import faults as _faults\nfrom kvguardian.runtime import retention as R\n"
                    "see src/kvguardian/ops/oom/guard.py and tests/unit/ops/k8s/test_x.py\n"
                    "log = logging.getLogger('kvguardian.oom')\nfrom kvguardian.lint import rules\n")
    assert rewrite_imports.rewrite_text(once) == once


def test_the_tree_names_no_old_path():
    """Nothing in src, tests, docs, scripts, bench or deploy still says an old path (CHANGELOG keeps history)."""
    stale = []
    for path in rewrite_imports.files([str(ROOT / d) for d in ("src", "tests", "docs", "scripts", "bench",
                                                               "deploy", "examples")]):
        if path.name in rewrite_imports.SELF:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if rewrite_imports.rewrite_text(text) != text:
            stale.append(str(path.relative_to(ROOT)))
    assert not stale, f"old module paths in: {stale}; fix: python3 scripts/rewrite_imports.py {' '.join(stale)}"
