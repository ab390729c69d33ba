"""KVG402 and KVG404 in a script's module-level serve loop, KVG402 through an app's own ``generate()`` wrapper,
KVG406 through ``atexit.register``: each clean near miss of the fixtures fires once its guard is taken away."""

from pathlib import Path

import pytest

from kvguardian.lint import LintConfig, lint_paths

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lint"


def _kvg402_lines(tmp_path: Path, text: str) -> set[int]:
    path = tmp_path / "m.py"
    path.write_text(text, encoding="utf-8")
    return {d.line for d in lint_paths([str(path)], LintConfig(select=("KVG402",))).diagnostics}


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(("old", "new"), [
    ('LATEST[("acme", "globex", "initech")[i % 3]] = out', "LATEST[f'tenant-{i}'] = out"),
    ("LATEST[i % 4] = out", "LATEST[i * 4] = out"),
    ('LATEST["last"] = out', "LATEST[str(i)] = out"),
    ("LATEST[Slot(i % 2)] = out", "LATEST[Tenant(i)] = out"),
    ("for n, key in enumerate(ORDER):", "for n, key in enumerate(load_order()):"),
    ("WARM.append(MODEL.generate(PROMPT, return_dict_in_generate=True))",
     "for _ in range(3): WARM.append(MODEL.generate(PROMPT, return_dict_in_generate=True))"),
])
def test_each_clean_store_fires_without_its_guard(tmp_path, old, new):
    clean = (FIXTURES / "kvg402_clean.py").read_text(encoding="utf-8")
    assert old in clean
    mutated = clean.replace(old, new, 1)
    store = _line_of(mutated, new) + (1 if new.startswith("for n, key") else 0)  # the loop's store
    assert store not in _kvg402_lines(tmp_path, clean)
    assert store in _kvg402_lines(tmp_path, mutated)


def test_module_level_names_carry_the_cache_into_the_loop(tmp_path):
    text = ("from transformers import DynamicCache\n"
            "KEPT = []\n"
            "shared = DynamicCache()\n"
            "KEPT.append(shared)\n"  # once, at import: no finding
            "for i in range(3):\n"
            "    fresh = DynamicCache()\n"
            "    KEPT.append(fresh)\n")  # a new cache kept on every iteration: a finding
    assert _kvg402_lines(tmp_path, text) == {7}


@pytest.mark.parametrize(("fixture", "rule", "old", "new", "line"), [
    ("kvg404_clean.py", "KVG404", "        importlib.import_module(name)\n", "        run(name)\n",
     "MISSING[name] = exc"),
    ("kvg404_clean.py", "KVG404",
     "try:\n    run(0)\nexcept RuntimeError as first_error:\n    ERRORS.append(first_error)",
     "for attempt in range(3):\n    try:\n        run(attempt)\n    except RuntimeError as first_error:\n"
     "        ERRORS.append(first_error)", "ERRORS.append(first_error)"),
    ("kvg406_clean.py", "KVG406", "        atexit.unregister(cb)\n", "        pass\n", "atexit.register(cb)"),
])
def test_kept_exceptions_and_atexit_near_misses(tmp_path, fixture, rule, old, new, line):
    clean = (FIXTURES / fixture).read_text(encoding="utf-8")
    assert old in clean
    mutated = clean.replace(old, new, 1)
    path = tmp_path / "m.py"
    found = []
    for text in (clean, mutated):
        path.write_text(text, encoding="utf-8")
        found.append({d.line for d in lint_paths([str(path)], LintConfig(select=(rule,))).diagnostics})
    assert _line_of(clean, line) not in found[0]
    assert _line_of(mutated, line) in found[1]
